"""Importing PT2E / torchao graphs: ``quantized_decomposed`` calls become fxloom's operators.

torch's PT2E flow (``prepare_pt2e``/``convert_pt2e``, now in torchao) and torchao's reference
graphs quantize with ``torch.ops.quantized_decomposed``: quantize/dequantize pairs around float
operators, int8 weights dequantized per channel before each ``linear``/``conv2d``.
``import_quantized(gm)`` rewrites such a graph (traced by ``fxloom.symbolic_trace``, or an
``fxloom.export`` program's module) into fxloom's operators on plain tensors (``quantize.ops``),
so it runs on fxloom's kernel table, saves with ``fxloom.save`` and loads where the loader's
run-time function table admits those operators, with ``torch.ao.quantization`` never imported::

    >>> import torch
    >>> import fxloom
    >>> from fxloom.quantize.importer import import_quantized
    >>> import torch.ao.quantization.fx._decomposed  # registers quantized_decomposed (the peer)
    >>> qd = torch.ops.quantized_decomposed
    >>> class Reference(torch.nn.Module):  # what convert_pt2e makes of one Linear
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.register_buffer("w", torch.randint(-127, 128, (4, 8), dtype=torch.int8))
    ...         self.register_buffer("w_scale", torch.full((4,), 0.01))
    ...         self.register_buffer("w_zero_point", torch.zeros(4, dtype=torch.int64))
    ...     def forward(self, x):
    ...         q = qd.quantize_per_tensor.default(x, 0.02, 128, 0, 255, torch.uint8)
    ...         x = qd.dequantize_per_tensor.default(q, 0.02, 128, 0, 255, torch.uint8)
    ...         w = qd.dequantize_per_channel.default(
    ...             self.w, self.w_scale, self.w_zero_point, 0, -128, 127, torch.int8)
    ...         return torch.nn.functional.linear(x, w)
    >>> reference = fxloom.symbolic_trace(Reference())
    >>> imported = import_quantized(reference)
    >>> [n.target.__name__ for n in imported.graph.nodes if n.op == "call_function"]
    ['quantize', 'linear_int8']
    >>> x = torch.randn(2, 8)
    >>> bool((imported(x) - reference(x)).abs().max() < 1e-4)
    True

Two tables say what becomes what. ``RENAMES``: operators that stand alone, each renamed to
the fxloom operator with the same arguments (``quantized_decomposed``'s conventions are
fxloom's: ``scale, zero_point, quant_min, quant_max, dtype``):

    quantize_per_tensor(.tensor, .tensor2)    -> ops.quantize     (scale/zero point tensors
    dequantize_per_tensor(.tensor, .tensor2)  -> ops.dequantize    that are constants become
    choose_qparams.tensor                     -> ops.choose_qparams   numbers)

and ``FORMS``: operators that only describe a layer's weight or activations, folded into that
layer's fxloom operator (``LAYERS`` lists the linear and convolution calls it recognises):

    weight dequantize_per_channel (int8, axis 0, zero points 0) or dequantize_per_tensor
      (int8 constant, zero point 0); activations:
        dequantize_per_tensor(q, scale, zp) with numbers      -> linear_int8 / conv2d_int8 (static)
        dequantize_per_token(quantize_per_token(x, choose_qparams_per_token(x)))
                                                              -> linear_int8(dynamic=True)
        anything else (float, a dequantize with computed scale) -> linear_w8 (weight only)
    weight dequantize_per_channel_group (a range of 16 values: int4)  -> linear_w4

Every layer keeps computing what the reference graph computes: integer accumulation in
place of float (static, dynamic) differs by float rounding, and a value rounded to an integer
after it may then move by one step. Any other ``quantized_decomposed`` call (per-token
asymmetric activations, group-wise 8-bit weights, a weight dequantized for something that is
no layer) is refused with a ``QuantizeError`` naming the node, its line and what fxloom
takes instead: never a graph that computes something else.

A static layer followed by a quantize to uint8 (through a ReLU or not) requantizes its own
output (``linear_int8``/``conv2d_int8``'s ``out_scale, out_zero_point, relu``), as
``convert`` builds them: the integers flow from one int8 kernel to the next.

Depends on: the IR, ``quantize.ops``, ``attr_path``, ``source_location``, torch (``torch._ops``
to read an operator's name; ``torch.ao`` is never imported: the table is keyed by names).
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxloom import attr_path
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.ops.runtime_functions import is_runtime_check
from fxloom.quantize import layouts, ops
from fxloom.quantize.errors import QuantizeError
from fxloom.source_location import source_location

__all__ = ["FORMS", "LAYERS", "NAMESPACE", "REFUSED", "RENAMES", "import_quantized"]

NAMESPACE = "quantized_decomposed"
aten = torch.ops.aten


def decomposed_name(target: Any) -> str | None:
    """``"quantize_per_tensor.default"`` for ``torch.ops.quantized_decomposed.
    quantize_per_tensor.default``; an overload packet reads as its ``default``; None for any
    other target."""
    if isinstance(target, torch._ops.OpOverload) and target.namespace == NAMESPACE:
        return f"{target._opname}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        namespace, _, name = target._qualified_op_name.partition("::")
        return f"{name}.default" if namespace == NAMESPACE else None
    return None


def _bound(node: Node) -> dict[str, Any]:
    """A ``quantized_decomposed`` call's arguments by their schema names, defaults filled in
    (positional or keyword, as the graph gives them)."""
    target = node.target
    overload = target if isinstance(target, torch._ops.OpOverload) else target.default
    values = dict(zip((a.name for a in overload._schema.arguments), node.args))
    for argument in overload._schema.arguments:
        if argument.name in node.kwargs:
            values[argument.name] = node.kwargs[argument.name]
        elif argument.name not in values and argument.has_default_value():
            values[argument.name] = argument.default_value
    return values


# ------------------------------------------------------------------ constants of the graph
class _Computed:
    """A value the graph computes (not a literal, not a ``get_attr`` constant)."""


COMPUTED = _Computed()


def _constant(gm: GraphModule, value: Any) -> Any:
    """A literal as it is, a ``get_attr`` node's tensor, else ``COMPUTED``."""
    if not isinstance(value, Node):
        return value
    if value.op == "get_attr":
        return attr_path.get(gm, value.target)
    return COMPUTED


