"""Which nodes must run before which, and an order of node groups that respects it.

Shared by the passes that move nodes or gather them into submodules
(``split_module``, ``split_by_support``, ``schedule``). Two kinds of constraint:

* **data**: a node runs after the nodes it uses (the graph's edges);
* **side effects**: impure nodes (``Node.is_impure``) keep their relative order,
  and every user of a value keeps its place relative to the impure users of that
  value (an in-place ``y.add_(1)`` stays after the earlier readers of ``y`` and
  before the later ones). Aliasing is not tracked: a view mutated in place is a
  different value from the tensor it views.

Impure nodes that only *check* their arguments (the guards symbolic tracing
inserts, the input checks of exported modules, ``torch._assert``) are **order-free**:
dead-code elimination keeps them, but they may move like pure nodes. fxloom's own are
its run-time checks (``fxloom.ops.runtime_functions``); ``ORDER_FREE_TARGETS`` lists
others, and takes your own read-only checks.

Depends on: the IR (``fxloom.node``) and the registry of run-time functions.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from fxloom.graph import Graph
from fxloom.node import Node
from fxloom.ops.runtime_functions import is_runtime_check

__all__ = [
    "CALL_OPS",
    "ORDER_FREE_TARGETS",
    "SplitError",
    "Unit",
    "first_out_of_order",
    "is_ordered_effect",
    "node_positions",
    "order_units",
    "side_effect_edges",
]

CALL_OPS = frozenset({"call_function", "call_method", "call_module"})

# call_function targets besides fxloom's run-time checks that are impure only so that
# dead-code elimination keeps them: they read their arguments and raise or not, so they need
# no place among other side effects. Classes among them stand for their instances.
ORDER_FREE_TARGETS: set[Any] = {torch._assert}


class SplitError(RuntimeError):
    """A split or schedule that cannot be done as asked; the module is left unchanged."""


def _is_order_free(node: Node) -> bool:
    target = node.target
    if is_runtime_check(target):
        return True
    try:
        return target in ORDER_FREE_TARGETS or type(target) in ORDER_FREE_TARGETS
    except TypeError:  # an unhashable callable
        return False


def is_ordered_effect(node: Node) -> bool:
    """Whether ``node`` is a call with side effects whose order must be kept."""
    return node.op in CALL_OPS and node.is_impure() and not _is_order_free(node)


def node_positions(graph: Graph) -> dict[Node, int]:
    """Each node's index in the graph's order (one walk)."""
    return {node: i for i, node in enumerate(graph.nodes)}


def side_effect_edges(graph: Graph, positions: dict[Node, int]) -> list[tuple[Node, Node]]:
    """``(before, after)`` pairs that side effects add to the data edges (module docstring).

    Linear in the graph size, plus a sort of the users of each value that has an
    impure user.
    """
    edges: list[tuple[Node, Node]] = []
    previous_effect: Node | None = None
    values_done: set[Node] = set()
    for node in graph.nodes:
        if not is_ordered_effect(node):
            continue
        if previous_effect is not None:
            edges.append((previous_effect, node))
        previous_effect = node
        for value in node.all_input_nodes:
            if value not in values_done:
                values_done.add(value)
                _barrier_edges(value, positions, edges)
    return edges


def _barrier_edges(value: Node, positions: dict[Node, int], edges: list) -> None:
    """Users of ``value`` keep their order relative to its impure users."""
    readers: list[Node] = []  # users since the last impure one
    last_effect: Node | None = None
    users = [user for user in value.users if user.op in CALL_OPS]  # the output comes last anyway
    for user in sorted(users, key=positions.__getitem__):
        if is_ordered_effect(user):
            edges.extend((reader, user) for reader in readers)
            readers = []
            last_effect = user
        else:
            if last_effect is not None:
                edges.append((last_effect, user))
            readers.append(user)


# ------------------------------------------------------------------ units
@dataclass(eq=False)
class Unit:
    """A set of nodes that move together: a partition, or one node left where it is."""

    label: str  # for errors: "partition 0", "%add"
    first: int  # position of its first node in the original graph
    nodes: list[Node] = field(default_factory=list)
    # successor -> (node here, node there, why the second must follow the first)
    succs: dict[Unit, tuple[Node, Node, str]] = field(default_factory=dict)
    preds: dict[Unit, None] = field(default_factory=dict)


def _link(a: Unit, b: Unit, witness: tuple[Node, Node, str]) -> None:
    if a is not b and b not in a.succs:
        a.succs[b] = witness
        b.preds[a] = None


def order_units(
    graph: Graph,
    unit_of: dict[Node, Unit],
    extra_edges: Iterable[tuple[Node, Node]],
    what: str,
) -> list[Unit]:
    """The units in a topological order, ties going to the unit that appears first.

    Nodes without a unit (placeholders, get_attr) are available from the start.
    When the original order of first appearance is valid, this is that order.
    Raises ``SplitError`` describing one cycle when there is no order; ``what``
    names the culprit for the message (e.g. ``"split_callback"``).
    """
    for node, unit in unit_of.items():
        for value in node.all_input_nodes:
            source = unit_of.get(value)
            if source is not None:
                _link(source, unit, (value, node, "is used by"))
    for before, after in extra_edges:
        a, b = unit_of.get(before), unit_of.get(after)
        if a is not None and b is not None:
            _link(a, b, (before, after, "has side effects that must stay before"))
    # Units are keyed by their first position in the heap: positions are unique.
    by_first = {unit.first: unit for unit in unit_of.values()}
    waiting = {unit: len(unit.preds) for unit in by_first.values()}
    ready = [unit.first for unit, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[Unit] = []
    while ready:
        unit = by_first[heapq.heappop(ready)]
        order.append(unit)
        for succ in unit.succs:
            waiting[succ] -= 1
            if waiting[succ] == 0:
                heapq.heappush(ready, succ.first)
    if len(order) != len(waiting):
        raise SplitError(_describe_cycle([u for u, count in waiting.items() if count], what))
    return order


def _describe_cycle(stuck: list[Unit], what: str) -> str:
    # Every stuck unit waits on a stuck predecessor: walking predecessors must loop.
    stuck_set = set(stuck)
    walk: list[Unit] = [stuck[0]]
    seen = {stuck[0]: 0}
    while True:
        pred = next(p for p in walk[-1].preds if p in stuck_set)
        if pred in seen:
            cycle = walk[seen[pred] :][::-1]  # forward direction: pred -> ... -> pred
            break
        seen[pred] = len(walk)
        walk.append(pred)
    lines = []
    for i, unit in enumerate(cycle):
        nxt = cycle[(i + 1) % len(cycle)]
        here, there, why = unit.succs[nxt]
        lines.append(
            f"  {unit.label} -> {nxt.label}: %{here.name} (in {unit.label}) {why} "
            f"%{there.name} (in {nxt.label})"
        )
    return (
        f"{what} makes a cycle: these depend on each other, so no order can compute them:\n"
        + "\n".join(lines)
        + "\nPut the nodes of the cycle into one partition, or assign them so that each "
        "partition only uses values from partitions before it."
    )


def first_out_of_order(order: list[Unit]) -> tuple[Unit, Unit, tuple[Node, Node, str]] | None:
    """For an order that differs from first appearance: a unit that had to wait, and why."""
    expected = sorted(order, key=_by_first)
    placed: set[Unit] = set()
    for got, wanted in zip(order, expected):
        if got is not wanted:
            blocker = next(p for p in wanted.preds if p not in placed)
            return wanted, blocker, blocker.succs[wanted]
        placed.add(got)
    return None


_by_first: Callable[[Unit], int] = lambda unit: unit.first
