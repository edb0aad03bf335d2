"""Code written for torch.fx runs under fxloom: each test runs the same code on both.

The ``fx`` parameter is ``torch.fx`` or ``fxloom``; a test asserts what both
do (fxloom's extra behaviour, where there is some, is named in the test). The
cases come from gaps found running PyTorch's own ``test/test_fx.py`` under
fxloom: custom ``CodeGen`` subclasses, ``concrete_args`` as a tuple, a
submodule's own ``__call__``, TorchScript and torchbind call targets, traced
dictionary keys, ``check_mutable_operations`` and the ``get_attr`` warning.
"""

from __future__ import annotations

import copy
import operator
import pickle
import warnings
from typing import Any

import pytest
import torch
import torch.fx

import fxloom
from fxloom.passes.shape_prop import ShapeProp

BOTH = pytest.mark.parametrize("fx", [torch.fx, fxloom], ids=["torch.fx", "fxloom"])


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0)


# ------------------------------------------------------------------ CodeGen
def list_codegen(fx: Any, with_output: bool = False) -> Any:
    """torch.fx's documented example: the function takes its inputs as one list."""

    class ListCodeGen(fx.CodeGen):
        def gen_fn_def(self, free_vars, maybe_return_annotation):
            return (
                f"\ndef forward(self, args_list: List[torch.Tensor]){maybe_return_annotation}:"
                f"\n    {', '.join(free_vars)} = args_list"
            )

        def additional_globals(self):
            return [("List", list)]

        def process_inputs(self, *inputs):
            assert len(inputs) == 1
            return inputs[0]

    class ListInListOutCodeGen(ListCodeGen):
        def generate_output(self, output_args):  # torch.fx's signature: no repr_fn
            return f"return list({repr(output_args)})"

        def process_outputs(self, outputs):
            return list(outputs)

    return ListInListOutCodeGen() if with_output else ListCodeGen()


# Traced functions without annotations: annotations would print in ``free_vars``
# (``a: torch.Tensor``), which the list-unpacking frame cannot take.
def add(a, b):  # noqa: ANN001, ANN201
    return a + b


def add_twice(a, b):  # noqa: ANN001, ANN201
    a = a + b
    b = a + b
    return a, b


@BOTH
def test_a_custom_codegen_gets_the_parameters_without_self(fx: Any) -> None:
    gm = fx.symbolic_trace(add)
    gm.graph.set_codegen(list_codegen(fx))
    gm.recompile()
    assert "a, b = args_list" in gm.code
    vals = [torch.randn(3), torch.randn(3)]
    assert_same(gm(vals), add(*vals))
    vals = [torch.randn(5, 2), torch.randn(5, 2)]  # another size
    assert_same(gm(vals), add(*vals))


@BOTH
def test_a_custom_codegen_frame_may_name_torch(fx: Any) -> None:
    gm = fx.symbolic_trace(add)
    gm.graph.set_codegen(list_codegen(fx))
    code = gm.graph.python_code("self")
    assert "List[torch.Tensor]" in code.src
    assert code.globals["torch"] is torch


@BOTH
def test_generate_output_with_torch_fx_signature_gets_no_repr_fn(fx: Any) -> None:
    gm = fx.symbolic_trace(add_twice)
    gm.graph.set_codegen(list_codegen(fx, with_output=True))
    gm.recompile()
    assert gm.code.strip().splitlines()[-1].strip() == "return list((add, add_1))"
    vals = [torch.randn(3), torch.randn(3)]
    out = gm(vals)
    assert isinstance(out, list)
    for got, want in zip(out, add_twice(*vals)):
        assert_same(got, want)


@BOTH
def test_the_interpreter_follows_a_custom_codegen(fx: Any) -> None:
    gm = fx.symbolic_trace(add_twice)
    gm.graph.set_codegen(list_codegen(fx, with_output=True))
    gm.recompile()
    vals = [torch.randn(3), torch.randn(3)]
    interpreted = fx.Interpreter(gm).run(vals)
    assert isinstance(interpreted, list)
    for got, want in zip(interpreted, gm(vals)):
        assert_same(got, want)


