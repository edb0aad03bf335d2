"""The quantized replacements: which operators have an int8 kernel, and how to swap them in.

Op-specific knowledge lives here, in tables keyed by operator (``fxloom.ops.identity``: the row
``"add"`` serves ``operator.add``, ``torch.add`` and ``aten.add.Tensor``; in-place twins find
no row) and by a module's exact class for ``call_module`` where the row builds an int8 module
from it (``STATIC_OPS``, ``FLOAT_IO``, ``DYNAMIC_MODULES``; ``RELU``, ``SHARES_QPARAMS`` and
``KEPT_FLOAT`` also answer for a module class through its key: ``nn.ReLU`` is ``"relu"``).
Users extend them for their own layers:

    STATIC_OPS      module class or operator -> ``QuantizedModule`` (builds an int8 module
                    from the float one and its int8 weight) or ``QuantizedFunction`` (an int8
                    kernel taking ``(a, b, scale, zero_point)``). Inputs are quantized; the
                    output gets its own observer, hence its own scale and zero point.
    SHARES_QPARAMS  operators that compute on int8 tensors directly with their input's scale
                    and zero point (ReLU, max pooling, reshapes): no observer, no conversion.
                    On a float input they stay float.
    IDENTITY_IN_EVAL  modules that return their input in eval mode (dropout): erased by convert.
    RELU            what fuses into a preceding ``fuses_relu`` operator (``Linear`` + ``ReLU`` is
                    one ``LinearReLU`` kernel).
    FLOAT_IO        layer class -> ``FloatIO``: its float-in/float-out int8 twin, for an int8
                    layer between float neighbours (``plan`` decides: its input is float and
                    every user reads float): one kernel that quantizes the input with the
                    calibrated scale and returns the 32-bit accumulator in float, so the
                    output is never rounded to 8 bits and needs no observer (x86/FBGEMM
                    only). PT2E's X86InductorQuantizer likewise leaves a layer's output in
                    float when what reads it is float.
    SUMS            int8 operators whose output scale can swallow an operand (``add``):
                    convert keeps one in float where calibration shows it would.
    KEPT_FLOAT      operators that could compute on int8 but are better in float, with why
                    (averages over many values: rounding the mean to its input's int8 step
                    throws away the resolution averaging gained).
    DYNAMIC_MODULES module class -> builder of its dynamically quantized twin (int8 weights,
                    activations quantized per batch at run time).
    FUSED_SUMS      (plain kernels) the fxloom operator whose only user is an int8 sum ->
                    ``FusedSum``: the one operator computing both, its result never rounded
                    to 8 bits before the sum (a residual block's last convolution and add).

Everything else has no int8 kernel here and runs in float, with ``dequantize`` before it and
``quantize_per_tensor`` after it where its neighbours are int8 (the report says so)::

    >>> import torch
    >>> from fxloom.quantize.table import STATIC_OPS, SHARES_QPARAMS
    >>> type(STATIC_OPS[torch.nn.Linear]).__name__
    'QuantizedModule'
    >>> torch.nn.SELU in STATIC_OPS, torch.nn.ReLU in SHARES_QPARAMS
    (False, True)
    >>> torch.ops.aten.mean.dim in KEPT_FLOAT
    True

The plain kernels (the default) read each row's ``plain``: the fxloom operator
(``quantize.ops``) it becomes. The builders of torch's quantized modules import
``torch.ao.nn.quantized`` only when ``QuantConfig(kernels="torch.ao")`` converts.

Depends on: torch (for kernels="torch.ao": its quantized CPU modules), ``fxloom.ops``.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fxloom.ops.identity import OpSet, OpTable
from fxloom.quantize.observers import Observer

aten = torch.ops.aten

__all__ = [
    "DYNAMIC_MODULES",
    "FLOAT_IO",
    "FLOAT_IO_ENGINES",
    "FUSED_SUMS",
    "FloatIO",
    "FusedSum",
    "IDENTITY_IN_EVAL",
    "is_table_key",
    "KEPT_FLOAT",
    "LinearFloatIO",
    "LinearReLUFloatIO",
    "RELU",
    "SHARES_QPARAMS",
    "STATIC_OPS",
    "QuantizedFunction",
    "QuantizedModule",
    "NOT_ON_PLAIN_INTEGERS",
    "PLAIN_SHARES",
]

# make(float_module, int8_weight, relu_fused) -> int8 module (scale and zero point set later)
MakeModule = Callable[[nn.Module, torch.Tensor, bool], nn.Module]


@dataclass(frozen=True)
class QuantizedModule:
    """A layer with weights, swapped for an int8 module; ``weight_axis`` is its output channels."""

    make: MakeModule  # kernels="torch.ao": builds torch's quantized module
    kernel: str  # for the report (kernels="torch.ao")
    plain: str = ""  # the fxloom operator of the plain kernels (``ops.<plain>``)
    fuses_relu: bool = True
    weight_axis: int = 0


@dataclass(frozen=True)
class QuantizedFunction:
    """A function of two tensors with an int8 kernel ``kernel(a, b, scale, zero_point)``."""

    kernel: Callable[..., torch.Tensor]
    relu_kernel: Callable[..., torch.Tensor] | None = None
    plain: str = ""  # the fxloom operator of the plain kernels (``ops.<plain>``)

    @property
    def fuses_relu(self) -> bool:
        return self.relu_kernel is not None


def is_table_key(value: Any) -> bool:
    """Whether ``value`` can be looked up in the tables (a node's target or module class may
    be an unhashable callable, which no row names)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _linear(module: nn.Linear, weight: torch.Tensor, relu: bool) -> nn.Module:
    import torch.ao.nn.intrinsic.quantized as nniq
    import torch.ao.nn.quantized as nnq

    cls = nniq.LinearReLU if relu else nnq.Linear
    quantized = cls(module.in_features, module.out_features, module.bias is not None)
    quantized.set_weight_bias(weight, _bias(module))
    return quantized


