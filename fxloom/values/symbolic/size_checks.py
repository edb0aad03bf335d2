"""``check_sizes``: an exported module's check that its inputs' symbolic sizes fit together.

A program exported with dynamic shapes holds for every input whose sizes
satisfy what the capture assumed: each symbol in its range, and sizes that the
program ties together equal (``y.shape[0] == x.shape[0]``) or related
(``y.shape[1] == 2 * x.shape[1]``). ``add_size_check`` adds one ``check_sizes``
call after the per-input checks of ``input_checks``; the sizes travel in the
graph as size trees (``size_trees``), printed in the generated code::

    check_sizes((x, y), ('x', 'y'), ((0, 0, 's0'), (1, 0, ('mul', 2, 's0'))), (('s0', 2, 1024, 'batch'),))

Its effect (a check: kept, writing nothing) and its place on the host are its row in
``fxloom.ops.runtime_functions`` (saved under this module's name; files that name
``fxloom.export.size_checks``, its home before issue 23, load through an alias row).
Frontend-neutral: it needs only the inputs' symbolic sizes, not how they were
captured, so it lives with the shape environment. Depends on ``size_trees`` and the IR.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import sympy
import torch

from fxloom.graph import Graph
from fxloom.node import Node
from fxloom.values.symbolic.size_trees import (
    SizeTree,
    exact_value,
    linear_form,
    size_symbols,
    size_text,
    size_tree,
)
from fxloom.values.symbolic_scalars import symbolic_expr

__all__ = ["add_size_check", "check_sizes"]

# One symbolic dimension to check: (input position, dimension, size tree).
DimCheck = tuple[int, int, SizeTree]
# One symbol's range: (symbol, min, max or None, the user's Dim name or None).
SymbolRange = tuple[str, int, int | None, str | None]


def check_sizes(
    values: tuple,
    names: tuple[str, ...],
    dims: tuple[DimCheck, ...],
    ranges: tuple[SymbolRange, ...],
) -> None:
    """Raise unless the inputs' symbolic sizes fit together and lie in their symbols' ranges.

    ``dims`` lists each symbolic dimension as (position in ``values``, dimension,
    size tree), in an order where each symbol is bound before it is used (see
    ``add_size_check``): a bare symbol takes the size the first time and must equal it
    after; a tree linear in one unbound symbol solves for it (``2*s0`` given 8 binds
    ``s0 = 4``); any other tree is computed from the bound symbols and compared. A
    symbol bound outside its range in ``ranges`` is refused. Messages name the input,
    the dimension, the constraint (by the user's Dim names) and the size given.
    """
    sizes = _BoundSizes(values, names, ranges)
    for position, dim, tree in dims:
        sizes.check(position, dim, tree)


class _BoundSizes:
    """The symbols' values learned from the inputs so far, and where each came from."""

    def __init__(self, values: tuple, names: tuple[str, ...], ranges: tuple) -> None:
        self.values = values
        self.names = names
        self.ranges = {symbol: (low, high, dim_name) for symbol, low, high, dim_name in ranges}
        self.display = {symbol: dim_name for symbol, _, _, dim_name in ranges if dim_name}
        self.bound: dict[str, int] = {}
        self.sources: dict[str, tuple[int, int]] = {}

    def check(self, position: int, dim: int, tree: SizeTree) -> None:
        size = self.values[position].shape[dim]
        unknown = [symbol for symbol in size_symbols(tree) if symbol not in self.bound]
        if not unknown:
            self._compare(position, dim, tree, size)
        elif isinstance(tree, str):
            self._bind(tree, size, position, dim)
        else:
            self._solve(position, dim, tree, size, unknown)

    def _where(self, position: int, dim: int) -> str:
        return f"input {self.names[position]!r}: dimension {dim} is"

    def _bind(
        self, symbol: str, value: int, position: int, dim: int, solved_from: int | None = None
    ) -> None:
        """``symbol = value``, read from the dimension (or solved from its size ``solved_from``)."""
        low, high, dim_name = self.ranges.get(symbol, (0, None, None))
        if value < low or (high is not None and value > high):
            bounds = f"[{low}, {'inf' if high is None else high}]"
            where = f"{self._where(position, dim)} {value},"
            if solved_from is not None:
                where = (
                    f"{self._where(position, dim)} {solved_from}, which makes "
                    f"{self.display.get(symbol, symbol)} = {value},"
                )
            of = (
                f"of Dim {dim_name!r} {bounds}"
                if dim_name
                else f"{bounds} the program was exported for"
            )
            raise ValueError(f"{where} outside the range {of}")
        self.bound[symbol] = value
        self.sources[symbol] = (position, dim)

    def _solve(self, position: int, dim: int, tree: SizeTree, size: int, unknown: list) -> None:
        (symbol,) = unknown  # add_size_check orders the checks so that one is unknown at most
        coefficient, offset = linear_form(tree, symbol, self.bound)
        value = (size - offset) / coefficient if coefficient else Fraction(-1)
        if value.denominator != 1 or value < 0:
            name = self.display.get(symbol, symbol)
            raise ValueError(
                f"{self._where(position, dim)} {size}, but the program needs it to be "
                f"{size_text(tree, self.display)} for an integer {name} >= 0"
            )
        self._bind(symbol, int(value), position, dim, solved_from=size)

    def _compare(self, position: int, dim: int, tree: SizeTree, size: int) -> None:
        try:
            expected = exact_value(tree, self.bound)
        except ZeroDivisionError:
            expected = None
        if expected == size:
            return
        where = f"{self._where(position, dim)} {size}"
        if isinstance(tree, str):
            first_position, first_dim = self.sources[tree]
            raise ValueError(
                f"{where}, but the program needs it equal to dimension {first_dim} of input "
                f"{self.names[first_position]!r} ({self.display.get(tree, tree)} = "
                f"{self.bound[tree]})"
            )
        sources = ", ".join(
            f"{self.display.get(symbol, symbol)} from input "
            f"{self.names[self.sources[symbol][0]]!r} dimension {self.sources[symbol][1]}"
            for symbol in size_symbols(tree)
        )
        value = "undefined" if expected is None else str(expected)
        raise ValueError(
            f"{where}, but the program needs {size_text(tree, self.display)} = {value} ({sources})"
        )


def add_size_check(
    graph: Graph,
    placeholders: list[Node],
    vals: list[Any],
    ranges: dict[sympy.Symbol, tuple[int, int | None, str | None]],
) -> Node | None:
    """Add to ``graph`` one ``check_sizes`` call for the inputs' symbolic dimensions, if any.

    ``vals`` are the placeholders' ``meta["val"]`` (stand-ins whose sizes may be
    ``torch.SymInt``; other values are skipped); ``ranges`` maps each symbol to its
    ``(min, max or None, the user's Dim name or None)``. Checks are ordered so every
    symbol is bound (by a dimension that is the bare symbol, or a derived size linear
    in it) before a size that needs it; a symbol no dimension determines is an error.
    """
    involved: list[Node] = []
    dims: list[DimCheck] = []
    for placeholder, val in zip(placeholders, vals):
        trees = _symbolic_size_trees(val)
        if trees:
            dims.extend((len(involved), dim, tree) for dim, tree in trees)
            involved.append(placeholder)
    if not dims:
        return None
    names = tuple(node.name for node in involved)
    ordered = _checking_order(dims, names)
    symbols = list(dict.fromkeys(s for _, _, tree in ordered for s in size_symbols(tree)))
    by_name = {symbol.name: bounds for symbol, bounds in ranges.items()}
    symbol_ranges = tuple(
        (symbol, int(by_name[symbol][0]), _finite(by_name[symbol][1]), by_name[symbol][2])
        for symbol in symbols
        if symbol in by_name
    )
    args = (tuple(involved), names, tuple(ordered), symbol_ranges)
    return graph.create_node("call_function", check_sizes, args, {}, name="check_input_sizes")


def _symbolic_size_trees(val: Any) -> list[tuple[int, SizeTree]]:
    if not isinstance(val, torch.Tensor):
        return []
    return [
        (dim, size_tree(expr))
        for dim, expr in enumerate(symbolic_expr(size) for size in val.shape)
        if expr is not None
    ]


def _finite(bound: Any) -> int | None:
    return None if bound is None or getattr(bound, "is_finite", True) is False else int(bound)


def _checking_order(dims: list[DimCheck], names: tuple[str, ...]) -> list[DimCheck]:
    """``dims`` with bare symbols first, then each tree once what it needs is bound."""
    ordered = [check for check in dims if isinstance(check[2], str)]
    bound = {check[2] for check in ordered}
    waiting = [check for check in dims if not isinstance(check[2], str)]
    while waiting:
        still = []
        for check in waiting:
            unknown = [s for s in size_symbols(check[2]) if s not in bound]
            if len(unknown) == 1 and linear_form(check[2], unknown[0], _ANY_VALUES) is not None:
                bound.add(unknown[0])  # this size determines its one unknown symbol
            elif unknown:
                still.append(check)
                continue
            ordered.append(check)
        if len(still) == len(waiting):
            position, dim, tree = still[0]
            raise ValueError(
                f"input {names[position]!r}: dimension {dim} has the size {size_text(tree)}, "
                "whose symbols no input dimension determines, so calls cannot be checked; "
                "declare the dimension static, or report this to fxloom"
            )
        waiting = still
    return ordered


class _AnyValues(dict):
    """Every symbol is 2: enough to tell whether a tree is linear in one symbol."""

    def __missing__(self, key: str) -> int:
        return 2


_ANY_VALUES = _AnyValues()
