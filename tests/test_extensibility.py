"""Extension points code written for torch.fx relies on, each checked side by side with torch.fx.

``ProxyableClassMeta``; the ``__fx_create_arg__`` protocol; dataclass
instances and ``Enum`` members in arguments and outputs; user attributes on
nodes; ``Node.insert_arg``; ``Interpreter.boxed_run``; pickling and
deep-copying a lone node; deep-copying a ``Tracer``; pickling GraphModules
that call custom ``torch.ops`` operators or hold torchbind objects.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import gc
import operator
import pickle
import weakref

import pytest
import torch
import torch.fx
from torch.testing import assert_close

import fxloom as fx
import fxloom.proxy
import fxloom.tracer

LIBRARIES = [fx, torch.fx]


def chain(lib) -> tuple:
    """``x -> relu -> add 1 -> output`` built with ``lib``'s Graph; returns (graph, relu node)."""
    g = lib.Graph()
    x = g.placeholder("x")
    relu = g.call_function(torch.relu, (x,))
    g.output(g.call_function(operator.add, (relu, 1)))
    return g, relu


def named(graph, name: str):
    return next(n for n in graph.nodes if n.name == name)


# ------------------------------------------------------ ProxyableClassMeta
class TensorPair(metaclass=fx.ProxyableClassMeta):
    def __init__(self, left, right):
        self.left, self.right = left, right

    def add(self, other):
        return TensorPair(self.left + other.left, self.right + other.right)


class TorchFxTensorPair(metaclass=torch.fx.ProxyableClassMeta):
    def __init__(self, left, right):
        self.left, self.right = left, right

    def add(self, other):
        return TorchFxTensorPair(self.left + other.left, self.right + other.right)


def test_constructing_a_proxyable_class_from_proxies_is_recorded_as_one_call():
    def build(x, y):
        return TensorPair(y, y).add(x)

    def build_fx(x, y):
        return TorchFxTensorPair(y, y).add(x)

    gm, ref = fx.symbolic_trace(build), torch.fx.symbolic_trace(build_fx)
    constructions = [n for n in gm.graph.nodes if n.target is TensorPair]
    assert [(n.op, len(n.args)) for n in constructions] == [("call_function", 2)]
    assert [n.op for n in gm.graph.nodes] == [n.op for n in ref.graph.nodes]
    y = torch.randn(3)
    pair = gm(TensorPair(torch.ones(3), torch.zeros(3)), y)
    expected = ref(TorchFxTensorPair(torch.ones(3), torch.zeros(3)), y)
    assert_close(pair.left, expected.left)
    assert_close(pair.right, expected.right)


def test_a_proxyable_class_without_proxies_is_constructed_as_usual():
    pair = TensorPair(1, 2)
    assert type(pair) is TensorPair and (pair.left, pair.right) == (1, 2)


def test_proxyable_class_meta_is_exported_where_torch_fx_exports_it():
    assert fx.ProxyableClassMeta is fxloom.proxy.ProxyableClassMeta
    assert fxloom.tracer.ProxyableClassMeta is fx.ProxyableClassMeta  # torch.fx._symbolic_trace


# ------------------------------------------------------ __fx_create_arg__
class Scaled:
    """A custom argument object: becomes ``factor * value`` in the graph."""

    def __init__(self, value, factor):
        self.value, self.factor = value, factor

    def __fx_create_arg__(self, tracer):
        return tracer.create_node(
            "call_function",
            operator.mul,
            (tracer.create_arg(self.value), self.factor),
            {},
        )


@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_an_object_with_fx_create_arg_is_turned_into_a_graph_argument_by_it(lib):
    def f(x):
        return x + Scaled(x, 3)

    gm = lib.symbolic_trace(f)
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert calls == [operator.mul, operator.add]
    x = torch.randn(4)
    assert_close(gm(x), x + x * 3)


def scaled_class_to(x, cls):
    return x if cls is Scaled else -x


fx.wrap("scaled_class_to")


