"""Tracing gives the graph torch.fx gives, side by side, in the corners ported code reaches.

Wrapped functions through a second trace, GraphModules as leaf submodules,
shared tensor constants, ``out=`` calls, the immutable argument containers under
torch's pytree, ``torch.profiler.record_function`` ranges, and the text of
``builtins`` and ``torch.ops`` targets.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx
import torch.utils._pytree as torch_pytree

import fxloom

LIBRARIES = pytest.mark.parametrize("fx", [torch.fx, fxloom], ids=["torch.fx", "fxloom"])


def scaled(x):
    return x * 2


torch.fx.wrap("scaled")
fxloom.wrap("scaled")
torch.fx.wrap("len")
fxloom.wrap("len")


class UsesWrapped(torch.nn.Module):
    def forward(self, x):
        return scaled(x) + len(x)


def calls(graph) -> list[tuple[str, object]]:
    return [(n.op, n.target) for n in graph.nodes if n.op not in ("placeholder", "output")]


# ------------------------------------------------------------ wrapped functions


@LIBRARIES
def test_wrapped_functions_stay_one_call_when_a_graph_module_is_traced_again(fx):
    traced = fx.symbolic_trace(UsesWrapped())
    again = fx.symbolic_trace(traced)
    expected = [
        ("call_function", scaled),
        ("call_function", len),
        ("call_function", operator.add),
    ]
    assert calls(traced.graph) == expected
    assert calls(again.graph) == expected
    x = torch.ones(3)
    assert torch.equal(again(x), UsesWrapped()(x))


def test_tracing_a_graph_module_again_leaves_its_generated_code_unpatched():
    traced = fxloom.symbolic_trace(UsesWrapped())
    generated_globals = dict(traced.forward.__globals__)
    fxloom.symbolic_trace(traced)
    assert traced.forward.__globals__ == generated_globals


# ------------------------------------------------------------ leaf GraphModules


def graph_modules_as_leaves(fx):
    class LeafTracer(fx.Tracer):
        def is_leaf_module(self, module, qualified_name):
            return isinstance(module, fx.GraphModule) or super().is_leaf_module(
                module, qualified_name
            )

    return LeafTracer()


@LIBRARIES
def test_a_graph_module_can_be_a_leaf_submodule_of_a_traced_model(fx):
    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = fx.symbolic_trace(UsesWrapped())

        def forward(self, x):
            return self.inner(x).relu()

    outer = Outer()
    graph = graph_modules_as_leaves(fx).trace(outer)
    assert calls(graph) == [("call_module", "inner"), ("call_method", "relu")]
    module = fx.GraphModule(outer, graph)
    assert isinstance(module.inner, fx.GraphModule)
    x = torch.randn(3)
    assert torch.equal(module(x), outer(x))


# ------------------------------------------------------------ tensor constants

CONSTANT = torch.tensor([1.0, 2.0, 3.0])


def _tensor_attributes(module: torch.nn.Module) -> list[str]:
    return [name for name, value in vars(module).items() if isinstance(value, torch.Tensor)] + [
        name for name, _ in module.named_buffers()
    ]


@LIBRARIES
def test_a_tensor_constant_used_twice_becomes_one_attribute(fx):
    traced = fx.symbolic_trace(lambda x: x * CONSTANT + CONSTANT)
    targets = {n.target for n in traced.graph.nodes if n.op == "get_attr"}
    assert len(targets) == 1
    assert torch.equal(getattr(traced, targets.pop()), CONSTANT)
    assert len(_tensor_attributes(traced)) == 1


# ------------------------------------------------------------ out=


def _out_graph_text(fx, fn) -> list[str]:
    graph = fx.symbolic_trace(fn).graph
    return [line.split("=", 1)[1] for line in str(graph).splitlines() if "out:" in line]


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, y: torch.add(x, y, out=y),
        lambda x, y: torch.mul(x, 2, out=y),
    ],
    ids=["proxy inputs", "proxy and scalar"],
)
def test_an_out_call_with_a_proxy_is_recorded_as_torch_fx_records_it(fn):
    assert _out_graph_text(fxloom, fn) == _out_graph_text(torch.fx, fn)
    traced = fxloom.symbolic_trace(fn)
    expected, out = torch.zeros(2), torch.zeros(2)
    fn(torch.full((2,), 3.0), expected)
    traced(torch.full((2,), 3.0), out)
    assert torch.equal(out, expected)


@LIBRARIES
def test_an_out_call_the_kernel_refuses_fails_when_run_as_in_torch_fx(fx):
    traced = fx.symbolic_trace(lambda x, y: torch.max(x, 0, out=(y, y)))
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype long"):
        traced(torch.ones(2), torch.zeros(2))


def test_an_out_call_whose_result_is_unused_survives_dead_code_elimination():
    # A deliberate difference: torch.fx's eliminate_dead_code drops this call,
    # and y is never written.
    def fill(x, y):
        torch.add(x, x, out=y)
        return y

    traced = fxloom.symbolic_trace(fill)
    traced.graph.eliminate_dead_code()
    out = torch.zeros(2)
    traced(torch.ones(2), out)
    assert torch.equal(out, torch.full((2,), 2.0))


# ------------------------------------------------------------ torch's pytree


@LIBRARIES
def test_immutable_list_flattens_with_torch_pytree(fx):
    value = fx.immutable_collections.immutable_list([1, [2, 3]])
    leaves, spec = torch_pytree.tree_flatten(value)
    assert leaves == [1, 2, 3]
    rebuilt = torch_pytree.tree_unflatten([4, 5, 6], spec)
    assert type(rebuilt) is type(value) and rebuilt == [4, [5, 6]]


@LIBRARIES
def test_immutable_dict_flattens_with_torch_pytree_with_paths(fx):
    value = fx.immutable_collections.immutable_dict(a=1, b=2)
    assert torch_pytree.tree_leaves(value) == [1, 2]
    paths = [path for path, _ in torch_pytree.tree_flatten_with_path(value)[0]]
    assert paths == [(torch_pytree.MappingKey("a"),), (torch_pytree.MappingKey("b"),)]
    rebuilt = torch_pytree.tree_unflatten([3, 4], torch_pytree.tree_structure(value))
    assert type(rebuilt) is type(value) and rebuilt == {"a": 3, "b": 4}


def test_node_arguments_flatten_with_torch_pytree():
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    cat = graph.call_function(torch.cat, ([x, x],), {"dim": 0})
    assert torch_pytree.tree_leaves((cat.args, cat.kwargs)) == [x, x, 0]


# ------------------------------------------------------------ profiler ranges


def with_range(x):
    with torch.profiler.record_function("block"):
        y = x + 1
    return y


@LIBRARIES
def test_record_function_is_traced_through_as_in_torch_fx(fx):
    traced = fx.symbolic_trace(with_range)
    assert calls(traced.graph) == [("call_function", operator.add)]


def _range_graph(fx):
    graph = fx.Graph()
    x = graph.placeholder("x")
    handle = graph.call_function(torch.ops.profiler._record_function_enter_new, ("block",))
    y = graph.call_function(operator.add, (x, 1))
    graph.call_function(torch.ops.profiler._record_function_exit._RecordFunction, (handle,))
    graph.call_function(torch.ops.profiler._record_function_enter.default, ("old",))
    graph.output(y)
    return graph


@LIBRARIES
def test_profiler_range_calls_survive_dead_code_elimination(fx):
    graph = _range_graph(fx)
    before = calls(graph)
    graph.eliminate_dead_code()
    assert calls(graph) == before


def test_profiler_ranges_are_side_effects_that_write_nothing():
    for op in (
        torch.ops.profiler._record_function_enter_new,
        torch.ops.profiler._record_function_enter_new.default,
        torch.ops.profiler._record_function_exit._RecordFunction,
    ):
        assert fxloom.ops.mutation.function_has_side_effect(op)
        assert fxloom.ops.mutation.is_read_only_effect(op)


# ------------------------------------------------------------ graph text


def _builtin_and_ops_graph(fx):
    graph = fx.Graph()
    x = graph.placeholder("x")
    shape = graph.call_function(getattr, (x, "shape"))
    size = graph.call_function(len, (shape,))
    added = graph.call_function(torch.ops.aten.add.Tensor, (x, x))
    packet = graph.call_function(torch.ops.aten.relu, (added,))
    summed = graph.call_function(operator.add, (size, 1))
    graph.output((packet, summed))
    return graph


def _targets(graph) -> list[str]:
    return [line.split("[target=")[1].split("]")[0] for line in str(graph).splitlines()[1:-1]]


def test_graph_text_names_builtins_and_torch_ops_targets_as_torch_fx_does():
    ours = _targets(_builtin_and_ops_graph(fxloom))
    assert ours == _targets(_builtin_and_ops_graph(torch.fx))
    assert ours[1:4] == ["builtins.getattr", "builtins.len", "torch.ops.aten.add.Tensor"]
