"""``SubgraphMatcher``: what a pattern matches, in which order, and the explanations of misses."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

import fxloom
from fxloom.passes.matcher import ANY, PatternError, SubgraphMatcher


def graph_of(fn) -> fxloom.Graph:
    return fxloom.symbolic_trace(fn).graph


def matches(pattern, model, **options) -> list:
    """The matches of ``pattern`` (a function or module) in the traced ``model``."""
    traced = fxloom.symbolic_trace(model)  # kept alive: call_module targets resolve in it
    return SubgraphMatcher(fxloom.symbolic_trace(pattern), **options).match(traced.graph)


def anchors(found) -> list[str]:
    return [m.anchor.name for m in found]


def node_named(graph: fxloom.Graph, name: str) -> fxloom.Node:
    return next(n for n in graph.nodes if n.name == name)


# --------------------------------------------------------------- placeholders
def test_a_pattern_input_matches_any_node():
    found = matches(lambda x: torch.relu(x), lambda a, b: torch.relu(a + b))
    assert anchors(found) == ["relu"]
    (match,) = found
    x = next(iter(match.nodes_map))
    assert match.nodes_map[x].name == "add"
    assert match.placeholder_nodes[0].name == "add"


def test_a_pattern_input_matches_a_constant_and_records_it():
    (match,) = matches(lambda x, k: x * k, lambda a: a * 3)
    assert match.placeholder_nodes[1] == 3


def test_an_input_used_twice_needs_the_same_value_twice():
    assert anchors(matches(lambda x: x * x, lambda a: a * a)) == ["mul"]
    assert matches(lambda x: x * x, lambda a, b: a * b) == []


def test_two_pattern_inputs_may_match_the_same_value():
    assert anchors(matches(lambda x, y: x + y, lambda a: a + a)) == ["add"]


# ----------------------------------------------------------------- operations
def test_the_target_must_be_the_same_callable():
    assert matches(lambda x: torch.relu(x), lambda a: torch.sigmoid(a)) == []


def test_a_method_call_does_not_match_the_function_of_the_same_name():
    assert matches(lambda x: torch.relu(x), lambda a: a.relu()) == []
    assert anchors(matches(lambda x: x.relu(), lambda a: a.relu())) == ["relu"]


def test_arguments_are_compared_as_written_positional_or_keyword():
    by_keyword = lambda x: torch.sum(x, dim=1)  # noqa: E731
    assert matches(by_keyword, lambda a: torch.sum(a, 1)) == []
    assert anchors(matches(by_keyword, lambda a: torch.sum(a, dim=1))) == ["sum_1"]


def test_lists_and_tuples_match_item_by_item():
    pattern = lambda x, y: torch.cat([x, y])  # noqa: E731
    assert anchors(matches(pattern, lambda a, b: torch.cat((a, b)))) == ["cat"]
    assert matches(pattern, lambda a, b, c: torch.cat([a, b, c])) == []


def test_an_operation_matches_one_graph_node_only():
    # Both relus of the pattern would have to be the graph's one relu.
    def pattern(x):
        return torch.relu(x) + torch.relu(x)

    def model(a):
        r = torch.relu(a)
        return r + r

    assert matches(pattern, model) == []


# ------------------------------------------------------------------ constants
def test_constants_must_be_equal_and_of_the_same_type():
    pattern = lambda x: x + 1  # noqa: E731
    assert anchors(matches(pattern, lambda a: a + 1)) == ["add"]
    assert matches(pattern, lambda a: a + 2) == []
    assert matches(pattern, lambda a: a + 1.0) == []


def test_any_matches_any_constant_but_not_a_computed_value():
    pattern = lambda x: x * ANY  # noqa: E731
    assert anchors(matches(pattern, lambda a: (a * 2, a * 0.5))) == ["mul", "mul_1"]
    assert matches(pattern, lambda a, b: a * b) == []


def test_any_in_one_place_and_a_specific_constant_in_another():
    pattern = lambda x: torch.clamp(x, ANY, 6.0)  # noqa: E731
    found = matches(pattern, lambda a: (torch.clamp(a, 0.0, 6.0), torch.clamp(a, -1.0, 6.0)))
    assert anchors(found) == ["clamp", "clamp_1"]
    assert matches(pattern, lambda a: torch.clamp(a, 0.0, 1.0)) == []


def test_ignore_literals_lets_every_constant_match_any_constant():
    pattern = lambda x: torch.clamp(x, 0.0, 6.0)  # noqa: E731
    model = lambda a, b: (torch.clamp(a, -1.0, 1.0), torch.clamp(a, b, 1.0))  # noqa: E731
    assert anchors(matches(pattern, model, ignore_literals=True)) == ["clamp"]


# --------------------------------------------------------- users and overlaps
def test_an_internal_node_used_outside_the_match_blocks_it():
    def model(a):
        s = torch.sigmoid(a)
        return a * s, s  # the sigmoid is also returned by the model

    assert matches(lambda x: x * torch.sigmoid(x), model) == []


def test_returned_values_may_be_used_anywhere():
    def model(a):
        m = a * torch.sigmoid(a)
        return m + 1, m * 2

    assert anchors(matches(lambda x: x * torch.sigmoid(x), model)) == ["mul"]


def test_overlapping_candidates_go_to_the_earliest_anchor():
    def chain(a):
        for _ in range(5):
            a = torch.relu(a)
        return a

    found = matches(lambda x: torch.relu(torch.relu(x)), chain)
    assert [[n.name for n in m.nodes] for m in found] == [["relu", "relu_1"], ["relu_2", "relu_3"]]


def test_matches_come_in_graph_order_of_their_anchors_and_are_repeatable():
    def model(a, b):
        return torch.relu(b + 1) * torch.relu(a + 1)

    pattern = graph_of(lambda x: torch.relu(x + 1))
    graph = graph_of(model)
    first = SubgraphMatcher(pattern).match(graph)
    assert anchors(first) == ["relu", "relu_1"]
    assert anchors(SubgraphMatcher(pattern).match(graph)) == anchors(first)


def test_a_match_may_take_an_earlier_matchs_output_as_input():
    def chain(a):
        return torch.relu(torch.relu(torch.relu(a)))

    assert anchors(matches(lambda x: torch.relu(x), chain)) == ["relu", "relu_1", "relu_2"]


def test_matching_leaves_the_graph_unchanged():
    graph = graph_of(lambda a: torch.relu(a) + 1)
    before = str(graph)
    SubgraphMatcher(graph_of(lambda x: torch.relu(x))).match(graph)
    assert str(graph) == before


def test_no_match_whose_inputs_come_after_a_use_of_its_outputs():
    # The pattern returns r and r + y; in the graph, y is computed from r's use u, so one
    # replacement would need its own result as an input.
    pattern = fxloom.Graph()
    x, y = pattern.placeholder("x"), pattern.placeholder("y")
    r = pattern.call_function(torch.relu, (x,))
    s = pattern.call_function(operator.add, (r, y))
    pattern.output((r, s))

    def model(a):
        r = torch.relu(a)
        u = torch.neg(r)
        return r + torch.exp(u)

    matcher = SubgraphMatcher(pattern)
    graph = graph_of(model)
    assert matcher.match(graph) == []
    assert "would need a value computed from its own result" in str(
        matcher.explain(node_named(graph, "relu"))
    )


# ----------------------------------------------------------- several outputs
def test_a_pattern_with_several_outputs_matches_them_together():
    def model(a):
        return torch.relu(a) + 1, torch.sigmoid(a) * 2

    (match,) = matches(lambda x: (torch.relu(x), torch.sigmoid(x)), model)
    assert [n.name for n in match.returning_nodes] == ["relu", "sigmoid"]
    assert match.anchor.name == "relu"


def test_a_second_output_is_searched_among_users_not_taken_yet():
    def model(a):
        return torch.relu(a), torch.relu(a), torch.sigmoid(a), torch.sigmoid(a)

    found = matches(lambda x: (torch.relu(x), torch.sigmoid(x)), model)
    assert [[n.name for n in m.returning_nodes] for m in found] == [
        ["relu", "sigmoid"],
        ["relu_1", "sigmoid_1"],
    ]


# -------------------------------------------------------------------- filters
def test_a_match_filter_rejects_and_another_combination_is_tried():
    def model(a):
        return torch.relu(a), torch.sigmoid(a), torch.sigmoid(a)

    def not_the_first_sigmoid(match, graph, pattern_graph):
        return match.returning_nodes[1].name != "sigmoid"

    found = matches(
        lambda x: (torch.relu(x), torch.sigmoid(x)), model, match_filters=[not_the_first_sigmoid]
    )
    assert [n.name for n in found[0].returning_nodes] == ["relu", "sigmoid_1"]


def test_match_filters_get_the_match_and_both_graphs():
    seen = []
    pattern = fxloom.symbolic_trace(lambda x: torch.relu(x))
    graph = graph_of(lambda a: torch.relu(a))
    SubgraphMatcher(pattern, match_filters=[lambda *args: seen.append(args) or True]).match(graph)
    ((match, original, pattern_graph),) = seen
    assert original is graph and pattern_graph is pattern.graph
    assert match.anchors == [match.anchor]


# --------------------------------------------------------- modules, attributes
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.conv(x))


def test_a_call_module_matches_a_call_of_a_module_of_the_same_class():
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = Block()
            self.second = nn.Sequential(nn.Conv2d(3, 3, 3), nn.ReLU())
            self.third = nn.Sequential(nn.Conv2d(3, 3, 3), nn.GELU())

        def forward(self, x):
            return self.third(self.second(self.first(x)))

    found = matches(Block(), Model())
    assert [[n.target for n in m.nodes] for m in found] == [
        ["first.conv", "first.act"],
        ["second.0", "second.1"],
    ]


def test_a_call_module_of_a_pattern_graph_without_a_module_matches_by_target():
    pattern = fxloom.Graph()
    pattern.output(pattern.call_module("act", (pattern.placeholder("x"),)))
    graph = fxloom.symbolic_trace(Block()).graph
    assert [m.anchor.target for m in SubgraphMatcher(pattern).match(graph)] == ["act"]


def test_a_get_attr_matches_any_attribute_of_the_same_kind():
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.weight

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gamma = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.gamma

    assert anchors(matches(Scale(), Model())) == ["mul"]


def test_anchor_candidates_come_from_the_index_by_target(monkeypatch):
    tried = []
    original = SubgraphMatcher._unify
    monkeypatch.setattr(
        SubgraphMatcher,
        "_unify",
        lambda self, p, g, state: tried.append(g) or original(self, p, g, state),
    )

    def model(a):
        for _ in range(50):
            a = a + 1
        return torch.relu(a)

    assert anchors(matches(lambda x: torch.relu(x), model)) == ["relu"]
    assert [n.name for n in tried] == ["relu"]  # the 50 additions were never looked at


# ------------------------------------------------------------- bad patterns
@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (lambda x: x, "has no operations"),
        (lambda x: (torch.relu(x), x), "returns %x, an input"),
        (lambda x, y: torch.relu(x), "input %y is neither used nor returned"),
        (lambda x, y: (torch.relu(x), torch.relu(y)), "not connected"),
    ],
)
def test_unusable_patterns_are_refused_with_the_reason(pattern, message):
    with pytest.raises(PatternError, match=message):
        SubgraphMatcher(fxloom.symbolic_trace(pattern))


def test_a_pattern_with_a_dead_node_is_refused():
    pattern = fxloom.Graph()
    x = pattern.placeholder("x")
    pattern.call_function(torch.neg, (x,))
    pattern.output(pattern.call_function(torch.relu, (x,)))
    with pytest.raises(PatternError, match="pattern node %neg is neither used nor returned"):
        SubgraphMatcher(pattern)


def test_a_pattern_that_is_not_a_graph_is_refused():
    with pytest.raises(TypeError, match="trace a function with fxloom.symbolic_trace first"):
        SubgraphMatcher(lambda x: x)


def test_a_pattern_graph_without_output_is_refused():
    pattern = fxloom.Graph()
    pattern.call_function(torch.relu, (pattern.placeholder("x"),))
    with pytest.raises(PatternError, match="no output node"):
        SubgraphMatcher(pattern)


# ------------------------------------------------------------- explanations
def explain(pattern, model, name: str, **options):
    graph = graph_of(model)
    matcher = SubgraphMatcher(fxloom.symbolic_trace(pattern), **options)
    return matcher.explain(node_named(graph, name))


def test_explain_names_a_different_target():
    why = explain(lambda x: x * 2, lambda a: (a + 2) * 3, "add")
    assert not why
    assert why.reasons == [
        "as %mul: %add: target operator.add differs from the pattern's target operator.mul at %mul"
    ]


def test_explain_names_the_outside_user():
    def model(a):
        r = torch.relu(a)
        return torch.neg(r), r + 1

    why = explain(lambda x: torch.neg(torch.relu(x)), model, "neg")
    assert "%relu has a user outside the match: %add" in str(why)


def test_explain_names_a_different_constant():
    why = explain(lambda x: torch.clamp(x, ANY, 6.0), lambda a: torch.clamp(a, 0.0, 1.0), "clamp")
    assert why.reasons == ["as %clamp: %clamp: argument 2 is 1.0, the pattern's %clamp has 6.0"]


def test_explain_names_an_inconsistent_input():
    why = explain(lambda x: x * x, lambda a, b: a * b, "mul")
    assert "the pattern's input %x is %a, but %mul has %b at argument 1" in str(why)


def test_explain_names_a_missing_second_output():
    why = explain(lambda x: (torch.relu(x), torch.sigmoid(x)), lambda a: torch.relu(a), "relu")
    assert "no user of %a (the pattern's %x) is a call of torch.sigmoid" in str(why)


def test_explain_names_the_overlapping_match():
    def chain(a):
        return torch.relu(torch.relu(torch.relu(a)))

    why = explain(lambda x: torch.relu(torch.relu(x)), chain, "relu_2")
    assert "would share %relu_1 with the match at %relu_1" in str(why)


def test_explain_names_the_filter_that_rejected():
    def never(match, graph, pattern_graph):
        return False

    why = explain(lambda x: torch.relu(x), lambda a: torch.relu(a), "relu", match_filters=[never])
    assert why.reasons == ["as %relu: the match at %relu was rejected by never"]


def test_explain_reports_a_match():
    why = explain(lambda x: torch.relu(x + 1), lambda a: torch.relu(a + 1), "add")
    assert why and why.match is not None
    assert str(why) == "%add matches the pattern (the match at %relu)"


def test_explain_tries_each_pattern_operation_of_the_nodes_kind():
    def model(a):
        return torch.relu(torch.relu(a)).sum()

    why = explain(lambda x: torch.relu(torch.relu(x)) * 2, model, "relu")
    assert [reason.split(":")[0] for reason in why.reasons] == ["as %relu", "as %relu_1"]
