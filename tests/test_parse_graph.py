"""``fxloom.parse_graph``: the text ``print(graph)`` writes reads back into the same graph.

Round trips cover every graph kind fxloom produces (traces of the embedded zoo and of Hugging
Face models, exported ATen programs, hand-written graphs); a module rebuilt from the parsed
graph computes what the original computes; unsafe or malformed text is refused, naming the
culprit.
"""

from __future__ import annotations

import operator
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import fxloom
from fxloom import zoo
from fxloom.serialize.graph_text import GraphParseError

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is not installed; import it from the checkout
    sys.path.insert(0, str(ROOT))

ZOO_MODELS = ["resnet_tiny", "resnet50", "transformer_tiny", "mlp_tiny", "deeprec", "cnn_small"]
HF_MODELS = ["bert", "gpt2", "t5"]


def assert_round_trips(graph: fxloom.Graph) -> fxloom.Graph:
    text = str(graph)
    parsed = fxloom.parse_graph(text)
    assert str(parsed) == text
    return parsed


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_traced_zoo_model_round_trips(name):
    model, _ = zoo.build(name)
    assert_round_trips(fxloom.symbolic_trace(model).graph)


@pytest.mark.parametrize("name", HF_MODELS)
def test_traced_hugging_face_model_round_trips(name):
    transformers = pytest.importorskip("transformers")
    from benchmarks.zoo.methods import fixed_args
    from benchmarks.zoo.registry import get

    model, inputs = get(name).build()
    gm = fxloom.symbolic_trace(model, fixed_args(model, inputs), example_inputs=inputs)
    text = str(gm.graph)
    # Targets (model output classes) and annotations name transformers' objects: the caller's.
    parsed = fxloom.parse_graph(text, namespace={"transformers": transformers})
    assert str(parsed) == text


@pytest.mark.parametrize("name", ["mlp_tiny", "cnn_small"])
def test_exported_program_with_aten_overloads_round_trips(name):
    model, inputs = zoo.build(name)
    program = fxloom.export.export(model, tuple(inputs))
    text = str(program.graph)
    assert "torch.ops.aten." in text
    assert_round_trips(program.graph)


def test_exported_hugging_face_model_round_trips_before_and_after_decomposition():
    pytest.importorskip("transformers")
    from benchmarks.zoo.methods import FLAGS, fixed_args
    from benchmarks.zoo.registry import get

    model, inputs = get("bert").build()
    flags = {k: v for k, v in fixed_args(model, inputs).items() if k in FLAGS}
    program = fxloom.export.export(model, args=(), kwargs={**inputs, **flags})
    assert_round_trips(program.graph)
    assert_round_trips(program.run_decompositions().graph)


def test_annotation_naming_an_unknown_type_stays_text():
    text = """graph():
    %x : mylib.Box | None [num_users=1] = placeholder[target=x]
    return x"""
    assert str(fxloom.parse_graph(text)) == text


def test_module_from_parsed_graph_runs_like_the_original():
    model, inputs = zoo.build("resnet_tiny")
    gm = fxloom.symbolic_trace(model)
    rebuilt = fxloom.GraphModule(gm, fxloom.parse_graph(str(gm.graph)))
    assert_close(rebuilt(*inputs), gm(*inputs))


def test_hand_written_graph_parses_with_literals_of_every_kind():
    text = """graph():
    %x : torch.Tensor [num_users=3] = placeholder[target=x]
    %n : [num_users=1] = placeholder[target=n](default=2)
    %getitem : [num_users=1] = call_function[target=operator.getitem](args = (%x, (slice(None, -1, None), Ellipsis)), kwargs = {})
    %to : [num_users=1] = call_method[target=to](args = (%getitem,), kwargs = {dtype: torch.float64, device: device(type='cpu'), memory_format: torch.contiguous_format})
    %clamp : [num_users=1] = call_function[target=torch.clamp](args = (%to,), kwargs = {min: -inf, max: 1e-05})
    %new_zeros : [num_users=1] = call_method[target=new_zeros](args = (%x, torch.Size([2, 3])), kwargs = {layout: torch.strided})
    %cat : [num_users=1] = call_function[target=torch.cat](args = ([%clamp, %x],), kwargs = {dim: 0})
    %mul : [num_users=1] = call_function[target=operator.mul](args = (%cat, %n), kwargs = {})
    return (mul, new_zeros, {a: 'b"c', n: None})"""
    graph = fxloom.parse_graph(text)
    assert str(graph) == text
    gm = fxloom.GraphModule(torch.nn.Module(), graph)
    out, zeros, _ = gm(torch.ones(2, 3))
    assert out.dtype == torch.float64 and zeros.shape == (2, 3)


