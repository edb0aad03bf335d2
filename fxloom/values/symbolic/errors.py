"""Errors of the shape environment: a program that contradicts declared ranges, a guard on data.

Each error names the symbol, its range, the condition and the user's line, and says
what to change. Depends on nothing of fxloom.
"""

from __future__ import annotations

__all__ = ["ConstraintViolationError", "DataDependentGuardError"]


class ConstraintViolationError(ValueError):
    """The program requires something of a size that its declared range does not promise.

    ``symbol`` is the sympy symbol, ``dim_name`` the user's name for it (a ``Dim``),
    ``declared`` its declared ``(min, max)``, ``condition`` what the program requires,
    ``location`` the user's ``file:line``.
    """

    def __init__(self, message: str, *, symbol, dim_name, declared, condition, location) -> None:
        super().__init__(message)
        self.symbol = symbol
        self.dim_name = dim_name
        self.declared = declared
        self.condition = condition
        self.location = location


class DataDependentGuardError(RuntimeError):
    """A branch on a value that depends on tensor data (an unbacked symbol such as ``i0``)."""

    def __init__(self, message: str, *, condition, location) -> None:
        super().__init__(message)
        self.condition = condition
        self.location = location