def _number(gm: GraphModule, value: Any, kind: type) -> Any:
    """A number argument: literals and one-element constant tensors as ``kind``; a computed
    one-element tensor stays the node (fxloom's operators take it as the number it holds)."""
    found = _constant(gm, value)
    if isinstance(found, torch.Tensor):
        if found.numel() != 1:
            return COMPUTED
        return kind(found.item())
    return value if found is COMPUTED else found


# ------------------------------------------------------------------ standalone operators
@dataclass(frozen=True)
class Rename:
    """A ``quantized_decomposed`` operator that becomes one fxloom operator: ``arguments``
    maps the node's (gm, args, kwargs) to the fxloom operator's arguments, or says why not
    (a str)."""

    becomes: Callable[..., Any]
    arguments: Callable[[GraphModule, dict[str, Any]], tuple | str]


def _per_tensor(gm: GraphModule, a: dict[str, Any]) -> tuple | str:
    x, scale, zero_point, quant_min, quant_max, dtype = (
        a[k] for k in ("input", "scale", "zero_point", "quant_min", "quant_max", "dtype")
    )
    out_dtype = a.get("out_dtype")
    if out_dtype not in (None, torch.float32):
        return f"out_dtype={out_dtype}: fxloom's dequantize returns float32"
    bounds = (_number(gm, quant_min, int), _number(gm, quant_max, int))
    if any(isinstance(b, Node) or b is COMPUTED for b in bounds):
        return "quant_min/quant_max are computed in the graph: fxloom takes numbers there"
    scale, zero_point = _number(gm, scale, float), _number(gm, zero_point, int)
    if COMPUTED in (scale, zero_point):
        return "a scale or zero point of more than one element: that is per channel"
    return (x, scale, zero_point, *bounds, dtype)


