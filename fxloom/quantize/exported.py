"""Quantizing exported programs: weighted ATen operators lifted back to layers, then ``prepare``.

An exported program (``fxloom.export``) is a graph of ``torch.ops.aten.*`` calls whose weights
are ``get_attr`` nodes in ``ep.module()``. ``lift_layers`` rewrites, on a copy, each weighted
operator of ``LIFTS`` into a ``call_module`` of the float layer it computes, installed where its
weight lives (``encoder.0.weight`` -> ``encoder.0``, so reports name the same layers as for a
traced model):

    aten.addmm(b, x, aten.t(w))                  -> nn.Linear      (w, b)
    aten.linear(x, w, b)                         -> nn.Linear
    aten.convolution(x, w, b, ..., groups)       -> nn.Conv1d/2d/3d (not transposed)
      followed by aten._native_batch_norm_legit_no_training(...)[0]
                                                 -> the same conv, the batch norm folded in
    aten.max_pool2d_with_indices(...)[0]         -> aten.max_pool2d (indices unused)

Everything else stays an ATen call; ``table`` lists the ATen operators with int8 kernels
(``aten.add.Tensor``, ``aten.relu.default``, views, ...). ``prepare(ep, example_inputs)`` does
this itself, so the whole flow is the same as for a module::

    >>> import torch
    >>> from fxloom.export import export
    >>> from fxloom.quantize import prepare, calibrate, convert, report
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    >>> x = torch.randn(4, 8)
    >>> prepared = prepare(export(model, (x,)), (x,))
    >>> int8 = convert(calibrate(prepared, [torch.randn(4, 8) for _ in range(4)], progress=False))
    >>> [row.calls for row in report(int8).quantized]
    ['0, a Linear']

An exported program checks its inputs' shapes: calibrate with batches of the example's shape
(or export with ``dynamic_shapes``).

node.meta: a lifted node keeps the operator node's meta.

Depends on: the IR, ``passes.fuse.weights`` (batch-norm folding arithmetic), torch.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fxloom import attr_path
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.passes.fuse.weights import fuse_conv_bn_weights

__all__ = ["LIFTS", "lift_layers"]

aten = torch.ops.aten
CONVS = {3: nn.Conv1d, 4: nn.Conv2d, 5: nn.Conv3d}  # weight rank -> layer


def lift_layers(gm: GraphModule) -> GraphModule:
    """A copy of ``gm`` (``ep.module()``) with the weighted operators of ``LIFTS`` as layers."""
    gm = copy.deepcopy(gm)
    for node in list(gm.graph.nodes):
        lift = LIFTS.get(node.target) if node.op == "call_function" else None
        if lift is not None:
            lift(gm, node)
    for node in list(gm.graph.find_nodes(op="get_attr")):
        if not node.users:  # weights now read by the layers, folded batch norms
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


def _lift_addmm(gm: GraphModule, node: Node) -> None:
    bias, x, transposed = node.args[:3]
    if node.kwargs or not _is(transposed, aten.t.default):
        return
    _install_linear(gm, node, x, transposed.args[0], bias)


def _lift_linear(gm: GraphModule, node: Node) -> None:
    x, weight, bias = (*node.args, None)[:3]
    if not node.kwargs:
        _install_linear(gm, node, x, weight, bias)


def _install_linear(gm: GraphModule, node: Node, x: Any, weight: Any, bias: Any) -> None:
    tensors = _attrs(gm, weight, bias)
    if tensors is None or tensors[0].dim() != 2:
        return
    w, b = tensors
    layer = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
    _set_weights(layer, w, b)
    _replace(gm, node, _owner(weight), layer, x)


def _lift_convolution(gm: GraphModule, node: Node) -> None:
    x, weight, bias, stride, padding, dilation, transposed, _, groups = node.args
    tensors = _attrs(gm, weight, bias)
    if transposed or tensors is None or tensors[0].dim() not in CONVS:
        return
    w, b = tensors
    cls = CONVS[w.dim()]
    layer = cls(
        w.shape[1] * groups, w.shape[0], tuple(w.shape[2:]), tuple(stride), tuple(padding),
        tuple(dilation), groups, bias=True, device="meta",
    )  # fmt: skip
    batch_norm, output = _folded_batch_norm(gm, node)
    if batch_norm is not None:
        bn_w, bn_b, mean, var = (_attr(gm, a.target) for a in batch_norm.args[1:5])
        w, b = fuse_conv_bn_weights(w, b, mean, var, batch_norm.args[6], bn_w, bn_b, groups=groups)
    elif b is None:
        layer.bias = None
    _set_weights(layer, w, b)
    _replace(gm, output, _owner(weight), layer, x)
    if batch_norm is not None:
        gm.graph.erase_node(batch_norm)
        gm.graph.erase_node(node)


def _folded_batch_norm(gm: GraphModule, conv: Node) -> tuple[Node | None, Node]:
    """The inference batch norm that only ``conv`` feeds, and its output (``[0]``), if any."""
    if len(conv.users) != 1:
        return None, conv
    (user,) = conv.users
    if not _is(user, aten._native_batch_norm_legit_no_training.default) or user.args[0] is not conv:
        return None, conv
    if not all(isinstance(a, Node) and a.op == "get_attr" for a in user.args[1:5]):
        return None, conv
    getitems = list(user.users)
    if len(getitems) != 1 or getitems[0].target is not operator.getitem or getitems[0].args[1]:
        return None, conv
    return user, getitems[0]


def _attrs(gm: GraphModule, weight: Any, bias: Any) -> tuple[torch.Tensor, Any] | None:
    """The weight (and bias, or None) when both are ``get_attr`` nodes; None otherwise."""
    if not (isinstance(weight, Node) and weight.op == "get_attr"):
        return None
    if bias is not None and not (isinstance(bias, Node) and bias.op == "get_attr"):
        return None
    w = _attr(gm, weight.target)
    return w, None if bias is None else _attr(gm, bias.target)


def _attr(gm: GraphModule, target: str) -> torch.Tensor:
    return attr_path.find(gm, target)


def _set_weights(layer: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    layer.weight = nn.Parameter(weight.detach(), requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias.detach(), requires_grad=False)


def _owner(weight: Node) -> str:
    return weight.target.rpartition(".")[0] or f"{weight.target}_layer"


def _replace(gm: GraphModule, node: Node, path: str, layer: nn.Module, x: Node) -> None:
    path = _free_path(gm, path)
    gm.add_submodule(path, layer)
    with gm.graph.inserting_before(node):
        call = gm.graph.call_module(path, (x,))
    call.meta = dict(node.meta)
    node.replace_all_uses_with(call)
    inputs = node.all_input_nodes
    gm.graph.erase_node(node)
    for arg in inputs:
        if _is(arg, aten.t.default) and not arg.users:
            gm.graph.erase_node(arg)


def _free_path(gm: GraphModule, path: str) -> str:
    """``path`` itself when what lives there is a plain holder of tensors (export's), else new."""
    try:
        current = gm.get_submodule(path)
    except AttributeError:
        return path
    if type(current) is nn.Module and not any(True for _ in current.children()):
        return path
    return attr_path.free_name(gm, path)


def _is(value: Any, target: Any) -> bool:
    return isinstance(value, Node) and value.op == "call_function" and value.target is target


def _max_pool_without_indices(gm: GraphModule, node: Node) -> None:
    """``max_pool2d_with_indices(...)[0]``, indices unused -> ``max_pool2d`` (an int8 kernel)."""
    users = list(node.users)
    if len(users) != 1 or users[0].target is not operator.getitem or users[0].args[1] != 0:
        return
    (user,) = users
    with gm.graph.inserting_before(node):
        pool = gm.graph.call_function(aten.max_pool2d.default, node.args, node.kwargs)
    pool.meta = dict(user.meta)
    user.replace_all_uses_with(pool)
    gm.graph.erase_node(user)
    gm.graph.erase_node(node)


# ATen operator -> how to lift it to a layer, or to an operator with an int8 kernel (each
# does nothing where its pattern does not match)
LIFTS: dict[Any, Callable[[GraphModule, Node], None]] = {
    aten.addmm.default: _lift_addmm,
    aten.linear.default: _lift_linear,
    aten.convolution.default: _lift_convolution,
    aten.max_pool2d_with_indices.default: _max_pool_without_indices,
}
