"""ONNX translations of the neural-network operators: products, convolutions, pooling, norms,
softmax, reductions, embedding and attention, as torch / F functions and Tensor methods.

The ``*_node`` helpers take ONNX value names and plain settings, so that the module handlers
(``onnx_ops_modules``) and the ATen handlers (``onnx_ops_aten``) emit the same nodes.

Depends on: ``onnx_ops``, ``onnx_ops_shapes`` (transpose, split).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from fxloom.lower.onnx_ops import (
    UnsupportedArgument,
    argument,
    cast_to,
    normalized_dim,
    reduce_axes,
    register,
)
from fxloom.lower.onnx_ops_shapes import rank_of, transpose

aten = torch.ops.aten


def pair_list(value: Any, count: int) -> list[int]:
    """An int or a sequence of ints, as ``count`` ints (``stride=2`` -> ``[2, 2]``)."""
    if isinstance(value, int):
        return [value] * count
    values = list(value)
    return values * count if len(values) == 1 else values


# ---- products --------------------------------------------------------------------------------


@register(["matmul", "bmm", "mm"])
def translate_matmul(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    return ctx.node("MatMul", [ctx.name(args[0]), ctx.name(argument(args, kwargs, 1, "other"))])


def linear_node(ctx: Any, x: str, rank: int, weight: Any, bias: Any) -> str:
    """``x @ weight.T + bias``: one Gemm for a 2-D input, else MatMul and Add."""
    if rank == 2:
        inputs = [x, ctx.name(weight)] + ([ctx.name(bias)] if bias is not None else [])
        return ctx.node("Gemm", inputs, transB=1)
    if isinstance(weight, torch.Tensor):  # transposed once, now
        weight_t = ctx.constant(weight.t().contiguous())
    else:
        weight_t = transpose(ctx, ctx.name(weight), 2, 0, 1)
    product = ctx.node("MatMul", [x, weight_t])
    return product if bias is None else ctx.node("Add", [product, ctx.name(bias)])


@register("linear")
def translate_linear(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    weight, bias = argument(args, kwargs, 1, "weight"), argument(args, kwargs, 2, "bias")
    return linear_node(ctx, ctx.name(args[0]), rank_of(ctx, args[0]), weight, bias)


@register("baddbmm")
def translate_baddbmm(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    """beta * input + alpha * (batch1 @ batch2)."""
    dtype = ctx.dtype_of(node)
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    batch1, batch2 = argument(args, kwargs, 1, "batch1"), argument(args, kwargs, 2, "batch2")
    product = ctx.node("MatMul", [ctx.name(batch1), ctx.name(batch2)])
    if alpha != 1:
        product = ctx.node("Mul", [product, ctx.constant(alpha, dtype=dtype)])
    if beta == 0:  # torch ignores input then, even NaN in it
        return product
    base = ctx.name(args[0])
    if beta != 1:
        base = ctx.node("Mul", [base, ctx.constant(beta, dtype=dtype)])
    return ctx.node("Add", [base, product])


@register("einsum")
def translate_einsum(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    operands = args[1:]
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = operands[0]
    return ctx.node("Einsum", [ctx.name(o) for o in operands], equation=args[0].replace(" ", ""))


# ---- convolution and pooling -----------------------------------------------------------------


def conv_node(
    ctx: Any,
    x: str,
    spatial: int,
    weight: Any,
    bias: Any,
    *,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
) -> str:
    shape = weight.shape if isinstance(weight, torch.Tensor) else ctx.shape_of(weight)
    kernel = list(shape[2:])
    dilations = pair_list(dilation, spatial)
    if padding == "same":
        totals = [d * (k - 1) for d, k in zip(dilations, kernel)]
        pads = [t // 2 for t in totals] + [t - t // 2 for t in totals]
    elif padding == "valid":
        pads = [0] * (2 * spatial)
    else:
        pads = pair_list(padding, spatial) * 2
    inputs = [x, ctx.name(weight)] + ([ctx.name(bias)] if bias is not None else [])
    return ctx.node(
        "Conv",
        inputs,
        strides=pair_list(stride, spatial),
        pads=pads,
        dilations=dilations,
        group=groups,
    )


@register(["conv1d", "conv2d", "conv3d"])
def translate_conv(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    return conv_node(
        ctx,
        ctx.name(args[0]),
        rank_of(ctx, args[0]) - 2,
        argument(args, kwargs, 1, "weight"),
        argument(args, kwargs, 2, "bias"),
        stride=argument(args, kwargs, 3, "stride", 1),
        padding=argument(args, kwargs, 4, "padding", 0),
        dilation=argument(args, kwargs, 5, "dilation", 1),
        groups=argument(args, kwargs, 6, "groups", 1),
    )


def pool_node(
    ctx: Any,
    op_type: str,
    x: str,
    spatial: int,
    *,
    kernel: Any,
    stride: Any,
    padding: Any,
    ceil_mode: bool,
    **extra: Any,
) -> str:
    stride = kernel if stride is None or stride == [] else stride
    return ctx.node(
        op_type,
        [x],
        kernel_shape=pair_list(kernel, spatial),
        strides=pair_list(stride, spatial),
        pads=pair_list(padding, spatial) * 2,
        ceil_mode=int(bool(ceil_mode)),
        **extra,
    )


@register(["max_pool1d", "max_pool2d", "max_pool3d"])
def translate_max_pool(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    if argument(args, kwargs, 6, "return_indices", False):
        raise UnsupportedArgument("max pooling with return_indices=True")
    return pool_node(
        ctx,
        "MaxPool",
        ctx.name(args[0]),
        rank_of(ctx, args[0]) - 2,
        kernel=argument(args, kwargs, 1, "kernel_size"),
        stride=argument(args, kwargs, 2, "stride"),
        padding=argument(args, kwargs, 3, "padding", 0),
        dilations=pair_list(argument(args, kwargs, 4, "dilation", 1), rank_of(ctx, args[0]) - 2),
        ceil_mode=argument(args, kwargs, 5, "ceil_mode", False),
    )


@register(["avg_pool1d", "avg_pool2d", "avg_pool3d"])
def translate_avg_pool(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    if argument(args, kwargs, 6, "divisor_override") is not None:
        raise UnsupportedArgument("average pooling with divisor_override")
    return pool_node(
        ctx,
        "AveragePool",
        ctx.name(args[0]),
        rank_of(ctx, args[0]) - 2,
        kernel=argument(args, kwargs, 1, "kernel_size"),
        stride=argument(args, kwargs, 2, "stride"),
        padding=argument(args, kwargs, 3, "padding", 0),
        ceil_mode=argument(args, kwargs, 4, "ceil_mode", False),
        count_include_pad=int(argument(args, kwargs, 5, "count_include_pad", True)),
    )


def adaptive_pool_node(
    ctx: Any, op_type: str, x: str, in_shape: tuple[int, ...], output_size: Any
) -> str:
    """Adaptive pooling: a global pool for 1x1, else a pool whose windows tile the input."""
    spatial = in_shape[2:]
    sizes = [s if o is None else o for s, o in zip(spatial, pair_list(output_size, len(spatial)))]
    if all(o == 1 for o in sizes):
        return ctx.node(f"Global{op_type}", [x])
    if any(s % o for s, o in zip(spatial, sizes)):
        raise UnsupportedArgument(
            f"adaptive pooling of {tuple(spatial)} to {tuple(sizes)}: sizes that do not divide"
        )
    kernel = [s // o for s, o in zip(spatial, sizes)]
    return ctx.node(op_type, [x], kernel_shape=kernel, strides=kernel)


@register(["adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d"])
def translate_adaptive_avg_pool(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    size = argument(args, kwargs, 1, "output_size")
    return adaptive_pool_node(ctx, "AveragePool", ctx.name(args[0]), ctx.shape_of(args[0]), size)


# F's forms only: torch's and ATen's also return the indices.
@register([F.adaptive_max_pool1d, F.adaptive_max_pool2d], pin=True)
def translate_adaptive_max_pool(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    size = argument(args, kwargs, 1, "output_size")
    return adaptive_pool_node(ctx, "MaxPool", ctx.name(args[0]), ctx.shape_of(args[0]), size)


# ---- normalisation ---------------------------------------------------------------------------


def affine_or_default(ctx: Any, value: Any, fill: float, shape: Any, dtype: torch.dtype) -> str:
    """A norm's weight or bias, or the constant it defaults to (ONNX norms want both)."""
    if value is not None:
        return cast_to(ctx, value, dtype)
    return ctx.constant(torch.full(list(shape), fill, dtype=dtype))


