"""ONNX translations of ``call_module`` nodes: one handler per nn.Module class.

A module handler reads the module's settings and tensors (``ctx.module(node)``) and emits the
same nodes as the functional form (the ``*_node`` helpers of ``onnx_ops_nn``). Modules that
behave differently in training (dropout, batch norm) are translated in eval mode only;
``refuses`` says so before translation starts. Activation modules share the function handlers
through a table of (module class, handler of the function, the module's arguments).

Depends on: ``onnx_ops``, ``onnx_ops_nn``, ``onnx_ops_elementwise``, ``onnx_ops_shapes``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from fxloom.lower import onnx_ops_elementwise as elementwise
from fxloom.lower import onnx_ops_nn as nn_ops
from fxloom.lower.onnx_ops import UnsupportedArgument, normalized_dim, register
from fxloom.lower.onnx_ops_shapes import flatten, rank_of


def training_refusal(node: Any, module: Any) -> str | None:
    called = module.get_submodule(str(node.target))
    if called.training:
        return f"{type(called).__name__} in training mode (call model.eval() first)"
    return None


# Activation modules: the functional handler, and the module's attributes as its arguments.
ACTIVATION_MODULES = {
    nn.ReLU: (elementwise.unary("Relu"), ()),
    nn.Sigmoid: (elementwise.unary("Sigmoid"), ()),
    nn.Tanh: (elementwise.unary("Tanh"), ()),
    nn.SELU: (elementwise.unary("Selu"), ()),
    nn.GELU: (elementwise.translate_gelu, ("approximate",)),
    nn.SiLU: (elementwise.translate_silu, ()),
    nn.Mish: (elementwise.translate_mish, ()),
    nn.Softplus: (elementwise.translate_softplus, ("beta",)),
    nn.Hardswish: (elementwise.translate_hardswish, ()),
    nn.Hardsigmoid: (elementwise.translate_hardsigmoid, ()),
    nn.LeakyReLU: (elementwise.translate_leaky_relu, ("negative_slope",)),
    nn.ELU: (elementwise.translate_elu, ("alpha",)),
    nn.Hardtanh: (elementwise.translate_hardtanh, ("min_val", "max_val")),  # ReLU6 too
    nn.Softmax: (nn_ops.softmax("Softmax"), ("dim",)),
    nn.LogSoftmax: (nn_ops.softmax("LogSoftmax"), ("dim",)),
}


def activation_module(function_handler: Any, attributes: tuple[str, ...]) -> Any:
    def translate_activation_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
        module = ctx.module(node)
        settings = tuple(getattr(module, a) for a in attributes)
        return function_handler(ctx, node, (args[0], *settings), {})

    return translate_activation_module


for _cls, (_handler, _attributes) in ACTIVATION_MODULES.items():
    register(_cls)(activation_module(_handler, _attributes))


@register([nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout],
          refuses=lambda node, module: None if isinstance(module.get_submodule(str(node.target)), nn.Identity) else training_refusal(node, module))  # fmt: skip
def translate_identity_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    if ctx.module(node).training and not isinstance(ctx.module(node), nn.Identity):
        raise UnsupportedArgument("dropout in training mode (call model.eval() first)")
    return ctx.node("Identity", [ctx.name(args[0])])


@register(nn.Linear)
def translate_linear_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    module = ctx.module(node)
    x, rank = ctx.name(args[0]), rank_of(ctx, args[0])
    return nn_ops.linear_node(ctx, x, rank, module.weight, module.bias)


def conv_refusal(node: Any, module: Any) -> str | None:
    conv = module.get_submodule(str(node.target))
    if conv.padding_mode != "zeros":
        return f"convolution with padding_mode={conv.padding_mode!r}"
    return None


@register([nn.Conv1d, nn.Conv2d, nn.Conv3d], refuses=conv_refusal)
def translate_conv_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    conv = ctx.module(node)
    return nn_ops.conv_node(
        ctx,
        ctx.name(args[0]),
        rank_of(ctx, args[0]) - 2,
        conv.weight,
        conv.bias,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=conv.groups,
    )


@register([nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d], refuses=training_refusal)
def translate_batch_norm_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    bn = ctx.module(node)
    if bn.training or bn.running_mean is None:
        raise UnsupportedArgument("batch norm in training mode or without running statistics")
    return nn_ops.batch_norm_node(
        ctx,
        ctx.name(args[0]),
        bn.num_features,
        ctx.dtype_of(node),
        bn.running_mean,
        bn.running_var,
        bn.weight,
        bn.bias,
        bn.eps,
    )


@register(nn.LayerNorm)
def translate_layer_norm_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    ln = ctx.module(node)
    return nn_ops.layer_norm_node(
        ctx, ctx.name(args[0]), ln.normalized_shape, ctx.dtype_of(node), ln.weight, ln.bias, ln.eps
    )


@register(nn.GroupNorm)
def translate_group_norm_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    gn = ctx.module(node)
    return nn_ops.group_norm_node(
        ctx,
        ctx.name(args[0]),
        ctx.shape_of(args[0]),
        ctx.dtype_of(node),
        gn.num_groups,
        gn.weight,
        gn.bias,
        gn.eps,
    )


@register(nn.Embedding, refuses=lambda node, module: (
    "embedding with max_norm" if module.get_submodule(str(node.target)).max_norm else None))  # fmt: skip
def translate_embedding_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    embedding = ctx.module(node)
    return nn_ops.translate_embedding(ctx, node, (args[0], embedding.weight), {})


@register([nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d])
def translate_max_pool_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    pool = ctx.module(node)
    if pool.return_indices:
        raise UnsupportedArgument("max pooling with return_indices=True")
    spatial = rank_of(ctx, args[0]) - 2
    return nn_ops.pool_node(
        ctx,
        "MaxPool",
        ctx.name(args[0]),
        spatial,
        kernel=pool.kernel_size,
        stride=pool.stride,
        padding=pool.padding,
        ceil_mode=pool.ceil_mode,
        dilations=nn_ops.pair_list(pool.dilation, spatial),
    )


@register([nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d])
def translate_avg_pool_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    pool = ctx.module(node)
    if getattr(pool, "divisor_override", None) is not None:
        raise UnsupportedArgument("average pooling with divisor_override")
    return nn_ops.pool_node(
        ctx,
        "AveragePool",
        ctx.name(args[0]),
        rank_of(ctx, args[0]) - 2,
        kernel=pool.kernel_size,
        stride=pool.stride,
        padding=pool.padding,
        ceil_mode=pool.ceil_mode,
        count_include_pad=int(pool.count_include_pad),
    )


@register([nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d])
def translate_adaptive_avg_pool_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    size = ctx.module(node).output_size
    return nn_ops.adaptive_pool_node(
        ctx, "AveragePool", ctx.name(args[0]), ctx.shape_of(args[0]), size
    )


@register([nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d])
def translate_adaptive_max_pool_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    size = ctx.module(node).output_size
    return nn_ops.adaptive_pool_node(ctx, "MaxPool", ctx.name(args[0]), ctx.shape_of(args[0]), size)


@register(nn.Flatten)
def translate_flatten_module(ctx: Any, node: Any, args: tuple, kwargs: dict) -> str:
    module, shape = ctx.module(node), ctx.shape_of(args[0])
    start, end = (normalized_dim(d, len(shape)) for d in (module.start_dim, module.end_dim))
    return flatten(ctx, ctx.name(args[0]), shape, start, end)
