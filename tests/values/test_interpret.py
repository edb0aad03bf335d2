"""The one sympy interpreter: every operation it names round-trips through each analysis."""

from __future__ import annotations

import pytest
import sympy
import torch

from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.serialize.symbols import decode_expr, encode_expr
from fxloom.values.symbolic import ShapeEnv, size_symint
from fxloom.values.symbolic.interpret import (
    CLASSES,
    OPERAND_KINDS,
    OPERATIONS,
    SAVED_NAMES,
    UnsupportedExpression,
    interpret,
    operation_of,
)
from fxloom.values.symbolic.ranges import bounds
from fxloom.values.symbolic.size_nodes import EMITTERS, SizeNodes
from fxloom.values.symbolic.size_trees import (
    evaluate_condition,
    exact_value,
    expr_text,
    size_text,
    size_tree,
)

s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
VALUES = {s0: 6, s1: 4}
RANGES = {s0: (sympy.Integer(2), sympy.Integer(10)), s1: (sympy.Integer(1), sympy.Integer(8))}

# One expression per operation name a size can use.
SIZES = {
    "add": s0 + 2 * s1 + 1,
    "mul": 3 * s0 * s1,
    "pow": s0**2,
    "floor": sympy.floor(s0 / 4),
    "ceiling": sympy.ceiling(s0 / 4),
    "mod": sympy.Mod(s0, s1),
    "max": sympy.Max(s0, s1),
    "min": sympy.Min(s0, s1),
    "abs": sympy.Abs(s0 - 7),
}
CONDITIONS = {
    "eq": sympy.Eq(s0, 6),
    "ne": sympy.Ne(s0, s1),
    "lt": sympy.Lt(s1, s0),
    "le": sympy.Le(s0, s1),
    "gt": sympy.Gt(s0, s1),
    "ge": sympy.Ge(s1, 4),
    "and": sympy.And(sympy.Eq(s0, 6), sympy.Lt(s1, 5)),
    "or": sympy.Or(sympy.Eq(s0, 1), sympy.Lt(s1, 5)),
    "not": sympy.Not(sympy.Eq(s0, 1), evaluate=False),  # sympy would write Ne
}


def test_every_class_has_one_operation_and_one_saved_name():
    assert set(CLASSES) == set(OPERATIONS.values()) == set(SAVED_NAMES)
    assert len(set(SAVED_NAMES.values())) == len(SAVED_NAMES)
    assert set(OPERAND_KINDS) <= set(CLASSES)


@pytest.mark.parametrize("operation", [*SIZES, *CONDITIONS])
def test_the_sample_expression_is_that_operation(operation):
    expr = {**SIZES, **CONDITIONS}[operation]
    assert operation_of(expr) == operation


@pytest.mark.parametrize("operation", [*SIZES, *CONDITIONS])
def test_saved_expressions_decode_to_themselves(operation):
    expr = {**SIZES, **CONDITIONS}[operation]
    symbols = {"s0": s0, "s1": s1}
    assert decode_expr(encode_expr(expr), symbols, "a test") == expr


@pytest.mark.parametrize("operation", [*SIZES, *CONDITIONS])
def test_size_trees_evaluate_as_sympy_substitutes(operation):
    expr = {**SIZES, **CONDITIONS}[operation]
    names = {symbol.name: value for symbol, value in VALUES.items()}
    expected = expr.subs(VALUES)
    if operation in CONDITIONS:
        assert evaluate_condition(size_tree(expr), names) == bool(expected)
    else:
        assert exact_value(size_tree(expr), names) == int(expected)


def test_the_saved_form_of_an_expression_is_unchanged():
    # Part of the file format: files written before the interpreter read the same.
    assert encode_expr(2 * s0 + 1) == {
        "op": "Add",
        "args": [1, {"op": "Mul", "args": [2, {"symbol": "s0"}]}],
    }
    assert encode_expr(sympy.Eq(sympy.Mod(s0, 2), 0)) == {
        "op": "Eq",
        "args": [{"op": "Mod", "args": [{"symbol": "s0"}, 2]}, 0],
    }
    assert [encode_expr(sympy.oo), encode_expr(-sympy.oo), encode_expr(sympy.true)] == [
        "oo",
        "-oo",
        True,
    ]
    assert encode_expr(sympy.Rational(3, 2)) == {"rational": [3, 2]}


