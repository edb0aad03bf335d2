"""Fake quantization for quantization-aware training: float in, float out, int8 rounding.

``FakeQuantize(observer)`` stands where ``prepare`` puts an observer. In training mode it
lets its observer watch the batch, then rounds the values to the int8 grid of the observer's
current ``(scale, zero_point)`` and back to float (``torch.fake_quantize_per_tensor_affine``).
Values are clamped where the converted model's int8 tensors clamp them (the dtype's whole
range, as ``torch.quantize_per_tensor`` does; ``reduce_range`` narrows only the range the
scale is chosen for). Its gradient is the straight-through estimator: 1 inside the
representable range, 0 outside,
so training learns weights that survive int8. In eval mode the parameters are frozen (the
observer no longer updates), which is what ``convert`` will use.

``fake_quantize_weight(weight, observer, kernels)`` does the same to a weight, with the very
scales and rounding ``convert`` will use for those kernels (``WEIGHT_ROUNDING``), so the QAT
model in eval mode and the converted model round weights identically::

    >>> import torch
    >>> from fxloom.quantize.fake_quantize import FakeQuantize
    >>> from fxloom.quantize.observers import MinMaxObserver
    >>> fake = FakeQuantize(MinMaxObserver())
    >>> x = torch.tensor([0.0, 0.3, 1.0], requires_grad=True)
    >>> y = fake(x)
    >>> [round(v, 4) for v in y.tolist()]
    [0.0, 0.298, 1.0]
    >>> y.sum().backward(); x.grad.tolist()
    [1.0, 1.0, 1.0]

``FakeQuantize`` answers ``seen``, ``nonfinite`` and ``qparams()`` as an observer does, so
``convert`` treats it as one.

Depends on: torch, ``observers``, ``weights`` (``int8_per_channel``), ``table``
(``quantize_weight``).
"""

from __future__ import annotations

import torch
from torch import nn

from fxloom.quantize.observers import Observer, quantized_range
from fxloom.quantize.table import quantize_weight
from fxloom.quantize.weights import int8_per_channel

__all__ = ["FakeQuantize", "fake_quantize_weight"]


class FakeQuantize(nn.Module):
    """Observe (in training mode) and round to int8 and back, with a straight-through gradient."""

    def __init__(self, observer: Observer) -> None:
        super().__init__()
        self.observer = observer

    @property
    def seen(self) -> torch.Tensor:
        return self.observer.seen

    @property
    def nonfinite(self) -> torch.Tensor:
        return self.observer.nonfinite

    def qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.observer.qparams()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            return x
        if self.training:
            self.observer(x)
        if not self.observer.seen:  # nothing seen yet: no parameters to round with
            return x
        scale, zero_point = self.observer.qparams()
        # Clamp where the converted model's int8 tensors clamp: the dtype's whole range
        # (``reduce_range`` narrows the scale's range, not what a quint8 tensor can hold).
        quant_min, quant_max = quantized_range(self.observer.dtype, reduce_range=False)
        return torch.fake_quantize_per_tensor_affine(
            x, float(scale), int(zero_point), quant_min, quant_max
        )


def _plain_rounded(weight: torch.Tensor, observer: Observer) -> torch.Tensor:
    """As the plain kernels' convert rounds (``weights.int8_per_channel``: in the observer's
    range, 7 bits for narrow weights)."""
    codes, scale = int8_per_channel(weight, observer)
    shape = [-1] + [1] * (weight.dim() - 1)
    return (codes.float() * scale.reshape(shape)).to(weight.dtype)


def _torch_ao_rounded(weight: torch.Tensor, observer: Observer) -> torch.Tensor:
    """As torch.ao's convert rounds (``table.quantize_weight``, torch's quantized tensors:
    they differ from the plain rounding on a few ties, 555 of 2.6 million normal weights)."""
    return quantize_weight(weight, observer).dequantize()


# QuantConfig.kernels -> how its convert rounds a weight
WEIGHT_ROUNDING = {"plain": _plain_rounded, "torch.ao": _torch_ao_rounded}


def fake_quantize_weight(
    weight: torch.Tensor, observer: Observer, kernels: str = "plain"
) -> torch.Tensor:
    """``weight`` rounded as ``convert`` will round it for ``kernels``; the gradient passes
    straight through."""
    rounded = WEIGHT_ROUNDING[kernels](weight, observer)
    return weight + (rounded - weight).detach()
