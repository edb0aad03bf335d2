"""How a tensor crosses a stage boundary: as a floating-point tensor, and back after the cut.

When a pipeline trains, torch.distributed.pipelining (2.11) makes every receive buffer
require grad, which only floating-point tensors can: an int64 position index or a bool mask
that crosses a cut cannot be received. So a tensor of another dtype crosses *on the wire* as
a floating-point one, and the receiving stage turns it back:

=============================  ==========================  =====================================
dtype                          sent as                     how (exact both ways)
=============================  ==========================  =====================================
int64 / int32 / int16          float64 / float32 / float16 ``view``: the same bytes, reinterpreted
bool, uint8, int8              float32                     ``to``: every value is representable
=============================  ==========================  =====================================

Floating and complex tensors cross as they are. torch sends a gradient back for every tensor
a stage received, so a training stage returns one for each, zeros where its own backward
reaches none (``with_input_gradients``).

Depends on: torch, ``fxloom.pytree``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from fxloom import pytree

__all__ = ["WIRE", "wire_dtype", "with_input_gradients"]

# dtype -> (the floating dtype it crosses as, the tensor method that converts each way)
WIRE: dict[torch.dtype, tuple[torch.dtype, str]] = {
    torch.int64: (torch.float64, "view"),
    torch.int32: (torch.float32, "view"),
    torch.int16: (torch.float16, "view"),
    torch.bool: (torch.float32, "to"),
    torch.uint8: (torch.float32, "to"),
    torch.int8: (torch.float32, "to"),
}


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` crosses a stage boundary as."""
    row = WIRE.get(dtype)
    return dtype if row is None else row[0]


class _GradientAnchor(torch.autograd.Function):
    """``output``, unchanged; backward also gives each of ``inputs`` a gradient of zeros,
    which adds nothing where autograd reaches the input anyway."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.layouts = [(t.shape, t.dtype, t.device) for t in inputs]
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        needed = ctx.needs_input_grad[1:]
        zeros = (
            torch.zeros(shape, dtype=dtype, device=device) if need else None
            for (shape, dtype, device), need in zip(ctx.layouts, needed)
        )
        return (grad, *zeros)


def with_input_gradients(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` (a stage that receives activations) made to return a gradient for every
    tensor it receives, zeros where autograd reaches none (an integer index that crossed on
    the wire, an activation used only for its shape). torch.distributed.pipelining sends a
    gradient back for each received tensor (torch 2.11 raises on a missing one; 2.13 checks
    under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``).

    The result is a shallow copy whose class overrides ``forward``: the same parameters and
    submodules under the same names, so ``state_dict``, optimizers and gradient sync see
    the stage's own."""
    anchored = copy.copy(module)
    anchored.__class__ = _anchored_class(type(module))
    return anchored


def _anchored_class(cls: type) -> type:
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = super(anchored, self).forward(*args, **kwargs)
        received = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        if not received:
            return output
        leaves, spec = pytree.tree_flatten(output)
        for index, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                leaves[index] = _GradientAnchor.apply(leaf, *received)
                return pytree.tree_unflatten(leaves, spec)
        return output

    anchored = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})
    return anchored
