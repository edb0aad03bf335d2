"""What one trace owns and what it leaves behind: per-trace state, the patch gate, graph constants.

A ``Tracer`` holds configuration; everything a trace accumulates (root,
graph, captured constants, parameter proxies, the module stack, patches) is
created afresh by each ``trace``. While example values are computed the
trace's patches stand aside, so the examples run as eager code. Tensors the
trace captures live in ``Graph.constants``, which travels with the graph.
"""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import fxloom as fx

SCALE = torch.tensor([1.0, 2.0, 3.0])  # a global tensor: captured as a graph constant
OFFSET = torch.tensor([0.5, 0.5, 0.5])


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x) * SCALE


class Shifted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * self.weight + OFFSET


# ------------------------------------------------------------ per-trace state
def test_a_reused_tracer_shares_no_state_between_traces():
    tracer = fx.Tracer()
    first = tracer.trace(Scaled())
    first_constants = dict(first.constants)
    second = tracer.trace(Shifted())
    assert list(first.constants) == list(first_constants) == ["_tensor_constant0"]
    assert first.constants["_tensor_constant0"] is SCALE  # untouched by the second trace
    assert second.constants["_tensor_constant0"] is OFFSET  # numbered afresh
    assert tracer.graph is second
    assert set(tracer.submodule_paths.values()) == {""}  # Shifted has no submodules
    assert list(tracer.tensor_attrs.values()) == ["_tensor_constant0"]
    get_attrs = [n for n in second.nodes if n.op == "get_attr"]
    assert [n.target for n in get_attrs] == ["weight", "_tensor_constant0"]
    assert all(user.graph is second for n in get_attrs for user in n.users)


class SharedLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(nn.ReLU(), nn.Linear(2, 2))
        self.head = self.blocks[1]  # reachable twice: the first path names it
        self.alias = self.blocks

    def forward(self, x):
        return self.head(self.blocks(x))


def test_submodule_paths_name_each_module_by_its_first_path_as_torch_fx_does():
    root = SharedLayer()
    tracer = fx.Tracer()
    graph = tracer.trace(root)
    fx_paths = {module: name for name, module in root.named_modules()}  # torch.fx's index
    assert list(tracer.submodule_paths.items()) == list(fx_paths.items())
    targets = [n.target for n in graph.find_nodes(op="call_module")]
    assert targets == ["blocks.0", "blocks.1", "blocks.1"]  # head is called as blocks.1


def test_a_tracer_that_has_not_traced_has_an_empty_root_and_graph():
    tracer = fx.Tracer()
    assert isinstance(tracer.root, nn.Module) and len(tracer.graph.nodes) == 0
    assert tracer.tensor_attrs == {}


def test_the_module_stack_is_empty_again_after_a_failing_submodule():
    class Failing(nn.Module):
        def forward(self, x):
            raise ValueError("no")

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Failing()

        def forward(self, x):
            return self.inner(x)

    tracer = fx.Tracer()
    with pytest.raises(fx.TraceError) as info:
        tracer.trace(Outer())
    assert info.value.module_path == "inner"
    graph = tracer.trace(Scaled())  # the same tracer, afterwards: no stale module stack
    at_the_root = [n for n in graph.nodes if n.op == "call_function"]
    assert at_the_root and all(n.meta["nn_module_stack"] == {} for n in at_the_root)


# -------------------------------------------------------------- the patch gate
class MakesZeros(nn.Module):
    """Kept as a leaf; its forward calls a tensor factory, which tracing patches."""

    def forward(self, x):
        return x + torch.zeros(x.shape) + math.sqrt(4.0)


class BranchesAfterLeaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.leaf = MakesZeros()

    def forward(self, x):
        y = self.leaf(x)
        return y if y.sum() > 0 else -y  # needs the leaf's example value


class LeafMakesZeros(fx.Tracer):
    def is_leaf_module(self, m, qualified_name):
        return isinstance(m, MakesZeros) or super().is_leaf_module(m, qualified_name)


def test_patched_functions_run_eagerly_while_example_values_are_computed():
    model = BranchesAfterLeaf()
    x = torch.ones(3)
    graph = LeafMakesZeros().trace(model, example_inputs=(x,))
    # The example run called the leaf's forward, and with it torch.zeros and math.sqrt:
    # they ran as themselves, nothing was recorded for them.
    targets = {n.target for n in graph.nodes if n.op == "call_function"}
    assert torch.zeros not in targets and math.sqrt not in targets
    assert [n.target for n in graph.nodes if n.op == "call_module"] == ["leaf"]
    assert_close(fx.GraphModule(model, graph)(x), model(x))


def patched_objects(*classes: type) -> dict[str, object]:
    """torch.zeros, math.sqrt, and the module methods tracing patches on each of ``classes``."""
    found: dict[str, object] = {"torch.zeros": torch.zeros, "math.sqrt": math.sqrt}
    for cls in classes:
        for name in ("__call__", "__getattr__", "__setattr__"):
            found[f"{cls.__name__}.{name}"] = cls.__dict__.get(name, "inherited")
    return found


def test_a_failure_while_example_values_are_computed_restores_every_patch():
    class FailsOnExamples(MakesZeros):
        def forward(self, x):
            super().forward(x)
            raise RuntimeError("cannot run on these examples")

    class Net(BranchesAfterLeaf):
        def __init__(self) -> None:
            super().__init__()
            self.leaf = FailsOnExamples()

    before = patched_objects(Net, FailsOnExamples)
    with pytest.raises(fx.TraceError, match="on the example inputs failed"):
        LeafMakesZeros().trace(Net(), example_inputs=(torch.ones(3),))
    assert patched_objects(Net, FailsOnExamples) == before
    # ... and tracing works as before afterwards: nothing is left half-suspended.
    gm = fx.symbolic_trace(lambda x: torch.zeros(3) + math.sqrt(x.shape[0]))
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert {torch.zeros, math.sqrt} <= targets


# ------------------------------------------------------------- graph constants
def test_captured_tensors_live_in_the_graphs_constants_not_on_the_module():
    model = Scaled()
    graph = fx.Tracer().trace(model)
    assert graph.constants == {"_tensor_constant0": SCALE}
    assert not hasattr(model, "_tensor_constant0")
    gm = fx.GraphModule(model, graph)
    assert gm.get_buffer("_tensor_constant0") is SCALE


@pytest.mark.parametrize("carry", ["deepcopy", "pickle"])
def test_graph_constants_travel_with_the_graph(carry):
    graph = fx.Tracer().trace(Scaled())
    copied = copy.deepcopy(graph) if carry == "deepcopy" else pickle.loads(pickle.dumps(graph))
    assert list(copied.constants) == ["_tensor_constant0"]
    assert torch.equal(copied.constants["_tensor_constant0"], SCALE)
    model = Scaled()
    x = torch.randn(2, 3)
    assert_close(fx.GraphModule(model, copied)(x), model(x))


def test_the_graph_keeps_no_tracer_class():
    graph = fx.Tracer().trace(Scaled())
    assert graph._tracer_cls is None
