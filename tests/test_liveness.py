"""``liveness.last_uses``: after which node each value dies, for codegen and the Interpreter alike."""

from __future__ import annotations

import operator

import torch

import fxloom as fx
from fxloom.liveness import last_uses


def names(graph: fx.Graph) -> dict[str, list[str]]:
    """``last_uses`` by node name, in graph order."""
    dead_after = last_uses(graph)
    return {
        node.name: [value.name for value in dead_after[node]]
        for node in graph.nodes
        if node in dead_after
    }


def test_a_value_dies_after_its_last_user():
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    b = g.call_function(operator.add, (a, x))
    g.output(g.call_function(operator.mul, (b, a)))
    assert names(g) == {"add": ["x"], "mul": ["add", "relu"], "output": ["mul"]}


def test_what_the_output_returns_dies_at_the_output_and_not_before():
    g = fx.Graph()
    x = g.placeholder("x")
    r = g.call_function(torch.relu, (x,))
    g.output((r, x))
    assert names(g) == {"output": ["relu", "x"]}


def test_the_output_node_is_never_listed_as_unused():
    g = fx.Graph()
    g.output(None)
    assert names(g) == {}


def test_an_unused_value_dies_where_it_is_computed_and_comes_first():
    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(print, (x,))
    g.output(None)
    assert names(g) == {"print_1": ["print_1", "x"]}


def test_unused_placeholders_and_get_attrs_die_where_they_are_computed():
    g = fx.Graph()
    g.placeholder("x")
    g.get_attr("weight")
    g.output(None)
    assert names(g) == {"x": ["x"], "weight": ["weight"]}


def test_get_attr_values_follow_the_same_rule_as_any_value():
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("weight")
    g.output(g.call_function(operator.add, (x, w)))
    assert names(g) == {"add": ["x", "weight"], "output": ["add"]}


def test_a_value_used_twice_by_one_node_is_listed_once():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.add, (x, x)))
    assert names(g)["add"] == ["x"]


def test_values_inside_containers_and_kwargs_count_as_uses():
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    g.output(g.call_function(torch.cat, ([x, y],), {"dim": 0}))
    assert names(g)["cat"] == ["x", "y"]


def test_an_erased_node_neither_uses_nor_is_listed():
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    b = g.call_function(torch.neg, (x,))
    g.output(a)
    assert names(g) == {"neg": ["neg", "x"], "output": ["relu"]}
    g.erase_node(b)
    assert names(g) == {"relu": ["x"], "output": ["relu"]}


def test_edited_arguments_move_the_last_use():
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    b = g.call_function(torch.neg, (a,))
    g.output(b)
    assert names(g) == {"relu": ["x"], "neg": ["relu"], "output": ["neg"]}
    b.args = (x,)  # relu is now unused; x lives on to neg
    assert names(g) == {"relu": ["relu"], "neg": ["x"], "output": ["neg"]}


def test_the_interpreter_keeps_the_analysis_as_user_to_last_uses():
    gm = fx.symbolic_trace(lambda x: torch.relu(x) + x)
    interpreter = fx.Interpreter(gm)
    assert interpreter.user_to_last_uses == last_uses(gm.graph)


def test_generated_code_releases_what_the_analysis_says():
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    g.call_function(print, (a,))
    b = g.call_function(operator.add, (a, x))
    g.output(b)
    assert names(g) == {"print_1": ["print_1"], "add": ["relu", "x"], "output": ["add"]}
    # Unused print_1 is never bound; what the output returns is not released.
    assert g.python_code().src.splitlines()[1:] == [
        "    relu = torch.relu(x)",
        "    print(relu)",
        "    add = relu + x;  relu = x = None",
        "    return add",
    ]


def test_an_unused_call_is_not_bound_whatever_its_arguments_print_as():
    # Binding is decided from the graph, never from printed text, so a ';'
    # inside a string argument changes nothing.
    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(print, (x, "a;b"))
    g.output(None)
    assert g.python_code().src.splitlines()[1:] == [
        "    print(x, 'a;b');  x = None",
        "    return None",
    ]


def test_unused_values_that_stay_bound_are_not_released():
    # An annotated value keeps its name (the annotation says what it is), and a
    # get_attr stays an assignment; neither is set to None afterwards.
    g = fx.Graph()
    x = g.placeholder("x")
    g.get_attr("weight")
    g.call_function(torch.relu, (x,), type_expr=torch.Tensor)
    g.output(None)
    assert g.python_code().src.splitlines()[1:] == [
        "    weight = self.weight",
        "    relu: torch.Tensor = torch.relu(x);  x = None",
        "    return None",
    ]
