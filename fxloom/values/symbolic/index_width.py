"""Bounds that come from an index width: ``N*C*H*W <= 2**31 - 1`` narrows a size, never refuses it.

Kernels that index with 32-bit integers guard on it (a CUDA convolution asks whether
its input's element count fits in an ``int32``). On a dynamic batch, that guard bounds
the batch — ResNet-50 at 224x224 on CUDA: at most 880,801 — which no user means to
forbid, and which the declared ``Dim`` cannot promise either. The shape environment
takes such a guard as a narrowing of the size's range (reported in
``range_constraints`` and ``shape_constraints``, with the line that made it, and
checked when the program runs), where any other guard that narrows a ``Dim`` is a
``ConstraintViolationError``.

A guard is of this form when it says a sum of sizes (products of sizes) with positive
coefficients, plus a constant, is at most (or below) one of ``INDEX_LIMITS``, the
largest values of the integer widths kernels index with.

    >>> import sympy
    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> upper_bound(sympy.Le(802816 * s0, 2**31 - 1))
    IndexBound(expr=802816*s0, limit=2147483647, width='int32')
    >>> upper_bound(sympy.Le(s0, 10)) is None
    True

Depends on sympy.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from fxloom.values.symbolic.interpret import OPERATIONS

__all__ = ["INDEX_LIMITS", "IndexBound", "upper_bound"]

# The largest value of each index width (and the first value past it, which guards
# written as ``numel < 2**31`` compare with), by the width's name.
INDEX_LIMITS: dict[int, str] = {
    2**31 - 1: "int32",
    2**31: "int32",
    2**32 - 1: "uint32",
    2**32: "uint32",
    2**63 - 1: "int64",
    2**63: "int64",
}


@dataclass(frozen=True)
class IndexBound:
    """A guard saying ``expr <= limit`` (``limit`` adjusted for ``<``), from an index width."""

    expr: sympy.Expr
    limit: int
    width: str


# inequality (by operation name, fxloom.values.symbolic.interpret) -> (smaller side, larger
# side, 1 if strict).
_SIDES = {
    "le": lambda f: (f.lhs, f.rhs, 0),
    "lt": lambda f: (f.lhs, f.rhs, 1),
    "ge": lambda f: (f.rhs, f.lhs, 0),
    "gt": lambda f: (f.rhs, f.lhs, 1),
}


def upper_bound(fact: sympy.Basic) -> IndexBound | None:
    """The index-width bound ``fact`` states, or None when it is any other condition."""
    sides = _SIDES.get(OPERATIONS.get(type(fact)))
    if sides is None:
        return None
    small, big, strict = sides(fact)
    if big.is_Integer and int(big) in INDEX_LIMITS:  # `numel <= INT_MAX`, as kernels write it
        expr, limit = sympy.expand(small), big
    else:  # the same after sympy moved terms (`150528*s0 - 1 <= 2**31 - 1`)
        constant, expr = sympy.expand(small - big).as_coeff_Add()
        limit = -constant
    if not (limit.is_Integer and int(limit) in INDEX_LIMITS) or not expr.free_symbols:
        return None
    terms = expr.as_coefficients_dict()
    if not all(c.is_positive and t.is_polynomial() for t, c in terms.items() if t != 1):
        return None  # a difference of sizes is no element count
    return IndexBound(expr, int(limit) - strict, INDEX_LIMITS[int(limit)])