def test_a_class_defining_fx_create_arg_is_passed_as_a_plain_value():
    gm = fx.symbolic_trace(lambda x: scaled_class_to(x, Scaled))
    x = torch.randn(2)
    assert_close(gm(x), x)


# ------------------------------------------------------ dataclasses, enums
@dataclasses.dataclass
class Prediction:
    logits: torch.Tensor
    label: int = 0


class Color(enum.Enum):
    RED = 1
    GREEN = 2


@fx.wrap
def tint(x, color):
    return x * color.value


@torch.fx.wrap
def tint_fx(x, color):
    return x * color.value


@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_a_dataclass_returned_from_forward_is_rebuilt_by_its_constructor(lib):
    def predict(x):
        return Prediction(x + 1, label=4)

    gm = lib.symbolic_trace(predict)
    (call,) = [n for n in gm.graph.nodes if n.target is Prediction]
    assert call.op == "call_function" and set(call.kwargs) == {"logits", "label"}
    x = torch.randn(2)
    out = gm(x)
    assert type(out) is Prediction and out.label == 4
    assert_close(out.logits, predict(x).logits)


def top_logit(prediction):
    return prediction.logits.max()


fx.wrap("top_logit")


def test_a_dataclass_passed_to_a_wrapped_function_is_rebuilt_with_the_traced_fields():
    def f(x):
        return top_logit(Prediction(x * 2))

    gm = fx.symbolic_trace(f)
    x = torch.randn(5)
    assert_close(gm(x), (x * 2).max())


def tinted(x):
    return tint(x, Color.GREEN), Color.RED


def tinted_fx(x):
    return tint_fx(x, Color.GREEN), Color.RED


@pytest.mark.parametrize("lib,f", [(fx, tinted), (torch.fx, tinted_fx)], ids=["fxloom", "torch.fx"])
def test_enum_members_stay_constants_in_arguments_and_outputs(lib, f):
    gm = lib.symbolic_trace(f)
    assert "Color.GREEN" in gm.code and "Color.RED" in gm.code
    x = torch.randn(3)
    out, color = gm(x)
    assert_close(out, x * 2)
    assert color is Color.RED


# ------------------------------------------------------ node attributes
@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_nodes_accept_user_attributes(lib):
    g, relu = chain(lib)
    relu.tag = "quantize"
    assert relu.tag == "quantize"
    assert not hasattr(named(g, "add"), "tag")


@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_user_attributes_travel_with_a_pickled_graph(lib):
    g, relu = chain(lib)
    relu.tag = "quantize"
    assert named(pickle.loads(pickle.dumps(g)), "relu").tag == "quantize"


@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_user_attributes_stay_behind_when_a_graph_is_copied(lib):
    g, relu = chain(lib)
    relu.tag = "quantize"
    copies = [copy.deepcopy(g)]
    val_map: dict = {}
    g3 = lib.Graph()
    g3.graph_copy(g, val_map)
    copies.append(g3)
    for copied in copies:
        assert not hasattr(named(copied, "relu"), "tag")
    assert not hasattr(g3.node_copy(relu, lambda n: val_map[n]), "tag")


# ------------------------------------------------------ insert_arg
@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_insert_arg_inserts_before_the_index_and_records_the_new_user(lib):
    g = lib.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    cat = g.call_function(torch.cat, ([x],))
    cat.insert_arg(1, 0)
    cat.insert_arg(0, y)
    assert cat.args == (y, [x], 0)
    assert cat in y.users
    cat.insert_arg(len(cat.args), 1)
    assert cat.args[-1] == 1


def test_insert_arg_out_of_range_names_the_node_and_the_allowed_range():
    g, relu = chain(fx)
    with pytest.raises(IndexError, match=r"%relu, which has 1 positional arguments \(0 to 1"):
        relu.insert_arg(2, 0)