@BOTH
def test_a_bare_codegen_runs_the_graph_between_process_inputs_and_outputs(fx: Any) -> None:
    gm = fx.symbolic_trace(add)
    gm.graph.set_codegen(list_codegen(fx))
    gm.recompile()
    bare = fx.GraphModule({}, copy.deepcopy(gm.graph))
    bare.graph.set_codegen(fx.CodeGen())
    bare.recompile()
    vals = [torch.randn(3), torch.randn(3)]
    assert_same(gm.graph.process_outputs(bare(*gm.graph.process_inputs(vals))), add(*vals))


@BOTH
def test_a_transformed_module_keeps_the_custom_codegen(fx: Any) -> None:
    gm = fx.symbolic_trace(add)
    gm.graph.set_codegen(list_codegen(fx))
    gm.recompile()
    transformed = fx.Transformer(gm).transform()
    vals = [torch.randn(3), torch.randn(3)]
    assert_same(transformed(vals), gm(vals))


@BOTH
def test_a_module_with_a_custom_codegen_scripts(fx: Any) -> None:
    gm = fx.symbolic_trace(add)
    gm.graph.set_codegen(list_codegen(fx))
    gm.recompile()
    vals = [torch.randn(3), torch.randn(3)]
    assert_same(torch.jit.script(gm)(vals), gm(vals))


def test_fxloom_codegen_hooks_may_still_take_repr_fn() -> None:
    class Doubled(fxloom.CodeGen):
        def generate_output(self, output_args, *, repr_fn=None):
            return f"return ({repr_fn(output_args)}, {repr_fn(output_args)})"

    g = fxloom.Graph()
    g.output(g.call_function(torch.neg, (g.placeholder("x"),)))
    g.set_codegen(Doubled())
    assert "return (neg, neg)" in g.python_code().src


# ------------------------------------------------------------ concrete_args
class TakesVarargs(torch.nn.Module):
    def forward(self, *args, **kwargs):
        return args[0] + args[1]


def branches(x: torch.Tensor, flag: bool) -> torch.Tensor:
    return x + 1 if flag else x - 1


@BOTH
def test_concrete_args_as_a_tuple_of_ph_gives_varargs_inputs(fx: Any) -> None:
    gm = fx.symbolic_trace(TakesVarargs(), concrete_args=(fx.PH, fx.PH))
    for shape in [(3,), (2, 5)]:
        a, b = torch.randn(shape), torch.randn(shape)
        assert_same(gm(a, b), a + b)


@BOTH
def test_concrete_args_as_a_tuple_fixes_parameters_in_order(fx: Any) -> None:
    gm = fx.symbolic_trace(branches, concrete_args=(fx.PH, True))
    x = torch.randn(4)
    assert_same(gm(x, True), x + 1)
    with pytest.raises(AssertionError):  # the value it was traced with is checked
        gm(x, False)


@BOTH
def test_a_module_traced_with_a_fixed_argument_traces_again(fx: Any) -> None:
    # torch.fx's test_pytree_concrete: the check of the fixed value is recorded, not run.
    gm = fx.symbolic_trace(fx.symbolic_trace(branches, concrete_args={"flag": True}))
    x = torch.randn(4)
    assert_same(gm(x, True), x + 1)
    with pytest.raises(AssertionError):
        gm(x, False)


@BOTH
def test_concrete_args_as_a_tuple_of_the_wrong_length_is_a_runtime_error(fx: Any) -> None:
    with pytest.raises(RuntimeError) as caught:
        fx.symbolic_trace(branches, concrete_args=(fx.PH,))
    if fx is fxloom:  # says which parameters the tuple should cover
        assert "2 parameters to fix (x, flag)" in str(caught.value)


# ------------------------------------------------------- a custom __call__
class CallsThroughItsOwnCall(torch.nn.Module):
    """torch.fx's test: the module's own ``__call__`` decides what forward computes."""

    def __init__(self) -> None:
        super().__init__()
        self.calling = False
        self.called = False

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t - t if self.calling else t + t

    def __call__(self, *args: Any) -> Any:
        self.called = True
        self.calling = True
        return super().__call__(*args)


