"""Pickling a ``Graph`` as a flat list of node records.

The default pickler would follow ``prev``/``next`` pointers recursively, one
stack frame per node, and overflow on large graphs. Records refer to earlier
nodes by position instead.

``torch.ops`` operators (``torch.ops.aten.add.Tensor``, custom ones made with
``torch.library``) cannot be pickled themselves: they travel as their path
under ``torch.ops`` — in targets, arguments and ``meta`` alike — and are looked
up again on loading, so the library defining a custom operator must be loaded
(imported) before the graph is. Memory formats (``torch.channels_last``, in a
``.contiguous(memory_format=...)`` call or shape propagation's metadata) travel
by name too: they pickle only at protocol 4 and above, and ``torch.save`` uses 2.
"""

from __future__ import annotations

from typing import Any

import torch

from fxloom import attr_path
from fxloom.graph import Graph
from fxloom.node import Node, map_aggregate
from fxloom.pytree import container_type, tree_map

__all__ = ["graph_to_records", "graph_from_records"]


class _NodeRef:
    """Stands for the node at ``index`` in the record list."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple:
        return (_NodeRef, (self.index,))


class _OperatorRef:
    """Stands for the operator at ``torch.<path>`` (``path`` like ``"ops.aten.add.Tensor"``),
    or another value of torch's found by name (``"channels_last"``)."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (_OperatorRef, (self.path,))

    def resolve(self) -> Any:
        operator = attr_path.find(torch, self.path)
        if operator is attr_path.MISSING:
            raise RuntimeError(
                f"cannot load the graph: it calls torch.{self.path}, which is not registered "
                "in this process; import the library that defines it before loading"
            )
        return operator


_OPERATOR_TYPES = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)


def _portable(value: Any) -> Any:
    """``value`` as a record holds it: operators by their path (``str(op)`` is
    ``ns.name[.overload]``), memory formats by their name (``str`` is ``torch.<name>``)."""
    if isinstance(value, _OPERATOR_TYPES):
        return _OperatorRef(f"ops.{value}")
    if isinstance(value, torch.memory_format):
        return _OperatorRef(str(value).removeprefix("torch."))
    return value


def _restored(value: Any) -> Any:
    return value.resolve() if isinstance(value, _OperatorRef) else value


def graph_to_records(graph: Graph) -> dict[str, Any]:
    position: dict[Node, int] = {node: i for i, node in enumerate(graph.nodes)}
    refer = lambda a: _NodeRef(position[a]) if isinstance(a, Node) else _portable(a)  # noqa: E731
    records = [
        (
            node.name,
            node.op,
            _portable(node.target),
            map_aggregate(node.args, refer),
            map_aggregate(node.kwargs, refer),
            node.type,
            _refer_in_meta(node.meta, position),
            node.__dict__ or None,  # user attributes (``node.tag``), as torch.fx pickles them
        )
        for node in position
    ]
    return {
        "records": records,
        "tracer_cls": graph._tracer_cls,
        "constants": graph.constants,
    }


def graph_from_records(state: dict[str, Any]) -> Graph:
    graph = Graph(tracer_cls=state.get("tracer_cls"))
    graph.constants = dict(state.get("constants", {}))
    nodes: list[Node] = []
    resolve = lambda ref: nodes[ref.index]  # noqa: E731
    for name, op, target, args, kwargs, type_expr, *_ in state["records"]:
        args = _resolve(args, resolve)
        kwargs = _resolve(kwargs, resolve)
        target = _restored(target)
        node = graph.create_node(op, target, args, kwargs, name=name, type_expr=type_expr)
        nodes.append(node)
    for node, record in zip(nodes, state["records"]):
        node.meta = _resolve_in_meta(record[6], resolve)
        if len(record) > 7 and record[7]:
            node.__dict__.update(record[7])
    return graph


def _map_meta(value: Any, leaf: Any) -> Any:
    """Apply ``leaf`` to every value inside the containers of ``meta``.

    Containers are ``fxloom.pytree``'s, walked only where it rebuilds them
    as the very type they were: an instance of an unregistered subclass (a
    model's output class, say) is passed to ``leaf`` whole, so it unpickles as
    itself.
    """
    return tree_map(leaf, value, is_leaf=_not_rebuilt_exactly)


def _not_rebuilt_exactly(value: Any) -> bool:
    entry = container_type(type(value))
    return entry is None or entry.type is not type(value)


def _refer_in_meta(meta: dict[str, Any], position: dict[Node, int]) -> dict[str, Any]:
    """Nodes mentioned in ``meta`` become references to their record."""

    def refer(value: Any) -> Any:
        if not isinstance(value, Node):
            return _portable(value)
        if value not in position:
            raise TypeError(f"cannot pickle: meta mentions %{value.name}, a node of another graph")
        return _NodeRef(position[value])

    return _map_meta(meta, refer)


def _resolve_in_meta(meta: dict[str, Any], resolve: Any) -> dict[str, Any]:
    return _map_meta(meta, lambda v: resolve(v) if isinstance(v, _NodeRef) else _restored(v))


def _resolve(value: Any, resolve: Any) -> Any:
    return map_aggregate(value, lambda a: resolve(a) if isinstance(a, _NodeRef) else _restored(a))
