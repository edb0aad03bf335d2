"""Weights as plain integer tensors: int8 per output channel, int4 per group packed in bytes.

    >>> import torch
    >>> from fxloom.quantize.weights import int4_grouped
    >>> weight = torch.linspace(-1, 1, 64).reshape(2, 32)
    >>> packed, scale, zero_point = int4_grouped(weight, 32)
    >>> packed.dtype, tuple(packed.shape), tuple(scale.shape), zero_point.dtype
    (torch.uint8, (2, 16), (2, 1), torch.uint8)

Depends on: torch, ``ops`` (int4 packing), ``observers``.
"""

from __future__ import annotations

import torch

from fxloom.quantize.observers import Observer
from fxloom.quantize.ops import pack_int4

__all__ = ["INT4_RANGE", "int4_grouped", "int8_per_channel"]

INT4_RANGE = (0, 15)  # unsigned, with an integer zero point per group


def int8_per_channel(weight: torch.Tensor, observer: Observer) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` as int8 with the (symmetric) observer's scales, in the observer's range
    (-128..127, or -64..63 for narrow weights, ``QuantSpec.narrow_weights``), and the scales
    as float32 ``[out_channels]`` (a per-tensor observer's one scale repeated: every kernel
    takes a scale per channel)."""
    weight = weight.detach().float()
    with torch.no_grad():
        observer.observe(weight)
    observer.seen += 1
    scale, zero_point = observer.qparams()
    if observer.ch_axis is None:
        scale = scale.reshape(1).expand(weight.shape[0])
        zero_point = zero_point.reshape(1).expand(weight.shape[0])
    if bool((zero_point != 0).any()):
        raise ValueError("int8 weights are symmetric (zero point 0): use a symmetric observer")
    shape = [-1] + [1] * (weight.dim() - 1)
    q = torch.round(weight / scale.reshape(shape))
    q = torch.clamp(q, observer.quant_min, observer.quant_max).to(torch.int8)
    return q.contiguous(), scale.float().contiguous()


def int4_grouped(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` as int4 in groups of ``group_size`` inputs, each with its own range:
    the codes packed two per byte (``uint8 [N, K/2]``), the scales (float32 ``[N, K/group]``)
    and the integer zero points (uint8 ``[N, K/group]``, 0..15)."""
    weight = weight.detach().float()
    n, k = weight.shape
    grouped = weight.reshape(n, k // group_size, group_size)
    low = grouped.amin(dim=-1).clamp(max=0.0)
    high = grouped.amax(dim=-1).clamp(min=0.0)
    qmin, qmax = INT4_RANGE
    scale = ((high - low) / (qmax - qmin)).clamp(min=1e-8)
    zero_point = torch.clamp(qmin - torch.round(low / scale), qmin, qmax)
    q = torch.round(grouped / scale[..., None]) + zero_point[..., None]
    q = torch.clamp(q, qmin, qmax).reshape(n, k)
    return pack_int4(q), scale.contiguous(), zero_point.to(torch.uint8).contiguous()