def _same_arguments(gm: GraphModule, a: dict[str, Any]) -> tuple | str:
    return tuple(a.values())  # in the schema's order


_QUANTIZE = Rename(ops.quantize, _per_tensor)
_DEQUANTIZE = Rename(ops.dequantize, _per_tensor)

# quantized_decomposed operator -> the fxloom operator it is renamed to
RENAMES: dict[str, Rename] = {
    "quantize_per_tensor.default": _QUANTIZE,
    "quantize_per_tensor.tensor": _QUANTIZE,
    "quantize_per_tensor.tensor2": _QUANTIZE,
    "dequantize_per_tensor.default": _DEQUANTIZE,
    "dequantize_per_tensor.tensor": _DEQUANTIZE,
    "dequantize_per_tensor.tensor2": _DEQUANTIZE,
    # same algorithm: affine per tensor over [min(x, 0), max(x, 0)]
    "choose_qparams.tensor": Rename(ops.choose_qparams, _same_arguments),
}

# quantized_decomposed operators that describe a layer's weight or activations: what they fold
# into (for the error when one is left over)
FORMS: dict[str, str] = {
    "dequantize_per_channel.default": "the int8 weight (axis 0, zero points 0) of a linear "
    "or 2-d convolution (linear_int8, linear_w8, conv2d_int8)",
    "dequantize_per_channel_group.default": "the int4 weight (16 values a group) of a linear "
    "(linear_w4)",
    "choose_qparams_per_token.default": "the activations of a dynamic linear (linear_int8 "
    "dynamic: choose_qparams_per_token -> quantize_per_token -> dequantize_per_token -> linear)",
    "quantize_per_token.default": "the activations of a dynamic linear (see "
    "choose_qparams_per_token)",
    "dequantize_per_token.default": "the activations of a dynamic linear (see "
    "choose_qparams_per_token)",
}

# quantized_decomposed operators fxloom has no operator for, and what to use instead
REFUSED: dict[str, str] = {
    "choose_qparams_per_token_asymmetric.default": "fxloom's dynamic activations are per-token "
    "symmetric: quantize with choose_qparams_per_token (torchao: "
    "Int8DynamicActivationInt8WeightConfig, symmetric), or use fxloom.quantize's "
    'QuantConfig(scheme="dynamic") on the float model',
    "quantize_per_channel.default": "fxloom takes weights already quantized (int8 constants): "
    "convert_pt2e with fold_quantize=True (its default) folds this",
    "quantize_per_channel_group.default": "fxloom takes weights already quantized (int4 "
    "constants): fold the weight's quantization before importing",
    "choose_qparams_symmetric.tensor": "fxloom's choose_qparams is affine per tensor",
}


# ------------------------------------------------------------------ layers
@dataclass(frozen=True)
class Layer:
    """A linear or convolution call, read off its node: ``x``, ``weight`` (the node feeding
    the weight, before any transpose), ``bias``, and for convolutions ``conv`` = (stride,
    padding, dilation, groups)."""

    node: Node
    x: Any
    weight: Any
    bias: Any
    conv: tuple | None = None


def _linear(node: Node) -> Layer | None:
    args = {**dict(zip(("input", "weight", "bias"), node.args)), **node.kwargs}
    return Layer(node, args["input"], args["weight"], args.get("bias"))


def _transposed(value: Any) -> Any:
    """``w`` for ``aten.t(w)`` (export's linear), else None."""
    if isinstance(value, Node) and value.op == "call_function" and value.target is aten.t.default:
        return value.args[0]
    return None


def _addmm(node: Node) -> Layer | None:
    if node.kwargs or len(node.args) != 3:
        return None
    bias, x, transposed = node.args
    weight = _transposed(transposed)
    return None if weight is None else Layer(node, x, weight, bias)


def _mm(node: Node) -> Layer | None:
    weight = _transposed(node.args[1]) if not node.kwargs else None
    return None if weight is None else Layer(node, node.args[0], weight, None)


