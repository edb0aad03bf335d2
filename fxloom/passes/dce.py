"""Dead-code elimination: drop unused nodes, then the submodules and attributes nothing reads.

    >>> import torch, fxloom
    >>> from fxloom.passes.dce import eliminate_dead_code
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.used = torch.nn.Linear(2, 2)
    ...         self.unused = torch.nn.Linear(2, 2)
    ...     def forward(self, x):
    ...         self.unused(x)  # result never used
    ...         return self.used(x)
    >>> gm = fxloom.symbolic_trace(Net())
    >>> report = eliminate_dead_code(gm)
    >>> print(report)
    removed 1 node (%unused), 1 submodule (unused)
    >>> print(gm.code.strip())
    def forward(self, x):
        used = self.used(x);  x = None
        return used

Depends on: the IR and ``fxloom.passes._effects`` (which calls are random).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fxloom import attr_path
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.passes._effects import Effects, check_graph_module

__all__ = ["DeadCodeReport", "eliminate_dead_code"]


@dataclass
class DeadCodeReport:
    """What ``eliminate_dead_code`` removed; true when it removed anything.

    ``nodes``: names of the erased nodes, in graph order. ``submodules``: qualified names of
    the deleted submodules (a deleted module's children are not listed again).
    ``attributes``: qualified names of the deleted parameters, buffers and tensor attributes.
    """

    nodes: list[str] = field(default_factory=list)
    submodules: list[str] = field(default_factory=list)
    attributes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.nodes or self.submodules or self.attributes)

    def __str__(self) -> str:
        parts = [
            _count(self.nodes, "node", "%"),
            _count(self.submodules, "submodule"),
            _count(self.attributes, "attribute"),
        ]
        parts = [part for part in parts if part]
        return "removed " + ", ".join(parts) if parts else "removed nothing"


def _count(names: list[str], noun: str, prefix: str = "") -> str:
    if not names:
        return ""
    shown = ", ".join(prefix + name for name in names[:5])
    more = f", ... {len(names) - 5} more" if len(names) > 5 else ""
    return f"{len(names)} {noun}{'s' if len(names) > 1 else ''} ({shown}{more})"


def eliminate_dead_code(
    gm: GraphModule,
    *,
    is_impure_node: Callable[[Node], bool] | None = None,
    remove_attributes: bool = True,
) -> DeadCodeReport:
    """Erase unused nodes, then unused submodules and attributes of ``gm``; report what went.

    Nodes: a node whose value no other node uses is erased, unless it is impure
    (``Node.is_impure``: placeholders, the output, in-place ops, guards, ``print``...) or
    random (``torch.rand``, dropout in training: dropping one would shift the random numbers
    every later random op draws, so the program would no longer match eager). Pass
    ``is_impure_node`` to decide yourself instead. One backward sweep: linear in graph size.

    Submodules: those no ``call_module`` or ``get_attr`` node reaches are deleted
    (``GraphModule.delete_all_unused_submodules``; a called module keeps all its children).

    Attributes (with ``remove_attributes``, the default): parameters, buffers and plain tensor
    attributes that no ``get_attr`` node reads, outside the called modules, are deleted. This
    changes ``gm.state_dict()``: a checkpoint of the original model then loads with
    ``strict=False`` only.

    ``gm`` is edited in place. ``node.meta`` and names of the remaining nodes are unchanged.
    """
    check_graph_module(gm, "eliminate_dead_code")
    is_kept = is_impure_node or _impure_or_random(Effects(gm))
    dead = _dead_nodes(gm.graph, is_kept)  # decided before any edit
    # Graph.eliminate_dead_code asks only about unused nodes, in one backward sweep.
    gm.graph.eliminate_dead_code(lambda node: node not in dead)
    report = DeadCodeReport(nodes=[node.name for node in reversed(dead)])
    report.submodules = _delete_unused_submodules(gm)
    if remove_attributes:
        report.attributes = _delete_unused_attributes(gm)
    return report


def _dead_nodes(graph: Any, is_kept: Callable[[Node], bool]) -> dict[Node, None]:
    """The nodes that erasing unused ones would remove, last first (one backward sweep)."""
    dead: dict[Node, None] = {}
    for node in reversed(graph.nodes):
        if all(user in dead for user in node.users) and not is_kept(node):
            dead[node] = None
    return dead


def _impure_or_random(effects: Effects) -> Callable[[Node], bool]:
    return lambda node: node.is_impure() or effects.is_random(node)


def _delete_unused_submodules(gm: GraphModule) -> list[str]:
    before = [name for name, _ in gm.named_modules() if name]
    gm.delete_all_unused_submodules()
    after = {name for name, _ in gm.named_modules()}
    gone = [name for name in before if name not in after]
    gone_set = set(gone)
    return [name for name in gone if name.rpartition(".")[0] not in gone_set]


def _delete_unused_attributes(gm: GraphModule) -> list[str]:
    read = {node.target for node in gm.graph.find_nodes(op="get_attr")}
    called = {node.target for node in gm.graph.find_nodes(op="call_module")}
    called |= {target for target in read if isinstance(attr_path.find(gm, target), nn.Module)}
    deleted = []
    for prefix, module in _modules_outside(gm, called):
        for name in _tensor_attribute_names(module):
            qualified = f"{prefix}.{name}" if prefix else name
            if qualified not in read:
                delattr(module, name)
                deleted.append(qualified)
    return deleted


def _modules_outside(gm: GraphModule, called: set[str]) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) for ``gm`` and its submodules not inside a called module."""
    found = []
    stack: list[tuple[str, nn.Module]] = [("", gm)]
    while stack:
        prefix, module = stack.pop()
        if prefix in called:
            continue  # a called module uses its own state: all of it is kept
        found.append((prefix, module))
        for name, child in module.named_children():
            stack.append((f"{prefix}.{name}" if prefix else name, child))
    return found


def _tensor_attribute_names(module: nn.Module) -> list[str]:
    tables = (module._parameters, module._buffers, vars(module))
    return [
        name
        for table in tables
        for name, value in table.items()
        if isinstance(value, torch.Tensor)  # not None (an absent bias), not other objects
    ]
