"""Common-subexpression elimination (``fxloom.passes.cse``): each pure expression computed once."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import fxloom
from fxloom import guards, zoo
from fxloom.ops import effects
from fxloom.passes.cse import cse, literal_key


def code_lines(gm: fxloom.GraphModule) -> list[str]:
    return [line.strip() for line in gm.code.strip().splitlines()[1:]]


def count(gm: fxloom.GraphModule, op: str, target) -> int:
    return len(gm.graph.find_nodes(op=op, target=target))


class Twice(nn.Module):
    """Calls the same linear layer twice on the same input."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x) + self.linear(x)


# ------------------------------------------------------------------ merging
def test_a_repeated_expression_is_computed_once_and_the_first_is_kept():
    gm = fxloom.symbolic_trace(lambda x: (x + 1) * (x + 1))
    cse(gm)
    assert code_lines(gm) == [
        "add = x + 1;  x = None",
        "mul = add * add;  add = None",
        "return mul",
    ]


def test_merges_chains_whose_inputs_were_merged():
    gm = fxloom.symbolic_trace(lambda x: torch.relu(x.t() + 1) - torch.relu(x.t() + 1))
    cse(gm)
    assert count(gm, "call_function", torch.relu) == 1
    assert count(gm, "call_method", "t") == 1


def test_returns_the_module_it_edited_in_place():
    gm = fxloom.symbolic_trace(lambda x: x + x)
    assert cse(gm) is gm


def test_kept_nodes_keep_their_names_and_meta():
    gm = fxloom.symbolic_trace(lambda x: (x * 2, x * 2))
    first, second = gm.graph.find_nodes(op="call_function", target=operator.mul)
    first.meta["tensor_meta"] = "first's"
    second.meta["tensor_meta"] = "second's"
    cse(gm)
    (kept,) = gm.graph.find_nodes(op="call_function", target=operator.mul)
    assert kept is first and kept.name == "mul"
    assert kept.meta["tensor_meta"] == "first's"
    assert second not in gm.graph.nodes


def test_equal_keyword_arguments_in_another_order_are_the_same_expression():
    g = fxloom.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.sum, (x,), {"dim": 0, "keepdim": True})
    b = g.call_function(torch.sum, (x,), {"keepdim": True, "dim": 0})
    g.output((a, b))
    gm = cse(fxloom.GraphModule(nn.Module(), g))
    assert count(gm, "call_function", torch.sum) == 1


def test_unhashable_literals_lists_dicts_and_slices_are_compared_by_value():
    def f(x):
        return (
            x[1:3, None],
            x[1:3, None],
            x.permute([1, 0]),
            x.permute([1, 0]),
            torch.cat([x, x], dim=0),
            torch.cat([x, x], dim=0),
        )

    gm = cse(fxloom.symbolic_trace(f))
    assert count(gm, "call_function", operator.getitem) == 1
    assert count(gm, "call_method", "permute") == 1
    assert count(gm, "call_function", torch.cat) == 1


@pytest.mark.parametrize(
    "one, other",
    [(1, 1.0), (1, True), (0.0, -0.0), ((1, 2), [1, 2]), (torch.float32, torch.float64)],
)
def test_literals_of_another_type_or_sign_are_different_expressions(one, other):
    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(operator.add, (x, one)), g.call_function(operator.add, (x, other))))
    gm = cse(fxloom.GraphModule(nn.Module(), g))
    assert count(gm, "call_function", operator.add) == 2


def test_literal_key_treats_nan_as_equal_to_itself():
    assert literal_key(float("nan")) == literal_key(float("nan"))
    assert literal_key(0.0) != literal_key(-0.0)


def test_operators_named_like_in_place_ones_are_merged():
    gm = cse(fxloom.symbolic_trace(lambda x, y: ((x > 0) & y, (x > 0) & y)))
    assert count(gm, "call_function", operator.and_) == 1


def test_duplicate_get_attr_nodes_are_merged():
    root = nn.Module()
    root.register_buffer("scale", torch.tensor(2.0))
    g = fxloom.Graph()
    x = g.placeholder("x")
    a = g.get_attr("scale")
    b = g.get_attr("scale")
    g.output(g.call_function(operator.add, (g.call_function(operator.mul, (x, a)), b)))
    gm = cse(fxloom.GraphModule(root, g))
    assert len(gm.graph.find_nodes(op="get_attr")) == 1
    assert_close(gm(torch.ones(2)), torch.full((2,), 4.0))