@pytest.mark.parametrize("operation", list(SIZES))
def test_bounds_contain_the_value(operation):
    low, high = bounds(SIZES[operation], RANGES)
    assert low <= SIZES[operation].subs(VALUES) <= high


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        (s0 + 2 * s1 + 1, "s0 + 2*s1 + 1"),
        (sympy.floor(s0 / 4), "s0//4"),
        (sympy.Mod(s0, s1), "s0 % s1"),
        (sympy.And(sympy.Eq(s0, 6), sympy.Lt(s1, 5)), "s0 == 6 and s1 < 5"),
        (sympy.Max(s0, s1), "max(s0, s1)"),
    ],
)
def test_printed_sizes_are_stable(expr, text):
    assert size_text(size_tree(expr)) == text


def test_a_class_no_table_knows_is_named_in_the_error():
    with pytest.raises(UnsupportedExpression, match=r"sin\(s0\) uses the sympy class sin"):
        interpret(sympy.sin(s0), {"symbol": lambda e: e})


def test_an_analysis_without_a_handler_names_the_operation():
    with pytest.raises(
        UnsupportedExpression, match=r"Mod\(s0, s1\) \(Mod, operation .mod.\) has no handler"
    ):
        interpret(sympy.Mod(s0, s1), {"symbol": lambda e: e})


def test_a_default_answers_for_what_the_analysis_lacks():
    assert interpret(sympy.Mod(s0, s1), {}, default=lambda e: "unknown") == "unknown"


# ----------------------------------------------------------------- emitting nodes
EMITTED_SIZES = {operation: SIZES[operation] for operation in SIZES if operation != "abs"}


def emitted_module(expr: sympy.Basic) -> GraphModule:
    """A module of two tensors ``x`` and ``y`` returning ``expr`` of their first sizes (s0, s1),
    its nodes made by ``SizeNodes``."""
    env = ShapeEnv()
    a, b = size_symint(env, 6), size_symint(env, 4)
    graph = Graph()
    sizes = SizeNodes(graph, env, stamp=dict, simplify=lambda e: e)
    for name, size in (("x", a), ("y", b)):
        sizes.bind_sizes(graph.placeholder(name), [size])
    ours = {a.node.expr: s0, b.node.expr: s1}
    graph.output(sizes.node(expr.xreplace({v: k for k, v in ours.items()})))
    return GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("operation", [*EMITTED_SIZES, *CONDITIONS])
def test_emitted_nodes_compute_what_sympy_substitutes(operation):
    expr = {**EMITTED_SIZES, **CONDITIONS}[operation]
    module = emitted_module(expr)
    for a, b in [(6, 4), (9, 2), (2, 7)]:
        expected = expr.subs({s0: a, s1: b})
        got = module(torch.empty(a), torch.empty(b))
        assert got == (bool(expected) if operation in CONDITIONS else int(expected))


def test_a_difference_is_one_subtraction_without_a_node_for_the_negated_term():
    module = emitted_module(s0 - s1)
    targets = [node.target for node in module.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.aten.sym_size.int) == 2
    assert [t.__name__ for t in targets if t is not torch.ops.aten.sym_size.int] == ["sub"]


def test_an_operation_with_no_graph_form_names_the_table_to_extend():
    with pytest.raises(NotImplementedError, match="size_nodes.EMITTERS"):
        emitted_module(sympy.Abs(s0 - 7))


def test_every_emitter_is_keyed_by_an_operation_the_interpreter_knows():
    assert set(EMITTERS) - {"symbol"} <= set(CLASSES)


# ----------------------------------------------------------------- printing


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        (sympy.Eq(sympy.Mod(s0, 2), 0), "x.size(0) % 2 == 0"),
        (sympy.Eq(s1, s0 / 2), "y.size(0) == x.size(0)/2"),
        (sympy.Lt(8388608 * s0, 2147483648), "8388608*x.size(0) < 2147483648"),
        (sympy.Ne(s0, 5), "x.size(0) != 5"),
    ],
)
def test_a_guard_prints_with_the_inputs_sizes_for_its_symbols(expr, text):
    assert expr_text(expr, {"s0": "x.size(0)", "s1": "y.size(0)"}) == text


def test_an_expression_without_a_size_tree_prints_as_sympy_does_renamed():
    piecewise = sympy.Piecewise((s0, s0 > 2), (1, True))
    assert expr_text(piecewise, {"s0": "n"}) == str(piecewise).replace("s0", "n")
