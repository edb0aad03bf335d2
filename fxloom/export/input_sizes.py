"""The sizes of the inputs under ``dynamic_shapes``: one symbol per ``Dim``, expressions for derived ones.

``dynamic_shapes`` says, per input dimension, a ``Dim`` (a named, ranged size
shared by every dimension naming it), a derived dim (``2 * seq + 1``: an
expression of its root Dim), or a hint (``Dim.AUTO``: export decides;
``Dim.DYNAMIC``: dynamic, an error if the program fixes it). ``InputSizes``
turns those into the ``torch.SymInt`` sizes of the inputs' stand-ins:

    >>> import torch
    >>> from fxloom.export import Dim
    >>> from fxloom.export.symbolic import ShapeEnv
    >>> sizes = InputSizes(ShapeEnv())
    >>> seq = Dim("seq", max=512)
    >>> sizes.of("x", torch.ones(3, 8), {1: seq}), sizes.of("y", torch.ones(8), {0: seq})
    ([3, s0], [s0])

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

from fxloom.export.dims import Dim
from fxloom.export.symbolic import ShapeEnv, size_symint, wrap_expr
from fxloom.export.symbolic.ranges import ValueRange

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
        return sizes if any(isinstance(size, torch.SymInt) for size in sizes) else None

    def _size(self, source: str, example: int, spec: Any) -> Any:
        if isinstance(spec, Dim):
            return self._named(spec, example, source)
        if hasattr(spec, "root"):  # a derived dim: coefficient * root + offset
            root_example = (example - spec.offset) // spec.coefficient
            root = self._named(spec.root, root_example, source)
            return wrap_expr(self.env, spec.coefficient * root.node.expr + spec.offset)
        hint = getattr(spec, "name", str(spec)).rpartition(".")[2].upper()
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
        return size_symint(self.env, example, min=2, dim_name=declared, source=source)

    def _named(self, dim: Dim, example: int, source: str) -> torch.SymInt:
        found = self._symbols.get(id(dim))
        if found is not None:
            return found
        if example < 2:
            raise ValueError(
                f"{source}: the example's size {example} for Dim {dim.__name__!r} is special-"
                "cased by many operators (sizes 0 and 1); pass an example of size >= 2"
            )
        size = size_symint(
            self.env,
            example,
            min=max(dim.min, 2),
            max=dim.max,
            dim_name=dim.__name__,
            source=source,
        )
        self.declared[size.node.expr] = ValueRange(dim.min, dim.max)
        self.env.symbols[size.node.expr].declared = (dim.min, dim.max)
        self._symbols[id(dim)] = size
        return size
