"""Memory formats in a converted graph: int8 activations stay channels-last between layers.

oneDNN's int8 convolution (``kernels``, conv2d_int8's row) computes on channels-last (NHWC)
activations. Copying each input to channels-last and each output back to NCHW cost about a
fifth of ResNet-50's int8 forward, so the kernel returns its output as oneDNN makes it,
channels-last: the same values, another layout. Nearly every operator computes the same
values on either layout; a few read the layout itself: ``view`` raises on a channels-last
tensor ("view size is not compatible with input tensor's size and stride"), as do
``stride()``-, ``is_contiguous()``- or ``data_ptr()``-reading code, and the model's caller may
do any of these with what it returns.

``keep_channels_last(gm)`` follows each value that may be channels-last
(``MAKES_CHANNELS_LAST``) through the users that compute the same values on any layout and
pass it on (``PASSES_LAYOUT``; ``ENDS_LAYOUT``: those that take any layout and return a
contiguous tensor or none) and gives every other user, the graph's output included,
``value.contiguous()`` instead (2-d max pooling, ``POOLS_CODES``, becomes
``ops.max_pool2d_int8`` of the codes, which takes any layout): a no-op on a value that is
contiguous already (the reference kernels' outputs), one copy where it is not. A ResNet's
graph (convolutions, residual adds, max pooling, the final dequantize, average pool and
flatten) gets none.

Depends on: the IR, ``ops``.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.nn.modules.utils import _pair

from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.ops.signatures import SIGNATURES
from fxloom.quantize import ops

__all__ = [
    "ENDS_LAYOUT",
    "MAKES_CHANNELS_LAST",
    "PASSES_LAYOUT",
    "POOLS_CODES",
    "keep_channels_last",
]

aten = torch.ops.aten

# the operators whose output may be channels-last
MAKES_CHANNELS_LAST = frozenset({ops.conv2d_int8, ops.conv2d_add_int8})

# Users that compute the same values whatever the memory format of their tensor inputs; their
# output may be channels-last in turn (elementwise and pooling operators keep the input's).
PASSES_LAYOUT = {
    "call_function": frozenset(
        {
            ops.conv2d_int8,
            ops.conv2d_add_int8,
            ops.add_int8,
            ops.mul_int8,
            ops.quantize,
            ops.dequantize,
            ops.max_pool2d_int8,
            torch.clamp_min,
            torch.relu,
            torch.flatten,
            torch.nn.functional.relu,
            torch.nn.functional.adaptive_avg_pool2d,
            aten.clamp_min.default,
            aten.relu.default,
            aten.flatten.using_ints,
            aten.reshape.default,
        }
    ),  # fmt: skip
    "call_method": frozenset({"relu", "clamp_min", "flatten", "reshape"}),
    "call_module": (
        nn.AvgPool2d,
        nn.AdaptiveAvgPool2d,
        nn.ReLU,
        nn.Dropout,
        nn.Identity,
        nn.Flatten,
    ),
}
# Torch's max pooling is not: torch 2.13's max_pool2d raises on a channels-last uint8 tensor
# ("Expected input_depth * input_height * input_width <= std::numeric_limits<integer_t>::max()")
# and runs 10x slower on a contiguous one than on channels-last float (1x64x112x112, one
# thread: 6.8 ms, 0.74 ms with casts to float and back). So these become
# ``ops.max_pool2d_int8`` of the codes (0.17 ms there, the same values, channels-last kept).
POOLS_CODES = {
    "call_module": (nn.MaxPool2d,),
    "call_function": frozenset({torch.nn.functional.max_pool2d, torch.max_pool2d}),
}
# Users that take any layout and return no tensor or a new contiguous one (the linear kernels
# read their input through ``reshape``): nothing to follow past them.
ENDS_LAYOUT = {
    "call_function": frozenset({ops.linear_int8, ops.linear_w8, ops.linear_w4}),
    "call_method": frozenset({"size", "dim", "contiguous"}),
}


def keep_channels_last(gm: GraphModule) -> int:
    """Give each user of ``gm`` that may see a channels-last value it cannot take a
    contiguous copy (see the module docstring); the number of ``contiguous`` calls added."""
    graph = gm.graph
    maybe: set[Node] = set()
    made: dict[Node, Node] = {}
    for node in list(graph.nodes):
        inputs = [value for value in node.all_input_nodes if value in maybe]
        if node.op == "call_function" and node.target in MAKES_CHANNELS_LAST:
            maybe.add(node)
        elif not inputs or _listed(ENDS_LAYOUT, gm, node):
            continue
        elif _listed(PASSES_LAYOUT, gm, node):
            maybe.add(node)
        elif _listed(POOLS_CODES, gm, node) and _one_tensor_out(gm, node):
            maybe.add(_pool_codes(gm, node))
        else:
            for value in inputs:
                node.replace_input_with(value, _contiguous(graph, value, made))
    return len(made)


def _listed(table: dict, gm: GraphModule, node: Node) -> bool:
    listed = table.get(node.op)
    if listed is None:
        return False
    if node.op == "call_module":
        return isinstance(gm.get_submodule(node.target), listed)
    return node.target in listed


def _one_tensor_out(gm: GraphModule, node: Node) -> bool:
    """A pooling call that returns only the pooled tensor (no indices)."""
    if node.op == "call_module":
        return not gm.get_submodule(node.target).return_indices
    bound = _pool_arguments(node)
    return bound is not None and not bound["return_indices"]


def _pool_codes(gm: GraphModule, node: Node) -> Node:
    """``node`` (a 2-d max pooling) turned into ``ops.max_pool2d_int8`` with its geometry, in
    place: its name, users and the plan's decision about it stay."""
    if node.op == "call_module":
        pool = gm.get_submodule(node.target)
        value = node.args[0]
        geometry = (pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)
    else:
        bound = _pool_arguments(node)
        value = bound["input"]
        geometry = tuple(bound[name] for name in _GEOMETRY)
    kernel, stride, padding, dilation, ceil_mode = geometry
    pairs = [list(_pair(v)) for v in (kernel, stride or kernel, padding, dilation)]
    module = node.target if node.op == "call_module" else None
    node.op, node.target = "call_function", ops.max_pool2d_int8
    node.args, node.kwargs = (value, *pairs, bool(ceil_mode)), {}
    if module is not None and not gm.graph.find_nodes(op="call_module", target=module):
        gm.delete_submodule(module)  # no other call of the same pooling module
    return node


_GEOMETRY = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
# ``F.max_pool2d`` and ``torch.max_pool2d`` take max_pool2d_with_indices's parameters (the
# signature table ``normalize`` reads; torch's C++ function spells the default stride [])
_POOL_SIGNATURE = inspect.signature(SIGNATURES[torch.nn.functional.max_pool2d])


def _pool_arguments(node: Node) -> dict | None:
    """A max_pool2d call's arguments by name, defaults filled (None: they do not bind)."""
    try:
        bound = _POOL_SIGNATURE.bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return bound.arguments


def _contiguous(graph, value: Node, made: dict[Node, Node]) -> Node:
    """One ``value.contiguous()`` per value, shared by its users that need it."""
    if value not in made:
        with graph.inserting_after(value):
            made[value] = graph.create_node(
                "call_method", "contiguous", (value,), name=f"{value.name}_contiguous"
            )
    return made[value]
