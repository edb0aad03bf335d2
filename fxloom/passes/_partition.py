"""Build a split module: one ``GraphModule`` per group of nodes, and a parent that calls them.

The caller (``split_module``, ``split_by_support``) decides which call nodes go
into which group and in which order groups and left-over nodes run
(``_ordering.order_units``); this module only builds, in named steps:

1. ``find_boundaries`` — the values each group receives and returns;
2. ``build_group`` — each group's graph: placeholders for what it receives,
   copies of its nodes (names and ``meta`` kept), get_attr/call_module targets
   copied in under flattened names, an output;
3. ``build_parent`` — placeholders as in the original, then each unit in order:
   a left-over node is copied, a group becomes a ``call_module`` of its
   submodule and, when it returns several values, one ``getitem`` per value.

Nothing here changes the original module: every graph is new, attribute values
are shared (not cloned) with the original.

Depends on: the IR and ``_ordering``.
"""

from __future__ import annotations

import copy
import operator
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from fxloom import attr_path
from fxloom._namespace import Namespace
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.passes._ordering import SplitError, Unit

__all__ = ["Group", "build_parent", "build_split", "find_boundaries", "identifier_part"]

_NOT_IDENTIFIER = re.compile(r"[^0-9a-zA-Z_]")

# Names a new module's attributes must not take: what nn.Module and GraphModule define.
_MODULE_ATTRIBUTES = frozenset(
    set(dir(GraphModule))
    | set(torch.nn.Module().__dict__)
    | {"meta", "_graph", "_code", "_compiled_graph", "_compiled_version", "_source_file"}
)


def identifier_part(value: Any) -> str:
    """``str(value)`` with every character not allowed in an identifier turned into ``_``."""
    return _NOT_IDENTIFIER.sub("_", str(value))


@dataclass(eq=False)
class Group:
    """One submodule to build: its nodes (``unit.nodes``), inputs and outputs in the original graph."""

    unit: Unit
    name: str  # the submodule's attribute name in the parent
    inputs: dict[Node, None] = field(default_factory=dict)  # in order of first use
    outputs: list[Node] = field(default_factory=list)  # in order of definition


class _Attributes:
    """The attributes a new module needs, read from ``source`` by qualified name.

    With ``flatten``, ``"layer1.0.conv"`` is installed as ``"layer1_0_conv"`` (made
    unique); otherwise under its own qualified name.
    """

    def __init__(self, source: torch.nn.Module, flatten: bool) -> None:
        self.source = source
        self.flatten = flatten
        self.values: dict[str, Any] = {}  # new name -> object
        self.renamed: dict[str, str] = {}  # original qualified name -> new name
        self._names = Namespace(reserved=_MODULE_ATTRIBUTES)

    def name_for(self, node: Node) -> str:
        target = node.target
        new = self.renamed.get(target)
        if new is None:
            try:
                value = attr_path.get(self.source, target)
            except attr_path.MissingAttributeError as err:
                raise SplitError(
                    f"%{node.name} ({node.op}) refers to {target!r}, which the module being "
                    f"split does not have ({err}); fix the node's target first"
                ) from None
            new = self._names.create_name(target.replace(".", "_")) if self.flatten else target
            self.renamed[target] = new
            self.values[new] = value
        return new


def find_boundaries(graph: Graph, groups: dict[Unit, Group], unit_of: dict[Node, Unit]) -> None:
    """Fill each group's inputs (values from outside it) and outputs (its values used outside).

    get_attr values are never inputs: each group reads its own copy of the attribute.
    """
    escaping: set[Node] = set()
    for node in graph.nodes:
        unit = unit_of.get(node)
        group = groups.get(unit) if unit is not None else None
        for value in node.all_input_nodes:
            source = unit_of.get(value)
            if source is unit and unit is not None:
                continue
            if group is not None and value.op != "get_attr":
                group.inputs[value] = None
            if source is not None and source in groups:
                escaping.add(value)
    for group in groups.values():
        group.outputs = [node for node in group.unit.nodes if node in escaping]


def build_group(source: GraphModule, group: Group) -> tuple[GraphModule, dict[str, str]]:
    """The submodule computing ``group``, and its attributes' new -> original qualified names."""
    graph = Graph(tracer_cls=source.graph._tracer_cls, tracer_extras=source.graph._tracer_extras)
    attributes = _Attributes(source, flatten=True)
    env: dict[Node, Node] = {}
    for value in group.inputs:
        placeholder = graph.create_node("placeholder", value.name, name=value.name)
        placeholder.type = value.type
        placeholder.meta = copy.copy(value.meta)
        env[value] = placeholder
    for node in group.unit.nodes:
        for value in node.all_input_nodes:
            if value not in env:  # only get_attr values come from outside unannounced
                env[value] = _copy_renamed(graph, value, env, attributes)
        env[node] = _copy_renamed(graph, node, env, attributes)
    results = [env[node] for node in group.outputs]
    graph.output(results[0] if len(results) == 1 else tuple(results))
    module = GraphModule(attributes.values, graph)
    module.training = source.training  # not .train(): the attributes are shared with source
    return module, {new: old for old, new in attributes.renamed.items()}