def _conv(plain: str, with_relu: str) -> MakeModule:
    """torch.ao's module classes by name, imported when first built (kernels="torch.ao")."""

    def make(module: nn.Module, weight: torch.Tensor, relu: bool) -> nn.Module:
        import torch.ao.nn.intrinsic.quantized as nniq
        import torch.ao.nn.quantized as nnq

        cls = getattr(nniq, with_relu) if relu else getattr(nnq, plain)
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


_ADD = QuantizedFunction(torch.ops.quantized.add, torch.ops.quantized.add_relu, "add_int8")
_MUL = QuantizedFunction(torch.ops.quantized.mul, torch.ops.quantized.mul_relu, "mul_int8")
# Module classes are rows of their own: a layer's int8 twin is built from the module.
STATIC_OPS: OpTable = OpTable(
    {
        nn.Linear: QuantizedModule(_linear, "quantized::linear", "linear_int8"),
        nn.Conv1d: QuantizedModule(
            _conv("Conv1d", "ConvReLU1d"), "quantized::conv1d", "conv2d_int8"
        ),
        nn.Conv2d: QuantizedModule(
            _conv("Conv2d", "ConvReLU2d"), "quantized::conv2d", "conv2d_int8"
        ),
        nn.Conv3d: QuantizedModule(
            _conv("Conv3d", "ConvReLU3d"), "quantized::conv3d", "conv2d_int8"
        ),
        "add": _ADD,  # operator.add, torch.add, aten.add.Tensor (exported programs)
        "mul": _MUL,
    }
)

RELU: OpSet = OpSet({"relu"}, modules=True)

# Sums: the output's int8 step follows the wider operand, so an operand that spans less than
# one step of the sum vanishes in it. Attention scores plus a mask of -3.4e38 (older
# transformers' T5) are the case: convert keeps such a sum in float (its calibration shows it).
SUMS: OpSet = OpSet({"add"})

