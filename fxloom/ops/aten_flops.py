"""FLOP formulas for ATen operators: the ``call_function`` targets of exported graphs.

An exported graph (``fxloom.export``) calls ``torch.ops.aten`` overloads (``aten.addmm.default``,
``aten.convolution.default``). This module registers them in ``fxloom.ops.flops``'s one table,
``FLOP_FORMULAS``, keyed by overload packet (``aten.add`` covers ``aten.add.Tensor`` and
``aten.add.Scalar``; ``find_flop_formula`` looks an overload up, then its packet), with the
conventions of ``fxloom.ops.flops``, so a model costs the same traced or exported:

    >>> import torch
    >>> from fxloom.ops.flops import find_flop_formula
    >>> aten = torch.ops.aten
    >>> find_flop_formula("call_function", aten.addmm.default).__name__
    '_matmul_plus_bias'
    >>> find_flop_formula("call_function", aten.gelu.default).__name__
    '_elementwise'

Operators named like a tensor method (``add``, ``sum``, ``view``...) reuse the method's row
(the name lists of ``fxloom.ops.flops``); the rest are here: ATen's own data movement, its
activations, and its forms of convolution, normalisation, pooling and attention, whose
arguments formulas read by name from the operator's schema (``aten_argument``).

Depends on: torch (``torch.ops.aten``), ``fxloom.ops.flops``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fxloom.ops.flops import (
    _ELEMENTWISE_NAMES,
    _FREE_NAMES,
    _MAYBE_VIEW_NAMES,
    _REDUCTION_NAMES,
    _SOFTMAX,
    _VIEW_NAMES,
    FLOP_FORMULAS,
    FlopCount,
    Formula,
    OpShapes,
    _attention_core,
    _elementwise,
    _free,
    _functional_conv,
    _functional_conv_transpose,
    _functional_linear,
    _matmul,
    _matmul_plus_bias,
    _per_input_element,
    _softmax,
    _window,
    numel,
    tensor_metas,
)

__all__ = ["aten_argument", "aten_packets"]

aten = torch.ops.aten


def aten_packets(*names: str) -> list[Any]:
    """``torch.ops.aten.<name>`` for each name ATen has in this torch version."""
    packets = []
    for name in names:
        try:
            packets.append(getattr(aten, name))
        except (AttributeError, RuntimeError):  # a Python-only name (T), or gone
            continue
    return packets


def aten_argument(op: OpShapes, name: str, default: Any = None) -> Any:
    """The argument called ``name`` in the node's ATen schema (positional or keyword).

    Overloads of one operator place their arguments differently
    (``_native_batch_norm_legit_no_training`` has no ``training``); names don't move.
    """
    schema = getattr(op.node.target, "_schema", None)
    if schema is None:
        return op.kwargs.get(name, default)
    for index, argument in enumerate(schema.arguments):
        if argument.name == name:
            return op.arg(index, name, default)
    return default


def _first_output_numel(op: OpShapes) -> int:
    """Elements of the first result: ATen's forms also return indices and saved statistics."""
    outputs = tensor_metas(op.out)
    return numel(outputs[0]) if outputs else 0


def _register(names_or_packets: Any, formula: Formula) -> None:
    for packet in names_or_packets:
        FLOP_FORMULAS[packet] = formula


# ------------------------------------------------ rows shared with the tensor methods' names
_register(aten_packets(*_ELEMENTWISE_NAMES), _elementwise)
_register(aten_packets(*_REDUCTION_NAMES, "linalg_vector_norm"), _per_input_element)
_register(aten_packets(*_SOFTMAX, "_softmax", "_log_softmax", "_safe_softmax"), _softmax)
_register(aten_packets(*_VIEW_NAMES, *_MAYBE_VIEW_NAMES, *_FREE_NAMES), _free)
_register(aten_packets("mm", "bmm", "matmul"), _matmul)
_register(aten_packets("addmm", "baddbmm", "addmv"), _matmul_plus_bias)
_register(aten_packets("linear"), _functional_linear)

