"""FLOP formulas: how much arithmetic each operator does, in tables keyed by target.

Conventions (the ones fvcore and ptflops use for "MACs"):

* a multiply-add is **one MAC and two FLOPs**; ``macs`` counts only the multiply-adds of
  contractions (matmul, linear, convolution, einsum, attention), so a ResNet-50 at 224x224 is
  4.09 GMACs;
* element-wise work (activations, adds, bias adds, comparisons) is one FLOP per output element,
  transcendental functions included; reductions one FLOP per input element; softmax five per
  element (max, subtract, exp, sum, divide);
* normalisation: batch norm 2 FLOPs per element to normalise with running statistics, 2 more
  to compute them (training), 2 more for the affine scale and shift; layer/group/instance norm 5
  per element (statistics and normalisation) plus 2 if affine; RMS norm 3, plus 1 if affine;
* data movement (views, reshapes, indexing, concatenation, casts, embedding lookups, dropout)
  is free.

``FLOP_FORMULAS`` maps a key to a formula: an operator's key (``fxloom.ops.identity``: ``"matmul"``
stands for ``torch.matmul``, ``operator.matmul``, the method ``"matmul"``, ``aten.matmul`` and
the in-place twins of such names), an ``nn.Module`` class for ``call_module`` (subclasses match
through their MRO; module rows read the module's attributes), or any other callable or method
name, matched as it is. Exported graphs' ATen-only operators are registered in
``fxloom.ops.aten_flops``. A formula
takes an ``OpShapes`` (the node's arguments with each node replaced by its ``tensor_meta``,
its output's ``tensor_meta``, and the module for ``call_module``) and returns a ``FlopCount``
(or an int: FLOPs without MACs). Add your own with ``register_flop_formula``:

    >>> from fxloom.passes.cost import FlopCount, register_flop_formula
    >>> def pairwise_sq_distances(x, y):  # (n, d), (m, d) -> (n, m)
    ...     return (x[:, None] - y[None]).pow(2).sum(-1)
    >>> @register_flop_formula(pairwise_sq_distances)
    ... def pairwise_flops(op):
    ...     x = op.args[0]  # its TensorMetadata
    ...     return FlopCount.of_macs(op.out_numel * x.shape[-1], extra_flops=op.out_numel * x.shape[-1])
    >>> pairwise_flops.__name__
    'pairwise_flops'

Views and reshapes (``fxloom.ops.effects.VIEW_OPS``, ``VIEW_IF_CONTIGUOUS``) are free.

A tensor is described by anything with a ``shape`` and a torch ``dtype``: the ``TensorMetadata``
that ``ShapeProp`` records (``fxloom.passes.shape_prop``), or a tensor itself (a meta tensor).

Depends on: torch, ``fxloom.ops`` (``identity``, ``effects``, ``signatures``) and ``fxloom.pytree`` (nestings of tensor
descriptions). Formulas may see a ``Node`` (a value that was not recorded), never imported here.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from fxloom.ops.effects import VIEW_IF_CONTIGUOUS, VIEW_OPS
from fxloom.ops.identity import OpTable
from fxloom.ops.signatures import parameter_names
from fxloom.pytree import tree_leaves

if TYPE_CHECKING:
    from fxloom.node import Node

__all__ = [
    "FLOP_FORMULAS",
    "FlopCount",
    "OpShapes",
    "find_flop_formula",
    "describes_tensor",
    "first_output_numel",
    "numel",
    "register_flop_formula",
]


class FlopCount(NamedTuple):
    """The arithmetic of one operation: ``flops`` in all, of which ``macs`` multiply-adds."""

    flops: int
    macs: int = 0

    @classmethod
    def of_macs(cls, macs: int, extra_flops: int = 0) -> FlopCount:
        """``macs`` multiply-adds (2 FLOPs each) plus ``extra_flops`` (a bias add, a softmax).

        >>> FlopCount.of_macs(10, extra_flops=3)
        FlopCount(flops=23, macs=10)
        """
        return cls(2 * macs + extra_flops, macs)


def describes_tensor(value: Any) -> bool:
    """Whether ``value`` describes one tensor: it has a ``shape`` and a torch ``dtype``."""
    return isinstance(getattr(value, "dtype", None), torch.dtype) and hasattr(value, "shape")


def numel(meta: Any) -> int:
    """Elements of the tensor(s) ``meta`` describes (a ``TensorMetadata`` or a nesting of them)."""
    return sum(math.prod(tensor.shape) for tensor in tensor_metas(meta))


def tensor_metas(meta: Any) -> list[Any]:
    """The tensor descriptions in ``meta`` (one, or any nesting of them), in order."""
    # A TensorMetadata is a NamedTuple, yet one tensor: the walk stops at it (also at the top).
    leaves = tree_leaves(meta, is_leaf=describes_tensor)
    return [leaf for leaf in leaves if describes_tensor(leaf)]


@dataclass(frozen=True)
class OpShapes:
    """What a FLOP formula sees of one node.

    ``args``/``kwargs`` are the node's, with every node replaced by its ``tensor_meta`` (a
    ``TensorMetadata``, or a nesting of them); a node whose value holds no tensor (an int
    computed at run time) stays a ``Node``, as its value is not recorded. ``out`` is the node's
    own ``tensor_meta``; ``module`` the submodule a ``call_module`` node calls (else ``None``).
    """

    node: Node
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any
    module: nn.Module | None = None

    @property
    def out_numel(self) -> int:
        """Elements of the output (of all its tensors, for a nested output)."""
        return numel(self.out)

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        """The argument at position ``index`` or keyword ``name`` (else ``default``)."""
        if index < len(self.args):
            return self.args[index]
        return self.kwargs.get(name, default)

    def named(self, name: str, default: Any = None) -> Any:
        """The argument called ``name``, wherever this spelling puts it (``parameter_names``).

        Spellings of one operator order their arguments differently (``F.batch_norm`` and
        ``aten.batch_norm``); names don't move.
        """
        names = parameter_names(self.node.target)
        if name in names:
            return self.arg(names.index(name), name, default)
        return self.kwargs.get(name, default)

    def tensor_args(self) -> list[Any]:
        """The ``TensorMetadata`` of the positional tensor arguments, in order."""
        return [arg for arg in self.args if describes_tensor(arg)]


Formula = Callable[[OpShapes], "FlopCount | int"]
# Rows by operator key (in-place twins cost what their operator does), module class, or as given.
FLOP_FORMULAS: OpTable = OpTable(in_place=True)


def register_flop_formula(*targets: Any) -> Callable[[Formula], Formula]:
    """Decorator: use the decorated formula for each of ``targets`` (replacing any before).

    A target is an operator in any spelling (``torch.matmul``, ``"matmul"``, ``aten.mm``: the
    row is the operator's ``fxloom.ops.identity`` key, so one registration serves them all),
    an ``nn.Module`` class (for ``call_module``, along the MRO), or any other callable or
    method name. See the module docstring for an example.
    """
    if not targets:
        raise TypeError("register_flop_formula needs at least one target")

    def register(formula: Formula) -> Formula:
        _register_all(targets, formula)
        return formula

    return register


def find_flop_formula(op: str, target: Any, module: nn.Module | None = None) -> Formula | None:
    """The formula for a node (opcode ``op``, ``target``, called ``module``), or ``None``.

    >>> import torch
    >>> find_flop_formula("call_module", "fc", torch.nn.Linear(2, 3)).__name__
    '_linear'
    >>> find_flop_formula("call_method", "add_").__name__  # in-place: as "add"
    '_elementwise'
    >>> find_flop_formula("call_function", torch.cdist) is None  # not in the table
    True
    """
    if op == "call_module":
        for cls in type(module).__mro__:
            formula = dict.get(FLOP_FORMULAS, cls)  # classes are rows of their own
            if formula is not None:
                return formula
        return None
    formula = FLOP_FORMULAS.get(target)
    if formula is None and isinstance(target, type) and issubclass(target, (tuple, list, dict)):
        return _free  # packing values into a container (a named tuple, a ModelOutput)
    return formula


def _register_all(targets: Iterable[Any], formula: Formula) -> None:
    for target in targets:
        FLOP_FORMULAS[target] = formula


def _free(op: OpShapes) -> FlopCount:
    return FlopCount(0)


def _elementwise(op: OpShapes) -> FlopCount:
    return FlopCount(op.out_numel)


def first_output_numel(op: OpShapes) -> int:
    """Elements of the first result: ATen's forms also return indices and saved statistics."""
    outputs = tensor_metas(op.out)
    return numel(outputs[0]) if outputs else 0


def _per_input_element(op: OpShapes) -> FlopCount:
    inputs = op.tensor_args()
    return FlopCount(numel(inputs[0]) if inputs else op.out_numel)


def _softmax(op: OpShapes) -> FlopCount:
    return FlopCount(5 * op.out_numel)


# ------------------------------------------------------------------- element-wise and free
_ELEMENTWISE_NAMES = (
    "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "floor_divide",
    "remainder", "fmod", "pow", "neg", "negative", "abs", "exp", "exp2", "expm1", "log", "log2",
    "log10", "log1p", "sqrt", "rsqrt", "square", "reciprocal", "sin", "cos", "tan", "tanh",
    "sigmoid", "relu", "erf", "erfc", "clamp", "clip", "clamp_min", "clamp_max", "maximum",
    "minimum", "where", "masked_fill", "lerp", "addcmul", "addcdiv", "sign", "floor", "ceil",
    "round", "trunc", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "logical_not", "bitwise_and", "bitwise_or", "bitwise_not", "isnan", "isinf", "nan_to_num",
)  # fmt: skip
_ELEMENTWISE_OPERATORS = (
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.pow, operator.neg, operator.pos, operator.abs, operator.invert, operator.and_,
    operator.or_, operator.xor, operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
    operator.ge,
)  # fmt: skip
_ELEMENTWISE_FUNCTIONAL = (
    F.relu6, F.gelu, F.silu, F.mish, F.elu, F.selu, F.celu, F.leaky_relu, F.hardtanh,
    F.hardswish, F.hardsigmoid, F.softplus, F.softsign, F.logsigmoid, F.threshold, F.glu,
    F.prelu, F.tanhshrink, F.hardshrink, F.softshrink,
)  # fmt: skip
_ACTIVATION_MODULES = (
    nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Mish, nn.ELU, nn.SELU, nn.CELU, nn.LeakyReLU,
    nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Softplus, nn.Softsign, nn.Tanh, nn.Sigmoid,
    nn.LogSigmoid, nn.Threshold, nn.GLU, nn.PReLU, nn.RReLU, nn.Tanhshrink, nn.Hardshrink,
    nn.Softshrink,
)  # fmt: skip
# Rows by operator key: a name stands for every spelling of its operator (``torch.add``,
# ``"add_"``, ``aten.add.Tensor``, ``operator.iadd``: ``x += y`` costs what ``x + y`` does).
_register_all(_ELEMENTWISE_NAMES, _elementwise)
_register_all(_ELEMENTWISE_OPERATORS, _elementwise)
_register_all(_ELEMENTWISE_FUNCTIONAL, _elementwise)
_register_all(_ACTIVATION_MODULES, _elementwise)

_REDUCTION_NAMES = (
    "sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std",
    "var_mean", "std_mean", "norm", "logsumexp", "cumsum", "cumprod", "all", "any", "count_nonzero",
)  # fmt: skip
_register_all(_REDUCTION_NAMES, _per_input_element)

_SOFTMAX = ("softmax", "log_softmax")
_register_all(_SOFTMAX, _softmax)
_register_all((F.softmin, nn.Softmax, nn.LogSoftmax, nn.Softmin), _softmax)

_FREE_NAMES = (
    "to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long", "bool",
    "short", "byte", "char", "cpu", "cuda", "clone", "cat", "concat", "concatenate", "stack",
    "hstack", "vstack", "gather", "index_select", "take", "masked_select", "repeat",
    "repeat_interleave", "roll", "flip", "tril", "triu", "tile", "broadcast_to", "new_ones",
    "new_zeros", "new_full", "new_empty", "new_tensor", "zeros", "ones", "full", "empty",
    "zeros_like", "ones_like", "full_like", "empty_like", "rand", "randn", "randint", "rand_like",
    "randn_like", "arange", "linspace", "tensor", "as_tensor", "scalar_tensor", "size", "dim",
    "numel", "stride", "item", "tolist", "fill_", "zero_", "copy_", "index_put", "scatter",
    "one_hot", "nonzero",
)  # fmt: skip
_register_all(_FREE_NAMES, _free)
_register_all(VIEW_OPS | VIEW_IF_CONTIGUOUS, _free)  # views and reshapes move no data
_register_all((getattr, F.embedding, F.dropout, F.pad, F.one_hot), _free)
_register_all(
    (
        nn.Embedding, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
        nn.ZeroPad2d, nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d, nn.ReflectionPad1d,
        nn.ReflectionPad2d, nn.ReplicationPad1d, nn.ReplicationPad2d, nn.ChannelShuffle,
        nn.PixelShuffle, nn.PixelUnshuffle, nn.Flatten, nn.Unflatten,
    ),
    _free,
)  # fmt: skip


# ------------------------------------------------------------------------ contractions
@register_flop_formula(torch.matmul, torch.mm, torch.bmm, operator.matmul, "matmul", "mm", "bmm")
def _matmul(op: OpShapes) -> FlopCount:
    # Every output element is a dot product over the first operand's last dimension (this
    # holds for vectors, matrices and broadcast batches alike).
    first = op.tensor_args()[0]
    return FlopCount.of_macs(op.out_numel * first.shape[-1])


@register_flop_formula(torch.addmm, torch.baddbmm, torch.addmv, "addmm", "baddbmm", "addmv")
def _matmul_plus_bias(op: OpShapes) -> FlopCount:
    # addmm(input, mat1, mat2), baddbmm(input, batch1, batch2), addmv(input, mat, vec)
    first_factor = op.arg(1, "mat1") or op.kwargs.get("batch1") or op.kwargs.get("mat")
    return FlopCount.of_macs(op.out_numel * first_factor.shape[-1], extra_flops=op.out_numel)


@register_flop_formula(F.linear)
def _functional_linear(op: OpShapes) -> FlopCount:
    weight = op.arg(1, "weight")
    bias = op.out_numel if op.arg(2, "bias") is not None else 0
    return FlopCount.of_macs(op.out_numel * weight.shape[-1], extra_flops=bias)


@register_flop_formula(nn.Linear)
def _linear(op: OpShapes) -> FlopCount:
    bias = op.out_numel if op.module.bias is not None else 0
    return FlopCount.of_macs(op.out_numel * op.module.in_features, extra_flops=bias)


@register_flop_formula(nn.Bilinear)
def _bilinear(op: OpShapes) -> FlopCount:
    module = op.module
    bias = op.out_numel if module.bias is not None else 0
    per_output = module.in1_features * module.in2_features + module.in1_features
    return FlopCount.of_macs(op.out_numel * per_output, extra_flops=bias)


@register_flop_formula(torch.einsum)
def _einsum(op: OpShapes) -> FlopCount:
    equation = op.args[0].replace(" ", "")
    operands = list(op.args[1:])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    terms = equation.partition("->")[0].split(",")
    sizes: dict[str, int] = {}
    batch_shape: tuple[int, ...] = ()
    for term, operand in zip(terms, operands):
        letters, dims, broadcast = _split_ellipsis(term, tuple(operand.shape))
        batch_shape = tuple(torch.broadcast_shapes(batch_shape, broadcast))
        for letter, size in zip(letters, dims):
            sizes[letter] = max(sizes.get(letter, 1), size)
    # One multiply-add per point of the joint index space and operand beyond the first.
    points = math.prod(sizes.values()) * math.prod(batch_shape)
    if len(operands) == 1:
        return FlopCount(points)  # a sum or trace: one addition per element
    return FlopCount.of_macs(points * (len(operands) - 1))


def _split_ellipsis(term: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...], tuple]:
    """``(letters, their sizes, the sizes "..." stands for)`` for one einsum operand."""
    if "..." not in term:
        return term, shape, ()
    before, after = term.split("...")
    covered = len(shape) - len(before) - len(after)
    dims = shape[: len(before)] + shape[len(before) + covered :]
    return before + after, dims, shape[len(before) : len(before) + covered]