# Torch-level spellings by key. Of exported programs' ATen calls only these: their graphs fix
# every stride, and a transpose or permute computed on int8 (then dequantized) leaves another
# layout than the float one a later ``aten.view`` was recorded for (exported BERT: "view size
# is not compatible with input tensor's size and stride").
SHARES_QPARAMS: OpSet = OpSet(
    {
        *RELU,
        nn.Dropout,
        nn.Identity,
        nn.AvgPool2d,  # the module only: F.avg_pool2d computes in float
        *("max_pool1d", "max_pool2d", "max_pool3d", "getitem", "flatten", "view", "reshape"),
        *("contiguous", "permute", "transpose", "squeeze", "unsqueeze", "chunk", "split"),
        *("size", "dim"),
    },
    modules=True,
    aten=False,
    pinned={
        aten.relu.default,
        aten.view.default,
        aten.reshape.default,
        aten.flatten.using_ints,
        aten.max_pool2d.default,
    },
)

# A global average over 256 int8 values resolves about 16 times finer than their step; on int8
# it would be rounded back to that step. What reads the average quantizes it with a scale of
# its own. (cnn_small exported, 8-bit activations: relative error 0.0114 with its average pool
# on int8, 0.0067 in float, as PT2E's 0.0067.)
_AVERAGES = "an average over many values is finer than its input's int8 step: computed in float"
KEPT_FLOAT: OpTable = OpTable(
    dict.fromkeys(("adaptive_avg_pool1d", "adaptive_avg_pool2d", "mean"), _AVERAGES),
    modules=True,
)

IDENTITY_IN_EVAL: set[type] = {nn.Dropout, nn.Identity}


@dataclass(frozen=True)
class FusedSum:
    """An int8 operator and the sum that is its only user, as one fxloom operator ``fused``
    (plain kernels): the operator's first ``inputs`` arguments (what it computes from),
    then the sum's other operand with its scale and zero point, then the sum's output
    parameters and ReLU. Never where the operator ReLUs its own output (argument ``relu_at``)
    or the operands' shapes differ (no broadcasting)."""

    sum: str  # the sum's fxloom operator (``ops.<sum>``: operands at 0 and 3, then out, relu)
    fused: str  # ``ops.<fused>``
    inputs: int
    relu_at: int
    why: str


# A ResNet block's add fused into its last convolution: oneDNN adds the residual to the
# convolution's result in its "sum" post-op, so the 16 conv + add pairs of ResNet-50 take 4.8
# ms instead of 8.0 (one thread, kernels only), and the sum is rounded once (the unfused pair
# rounds and clips the convolution's output to its calibrated range first).
FUSED_SUMS: dict[str, FusedSum] = {
    "conv2d_int8": FusedSum(
        "add_int8", "conv2d_add_int8", inputs=10, relu_at=12,
        why="the add is the convolution's only user: one kernel adds the residual to the "
        "convolution's result and requantizes once (the convolution's output is not rounded "
        "to 8 bits of its own)",
    ),
}  # fmt: skip

# The operators of SHARES_QPARAMS that compute right on plain uint8 tensors (the plain
# kernels): those that move, pick or order-compare values (an affine map keeps the order), and
# ReLU (convert clamps at the zero point). On a quantized tensor torch.ao's kernels know the
# scale; on plain integers any other row (Hardtanh added by a user, an average) would compute
# on the codes, so it runs in float instead (``NOT_ON_PLAIN_INTEGERS`` says why).
PLAIN_SHARES: OpSet = OpSet(
    {
        *RELU,
        nn.Dropout,
        nn.Identity,
        *("max_pool1d", "max_pool2d", "max_pool3d", "getitem", "flatten", "view", "reshape"),
        *("contiguous", "permute", "transpose", "squeeze", "unsqueeze", "chunk", "split"),
        *("size", "dim"),
    },
    modules=True,
    aten=False,
    pinned={
        aten.relu.default,
        aten.view.default,
        aten.reshape.default,
        aten.flatten.using_ints,
        aten.max_pool2d.default,
    },
)
NOT_ON_PLAIN_INTEGERS = (
    "on plain uint8 tensors it would compute on the integer codes (not in table.PLAIN_SHARES): "
    "computed in float"
)