# ------------------------------------------------------ boxed_run
@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_boxed_run_empties_the_list_and_returns_what_run_returns(lib):
    gm = lib.symbolic_trace(lambda x, y: torch.relu(x) + y)
    x, y = torch.randn(3), torch.randn(3)
    inputs = [x, y]
    result = lib.Interpreter(gm).boxed_run(inputs)
    assert inputs == []
    assert_close(result, torch.relu(x) + y)


def test_boxed_run_frees_an_input_after_its_last_use():
    gm = fx.symbolic_trace(lambda x: torch.relu(x).neg().exp())
    seen_alive = []

    class Watch(fx.Interpreter):
        def call_method(self, target, args, kwargs):
            gc.collect()
            seen_alive.append(watched() is not None)
            return super().call_method(target, args, kwargs)

    inputs = [torch.randn(3)]
    watched = weakref.ref(inputs[0])
    Watch(gm).boxed_run(inputs)
    assert seen_alive == [False, False]  # relu was x's last use


def test_boxed_run_with_the_wrong_number_of_inputs_names_the_placeholders():
    gm = fx.symbolic_trace(lambda x, y: x + y)
    with pytest.raises(RuntimeError, match=r"2 placeholders \(x, y\) but 1 arguments"):
        fx.Interpreter(gm).boxed_run([torch.ones(1)])


# ------------------------------------------------------ lone nodes
@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_a_pickled_node_comes_back_inside_a_copy_of_its_graph(lib):
    g, relu = chain(lib)
    relu.tag = "quantize"
    loaded = pickle.loads(pickle.dumps(relu))
    assert loaded.name == "relu" and loaded.graph is not g
    assert loaded.tag == "quantize"
    assert [n.name for n in loaded.graph.nodes] == ["x", "relu", "add", "output"]
    assert named(loaded.graph, "relu") is loaded


def test_a_deep_copied_node_comes_with_a_copy_of_its_graph():
    # torch.fx also copies the graph, but its copy of the node is not among
    # the copied graph's nodes; here it is.
    g, relu = chain(fx)
    copied = copy.deepcopy(relu)
    assert copied is not relu and copied.graph is not g
    assert named(copied.graph, "relu") is copied


def test_an_erased_node_cannot_be_pickled():
    g = fx.Graph()
    x = g.placeholder("x")
    g.erase_node(x)
    with pytest.raises(TypeError, match="%x: it was erased"):
        pickle.dumps(x)


# ------------------------------------------------------ deep-copying a Tracer
class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x).relu() + torch.ones(3)


@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_a_tracer_deep_copied_before_tracing_traces_like_the_original(lib):
    tracer = copy.deepcopy(lib.Tracer())
    graph = tracer.trace(Net())
    assert [n.op for n in graph.nodes] == [n.op for n in lib.Tracer().trace(Net()).nodes]


@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_a_tracer_deep_copied_after_tracing_owns_copies_of_root_and_graph(lib):
    tracer = lib.Tracer()
    net = Net()
    graph = tracer.trace(net)
    copied = copy.deepcopy(tracer)
    assert copied.root is not net and copied.graph is not graph
    assert [n.name for n in copied.graph.nodes] == [n.name for n in graph.nodes]
    gm = lib.GraphModule(copied.root, copied.graph)
    x = torch.randn(2, 3)
    assert_close(gm(x), net(x))


def test_a_deep_copied_tracer_keeps_its_settings_and_shares_autowrap_modules():
    import math

    tracer = fx.Tracer(autowrap_functions=(len,), param_shapes_constant=True)
    tracer.trace(Net())
    copied = copy.deepcopy(tracer)
    assert copied.autowrap_modules == (math,) and copied.autowrap_modules[0] is math
    assert copied.autowrap_functions == (len,) and copied.param_shapes_constant
    assert copied.submodule_paths[copied.root.lin] == "lin"