class HoldsB(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.b = CallsThroughItsOwnCall()

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.b(t) * 2


@BOTH
def test_a_submodules_own_call_runs_when_it_is_traced_through(fx: Any) -> None:
    m = HoldsB()
    gm = fx.GraphModule(m, fx.Tracer().trace(m))
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [
        operator.sub,
        operator.mul,
    ]
    assert m.b.called
    t = torch.randn(3)
    assert_same(gm(t), torch.zeros(3))


@BOTH
def test_a_submodules_own_call_runs_when_it_is_a_leaf(fx: Any) -> None:
    class AllLeaves(fx.Tracer):
        def is_leaf_module(self, m: torch.nn.Module, qualified_name: str) -> bool:
            return True

    m = HoldsB()
    graph = AllLeaves().trace(m)
    assert [n.op for n in graph.nodes] == ["placeholder", "call_module", "call_function", "output"]
    assert m.b.called


def test_modules_call_is_put_back_after_tracing_a_custom_call() -> None:
    original = torch.nn.Module.__call__
    fxloom.symbolic_trace(HoldsB())
    assert torch.nn.Module.__call__ is original
    assert "__call__" not in vars(HoldsB)


# --------------------------------------------- TorchScript and torchbind targets
class Relu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


class HoldsScripted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.s = torch.jit.script(Relu())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.s(x) + self.s.forward(x)


@BOTH
def test_a_scripted_submodule_is_called_as_a_method_of_an_owned_attribute(fx: Any) -> None:
    m = HoldsScripted()
    gm = fx.symbolic_trace(m)
    ops = [n.op for n in gm.graph.nodes]
    assert ops.count("call_method") == 2 and "get_attr" in ops
    # No node's target is an object the GraphModule does not own.
    assert not any(n.op == "call_function" and n.target is not operator.add for n in gm.graph.nodes)
    for shape in [(3, 4), (5, 2)]:
        x = torch.randn(shape)
        assert_same(gm(x), m(x))


@BOTH
def test_a_module_calling_a_scripted_submodule_deep_copies(fx: Any) -> None:
    m = HoldsScripted()
    copied = copy.deepcopy(fx.symbolic_trace(m))
    x = torch.randn(3, 4)
    assert_same(copied(x), m(x))


def test_fxloom_refuses_to_pickle_a_scripted_submodule_naming_it() -> None:
    # torch.fx fails too, with torch's message about the scripted class.
    gm = fxloom.symbolic_trace(HoldsScripted())
    with pytest.raises(TypeError, match="submodule 's' is a TorchScript module"):
        pickle.dumps(gm)


def packed_linear() -> torch.ScriptObject:
    """A torchbind object shipped with torch: packed int8 weights of a linear layer."""
    weight = torch.quantize_per_tensor(torch.randn(4, 3), 0.1, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(weight, torch.zeros(4))


GLOBAL_PACKED = None


class QuantizedLinear(torch.nn.Module):
    def __init__(self, owned: bool) -> None:
        super().__init__()
        self.owned = owned
        if owned:
            self.packed = packed_linear()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self.packed if self.owned else GLOBAL_PACKED
        q = torch.quantize_per_tensor(x, 0.05, 64, torch.quint8)
        return torch.ops.quantized.linear(q, packed, 0.2, 64).dequantize()


@pytest.fixture
def global_packed() -> Any:
    global GLOBAL_PACKED
    GLOBAL_PACKED = packed_linear()
    yield GLOBAL_PACKED
    GLOBAL_PACKED = None


@BOTH
@pytest.mark.filterwarnings("ignore:.*quantized tensor creation.*:UserWarning")
def test_an_owned_torchbind_object_is_read_by_get_attr(fx: Any) -> None:
    m = QuantizedLinear(owned=True)
    gm = fx.symbolic_trace(m)
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["packed"]
    for batch in (2, 5):
        x = torch.randn(batch, 3)
        assert_same(gm(x), m(x))


@BOTH
@pytest.mark.filterwarnings("ignore:.*quantized tensor creation.*:UserWarning")
def test_a_global_torchbind_object_becomes_an_attribute_of_the_module(
    fx: Any, global_packed: Any
) -> None:
    m = QuantizedLinear(owned=False)
    gm = fx.symbolic_trace(m)
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["_torchbind_obj0"]
    assert gm._torchbind_obj0 is global_packed
    if fx is fxloom:  # torch.fx also sets it on the user's module
        assert not hasattr(m, "_torchbind_obj0")
    x = torch.randn(2, 3)
    assert_same(gm(x), m(x))


@BOTH
@pytest.mark.filterwarnings("ignore:.*quantized tensor creation.*:UserWarning")
@pytest.mark.parametrize("owned", [True, False])
def test_a_module_holding_a_torchbind_object_deep_copies(
    fx: Any, owned: bool, global_packed: Any
) -> None:
    m = QuantizedLinear(owned=owned)
    x = torch.randn(2, 3)
    assert_same(copy.deepcopy(fx.symbolic_trace(m))(x), m(x))


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation.*:UserWarning")
@pytest.mark.parametrize("owned", [True, False])
def test_a_module_holding_a_torchbind_object_pickles_in_fxloom(
    owned: bool, global_packed: Any
) -> None:
    # torch.fx's pickling fails here ('str' object has no attribute '__name__').
    m = QuantizedLinear(owned=owned)
    gm = fxloom.symbolic_trace(m)
    for batch in (2, 5):
        x = torch.randn(batch, 3)
        assert_same(pickle.loads(pickle.dumps(gm))(x), m(x))


# ------------------------------------------------------- traced dict keys
class KeysByTensor(torch.nn.Module):
    def forward(self, d: dict) -> torch.Tensor:
        return next(iter(d.values()))


class PassesTracedKey(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.m = KeysByTensor()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m({x: x})


@BOTH
def test_a_traced_value_as_a_dict_key_of_a_graph_argument_is_refused(fx: Any) -> None:
    class LeafTracer(fx.Tracer):
        def is_leaf_module(self, m: torch.nn.Module, qualified_name: str) -> bool:
            return isinstance(m, KeysByTensor)

    with pytest.raises(RuntimeError, match="cannot contain a Node") as caught:
        LeafTracer().trace(PassesTracedKey())
    if fx is fxloom:  # names the user's line
        assert "return self.m({x: x})" in str(caught.value)


@BOTH
def test_a_dict_keyed_by_a_traced_value_inside_the_program_still_traces(fx: Any) -> None:
    def look_up(x: torch.Tensor) -> torch.Tensor:
        d = {x: 1}
        return x + d[x]

    gm = fx.symbolic_trace(look_up)
    x = torch.randn(3)
    assert_same(gm(x), x + 1)


# ------------------------------------------------- check_mutable_operations
def sigmoid_into(x: torch.Tensor) -> torch.Tensor:
    y = torch.rand_like(x)
    torch.sigmoid(x, out=y)
    return y


def log_in_place(x: torch.Tensor) -> torch.Tensor:
    torch.log_(x)
    return x


def pure(x: torch.Tensor) -> torch.Tensor:
    return torch.add(torch.sigmoid(x), 1)


@BOTH
@pytest.mark.parametrize(
    ("fn", "schema"), [(sigmoid_into, "aten::sigmoid.out"), (log_in_place, "aten::log_")]
)
def test_check_mutable_operations_refuses_a_mutating_call(fx: Any, fn: Any, schema: str) -> None:
    class Checking(fx.Tracer):
        check_mutable_operations = True

    with pytest.raises(RuntimeError, match=f"Tried to trace mutable operation {schema}"):
        Checking().trace(fn)


@BOTH
def test_check_mutable_operations_lets_pure_calls_through(fx: Any) -> None:
    class Checking(fx.Tracer):
        check_mutable_operations = True

    graph = Checking().trace(pure)
    assert [n.target for n in graph.nodes if n.op == "call_function"] == [torch.sigmoid, torch.add]


@BOTH
def test_mutable_operations_are_recorded_by_default(fx: Any) -> None:
    graph = fx.Tracer().trace(log_in_place)
    assert any(n.target is torch.log_ for n in graph.nodes)


# ----------------------------------------------------- missing references
class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.rand(2))
        self.sub = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sub(x) + self.p


def warnings_inserting(gm: Any, insert: Any) -> list[str]:
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gm.graph.inserting_before(output):
            insert(gm.graph)
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@BOTH
def test_get_attr_of_an_existing_attribute_does_not_warn(fx: Any) -> None:
    gm = fx.symbolic_trace(Small())

    def insert(graph: Any) -> None:
        graph.get_attr("p")
        graph.get_attr("sub.weight")
        graph.get_attr("sub")

    assert warnings_inserting(gm, insert) == []


@BOTH
@pytest.mark.parametrize("target", ["missing", "sub.missing"])
def test_get_attr_of_a_missing_attribute_warns(fx: Any, target: str) -> None:
    gm = fx.symbolic_trace(Small())
    messages = warnings_inserting(gm, lambda graph: graph.get_attr(target))
    assert len(messages) == 1
    assert "Attempted to insert a get_attr Node with no underlying reference" in messages[0]
    if fx is fxloom:  # names the target
        assert repr(target) in messages[0]


def test_call_module_of_a_missing_submodule_warns_in_fxloom() -> None:
    # torch.fx raises an AttributeError from get_submodule here instead.
    gm = fxloom.symbolic_trace(Small())
    messages = warnings_inserting(gm, lambda graph: graph.call_module("missing", ()))
    assert len(messages) == 1 and "no submodule 'missing'" in messages[0]


def test_a_graph_without_an_owning_module_never_warns() -> None:
    g = fxloom.Graph()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.get_attr("anything")
        g.call_module("anything", ())


# ================================================= augmented assignment, names, DCE
def names_of(gm: Any) -> list[str]:
    return [node.name for node in gm.graph.nodes]


@BOTH
def test_augmented_assignment_records_add(fx: Any) -> None:
    def fn(x, y):
        x += y
        return x

    assert [n.target for n in fx.symbolic_trace(fn).graph.nodes][2] is operator.add


def _private(x):
    return x * 2


torch.fx.wrap("_private")
fxloom.wrap("_private")


@BOTH
def test_node_names_keep_leading_underscores(fx: Any) -> None:
    def fn(x):
        torch._assert(x.dim() == 1, "one dimension")
        return _private(x) + _private(x)

    assert names_of(fx.symbolic_trace(fn))[1:] == [
        "dim",
        "eq",
        "_assert",
        "_private",
        "_private_1",
        "add",
        "output",
    ]


class ReadsABuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("index", torch.arange(4))

    def forward(self, x):
        return x[self.index.view(2, 2)]


@BOTH
def test_a_tracer_reads_buffers_as_tensors(fx: Any) -> None:
    graph = fx.Tracer().trace(ReadsABuffer())
    ops = [node.op for node in graph.nodes]
    assert ops == ["placeholder", "get_attr", "call_function", "output"]  # the view: a constant


def test_symbolic_trace_traces_buffers_in_fxloom() -> None:
    gm = fxloom.symbolic_trace(ReadsABuffer())
    assert [node.name for node in gm.graph.nodes][1:3] == ["index", "view"]
    gm = fxloom.symbolic_trace(ReadsABuffer(), proxy_buffer_attributes=False)
    assert "view" not in names_of(gm)


@BOTH
def test_dead_code_elimination_drops_an_unused_in_place_update_of_a_fresh_value(fx: Any) -> None:
    def fn(x):
        y = torch.mul(x, 2)
        torch.relu_(y + 1)  # written, never read
        return y

    gm = fx.symbolic_trace(fn)
    gm.graph.eliminate_dead_code()
    assert names_of(gm) == ["x", "mul", "output"]


@BOTH
def test_dead_code_elimination_drops_an_in_place_module_nobody_reads(fx: Any) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(inplace=True))

    class Cut(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = model

        def forward(self, x):
            first = self.body[0](x)
            self.body[1](first * 1)
            return first

    gm = fx.symbolic_trace(Cut())
    gm.graph.eliminate_dead_code()
    assert names_of(gm) == ["x", "body_0", "output"]


@pytest.mark.parametrize("writes", ["input", "buffer"])
def test_dead_code_elimination_keeps_an_in_place_update_of_an_input_or_buffer(writes) -> None:
    class Writes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("total", torch.zeros(2))

        def forward(self, x):
            (x if writes == "input" else self.total).add_(1)
            return x * 2

    gm = fxloom.symbolic_trace(Writes())
    gm.graph.eliminate_dead_code()
    assert "add_" in names_of(gm)


def test_dead_code_elimination_keeps_an_in_place_update_read_later() -> None:
    # timm's DropPath in training: the mask is divided in place, then used. torch.fx drops
    # the div_ (its result is unused) and changes the values; fxloom keeps it.
    def drop_path(x):
        mask = x.new_ones(x.shape)
        mask.div_(0.5)
        return x * mask

    x = torch.ones(2)
    for fx, kept in ((torch.fx, False), (fxloom, True)):
        gm = fx.symbolic_trace(drop_path)
        gm.graph.eliminate_dead_code()
        gm.recompile()
        assert ("div_" in names_of(gm)) is kept
        assert torch.equal(gm(x), drop_path(x)) is kept


@BOTH
def test_an_unpacking_check_goes_with_the_items_it_protects(fx: Any) -> None:
    def fn(x):
        first, second = x.unbind(0)
        return x + 1

    gm = fx.symbolic_trace(fn)
    gm.graph.eliminate_dead_code()
    assert names_of(gm) == ["x", "add", "output"]


@BOTH
def test_private_names_of_torch_fx_graph_module_are_there(fx: Any) -> None:
    graph_module = __import__(f"{fx.__name__}.graph_module", fromlist=["_copy_attr"])
    root = torch.nn.Module()
    root.sub = torch.nn.Linear(2, 2)
    root.sub.register_buffer("scale", torch.ones(2))
    into = torch.nn.Module()
    graph_module._copy_attr(root, into, "sub.scale")
    assert "scale" in dict(into.sub.named_buffers()) and into.sub.training == root.sub.training
    copied = graph_module._CodeOnlyModule(dict(root.__dict__))
    assert copied.sub is root.sub
    assert graph_module._USER_PRESERVED_ATTRIBUTES_KEY == "_user_preserved_attributes"


@BOTH
def test_a_graph_module_deep_copies_pickles_and_saves_after_a_run(fx: Any) -> None:
    import io

    gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    x = torch.randn(3, 2)
    expected = gm(x)
    buffer = io.BytesIO()
    torch.save(gm, buffer)
    buffer.seek(0)
    for copied in (
        copy.deepcopy(gm),
        pickle.loads(pickle.dumps(gm)),
        torch.load(buffer, weights_only=False),
        fx.GraphModule(graph_module_body(fx, gm), gm.graph),
    ):
        assert_same(copied(x), expected)


class _ChannelsLast(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x.contiguous(memory_format=torch.channels_last))
        return y.to(memory_format=torch.contiguous_format)


def test_a_graph_module_naming_a_memory_format_saves_with_torch_save() -> None:
    """torch.save pickles at protocol 2, where torch's memory formats cannot be pickled
    themselves: a graph whose calls name one must still save. (torch.fx 2.13 raises
    AttributeError on this module: its pickler looks the format's name up as a global.)"""
    gm = fxloom.symbolic_trace(_ChannelsLast().eval())
    x = torch.randn(2, 3, 8, 8)
    expected = gm(x)
    for copied in (torch_saved_and_loaded(gm), pickle.loads(pickle.dumps(gm, 2))):
        assert_same(copied(x), expected)


def test_shape_metadata_naming_memory_formats_saves_with_torch_save() -> None:
    gm = fxloom.symbolic_trace(_ChannelsLast().eval())
    x = torch.randn(2, 3, 8, 8)
    ShapeProp(gm).propagate(x)
    loaded = torch_saved_and_loaded(gm)
    assert_same(loaded(x), gm(x))
    formats = {n.meta["tensor_meta"].memory_format for n in loaded.graph.nodes if n.op != "output"}
    assert formats == {torch.contiguous_format, torch.channels_last}


def torch_saved_and_loaded(module: torch.nn.Module) -> torch.nn.Module:
    import io

    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def graph_module_body(fx: Any, gm: Any) -> torch.nn.Module:
    """A deep copy of a run module's __dict__ as a root (torchvision's DualGraphModule copy)."""
    graph_module = __import__(f"{fx.__name__}.graph_module", fromlist=["_CodeOnlyModule"])
    return graph_module._CodeOnlyModule(copy.deepcopy(gm.__dict__))