# ATen-only names: activations (one FLOP per output element) and data movement (free).
_ATEN_ELEMENTWISE = (
    "gelu", "silu", "mish", "elu", "celu", "selu", "leaky_relu", "hardtanh", "hardswish",
    "hardsigmoid", "softplus", "softshrink", "hardshrink", "threshold", "glu", "prelu",
    "_prelu_kernel", "relu6", "log_sigmoid_forward", "rsub", "xlogy", "hypot", "atan2",
    "sgn", "bitwise_xor", "logical_xor", "isfinite",
)  # fmt: skip
_ATEN_FREE = (
    "_to_copy", "_unsafe_view", "alias", "slice", "slice_scatter", "select_scatter",
    "diagonal_scatter", "as_strided_scatter", "index", "_unsafe_index", "index_put",
    "_unsafe_index_put", "embedding", "constant_pad_nd", "reflection_pad1d", "reflection_pad2d",
    "replication_pad1d", "replication_pad2d", "lift_fresh_copy", "copy", "split_with_sizes",
    "empty_strided", "new_empty_strided", "scatter_add", "native_dropout", "dropout",
    "bernoulli", "expand_copy", "view_copy", "permute_copy", "squeeze_copy", "unsqueeze_copy",
    "pixel_shuffle", "pixel_unshuffle", "upsample_nearest1d", "upsample_nearest2d",
    "_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size", "channel_shuffle",
    "fill", "eye",
)  # fmt: skip
_register(aten_packets(*_ATEN_ELEMENTWISE), _elementwise)
_register(aten_packets(*_ATEN_FREE), _free)


# ------------------------------------------------------------------------- convolution
def _aten_convolution(op: OpShapes) -> FlopCount:
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    if aten_argument(op, "transposed", False):
        return _functional_conv_transpose(op)
    return _functional_conv(op)


_register(
    aten_packets("convolution", "_convolution", "conv2d", "conv1d", "conv3d"), _aten_convolution
)


# ----------------------------------------------------------------------- normalisation
def _aten_batch_norm(op: OpShapes) -> FlopCount:
    # Statistics are computed in training, and always without running statistics (no_stats).
    computes_statistics = bool(aten_argument(op, "training", False)) or (
        aten_argument(op, "running_mean") is None
    )
    affine = aten_argument(op, "weight") is not None
    per_element = 2 + (2 if computes_statistics else 0) + (2 if affine else 0)
    return FlopCount(_first_output_numel(op) * per_element)


def _aten_layer_or_group_norm(op: OpShapes) -> FlopCount:
    affine = aten_argument(op, "weight") is not None
    return FlopCount(_first_output_numel(op) * (5 + (2 if affine else 0)))


def _aten_rms_norm(op: OpShapes) -> FlopCount:
    affine = aten_argument(op, "weight") is not None
    return FlopCount(_first_output_numel(op) * (3 + (1 if affine else 0)))


_register(
    aten_packets(
        "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
        "_native_batch_norm_legit_no_training", "batch_norm", "cudnn_batch_norm",
        "miopen_batch_norm",
    ),
    _aten_batch_norm,
)  # fmt: skip
_register(
    aten_packets("native_layer_norm", "layer_norm", "native_group_norm", "group_norm"),
    _aten_layer_or_group_norm,
)
_register(aten_packets("_fused_rms_norm", "rms_norm"), _aten_rms_norm)


def _aten_weight_norm(op: OpShapes) -> FlopCount:
    # w = g * v / ||v||: the norm squares and adds each element of v, the scaling multiplies it.
    return FlopCount(3 * numel(aten_argument(op, "v")))


_register(aten_packets("_weight_norm_interface", "_weight_norm"), _aten_weight_norm)


# ----------------------------------------------------------------------------- pooling
def _aten_pool(op: OpShapes) -> FlopCount:
    # One comparison (max) or addition (average) per window element per output.
    spatial_dims = len(aten_argument(op, "self").shape) - 2
    window = _window(aten_argument(op, "kernel_size"), spatial_dims)
    return FlopCount(_first_output_numel(op) * window)


_register(
    aten_packets(
        "max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices",
        "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d",
        "avg_pool3d",
    ),
    _aten_pool,
)  # fmt: skip
_register(
    aten_packets(
        "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_avg_pool1d",
        "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool1d",
        "adaptive_max_pool2d", "adaptive_max_pool3d",
    ),
    _per_input_element,  # every input element joins exactly one window
)  # fmt: skip


# --------------------------------------------------------------------------- attention
def _aten_attention(op: OpShapes) -> FlopCount:
    """softmax(q k^T * scale + mask) v, as ``F.scaled_dot_product_attention`` counts it."""
    query, key, value = (aten_argument(op, name) for name in ("query", "key", "value"))
    batch_heads, queries, keys = math.prod(query.shape[:-2]), query.shape[-2], key.shape[-2]
    core = _attention_core(batch_heads, queries, keys, query.shape[-1], value.shape[-1])
    scores = batch_heads * queries * keys
    masked = (
        aten_argument(op, "attn_mask") is not None or aten_argument(op, "attn_bias") is not None
    )
    return FlopCount(core.flops + (scores if masked else 0), core.macs)


_register(
    aten_packets(
        "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
    ),
    _aten_attention,
)  # fmt: skip