# ------------------------------------------------------ custom ops, torchbind
@torch.library.custom_op("fxloom_test::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@scale.register_fake
def _(x, factor):
    return torch.empty_like(x)


def calls_custom_op(x):
    return torch.ops.fxloom_test.scale.default(x, 2.0) + torch.ops.fxloom_test.scale(x, 3.0)


@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_a_graph_module_calling_custom_operators_pickles(lib):
    gm = lib.symbolic_trace(calls_custom_op)
    loaded = pickle.loads(pickle.dumps(gm))
    x = torch.randn(4)
    assert_close(loaded(x), x * 5)
    targets = [n.target for n in loaded.graph.nodes if n.op == "call_function"]
    assert targets[:2] == [torch.ops.fxloom_test.scale.default, torch.ops.fxloom_test.scale]


def test_operators_in_arguments_and_meta_pickle_as_references():
    g = fx.Graph()
    x = g.placeholder("x")
    call = g.call_function(torch.ops.fxloom_test.scale.default, (x, 2.0))
    call.meta["replaces"] = torch.ops.aten.mul.Tensor
    g.output((call, torch.ops.aten.add.Tensor))
    loaded = pickle.loads(pickle.dumps(g))
    assert named(loaded, "scale_default").meta["replaces"] is torch.ops.aten.mul.Tensor
    (output,) = [n for n in loaded.nodes if n.op == "output"]
    assert output.args[0][1] is torch.ops.aten.add.Tensor


def test_loading_a_graph_whose_operator_is_not_registered_says_what_to_import():
    from fxloom._graph_pickle import _OperatorRef

    with pytest.raises(RuntimeError, match=r"torch\.ops\.fxloom_test\.missing\.default"):
        _OperatorRef("ops.fxloom_test.missing.default").resolve()


def packed_linear_weights() -> torch.ScriptObject:
    """A torchbind object built into torch: fp16-packed linear weights (needs fbgemm)."""
    try:
        return torch.ops.quantized.linear_prepack_fp16(torch.randn(4, 3), torch.randn(4))
    except RuntimeError as err:  # a torch build without the quantized CPU engine
        pytest.skip(f"no torchbind class usable here: {err}")


def packed_linear_root() -> torch.nn.Module:
    root = torch.nn.Module()
    root.packed = packed_linear_weights()
    return root


class PackedLinear(torch.nn.Module):
    def __init__(self, packed: torch.ScriptObject) -> None:
        super().__init__()
        self.packed = packed

    def forward(self, x):
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)


@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_a_torchbind_attribute_is_traced_as_get_attr_and_the_module_pickles(lib):
    net = torch.nn.Sequential(PackedLinear(packed_linear_weights()))
    gm = lib.symbolic_trace(net)
    assert [(n.op, n.target) for n in gm.graph.nodes if n.op == "get_attr"] == [
        ("get_attr", "0.packed")
    ]
    x = torch.randn(2, 3)
    assert_close(pickle.loads(pickle.dumps(gm))(x), net(x))


@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_a_torchbind_object_that_is_no_attribute_of_the_root_becomes_one_of_the_module(lib):
    packed = packed_linear_weights()

    def f(x):
        return torch.ops.quantized.linear_dynamic_fp16(x, packed)

    gm = lib.symbolic_trace(f)
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["_torchbind_obj0"]
    assert gm._torchbind_obj0 is packed
    for batch in (2, 5):
        x = torch.randn(batch, 3)
        assert_close(gm(x), f(x))


@pytest.mark.parametrize("lib", LIBRARIES, ids=["fxloom", "torch.fx"])
def test_a_graph_module_holding_a_torchbind_object_pickles_and_deep_copies(lib):
    g = lib.Graph()
    x, packed = g.placeholder("x"), g.get_attr("packed")
    g.output(g.call_function(torch.ops.quantized.linear_dynamic_fp16.default, (x, packed)))
    gm = lib.GraphModule(packed_linear_root(), g)
    inputs = torch.randn(2, 3)
    for copied in (pickle.loads(pickle.dumps(gm)), copy.deepcopy(gm)):
        assert isinstance(copied.packed, torch.ScriptObject)
        assert_close(copied(inputs), gm(inputs))