def test_same_pure_module_on_the_same_input_is_called_once():
    model = Twice()
    gm = cse(fxloom.symbolic_trace(model))
    assert count(gm, "call_module", "linear") == 1
    x = torch.randn(2, 3)
    assert_close(gm(x), model(x))


# ------------------------------------------------------------------ never merged
def test_impure_nodes_are_never_merged():
    g = fxloom.Graph()
    x = g.placeholder("x")
    g.call_method("add_", (x, 1))
    g.call_method("add_", (x, 1))
    g.call_function(print, (x,))
    g.call_function(print, (x,))
    g.output(x)
    gm = cse(fxloom.GraphModule(nn.Module(), g))
    assert count(gm, "call_method", "add_") == 2
    assert count(gm, "call_function", print) == 2


def test_guards_are_never_merged():
    g = fxloom.Graph()
    x = g.placeholder("x")
    size = g.call_method("size", (x,))
    g.call_function(guards.check_length, (size, 2, "model.py:1"))
    g.call_function(guards.check_length, (size, 2, "model.py:1"))
    g.output(x)
    gm = cse(fxloom.GraphModule(nn.Module(), g))
    assert count(gm, "call_function", guards.check_length) == 2


@pytest.mark.parametrize(
    "random_call",
    [
        lambda x: torch.rand(3),
        lambda x: torch.randn_like(x),
        lambda x: F.dropout(x, 0.5),
        lambda x: F.dropout(x, 0.5, training=True),
        lambda x: x.bernoulli(),
    ],
    ids=["rand", "randn_like", "dropout", "dropout_training", "bernoulli_method"],
)
def test_random_calls_are_never_merged(random_call):
    gm = fxloom.symbolic_trace(lambda x: (random_call(x), random_call(x)))
    before = len(gm.graph.nodes)
    cse(gm)
    assert len(gm.graph.nodes) == before


def test_dropout_outside_training_is_deterministic_and_merged():
    gm = cse(fxloom.symbolic_trace(lambda x: (F.dropout(x, 0.5, False), F.dropout(x, 0.5, False))))
    assert count(gm, "call_function", F.dropout) == 1


def test_a_dropout_module_is_merged_in_eval_mode_only():
    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(x), self.drop(x)

    assert count(cse(fxloom.symbolic_trace(Drop().train())), "call_module", "drop") == 2
    assert count(cse(fxloom.symbolic_trace(Drop().eval())), "call_module", "drop") == 1


def test_batch_norm_in_training_updates_running_stats_so_is_never_merged():
    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x):
            return self.bn(x) + self.bn(x)

    model = Norm().train()
    gm = cse(fxloom.symbolic_trace(model))
    assert count(gm, "call_module", "bn") == 2


def test_modules_outside_torch_nn_are_not_merged_unless_registered(monkeypatch):
    class Scale(nn.Module):
        def forward(self, x):
            return x * 2

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = Scale()

        def forward(self, x):
            return self.scale(x) + self.scale(x)

    leaf = fxloom.Tracer()
    leaf.is_leaf_module = lambda module, name: isinstance(module, Scale)
    graph = leaf.trace(Net())
    gm = cse(fxloom.GraphModule(Net(), graph))
    assert count(gm, "call_module", "scale") == 2

    monkeypatch.setitem(effects.MODULE_PURITY, Scale, lambda module: True)
    gm = cse(fxloom.GraphModule(Net(), leaf.trace(Net())))
    assert count(gm, "call_module", "scale") == 1


def test_modules_with_forward_hooks_are_not_merged():
    model = Twice()
    model.linear.register_forward_hook(lambda module, args, out: None)
    gm = cse(fxloom.symbolic_trace(model))
    assert count(gm, "call_module", "linear") == 2


def test_in_place_modules_are_not_merged():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            y = x * 1
            return self.relu(y), self.relu(y)

    gm = cse(fxloom.symbolic_trace(Net()))
    assert count(gm, "call_module", "relu") == 2


# ------------------------------------------------------------------ writes
def test_nothing_is_merged_across_a_write_to_an_input():
    def f(x):
        a = x + 1
        x.add_(1)
        b = x + 1
        return a, b

    gm = cse(fxloom.symbolic_trace(f))
    assert count(gm, "call_function", operator.add) == 2
    a, b = gm(torch.zeros(2))
    assert_close(a, torch.ones(2))
    assert_close(b, torch.full((2,), 2.0))


