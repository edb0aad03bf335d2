"""How the subgraph matcher words its reasons: nodes as ``%name``, values as literals.

Reasons are built only when explaining (``SubgraphMatcher.explain``): the matcher passes a
template and raw values, and ``shown`` renders each value.

Depends on: the IR and ``fxloom._format``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from fxloom._format import describe_target, format_arg
from fxloom.node import Node

__all__ = ["Constant", "Place", "Target", "kind", "shown"]


# How a reason names what a node does, before ``describe_target``'s text.
_TARGET_KIND = {"call_function": "target", "call_method": "method", "call_module": "module"}


def _target_text(node: Node) -> str:
    return f"{_TARGET_KIND.get(node.op, 'attribute')} {describe_target(node)}"


def kind(node: Node) -> str:
    """What a node does, as in "no user of %x is a call of torch.sigmoid"."""
    if node.op in ("call_function", "call_method"):
        return f"a call of {describe_target(node)}"
    return f"a {node.op} of {node.target}"


class Constant(NamedTuple):
    """A value shown as a literal in a reason (``'tanh'``, ``2.0``, ``%x`` for a node)."""

    value: Any


class Place(NamedTuple):
    """Where an argument sits: a position (``0``, ``"1[0]"``) or a keyword name."""

    where: Any


class Target(NamedTuple):
    """A node's target, described for a reason."""

    node: Node


def shown(value: Any) -> str:
    """A value of a reason as text: ``%name`` for nodes, the literal for a ``Constant``."""
    if type(value) is Node:
        return f"%{value.name}"
    if isinstance(value, Constant):
        return format_arg(value.value)
    if isinstance(value, Place):
        where = value.where
        positional = isinstance(where, int) or str(where)[:1].isdigit()
        return f"argument {where}" if positional else f"keyword argument {where}"
    if isinstance(value, Target):
        return _target_text(value.node)
    return str(value)
