"""Checks an exported module runs on its inputs: the program is only sound for inputs like the examples.

``ExportedProgram.module()`` calls one per input before anything else, so a
tensor of another shape or dtype, or another value for an input that export
fixed (an int, a flag), fails with a message naming the input rather than
computing something else.

Depends on ``fxloom.ops.mutation``.
"""

from __future__ import annotations

from typing import Any

import torch

from fxloom.ops.mutation import READ_ONLY_EFFECTS, has_side_effect

__all__ = ["check_tensor", "check_value"]


@has_side_effect
def check_tensor(value: Any, shape: tuple[int, ...], dtype: torch.dtype, name: str) -> None:
    """Raise unless ``value`` is a tensor of ``shape`` and ``dtype``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"input {name!r}: the program was exported with a tensor here, got "
            f"{type(value).__name__}"
        )
    if value.dtype != dtype:
        raise TypeError(
            f"input {name!r}: the program was exported with dtype {dtype}, got {value.dtype}"
        )
    if tuple(value.shape) != shape:
        differing = [
            f"dimension {dim}: {got} instead of {expected}"
            for dim, (expected, got) in enumerate(zip(shape, value.shape))
            if expected != got
        ]
        where = f" ({differing[0]})" if differing else ""
        raise ValueError(
            f"input {name!r}: the program was exported for shape {list(shape)}, got "
            f"{list(value.shape)}{where}; export again with an example of this shape (dynamic "
            "shapes are not supported yet)"
        )


@has_side_effect
def check_value(value: Any, expected: Any, name: str) -> None:
    """Raise unless a non-tensor input is the value the program was exported with."""
    if value is not expected and value != expected:
        raise ValueError(
            f"input {name!r}: the program was exported with {expected!r}, which its graph "
            f"depends on; got {value!r}. Export again with this value"
        )


READ_ONLY_EFFECTS.update((check_tensor, check_value))
