"""ONNX translations of the ATen operators in exported programs (``fxloom.export``).

Most ATen operators share a handler with their torch function (the row of their operator key,
in the other families); this module holds ATen's own operators and, pinned to the ATen
spelling, the ones whose arguments differ from torch's.

Depends on: ``onnx_ops``, ``onnx_ops_nn``.
"""

from __future__ import annotations

from typing import Any

import torch

from fxloom.lower import onnx_ops_nn as nn_ops
from fxloom.lower.onnx_ops import UnsupportedArgument, argument, cast_to, register
from fxloom.lower.onnx_ops_shapes import gather_nd, index_refusal, rank_of

aten = torch.ops.aten

# ATen's own names for operators torch spells otherwise (the shared names, ``aten.mm`` or
# ``aten.softmax``, find torch's row through their operator key).
register("_softmax")(nn_ops.softmax("Softmax"))
register("_log_softmax")(nn_ops.softmax("LogSoftmax"))
register("_adaptive_avg_pool2d")(nn_ops.translate_adaptive_avg_pool)

# Outputs of ATen operators that inference graphs never read (saved statistics, indices):
# left unnamed, so that a graph reading one fails ONNX's checker instead of running wrong.
UNUSED = ""


@register([aten.convolution, aten._convolution])
def translate_aten_convolution(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    x, weight, bias, stride, padding, dilation, transposed = args[:7]
    if transposed:
        raise UnsupportedArgument("transposed convolution")
    return nn_ops.conv_node(
        ctx,
        ctx.name(x),
        rank_of(ctx, x) - 2,
        weight,
        bias,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=args[8],
    )


@register([aten.addmm, torch.addmm])
def translate_addmm(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    """beta * bias + alpha * (a @ b): one Gemm."""
    bias, a, b = args[0], args[1], args[2]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    inputs = [ctx.name(a), ctx.name(b), ctx.name(bias)]
    return ctx.node("Gemm", inputs, alpha=float(alpha), beta=float(beta))


@register(aten._native_batch_norm_legit_no_training)
def translate_aten_batch_norm(ctx: Any, node: Any, args: tuple, kwargs: dict) -> tuple:
    x, weight, bias, mean, var, _momentum, eps = args[:7]
    channels = ctx.shape_of(x)[1]
    out = nn_ops.batch_norm_node(
        ctx, ctx.name(x), channels, ctx.dtype_of(x), mean, var, weight, bias, eps
    )
    return (out, UNUSED, UNUSED)


@register(aten.native_layer_norm)
def translate_aten_layer_norm(ctx: Any, node: Any, args: tuple, kwargs: dict) -> tuple:
    x, normalized_shape, weight, bias, eps = args[:5]
    dtype = ctx.dtype_of(x)
    return nn_ops.layer_norm_node(
        ctx, ctx.name(x), normalized_shape, dtype, weight, bias, eps, outputs=3
    )


@register(aten.native_group_norm)
def translate_aten_group_norm(ctx: Any, node: Any, args: tuple, kwargs: dict) -> tuple:
    x, weight, bias, _n, _c, _hw, groups, eps = args[:8]
    out = nn_ops.group_norm_node(
        ctx, ctx.name(x), ctx.shape_of(x), ctx.dtype_of(x), groups, weight, bias, eps
    )
    return (out, UNUSED, UNUSED)


@register("embedding")  # (weight, indices), as torch.embedding; F.embedding is pinned
def translate_aten_embedding(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    weight, indices = args[0], args[1]
    return ctx.node("Gather", [ctx.name(weight), cast_to(ctx, indices, torch.int64)], axis=0)


def _aten_index_refusal(node: Any, module: Any) -> str | None:
    indices = node.args[1]
    if any(i is None for i in indices):
        return "aten.index with None among its indices (a dimension skipped)"
    return index_refusal(tuple(indices))


@register(aten.index, refuses=_aten_index_refusal)
def translate_aten_index(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    """``x[i, j]`` with integer tensors over the leading dimensions (``padding_mask[b, k]`` of
    transformers' masks), as the getitem it was."""
    return gather_nd(ctx, ctx.name(args[0]), list(args[1]))


@register(aten.max_pool2d_with_indices)
def translate_aten_max_pool_with_indices(ctx: Any, node: Any, args: tuple, kwargs: dict) -> tuple:
    return (nn_ops.translate_max_pool(ctx, node, args[:6], {}), UNUSED)


@register(
    [
        aten._scaled_dot_product_flash_attention_for_cpu,
        aten._scaled_dot_product_flash_attention,
        aten._scaled_dot_product_efficient_attention,
    ]
)
def translate_aten_attention(ctx: Any, node: Any, args: tuple, kwargs: dict) -> tuple:
    q, k, v = args[:3]
    is_causal = argument(args, kwargs, 4, "is_causal", False)
    mask = kwargs.get("attn_mask")
    out = nn_ops.attention_node(ctx, node, q, k, v, mask, is_causal, kwargs.get("scale"))
    return (out, UNUSED)


@register(aten.rsub)
def translate_rsub(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    """other - alpha * x."""
    dtype = ctx.dtype_of(node)
    x = cast_to(ctx, args[0], dtype)
    alpha = argument(args, kwargs, 2, "alpha", 1)
    if alpha != 1:
        x = ctx.node("Mul", [x, ctx.constant(alpha, dtype=dtype)])
    return ctx.node("Sub", [cast_to(ctx, args[1], dtype), x])
