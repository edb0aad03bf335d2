"""The one place that knows sympy's expression classes, and a fold over them.

Every analysis of a symbolic size (its bounds, its encoding as a graph
argument, its name in a saved file, ...) walks the same expressions. Instead
of each keeping a table keyed by sympy class, ``OPERATIONS`` names each
supported class once, and an analysis is a table from those operation names to
handlers. ``interpret(expr, analysis)`` folds bottom-up: a handler gets the
expression and its operands already interpreted::

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", integer=True)
    >>> count = {"symbol": lambda e: 1, "integer": lambda e: 0,
    ...          "add": lambda e, xs: sum(xs), "mul": lambda e, xs: sum(xs)}
    >>> interpret(2 * s0 + 1, count)
    1

Leaves are handled by the names in ``LEAVES`` (``integer``, ``rational``,
``float``, ``infinity``, ``symbol``, ``boolean``), called with the leaf alone.
The class names a saved file uses (``SAVED_NAMES``) sit next to the class
table so that decoding a file and walking an expression cannot drift.

The analyses, each a table keyed by these names: bounds
(``ranges.BOUND_RULES``), size trees (``size_trees.ENCODERS``; the trees are
then evaluated, solved and printed by tables keyed by the same names), graph
nodes (``size_nodes.EMITTERS``, which walks top-down through ``operation_of``)
and the saved format (``fxloom.serialize.symbols.ENCODERS``; decoding builds
``CLASSES[operation]`` from ``SAVED_NAMES``, checking ``OPERAND_KINDS``).

Depends on sympy only (frontend-neutral: export, serialize and the shape
environment all read it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import sympy
from sympy.functions.elementary.piecewise import ExprCondPair

__all__ = [
    "LEAVES",
    "OPERAND_KINDS",
    "OPERATIONS",
    "CLASSES",
    "SAVED_NAMES",
    "UnsupportedExpression",
    "interpret",
    "operation_of",
]

# sympy class -> its one operation name (what analyses are keyed by).
OPERATIONS: dict[type, str] = {
    sympy.Add: "add",
    sympy.Mul: "mul",
    sympy.Pow: "pow",
    sympy.floor: "floor",
    sympy.ceiling: "ceiling",
    sympy.Mod: "mod",
    sympy.Max: "max",
    sympy.Min: "min",
    sympy.Abs: "abs",
    sympy.Eq: "eq",
    sympy.Ne: "ne",
    sympy.Lt: "lt",
    sympy.Le: "le",
    sympy.Gt: "gt",
    sympy.Ge: "ge",
    sympy.And: "and",
    sympy.Or: "or",
    sympy.Not: "not",
    sympy.Piecewise: "piecewise",
    ExprCondPair: "case",
}
# operation name -> the sympy class (its constructor when decoding).
CLASSES: dict[str, type] = {operation: cls for cls, operation in OPERATIONS.items()}
# operation name -> the name a saved file writes for it. Part of the save format:
# never change one (sympy's own class names differ: Eq is Equality).
SAVED_NAMES: dict[str, str] = {
    "add": "Add",
    "mul": "Mul",
    "pow": "Pow",
    "mod": "Mod",
    "floor": "floor",
    "ceiling": "ceiling",
    "max": "Max",
    "min": "Min",
    "abs": "Abs",
    "eq": "Eq",
    "ne": "Ne",
    "lt": "Lt",
    "le": "Le",
    "gt": "Gt",
    "ge": "Ge",
    "and": "And",
    "or": "Or",
    "not": "Not",
    "piecewise": "Piecewise",
    "case": "ExprCondPair",
}

LEAVES = ("integer", "rational", "float", "infinity", "symbol", "boolean")

# operation name -> what its operands are: numbers (sizes) or conditions (truth values).
# A piecewise expression and its cases mix both.
OPERAND_KINDS: dict[str, str] = {
    **dict.fromkeys(("add", "mul", "pow", "mod", "floor", "ceiling", "max", "min"), "number"),
    **dict.fromkeys(("abs", "eq", "ne", "lt", "le", "gt", "ge"), "number"),
    **dict.fromkeys(("and", "or", "not"), "condition"),
}

Handler = Callable[..., Any]


class UnsupportedExpression(TypeError):
    """An expression of a sympy class no analysis knows, or one this analysis lacks."""


def operation_of(expr: sympy.Basic) -> str:
    """The operation (or leaf) name of ``expr``'s outermost class."""
    if expr is sympy.true or expr is sympy.false:
        return "boolean"
    if expr in (sympy.oo, -sympy.oo):
        return "infinity"
    if expr.is_Integer:
        return "integer"
    if expr.is_Rational:
        return "rational"
    if expr.is_Float:
        return "float"
    if expr.is_Symbol:
        return "symbol"
    operation = OPERATIONS.get(type(expr))
    if operation is None:
        raise UnsupportedExpression(
            f"{expr} uses the sympy class {type(expr).__name__}, which fxloom's symbolic "
            "sizes do not support; add it to fxloom.values.symbolic.interpret.OPERATIONS "
            "and a handler to each analysis that needs it"
        )
    return operation


def interpret(
    expr: sympy.Basic,
    analysis: Mapping[str, Handler],
    default: Callable[[sympy.Basic], Any] | None = None,
) -> Any:
    """Fold ``expr`` bottom-up with ``analysis`` (operation name -> handler).

    A leaf's handler gets the leaf; an operation's gets ``(expr, operands)``.
    Where the class or the handler is missing, ``default(expr)`` answers for the
    whole subexpression if given; otherwise ``UnsupportedExpression`` names it.
    """
    try:
        operation = operation_of(expr)
    except UnsupportedExpression:
        if default is None:
            raise
        return default(expr)
    handler = analysis.get(operation)
    if handler is None:
        if default is not None:
            return default(expr)
        raise UnsupportedExpression(
            f"{expr} ({type(expr).__name__}, operation {operation!r}) has no handler in "
            "this analysis; add one for that operation name"
        )
    if operation in LEAVES:
        return handler(expr)
    return handler(expr, [interpret(arg, analysis, default) for arg in expr.args])