_CONV_DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def _conv2d(node: Node) -> Layer | None:
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    args = {**_CONV_DEFAULTS, **dict(zip(names, node.args)), **node.kwargs}
    if isinstance(args["padding"], str):
        return None  # "same"/"valid": no integer padding to give conv2d_int8
    conv = tuple(args[k] for k in ("stride", "padding", "dilation")) + (args["groups"],)
    return Layer(node, args["input"], args["weight"], args["bias"], conv)


def _convolution(node: Node) -> Layer | None:
    x, weight, bias, stride, padding, dilation, transposed, _, groups = node.args
    if transposed:
        return None
    return Layer(node, x, weight, bias, (stride, padding, dilation, groups))


# the calls that are layers, and how to read one
LAYERS: dict[Any, Callable[[Node], Layer | None]] = {
    torch.nn.functional.linear: _linear,
    torch._C._nn.linear: _linear,
    aten.linear.default: _linear,
    aten.addmm.default: _addmm,
    aten.mm.default: _mm,
    torch.nn.functional.conv2d: _conv2d,
    torch.conv2d: _conv2d,
    aten.conv2d.default: _conv2d,
    aten.convolution.default: _convolution,
}


# ------------------------------------------------------------------ weight and activation forms
@dataclass(frozen=True)
class Int8Weight:
    node: Node  # the get_attr of the int8 weight
    scale: torch.Tensor  # float32, one per output channel


@dataclass(frozen=True)
class Int4Weight:
    packed: torch.Tensor  # uint8 [N, K/2], values 0..15 (ops.pack_int4)
    scale: torch.Tensor  # float32 [N, K/group]
    zero_point: torch.Tensor  # int32 [N, K/group], in 0..15 terms
    group_size: int


@dataclass(frozen=True)
class Static:
    q: Any  # the integer activations
    scale: float
    zero_point: int


@dataclass(frozen=True)
class Dynamic:
    x: Any  # the float activations, quantized per token inside the layer


def _producer(value: Any) -> str | None:
    return decomposed_name(value.target) if _is_call(value) else None


def _is_call(value: Any) -> bool:
    return isinstance(value, Node) and value.op == "call_function"


def _int8_weight(gm: GraphModule, node: Node, conv: bool) -> Int8Weight | None:
    name = _producer(node)
    if name not in ("dequantize_per_channel.default", "dequantize_per_tensor.default",
                    "dequantize_per_tensor.tensor"):  # fmt: skip
        return None
    a = _bound(node)
    w_node = a["input"]
    w = _constant(gm, w_node)
    if not isinstance(w, torch.Tensor) or w.dtype != torch.int8 or w.dim() != (4 if conv else 2):
        return None
    if a.get("out_dtype") not in (None, torch.float32):
        return None
    if name == "dequantize_per_channel.default":
        scale, zero_point, axis = (_constant(gm, a[k]) for k in ("scales", "zero_points", "axis"))
        if axis != 0 or not isinstance(scale, torch.Tensor):
            return None
    else:
        scale, zero_point = _number(gm, a["scale"], float), _number(gm, a["zero_point"], int)
        if not isinstance(scale, float):
            return None
        scale = torch.full((w.shape[0],), scale)
    symmetric = zero_point is None or (
        not zero_point.any() if isinstance(zero_point, torch.Tensor) else zero_point == 0
    )
    if not symmetric or scale.numel() != w.shape[0]:
        return None  # fxloom's int8 weights are symmetric, one scale per output channel
    return Int8Weight(w_node, scale.detach().reshape(-1).float())