def test_numpy_scalar_constants_round_trip():
    np = pytest.importorskip("numpy")
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(operator.mul, (x, np.float64(0.5))))
    parsed = assert_round_trips(graph)
    (mul,) = [n for n in parsed.nodes if n.op == "call_function"]
    assert type(mul.args[1]) is np.float64


def test_namespace_supplies_user_functions():
    def scale(t, factor):
        return t * factor

    graph = fxloom.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(scale, (x, 3)))
    text = str(graph)
    with pytest.raises(GraphParseError, match="namespace"):
        fxloom.parse_graph(text)
    name = text.split("target=")[2].split("]")[0]
    parsed = fxloom.parse_graph(text, namespace={name: scale})
    assert str(parsed) == text
    (call,) = [n for n in parsed.nodes if n.op == "call_function"]
    assert call.target is scale


def test_unknown_target_is_refused_naming_it():
    text = """graph():
    %x : [num_users=1] = placeholder[target=x]
    %system : [num_users=1] = call_function[target=os.system](args = ('echo hi',), kwargs = {})
    return system"""
    with pytest.raises(
        GraphParseError, match=r"line 3: target 'os.system' is not allowed.*namespace"
    ):
        fxloom.parse_graph(text)


@pytest.mark.parametrize(
    "target",
    [
        "builtins.eval",
        "builtins.exec",
        "eval",
        "torch.load",
        "torch.os.system",
        "torch.hub.load",
        "torch.utils.cpp_extension.load",
        "operator.methodcaller",
        "operator.call",
        "torch.ops.os.system",
    ],
)
def test_dangerous_reachable_callables_are_refused(target):
    text = f"""graph():
    %y : [num_users=1] = call_function[target={target}](args = ('1',), kwargs = {{}})
    return y"""
    with pytest.raises(GraphParseError, match="not allowed"):
        fxloom.parse_graph(text)


def test_malformed_line_is_reported_with_its_number():
    text = """graph():
    %x : [num_users=1] = placeholder[target=x]
    %y = relu(%x)
    return y"""
    with pytest.raises(GraphParseError, match="line 3"):
        fxloom.parse_graph(text)


def test_undefined_node_is_refused_naming_it():
    text = """graph():
    %x : [num_users=1] = placeholder[target=x]
    %add : [num_users=1] = call_function[target=operator.add](args = (%x, %ghost), kwargs = {})
    return add"""
    with pytest.raises(GraphParseError, match=r"line 3: '%ghost' is used before it is defined"):
        fxloom.parse_graph(text)


def test_unknown_call_method_name_is_refused():
    text = """graph():
    %x : [num_users=1] = placeholder[target=x]
    %m : [num_users=1] = call_method[target=__reduce_ex_nope__](args = (%x,), kwargs = {})
    return m"""
    with pytest.raises(GraphParseError, match="not a Tensor method"):
        fxloom.parse_graph(text)


def test_getattr_of_a_dunder_attribute_is_refused():
    text = """graph():
    %x : [num_users=1] = placeholder[target=x]
    %g : [num_users=1] = call_function[target=builtins.getattr](args = (torch.nn.functional.relu, '__globals__'), kwargs = {})
    return g"""
    with pytest.raises(
        GraphParseError, match="line 3: getattr of the attribute .__globals__. is not allowed"
    ):
        fxloom.parse_graph(text)


def test_call_method_of_a_non_tensor_attribute_is_refused():
    text = """graph():
    %x : [num_users=1] = placeholder[target=x]
    %c : [num_users=1] = call_method[target=__call__](args = (%x,), kwargs = {})
    return c"""
    with pytest.raises(GraphParseError, match="not a Tensor method"):
        fxloom.parse_graph(text)


def test_text_is_never_evaluated():
    text = """graph():
    %x : [num_users=1] = placeholder[target=x]
    %add : [num_users=1] = call_function[target=operator.add](args = (%x, __import__('os')), kwargs = {})
    return add"""
    with pytest.raises(GraphParseError, match="line 3"):
        fxloom.parse_graph(text)


def test_operator_targets_resolve_to_the_operator_functions():
    text = """graph():
    %x : [num_users=1] = placeholder[target=x]
    %add : [num_users=1] = call_function[target=operator.add](args = (%x, 1), kwargs = {})
    return add"""
    (add,) = [n for n in fxloom.parse_graph(text).nodes if n.op == "call_function"]
    assert add.target is operator.add


def test_a_class_given_as_an_argument_prints_by_name_and_reads_back():
    # fxloom show prints what a file's graph holds; a class value (isinstance's) must read back.
    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(isinstance, (x, dict)))
    assert "(%x, dict)" in str(g)
    assert str(fxloom.parse_graph(str(g))) == str(g)
