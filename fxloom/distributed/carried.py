"""Numbers carried between pipeline stages as tensors, since stages send only tensors.

A size or a count computed before a cut and used after it (``x.size()``, ``seq_len - 1``) is
recomputed after the cut when what it is computed from crosses anyway. When it is not, the
stage that computes it sends ``carry(value)``, a one-dimensional int64 (or float64) tensor of
its numbers, and the stage that uses it rebuilds the value with ``uncarry(tensor, layout)``.
``layout`` describes the value's structure with type names only (``("Size", ("int", "int"))``),
so it is a legal graph argument and stays the same for every microbatch.

Both are fxloom's run-time functions (``fxloom.ops.runtime_functions``): pure, computed where
the stage runs.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["carry", "is_carriable", "layout_of", "uncarry"]

# layout name -> the type it rebuilds; containers hold the layouts of their items
_SCALARS: dict[str, type] = {"int": int, "float": float, "bool": bool}
_CONTAINERS: dict[str, type] = {"tuple": tuple, "list": list, "Size": torch.Size}


def is_carriable(value: Any) -> bool:
    """Whether ``value`` is numbers (ints, floats, bools) in tuples, lists and sizes."""
    if type(value) in _SCALARS.values():
        return True
    if type(value) in _CONTAINERS.values():
        return all(is_carriable(item) for item in value)
    return False


def layout_of(value: Any) -> Any:
    """The structure of a carriable value, in type names: ``("Size", ("int", "int"))``."""
    for name, kind in _SCALARS.items():
        if type(value) is kind:
            return name
    for name, kind in _CONTAINERS.items():
        if type(value) is kind:
            return (name, tuple(layout_of(item) for item in value))
    raise TypeError(f"cannot carry a {type(value).__name__} between stages: {value!r}")


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def carry(value: Any) -> torch.Tensor:
    """``value``'s numbers as a one-dimensional tensor (float64 if any is a float)."""
    leaves = _leaves(value)
    dtype = torch.float64 if any(isinstance(leaf, float) for leaf in leaves) else torch.int64
    return torch.tensor(
        [float(v) if dtype is torch.float64 else int(v) for v in leaves], dtype=dtype
    )


def uncarry(tensor: torch.Tensor, layout: Any) -> Any:
    """The value ``carry`` made ``tensor`` from, rebuilt by ``layout``."""
    numbers = iter(tensor.tolist())
    return _rebuild(layout, numbers)


def _rebuild(layout: Any, numbers: Any) -> Any:
    if isinstance(layout, str):
        return _SCALARS[layout](next(numbers))
    name, items = layout
    return _CONTAINERS[name](_rebuild(item, numbers) for item in items)
