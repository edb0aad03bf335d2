"""``split_by_support``: connected supported nodes gathered into ``_run_on_acc_<i>`` submodules."""

from __future__ import annotations

import operator
import random

import pytest
import torch
from torch.testing import assert_close

import fxloom
from fxloom import zoo
from fxloom.passes.split_by_support import SplitError, SupportSplit, split_by_support


def not_sort(node) -> bool:
    return node.target is not torch.sort


def call_names(gm: fxloom.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op.startswith("call_")]


def submodule_calls(gm: fxloom.GraphModule) -> list[str]:
    return [n.target for n in gm.graph.find_nodes(op="call_module")]


def snapshot(gm: fxloom.GraphModule) -> tuple[str, str, list]:
    return gm.code, str(gm.graph), [dict(n.meta) for n in gm.graph.nodes]


# ------------------------------------------------------------------- groups
def test_supported_runs_become_submodules_and_unsupported_nodes_stay_in_the_parent() -> None:
    def f(x):
        y = torch.relu(x) + 1
        z = torch.sort(y).values
        return torch.sigmoid(z) * 2

    gm = fxloom.symbolic_trace(f)
    split, report = split_by_support(gm, not_sort)
    assert report.partitions == {
        "_run_on_acc_0": ("relu", "add"),
        "_run_on_acc_1": ("getattr_1", "sigmoid", "mul"),
    }
    assert report.unsupported == ("sort",)
    assert [n.name for n in split.graph.nodes if n.op != "placeholder"] == [
        "_run_on_acc_0",
        "sort",
        "_run_on_acc_1",
        "output",
    ]
    x = torch.randn(6)
    assert torch.equal(split(x), gm(x))
    split.graph.lint()


def test_supported_nodes_joined_through_an_unsupported_node_are_not_merged() -> None:
    # relu -> sort -> add and relu -> add: one group {relu, add} would need sort's result
    # while sort needs the group's: a cycle between the submodule and the parent.
    def f(x):
        a = torch.relu(x)
        u = torch.sort(a).values
        return a + u

    gm = fxloom.symbolic_trace(f)
    split, report = split_by_support(gm, lambda n: n.name in ("relu", "add"))
    assert report.partitions == {"_run_on_acc_0": ("relu",), "_run_on_acc_1": ("add",)}
    assert call_names(split) == [
        "_run_on_acc_0",
        "sort",
        "getattr_1",
        "_run_on_acc_1",
    ]
    x = torch.randn(5)
    assert torch.equal(split(x), gm(x))


def test_supported_nodes_separated_by_an_unrelated_unsupported_node_are_merged() -> None:
    def f(x):
        a = torch.relu(x)
        u = torch.sort(x).values  # comes between a and b, but neither depends on it
        b = torch.tanh(a)
        return b, u

    gm = fxloom.symbolic_trace(f)
    split, report = split_by_support(gm, lambda n: n.name in ("relu", "tanh"))
    assert report.partitions == {"_run_on_acc_0": ("relu", "tanh")}
    x = torch.randn(5)
    assert_close(split(x), gm(x))


def test_supported_work_independent_of_an_unsupported_node_joins_the_group_before_it() -> None:
    def f(x):
        a = torch.relu(x)
        u = torch.sort(a).values
        b = torch.sigmoid(a)  # written after the sort, needs only a
        return u + b

    split, report = split_by_support(fxloom.symbolic_trace(f), not_sort)
    assert report.partitions["_run_on_acc_0"] == ("relu", "sigmoid")


def test_supported_nodes_that_are_not_connected_form_separate_groups() -> None:
    def f(x):
        return torch.relu(x), torch.tanh(x)  # linked only through the input

    _, report = split_by_support(fxloom.symbolic_trace(f), lambda n: True)
    assert report.partitions == {"_run_on_acc_0": ("relu",), "_run_on_acc_1": ("tanh",)}


def test_a_fully_supported_module_becomes_one_submodule() -> None:
    model, (x,) = zoo.build("mlp_tiny")
    gm = fxloom.symbolic_trace(model)
    split, report = split_by_support(gm, lambda n: True)
    assert report.num_partitions == 1
    assert report.partitions["_run_on_acc_0"] == tuple(call_names(gm))
    assert_close(split(x), model(x))


def test_nothing_supported_leaves_every_node_in_the_parent() -> None:
    model, (x,) = zoo.build("mlp_tiny")
    gm = fxloom.symbolic_trace(model)
    split, report = split_by_support(gm, lambda n: False)
    assert report.partitions == {} and report.unsupported == tuple(call_names(gm))
    assert split.code == gm.code
    assert_close(split(x), model(x))


