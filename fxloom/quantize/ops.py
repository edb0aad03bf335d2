"""fxloom's quantized operators on plain tensors (``torch.ops.fxloom_q``), and their references.

A quantized graph holds integers in ordinary tensors: ``uint8`` activations with a scale and a
zero point, ``int8`` weights with one scale per output channel (symmetric: zero point 0),
int4 weights packed two per byte in ``uint8 [N, K/2]`` with a scale and an integer zero point
per group of ``group_size`` inputs. No ``quint8``/``qint8`` tensor and no packed-parameter
object appears in a graph or a file.

Each operator has:

* a **reference** (``reference_<op>`` here): plain ATen (round, clamp, integer matmul, scale)
  that defines what it computes, with ``quantized_decomposed``'s argument conventions
  (``scale, zero_point, quant_min, quant_max, dtype``) where it has a twin there;
* a **Meta kernel** (``_meta_<op>``): shapes and dtypes only, so export and dynamic shapes
  trace through it;
* a **CPU kernel** that asks ``kernels.choose`` for the fastest kernel of the table for this
  call and this CPU, the reference being the fallback (``kernels`` documents the table);
* a **Python function** of the same name here, which graphs call: one row each in
  ``fxloom.ops.runtime_functions`` (``fxloom.quantize.ops.<op>``), so the safe loader admits
  a file calling it by construction, in a process that imported nothing before (each calls
  the CPU kernel itself when nothing but the dispatcher would see the call: ``_entry``).

    >>> import torch
    >>> from fxloom.quantize import ops
    >>> x = torch.tensor([[0.5, -1.0, 2.0]])
    >>> q = ops.quantize(x, 0.02, 128, 0, 255, torch.uint8)
    >>> q.dtype, q.tolist()
    (torch.uint8, [[153, 78, 228]])
    >>> ops.dequantize(q, 0.02, 128, 0, 255, torch.uint8).tolist()
    [[0.5, -1.0, 2.0]]

Operators:

    quantize(x, scale, zero_point, quant_min, quant_max, dtype)       round(x/scale)+zp, clamped
    dequantize(q, scale, zero_point, quant_min, quant_max, dtype)     (q - zp) * scale
    choose_qparams(x, quant_min, quant_max, eps, dtype)               per-tensor affine (scale, zp)
    linear_int8(x, x_scale, x_zp, w, w_scale, bias, out_scale, out_zp, relu, dynamic,
                activations="per_token")
        x uint8 (quantized already), or float: quantized here with (x_scale, x_zp) (static,
        "float in"), or at run time (``dynamic``): ``activations`` "per_token" (int8,
        symmetric, a scale per row) or "per_tensor" (uint8, affine, ``choose_qparams`` of the
        whole input, as ONNX's ``DynamicQuantizeLinear``); w int8 [N, K] with a scale per
        output channel; the output is uint8 with (out_scale, out_zp), or float when
        out_scale is 0
    linear_w8(x, w, w_scale, bias)                  weight-only int8: x float (fp32 or bf16)
    linear_w4(x, w, w_scale, w_zero_point, group_size, bias)   weight-only int4, per group
    conv2d_int8(x, x_scale, x_zp, w, w_scale, bias, stride, padding, dilation, groups,
                out_scale, out_zp, relu)       (any spatial rank: 1d and 3d weights work too)
    add_int8 / mul_int8(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, relu)
    conv2d_add_int8(x, x_scale, x_zp, w, w_scale, bias, stride, padding, dilation, groups,
                    other, other_scale, other_zp, out_scale, out_zp, relu)
        a convolution and a residual add in one: the convolution's accumulator in float
        (never rounded to 8 bits), plus ``other`` dequantized, ReLU'd if asked, quantized
        once with the output's parameters (``convert`` fuses conv2d_int8 -> add_int8 into it
        where the add is the convolution's only user: one rounding instead of two)
    max_pool2d_int8(x, kernel_size, stride, padding, dilation, ceil_mode)
        max pooling of integer codes (uint8 or int8), any memory format: the codes' own
        maximum (``convert`` pools int8 activations with it; torch's ``max_pool2d`` refuses
        a channels-last uint8 tensor)

Depends on: torch (``torch.library``), ``kernels`` (imported when a CPU kernel first runs).
"""

