"""The sizes of the inputs under ``dynamic_shapes``: one symbol per ``Dim``, expressions for derived ones.

``dynamic_shapes`` says, per input dimension, a ``Dim`` (a named, ranged size
shared by every dimension naming it), a derived dim (``2 * seq + 1``: an
expression of its root Dim), or a hint (``Dim.AUTO``: export decides;
``Dim.DYNAMIC``: dynamic, an error if the program fixes it). ``InputSizes``
turns those into the ``torch.SymInt`` sizes of the inputs' stand-ins:

    >>> import torch
    >>> from fxloom.export import Dim
    >>> from fxloom.values.symbolic import ShapeEnv
    >>> sizes = InputSizes(ShapeEnv())
    >>> seq = Dim("seq", max=512)
    >>> sizes.of("x", torch.ones(3, 8), {1: seq}), sizes.of("y", torch.ones(17), {0: 2 * seq + 1})
    ([3, s0], [2*s0 + 1])

A Dim's symbol reasons as if the size were at least 2 whatever the Dim's
``min`` (sizes 0 and 1 are special cases in many operators; the program is
taken to treat them like the others, as torch.export does), while its
declared range is what ``range_constraints`` reports and what the exported
module checks at call time.

Depends on ``dims`` and ``symbolic``.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from fxloom.values.symbolic import ShapeEnv, size_symint, wrap_expr
from fxloom.values.symbolic.dims import DerivedDim, Dim, DimHint
from fxloom.values.symbolic.dynamic_shapes import symbol_range
from fxloom.values.symbolic.ranges import ValueRange
from fxloom.values.symbolic_scalars import is_symbolic

__all__ = ["InputSizes"]


class InputSizes:
    """Symbols for the dynamic dimensions of the inputs; see the module docstring."""

    def __init__(self, env: ShapeEnv) -> None:
        self.env = env
        self._symbols: dict[int, torch.SymInt] = {}  # id(Dim) -> its size
        self.declared: dict[sympy.Symbol, ValueRange] = {}  # the ranges Dims promise
        self.made_static: list[str] = []  # AUTO dimensions whose example is 0 or 1

    def of(self, path: str, tensor: torch.Tensor, dims: dict[int, Any]) -> list[Any] | None:
        """The sizes of input ``path`` (``tensor`` is its example); None when all are static."""
        if not dims:
            return None
        sizes: list[Any] = list(tensor.shape)
        for index, spec in dims.items():
            sizes[index] = self._size(f"{path}.size({index})", tensor.shape[index], spec)
        return sizes if any(is_symbolic(size) for size in sizes) else None

    def _size(self, source: str, example: int, spec: Dim | DimHint) -> Any:
        if isinstance(spec, DerivedDim):  # coefficient * root + offset
            root = self._named(spec.root, spec.root_value(example), source)
            return wrap_expr(self.env, spec.coefficient * root.node.expr + spec.offset)
        if isinstance(spec, Dim):
            return self._named(spec, example, source)
        hint = spec.kind
        if hint == "STATIC":
            return example
        if example < 2:  # 0 and 1 are special cases: an AUTO dimension stays static
            if hint == "DYNAMIC":
                raise ValueError(
                    f"{source} is marked Dim.DYNAMIC but its example size is {example}; sizes 0 "
                    "and 1 are special-cased by many operators: pass an example of size >= 2"
                )
            self.made_static.append(f"{source} = {example}")
            return example
        declared = source if hint == "DYNAMIC" else None
        low, high = symbol_range(spec)
        size = size_symint(self.env, example, min=low, max=high, dim_name=declared, source=source)
        if spec.min is not None or spec.max is not None:  # a ranged hint reports its range
            self.declared[size.node.expr] = ValueRange(spec.min or 0, spec.max)
        return size

    def _named(self, dim: Dim, example: int, source: str) -> torch.SymInt:
        found = self._symbols.get(id(dim))
        if found is not None:
            return found
        if example < 2:
            raise ValueError(
                f"{source}: the example's size {example} for Dim {dim.__name__!r} is special-"
                "cased by many operators (sizes 0 and 1); pass an example of size >= 2"
            )
        low, high = symbol_range(dim)
        size = size_symint(
            self.env,
            example,
            min=low,
            max=high,
            dim_name=dim.__name__,
            source=source,
        )
        self.declared[size.node.expr] = ValueRange(dim.min, dim.max)
        self.env.symbols[size.node.expr].declared = (dim.min, dim.max)
        self._symbols[id(dim)] = size
        return size