def test_min_size_leaves_small_groups_in_the_parent() -> None:
    def f(x):
        y = torch.sort(x).values.relu()
        return torch.sort(y).values

    gm = fxloom.symbolic_trace(f)
    _, every = split_by_support(gm, not_sort)
    split, report = split_by_support(gm, not_sort, min_size=3)
    assert every.num_partitions == 2
    assert report.num_partitions == 0
    assert report.too_small == ("getattr_1", "relu", "getattr_2")
    assert "too small: getattr_1, relu, getattr_2" in str(report)
    x = torch.randn(4)
    assert torch.equal(split(x), gm(x))


def test_the_prefix_names_the_submodules() -> None:
    gm = fxloom.symbolic_trace(lambda x: torch.relu(x))
    split, _ = split_by_support(gm, lambda n: True, prefix="trt_")
    assert submodule_calls(split) == ["trt_0"]


def test_the_report_lists_every_call_node_once() -> None:
    model, _ = zoo.build("transformer_tiny")
    gm = fxloom.symbolic_trace(model)
    _, report = split_by_support(gm, lambda n: "softmax" not in str(n.target), min_size=2)
    placed = [name for nodes in report.partitions.values() for name in nodes]
    placed += [*report.unsupported, *report.too_small]
    assert sorted(placed) == sorted(call_names(gm))


def test_the_report_prints_as_a_summary() -> None:
    report = SupportSplit({"_run_on_acc_0": ("relu", "add")}, ("sort",))
    assert str(report) == (
        "1 partition, 1 node left in the parent (unsupported: sort)\n  _run_on_acc_0: relu, add"
    )


# --------------------------------------------------------------- names, meta
def test_nodes_keep_their_names_and_meta_in_submodules_and_parent() -> None:
    def f(x):
        return torch.sort(torch.relu(x)).values.tanh()

    gm = fxloom.symbolic_trace(f)
    for node in gm.graph.nodes:
        node.meta["tag"] = node.name
    split, _ = split_by_support(gm, not_sort)
    sort = next(n for n in split.graph.nodes if n.name == "sort")
    assert sort.meta["tag"] == "sort"
    for name in ("_run_on_acc_0", "_run_on_acc_1"):
        for node in getattr(split, name).graph.nodes:
            if node.op != "output":
                assert node.meta["tag"] == node.name


def test_the_split_is_deterministic() -> None:
    model, _ = zoo.build("transformer_tiny")
    gm = fxloom.symbolic_trace(model)

    def is_supported(node):
        return node.op != "call_method"

    first, report = split_by_support(gm, is_supported)
    second, again = split_by_support(gm, is_supported)
    assert report == again
    assert first.code == second.code


# ------------------------------------------------------------- side effects
EVENTS: list[str] = []


@fxloom.has_side_effect
def record(tag: str, value=None):
    EVENTS.append(tag)
    return value


def test_impure_nodes_keep_their_order_across_submodules_and_parent() -> None:
    g = fxloom.Graph()
    x = g.placeholder("x")
    for i, tag in enumerate("abcdef"):
        x = g.call_function(record, (tag, x))
        if i % 2:
            x = g.call_function(torch.neg, (x,))
    g.output(x)
    gm = fxloom.GraphModule(torch.nn.Module(), g)
    split, report = split_by_support(gm, lambda n: n.name in ("record", "record_2", "neg_1"))
    EVENTS.clear()
    assert torch.equal(split(torch.ones(1)), gm(torch.ones(1)))
    assert EVENTS == list("abcdef") * 2
    split.graph.lint()


def test_an_in_place_update_after_a_submodule_is_kept_in_order() -> None:
    def f(x):
        y = x * 2
        y.add_(1)
        return y

    split, report = split_by_support(fxloom.symbolic_trace(f), lambda n: n.name == "mul")
    assert report.partitions == {"_run_on_acc_0": ("mul",)}
    assert torch.equal(split(torch.ones(2)), torch.full((2,), 3.0))


# ---------------------------------------------------------------- bad input
def test_is_supported_raising_is_reported_with_the_node_and_changes_nothing() -> None:
    model, _ = zoo.build("resnet_tiny")
    gm = fxloom.symbolic_trace(model)
    before = snapshot(gm)

    def is_supported(node):
        if node.name == "maxpool":
            raise ValueError("cannot decide")
        return True

    with pytest.raises(
        SplitError, match=r"is_supported raised ValueError for %maxpool .*cannot decide"
    ):
        split_by_support(gm, is_supported)
    assert snapshot(gm) == before


def test_a_module_that_is_not_traced_is_refused() -> None:
    with pytest.raises(TypeError, match=r"split_by_support works on an fxloom.GraphModule"):
        split_by_support(torch.nn.ReLU(), lambda n: True)


