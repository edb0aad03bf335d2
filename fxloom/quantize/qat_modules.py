"""Layers for quantization-aware training: a float layer whose weight is fake-quantized.

``QAT_MODULES`` maps a float layer class to its QAT twin. A twin shares the float layer's
parameters (training updates them), rounds the weight to int8 and back on every forward with
a fresh weight observer (``fake_quantize_weight``), and gives the float layer back with
``to_float()``, which ``convert`` quantizes exactly as it would an unquantized layer. Add a row
for your own layer with a weight: a subclass of it with ``weight_observer`` and a forward
using ``self.fake_quantized_weight()``::

    >>> import torch
    >>> from fxloom.quantize.qat_modules import QAT_MODULES
    >>> from fxloom.quantize.observers import MinMaxObserver
    >>> linear = torch.nn.Linear(4, 2)
    >>> weight_observer = lambda: MinMaxObserver(dtype=torch.qint8, symmetric=True)
    >>> qat = QAT_MODULES[torch.nn.Linear].from_float(linear, weight_observer)
    >>> qat.weight is linear.weight, type(qat.to_float()) is torch.nn.Linear
    (True, True)

Depends on: torch, ``fake_quantize``, ``observers``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fxloom.quantize.fake_quantize import fake_quantize_weight
from fxloom.quantize.observers import Observer

__all__ = ["QAT_MODULES", "QATConv1d", "QATConv2d", "QATConv3d", "QATLinear", "QATModule"]


class QATModule:
    """Mixin: ``from_float`` (shares parameters), ``fake_quantized_weight``, ``to_float``."""

    float_class: type[nn.Module]
    weight_observer: Callable[[], Observer]
    kernels: str  # QuantConfig.kernels: the convert whose weight rounding training sees

    @classmethod
    def from_float(
        cls, module: nn.Module, weight_observer: Callable[[], Observer], kernels: str = "plain"
    ) -> nn.Module:
        qat = cls.__new__(cls)
        qat.__dict__ = dict(module.__dict__)  # the same parameters, buffers and settings
        qat._parameters = dict(module._parameters)
        qat._buffers = dict(module._buffers)
        qat._modules = dict(module._modules)
        qat.weight_observer = weight_observer
        qat.kernels = kernels
        return qat

    def fake_quantized_weight(self) -> torch.Tensor:
        return fake_quantize_weight(self.weight, self.weight_observer(), self.kernels)

    def to_float(self) -> nn.Module:
        module = self.float_class.__new__(self.float_class)
        module.__dict__ = {k: v for k, v in self.__dict__.items() if k not in _QAT_ONLY}
        return module


_QAT_ONLY = ("weight_observer", "kernels")  # what a QAT twin holds that its float layer lacks


class QATLinear(QATModule, nn.Linear):
    float_class = nn.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.fake_quantized_weight(), self.bias)


class _QATConv(QATModule):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.fake_quantized_weight(), self.bias)


class QATConv1d(_QATConv, nn.Conv1d):
    float_class = nn.Conv1d


class QATConv2d(_QATConv, nn.Conv2d):
    float_class = nn.Conv2d


class QATConv3d(_QATConv, nn.Conv3d):
    float_class = nn.Conv3d


QAT_MODULES: dict[type, type[QATModule]] = {
    nn.Linear: QATLinear,
    nn.Conv1d: QATConv1d,
    nn.Conv2d: QATConv2d,
    nn.Conv3d: QATConv3d,
}
