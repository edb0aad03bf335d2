"""FLOP formulas for ATen operators: the ``call_function`` targets of exported graphs.

An exported graph (``fxloom.export``) calls ``torch.ops.aten`` overloads (``aten.addmm.default``,
``aten.convolution.default``). This module registers them in ``fxloom.ops.flops``'s one table,
``FLOP_FORMULAS``, whose rows are operator keys (``fxloom.ops.identity``): an ATen operator
named like a torch function or Tensor method (``aten.add.Tensor``, ``aten.addmm.default``,
``aten.gelu.default``) already has its row there, the same one ``torch.add`` and ``"add"``
hit, so a model costs the same traced or exported:

    >>> import torch
    >>> from fxloom.ops.flops import find_flop_formula
    >>> aten = torch.ops.aten
    >>> find_flop_formula("call_function", aten.addmm.default).__name__
    '_matmul_plus_bias'
    >>> find_flop_formula("call_function", aten.native_layer_norm.default).__name__
    '_functional_normalisation'

This module adds the names only ATen has: its data movement, a few element-wise operators,
and its own forms of convolution, normalisation, pooling and attention, whose formulas read
arguments by name (``OpShapes.named``), as the schemas place them differently.

Depends on: ``fxloom.ops.flops``.
"""

from __future__ import annotations

from fxloom.ops.flops import (
    FlopCount,
    OpShapes,
    _elementwise,
    _free,
    _functional_batch_norm,
    _functional_conv,
    _functional_conv_transpose,
    _functional_normalisation,
    _functional_pool,
    _functional_rms_norm,
    _per_input_element,
    _register_all,
    _scaled_dot_product_attention,
    _softmax,
    numel,
)

__all__: list[str] = []


# ATen-only names: activations (one FLOP per output element) and data movement (free).
_ATEN_ELEMENTWISE = (
    "_prelu_kernel", "log_sigmoid_forward", "rsub", "xlogy", "hypot", "atan2", "sgn",
    "bitwise_xor", "logical_xor", "isfinite",
)  # fmt: skip
_ATEN_FREE = (
    "_to_copy", "_unsafe_view", "alias", "slice", "slice_scatter", "select_scatter",
    "diagonal_scatter", "as_strided_scatter", "index", "_unsafe_index", "_unsafe_index_put",
    "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "replication_pad1d",
    "replication_pad2d", "lift_fresh_copy", "split_with_sizes", "empty_strided",
    "new_empty_strided", "scatter_add", "native_dropout", "bernoulli", "expand_copy",
    "view_copy", "permute_copy", "squeeze_copy", "unsqueeze_copy", "pixel_shuffle",
    "pixel_unshuffle", "upsample_nearest1d", "upsample_nearest2d", "_assert_tensor_metadata",
    "_assert_scalar", "sym_constrain_range_for_size", "channel_shuffle", "eye",
)  # fmt: skip
_register_all(_ATEN_ELEMENTWISE, _elementwise)
_register_all(_ATEN_FREE, _free)
_register_all(("_softmax", "_log_softmax", "_safe_softmax"), _softmax)
_register_all(("linalg_vector_norm",), _per_input_element)


# ------------------------------------------------------------------------- convolution
def _aten_convolution(op: OpShapes) -> FlopCount:
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    if op.named("transposed", False):
        return _functional_conv_transpose(op)
    return _functional_conv(op)


_register_all(("convolution", "_convolution"), _aten_convolution)

# ----------------------------------------------------------------------- normalisation
# ATen's own forms of the operators ``fxloom.ops.flops`` counts; formulas read arguments by name.
_register_all(
    (
        "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
        "_native_batch_norm_legit_no_training", "cudnn_batch_norm", "miopen_batch_norm",
    ),
    _functional_batch_norm,
)  # fmt: skip
_register_all(("native_layer_norm", "native_group_norm"), _functional_normalisation)
_register_all(("_fused_rms_norm",), _functional_rms_norm)


def _aten_weight_norm(op: OpShapes) -> FlopCount:
    # w = g * v / ||v||: the norm squares and adds each element of v, the scaling multiplies it.
    return FlopCount(3 * numel(op.named("v")))


_register_all(("_weight_norm_interface", "_weight_norm"), _aten_weight_norm)

# ----------------------------------------------------------------------------- pooling
_register_all(
    ("max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices"),
    _functional_pool,
)
_register_all(("_adaptive_avg_pool2d", "_adaptive_avg_pool3d"), _per_input_element)

# --------------------------------------------------------------------------- attention
_register_all(
    (
        "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention_overrideable",
    ),
    _scaled_dot_product_attention,
)  # fmt: skip
