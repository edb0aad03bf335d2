"""The quantized replacements: which operators have an int8 kernel, and how to swap them in.

Op-specific knowledge lives here, in tables keyed by what a node calls (a module's exact
class for ``call_module``, the function for ``call_function``, the method name for
``call_method``). Users extend them for their own layers:

    STATIC_OPS      module class or function -> ``QuantizedModule`` (builds an int8 module
                    from the float one and its int8 weight) or ``QuantizedFunction`` (an int8
                    kernel taking ``(a, b, scale, zero_point)``). Inputs are quantized; the
                    output gets its own observer, hence its own scale and zero point.
    SHARES_QPARAMS  operators that compute on int8 tensors directly with their input's scale
                    and zero point (ReLU, max pooling, reshapes): no observer, no conversion.
                    On a float input they stay float.
    IDENTITY_IN_EVAL  modules that return their input in eval mode (dropout): erased by convert.
    RELU            what fuses into a preceding ``fuses_relu`` operator (``Linear`` + ``ReLU`` is
                    one ``LinearReLU`` kernel).
    FLOAT_IO        int8 module class -> its float-in/float-out twin, for an int8 layer between
                    two float neighbours (quantize -> int8 layer -> dequantize): one kernel
                    that quantizes the input with the calibrated scale and returns the
                    32-bit accumulator in float, with no 8-bit rounding of the output
                    (x86/FBGEMM only).
    DYNAMIC_MODULES module class -> builder of its dynamically quantized twin (int8 weights,
                    activations quantized per batch at run time).

Everything else has no int8 kernel here and runs in float, with ``dequantize`` before it and
``quantize_per_tensor`` after it where its neighbours are int8 (the report says so)::

    >>> import torch
    >>> from fxloom.quantize.table import STATIC_OPS, SHARES_QPARAMS
    >>> type(STATIC_OPS[torch.nn.Linear]).__name__
    'QuantizedModule'
    >>> torch.nn.SELU in STATIC_OPS, torch.nn.ReLU in SHARES_QPARAMS
    (False, True)

Depends on: torch (its quantized CPU modules and kernels: torch.ao.nn.quantized).
"""

from __future__ import annotations

import copy
import operator
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq
import torch.ao.nn.quantized.dynamic as nnqd
import torch.nn.functional as F
from torch import nn

from fxloom.quantize.observers import Observer

aten = torch.ops.aten

__all__ = [
    "DYNAMIC_MODULES",
    "FLOAT_IO",
    "FLOAT_IO_ENGINES",
    "IDENTITY_IN_EVAL",
    "LinearFloatIO",
    "RELU",
    "SHARES_QPARAMS",
    "STATIC_OPS",
    "QuantizedFunction",
    "QuantizedModule",
]

# make(float_module, int8_weight, relu_fused) -> int8 module (scale and zero point set later)
MakeModule = Callable[[nn.Module, torch.Tensor, bool], nn.Module]


@dataclass(frozen=True)
class QuantizedModule:
    """A layer with weights, swapped for an int8 module; ``weight_axis`` is its output channels."""

    make: MakeModule
    kernel: str  # for the report
    fuses_relu: bool = True
    weight_axis: int = 0


@dataclass(frozen=True)
class QuantizedFunction:
    """A function of two tensors with an int8 kernel ``kernel(a, b, scale, zero_point)``."""

    kernel: Callable[..., torch.Tensor]
    relu_kernel: Callable[..., torch.Tensor] | None = None

    @property
    def fuses_relu(self) -> bool:
        return self.relu_kernel is not None


def _linear(module: nn.Linear, weight: torch.Tensor, relu: bool) -> nn.Module:
    cls = nniq.LinearReLU if relu else nnq.Linear
    quantized = cls(module.in_features, module.out_features, module.bias is not None)
    quantized.set_weight_bias(weight, _bias(module))
    return quantized


def _conv(plain: type, with_relu: type) -> MakeModule:
    def make(module: nn.Module, weight: torch.Tensor, relu: bool) -> nn.Module:
        cls = with_relu if relu else plain
        quantized = cls(
            module.in_channels,
            module.out_channels,
            module.kernel_size,
            module.stride,
            module.padding,
            module.dilation,
            module.groups,
            module.bias is not None,
            module.padding_mode,
        )
        quantized.set_weight_bias(weight, _bias(module))
        return quantized

    return make


def _bias(module: nn.Module) -> torch.Tensor | None:
    return None if module.bias is None else module.bias.detach().float()