def _copy_renamed(graph: Graph, node: Node, env: dict[Node, Node], attrs: _Attributes) -> Node:
    """Copy ``node``; a get_attr/call_module target becomes the module's own flattened name."""
    copied = graph.node_copy(node, env.__getitem__)
    if node.op in ("get_attr", "call_module"):
        copied.target = attrs.name_for(node)
    return copied


def build_parent(
    source: GraphModule,
    order: list[Unit],
    groups: dict[Unit, Group],
    submodules: dict[str, GraphModule],
) -> GraphModule:
    """The parent module: the original placeholders, then each unit of ``order`` in turn."""
    old = source.graph
    graph = Graph(tracer_cls=old._tracer_cls, tracer_extras=old._tracer_extras)
    attributes = _Attributes(source, flatten=False)
    taken_names = {node.name for node in old.nodes}
    env: dict[Node, Node] = {}

    def lookup(value: Node) -> Node:
        copied = env.get(value)
        if copied is None:  # a get_attr: copied in at its first use
            copied = env[value] = graph.node_copy(value)
            attributes.name_for(value)
        return copied

    for node in old.find_nodes(op="placeholder"):
        env[node] = graph.node_copy(node)
    for unit in order:
        group = groups.get(unit)
        if group is None:
            (node,) = unit.nodes
            env[node] = graph.node_copy(node, lookup)
            if node.op == "call_module":
                attributes.name_for(node)
        else:
            _call_group(
                graph, group, env, lookup, attr_path.free_name(None, group.name, taken=taken_names)
            )
    (output,) = old.find_nodes(op="output")
    graph.node_copy(output, lookup)
    root = {**attributes.values, **submodules}
    parent = GraphModule(root, graph)
    parent.training = source.training
    return parent


def _call_group(graph: Graph, group: Group, env: dict, lookup: Any, call_name: str) -> None:
    """Call ``group``'s submodule; bind each of its outputs in ``env``."""
    args = tuple(lookup(value) for value in group.inputs)
    call = graph.create_node("call_module", group.name, args, name=call_name)
    if len(group.outputs) == 1:
        (value,) = group.outputs
        call.type = value.type
        call.meta = copy.copy(value.meta)
        env[value] = call
        return
    for i, value in enumerate(group.outputs):
        item = graph.create_node(
            "call_function", operator.getitem, (call, i), name=value.name, type_expr=value.type
        )
        item.meta = copy.copy(value.meta)
        env[value] = item


def _avoid_parent_attributes(graph: Graph, groups: dict[Unit, Group], unit_of: dict) -> None:
    """Rename a group whose submodule name is the root of an attribute the parent keeps."""
    roots: set[str] = set()
    for node in graph.nodes:
        if node.op == "get_attr":
            in_parent = any(unit_of.get(user) not in groups for user in node.users)
        else:
            in_parent = node.op == "call_module" and unit_of[node] not in groups
        if in_parent:
            roots.add(node.target.split(".")[0])
    taken = roots | {group.name for group in groups.values()}
    for group in groups.values():
        if group.name in roots:
            group.name = attr_path.free_name(None, group.name, taken=taken)
            taken.add(group.name)


def build_split(
    source: GraphModule,
    order: list[Unit],
    groups: dict[Unit, Group],
    unit_of: dict[Node, Unit],
) -> tuple[GraphModule, dict[str, str]]:
    """Build every group's submodule and the parent; return it with its qualified-name map.

    The map goes from each attribute's new qualified name in the result
    (``"submod_0.layer1_0_conv"``) to its name in ``source`` (``"layer1.0.conv"``).
    """
    find_boundaries(source.graph, groups, unit_of)
    _avoid_parent_attributes(source.graph, groups, unit_of)
    submodules: dict[str, GraphModule] = {}
    qualnames: dict[str, str] = {}
    for unit in order:
        group = groups.get(unit)
        if group is None:
            continue
        submodules[group.name], renamed = build_group(source, group)
        for new, old in renamed.items():
            qualnames[f"{group.name}.{new}"] = old
    return build_parent(source, order, groups, submodules), qualnames
