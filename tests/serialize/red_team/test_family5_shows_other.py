"""Family 5 of issue 21: a module that computes something other than what it shows.

``state_dict()`` and ``fxloom show`` list one set of tensors while ``forward`` uses another:
a ``tensors`` entry or attribute shadows a parameter, buffer or child of the same name; a
graph constant shadows a buffer; a zip holds two programs; an LSTM's weight names are
reordered; a per-channel quantized tensor has one scale for 1000 channels. One name must have
one meaning, so each file must be refused while loading.
"""

import pytest
import torch
from red_team_files import (
    FORMAT,
    PROGRAM,
    WEIGHTS,
    Square,
    call,
    edited,
    insert_before_output,
    lstm_file,
    module_at,
    node,
    read,
    record,
    ref,
    rewrite,
    saved,
    with_tensors,
)
from red_team_harness import Case, assert_refused, case, family

EVIL_3x3 = torch.full((3, 3), 7.0)
EVIL_2 = torch.full((2,), 100.0)


def _edit(id, doc, edit, model=None, tensors=None) -> Case:
    def build():
        data = saved(model() if model else None)
        if tensors:
            data = with_tensors(data, tensors)
        return edited(edit, data)

    return Case(id, doc, build)


def _shadow_weight_by_tensors(program):
    module_at(program, "lin")["tensors"] = {"weight": record("evil", EVIL_3x3)}


def _shadow_buffer_by_tensors(program):
    program["module"]["tensors"] = {"scale": record("evil", EVIL_2)}


def _shadow_buffer_by_attribute(program):
    program["module"]["attributes"]["scale"] = 100.0


def _shadow_bias_by_attribute(program):
    module_at(program, "lin")["attributes"]["bias"] = None


def _shadow_child_by_attribute(program):
    program["module"]["attributes"]["lin"] = None


def _child_named_like_parameter(program):
    module_at(program, "lin")["children"]["weight"] = {
        "class": "torch.nn.modules.linear.Identity",
        "training": False,
        "attributes": {},
        "parameters": {},
        "buffers": {},
        "children": {},
    }


def _buffer_named_like_parameter(program):
    module_at(program, "lin")["buffers"]["weight"] = record("evil", EVIL_3x3)


def _graph_constant_shadows_buffer(program):
    program["module"]["graph_constants"] = {"scale": record("evil", EVIL_2)}


CASES = [
    _edit(
        "tensors-entry-shadows-a-parameter",
        "lin.tensors['weight'] (7s) shadows lin's weight parameter that state_dict shows",
        _shadow_weight_by_tensors,
        Square,
        {"evil": EVIL_3x3},
    ),
    _edit(
        "tensors-entry-shadows-a-buffer",
        "root tensors['scale'] (100s) shadows the buffer scale",
        _shadow_buffer_by_tensors,
        None,
        {"evil": EVIL_2},
    ),
    _edit(
        "attribute-shadows-a-buffer",
        "a float attribute 'scale' shadows the buffer scale",
        _shadow_buffer_by_attribute,
    ),
    _edit(
        "attribute-shadows-a-parameter",
        "an attribute bias=None hides lin's bias parameter",
        _shadow_bias_by_attribute,
    ),
    _edit(
        "attribute-shadows-a-child-module",
        "an attribute 'lin' shadows the child module lin",
        _shadow_child_by_attribute,
    ),
    _edit(
        "child-module-named-like-a-parameter",
        "a child 'weight' beside the parameter weight",
        _child_named_like_parameter,
        Square,
    ),
    _edit(
        "buffer-named-like-a-parameter",
        "a buffer 'weight' beside the parameter weight",
        _buffer_named_like_parameter,
        Square,
        {"evil": EVIL_3x3},
    ),
    _edit(
        "graph-constant-shadows-a-buffer",
        "graph_constants['scale'] is what get_attr reads, not the buffer state_dict shows",
        _graph_constant_shadows_buffer,
        None,
        {"evil": EVIL_2},
    ),
    # (A get_attr of a 'tensors' entry that state_dict does not list is how traced graphs hold
    # their constants, `_tensor_constant0`, as in torch.fx; `fxloom show` lists them as "other
    # tensors". It is not a second meaning of a name, so it is not a case here.)
]


def _duplicate(member, change):
    def build():
        data = saved()
        document = read(data, member)
        change(document)
        # The first member is the honest one; zipfile reads the last of a name.
        return rewrite(data, {}, extra=[(member, __import__("json").dumps(document).encode())])

    return build