from __future__ import annotations

import functools
import importlib

import torch

__all__ = [
    "NAMESPACE",
    "OPERATORS",
    "add_int8",
    "choose_qparams",
    "conv2d_add_int8",
    "conv2d_int8",
    "dequantize",
    "linear_int8",
    "linear_w4",
    "linear_w8",
    "max_pool2d_int8",
    "mul_int8",
    "pack_int4",
    "quantize",
    "unpack_int4",
]

NAMESPACE = "fxloom_q"

# name -> schema (quantized_decomposed's conventions: scale, zero_point, quant_min, quant_max)
SCHEMAS = {
    "quantize": "quantize(Tensor input, float scale, int zero_point, int quant_min, "
    "int quant_max, ScalarType dtype) -> Tensor",
    "dequantize": "dequantize(Tensor input, float scale, int zero_point, int quant_min, "
    "int quant_max, ScalarType dtype) -> Tensor",
    "choose_qparams": "choose_qparams(Tensor input, int quant_min, int quant_max, float eps, "
    "ScalarType dtype) -> (Tensor, Tensor)",
    "linear_int8": "linear_int8(Tensor x, float x_scale, int x_zero_point, Tensor w, "
    "Tensor w_scale, Tensor? bias, float out_scale, int out_zero_point, bool relu, "
    'bool dynamic, str activations="per_token") -> Tensor',
    "linear_w8": "linear_w8(Tensor x, Tensor w, Tensor w_scale, Tensor? bias) -> Tensor",
    "linear_w4": "linear_w4(Tensor x, Tensor w, Tensor w_scale, Tensor w_zero_point, "
    "int group_size, Tensor? bias) -> Tensor",
    "conv2d_int8": "conv2d_int8(Tensor x, float x_scale, int x_zero_point, Tensor w, "
    "Tensor w_scale, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, "
    "float out_scale, int out_zero_point, bool relu) -> Tensor",
    "conv2d_add_int8": "conv2d_add_int8(Tensor x, float x_scale, int x_zero_point, Tensor w, "
    "Tensor w_scale, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, "
    "Tensor other, float other_scale, int other_zero_point, float out_scale, "
    "int out_zero_point, bool relu) -> Tensor",
    "add_int8": "add_int8(Tensor a, float a_scale, int a_zero_point, Tensor b, float b_scale, "
    "int b_zero_point, float out_scale, int out_zero_point, bool relu) -> Tensor",
    "mul_int8": "mul_int8(Tensor a, float a_scale, int a_zero_point, Tensor b, float b_scale, "
    "int b_zero_point, float out_scale, int out_zero_point, bool relu) -> Tensor",
    "max_pool2d_int8": "max_pool2d_int8(Tensor x, int[2] kernel_size, int[2] stride, "
    "int[2] padding, int[2] dilation, bool ceil_mode) -> Tensor",
}
OPERATORS = tuple(SCHEMAS)

ACTIVATION_RANGE = (0, 255)  # uint8 activations, as onednn's int8 kernels take them
TOKEN_RANGE = (-128, 127)  # dynamic per-token activations: int8, symmetric
# linear_int8(dynamic=True)'s ``activations``: how the input is quantized at run time
DYNAMIC_ACTIVATIONS = ("per_token", "per_tensor")


# ------------------------------------------------------------------ references
def reference_quantize(x, scale, zero_point, quant_min, quant_max, dtype):
    q = torch.round(x.float() / scale) + zero_point
    return torch.clamp(q, quant_min, quant_max).to(dtype)


