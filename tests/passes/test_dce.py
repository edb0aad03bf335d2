"""Dead-code elimination (``fxloom.passes.dce``): unused nodes, submodules and attributes go."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import fxloom
from fxloom import guards, zoo
from fxloom.passes.const_fold import const_fold
from fxloom.passes.dce import DeadCodeReport, eliminate_dead_code


def graph_module(build, root: nn.Module | None = None) -> fxloom.GraphModule:
    """A GraphModule over a graph made by ``build(graph, x)``, which returns the output value."""
    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output(build(g, x))
    return fxloom.GraphModule(root if root is not None else nn.Module(), g)


# ------------------------------------------------------------------ nodes
def test_unused_nodes_go_and_the_report_names_them_in_graph_order():
    def build(g, x):
        unused = g.call_function(torch.relu, (x,))
        g.call_function(operator.mul, (unused, 2))
        return g.call_function(operator.add, (x, 1))

    gm = graph_module(build)
    report = eliminate_dead_code(gm)
    assert report.nodes == ["relu", "mul"]
    assert [node.name for node in gm.graph.nodes] == ["x", "add", "output"]


def test_nodes_still_used_and_their_names_and_meta_stay():
    gm = fxloom.symbolic_trace(lambda x: torch.relu(x) + 1)
    relu = gm.graph.find_nodes(op="call_function", target=torch.relu)[0]
    relu.meta["tensor_meta"] = "kept"
    assert not eliminate_dead_code(gm)
    assert relu in gm.graph.nodes and relu.name == "relu"
    assert relu.meta["tensor_meta"] == "kept"


def test_impure_nodes_stay_even_when_unused():
    def build(g, x):
        g.call_method("add_", (x, 1))
        g.call_function(print, (x,))
        g.call_function(guards.check_length, (g.call_method("size", (x,)), 1, "here"))
        g.call_function(operator.setitem, (x, 0, 5.0))
        return x

    gm = graph_module(build)
    report = eliminate_dead_code(gm)
    assert report.nodes == []
    assert len(gm.graph.nodes) == 7


def test_unused_operators_named_like_in_place_ones_go():
    def build(g, x):
        g.call_function(operator.and_, (x, x))
        g.call_function(operator.not_, (x,))
        return x

    gm = graph_module(build)
    assert eliminate_dead_code(gm).nodes == ["and_", "not_"]


@pytest.mark.parametrize(
    "random_call",
    [
        lambda g, x: g.call_function(torch.rand, (3,)),
        lambda g, x: g.call_function(F.dropout, (x, 0.5)),
    ],
    ids=["rand", "dropout"],
)
def test_unused_random_calls_stay_so_later_random_numbers_match_eager(random_call):
    def build(g, x):
        random_call(g, x)
        return x

    gm = graph_module(build)
    assert eliminate_dead_code(gm).nodes == []


def test_an_unused_dropout_module_goes_in_eval_mode_but_stays_in_training():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            self.drop(x)
            return x

    assert eliminate_dead_code(fxloom.symbolic_trace(Net().eval())).nodes == ["drop"]
    assert eliminate_dead_code(fxloom.symbolic_trace(Net().train())).nodes == []


def test_is_impure_node_decides_instead_of_the_default():
    def build(g, x):
        g.call_function(torch.rand, (3,))
        g.call_function(torch.relu, (x,))
        return x

    gm = graph_module(build)
    report = eliminate_dead_code(
        gm, is_impure_node=lambda node: node.op in ("placeholder", "output")
    )
    assert report.nodes == ["rand", "relu"]


# ------------------------------------------------------------------ submodules
class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        self.unused = nn.Sequential(nn.Linear(2, 2), nn.ReLU())

    def forward(self, x):
        self.unused(x)
        return self.used(x)


def test_submodules_nothing_calls_any_more_are_deleted_and_reported_once():
    gm = fxloom.symbolic_trace(TwoBranches())
    report = eliminate_dead_code(gm)
    assert report.submodules == ["unused"]
    assert not hasattr(gm, "unused")
    assert str(report) == "removed 2 nodes (%unused_0, %unused_1), 1 submodule (unused)"


def test_a_called_module_keeps_its_children_and_state():
    gm = fxloom.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
    leaf = fxloom.Tracer()
    leaf.is_leaf_module = lambda module, name: True
    gm = fxloom.GraphModule(gm, leaf.trace(nn.Sequential(nn.Linear(2, 2))))
    report = eliminate_dead_code(gm)
    assert not report
    assert set(dict(gm.named_parameters())) == {"0.weight", "0.bias"}


# ------------------------------------------------------------------ attributes
class Transposed(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 4))
        self.register_buffer("unused", torch.zeros(2))

    def forward(self, x):
        return x @ self.weight.t()


def test_attributes_no_node_reads_are_deleted():
    model = Transposed().eval()
    gm = const_fold(fxloom.symbolic_trace(model))  # weight is now read through a folded buffer
    report = eliminate_dead_code(gm)
    assert report.attributes == ["weight"]
    assert set(gm.state_dict()) == {"_folded_t"}
    x = torch.randn(2, 4)
    assert_close(gm(x), model(x))


def test_remove_attributes_false_keeps_them():
    gm = const_fold(fxloom.symbolic_trace(Transposed().eval()))
    report = eliminate_dead_code(gm, remove_attributes=False)
    assert report.attributes == []
    assert "weight" in dict(gm.named_parameters())


def test_attributes_of_modules_reached_through_get_attr_are_kept():
    root = nn.Module()
    root.inner = nn.Linear(2, 2)

    def build(g, x):
        module = g.get_attr("inner")
        return g.call_function(operator.getitem, ((module, x), 1))

    gm = graph_module(build, root)
    report = eliminate_dead_code(gm)
    assert report.attributes == [] and report.submodules == []


# ------------------------------------------------------------------ report
def test_the_report_is_false_and_says_so_when_nothing_went():
    gm = fxloom.symbolic_trace(lambda x: x + 1)
    report = eliminate_dead_code(gm)
    assert not report
    assert str(report) == "removed nothing"


def test_the_report_shortens_long_lists():
    report = DeadCodeReport(nodes=[f"n{i}" for i in range(7)])
    assert str(report) == "removed 7 nodes (%n0, %n1, %n2, %n3, %n4, ... 2 more)"


# ------------------------------------------------------------------ real models
@pytest.mark.parametrize("name", ["mlp_tiny", "resnet_tiny", "transformer_tiny"])
def test_zoo_models_compute_what_eager_does(name):
    model, inputs = zoo.build(name)
    gm = fxloom.symbolic_trace(model)
    eliminate_dead_code(gm)
    gm.graph.lint()
    with torch.no_grad():
        assert_close(gm(*inputs), model(*inputs))


def test_gpt2_loses_unused_shape_reads_keeps_its_guards_and_matches_eager(traced_hf):
    gpt2 = traced_hf("gpt2")
    gm = gpt2.gm
    impure = [node.name for node in gm.graph.nodes if node.is_impure()]
    report = eliminate_dead_code(gm)
    gm.graph.lint()
    assert report.nodes
    assert [node.name for node in gm.graph.nodes if node.is_impure()] == impure
    with torch.no_grad():
        assert_close(gm(**gpt2.inputs)[0], gpt2.eager()[0])


def test_a_long_dead_chain_goes_in_one_sweep():
    def build(g, x):
        value = x
        for _ in range(5000):
            value = g.call_function(operator.add, (value, 1))
        return x

    gm = graph_module(build)
    assert len(eliminate_dead_code(gm).nodes) == 5000


# ------------------------------------------------------------------ bad input
def test_refuses_what_is_not_a_graph_module():
    with pytest.raises(TypeError, match="eliminate_dead_code works on an fxloom.GraphModule"):
        eliminate_dead_code(fxloom.Graph())


def test_a_failing_is_impure_node_leaves_the_module_unchanged():
    gm = fxloom.symbolic_trace(TwoBranches())
    before, modules = gm.code, [name for name, _ in gm.named_modules()]

    def broken(node):
        if node.name == "unused_0":
            raise RuntimeError("a user rule failed")
        return False

    with pytest.raises(RuntimeError, match="a user rule failed"):
        eliminate_dead_code(gm, is_impure_node=broken)
    assert gm.code == before
    assert [name for name, _ in gm.named_modules()] == modules
