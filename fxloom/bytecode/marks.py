"""Marks on tensors: which of a tensor's dimensions ``fxloom.compile`` takes as symbols.

    >>> import torch, fxloom
    >>> x = torch.ones(4, 3)
    >>> fxloom.mark_dynamic(x, 0)          # symbolic from the first compile; an error if fixed
    >>> fxloom.mark_static(x, 1)           # static even after it changes
    >>> sorted(marks_of(x).dynamic), sorted(marks_of(x).static)
    ([0], [1])

As torch users write them (``torch._dynamo.mark_dynamic`` and friends): a dimension marked
*dynamic* is a symbol from the first compile, and a program that fixes it to one value
(``range(x.shape[0])``, an ``int()`` of it) is refused with ``DynamicDimError``; one marked
*maybe dynamic* is a symbol too, but may be fixed (the entry then guards its value); one marked
*static* keeps its value guarded, even after it changes (each size another entry). The marks
live on the tensor in fxloom's attributes (``_ATTRIBUTES``); torch's own attributes, which
``torch._dynamo.mark_dynamic`` writes, are read too (never imported: reading an attribute is
enough).

Depends on torch only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Marks", "mark_dynamic", "mark_static", "marks_of", "maybe_mark_dynamic"]

# mark -> the tensor attributes holding its dimensions: fxloom's (written here), torch's (read)
_ATTRIBUTES: dict[str, tuple[str, str]] = {
    "dynamic": ("_fxloom_dynamic_dims", "_dynamo_dynamic_indices"),
    "maybe": ("_fxloom_maybe_dynamic_dims", "_dynamo_weak_dynamic_indices"),
    "static": ("_fxloom_static_dims", "_dynamo_static_indices"),
}
# the ranges of dims marked dynamic: fxloom's {dim: (min, max)}; torch's {_DimRange(dim, min, max)}
_RANGES = ("_fxloom_dynamic_ranges", "_dynamo_dynamic_range")
_EVERY_ATTRIBUTE = tuple(name for names in _ATTRIBUTES.values() for name in names)


@dataclass(frozen=True)
class Marks:
    """A tensor's marked dimensions (non-negative), and the ranges given for dynamic ones."""

    dynamic: frozenset[int] = frozenset()
    maybe: frozenset[int] = frozenset()
    static: frozenset[int] = frozenset()
    ranges: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)


def mark_dynamic(
    tensor: torch.Tensor, dim: int | Iterable[int], *, min: int | None = None,
    max: int | None = None,
) -> None:  # fmt: skip
    """Make ``dim`` of ``tensor`` a symbol from the first compile that reads it; the compile
    raises ``DynamicDimError`` if the program fixes it to one value (``min``/``max``: its
    range, guarded)."""
    for index in _dims(tensor, dim, "mark_dynamic"):
        _add(tensor, "dynamic", index)
        if min is not None or max is not None:
            _ranges(tensor)[index] = (min, max)


def maybe_mark_dynamic(tensor: torch.Tensor, dim: int | Iterable[int]) -> None:
    """As ``mark_dynamic``, but the program may fix the size (the entry then guards its value)."""
    for index in _dims(tensor, dim, "maybe_mark_dynamic"):
        _add(tensor, "maybe", index)


def mark_static(tensor: torch.Tensor, dim: int | Iterable[int] | None = None) -> None:
    """Keep ``dim`` of ``tensor`` (every dimension where None) guarded by value, even after it
    changes between calls (each size compiles its own entry)."""
    dims = range(tensor.dim()) if dim is None else _dims(tensor, dim, "mark_static")
    for index in dims:
        _add(tensor, "static", index)


def marks_of(tensor: torch.Tensor) -> Marks | None:
    """``tensor``'s marks, fxloom's and torch's together; None for an unmarked tensor (the
    common case, answered by one attribute scan of the tensor's ``__dict__``)."""
    own = getattr(tensor, "__dict__", None)
    if not own or not any(name in own for name in _EVERY_ATTRIBUTE):
        return None
    found = {
        mark: frozenset(d for name in names for d in own.get(name, ()))
        for mark, names in _ATTRIBUTES.items()
    }
    ranges = dict(own.get(_RANGES[0], {}))
    for item in own.get(_RANGES[1], ()):  # torch's _DimRange(dim, min, max)
        low, high = getattr(item, "min", None), getattr(item, "max", None)
        if low is not None or high is not None:
            ranges.setdefault(item.dim, (low, high))
    return Marks(found["dynamic"], found["maybe"], found["static"], ranges)


def _dims(tensor: torch.Tensor, dim: int | Iterable[int], who: str) -> list[int]:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"fxloom.{who} marks a tensor, got a {type(tensor).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    rank = tensor.dim()
    for index in dims:
        if type(index) is not int or not -rank <= index < rank:
            raise IndexError(
                f"fxloom.{who}: dimension {index!r} is not one of the tensor's {rank} "
                f"dimensions (shape {list(tensor.shape)}); use an index in [{-rank}, {rank - 1}]"
            )
    return [index % rank for index in dims]


def _add(tensor: torch.Tensor, mark: str, index: int) -> None:
    name = _ATTRIBUTES[mark][0]
    dims = getattr(tensor, name, None)
    if dims is None:
        dims = set()
        setattr(tensor, name, dims)
    dims.add(index)


def _ranges(tensor: torch.Tensor) -> dict[int, tuple[Any, Any]]:
    ranges = getattr(tensor, _RANGES[0], None)
    if ranges is None:
        ranges = {}
        setattr(tensor, _RANGES[0], ranges)
    return ranges
