"""ONNX translations of fxloom's quantized operators (``fxloom.quantize.ops``), as QDQ.

A quantized graph (``fxloom.quantize.convert``, the default plain kernels) calls
``fxloom.quantize.ops.<op>`` on plain integer tensors; each row here writes the standard
ONNX operators that compute the same thing, in the forms ONNX Runtime's graph optimizer
fuses into its integer kernels (checked by ``tests/lower/test_quantized_lowering.py``
on onnxruntime 1.30):

=============== ======================================================= =====================
operator        ONNX                                                    ONNX Runtime runs
=============== ======================================================= =====================
quantize        ``QuantizeLinear`` (+ ``Clip`` for a narrowed range)    itself, or fused
dequantize      ``DequantizeLinear``                                    itself, or fused
choose_qparams  ReduceMin/ReduceMax arithmetic, as the reference        itself
linear_w8       ``DequantizeLinear`` (int8, per channel) + ``MatMul``   ``MatMulNBits`` (8 bit)
                (+ bias ``Add``)
linear_w4       ``DequantizeLinear`` (uint4, ``block_size`` = group)    ``MatMulNBits`` (4 bit)
                + ``MatMul`` (+ bias ``Add``)
linear_int8     per tensor: ``DynamicQuantizeLinear``, ``MatMulInteger``  ``MatMulInteger``
(dynamic)       with its zero point, scale ``Mul``s, bias ``Add``;
                per token: ``Abs``/``ReduceMax``/``Round`` to uint8
                with zero point 128, ``MatMulInteger``, scale ``Mul``,
                bias ``Add``
linear_int8     (``QuantizeLinear`` for float in) ``MatMulInteger``,    ``MatMulInteger``
(static)        scale ``Mul``, bias ``Add``, ``Relu``, ``QuantizeLinear``
conv2d_int8     ``DequantizeLinear`` of input, weight (per channel) and ``QLinearConv``
                int32 bias around ``Conv`` (+ ``Relu``), ``QuantizeLinear``
add_int8,       ``DequantizeLinear`` around ``Add``/``Mul``, (``Relu``),  ``QLinearAdd``,
mul_int8        ``QuantizeLinear``                                      ``QLinearMul``
conv2d_add_int8 conv2d_int8's form, its output quantized at a scale     ``QLinearConv``,
                that clips nothing the sum keeps, then add_int8's       ``QLinearAdd``
max_pool2d_int8 ``MaxPool`` of the uint8/int8 codes                       itself (uint8)
=============== ======================================================= =====================

Why these forms and not others:

* dynamic per-tensor activations are ``DynamicQuantizeLinear``'s own definition (uint8,
  affine, the range widened to hold 0); per-token ones are symmetric, a scale per row, which
  ``DynamicQuantizeLinear`` would compute otherwise (and its fused
  ``DynamicQuantizeMatMul`` is a ``com.microsoft`` operator, which a saved region may not
  use: ``runtime_saving``). The per-token steps are written out; ``x / scale`` rounded and
  shifted by 128 is the uint8 form of the int8 value, so ``MatMulInteger`` with zero point
  128 computes the reference's integer product exactly. On a CPU without VNNI the weight
  goes in as uint8 (plus 128, weight zero point 128): ONNX Runtime's uint8 x int8 kernel
  there saturates int16 pair sums, its uint8 x uint8 kernel does not (``_integer_weight``;
  convolutions likewise, ``_conv_weight``);
* a static linear layer with a bias does not fuse as QDQ in ONNX Runtime 1.30: it rewrites
  ``MatMul`` + ``Add`` into a float ``Gemm`` and never forms ``QGemm`` (tried with per-tensor
  and per-channel weights, transposed or not). ``MatMulInteger`` with the reference's float
  scale and bias is its integer kernel, and equals the reference;
* weight-only layers dequantize a constant integer weight (transposed to ``[K, N]``, int4
  repacked as ONNX ``UINT4``), which ONNX Runtime fuses into ``MatMulNBits``; it runs
  faster with ``accuracy_level=4`` (activations in int8 per block, about 0.5% error), which
  ``OrtModule`` asks for (``runtime.SESSION_CONFIG``);
* a static convolution is the textbook QDQ pattern (the bias int32 at the input scale times
  each channel's weight scale: half a unit of the accumulator at most from the reference's
  float bias, which is added as float where it would not fit in int32);
* a convolution fused with its residual add (``conv2d_add_int8``) keeps the convolution's
  result in float; ONNX Runtime has no integer kernel for that (``Conv`` + ``Add`` between
  QDQ pairs runs as a float ``FusedConv``), so the convolution's result is quantized to
  uint8 in between at the scale ``out_scale + other_scale`` with the zero point that makes
  its range ``[out_low - other_high, out_high - other_low]``: a convolution value beyond it
  gives a sum beyond the output's range whatever ``other`` is, clipped there either way, so
  the extra step only rounds (half a step of that scale: about one output code where the
  operands' scales are alike), and ONNX Runtime runs ``QLinearConv`` + ``QLinearAdd``.

Weights, scales, zero points and biases must be constants of the graph (``get_attr``, as
``convert`` makes them); a graph that computes them is refused (``UnsupportedArgument``), and
``fxloom.lower`` keeps that region in PyTorch. The operators need ONNX opset 21
(``block_size``, ``UINT4``): each handler's ``opset`` says so, and the translator raises
the graph's opset to it.

Depends on: torch, ``fxloom.quantize.ops`` (the operators' signatures and int4 packing),
``onnx_ops``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from fxloom.lower.onnx_ops import UnsupportedArgument, cast_to, onnx_dtype, register
from fxloom.lower.onnx_ops_nn import pool_node
from fxloom.node import Node
from fxloom.quantize import kernels, ops

__all__ = ["QUANTIZED_OPERATORS"]

# ONNX TensorProto element types used here (onnx's enum, written out: no onnx import).
_FLOAT, _UINT8 = 1, 2

# The opset the handlers here write (blocked DequantizeLinear and UINT4 are opset 21).
QUANT_OPSET = 21

# Each operator's spellings: the Python function graphs call and the torch.library overload.
QUANTIZED_OPERATORS = {
    name: (getattr(ops, name), getattr(getattr(torch.ops, ops.NAMESPACE), name).default)
    for name in ops.OPERATORS
}


# The operators ONNX Runtime computes otherwise than their references, and how: ``lower``'s
# check names them when the lowered model misses its tolerance (``OnnxRuntimeBackend``).
_MATMULNBITS = (
    "ONNX Runtime runs it as MatMulNBits with int8 activations per block (accuracy_level=4, "
    "runtime.SESSION_CONFIG), off by about 0.5% of the outputs' largest magnitude (an atol "
    "of about 1% of it passes)"
)
APPROXIMATED = {
    "linear_w8": _MATMULNBITS,
    "linear_w4": _MATMULNBITS,
    "conv2d_int8": (
        "the bias is rounded to int32 at the input scale times each channel's weight scale, "
        "as QLinearConv takes it, and the result requantized with one float multiplier: one "
        "output code off on about 1 element in 1000 (measured on random 1-, 2- and 3-d ones)"
    ),
    "conv2d_add_int8": (
        "the convolution's result is rounded to uint8 before the add, for ONNX Runtime's "
        "QLinearConv + QLinearAdd (it has no integer kernel for the float sum): about one "
        "output code off"
    ),
}


def approximated(node: Any) -> str | None:
    """What ONNX Runtime computes otherwise than ``node``'s operator (None: its reference)."""
    for name, why in APPROXIMATED.items():
        if node.op == "call_function" and node.target in QUANTIZED_OPERATORS[name]:
            return f"{name}: {why}"
    return None


