"""Family 1 of issue 21: code from the file runs during ``fxloom.load`` itself.

A module's tensor parametrized by a file-supplied module (a GraphModule inside a
``ParametrizationList``) runs that module whenever the tensor is read, and the loader's own
checks read it (the shape rules, the ``get_attr`` check, an RNN's flat-weight hook). Every
payload here calls a recorded function, so a file that runs anything while loading says so.
"""

import pytest
from red_team_files import (
    call,
    edited,
    lstm_file,
    module_at,
    parametrized_file,
    payload_parametrization,
    ref,
    two_input_payload,
)
from red_team_harness import assert_refused, case, family
from torch import nn

SEED = call("seed", "torch.manual_seed", 1234)
# The same os.system chain as family 2, from the (detached) tensor the parametrization gets.
CHAIN = [
    call("plain", "detach", ref("v"), op="call_method"),
    call("arr", "numpy", ref("plain"), op="call_method"),
    call("np_ctypes", "getattr", ref("arr"), "ctypes"),
    call("ctypes_module", "getattr", ref("np_ctypes"), "_ctypes"),
    call("os_module", "getattr", ref("ctypes_module"), "_os"),
    call("system", "getattr", ref("os_module"), "system"),
    call("run", "max", ["touch fxloom_red_team_pwned"], key=ref("system")),
]


def _weight_norm_with(module, payload_nodes, tensor="weight"):
    data = parametrized_file(module, tensor)
    return edited(
        lambda p: payload_parametrization(p, "0", tensor, two_input_payload(*payload_nodes)), data
    )


@case("linear-weight-parametrized-by-graph-module")
def linear():
    """Linear.weight parametrized by a GraphModule calling torch.manual_seed (shape rules read it)"""
    return _weight_norm_with(nn.Linear(3, 2), [SEED])


@case("linear-weight-parametrized-by-os-system-chain")
def linear_chain():
    """Linear.weight parametrized by a GraphModule reaching os.system through numpy's ctypes"""
    return _weight_norm_with(nn.Linear(3, 2), CHAIN)


@case("linear-bias-parametrized-by-graph-module")
def linear_bias():
    """Linear.bias parametrized by a GraphModule calling torch.manual_seed"""
    return _weight_norm_with(nn.Linear(3, 2), [SEED], tensor="bias")


@case("conv-weight-parametrized-by-graph-module", inputs=[{"randn": [1, 3, 5, 5]}])
def conv():
    """Conv2d.weight parametrized by a GraphModule (the conv shape rule reads the weight)"""
    return _weight_norm_with(nn.Conv2d(3, 2, 3), [SEED])


@case("embedding-weight-parametrized-by-graph-module", inputs=[{"long": [[0, 1]]}])
def embedding():
    """Embedding.weight parametrized by a GraphModule calling torch.manual_seed"""
    return _weight_norm_with(nn.Embedding(5, 3), [SEED])


@case("layernorm-weight-parametrized-by-graph-module", inputs=[{"randn": [4, 3]}])
def layer_norm():
    """LayerNorm.weight parametrized by a GraphModule calling torch.manual_seed"""
    return _weight_norm_with(nn.LayerNorm(3), [SEED])


@case("parametrization-graph-module-wrapped-in-sequential")
def wrapped():
    """the GraphModule payload hidden one level down, inside a Sequential parametrization"""
    data = parametrized_file(nn.Linear(3, 2))

    def edit(program):
        payload = two_input_payload(SEED)
        payload_parametrization(
            program,
            "0",
            "weight",
            {
                "class": "torch.nn.modules.container.Sequential",
                "training": False,
                "attributes": {},
                "parameters": {},
                "buffers": {},
                "children": {"0": payload},
            },
        )

    return edited(edit, data)


@case("get_attr-check-reads-a-parametrized-tensor")
def get_attr_check():
    """a root get_attr of the parametrized weight, with a recorded val: the loader's get_attr
    check reads the tensor, which runs the payload"""
    data = _weight_norm_with(nn.Linear(3, 2), [SEED])

    def edit(program):
        nodes = program["module"]["graph"]["nodes"]
        nodes.insert(
            1,
            {
                "name": "w",
                "op": "get_attr",
                "target": "0.weight",
                "meta": {
                    "val": {
                        "tensor": {
                            "shape": [2, 3],
                            "stride": [3, 1],
                            "dtype": {"dtype": "float"},
                            "device": "cpu",
                        }
                    }
                },
            },
        )

    return edited(edit, data)


@case("lstm-flat-weights-hook-reads-a-parametrized-weight", inputs=[{"randn": [2, 1, 4]}])
def lstm_hook():
    """an LSTM whose weight_hh_l0 is parametrized by a GraphModule: the loader's RNN hook
    (_init_flat_weights) reads every weight by name while loading"""
    data = lstm_file()

    def edit(program):
        lstm = module_at(program, "lstm")
        weight = lstm["parameters"].pop("weight_hh_l0")
        lstm["parametrized"] = ["weight_hh_l0"]
        payload = two_input_payload(SEED, returns="g")
        payload["graph"]["nodes"] = [n for n in payload["graph"]["nodes"] if n["name"] != "v"]
        lstm["children"]["parametrizations"] = {
            "class": "torch.nn.modules.container.ModuleDict",
            "training": False,
            "attributes": {},
            "parameters": {},
            "buffers": {},
            "children": {
                "weight_hh_l0": {
                    "class": "torch.nn.utils.parametrize.ParametrizationList",
                    "training": False,
                    "attributes": {"unsafe": True, "is_tensor": True, "ntensors": 1},
                    "parameters": {"original": weight},
                    "buffers": {},
                    "children": {"0": payload},
                }
            },
        }

    return edited(edit, data)


def _hook(attribute):
    @case(f"hook-in-attribute-{attribute}")
    def build():
        """a forward hook smuggled in as a module attribute, calling torch.manual_seed"""

        def edit(program):
            module_at(program, "lin")["attributes"][attribute] = {
                "dict": [[0, {"function": "torch.manual_seed"}]]
            }

        return edited(edit)

    return build


@case("graph-module-child-in-a-linear-called-by-hook-name")
def graph_module_as_hooks_child():
    """a GraphModule child named _forward_pre_hooks inside a Linear (a hook in disguise)"""

    def edit(program):
        module_at(program, "lin")["children"]["_forward_pre_hooks"] = two_input_payload(SEED)

    return edited(edit)


@case("parametrization-original-shadowed-by-attribute")
def original_as_attribute():
    """ParametrizationList attributes rewritten (is_tensor/ntensors) so the payload gets
    called with a different number of tensors than saved, still a GraphModule payload"""
    data = _weight_norm_with(nn.Linear(3, 2), [SEED])

    def edit(program):
        plist = module_at(program, "0")["children"]["parametrizations"]["children"]["weight"]
        plist["attributes"]["unsafe"] = False

    return edited(edit, data)


CASES = [
    linear,
    linear_chain,
    linear_bias,
    conv,
    embedding,
    layer_norm,
    wrapped,
    get_attr_check,
    lstm_hook,
    _hook("_forward_hooks"),
    _hook("_forward_pre_hooks"),
    _hook("_forward_hooks_with_kwargs"),
    _hook("_state_dict_hooks"),
    graph_module_as_hooks_child,
    original_as_attribute,
]
family("family1", CASES)


@pytest.mark.parametrize("attack", CASES, ids=[c.id for c in CASES])
def test_no_code_runs_while_loading(attack, verdicts):
    """The file is refused (SerializationError) and nothing is recorded, during load or call."""
    assert_refused(verdicts, attack)