class LinearFloatIO(nn.Module):
    """An int8 linear layer with float input and output, its input scale fixed by calibration.

    ``quantized::linear_with_input_q_dq_qweight_dq_output_fp32``: quantize the input with
    ``(input_scale, input_zero_point)``, multiply with the int8 weight, return float.
    """

    kernel = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32

    def __init__(self, linear: nn.Module, input_scale: float, input_zero_point: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._packed_params = linear._packed_params
        self.input_scale = input_scale
        self.input_zero_point = input_zero_point

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(
            x, self.input_scale, self.input_zero_point, self._packed_params._packed_params
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"input_scale={self.input_scale}, input_zero_point={self.input_zero_point}"
        )


class LinearReLUFloatIO(LinearFloatIO):
    """``LinearFloatIO`` with the ReLU applied in the kernel (for a fused ``LinearReLU``)."""

    kernel = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_relu_output_fp32


# FBGEMM quantizes a float input inside the float-in/out kernel more slowly than
# torch.quantize_per_tensor does once the rows are very wide (one thread, batch 256: 17768 ->
# 512 14% slower, 8192 -> 512 2%, 4096 -> 1024 and narrower equal or faster; at batch 1 and
# 16 faster at every width): there the int8 layer and a dequantize of its output stay.
WIDE_INPUT = 8192


def _not_wide(linear: nn.Module) -> bool:
    return linear.in_features < WIDE_INPUT


@dataclass(frozen=True)
class FloatIO:
    """An int8 layer's float-in/float-out twin: ``plain`` or, with a fused ReLU, ``relu``
    (each built from the int8 module, the input scale and zero point), where ``fits`` the
    float layer (a twin slower than the int8 layer and a dequantize does not fit)."""

    plain: Callable[[nn.Module, float, int], nn.Module]
    relu: Callable[[nn.Module, float, int], nn.Module]
    fits: Callable[[nn.Module], bool]


# No row for convolutions: torch's one float-output int8 convolution on CPU (oneDNN's
# qconv2d_pointwise, fed uint8 through int_repr) measured 6-30% slower than quantize + int8
# conv + dequantize (one thread, 16 to 512 channels).
FLOAT_IO: dict[Any, FloatIO] = {nn.Linear: FloatIO(LinearFloatIO, LinearReLUFloatIO, _not_wide)}
FLOAT_IO_ENGINES = ("x86", "fbgemm")  # the engines whose packed weights implement FLOAT_IO


def _dynamic_linear(module: nn.Linear, weight_observer: Callable[[], Observer]) -> nn.Module:
    import torch.ao.nn.quantized.dynamic as nnqd

    observer = weight_observer()
    quantized = nnqd.Linear(module.in_features, module.out_features, module.bias is not None)
    quantized.set_weight_bias(quantize_weight(module.weight, observer), _bias(module))
    return quantized


def _dynamic_rnn(name: str) -> Callable[[nn.Module, Callable[[], Observer]], nn.Module]:
    def make(module: nn.Module, weight_observer: Callable[[], Observer]) -> nn.Module:
        import torch.ao.nn.quantized.dynamic as nnqd

        cls = getattr(nnqd, name)
        # torch's from_float reads the weight observer from ``module.qconfig.weight``; give it
        # ours on a shallow copy, so the float module is not modified.
        shim = copy.copy(module)
        shim.qconfig = types.SimpleNamespace(weight=weight_observer, activation=None)
        return cls.from_float(shim)

    return make


DYNAMIC_MODULES: dict[type, Callable[[nn.Module, Callable[[], Observer]], nn.Module]] = {
    nn.Linear: _dynamic_linear,
    nn.LSTM: _dynamic_rnn("LSTM"),
    nn.GRU: _dynamic_rnn("GRU"),
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
