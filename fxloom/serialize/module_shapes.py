"""What a rebuilt module's attributes and tensors must be, checked before anything packs or runs it.

A module is rebuilt from a file without its ``__init__``, so nothing checks that
``Linear.weight`` is ``(out_features, in_features)`` or that a convolution's ``groups``
divides its channels: a file could hold a layer that computes with a weight its
attributes contradict, or hand a native kernel a value it divides by. Three tables,
each with one row per class family (matched by the class's bases, nearest first; a
row of ``fxloom.quantize`` is keyed by its qualified name, as this package never
imports it), say what holds:

* ``SHAPE_RULES``: the rules ``__init__`` applies to the attributes (``groups`` at least
  1 and dividing both channel counts; stride, dilation and kernel at least 1; padding at
  least 0; ``CONV_KINDS`` says per convolution class how many spatial dimensions it has,
  whether it is transposed and which padding modes it admits), and the shapes the
  attributes give its tensors;
* ``PACKING``: what a quantized layer's kernel packs: the dtype of its weights (qint8,
  or float32 rounded to float16 by the packing itself), the axis its per-channel
  scales must run along (one per output channel: a kernel reads that many), float32
  biases;
* ``QUANTIZATION_PARAMETERS``: a quantized module's output (or input) scale and zero
  point: the scale finite and positive, the zero point within its dtype (``quint8``,
  the activations of torch's CPU kernels, unless the row names the attribute holding it).

``check_module_shapes`` applies them; the tensors compared are the module's own, a
parametrized tensor's shape computed from its originals (``parametrized``), or, for a
quantized layer, the tensors it is about to pack (``module_states`` checks them before
``set_weight_bias``) or has packed. These preconditions hold on every quantized engine
torch offers (``torch.backends.quantized.supported_engines``): FBGEMM and QNNPACK divide
by ``groups`` and ``stride`` while packing (SIGFPE at 0), read one scale per output
channel whatever the tensor holds, and compute with a weight of the wrong width.

Only the module's dictionaries are read (``vars``, ``_parameters``, ``_buffers``,
``_modules``): no method, property or parametrization of the module runs, except torch's
own unpacking of a quantized linear layer's weights when saving. Saving runs the same
checks, so what would not load is not written.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.ao.nn.quantized as nnq
import torch.ao.nn.quantized.dynamic as nnqd
from torch import nn
from torch.ao.nn.quantized.dynamic.modules import rnn as dynamic_rnn
from torch.ao.nn.quantized.modules import batchnorm as quantized_batchnorm
from torch.ao.nn.quantized.modules.conv import _ConvNd as QuantizedConvNd
from torch.ao.nn.quantized.modules.linear import LinearPackedParams
from torch.ao.nn.quantized.modules.utils import WeightedQuantizedModule

from fxloom.serialize import parametrized, rnn_weights
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.limits import MAX_CONV_PARAMETER
from fxloom.serialize.tensors import PER_CHANNEL, PER_TENSOR, check_scales

__all__ = [
    "CONV_KINDS",
    "PACKING",
    "QUANTIZATION_PARAMETERS",
    "SHAPE_RULES",
    "ConvKind",
    "Packing",
    "QuantizationParameters",
    "ShapeRule",
    "check_module_shapes",
    "record_packed",
    "row_for",
]

Shapes = dict[str, tuple[int, ...]]
Tensors = Mapping[str, torch.Tensor | None]


def row_for(table: Mapping[type | str, Any], cls: type) -> Any:
    """The row of ``cls`` in ``table``, or of its nearest base; keyed by class or by
    qualified class name. None if no base has one."""
    for base in cls.__mro__:
        for key in (base, f"{base.__module__}.{base.__qualname__}"):
            if key in table:
                return table[key]
    return None


# ------------------------------------------------------------------ attributes
def _int(module: nn.Module, name: str, least: int = 0) -> int:
    value = vars(module).get(name)
    if type(value) is not int or value < least:
        raise SerializationError(f"{name}={value!r} must be an int, at least {least}")
    return value


def _ints(
    module: nn.Module, name: str, count: int | None = None, least: int = 0, most: int | None = None
) -> tuple[int, ...]:
    """A tuple of sizes (an int is one size), ``count`` of them when given."""
    value = vars(module).get(name)
    value = (value,) if type(value) is int else value
    if not _sizes(value, count, least, most):
        raise SerializationError(f"{name}={value!r} must be {_sizes_rule(count, least, most)}")
    return tuple(value)


def _sizes(value: Any, count: int | None, least: int, most: int | None) -> bool:
    return (
        isinstance(value, (tuple, list))
        and (count is None or len(value) == count)
        and all(type(v) is int and v >= least and (most is None or v <= most) for v in value)
    )


def _sizes_rule(count: int | None, least: int, most: int | None) -> str:
    how_many = "ints" if count is None else f"{count} int{'s' if count != 1 else ''}"
    bound = "" if most is None else f" and at most {most:,}"
    return f"{how_many}, each at least {least}{bound}"


def _choice(module: nn.Module, name: str, choices: tuple[str, ...]) -> str:
    value = vars(module).get(name)
    if not isinstance(value, str) or value not in choices:
        raise SerializationError(f"{name}={value!r} must be one of {list(choices)}")
    return value


# --------------------------------------------------------------- convolutions
@dataclass(frozen=True)
class ConvKind:
    """What one class of convolution admits: ``dims`` spatial dimensions, ``transposed`` or
    not, its padding modes, the padding strings it takes instead of sizes, and whether it
    keeps ``_reversed_padding_repeated_twice`` (the float ones, for ``F.pad``)."""

    dims: int
    transposed: bool
    padding_modes: tuple[str, ...]
    padding_strings: tuple[str, ...] = ()
    derives_padding: bool = False


_FLOAT_MODES = ("zeros", "reflect", "replicate", "circular")
_QUANTIZED_MODES = ("zeros", "reflect")  # torch.ao's quantized convolutions pad these only


def _float_conv(dims: int) -> ConvKind:
    return ConvKind(dims, False, _FLOAT_MODES, ("same", "valid"), derives_padding=True)


def _float_transposed(dims: int) -> ConvKind:
    return ConvKind(dims, True, ("zeros",), derives_padding=True)


# Quantized ones cover their fused (ConvReLU, ConvAdd) and dynamic subclasses.
CONV_KINDS: dict[type, ConvKind] = {
    nn.Conv1d: _float_conv(1),
    nn.Conv2d: _float_conv(2),
    nn.Conv3d: _float_conv(3),
    nn.ConvTranspose1d: _float_transposed(1),
    nn.ConvTranspose2d: _float_transposed(2),
    nn.ConvTranspose3d: _float_transposed(3),
    nnq.Conv1d: ConvKind(1, False, _QUANTIZED_MODES),
    nnq.Conv2d: ConvKind(2, False, _QUANTIZED_MODES),
    nnq.Conv3d: ConvKind(3, False, ("zeros",)),
    nnq.ConvTranspose1d: ConvKind(1, True, ("zeros",)),
    nnq.ConvTranspose2d: ConvKind(2, True, ("zeros",)),
    nnq.ConvTranspose3d: ConvKind(3, True, ("zeros",)),
}


def _conv(m: nn.Module, held: Shapes) -> Shapes:
    # weight: (out, in / groups, *kernel), or (in, out / groups, *kernel) when transposed.
    kind = row_for(CONV_KINDS, type(m))
    if kind is None:
        raise SerializationError("fxloom has no rule for this convolution class")
    c_in, c_out = _int(m, "in_channels", least=1), _int(m, "out_channels", least=1)
    groups = vars(m).get("groups")
    if type(groups) is not int or groups < 1 or c_in % groups or c_out % groups:
        raise SerializationError(
            f"groups={groups!r} must be at least 1 and divide in_channels={c_in} and "
            f"out_channels={c_out}"
        )
    kernel = _ints(m, "kernel_size", kind.dims, least=1, most=MAX_CONV_PARAMETER)
    stride = _ints(m, "stride", kind.dims, least=1, most=MAX_CONV_PARAMETER)
    dilation = _ints(m, "dilation", kind.dims, least=1, most=MAX_CONV_PARAMETER)
    padding = _conv_padding(m, kind, stride)
    _output_padding(m, kind, stride, dilation)
    if vars(m).get("transposed") is not kind.transposed:
        raise SerializationError(
            f"transposed={vars(m).get('transposed')!r} must be {kind.transposed} for this class"
        )
    _choice(m, "padding_mode", kind.padding_modes)
    if kind.derives_padding:
        _check_reversed_padding(m, padding, kernel, dilation)
    first, second = (c_in, c_out) if kind.transposed else (c_out, c_in)
    return {"weight": (first, second // groups, *kernel), "bias": (c_out,)}


def _conv_padding(m: nn.Module, kind: ConvKind, stride: tuple[int, ...]) -> Any:
    padding = vars(m).get("padding")
    if not isinstance(padding, str):
        if not _sizes(padding, kind.dims, 0, MAX_CONV_PARAMETER):
            strings = f", or one of {list(kind.padding_strings)}" if kind.padding_strings else ""
            rule = _sizes_rule(kind.dims, 0, MAX_CONV_PARAMETER)
            raise SerializationError(f"padding={padding!r} must be {rule}{strings}")
        return tuple(padding)
    if padding not in kind.padding_strings:
        raise SerializationError(f"padding={padding!r} must be {kind.dims} sizes, not a string")
    if padding == "same" and any(s != 1 for s in stride):
        raise SerializationError(f"padding='same' needs stride 1, not stride={stride}")
    return padding


def _output_padding(
    m: nn.Module, kind: ConvKind, stride: tuple[int, ...], dilation: tuple[int, ...]
) -> None:
    """Only a transposed convolution has one, smaller than its stride or its dilation."""
    padding = _ints(m, "output_padding", kind.dims, least=0, most=MAX_CONV_PARAMETER)
    if not kind.transposed and any(padding):
        raise SerializationError(
            f"output_padding={padding} must be zeros: only a transposed convolution has one"
        )
    if any(p >= max(s, d) for p, s, d in zip(padding, stride, dilation, strict=True)):
        raise SerializationError(
            f"output_padding={padding} must be smaller than stride={stride} or "
            f"dilation={dilation} in each dimension"
        )


def _check_reversed_padding(
    m: nn.Module, padding: Any, kernel: tuple[int, ...], dilation: tuple[int, ...]
) -> None:
    """Float convolutions pad with ``_reversed_padding_repeated_twice`` for non-zero padding
    modes: what their ``__init__`` derives from the padding, or what they show is not what
    they compute."""
    if padding == "valid":
        pairs = [(0, 0)] * len(kernel)
    elif padding == "same":
        totals = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
        pairs = [(total // 2, total - total // 2) for total in totals]
    else:
        pairs = [(p, p) for p in padding]
    expected = [side for pair in reversed(pairs) for side in pair]
    found = vars(m).get("_reversed_padding_repeated_twice")
    if not isinstance(found, (tuple, list)) or list(found) != expected:
        raise SerializationError(
            f"_reversed_padding_repeated_twice={found!r} must be {expected} "
            f"(what padding={padding!r} gives)"
        )


# ------------------------------------------------------------ the other layers
def _linear(m: nn.Module, held: Shapes) -> Shapes:
    out = _int(m, "out_features")
    return {"weight": (out, _int(m, "in_features")), "bias": (out,)}


def _bilinear(m: nn.Module, held: Shapes) -> Shapes:
    out = _int(m, "out_features")
    return {"weight": (out, _int(m, "in1_features"), _int(m, "in2_features")), "bias": (out,)}


def _packed_linear(m: nn.Module, held: Shapes) -> Shapes:
    """``LinearPackedParams`` has no sizes of its own: its weight is 2-d, its bias one per row."""
    weight = held.get("weight")
    if weight is None or len(weight) != 2:
        found = "none" if weight is None else f"shape {list(weight)}"
        raise SerializationError(
            f"its weight must be 2-d (out_features, in_features), found {found}"
        )
    return {"weight": weight, "bias": (weight[0],)}


def _embedding(m: nn.Module, held: Shapes) -> Shapes:
    rows = _int(m, "num_embeddings")
    padding_idx = vars(m).get("padding_idx")
    if padding_idx is not None and (type(padding_idx) is not int or not 0 <= padding_idx < rows):
        raise SerializationError(
            f"padding_idx={padding_idx!r} must be None or a row below num_embeddings={rows}"
        )
    return {"weight": (rows, _int(m, "embedding_dim"))}


def _embedding_bag(m: nn.Module, held: Shapes) -> Shapes:
    _choice(m, "mode", ("sum", "mean", "max"))
    return _embedding(m, held)


def _norm_over(attribute: str) -> Callable[[nn.Module, Shapes], Shapes]:
    def shapes(m: nn.Module, held: Shapes) -> Shapes:
        shape = _ints(m, attribute)
        return {"weight": shape, "bias": shape}

    return shapes


def _batch_norm(m: nn.Module, held: Shapes) -> Shapes:
    n = _int(m, "num_features")
    return {"weight": (n,), "bias": (n,), "running_mean": (n,), "running_var": (n,)}


def _group_norm(m: nn.Module, held: Shapes) -> Shapes:
    n = _int(m, "num_channels")
    return {"weight": (n,), "bias": (n,)}


# ------------------------------------------------------- quantized linear layers
# The shapes a LinearPackedParams packed when fxloom loaded it, with the packed object they
# describe: its parent layer's sizes are checked against them, and reading them back from
# the packed weights would unpack them, which costs as much as packing.
_PACKED: weakref.WeakKeyDictionary[nn.Module, tuple[Any, Shapes]] = weakref.WeakKeyDictionary()


def record_packed(module: nn.Module, packed: Tensors) -> None:
    """Note what ``module`` (a ``LinearPackedParams``) has just packed."""
    shapes = {name: tuple(t.shape) for name, t in packed.items() if t is not None}
    _PACKED[module] = (vars(module).get("_packed_params"), shapes)


def _packed_linear_shapes(module: nn.Module) -> Shapes:
    known = _PACKED.get(module)
    if known is not None and known[0] is vars(module).get("_packed_params"):
        return known[1]
    weight, bias = LinearPackedParams._weight_bias(module)  # torch's unpacking, when saving
    return {
        "weight": tuple(weight.shape),
        **({"bias": tuple(bias.shape)} if bias is not None else {}),
    }


def _packed_child(*dtypes: torch.dtype) -> Callable[[nn.Module], Shapes]:
    """The tensors of a layer holding its weights in a ``LinearPackedParams`` child packed
    for one of ``dtypes`` (a static layer's kernel takes int8 weights only)."""

    def held(m: nn.Module) -> Shapes:
        child = m._modules.get("_packed_params")
        if type(child) is not LinearPackedParams:
            raise SerializationError(
                f"_packed_params must be a LinearPackedParams, found {type(child).__name__}"
            )
        dtype = vars(child).get("dtype")
        if dtype not in dtypes:
            raise SerializationError(
                f"_packed_params holds {dtype} weights; this layer runs on "
                f"{' or '.join(map(str, dtypes))} ones"
            )
        return _packed_linear_shapes(child)

    return held


# ------------------------------------------------------------------ the table
@dataclass(frozen=True)
class ShapeRule:
    """``shapes(module, held)`` checks the attributes and returns the shapes they give the
    tensors, given ``held``, the shapes of the tensors the module holds: its own, unless
    ``held(module)`` says where they are (a quantized layer's packed child)."""

    shapes: Callable[[nn.Module, Shapes], Shapes]
    held: Callable[[nn.Module], Shapes] | None = None


_STATIC_LINEAR = ShapeRule(_linear, _packed_child(torch.qint8))

SHAPE_RULES: dict[type | str, ShapeRule] = {
    nn.Linear: ShapeRule(_linear),
    nn.Bilinear: ShapeRule(_bilinear),
    nn.modules.conv._ConvNd: ShapeRule(_conv),
    QuantizedConvNd: ShapeRule(_conv),
    nnq.Linear: _STATIC_LINEAR,
    nnqd.Linear: ShapeRule(_linear, _packed_child(torch.qint8, torch.float16)),
    "fxloom.quantize.table.LinearFloatIO": _STATIC_LINEAR,
    LinearPackedParams: ShapeRule(_packed_linear, _packed_linear_shapes),
    nn.Embedding: ShapeRule(_embedding),
    nn.EmbeddingBag: ShapeRule(_embedding_bag),
    nn.LayerNorm: ShapeRule(_norm_over("normalized_shape")),
    nn.RMSNorm: ShapeRule(lambda m, held: {"weight": _ints(m, "normalized_shape")}),
    nn.modules.batchnorm._NormBase: ShapeRule(_batch_norm),
    nn.GroupNorm: ShapeRule(_group_norm),
    nn.RNNBase: ShapeRule(lambda m, held: rnn_weights.rnn_shapes(m)),
    dynamic_rnn.RNNBase: ShapeRule(lambda m, held: rnn_weights.packed_rnn_shapes(m)),
}


# -------------------------------------------------------------- packed tensors
@dataclass(frozen=True)
class Packing:
    """What a quantized layer's kernel packs: ``weight_dtype(module)``, the dtype of its
    tensors named ``weight*``, and ``channel_axis(module)``, the dimension their per-channel
    scales must run along (its output channels; None: per-tensor scales only). Biases are
    float32; everything is on the CPU, where torch's quantized kernels run."""

    weight_dtype: Callable[[nn.Module], torch.dtype]
    channel_axis: Callable[[nn.Module], int | None]


# A layer's ``dtype`` attribute -> the dtype of the weights it packs: float16 packing takes
# float32 weights and rounds them itself.
_PACKED_DTYPES = {torch.qint8: torch.qint8, torch.float16: torch.float32}


def _by_dtype_attribute(m: nn.Module) -> torch.dtype:
    dtype = vars(m).get("dtype")
    if dtype not in _PACKED_DTYPES:
        raise SerializationError(f"dtype={dtype!r} must be one of {list(_PACKED_DTYPES)}")
    return _PACKED_DTYPES[dtype]


def _conv_channel_axis(m: nn.Module) -> int | None:
    # A transposed weight is (in, out / groups, *kernel): one scale per output channel
    # fits along dim 1 only without groups (QNNPACK reads out_channels of them).
    if vars(m).get("transposed") is not True:
        return 0
    return 1 if vars(m).get("groups") == 1 else None


PACKING: dict[type | str, Packing] = {
    QuantizedConvNd: Packing(lambda m: torch.qint8, _conv_channel_axis),
    LinearPackedParams: Packing(_by_dtype_attribute, lambda m: 0),
    dynamic_rnn.RNNBase: Packing(_by_dtype_attribute, lambda m: 0),
}


def _check_packed(module: nn.Module, cls: type, packed: Tensors, expected: Shapes) -> None:
    """The tensors a quantized layer is about to pack: the names it packs, every one there
    (a bias may be None), each of the dtype, device and quantization its kernel takes."""
    unknown = sorted(set(packed) - set(expected))
    missing = sorted(n for n in expected if packed.get(n) is None and n != "bias")
    if unknown or missing:
        raise SerializationError(
            f"it packs {sorted(expected)}; found {sorted(n for n in packed if packed[n] is not None)}"
        )
    packing = row_for(PACKING, cls)
    weight_dtype, axis = packing.weight_dtype(module), packing.channel_axis(module)
    for name, tensor in packed.items():
        if tensor is None:
            continue
        if tensor.device.type != "cpu":
            raise SerializationError(f"its {name} is on {tensor.device}; it packs CPU tensors")
        if not name.startswith("weight"):
            if tensor.dtype is not torch.float32 or tensor.is_quantized:
                raise SerializationError(f"its {name} is {tensor.dtype}; it packs float32 biases")
            continue
        if tensor.dtype is not weight_dtype:
            raise SerializationError(
                f"its {name} is {tensor.dtype}; this layer packs {weight_dtype} weights"
            )
        if tensor.is_quantized:
            _check_weight_scales(name, tensor, axis)


def _check_weight_scales(name: str, weight: torch.Tensor, axis: int | None) -> None:
    """Per-tensor scales, or one per output channel: the kernel reads one per output channel
    whatever the tensor holds (QNNPACK reads past the end of a shorter list)."""
    scheme = weight.qscheme()
    if scheme in PER_TENSOR or (scheme in PER_CHANNEL and weight.q_per_channel_axis() == axis):
        return
    found = f"{scheme} along dim {weight.q_per_channel_axis()}" if scheme in PER_CHANNEL else scheme
    wanted = "" if axis is None else f", or one per output channel (along dim {axis})"
    raise SerializationError(
        f"its {name} is quantized {found}; this layer packs per-tensor scales{wanted}"
    )


# ------------------------------------------------- output quantization parameters
@dataclass(frozen=True)
class QuantizationParameters:
    """The attribute (or buffer) names of a quantized module's scale and zero point, and of
    the dtype they quantize to (None: ``quint8``, the activations of torch's CPU kernels)."""

    scale: str = "scale"
    zero_point: str = "zero_point"
    dtype: str | None = None


_OUTPUT = QuantizationParameters()
QUANTIZATION_PARAMETERS: dict[type | str, QuantizationParameters] = {
    WeightedQuantizedModule: _OUTPUT,  # convolutions and linear layers, static and dynamic
    "fxloom.quantize.table.LinearFloatIO": QuantizationParameters(
        "input_scale", "input_zero_point"
    ),
    nnq.Quantize: QuantizationParameters(dtype="dtype"),
    nnq.Sigmoid: QuantizationParameters("output_scale", "output_zero_point"),
    **dict.fromkeys(
        (
            nnq.ELU,
            nnq.Hardswish,
            nnq.LeakyReLU,
            nnq.PReLU,
            nnq.Softmax,
            nnq.QFunctional,
            nnq.LayerNorm,
            nnq.GroupNorm,
            nnq.InstanceNorm1d,
            nnq.InstanceNorm2d,
            nnq.InstanceNorm3d,
            quantized_batchnorm._BatchNorm,  # and nniq.BNReLU2d/3d
        ),
        _OUTPUT,
    ),
}


def _check_quantization_parameters(module: nn.Module, row: QuantizationParameters) -> None:
    scale, zero_point = _number(module, row.scale), _number(module, row.zero_point)
    dtype = torch.quint8 if row.dtype is None else vars(module).get(row.dtype)
    said = f"{row.scale}={scale!r}, {row.zero_point}={zero_point!r}"
    if type(scale) not in (float, int) or type(zero_point) is not int:
        raise SerializationError(f"{said}: the scale must be a number, the zero point an int")
    if dtype not in (torch.quint8, torch.qint8, torch.qint32):
        raise SerializationError(f"{row.dtype}={dtype!r} must be a quantized dtype")
    check_scales(torch.tensor([float(scale)]), torch.tensor([zero_point]), dtype, said)


def _number(module: nn.Module, name: str) -> Any:
    """An attribute, or a one-element buffer's value (torch keeps some as buffers)."""
    value = vars(module).get(name, module._buffers.get(name))
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_quantized:
        return value.item()
    return value


# ------------------------------------------------------------------ the check
def check_module_shapes(module: nn.Module, where: str, packed: Tensors | None = None) -> None:
    """Refuse ``module`` if an attribute breaks its class's rules or a tensor disagrees with
    the attributes that size it; ``packed``: the tensors a quantized layer is about to pack
    (its weight and bias by name), checked as its kernel needs them too."""
    cls = parametrized.saved_class(module, type(module))
    own = {name: tuple(t.shape) for name, t in _tensors(module) if t is not None}
    own.update(parametrized.parametrized_shapes(module, where))
    try:
        _check(module, cls, own, packed)
    except SerializationError as e:
        raise SerializationError(f"{where} ({_class_name(cls)}): {e}; refused") from None


def _check(module: nn.Module, cls: type, own: Shapes, packed: Tensors | None) -> None:
    quantization = row_for(QUANTIZATION_PARAMETERS, cls)
    if quantization is not None:
        _check_quantization_parameters(module, quantization)
    rule = row_for(SHAPE_RULES, cls)
    if rule is None:
        return
    if packed is not None:
        held = {name: tuple(t.shape) for name, t in packed.items() if t is not None}
    else:
        held = own if rule.held is None else rule.held(module)
    expected = rule.shapes(module, held)
    if packed is not None:
        _check_packed(module, cls, packed, expected)
    for name, shape in expected.items():
        if name in held and held[name] != shape:
            sizes = _attributes(module)
            basis = f"its attributes ({sizes})" if sizes else "its other tensors"
            raise SerializationError(
                f"its {name} has shape {list(held[name])}, but {basis} make it {list(shape)}"
            )


def _tensors(module: nn.Module) -> list[tuple[str, Any]]:
    return [*module._parameters.items(), *module._buffers.items()]


def _attributes(module: nn.Module) -> str:
    sizes = {k: v for k, v in vars(module).items() if type(v) in (int, tuple) and k[0] != "_"}
    return ", ".join(f"{k}={v!r}" for k, v in sizes.items())


def _class_name(cls: type) -> str:
    """torch.nn classes by name (``Linear``); others by the path torch exports them under
    (``torch.ao.nn.quantized.Conv2d``): the bare name does not say which Conv2d."""
    if cls.__module__.startswith("torch.nn."):
        return cls.__qualname__
    return f"{cls.__module__.split('.modules.')[0]}.{cls.__qualname__}"
