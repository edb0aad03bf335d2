"""Operators whose result's size or value comes from the data: new *unbacked* symbols.

``nonzero`` returns as many rows as there are non-zero elements, ``.item()``
a number stored in a tensor: export, which has shapes and no data, cannot know
them. Each such operator gets a rule here that describes its result with new
symbols ``i0, i1, ...`` (no example value; a range where one is known: a count
lies between 0 and the input's number of elements). The program may compute
with them (``torch.zeros(n)``, ``x[:n]``), state facts about them
(``torch._check(n > 0)``, a runtime assertion in the graph) or branch on them
with ``fxloom.cond``; a plain ``if`` on one is refused with the user's line.

A rule takes the shape environment and the operator's arguments (meta tensors)
and returns the result's metadata with its new symbols; ``DATA_DEPENDENT_RULES``
maps operators to rules, and users may add their own.

Depends on torch and ``symbolic``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch

from fxloom.values.symbolic import ShapeEnv, SymNode

__all__ = ["DATA_DEPENDENT_RULES", "MASK_REWRITES", "unbacked_scalar"]

aten = torch.ops.aten
_META = torch.device("meta")


def _count(env: ShapeEnv, of: torch.Tensor, what: str) -> torch.SymInt:
    """A new size: how many of ``of``'s elements something holds for (0 to its numel)."""
    numel = of.numel()
    high = numel if isinstance(numel, int) else None
    symbol = env.create_unbacked_symbol(min=0, max=high, source=what)
    return torch.SymInt(SymNode(symbol, env, int, None))


def unbacked_scalar(env: ShapeEnv, dtype: torch.dtype, what: str) -> Any:
    """A value read from data: ``SymBool`` for bool, ``SymFloat`` for floating, else ``SymInt``."""
    if dtype is torch.bool:
        symbol = env.create_unbacked_symbol(min=0, max=1, source=what)
        return torch.SymBool(SymNode(sympy.Eq(symbol, 1), env, bool, None))
    if dtype.is_floating_point or dtype.is_complex:
        symbol = env.create_unbacked_symbol(min=None, real=True, source=what)
        return torch.SymFloat(SymNode(symbol, env, float, None))
    symbol = env.create_unbacked_symbol(min=None, source=what)
    return torch.SymInt(SymNode(symbol, env, int, None))


def _local_scalar_dense(env: ShapeEnv, x: torch.Tensor) -> Any:
    return unbacked_scalar(env, x.dtype, ".item()")


def _nonzero(env: ShapeEnv, x: torch.Tensor) -> torch.Tensor:
    rows = _count(env, x, "nonzero")
    # Column-major, as the CPU kernel lays it out.
    return torch.empty_strided((rows, x.dim()), (1, rows), dtype=torch.long, device=_META)


def _masked_select(env: ShapeEnv, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    selected = _count(env, torch.broadcast_tensors(x, mask)[0], "masked_select")
    return torch.empty((selected,), dtype=x.dtype, device=_META)


def _unique_results(
    env: ShapeEnv, x: torch.Tensor, return_inverse: bool, return_counts: bool, what: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    distinct = _count(env, x, what)
    values = torch.empty((distinct,), dtype=x.dtype, device=_META)
    inverse = torch.empty(x.shape if return_inverse else (0,), dtype=torch.long, device=_META)
    counts = torch.empty((distinct if return_counts else 0,), dtype=torch.long, device=_META)
    return values, inverse, counts


def _unique2(
    env: ShapeEnv, x: torch.Tensor, sorted: bool = True, return_inverse=False, return_counts=False
):
    return _unique_results(env, x, return_inverse, return_counts, "unique")


def _unique_consecutive(
    env: ShapeEnv, x: torch.Tensor, return_inverse=False, return_counts=False, dim=None
):
    if dim is not None:
        raise NotImplementedError("unique_consecutive along a dimension is not supported in export")
    return _unique_results(env, x, return_inverse, return_counts, "unique_consecutive")


# operator -> rule(shape environment, *meta arguments, **kwargs) -> the result's metadata.
DATA_DEPENDENT_RULES: dict[Any, Callable[..., Any]] = {
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.nonzero.default: _nonzero,
    aten.masked_select.default: _masked_select,
    aten._unique2.default: _unique2,
    aten.unique_consecutive.default: _unique_consecutive,
}


# ---------------------------------------------------------------- boolean masks as indices
# ``x[mask]`` and ``x[mask] = v`` index with the positions where ``mask`` holds, which only
# ``nonzero`` knows: these rewrite such a call into ``nonzero`` and integer indexing (run
# under the capture, so each step is recorded). They return NotImplemented for other calls.


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _positions(indices: list[Any]) -> list[Any] | None:
    """``indices`` with each mask replaced by the integer positions (one per mask dimension)."""
    if not any(_is_mask(index) for index in indices):
        return None
    expanded: list[Any] = []
    for index in indices:
        if _is_mask(index):
            expanded.extend(aten.unbind.int(aten.nonzero.default(index), 1))
        else:
            expanded.append(index)
    return expanded


def _index(x: torch.Tensor, indices: list[Any]) -> Any:
    expanded = _positions(indices)
    return NotImplemented if expanded is None else aten.index.Tensor(x, expanded)


def _put_with(put: Any) -> Callable[..., Any]:
    """The rewrite of ``put`` (``index_put`` or its in-place form) with masks as positions."""

    def rewrite(x, indices, values, accumulate=False) -> Any:
        expanded = _positions(indices)
        return NotImplemented if expanded is None else put(x, expanded, values, accumulate)

    return rewrite


# operator -> rewrite(*args, **kwargs): the call in data-independent pieces, or NotImplemented.
MASK_REWRITES: dict[Any, Callable[..., Any]] = {
    aten.index.Tensor: _index,
    aten.index_put.default: _put_with(aten.index_put.default),
    aten.index_put_.default: _put_with(aten.index_put_.default),
}