def test_a_write_through_a_view_of_an_input_counts_as_a_write_to_it():
    def f(x):
        a = x + 1
        x.view(-1).add_(1)
        b = x + 1
        return a, b

    gm = cse(fxloom.symbolic_trace(f))
    assert count(gm, "call_function", operator.add) == 2


def test_values_written_to_later_are_not_merged():
    def f(x):
        a = x + 1
        b = x + 1
        a.mul_(10)
        return a, b

    gm = cse(fxloom.symbolic_trace(f))
    a, b = gm(torch.zeros(2))
    assert_close(a, torch.full((2,), 10.0))
    assert_close(b, torch.ones(2))


def test_a_write_through_a_tuple_built_with_plus_reaches_the_tensors_in_it():
    def f(x):
        a = x * 2
        both = x.chunk(1) + (a,)  # a graph value: a tuple holding a itself
        first = a + 1
        both[1].add_(1)  # writes to a
        second = a + 1
        return first, second

    gm = cse(fxloom.symbolic_trace(f))
    first, second = gm(torch.zeros(2))
    assert_close(second - first, torch.ones(2))


def test_a_write_to_one_value_does_not_stop_merges_of_unrelated_ones():
    def f(x, y):
        a = y * 2
        x.add_(1)
        b = y * 2
        return a, b

    gm = cse(fxloom.symbolic_trace(f))
    assert count(gm, "call_function", operator.mul) == 1


def test_a_write_to_a_buffer_separates_reads_before_and_after_it():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            before = x + self.count
            self.count.add_(1)
            after = x + self.count
            return before, after

    gm = cse(fxloom.symbolic_trace(Counter()))
    before, after = gm(torch.zeros(1))
    assert_close(after - before, torch.ones(1))


def test_an_unknown_module_may_write_its_own_state():
    class Stateful(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.zeros(1))

        def forward(self, x):
            self.seen.add_(1)
            return x

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.state = Stateful()

        def forward(self, x):
            before = x + self.state.seen
            x = self.state(x)
            return before, x + self.state.seen

    tracer = fxloom.Tracer()
    tracer.is_leaf_module = lambda module, name: isinstance(module, Stateful)
    net = Net()
    gm = cse(fxloom.GraphModule(net, tracer.trace(net)))
    before, after = gm(torch.zeros(1))
    assert_close(after - before, torch.ones(1))


# ------------------------------------------------------------------ real models
@pytest.mark.parametrize("name", ["mlp_tiny", "resnet_tiny", "transformer_tiny"])
def test_zoo_models_compute_what_eager_does(name):
    model, inputs = zoo.build(name)
    gm = cse(fxloom.symbolic_trace(model))
    gm.graph.lint()
    with torch.no_grad():
        assert_close(gm(*inputs), model(*inputs))


def test_bert_loses_repeated_shape_reads_and_still_matches_eager(traced_hf):
    bert = traced_hf("bert")
    gm = bert.gm
    before = len(gm.graph.nodes)
    cse(gm)
    gm.graph.lint()
    assert len(gm.graph.nodes) < before
    with torch.no_grad():
        assert_close(gm(**bert.inputs)[0], bert.eager()[0])


def test_a_long_graph_is_handled_without_recursion():
    g = fxloom.Graph()
    x = g.placeholder("x")
    value = x
    for _ in range(5000):  # a chain of +1, each step computed twice
        value = g.call_function(operator.add, (value, 1))
        g.call_function(operator.add, (value, 1))
    g.output(value)
    gm = cse(fxloom.GraphModule(nn.Module(), g))
    assert len(gm.graph.nodes) == 1 + 5001 + 1  # x, one node per depth of the chain, output


# ------------------------------------------------------------------ bad input
def test_refuses_what_is_not_a_graph_module():
    with pytest.raises(TypeError, match=r"cse works on an fxloom.GraphModule, got Linear"):
        cse(nn.Linear(2, 2))


def test_a_failure_while_deciding_leaves_the_module_unchanged(monkeypatch):
    def broken(node):
        raise RuntimeError("a user rule failed")

    gm = fxloom.symbolic_trace(lambda x: (x + 1, x + 1, torch.sigmoid(x)))
    before = copy.deepcopy(gm).code
    monkeypatch.setitem(effects.RANDOM_FUNCTIONS, torch.sigmoid, broken)
    with pytest.raises(RuntimeError, match="a user rule failed"):
        cse(gm)
    assert gm.code == before