@pytest.mark.parametrize("min_size", [0, -1, 1.5])
def test_min_size_must_be_a_positive_int(min_size) -> None:
    gm = fxloom.symbolic_trace(lambda x: x + 1)
    with pytest.raises(ValueError, match="min_size must be a positive int"):
        split_by_support(gm, lambda n: True, min_size=min_size)


def test_a_prefix_that_makes_no_identifier_is_refused() -> None:
    gm = fxloom.symbolic_trace(lambda x: x + 1)
    with pytest.raises(ValueError, match="prefix"):
        split_by_support(gm, lambda n: True, prefix="acc-")


# ------------------------------------------------------------ random graphs
UNARY = (torch.tanh, torch.sigmoid, torch.neg)
BINARY = (torch.add, torch.mul, torch.sub)


def random_graph(rng: random.Random, size: int) -> fxloom.GraphModule:
    g = fxloom.Graph()
    values = [g.placeholder("x"), g.placeholder("y")]
    for _ in range(size):
        if rng.random() < 0.5:
            node = g.call_function(rng.choice(UNARY), (rng.choice(values[-6:]),))
        else:
            node = g.call_function(rng.choice(BINARY), tuple(rng.sample(values[-8:], 2)))
        values.append(node)
    g.output(tuple(values[-3:]))
    return fxloom.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_split_without_cycles_and_compute_the_same(seed: int) -> None:
    rng = random.Random(seed)
    gm = random_graph(rng, rng.randint(5, 40))
    unsupported = {n for n in gm.graph.nodes if rng.random() < 0.3}
    split, report = split_by_support(gm, lambda n: n not in unsupported)
    split.graph.lint()
    x, y = torch.randn(3), torch.randn(3)
    assert_close(split(x, y), gm(x, y))
    for name in report.partitions:
        assert is_connected(getattr(split, name).graph)


def is_connected(graph: fxloom.Graph) -> bool:
    """Whether the call nodes of ``graph`` form one connected component."""
    calls = {n for n in graph.nodes if n.op == "call_function"}
    reached, todo = set(), [next(iter(calls))]
    while todo:
        node = todo.pop()
        if node not in reached:
            reached.add(node)
            todo += [m for m in (*node.all_input_nodes, *node.users) if m in calls]
    return reached == calls


# -------------------------------------------------------------- real models
def test_resnet_with_unsupported_pooling() -> None:
    model, inputs = zoo.build("resnet_tiny")
    gm = fxloom.symbolic_trace(model)
    pooling = (torch.nn.MaxPool2d, torch.nn.AdaptiveAvgPool2d)

    def is_supported(node):
        return not (node.op == "call_module" and isinstance(gm.get_submodule(node.target), pooling))

    split, report = split_by_support(gm, is_supported)
    assert report.unsupported == ("maxpool", "avgpool")
    assert submodule_calls(split) == [
        "_run_on_acc_0",
        "maxpool",
        "_run_on_acc_1",
        "avgpool",
        "_run_on_acc_2",
    ]
    assert split.maxpool is model.maxpool
    with torch.no_grad():
        assert_close(split(*inputs), model(*inputs))


def test_transformer_with_unsupported_softmax() -> None:
    model, inputs = zoo.build("transformer_tiny")
    gm = fxloom.symbolic_trace(model)
    split, report = split_by_support(gm, lambda n: n.target != "softmax")
    assert report.unsupported == ("softmax", "softmax_1")
    assert report.num_partitions == 3
    with torch.no_grad():
        assert_close(split(*inputs), model(*inputs))


def test_bert_with_unsupported_method_calls(traced_hf) -> None:
    bert = traced_hf("bert")
    unsupported = {"view", "transpose", "permute", "softmax", "size"}

    def is_supported(node):
        return not (node.op == "call_method" and node.target in unsupported)

    split, report = split_by_support(bert.gm, is_supported, min_size=2)
    assert report.num_partitions > 1
    split.graph.lint()
    with torch.no_grad():
        assert_close(split(**bert.inputs), bert.eager())


def test_a_long_chain_is_split_in_one_pass() -> None:
    # 3000 alternating runs: a quadratic splitter would take minutes here.
    g = fxloom.Graph()
    x = g.placeholder("x")
    for i in range(3000):
        x = g.call_function(operator.neg if i % 3 else operator.pos, (x,))
    g.output(x)
    gm = fxloom.GraphModule(torch.nn.Module(), g)
    split, report = split_by_support(gm, lambda n: n.target is operator.neg)
    assert report.num_partitions == 1000
    assert torch.equal(split(torch.ones(1)), gm(torch.ones(1)))
