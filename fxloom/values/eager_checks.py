"""Checks eager kernels make that torch's meta kernels skip, made on stand-ins too.

A stand-in's metadata comes from torch's meta kernels (``fxloom.values.stand_in``), which
compute result sizes and dtypes but do not always refuse what the CPU and CUDA kernels
refuse. ``mm`` of a float64 matrix by a float32 one raises in eager ("expected m1 and m2 to
have the same dtype") while its meta kernel returns a float64 result: a program captured
on stand-ins would go on where eager stops, and an unused product would even be dropped
from the graph. ``refuse_as_eager`` raises the same exception type eager raises, before
the meta kernel runs, so capture stops where eager does (``fxloom.compile`` then runs
that operation as Python, which raises for real).

The rules are a table, ``SAME_DTYPE``: operator (its schema name) -> the tensor arguments
whose dtypes must all agree. Only rules eager applies on every device are listed (``addr``
mixes dtypes on CPU and is left out; ``layer_norm`` mixes them on CUDA).

Depends on torch only.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SAME_DTYPE", "refuse_as_eager"]

# schema name -> the arguments whose dtypes must agree (a missing or None one is skipped).
# matmul, linear, einsum, tensordot and conv*d reach these after torch decomposes them.
SAME_DTYPE: dict[str, tuple[str, ...]] = {
    "aten::mm": ("self", "mat2"),
    "aten::bmm": ("self", "mat2"),
    "aten::mv": ("self", "vec"),
    "aten::addmm": ("self", "mat1", "mat2"),
    "aten::_addmm_activation": ("self", "mat1", "mat2"),
    "aten::addmv": ("self", "mat", "vec"),
    "aten::addbmm": ("self", "batch1", "batch2"),
    "aten::baddbmm": ("self", "batch1", "batch2"),
    "aten::convolution": ("input", "weight", "bias"),
}


def refuse_as_eager(func: Any, args: tuple, kwargs: dict) -> None:
    """Raise ``RuntimeError`` (as eager does) if ``func(*args, **kwargs)`` breaks a rule of
    ``SAME_DTYPE``; ``func`` is an operator overload (anything else passes)."""
    names = SAME_DTYPE.get(getattr(func, "_name", None))
    if names is None:
        return
    dtypes: dict[str, torch.dtype] = {}
    for index, argument in enumerate(func._schema.arguments):
        if argument.name in names:
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            if isinstance(value, torch.Tensor):
                dtypes[argument.name] = value.dtype
    if len(set(dtypes.values())) > 1:
        got = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
        raise RuntimeError(
            f"{func._name.split('::')[-1]}: expected its tensors to have the same dtype, but "
            f"got {got} (eager raises here too); convert one with .to(dtype)"
        )