# ------------------------------------------------------------------------- convolutions
def _bias_flops(op: OpShapes, has_bias: bool) -> int:
    return op.out_numel if has_bias else 0


@register_flop_formula(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def _conv(op: OpShapes) -> FlopCount:
    # Each output element sums (in_channels / groups) x kernel products.
    module = op.module
    per_output = module.in_channels // module.groups * math.prod(module.kernel_size)
    return FlopCount.of_macs(op.out_numel * per_output, _bias_flops(op, module.bias is not None))


@register_flop_formula(F.conv1d, F.conv2d, F.conv3d)
def _functional_conv(op: OpShapes) -> FlopCount:
    weight = op.arg(1, "weight")  # (out, in / groups, *kernel)
    per_output = math.prod(weight.shape[1:])
    return FlopCount.of_macs(
        op.out_numel * per_output, _bias_flops(op, op.arg(2, "bias") is not None)
    )


@register_flop_formula(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
def _conv_transpose(op: OpShapes) -> FlopCount:
    # Each input element is scattered to (out_channels / groups) x kernel outputs.
    module = op.module
    per_input = module.out_channels // module.groups * math.prod(module.kernel_size)
    inputs = numel(op.tensor_args()[0])
    return FlopCount.of_macs(inputs * per_input, _bias_flops(op, module.bias is not None))


@register_flop_formula(F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)
def _functional_conv_transpose(op: OpShapes) -> FlopCount:
    weight = op.arg(1, "weight")  # (in, out / groups, *kernel)
    inputs = numel(op.arg(0, "input"))
    return FlopCount.of_macs(
        inputs * math.prod(weight.shape[1:]), _bias_flops(op, op.arg(2, "bias") is not None)
    )


# ------------------------------------------------------------------------ normalisation
@register_flop_formula(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
def _batch_norm(op: OpShapes) -> FlopCount:
    module = op.module
    computes_statistics = module.training or not module.track_running_stats
    return FlopCount(op.out_numel * _batch_norm_per_element(computes_statistics, module.affine))


@register_flop_formula(F.batch_norm)
def _functional_batch_norm(op: OpShapes) -> FlopCount:
    # Statistics are computed in training, and always without running statistics (no_stats).
    computes_statistics = bool(op.named("training", False)) or op.named("running_mean") is None
    affine = op.named("weight") is not None
    return FlopCount(first_output_numel(op) * _batch_norm_per_element(computes_statistics, affine))


def _batch_norm_per_element(computes_statistics: bool, affine: bool) -> int:
    return 2 + (2 if computes_statistics else 0) + (2 if affine else 0)


@register_flop_formula(nn.LayerNorm, nn.GroupNorm)
def _layer_norm(op: OpShapes) -> FlopCount:
    module = op.module
    affine = getattr(module, "elementwise_affine", getattr(module, "affine", False))
    return FlopCount(op.out_numel * (5 + (2 if affine else 0)))


@register_flop_formula(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
def _instance_norm(op: OpShapes) -> FlopCount:
    return FlopCount(op.out_numel * (5 + (2 if op.module.affine else 0)))


@register_flop_formula(F.layer_norm, F.group_norm, F.instance_norm)
def _functional_normalisation(op: OpShapes) -> FlopCount:
    affine = op.named("weight") is not None
    return FlopCount(first_output_numel(op) * (5 + (2 if affine else 0)))


@register_flop_formula(nn.RMSNorm)
def _rms_norm(op: OpShapes) -> FlopCount:
    return FlopCount(op.out_numel * (3 + (1 if op.module.elementwise_affine else 0)))


@register_flop_formula(F.rms_norm)
def _functional_rms_norm(op: OpShapes) -> FlopCount:
    affine = op.named("weight") is not None
    return FlopCount(first_output_numel(op) * (3 + (1 if affine else 0)))


# ------------------------------------------------------------------------------ pooling
def _window(kernel_size: Any, spatial_dims: int) -> int:
    if isinstance(kernel_size, int):
        return kernel_size**spatial_dims
    return math.prod(kernel_size)


_POOL_DIMS = {
    nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.MaxPool3d: 3, nn.AvgPool1d: 1, nn.AvgPool2d: 2,
    nn.AvgPool3d: 3, nn.LPPool1d: 1, nn.LPPool2d: 2,
}  # fmt: skip


@register_flop_formula(*_POOL_DIMS)
def _pool(op: OpShapes) -> FlopCount:
    # One comparison (max) or addition (average) per window element per output.
    spatial_dims = next(_POOL_DIMS[cls] for cls in type(op.module).__mro__ if cls in _POOL_DIMS)
    return FlopCount(op.out_numel * _window(op.module.kernel_size, spatial_dims))


@register_flop_formula(
    F.max_pool1d, F.max_pool2d, F.max_pool3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d
)
def _functional_pool(op: OpShapes) -> FlopCount:
    # (input, kernel_size, ...) in every spelling; ATen's forms also return indices.
    spatial_dims = len(op.arg(0, "input").shape) - 2
    return FlopCount(first_output_numel(op) * _window(op.arg(1, "kernel_size"), spatial_dims))


_register_all(
    (
        nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool1d,
        nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d,
        F.adaptive_avg_pool3d, F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d,
    ),
    _per_input_element,  # every input element joins exactly one window
)  # fmt: skip


# ---------------------------------------------------------------------------- attention
def _attention_core(
    batch_heads: int, queries: int, keys: int, dim: int, value_dim: int
) -> FlopCount:
    """softmax(q k^T * scale) v: two contractions, the scaling and a softmax per score."""
    scores = batch_heads * queries * keys
    return FlopCount.of_macs(scores * (dim + value_dim), extra_flops=scores + 5 * scores)


@register_flop_formula(F.scaled_dot_product_attention)
def _scaled_dot_product_attention(op: OpShapes) -> FlopCount:
    """softmax(q k^T * scale + mask) v; ATen's fused forms name the mask ``attn_bias``."""
    query, key, value = (op.named(name) for name in ("query", "key", "value"))
    batch_heads, queries, keys = math.prod(query.shape[:-2]), query.shape[-2], key.shape[-2]
    core = _attention_core(batch_heads, queries, keys, query.shape[-1], value.shape[-1])
    masked = op.named("attn_mask") is not None or op.named("attn_bias") is not None
    return FlopCount(core.flops + (batch_heads * queries * keys if masked else 0), core.macs)


@register_flop_formula(nn.MultiheadAttention)
def _multihead_attention(op: OpShapes) -> FlopCount:
    module = op.module
    query, key = op.arg(0, "query"), op.arg(1, "key")
    batched = len(query.shape) == 3
    batch = (query.shape[0] if module.batch_first else query.shape[1]) if batched else 1
    queries = query.shape[1 if module.batch_first else 0] if batched else query.shape[0]
    keys = key.shape[1 if module.batch_first else 0] if batched else key.shape[0]
    embed, head_dim = module.embed_dim, module.head_dim
    projections = batch * (
        queries * embed * embed + keys * module.kdim * embed + keys * module.vdim * embed
    )
    output_projection = batch * queries * embed * embed
    core = _attention_core(batch * module.num_heads, queries, keys, head_dim, head_dim)
    # Bias adds of the q, k, v and output projections.
    biases = batch * (2 * queries + 2 * keys) * embed if module.in_proj_bias is not None else 0
    return FlopCount(
        2 * (projections + output_projection) + biases + core.flops,
        projections + output_projection + core.macs,
    )


# ATen operators (exported graphs) register their rows in the same table; imported last, as it
# builds on the rows and name lists above.
from fxloom.ops import aten_flops  # noqa: E402, F401
