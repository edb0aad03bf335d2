"""Rewriting a module and its graph once a layer and its batch norm have been folded.

The layer node is pointed at the folded weights (a new module, or new attributes read by new
``get_attr`` nodes); the batch-norm node is erased, and whatever only it needed (its module,
its ``get_attr`` nodes and their attributes) goes with it. Nothing the input model holds is
modified: new values are new objects, installed in containers no other node uses whole.

Depends on: torch, the IR, ``attrs``, ``sites``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from fxloom import attr_path
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.passes.fuse.attrs import AttrUses, fused_path
from fxloom.passes.fuse.sites import Producer, bind, set_argument

__all__ = ["VALUE_META_KEYS", "install", "remove_batch_norm"]

# Node meta describing the node's value: after a fold the layer node produces the batch
# norm's value, so these follow the value.
VALUE_META_KEYS = ("val", "tensor_meta")


def install(
    gm: GraphModule, producer: Producer, weight: torch.Tensor, bias: torch.Tensor, uses: AttrUses
) -> list[Any]:
    """Make the producer node compute with the folded weight and bias; return the new objects
    holding them (a module, or two tensors)."""
    if producer.node.op == "call_module":
        return _install_module(gm, producer.node, weight, bias, uses)
    return _install_attributes(gm, producer.node, weight, bias, uses)


def _install_module(
    gm: GraphModule, node: Node, weight: torch.Tensor, bias: torch.Tensor, uses: AttrUses
) -> list[Any]:
    module = attr_path.get(gm, node.target)
    fused = _module_with(module, weight, bias)
    if uses.users(node.target) == 1:  # this node is the module's only use: replace it
        attr_path.install(gm, node.target, fused)
    else:
        path = fused_path(gm, node.target, uses)
        attr_path.install(gm, path, fused)
        uses.remove(node.target)
        node.target = path
        uses.add(path)
    return [fused]


def _module_with(
    module: torch.nn.Module, weight: torch.Tensor, bias: torch.Tensor
) -> torch.nn.Module:
    """A copy of ``module`` (a new object) with ``weight`` and ``bias`` as its parameters."""
    old_weight, old_bias = module.weight, module.bias
    # Shared in the copy, then replaced: no point copying tensors about to be dropped.
    memo = {id(t): t for t in (old_weight, old_bias) if t is not None}
    fused = copy.deepcopy(module, memo)
    fused.weight = torch.nn.Parameter(weight, requires_grad=old_weight.requires_grad)
    bias_grad = (old_bias if old_bias is not None else old_weight).requires_grad
    fused.bias = torch.nn.Parameter(bias, requires_grad=bias_grad)
    return fused


def _install_attributes(
    gm: GraphModule, node: Node, weight: torch.Tensor, bias: torch.Tensor, uses: AttrUses
) -> list[Any]:
    bound = bind(node)
    old_weight, old_bias = bound["weight"], bound["bias"]
    new_weight = _new_get_attr(gm, node, weight, old_weight, old_weight.target, uses)
    bias_base = old_bias.target if old_bias is not None else f"{old_weight.target}_bias"
    like = old_bias if old_bias is not None else old_weight
    new_bias = _new_get_attr(gm, node, bias, like, bias_base, uses)
    set_argument(node, "weight", new_weight)
    set_argument(node, "bias", new_bias)
    for old in (old_weight, old_bias):
        if old is not None:
            _drop_if_unused(gm, old, uses)
    return [attr_path.get(gm, new.target) for new in (new_weight, new_bias)]


def _new_get_attr(
    gm: GraphModule, user: Node, value: torch.Tensor, like: Node, original: str, uses: AttrUses
) -> Node:
    """Store ``value`` at ``<original>_fused`` as ``like``'s attribute is stored (parameter or
    buffer), read by a new ``get_attr`` node before ``user``."""
    target = fused_path(gm, original, uses)
    stored = attr_path.get(gm, like.target)
    if isinstance(stored, torch.nn.Parameter):
        value = torch.nn.Parameter(value, requires_grad=stored.requires_grad)
    attr_path.install(gm, target, value, as_buffer=True)
    with gm.graph.inserting_before(user):
        new_node = gm.graph.get_attr(target)
    new_node.meta = dict(like.meta)
    uses.add(target)
    return new_node


def remove_batch_norm(gm: GraphModule, bn_node: Node, layer_node: Node, uses: AttrUses) -> None:
    """Erase the batch-norm node (its users now use the layer) and what only it needed."""
    for key in VALUE_META_KEYS:
        if key in bn_node.meta:
            layer_node.meta[key] = bn_node.meta[key]
    bn_node.replace_all_uses_with(layer_node)
    inputs = bn_node.all_input_nodes
    gm.graph.erase_node(bn_node)
    if bn_node.op == "call_module":
        uses.remove(bn_node.target)
        if not uses.is_used(bn_node.target):
            attr_path.delete(gm, bn_node.target)
    for node in inputs:
        if node.op == "get_attr":
            _drop_if_unused(gm, node, uses)


def _drop_if_unused(gm: GraphModule, node: Node, uses: AttrUses) -> None:
    """Erase a ``get_attr`` node nobody uses, and its attribute if no other node reaches it."""
    if node.users:
        return
    gm.graph.erase_node(node)
    uses.remove(node.target)
    if not uses.is_used(node.target):
        attr_path.delete(gm, node.target)