def _int4_weight(gm: GraphModule, node: Node) -> Int4Weight | None:
    if _producer(node) != "dequantize_per_channel_group.default":
        return None
    a = _bound(node)
    w, scale, zero_point, quant_min, quant_max, group_size, output_dtype = (
        _constant(gm, a[k])
        for k in ("input", "scales", "zero_points", "quant_min", "quant_max", "group_size",
                  "output_dtype")
    )  # fmt: skip
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not isinstance(scale, torch.Tensor):
        return None
    if not all(isinstance(v, int) for v in (quant_min, quant_max, group_size)):
        return None
    n, k = w.shape
    if quant_max - quant_min > 15 or k % group_size or k % 2 or output_dtype != torch.float32:
        return None
    groups = (n, k // group_size)
    if zero_point is None:
        zero_point = torch.zeros(groups, dtype=torch.int64)
    if not isinstance(zero_point, torch.Tensor) or zero_point.is_floating_point():
        return None
    # fxloom's int4 codes are 0..15: shift the range (and the zero point with it) to start at 0
    codes = (w.to(torch.int32) - quant_min).clamp(0, 15)
    return Int4Weight(
        ops.pack_int4(codes),
        scale.detach().reshape(groups).float(),
        (zero_point.reshape(groups) - quant_min).to(torch.int32),
        group_size,
    )


def _activations(gm: GraphModule, x: Any) -> Static | Dynamic | None:
    """How ``x`` reaches the layer: integers with numbers for parameters (``Static``), per
    token symmetric (``Dynamic``), or None (float: the layer reads it as it is)."""
    name = _producer(x)
    if name in ("dequantize_per_tensor.default", "dequantize_per_tensor.tensor"):
        arguments = _per_tensor(gm, _bound(x))
        if isinstance(arguments, tuple) and not any(isinstance(a, Node) for a in arguments[1:3]):
            return Static(arguments[0], arguments[1], arguments[2])
    if name == "dequantize_per_token.default":
        return _per_token_symmetric(x)
    return None


def _per_token_symmetric(dequantize: Node) -> Dynamic | None:
    """``dequantize_per_token(quantize_per_token(x, s, zp, -128, 127, int8), s, zp, ...)`` with
    ``(s, zp) = choose_qparams_per_token(x, int8)``: fxloom's per-token symmetric int8."""
    d = _bound(dequantize)
    q, scale, zero_point = d["input"], d["scales"], d["zero_points"]
    if _producer(q) != "quantize_per_token.default" or d["output_dtype"] != torch.float32:
        return None
    x, q_scale, q_zero_point, quant_min, quant_max, dtype = _bound(q).values()
    if (q_scale, q_zero_point) != (scale, zero_point) or dtype != torch.int8:
        return None
    if (quant_min, quant_max) not in ((-128, 127), (-127, 127)):
        return None
    parts = [_getitem_of(value) for value in (scale, zero_point)]
    if parts[0] is None or parts != [(parts[0][0], 0), (parts[0][0], 1)]:
        return None
    chosen = parts[0][0]
    chosen_for = _bound(chosen)["input"] if _is_call(chosen) and _producer(chosen) else None
    if _producer(chosen) != "choose_qparams_per_token.default" or chosen_for is not x:
        return None
    return Dynamic(x)


def _getitem_of(value: Any) -> tuple[Node, int] | None:
    if _is_call(value) and value.target is operator.getitem:
        return value.args[0], value.args[1]
    return None


# ------------------------------------------------------------------ the layer each combination becomes
def _fold_layer(gm: GraphModule, layer: Layer) -> tuple[Callable, tuple] | None:
    """The fxloom operator call that computes ``layer`` and its quantized inputs, or None."""
    conv = layer.conv is not None
    weight = _int8_weight(gm, layer.weight, conv)
    if weight is None:
        if conv or layer.weight is None:
            return None
        int4 = _int4_weight(gm, layer.weight)
        if int4 is None:
            return None
        scale, zero_point = (
            _buffer(gm, layer, "scale", int4.scale),
            _buffer(gm, layer, "zero_point", int4.zero_point),
        )
        packed = _buffer(gm, layer, "int4", int4.packed)
        return ops.linear_w4, (layer.x, packed, scale, zero_point, int4.group_size, layer.bias)
    activations = _activations(gm, layer.x)
    if conv and not isinstance(activations, Static):
        return None  # fxloom has no weight-only convolution
    scale = _buffer(gm, layer, "scale", weight.scale)
    if conv:
        stride, padding, dilation = (_pair(v) for v in layer.conv[:3])
        groups = layer.conv[3]
        return ops.conv2d_int8, (
            activations.q, activations.scale, activations.zero_point, weight.node, scale,
            layer.bias, stride, padding, dilation, groups, 0.0, 0, False,
        )  # fmt: skip
    if isinstance(activations, Static):
        return ops.linear_int8, (
            activations.q, activations.scale, activations.zero_point, weight.node, scale,
            layer.bias, 0.0, 0, False, False,
        )  # fmt: skip
    if isinstance(activations, Dynamic):
        return ops.linear_int8, (
            activations.x,
            0.0,
            0,
            weight.node,
            scale,
            layer.bias,
            0.0,
            0,
            False,
            True,
        )
    return ops.linear_w8, (layer.x, weight.node, scale, layer.bias)


def _pair(value: Any) -> list[int]:
    return [value, value] if isinstance(value, int) else list(value)


def _buffer(gm: GraphModule, layer: Layer, what: str, tensor: torch.Tensor) -> Node:
    """A ``get_attr`` of ``tensor``, installed as a buffer named after the layer's weight."""
    weight = layer.weight.args[0] if _is_call(layer.weight) else None
    base = weight.target if isinstance(weight, Node) and weight.op == "get_attr" else "imported"
    path = attr_path.free_name(gm, f"{base}_{what}".replace(".", "_"))
    attr_path.install(gm, path, tensor.contiguous(), as_buffer=True)
    with gm.graph.inserting_before(layer.node):
        return gm.graph.get_attr(path)


# ------------------------------------------------------------------ the pass
def import_quantized(gm: GraphModule) -> GraphModule:
    """A copy of ``gm`` with its ``quantized_decomposed`` calls as fxloom's operators.

    Layers first (``LAYERS``: a linear or convolution whose weight is dequantized from int8
    or int4 constants becomes one fxloom operator, reading its activations' integers where
    they are quantized per tensor or per token), then ``RENAMES``; any ``quantized_decomposed``
    call left raises ``QuantizeError`` naming the node and its line.
    """
    gm = copy.deepcopy(gm)
    graph = gm.graph
    constants = {node.target for node in graph.nodes if node.op == "get_attr"}
    for node in list(graph.nodes):
        read = LAYERS.get(node.target) if node.op == "call_function" else None
        layer = read(node) if read is not None else None
        folded = _fold_layer(gm, layer) if layer is not None else None
        if folded is not None:
            _replace(gm, node, *folded)
    for node in list(graph.nodes):
        rename = RENAMES.get(decomposed_name(node.target)) if node.op == "call_function" else None
        if rename is not None:
            arguments = rename.arguments(gm, _bound(node))
            if isinstance(arguments, str):
                raise _refusal(gm, node, arguments)
            _replace(gm, node, rename.becomes, arguments)
    for node in graph.nodes:
        name = decomposed_name(node.target) if node.op == "call_function" else None
        if name is not None:
            raise _refusal(gm, node, _why_left(name))
    for node in list(graph.find_nodes(op="call_function", target=ops.quantize)):
        _fold_output_quantize(gm, node)
    _drop_unused_constants(gm, constants)
    layouts.keep_channels_last(gm)  # conv2d_int8 returns channels-last: contiguous where read
    graph.lint()
    gm.recompile()
    return gm


def _replace(gm: GraphModule, node: Node, target: Callable, args: tuple) -> None:
    with gm.graph.inserting_before(node):
        new = gm.graph.call_function(target, tuple(args))
    new.meta = dict(node.meta)
    node.replace_all_uses_with(new)
    _erase_dead(gm, node)


# the ReLUs an int8 layer computes itself before requantizing (its ``relu`` argument)
RELUS = {torch.relu, torch.nn.functional.relu, aten.relu.default}
# int8 layer -> the positions of its (out_scale, out_zero_point, relu) arguments
REQUANTIZES = {ops.linear_int8: (6, 7, 8), ops.conv2d_int8: (10, 11, 12)}


def _fold_output_quantize(gm: GraphModule, quantize: Node) -> None:
    """``quantize(relu?(layer(...)))`` -> ``layer(..., out_scale, out_zero_point, relu)`` for
    a static int8 layer returning float that nothing else reads: its output is requantized by
    the same arithmetic as ``ops.quantize`` (uint8, 0..255), inside its kernel."""
    x, scale, zero_point, quant_min, quant_max, dtype = quantize.args
    if (quant_min, quant_max, dtype) != (*ops.ACTIVATION_RANGE, torch.uint8):
        return
    relu = _is_relu(x)
    layer = x.args[0] if relu else x
    if not _is_call(layer) or layer.target not in REQUANTIZES or len(layer.users) != 1:
        return
    if relu and len(x.users) != 1:
        return
    at_scale, at_zero_point, at_relu = REQUANTIZES[layer.target]
    args = list(layer.args)
    if args[at_scale] != 0.0 or args[at_relu] or (layer.target is ops.linear_int8 and args[9]):
        return  # already requantizing, or dynamic
    args[at_scale], args[at_zero_point], args[at_relu] = scale, zero_point, relu
    layer.args = tuple(args)
    quantize.replace_all_uses_with(layer)
    _erase_dead(gm, quantize)


def _is_relu(node: Any) -> bool:
    """A ReLU call that writes nothing (``inplace`` false or not given)."""
    if not _is_call(node) or node.target not in RELUS:
        return False
    inplace = node.kwargs.get("inplace", node.args[1] if len(node.args) > 1 else False)
    return inplace is False and set(node.kwargs) <= {"inplace"}


# what may be erased once nothing reads it: these compute without effects
_PURE = (operator.getitem, aten.t.default, *RELUS)


def _erase_dead(gm: GraphModule, node: Node) -> None:
    """Erase ``node`` and what fed only it, as far as that computes without effects."""
    work = [node]
    while work:
        current = work.pop()
        if current.graph is None or not (current is node or _pure(current)):
            continue
        for check in [user for user in current.users if _checks_only(user, current)]:
            gm.graph.erase_node(check)  # a check of a value that is gone (a tuple's length)
        if current.users:
            continue
        inputs = current.all_input_nodes
        gm.graph.erase_node(current)
        work.extend(inputs)


def _pure(node: Node) -> bool:
    if node.op == "get_attr":
        return True
    return node.op == "call_function" and (
        node.target in _PURE or decomposed_name(node.target) is not None
    )


def _checks_only(user: Node, value: Node) -> bool:
    """Whether ``user`` is a run-time check (a tracer guard) of ``value`` alone."""
    return (
        user.op == "call_function"
        and is_runtime_check(user.target)
        and user.all_input_nodes == [value]
    )


def _drop_unused_constants(gm: GraphModule, before: set[str]) -> None:
    """Delete the constants the graph read before and reads no longer (scales and zero points
    now held in fxloom's layout; the int8 weights stay, read by the fxloom operators)."""
    read = {node.target for node in gm.graph.nodes if node.op == "get_attr"}
    called = {node.target for node in gm.graph.nodes if node.op == "call_module"}
    for name in before - read:
        if not any(name.startswith(f"{path}.") for path in called):
            attr_path.delete(gm, name)


def _why_left(name: str) -> str:
    if name in FORMS:
        return f"it is read only as {FORMS[name]}, and here it is not"
    if name in REFUSED:
        return REFUSED[name]
    return "fxloom has no operator for it (RENAMES and FORMS in fxloom/quantize/importer.py " \
        "list what it imports)"  # fmt: skip


def _refusal(gm: GraphModule, node: Node, why: str) -> QuantizeError:
    return QuantizeError(
        f"import_quantized: {node.name} ({_where(gm, node)}) calls "
        f"{NAMESPACE}.{decomposed_name(node.target)}: {why}"
    )


def _where(gm: GraphModule, node: Node) -> str:
    """The user's line when tracing recorded one, else the graph code's line of the node."""
    location = source_location(node)
    if location is not None:
        return location.short
    for number, line in enumerate(gm.code.splitlines(), start=1):
        if line.lstrip().startswith(f"{node.name} = "):
            return f"line {number} of the graph's code: {line.strip()[:120]}"
    return "no line recorded"
