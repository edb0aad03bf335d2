"""The one sympy interpreter: every operation it names round-trips through each analysis."""

from __future__ import annotations

import pytest
import sympy

from fxloom.export.size_trees import evaluate_condition, exact_value, size_text, size_tree
from fxloom.serialize.symbols import EXPRESSION_CLASSES, decode_expr, encode_expr
from fxloom.values.symbolic.interpret import (
    CLASSES,
    OPERATIONS,
    SAVED_NAMES,
    UnsupportedExpression,
    interpret,
    operation_of,
)
from fxloom.values.symbolic.ranges import bounds

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
    assert set(EXPRESSION_CLASSES) == set(SAVED_NAMES.values())


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
