"""Interval bounds of a sympy expression over symbols with integer ranges.

``bounds(expr, ranges)`` gives an inclusive ``(low, high)`` (sympy numbers, ``oo``
for unbounded) that every value of ``expr`` lies in when each symbol lies in its
range. The rules are an analysis for ``interpret`` (``BOUND_RULES``, keyed by the
operation names of ``fxloom.values.symbolic.interpret``); an expression of a kind
not in the table is unbounded, never wrongly bounded. The shape
environment uses it to decide guards without recording them.

Depends on sympy only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy

from fxloom.values.symbolic.interpret import interpret

__all__ = ["Bounds", "bounds", "BOUND_RULES", "ValueRange"]

Bounds = tuple[sympy.Expr, sympy.Expr]
_UNBOUNDED: Bounds = (-sympy.oo, sympy.oo)


def _products(a: Bounds, b: Bounds) -> Bounds:
    # 0 * oo is nan in sympy; a product with a zero end is zero.
    corners = [x * y if x != 0 and y != 0 else sympy.S.Zero for x in a for y in b]
    return min(corners), max(corners)


def _add(expr: sympy.Basic, args: list[Bounds]) -> Bounds:
    return sympy.Add(*(lo for lo, _ in args)), sympy.Add(*(hi for _, hi in args))


def _mul(expr: sympy.Basic, args: list[Bounds]) -> Bounds:
    result: Bounds = (sympy.S.One, sympy.S.One)
    for arg in args:
        result = _products(result, arg)
    return result


def _pow(expr: sympy.Basic, args: list[Bounds]) -> Bounds:
    (base_lo, base_hi), (exp_lo, exp_hi) = args
    if exp_lo != exp_hi or not exp_lo.is_Integer or exp_lo < 0 or base_lo < 0:
        return _UNBOUNDED
    return base_lo**exp_lo, base_hi**exp_lo  # monotone for a non-negative base


def _floor(expr: sympy.Basic, args: list[Bounds]) -> Bounds:
    ((lo, hi),) = args
    return sympy.floor(lo), sympy.floor(hi)


def _ceiling(expr: sympy.Basic, args: list[Bounds]) -> Bounds:
    ((lo, hi),) = args
    return sympy.ceiling(lo), sympy.ceiling(hi)


def _mod(expr: sympy.Basic, args: list[Bounds]) -> Bounds:
    # Python's modulo by a positive divisor lies in [0, divisor - 1], and is the
    # dividend itself when that is already below every possible divisor.
    (dividend_lo, dividend_hi), (div_lo, div_hi) = args
    if div_lo <= 0:
        return _UNBOUNDED
    if dividend_lo >= 0 and dividend_hi < div_lo:
        return dividend_lo, dividend_hi
    return sympy.S.Zero, div_hi - 1


def _max(expr: sympy.Basic, args: list[Bounds]) -> Bounds:
    return max(lo for lo, _ in args), max(hi for _, hi in args)


def _min(expr: sympy.Basic, args: list[Bounds]) -> Bounds:
    return min(lo for lo, _ in args), min(hi for _, hi in args)


# operation -> rule from the bounds of the arguments to the bounds of the whole.
BOUND_RULES: dict[str, Callable[..., Bounds]] = {
    "integer": lambda e: (e, e),
    "rational": lambda e: (e, e),
    "float": lambda e: (e, e),
    "infinity": lambda e: (e, e),
    "add": _add,
    "mul": _mul,
    "pow": _pow,
    "floor": _floor,
    "ceiling": _ceiling,
    "mod": _mod,
    "max": _max,
    "min": _min,
}


def bounds(expr: sympy.Basic, ranges: Mapping[sympy.Symbol, Bounds]) -> Bounds:
    """Inclusive bounds of ``expr`` given each symbol's range.

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", integer=True)
    >>> bounds(2 * s0 + 1, {s0: (sympy.Integer(2), sympy.oo)})
    (5, oo)
    """
    rules = {**BOUND_RULES, "symbol": lambda e: ranges.get(e, _UNBOUNDED)}
    return interpret(expr, rules, default=lambda e: _UNBOUNDED)


class ValueRange:
    """The inclusive range of values a symbol may take, as ``range_constraints`` reports it.

    >>> ValueRange(2, 1024), ValueRange(0, None)
    (VR[2, 1024], VR[0, inf])
    """

    __slots__ = ("lower", "upper")

    def __init__(self, lower, upper) -> None:
        self.lower = _plain(lower)
        self.upper = _plain(upper)

    def __contains__(self, value) -> bool:
        return self.lower <= value <= self.upper

    def __eq__(self, other) -> bool:
        return isinstance(other, ValueRange) and (self.lower, self.upper) == (
            other.lower,
            other.upper,
        )

    def __hash__(self) -> int:
        return hash((self.lower, self.upper))

    def __repr__(self) -> str:
        return f"VR[{self.lower}, {self.upper}]"


def _plain(bound):
    """A range end as a Python number: an int, or +-inf for an unbounded end."""
    if bound is None:
        return float("inf")
    if bound in (sympy.oo, -sympy.oo):
        return float(bound)
    return int(bound)