def reference_dequantize(q, scale, zero_point, quant_min, quant_max, dtype):
    return (q.to(torch.int32) - zero_point).float() * scale


def reference_choose_qparams(x, quant_min, quant_max, eps, dtype):
    """Affine per-tensor parameters mapping ``[min(x, 0), max(x, 0)]`` onto the integers (an
    empty ``x``: the range ``[0, 0]``, as a dynamic layer on an empty batch needs)."""
    if not x.numel():  # (min() of nothing raises; the range always holds 0)
        x = x.new_zeros(())
    low = torch.clamp(x.min().float(), max=0.0)
    high = torch.clamp(x.max().float(), min=0.0)
    scale = torch.clamp((high - low) / float(quant_max - quant_min), min=eps)
    zero_point = torch.clamp(quant_min - torch.round(low / scale), quant_min, quant_max)
    return scale.reshape(1), zero_point.to(torch.int64).reshape(1)


def per_token_scale(x: torch.Tensor) -> torch.Tensor:
    """One scale per row of ``x`` (float, ``[..., K]``): ``absmax / 127``, ``[..., 1]``."""
    return x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-8) / 127.0


def per_token_symmetric(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (float, ``[..., K]``) as int8 with one scale per row (``per_token_scale``)."""
    scale = per_token_scale(x)
    q = torch.clamp(torch.round(x.float() / scale), *TOKEN_RANGE).to(torch.int8)
    return q, scale


def _integer_matmul(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a @ w.T`` in int32: ``a`` integers ``[..., K]`` (zero point removed), ``w`` int8."""
    return torch.matmul(a.to(torch.int32), w.to(torch.int32).t())


def _requantize(value, out_scale, out_zero_point, relu):
    """The float result, ReLU'd if asked, then uint8 with the output parameters (scale 0:
    stays float)."""
    if relu:
        value = torch.relu(value)
    if out_scale == 0.0:
        return value
    return reference_quantize(value, out_scale, out_zero_point, *ACTIVATION_RANGE, torch.uint8)


def per_tensor_affine(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` (float) as uint8 with one scale and zero point chosen from its own range
    (``choose_qparams``): the codes, the scale and the zero point (1-element tensors)."""
    scale, zero_point = reference_choose_qparams(x, *ACTIVATION_RANGE, 1e-8, torch.uint8)
    return (
        reference_quantize(x, scale, zero_point, *ACTIVATION_RANGE, torch.uint8),
        scale,
        zero_point,
    )


def _dynamic_activations(activations: str) -> str:
    if activations not in DYNAMIC_ACTIVATIONS:
        raise ValueError(
            f"linear_int8(activations={activations!r}): dynamic activations are one of "
            f"{', '.join(map(repr, DYNAMIC_ACTIVATIONS))}"
        )
    return activations


def reference_linear_int8(
    x, x_scale, x_zero_point, w, w_scale, bias, out_scale, out_zero_point, relu, dynamic,
    activations="per_token",
):  # fmt: skip
    if dynamic and _dynamic_activations(activations) == "per_tensor":
        q, scale, zero_point = per_tensor_affine(x)
        accumulated = _integer_matmul(q.to(torch.int32) - zero_point, w).float()
        accumulated = accumulated * (scale * w_scale.float())
    elif dynamic:
        q, row_scale = per_token_symmetric(x)
        accumulated = _integer_matmul(q, w).float() * (row_scale * w_scale.float())
    else:
        if x.is_floating_point():  # float in: quantized here with the calibrated parameters
            x = reference_quantize(x, x_scale, x_zero_point, *ACTIVATION_RANGE, torch.uint8)
        accumulated = _integer_matmul(x.to(torch.int32) - x_zero_point, w).float()
        accumulated = accumulated * (x_scale * w_scale.float())
    if bias is not None:
        accumulated = accumulated + bias.float()
    return _requantize(accumulated, out_scale, out_zero_point, relu)


def reference_linear_w8(x, w, w_scale, bias):
    weight = w.to(x.dtype) * w_scale.to(x.dtype)[:, None]
    out = torch.matmul(x, weight.t())
    return out if bias is None else out + bias.to(x.dtype)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Integers 0..15 ``[N, K]`` (K even) as ``uint8 [N, K/2]``: element 2i in the low nibble."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """``pack_int4``'s inverse: ``uint8 [N, K/2]`` -> integers 0..15 ``[N, K]`` (uint8)."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack((low, high), dim=-1).reshape(packed.shape[0], -1)


def reference_linear_w4(x, w, w_scale, w_zero_point, group_size, bias):
    q = unpack_int4(w).to(torch.int32)  # [N, K]
    n, k = q.shape
    grouped = q.reshape(n, k // group_size, group_size) - w_zero_point[..., None].to(torch.int32)
    weight = (grouped.float() * w_scale[..., None].float()).reshape(n, k).to(x.dtype)
    out = torch.matmul(x, weight.t())
    return out if bias is None else out + bias.to(x.dtype)


# the operators that take an unbatched image, and where their image arguments are
_IMAGES = {"conv2d_int8": (0,), "conv2d_add_int8": (0, 10)}
_CONV_WEIGHT = 3  # the weight's position in both


def _unbatched_images(*positions: int):
    """An int8 convolution's function (reference, meta or CPU kernel) taking an unbatched
    input (``[C, H, W]`` for a 2-d convolution, ``[C, L]`` for 1-d, ``[C, D, H, W]`` for 3-d)
    at ``positions[0]`` as ``nn.Conv2d`` and its kin do: as a batch of one, the batch
    dimension dropped from the result where no image argument (``positions``: the input, and
    the residual an add broadcasts against it) had one. Unbatched means one dimension fewer
    than the weight (``[out, in, *kernel]``, at ``_CONV_WEIGHT``): the operators serve 1-d
    and 3-d convolutions too, whose batched inputs have 3 and 5 dimensions."""

    def wrap(function):
        @functools.wraps(function)
        def call(*args):
            batched_rank = args[_CONV_WEIGHT].dim()
            if args[positions[0]].dim() != batched_rank - 1:
                return function(*args)
            args = list(args)
            # a residual's batch stays
            batched = any(args[i].dim() >= batched_rank for i in positions)
            for i in positions:
                if args[i].dim() == batched_rank - 1:
                    args[i] = args[i].unsqueeze(0)
            out = function(*args)
            return out if batched else out.squeeze(0)

        return call

    return wrap


def _conv_value(
    x, x_scale, x_zero_point, w, w_scale, bias, stride, padding, dilation, groups,
    accumulate=torch.float64,
):  # fmt: skip
    """The int8 convolution's result in float: the integer accumulator scaled, plus bias.
    ``accumulate``: the dtype the integers are summed in (the kernel table's float row
    passes float32: within float rounding, on oneDNN's fast float convolution)."""
    # torch has no integer convolution on CPU: integers in float64 sum exactly (< 2**53)
    centred = (x.to(torch.int32) - x_zero_point).to(accumulate)
    accumulated = torch.convolution(
        centred, w.to(accumulate), None, stride, padding, dilation, False,
        [0] * len(stride), groups,
    )  # fmt: skip
    shape = [1, -1] + [1] * (accumulated.dim() - 2)
    value = accumulated.float() * (x_scale * w_scale.float().reshape(shape))
    return value if bias is None else value + bias.float().reshape(shape)


@_unbatched_images(*_IMAGES["conv2d_int8"])
def reference_conv2d_int8(
    x, x_scale, x_zero_point, w, w_scale, bias, stride, padding, dilation, groups,
    out_scale, out_zero_point, relu,
):  # fmt: skip
    value = _conv_value(
        x, x_scale, x_zero_point, w, w_scale, bias, stride, padding, dilation, groups
    )
    return _requantize(value, out_scale, out_zero_point, relu)


@_unbatched_images(*_IMAGES["conv2d_add_int8"])
def reference_conv2d_add_int8(
    x, x_scale, x_zero_point, w, w_scale, bias, stride, padding, dilation, groups,
    other, other_scale, other_zero_point, out_scale, out_zero_point, relu,
):  # fmt: skip
    # the convolution's result stays float (not rounded and clipped to a uint8 range of its
    # own, as conv2d_int8 then add_int8 would): the sum is rounded once
    value = _conv_value(
        x, x_scale, x_zero_point, w, w_scale, bias, stride, padding, dilation, groups
    )
    value = value + reference_dequantize(
        other, other_scale, other_zero_point, *ACTIVATION_RANGE, torch.uint8
    )
    return _requantize(value, out_scale, out_zero_point, relu)


def _elementwise(combine):
    def reference(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, relu):
        value = combine(
            reference_dequantize(a, a_scale, a_zp, *ACTIVATION_RANGE, torch.uint8),
            reference_dequantize(b, b_scale, b_zp, *ACTIVATION_RANGE, torch.uint8),
        )
        return _requantize(value, out_scale, out_zp, relu)

    return reference


reference_add_int8 = _elementwise(torch.add)
reference_mul_int8 = _elementwise(torch.mul)


def reference_max_pool2d_int8(x, kernel_size, stride, padding, dilation, ceil_mode):
    """Max pooling of codes on a float copy: codes are exact in float, and a window's maximum
    is one of them (the layout follows ``x``'s, as torch's pooling keeps it)."""
    pooled = torch.nn.functional.max_pool2d(
        x.float(), kernel_size, stride, padding, dilation, ceil_mode
    )
    return pooled.to(x.dtype)


REFERENCES = {name: globals()[f"reference_{name}"] for name in SCHEMAS}


# ------------------------------------------------------------------ meta kernels
def _meta_quantize(x, scale, zero_point, quant_min, quant_max, dtype):
    return torch.empty_like(x, dtype=dtype)


def _meta_dequantize(q, scale, zero_point, quant_min, quant_max, dtype):
    return torch.empty_like(q, dtype=torch.float32)


def _meta_choose_qparams(x, quant_min, quant_max, eps, dtype):
    return x.new_empty((1,), dtype=torch.float32), x.new_empty((1,), dtype=torch.int64)


def _out_dtype(out_scale: float) -> torch.dtype:
    return torch.float32 if out_scale == 0.0 else torch.uint8


def _meta_linear_int8(
    x, x_scale, x_zero_point, w, w_scale, bias, out_scale, out_zero_point, relu, dynamic,
    activations="per_token",
):  # fmt: skip
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=_out_dtype(out_scale))


def _meta_linear_w8(x, w, w_scale, bias):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def _meta_linear_w4(x, w, w_scale, w_zero_point, group_size, bias):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


@_unbatched_images(*_IMAGES["conv2d_int8"])
def _meta_conv2d_int8(
    x, x_scale, x_zero_point, w, w_scale, bias, stride, padding, dilation, groups,
    out_scale, out_zero_point, relu,
):  # fmt: skip
    sizes = [
        (size + 2 * pad - dil * (k - 1) - 1) // step + 1
        for size, k, step, pad, dil in zip(x.shape[2:], w.shape[2:], stride, padding, dilation)
    ]
    return x.new_empty((x.shape[0], w.shape[0], *sizes), dtype=_out_dtype(out_scale))


@_unbatched_images(*_IMAGES["conv2d_add_int8"])
def _meta_conv2d_add_int8(
    x, x_scale, x_zero_point, w, w_scale, bias, stride, padding, dilation, groups,
    other, other_scale, other_zero_point, out_scale, out_zero_point, relu,
):  # fmt: skip
    convolution = _meta_conv2d_int8(
        x, x_scale, x_zero_point, w, w_scale, bias, stride, padding, dilation, groups,
        out_scale, out_zero_point, relu,
    )  # fmt: skip
    shape = torch.broadcast_shapes(convolution.shape, other.shape)  # as the add broadcasts
    return x.new_empty(shape, dtype=_out_dtype(out_scale))


def _meta_elementwise(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, relu):
    shape = torch.broadcast_shapes(a.shape, b.shape)
    return a.new_empty(shape, dtype=_out_dtype(out_scale))


METAS = {
    "quantize": _meta_quantize,
    "dequantize": _meta_dequantize,
    "choose_qparams": _meta_choose_qparams,
    "linear_int8": _meta_linear_int8,
    "linear_w8": _meta_linear_w8,
    "linear_w4": _meta_linear_w4,
    "conv2d_int8": _meta_conv2d_int8,
    "conv2d_add_int8": _meta_conv2d_add_int8,
    "add_int8": _meta_elementwise,
    "mul_int8": _meta_elementwise,
    "max_pool2d_int8": reference_max_pool2d_int8,  # shapes and layout: torch's own meta pooling
}


# ------------------------------------------------------------------ registration
@functools.cache
def _kernels():
    """The kernel table's module (it imports this one: imported at the first call, once;
    an import statement per call cost about 1 us)."""
    return importlib.import_module("fxloom.quantize.kernels")


def _cpu_kernel(name: str):
    reference = REFERENCES[name]

    def run(*args):
        return _kernels().run(name, reference, args)

    run.__name__ = f"cpu_{name}"
    return _unbatched_images(*_IMAGES[name])(run) if name in _IMAGES else run


_CPU_KERNELS = {name: _cpu_kernel(name) for name in SCHEMAS}


def _register() -> torch.library.Library:
    library = torch.library.Library(NAMESPACE, "DEF")
    for name, schema in SCHEMAS.items():
        library.define(schema)
        library.impl(name, _CPU_KERNELS[name], "CPU")
        library.impl(name, METAS[name], "Meta")
    return library


_LIBRARY = _register()
_ops = getattr(torch.ops, NAMESPACE)


# ------------------------------------------------------------------ what graphs call
# One function per operator, by the name its runtime_functions row saves it under. Each calls
# the CPU kernel itself when the dispatcher could only route the call there (``_entry``): a
# small layer's kernel takes 30-50 us and the dispatcher's trip through a Python kernel
# (arguments to the schema's values and back) 10-30 us more, 1.5 ms of a ResNet-50 int8
# forward. Anything that watches calls (tracing, export, a mode, vmap, autograd,
# torch.compile) sees the operator as before.
_OPERATOR = {name: getattr(_ops, name).default for name in SCHEMAS}


_is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def _entry(name: str, *tensors):
    """What to call for ``name`` on ``tensors`` (every tensor argument of the call): its CPU
    kernel where nothing but the CPU kernel would see them, plain CPU tensors (not a
    FakeTensor, a stand-in, a subclass or a functorch wrapper) with no autograd to record,
    no mode active and nothing compiling; else the operator."""
    if (
        torch._C._is_torch_function_mode_enabled()
        or torch._C._len_torch_dispatch_stack()
        or torch.compiler.is_compiling()
    ):
        return _OPERATOR[name]
    grad = torch.is_grad_enabled()
    for tensor in tensors:
        if tensor is not None and (
            type(tensor) is not torch.Tensor
            or not tensor.is_cpu  # (``device.type`` costs 5x as much)
            or (grad and tensor.requires_grad)
            or _is_wrapped(tensor)
        ):
            return _OPERATOR[name]
    return _CPU_KERNELS[name]


def quantize(x, scale, zero_point, quant_min, quant_max, dtype):
    return _entry("quantize", x)(x, scale, zero_point, quant_min, quant_max, dtype)


def dequantize(q, scale, zero_point, quant_min, quant_max, dtype):
    return _entry("dequantize", q)(q, scale, zero_point, quant_min, quant_max, dtype)


def choose_qparams(x, quant_min, quant_max, eps, dtype):
    return _entry("choose_qparams", x)(x, quant_min, quant_max, eps, dtype)


def linear_int8(
    x, x_scale, x_zero_point, w, w_scale, bias, out_scale=0.0, out_zero_point=0, relu=False,
    dynamic=False, activations="per_token",
):  # fmt: skip
    return _entry("linear_int8", x, w, w_scale, bias)(
        x, x_scale, x_zero_point, w, w_scale, bias, out_scale, out_zero_point, relu, dynamic,
        activations,
    )  # fmt: skip


def linear_w8(x, w, w_scale, bias=None):
    return _entry("linear_w8", x, w, w_scale, bias)(x, w, w_scale, bias)


def linear_w4(x, w, w_scale, w_zero_point, group_size, bias=None):
    return _entry("linear_w4", x, w, w_scale, w_zero_point, bias)(
        x, w, w_scale, w_zero_point, group_size, bias
    )


def conv2d_int8(
    x, x_scale, x_zero_point, w, w_scale, bias, stride, padding, dilation, groups,
    out_scale=0.0, out_zero_point=0, relu=False,
):  # fmt: skip
    return _entry("conv2d_int8", x, w, w_scale, bias)(
        x, x_scale, x_zero_point, w, w_scale, bias, list(stride), list(padding),
        list(dilation), groups, out_scale, out_zero_point, relu,
    )  # fmt: skip


def conv2d_add_int8(
    x, x_scale, x_zero_point, w, w_scale, bias, stride, padding, dilation, groups,
    other, other_scale, other_zero_point, out_scale, out_zero_point, relu=False,
):  # fmt: skip
    return _entry("conv2d_add_int8", x, w, w_scale, bias, other)(
        x, x_scale, x_zero_point, w, w_scale, bias, list(stride), list(padding),
        list(dilation), groups, other, other_scale, other_zero_point, out_scale,
        out_zero_point, relu,
    )  # fmt: skip


def conv2d_add_int8_into_other(
    x, x_scale, x_zero_point, w, w_scale, bias, stride, padding, dilation, groups,
    other, other_scale, other_zero_point, out_scale, out_zero_point, relu=False,
):  # fmt: skip
    """``conv2d_add_int8``, free to write its result into ``other``'s storage: generated code
    calls it instead where ``other`` dies at the call and nothing else holds its storage
    (``fxloom.liveness.reused_argument``), which saves oneDNN's "sum" post-op a copy of
    ``other`` to accumulate into. Anything that watches calls gets the operator itself, which
    never writes ``other``."""
    args = (
        x, x_scale, x_zero_point, w, w_scale, bias, list(stride), list(padding),
        list(dilation), groups, other, other_scale, other_zero_point, out_scale,
        out_zero_point, relu,
    )  # fmt: skip
    entry = _entry("conv2d_add_int8", x, w, w_scale, bias, other)
    if entry is not _CPU_KERNELS["conv2d_add_int8"]:
        return entry(*args)
    return _run_reusing_other(*args)


@_unbatched_images(*_IMAGES["conv2d_add_int8"])
def _run_reusing_other(*args):
    return _kernels().run("conv2d_add_int8", reference_conv2d_add_int8, args, reuse=True)


def add_int8(
    a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point, relu=False
):
    return _entry("add_int8", a, b)(
        a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point, relu
    )


def mul_int8(
    a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point, relu=False
):
    return _entry("mul_int8", a, b)(
        a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point, relu
    )


def max_pool2d_int8(x, kernel_size, stride, padding, dilation, ceil_mode=False):
    return _entry("max_pool2d_int8", x)(
        x, list(kernel_size), list(stride), list(padding), list(dilation), ceil_mode
    )