def batch_norm_node(
    ctx: Any, x: str, channels: int, dtype: torch.dtype, mean: Any, var: Any, weight: Any,
    bias: Any, eps: float,
) -> str:  # fmt: skip
    scale = affine_or_default(ctx, weight, 1.0, [channels], dtype)
    shift = affine_or_default(ctx, bias, 0.0, [channels], dtype)
    stats = [cast_to(ctx, mean, dtype), cast_to(ctx, var, dtype)]
    return ctx.node("BatchNormalization", [x, scale, shift, *stats], epsilon=float(eps))


# F.batch_norm's argument order: torch.batch_norm and ATen's put weight and bias first.
@register(F.batch_norm, pin=True)
def translate_batch_norm(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    if argument(args, kwargs, 5, "training", False):
        raise UnsupportedArgument("batch norm in training mode (call model.eval() first)")
    mean, var = argument(args, kwargs, 1, "running_mean"), argument(args, kwargs, 2, "running_var")
    if mean is None or var is None:
        raise UnsupportedArgument("batch norm without running statistics")
    return batch_norm_node(
        ctx,
        ctx.name(args[0]),
        ctx.shape_of(args[0])[1],
        ctx.dtype_of(node),
        mean,
        var,
        argument(args, kwargs, 3, "weight"),
        argument(args, kwargs, 4, "bias"),
        argument(args, kwargs, 7, "eps", 1e-5),
    )


def layer_norm_node(
    ctx: Any, x: str, normalized_shape: Any, dtype: torch.dtype, weight: Any, bias: Any,
    eps: float, outputs: int = 1,
) -> Any:  # fmt: skip
    shape = list(normalized_shape)
    scale = affine_or_default(ctx, weight, 1.0, shape, dtype)
    shift = affine_or_default(ctx, bias, 0.0, shape, dtype)
    return ctx.node(
        "LayerNormalization",
        [x, scale, shift],
        outputs=outputs,
        axis=-len(shape),
        epsilon=float(eps),
    )


@register("layer_norm")
def translate_layer_norm(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    return layer_norm_node(
        ctx,
        ctx.name(args[0]),
        argument(args, kwargs, 1, "normalized_shape"),
        ctx.dtype_of(node),
        argument(args, kwargs, 2, "weight"),
        argument(args, kwargs, 3, "bias"),
        argument(args, kwargs, 4, "eps", 1e-5),
    )


def group_norm_node(
    ctx: Any, x: str, shape: tuple[int, ...], dtype: torch.dtype, groups: int, weight: Any,
    bias: Any, eps: float,
) -> str:  # fmt: skip
    """Normalise over (C/G, spatial) per group: reshape to (N, G, -1), then the affine per C."""
    grouped = ctx.node("Reshape", [x, ctx.constant([0, groups, -1])])
    axes = ctx.constant([2])
    centred = ctx.node("Sub", [grouped, ctx.node("ReduceMean", [grouped, axes], keepdims=1)])
    variance = ctx.node("ReduceMean", [ctx.node("Mul", [centred, centred]), axes], keepdims=1)
    deviation = ctx.node("Sqrt", [ctx.node("Add", [variance, ctx.constant(eps, dtype=dtype)])])
    normalized = ctx.node("Div", [centred, deviation])
    y = ctx.node("Reshape", [normalized, ctx.node("Shape", [x])])
    per_channel = [shape[1]] + [1] * (len(shape) - 2)
    if weight is not None:
        scale = ctx.node("Reshape", [cast_to(ctx, weight, dtype), ctx.constant(per_channel)])
        y = ctx.node("Mul", [y, scale])
    if bias is not None:
        shift = ctx.node("Reshape", [cast_to(ctx, bias, dtype), ctx.constant(per_channel)])
        y = ctx.node("Add", [y, shift])
    return y


@register("group_norm")
def translate_group_norm(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    return group_norm_node(
        ctx,
        ctx.name(args[0]),
        ctx.shape_of(args[0]),
        ctx.dtype_of(node),
        argument(args, kwargs, 1, "num_groups"),
        argument(args, kwargs, 2, "weight"),
        argument(args, kwargs, 3, "bias"),
        argument(args, kwargs, 4, "eps", 1e-5),
    )


# ---- softmax ---------------------------------------------------------------------------------


def softmax_node(ctx: Any, op_type: str, x: Any, dim: int, node: Any) -> str:
    dtype = ctx.dtype_of(node)
    rank = len(ctx.shape_of(node))
    return ctx.node(op_type, [cast_to(ctx, x, dtype)], axis=normalized_dim(dim, rank))


def softmax(op_type: str) -> Any:
    def translate_softmax(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
        dim = argument(args, kwargs, 1, "dim")
        if dim is None:
            raise UnsupportedArgument("softmax without dim (give dim explicitly)")
        return softmax_node(ctx, op_type, args[0], dim, node)

    return translate_softmax


register("softmax")(softmax("Softmax"))
register("log_softmax")(softmax("LogSoftmax"))


# ---- reductions ------------------------------------------------------------------------------

REDUCTIONS = {
    "mean": "ReduceMean",
    "sum": "ReduceSum",
    "amax": "ReduceMax",
    "amin": "ReduceMin",
    "prod": "ReduceProd",
}


def reduce_node(ctx: Any, op_type: str, x: Any, axes: list[int], keepdim: bool, node: Any) -> str:
    source = cast_to(ctx, x, ctx.dtype_of(node))  # sum of bools/ints: in the result's dtype
    return ctx.node(op_type, [source, ctx.constant(axes)], keepdims=int(bool(keepdim)))


def reduction(op_type: str) -> Any:
    def translate_reduction(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
        dims = argument(args, kwargs, 1, "dim", kwargs.get("axis"))
        keepdim = argument(args, kwargs, 2, "keepdim", False)
        return reduce_node(ctx, op_type, args[0], reduce_axes(ctx, args[0], dims), keepdim, node)

    return translate_reduction


for _name, _op_type in REDUCTIONS.items():
    register(_name)(reduction(_op_type))


@register(["argmax", "argmin"])
def translate_argmax(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    op_type = (
        "ArgMin" if "argmin" in str(getattr(node.target, "__name__", node.target)) else "ArgMax"
    )
    dim = argument(args, kwargs, 1, "dim")
    keepdim = int(bool(argument(args, kwargs, 2, "keepdim", False)))
    x = ctx.name(args[0])
    if dim is None:  # over the flattened tensor
        x, dim = ctx.node("Reshape", [x, ctx.constant([-1])]), 0
    return ctx.node(
        op_type, [x], axis=normalized_dim(dim, max(rank_of(ctx, args[0]), 1)), keepdims=keepdim
    )


@register("norm")
def translate_norm(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    p = argument(args, kwargs, 1, "p", 2)
    if p not in (1, 2, "fro"):
        raise UnsupportedArgument(f"a norm with p={p!r} (1, 2 and 'fro' are translated)")
    dims = argument(args, kwargs, 2, "dim")
    keepdim = argument(args, kwargs, 3, "keepdim", False)
    op_type = "ReduceL1" if p == 1 else "ReduceL2"
    return reduce_node(ctx, op_type, args[0], reduce_axes(ctx, args[0], dims), keepdim, node)


@register("topk")
def translate_topk(ctx: Any, node: Any, args: tuple, kwargs: dict) -> tuple[str, ...]:
    k = argument(args, kwargs, 1, "k")
    dim = normalized_dim(argument(args, kwargs, 2, "dim", -1), rank_of(ctx, args[0]))
    largest = int(bool(argument(args, kwargs, 3, "largest", True)))
    sorted_ = int(bool(argument(args, kwargs, 4, "sorted", True)))
    k_name = ctx.node("Reshape", [cast_to(ctx, k, torch.int64), ctx.constant([1])])
    return ctx.node(
        "TopK", [ctx.name(args[0]), k_name], outputs=2, axis=dim, largest=largest, sorted=sorted_
    )


@register("cumsum")
def translate_cumsum(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    dim = normalized_dim(argument(args, kwargs, 1, "dim"), rank_of(ctx, args[0]))
    x = cast_to(ctx, args[0], ctx.dtype_of(node))
    return ctx.node("CumSum", [x, ctx.constant(dim)])


# ---- embedding and attention -----------------------------------------------------------------


@register(F.embedding, pin=True)  # (input, weight); torch.embedding, aten.embedding: onnx_ops_aten
def translate_embedding(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    if argument(args, kwargs, 3, "max_norm") is not None:
        raise UnsupportedArgument("embedding with max_norm (it renormalises the weight in place)")
    weight, indices = argument(args, kwargs, 1, "weight"), args[0]
    return ctx.node("Gather", [ctx.name(weight), cast_to(ctx, indices, torch.int64)], axis=0)


def attention_node(
    ctx: Any, node: Any, query: Any, key: Any, value: Any, mask: Any, is_causal: bool,
    scale: float | None,
) -> str:  # fmt: skip
    """softmax(q k^T * scale + mask) v, with a boolean mask as -inf where False."""
    q_shape, k_shape = ctx.shape_of(query), ctx.shape_of(key)
    dtype = ctx.dtype_of(query)
    if len(q_shape) != len(k_shape) or q_shape[:-3] != k_shape[:-3] and q_shape[-3] != k_shape[-3]:
        raise UnsupportedArgument("attention with grouped query heads (enable_gqa)")
    scale = 1 / math.sqrt(q_shape[-1]) if scale is None else scale
    key_t = transpose(ctx, ctx.name(key), len(k_shape), len(k_shape) - 2, len(k_shape) - 1)
    scores = ctx.node("MatMul", [ctx.name(query), key_t])
    scores = ctx.node("Mul", [scores, ctx.constant(scale, dtype=dtype)])
    if is_causal:
        length, source = q_shape[-2], k_shape[-2]
        mask = torch.ones(length, source, dtype=torch.bool).tril(diagonal=source - length)
    if mask is not None:
        mask_dtype = mask.dtype if isinstance(mask, torch.Tensor) else ctx.dtype_of(mask)
        if mask_dtype == torch.bool:
            filler = ctx.constant(float("-inf"), dtype=dtype)
            scores = ctx.node("Where", [ctx.name(mask), scores, filler])
        else:
            scores = ctx.node("Add", [scores, cast_to(ctx, mask, dtype)])
    weights = ctx.node("Softmax", [scores], axis=-1)
    return ctx.node("MatMul", [weights, ctx.name(value)])


@register("scaled_dot_product_attention")
def translate_sdpa(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    if argument(args, kwargs, 4, "dropout_p", 0.0):
        raise UnsupportedArgument("attention with dropout_p > 0 (call model.eval() first)")
    if kwargs.get("enable_gqa"):
        raise UnsupportedArgument("attention with enable_gqa=True")
    return attention_node(
        ctx,
        node,
        args[0],
        args[1],
        args[2],
        argument(args, kwargs, 3, "attn_mask"),
        argument(args, kwargs, 5, "is_causal", False),
        kwargs.get("scale"),
    )