STATIC_OPS: dict[Any, QuantizedModule | QuantizedFunction] = {
    nn.Linear: QuantizedModule(_linear, "quantized::linear"),
    nn.Conv1d: QuantizedModule(_conv(nnq.Conv1d, nniq.ConvReLU1d), "quantized::conv1d"),
    nn.Conv2d: QuantizedModule(_conv(nnq.Conv2d, nniq.ConvReLU2d), "quantized::conv2d"),
    nn.Conv3d: QuantizedModule(_conv(nnq.Conv3d, nniq.ConvReLU3d), "quantized::conv3d"),
    operator.add: QuantizedFunction(torch.ops.quantized.add, torch.ops.quantized.add_relu),
    torch.add: QuantizedFunction(torch.ops.quantized.add, torch.ops.quantized.add_relu),
    operator.mul: QuantizedFunction(torch.ops.quantized.mul, torch.ops.quantized.mul_relu),
    torch.mul: QuantizedFunction(torch.ops.quantized.mul, torch.ops.quantized.mul_relu),
    # exported programs (``quantize.exported`` lifts their weighted operators to layers)
    aten.add.Tensor: QuantizedFunction(torch.ops.quantized.add, torch.ops.quantized.add_relu),
    aten.mul.Tensor: QuantizedFunction(torch.ops.quantized.mul, torch.ops.quantized.mul_relu),
}

RELU: set[Any] = {nn.ReLU, F.relu, torch.relu, "relu", aten.relu.default}

SHARES_QPARAMS: set[Any] = {
    *RELU,
    nn.Dropout,
    nn.Identity,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    F.max_pool1d,
    F.max_pool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    F.adaptive_avg_pool2d,
    nn.AvgPool2d,
    nn.Flatten,
    torch.flatten,
    operator.getitem,
    *("flatten", "view", "reshape", "contiguous", "permute", "transpose", "squeeze"),
    *("unsqueeze", "chunk", "split", "size", "dim"),
    aten.view.default,
    aten.reshape.default,
    aten.flatten.using_ints,
    aten.mean.dim,
    aten.adaptive_avg_pool2d.default,
    aten.max_pool2d.default,
}

IDENTITY_IN_EVAL: set[type] = {nn.Dropout, nn.Identity}


class LinearFloatIO(nn.Module):
    """An int8 linear layer with float input and output, its input scale fixed by calibration.

    ``quantized::linear_with_input_q_dq_qweight_dq_output_fp32``: quantize the input with
    ``(input_scale, input_zero_point)``, multiply with the int8 weight, return float.
    """

    def __init__(self, linear: nnq.Linear, input_scale: float, input_zero_point: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._packed_params = linear._packed_params
        self.input_scale = input_scale
        self.input_zero_point = input_zero_point

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            x, self.input_scale, self.input_zero_point, self._packed_params._packed_params
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"input_scale={self.input_scale}, input_zero_point={self.input_zero_point}"
        )


def _linear_float_io(linear: nnq.Linear, scale: float, zero_point: int) -> nn.Module | None:
    # The kernel saves dequantizing the output but quantizes its input more slowly than
    # torch.quantize_per_tensor does (measured with FBGEMM, batch 256: 17768 -> 512 is 25%
    # slower, 512 -> 17768 8% faster, small layers equal): worth it unless the input is wider.
    if linear.in_features > linear.out_features:
        return None
    return LinearFloatIO(linear, scale, zero_point)


# int8 module class -> its float-in/float-out twin (module, input scale, input zero point),
# or None where the twin would be slower
FLOAT_IO: dict[type, Callable[[nn.Module, float, int], nn.Module | None]] = {
    nnq.Linear: _linear_float_io
}
FLOAT_IO_ENGINES = ("x86", "fbgemm")  # the engines whose packed weights implement FLOAT_IO


def _dynamic_linear(module: nn.Linear, weight_observer: Callable[[], Observer]) -> nn.Module:
    observer = weight_observer()
    quantized = nnqd.Linear(module.in_features, module.out_features, module.bias is not None)
    quantized.set_weight_bias(quantize_weight(module.weight, observer), _bias(module))
    return quantized


def _dynamic_rnn(cls: type) -> Callable[[nn.Module, Callable[[], Observer]], nn.Module]:
    def make(module: nn.Module, weight_observer: Callable[[], Observer]) -> nn.Module:
        # torch's from_float reads the weight observer from ``module.qconfig.weight``; give it
        # ours on a shallow copy, so the float module is not modified.
        shim = copy.copy(module)
        shim.qconfig = types.SimpleNamespace(weight=weight_observer, activation=None)
        return cls.from_float(shim)

    return make


DYNAMIC_MODULES: dict[type, Callable[[nn.Module, Callable[[], Observer]], nn.Module]] = {
    nn.Linear: _dynamic_linear,
    nn.LSTM: _dynamic_rnn(nnqd.LSTM),
    nn.GRU: _dynamic_rnn(nnqd.GRU),
}


def quantize_weight(weight: torch.Tensor, observer: Observer) -> torch.Tensor:
    """``weight`` as an int8 tensor with the observer's scales (one per channel or per tensor)."""
    weight = weight.detach().float()
    with torch.no_grad():
        observer.observe(weight)  # weights are finite: no need for the forward's check
    observer.seen += 1
    scale, zero_point = observer.qparams()
    if observer.ch_axis is not None:
        return torch.quantize_per_channel(weight, scale, zero_point, observer.ch_axis, torch.qint8)
    return torch.quantize_per_tensor(weight, scale.item(), int(zero_point), torch.qint8)