def _rows(name: str):
    """Register the handler under ``name``'s spellings, needing opset ``QUANT_OPSET``."""

    def decorate(handler):
        handler.opset = QUANT_OPSET
        return register(list(QUANTIZED_OPERATORS[name]))(handler)

    return decorate


# ---- arguments ------------------------------------------------------------------------------
def _bound(name: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by the names of ``fxloom.quantize.ops.<name>``, defaults filled."""
    try:
        bound = inspect.signature(getattr(ops, name)).bind(*args, **kwargs)
    except TypeError as error:  # keywords named as the torch.library schema names them
        raise UnsupportedArgument(
            f"{name}: arguments {error}; pass them by position, as convert writes them"
        ) from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _constant(value: Any, what: str, name: str) -> torch.Tensor:
    """``value`` as a tensor the examples fix (a weight, a scale), or refuse the call."""
    if isinstance(value, Node):
        raise UnsupportedArgument(
            f"{name}: its {what} is computed in the graph; the ONNX translation needs it "
            "constant (a get_attr, as fxloom.quantize.convert makes it)"
        )
    return value.detach()


def _scalar(ctx: Any, value: float | int, dtype: torch.dtype) -> str:
    return ctx.constant(torch.tensor(value, dtype=dtype))


def _float_input(ctx: Any, value: Any, name: str) -> str:
    if isinstance(value, Node) and ctx.dtype_of(value) != torch.float32:
        raise UnsupportedArgument(
            f"{name}: {ctx.dtype_of(value)} activations; the ONNX translation takes float32"
        )
    return cast_to(ctx, value, torch.float32)


# ---- quantize, dequantize, choose_qparams -------------------------------------------------
_FULL_RANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127)}


@_rows("quantize")
def translate_quantize(ctx, node, args, kwargs):
    a = _bound("quantize", args, kwargs)
    dtype = a["dtype"]
    if dtype not in _FULL_RANGE:
        raise UnsupportedArgument(f"quantize to {dtype}: ONNX QuantizeLinear takes uint8/int8")
    x = _float_input(ctx, a["x"], "quantize")
    q = ctx.node(
        "QuantizeLinear",
        [x, _scalar(ctx, a["scale"], torch.float32), _scalar(ctx, a["zero_point"], dtype)],
    )
    low, high = a["quant_min"], a["quant_max"]
    if (low, high) == _FULL_RANGE[dtype]:  # QuantizeLinear saturates to the dtype's range
        return q
    return ctx.node("Clip", [q, _scalar(ctx, low, dtype), _scalar(ctx, high, dtype)])


@_rows("dequantize")
def translate_dequantize(ctx, node, args, kwargs):
    a = _bound("dequantize", args, kwargs)
    q = a["q"]
    dtype = ctx.dtype_of(q) if isinstance(q, Node) else q.dtype
    return ctx.node(
        "DequantizeLinear",
        [
            ctx.name(q),
            _scalar(ctx, a["scale"], torch.float32),
            _scalar(ctx, a["zero_point"], dtype),
        ],
    )


@_rows("choose_qparams")
def translate_choose_qparams(ctx, node, args, kwargs):
    """The reference's per-tensor arithmetic: the range of ``[min(x, 0), max(x, 0)]``."""
    a = _bound("choose_qparams", args, kwargs)
    x = _float_input(ctx, a["x"], "choose_qparams")
    low_int, high_int = a["quant_min"], a["quant_max"]
    zero = _scalar(ctx, 0.0, torch.float32)
    low = ctx.node("Min", [ctx.node("ReduceMin", [x], keepdims=0), zero])
    high = ctx.node("Max", [ctx.node("ReduceMax", [x], keepdims=0), zero])
    span = _scalar(ctx, float(high_int - low_int), torch.float32)
    scale = ctx.node("Max", [ctx.node("Div", [ctx.node("Sub", [high, low]), span]),
                             _scalar(ctx, float(a["eps"]), torch.float32)])  # fmt: skip
    shifted = ctx.node("Sub", [_scalar(ctx, float(low_int), torch.float32),
                               ctx.node("Round", [ctx.node("Div", [low, scale])])])  # fmt: skip
    zero_point = ctx.node(
        "Clip",
        [shifted, _scalar(ctx, float(low_int), torch.float32),
         _scalar(ctx, float(high_int), torch.float32)],
    )  # fmt: skip
    one = ctx.constant([1])
    return (
        ctx.node("Reshape", [scale, one]),
        ctx.node("Reshape", [ctx.node("Cast", [zero_point], to=onnx_dtype(torch.int64)), one]),
    )


# ---- linear layers --------------------------------------------------------------------------
def _finish(ctx, value: str, bias: Any, relu: bool, out_scale: float, out_zero_point: int) -> str:
    """The float result, as the operators end: bias added, ReLU'd, and uint8 with the output's
    parameters unless ``out_scale`` is 0 (float out)."""
    if bias is not None:
        value = ctx.node("Add", [value, ctx.constant(_constant(bias, "bias", "linear").float())])
    if relu:
        value = ctx.node("Relu", [value])
    if out_scale == 0.0:
        return value
    return ctx.node(
        "QuantizeLinear",
        [value, _scalar(ctx, out_scale, torch.float32), _scalar(ctx, out_zero_point, torch.uint8)],
    )


def _per_token_uint8(ctx, x: str) -> tuple[str, str]:
    """``x`` as ``ops.per_token_symmetric`` quantizes it, plus 128 (uint8, zero point 128),
    and the per-row scales (``absmax / 127``, keeping the last dimension)."""
    f32 = torch.float32
    absmax = ctx.node("ReduceMax", [ctx.node("Abs", [x]), ctx.constant([-1])], keepdims=1)
    scale = ctx.node(
        "Div", [ctx.node("Max", [absmax, _scalar(ctx, 1e-8, f32)]), _scalar(ctx, 127.0, f32)]
    )
    rounded = ctx.node("Round", [ctx.node("Div", [x, scale])])
    low, high = ops.TOKEN_RANGE
    clipped = ctx.node(
        "Clip", [rounded, _scalar(ctx, float(low), f32), _scalar(ctx, float(high), f32)]
    )
    shifted = ctx.node("Add", [clipped, _scalar(ctx, 128.0, f32)])
    return ctx.node("Cast", [shifted], to=_UINT8), scale


@_rows("linear_int8")
def translate_linear_int8(ctx, node, args, kwargs):
    a = _bound("linear_int8", args, kwargs)
    w = _constant(a["w"], "weight", "linear_int8")
    w_scale = _constant(a["w_scale"], "weight scale", "linear_int8").float()
    product = _DYNAMIC_PRODUCTS[a["activations"]] if a["dynamic"] else _static_product
    value = product(ctx, a, _integer_weight(ctx, w), w_scale)
    return _finish(ctx, value, a["bias"], a["relu"], a["out_scale"], a["out_zero_point"])


def _int8_exact(w: torch.Tensor) -> bool:
    """Whether ONNX Runtime's uint8 x int8 kernels are exact on ``w`` here: with VNNI, or
    narrow weights (``kernels.NARROW_WEIGHT``: no int16 pair sum saturates)."""
    return kernels.vnni() or kernels.narrow(w)


def _integer_weight(ctx, w: torch.Tensor) -> list[str]:
    """``MatMulInteger``'s weight inputs: ``[K, N]`` int8 where the CPU has VNNI or the
    weight is narrow; elsewhere uint8 (the codes plus 128) with weight zero point 128, the
    same products. ONNX Runtime's uint8 x int8 kernel on AVX2 without VNNI sums pairs of
    products in int16, which saturates on 8-bit weights (ONNX Runtime's documentation says
    so; measured on an AMD EPYC, onnxruntime 1.30: 0.19 off on outputs of 0.64); its uint8 x
    uint8 kernel widens first and is exact, but slower. The lowered model runs where it is
    lowered, so the form follows this CPU."""
    if _int8_exact(w):
        return [ctx.constant(w.t().contiguous())]
    shifted = (w.t().to(torch.int16) + 128).to(torch.uint8).contiguous()
    return [ctx.constant(shifted), _scalar(ctx, 128, torch.uint8)]


def _matmul_integer(ctx, x: str, weight: list[str], x_zero_point: str) -> str:
    return ctx.node("MatMulInteger", [x, weight[0], x_zero_point, *weight[1:]])


def _per_token_product(ctx, a: dict, weight: list[str], w_scale: torch.Tensor) -> str:
    x, row_scale = _per_token_uint8(ctx, _float_input(ctx, a["x"], "linear_int8"))
    accumulated = _matmul_integer(ctx, x, weight, _scalar(ctx, 128, torch.uint8))
    # Scaled by the weight's scales first, the rows' after: ONNX Runtime 1.30 fuses
    # MatMulInteger -> Cast -> Mul(row scales * weight scales) into MatMulIntegerToFloat,
    # taking the row scales [..., 1] for a per-tensor scale, and computes wrong results (the
    # first row's scale for every row); in this order the row scales stay out of the fusion.
    value = ctx.node("Mul", [ctx.node("Cast", [accumulated], to=_FLOAT), ctx.constant(w_scale)])
    return ctx.node("Mul", [value, row_scale])


def _per_tensor_product(ctx, a: dict, weight: list[str], w_scale: torch.Tensor) -> str:
    """``DynamicQuantizeLinear`` quantizes as ``ops.per_tensor_affine`` does (uint8, the range
    widened to hold 0, round half to even), then ``MatMulInteger`` with its zero point."""
    x = _float_input(ctx, a["x"], "linear_int8")
    codes, scale, zero_point = ctx.node("DynamicQuantizeLinear", [x], outputs=3)
    accumulated = _matmul_integer(ctx, codes, weight, zero_point)
    value = ctx.node("Mul", [ctx.node("Cast", [accumulated], to=_FLOAT), ctx.constant(w_scale)])
    return ctx.node("Mul", [value, scale])


# linear_int8's dynamic ``activations`` -> how the product is written
_DYNAMIC_PRODUCTS = {"per_token": _per_token_product, "per_tensor": _per_tensor_product}


def _static_product(ctx, a: dict, weight: list[str], w_scale: torch.Tensor) -> str:
    x, x_zero_point = a["x"], _scalar(ctx, a["x_zero_point"], torch.uint8)
    if isinstance(x, Node) and ctx.dtype_of(x).is_floating_point:  # float in: quantized here
        x_scale = _scalar(ctx, a["x_scale"], torch.float32)
        x = ctx.node("QuantizeLinear", [_float_input(ctx, x, "linear_int8"), x_scale, x_zero_point])
    else:
        x = ctx.name(x)
    accumulated = _matmul_integer(ctx, x, weight, x_zero_point)
    scale = ctx.constant(a["x_scale"] * w_scale)  # as the reference computes it
    return ctx.node("Mul", [ctx.node("Cast", [accumulated], to=_FLOAT), scale])


@_rows("linear_w8")
def translate_linear_w8(ctx, node, args, kwargs):
    a = _bound("linear_w8", args, kwargs)
    w = _constant(a["w"], "weight", "linear_w8")
    w_scale = _constant(a["w_scale"], "weight scale", "linear_w8").float()
    weight = ctx.node(
        "DequantizeLinear", [ctx.constant(w.t().contiguous()), ctx.constant(w_scale)], axis=1
    )
    value = ctx.node("MatMul", [_float_input(ctx, a["x"], "linear_w8"), weight])
    return _finish(ctx, value, a["bias"], False, 0.0, 0)


@_rows("linear_w4")
def translate_linear_w4(ctx, node, args, kwargs):
    a = _bound("linear_w4", args, kwargs)
    packed = _constant(a["w"], "weight", "linear_w4")
    w_scale = _constant(a["w_scale"], "weight scale", "linear_w4").float()
    w_zero_point = _constant(a["w_zero_point"], "weight zero point", "linear_w4")
    codes = ops.unpack_int4(packed)  # [N, K], 0..15
    weight = ctx.node(
        "DequantizeLinear",
        [
            ctx.constant_uint4(codes.t().contiguous()),  # [K, N]: MatMul's right side
            ctx.constant(w_scale.t().contiguous()),  # [K / group, N]
            ctx.constant_uint4(w_zero_point.to(torch.uint8).t().contiguous()),
        ],
        axis=0,
        block_size=int(a["group_size"]),
    )
    value = ctx.node("MatMul", [_float_input(ctx, a["x"], "linear_w4"), weight])
    return _finish(ctx, value, a["bias"], False, 0.0, 0)


# ---- convolution ----------------------------------------------------------------------------
@_rows("conv2d_int8")
def translate_conv2d_int8(ctx, node, args, kwargs):
    a = _bound("conv2d_int8", args, kwargs)
    value = _convolution(ctx, a, "conv2d_int8")
    return _finish(ctx, value, None, a["relu"], a["out_scale"], a["out_zero_point"])


@_rows("conv2d_add_int8")
def translate_conv2d_add_int8(ctx, node, args, kwargs):
    a = _bound("conv2d_add_int8", args, kwargs)
    value = _convolution(ctx, a, "conv2d_add_int8")
    scale, zero_point = _unclipped_sum_operand(a)
    in_between = _finish(ctx, value, None, False, scale, zero_point)
    value = ctx.node(
        "Add",
        [_dequantized(ctx, in_between, scale, zero_point),
         _dequantized(ctx, a["other"], a["other_scale"], a["other_zero_point"])],
    )  # fmt: skip
    return _finish(ctx, value, None, a["relu"], a["out_scale"], a["out_zero_point"])


@_rows("max_pool2d_int8")
def translate_max_pool2d_int8(ctx, node, args, kwargs):
    a = _bound("max_pool2d_int8", args, kwargs)
    return pool_node(
        ctx, "MaxPool", ctx.name(a["x"]), 2, kernel=a["kernel_size"], stride=a["stride"],
        padding=a["padding"], ceil_mode=a["ceil_mode"], dilations=list(a["dilation"]),
    )  # fmt: skip


def _unclipped_sum_operand(a: dict) -> tuple[float, int]:
    """uint8 parameters for the convolution's result ``c`` in ``c + other``: the range
    ``[out_low - other_high, out_high - other_low]`` (beyond it the sum is clipped to the
    output's range for every ``other``), 255 steps of ``out_scale + other_scale``."""
    out_scale, other_scale = a["out_scale"], a["other_scale"]
    if out_scale == 0.0:
        raise UnsupportedArgument(
            "conv2d_add_int8: a float output (out_scale 0) has no range to derive the "
            "convolution's uint8 parameters from; convert fuses only int8 sums"
        )
    scale = out_scale + other_scale
    low = -a["out_zero_point"] * out_scale - (255 - a["other_zero_point"]) * other_scale
    return scale, min(max(round(-low / scale), 0), 255)


def _dequantized(ctx, value: Any, scale: float, zero_point: int) -> str:
    """``value`` (a graph value, or an ONNX name written here) as float."""
    return ctx.node(
        "DequantizeLinear",
        [value if isinstance(value, str) else ctx.name(value, dtype=torch.uint8),
         _scalar(ctx, scale, torch.float32), _scalar(ctx, zero_point, torch.uint8)],
    )  # fmt: skip


def _conv_weight(ctx, w: torch.Tensor, w_scale: torch.Tensor) -> str:
    """The convolution's weight dequantized per output channel: int8 where the CPU has VNNI
    or the weight is narrow; elsewhere uint8, the codes plus 128, with zero points 128 (ONNX
    Runtime's uint8 x int8 convolution saturates there on 8-bit weights, as
    ``_integer_weight`` says of its matmul: a residual block lowered with 8-bit int8 weights
    came out 0.085 off, relatively)."""
    if _int8_exact(w):
        inputs = [ctx.constant(w), ctx.constant(w_scale)]
    else:
        shifted = (w.to(torch.int16) + 128).to(torch.uint8)
        zero_points = torch.full(w_scale.shape, 128, dtype=torch.uint8)
        inputs = [ctx.constant(shifted), ctx.constant(w_scale), ctx.constant(zero_points)]
    return ctx.node("DequantizeLinear", inputs, axis=0)


def _convolution(ctx, a: dict, name: str) -> str:
    """The int8 convolution's float result (bias added): QDQ around ``Conv``."""
    w = _constant(a["w"], "weight", name)
    w_scale = _constant(a["w_scale"], "weight scale", name).float()
    x = ctx.node(
        "DequantizeLinear",
        [ctx.name(a["x"]), _scalar(ctx, a["x_scale"], torch.float32),
         _scalar(ctx, a["x_zero_point"], torch.uint8)],
    )  # fmt: skip
    inputs, float_bias = [x, _conv_weight(ctx, w, w_scale)], None
    if a["bias"] is not None:
        bias = _constant(a["bias"], "bias", name).float()
        bias_scale = a["x_scale"] * w_scale
        units = torch.round(bias / bias_scale)
        if bool((units.abs() < 2**31 - 1).all()):  # the QDQ form: an int32 bias
            inputs.append(
                ctx.node(
                    "DequantizeLinear",
                    [ctx.constant(units.to(torch.int32)), ctx.constant(bias_scale)],
                    axis=0,
                )
            )
        else:
            float_bias = bias
    spatial = len(w.shape) - 2
    value = ctx.node(
        "Conv",
        inputs,
        strides=list(a["stride"]),
        pads=list(a["padding"]) * 2,
        dilations=list(a["dilation"]),
        group=int(a["groups"]),
        kernel_shape=list(w.shape[2:]),
    )
    if float_bias is not None:
        value = ctx.node("Add", [value, ctx.constant(float_bias.reshape(-1, *[1] * spatial))])
    return value


# ---- elementwise ----------------------------------------------------------------------------
def _elementwise(name: str, op_type: str):
    @_rows(name)
    def translate(ctx, node, args, kwargs):
        a = _bound(name, args, kwargs)

        def dequantized(value, scale, zero_point):
            return ctx.node(
                "DequantizeLinear",
                [ctx.name(value, dtype=torch.uint8), _scalar(ctx, scale, torch.float32),
                 _scalar(ctx, zero_point, torch.uint8)],
            )  # fmt: skip

        value = ctx.node(
            op_type,
            [dequantized(a["a"], a["a_scale"], a["a_zero_point"]),
             dequantized(a["b"], a["b_scale"], a["b_zero_point"])],
        )  # fmt: skip
        return _finish(ctx, value, None, a["relu"], a["out_scale"], a["out_zero_point"])

    translate.__name__ = f"translate_{name}"
    return translate


translate_add_int8 = _elementwise("add_int8", "Add")
translate_mul_int8 = _elementwise("mul_int8", "Mul")