def _relu_to_sigmoid(program):
    node(program, "relu")["target"] = "torch.sigmoid"


CASES += [
    Case(
        "two-program-json-members",
        "a second fxloom/program.json (relu -> sigmoid) after the first",
        _duplicate(PROGRAM, _relu_to_sigmoid),
    ),
    Case(
        "two-format-json-members",
        "a second fxloom/format.json after the first",
        _duplicate(FORMAT, lambda header: header.update(fxloom_version="9.9.9")),
    ),
]


@case("two-weights-members")
def two_weights():
    """a second weights member whose tensors differ from the first"""
    import io
    import zipfile

    from safetensors.torch import load, save

    data = saved()
    weights = load(zipfile.ZipFile(io.BytesIO(data)).read(WEIGHTS))
    evil = {k: torch.full_like(v, 5.0) for k, v in weights.items()}
    return rewrite(data, {}, extra=[(WEIGHTS, save(evil))])


def _lstm(id, doc, edit):
    return Case(
        id,
        doc,
        lambda: edited(lambda p: edit(module_at(p, "lstm")), lstm_file()),
        inputs=[{"randn": [2, 1, 4]}],
    )


def _swap_flat_names(lstm):
    names = lstm["attributes"]["_flat_weights_names"]
    names[0], names[1] = names[1], names[0]


def _duplicate_flat_name(lstm):
    names = lstm["attributes"]["_flat_weights_names"]
    names[1] = names[0]


def _swap_parameter_records(lstm):
    p = lstm["parameters"]
    p["weight_ih_l0"], p["weight_hh_l0"] = p["weight_hh_l0"], p["weight_ih_l0"]


CASES += [
    two_weights,
    _lstm(
        "lstm-flat-weight-names-swapped",
        "LSTM _flat_weights_names lists weight_hh_l0 first: the kernel swaps the matrices",
        _swap_flat_names,
    ),
    _lstm(
        "lstm-flat-weight-names-duplicated",
        "LSTM _flat_weights_names names weight_ih_l0 twice",
        _duplicate_flat_name,
    ),
    _lstm(
        "lstm-all-weights-reordered",
        "LSTM _all_weights in another order than the class's",
        lambda lstm: lstm["attributes"]["_all_weights"][0].reverse(),
    ),
]


@case("per-channel-quantized-one-scale-for-1000-channels")
def per_channel():
    """a per-channel qint8 buffer of 1000 channels with 1 scale and 1 zero point, dequantized"""
    values = torch.ones(1000, 2, dtype=torch.int8)
    data = with_tensors(
        saved(),
        {
            "q": values,
            "q.scales": torch.ones(1, dtype=torch.float64),
            "q.zero_points": torch.zeros(1, dtype=torch.int64),
        },
    )

    def edit(program):
        program["module"]["buffers"]["q"] = {
            "key": "q",
            "shape": [1000, 2],
            "dtype": {"dtype": "qint8"},
            "quantized": {"qscheme": {"qscheme": "per_channel_affine"}, "axis": 0},
        }
        insert_before_output(
            program,
            call("q", "q", op="get_attr"),
            call("deq", "dequantize", ref("q"), op="call_method"),
            call("total", "torch.sum", ref("deq")),
        )

    return edited(edit, data)


@case("per-channel-quantized-axis-out-of-range")
def per_channel_axis():
    """a per-channel qint8 buffer whose axis (5) is not one of its dimensions"""
    data = with_tensors(
        saved(),
        {
            "q": torch.ones(4, 2, dtype=torch.int8),
            "q.scales": torch.ones(4, dtype=torch.float64),
            "q.zero_points": torch.zeros(4, dtype=torch.int64),
        },
    )

    def edit(program):
        program["module"]["buffers"]["q"] = {
            "key": "q",
            "shape": [4, 2],
            "dtype": {"dtype": "qint8"},
            "quantized": {"qscheme": {"qscheme": "per_channel_affine"}, "axis": 5},
        }

    return edited(edit, data)


CASES += [per_channel, per_channel_axis]
family("family5", CASES)


@pytest.mark.parametrize("attack", CASES, ids=[c.id for c in CASES])
def test_one_name_one_meaning(attack, verdicts):
    """Refused (SerializationError): no file whose forward differs from what it shows loads."""
    assert_refused(verdicts, attack)
