"""``split_by_support``: gather the nodes a backend supports into submodules, the rest stays.

The splitter of the torch.fx paper's TensorRT lowering: ``is_supported(node)``
says which call nodes a backend (TensorRT, ONNX Runtime, an accelerator) can
run; each maximal connected group of supported nodes becomes one submodule,
``_run_on_acc_0``, ``_run_on_acc_1``, ... (numbered in order of their first
node), to be compiled or replaced; unsupported nodes stay in the parent and run
in eager PyTorch::

    >>> import torch, fxloom
    >>> from fxloom.passes.split_by_support import split_by_support
    >>> def f(x):
    ...     y = torch.relu(x) + 1
    ...     z = torch.sort(y).values  # suppose the backend has no sort
    ...     return torch.sigmoid(z) * 2
    >>> gm = fxloom.symbolic_trace(f)
    >>> split, report = split_by_support(gm, lambda node: node.target is not torch.sort)
    >>> print(split.code.strip())
    def forward(self, x):
        _run_on_acc_0 = self._run_on_acc_0(x);  x = None
        sort = torch.sort(_run_on_acc_0);  _run_on_acc_0 = None
        _run_on_acc_1 = self._run_on_acc_1(sort);  sort = None
        return _run_on_acc_1
    >>> print(report)
    2 partitions, 1 node left in the parent (unsupported: sort)
      _run_on_acc_0: relu, add
      _run_on_acc_1: getattr_1, sigmoid, mul
    >>> x = torch.randn(5)
    >>> torch.equal(split(x), gm(x))
    True

How groups are formed. Merging two supported nodes is only allowed if no path
leaves their group and comes back (through an unsupported node, say): that
would make the group and the parent need each other. The pass schedules the
call nodes in a topological order that runs as many supported nodes in a row
as it can (Kahn's algorithm with one ready queue per kind: it stays with the
current kind until that queue is empty, starting with unsupported nodes so that
supported ones find more of their inputs ready). Each run of supported nodes is
cut into its connected components; every component is a group. A run is an
interval of a topological order, so no path can leave it and come back: groups
never form cycles. Runs are as long as this greedy schedule makes them, which is
maximal in the common cases but not guaranteed optimal in general. Side effects
keep their order (``fxloom.passes._ordering``). Deterministic: ties always go to
the node that comes first in the original graph. Time O(n log n).

Names and ``node.meta``: as for ``split_module`` — nodes keep their names and a
shallow copy of their ``meta`` wherever they go; a group's call in the parent
is named after its submodule; values a group returns are unpacked by
``getitem`` nodes named after the values they carry, with a copy of their meta.
get_attr/call_module targets in a group are flattened (``blocks_0_mlp_fc``);
in the parent they keep their qualified names. ``is_supported`` sees the
original nodes; the original module is never modified.

Depends on: the IR and the shared ``_ordering``/``_partition`` steps.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.passes._ordering import (
    CALL_OPS,
    SplitError,
    Unit,
    node_positions,
    order_units,
    side_effect_edges,
)
from fxloom.passes._partition import Group, build_split
from fxloom.passes.captured import captured_module

__all__ = ["SplitError", "SupportSplit", "split_by_support"]


@dataclass(frozen=True)
class SupportSplit:
    """What ``split_by_support`` did, by node name (names are the same in the result).

    Attributes:
        partitions: submodule name -> the names of the nodes it holds, in order.
        unsupported: call nodes ``is_supported`` refused (left in the parent).
        too_small: supported nodes left in the parent because their group had
            fewer than ``min_size`` nodes.
    """

    partitions: dict[str, tuple[str, ...]]
    unsupported: tuple[str, ...]
    too_small: tuple[str, ...] = ()

    @property
    def num_partitions(self) -> int:
        """How many submodules were made."""
        return len(self.partitions)

    def __str__(self) -> str:
        left = len(self.unsupported) + len(self.too_small)
        detail = [f"unsupported: {', '.join(self.unsupported)}"] if self.unsupported else []
        if self.too_small:
            detail.append(f"too small: {', '.join(self.too_small)}")
        lines = [
            f"{self.num_partitions} partition{'s' * (self.num_partitions != 1)}, "
            f"{left} node{'s' * (left != 1)} left in the parent"
            + (f" ({'; '.join(detail)})" if detail else "")
        ]
        lines += [f"  {name}: {', '.join(nodes)}" for name, nodes in self.partitions.items()]
        return "\n".join(lines)


def split_by_support(
    gm: GraphModule,
    is_supported: Callable[[Node], bool],
    *,
    min_size: int = 1,
    prefix: str = "_run_on_acc_",
) -> tuple[GraphModule, SupportSplit]:
    """Gather connected supported nodes of ``gm`` into submodules; see the module docstring.

    Args:
        gm: the traced module; read, never changed.
        is_supported: called once per call_function/call_method/call_module
            node, in graph order; truthy if the backend runs the node.
        min_size: groups with fewer call nodes stay in the parent (a lone
            ``getitem`` is rarely worth a trip to an accelerator).
        prefix: submodules are named ``prefix + index``.

    Returns:
        ``(new module, report)``; the report lists which nodes went where.
    """
    gm = captured_module(gm, "split_by_support")
    if not isinstance(min_size, int) or min_size < 1:
        raise ValueError(f"min_size must be a positive int, got {min_size!r}")
    if not isinstance(prefix, str) or not f"{prefix}0".isidentifier():
        raise ValueError(
            f"prefix must start an identifier (submodules are named prefix + index), got {prefix!r}"
        )
    graph = gm.graph
    positions = node_positions(graph)
    supported = _ask_support(graph, is_supported)
    effects = side_effect_edges(graph, positions)
    components = _connected_runs(graph, supported, effects, positions)
    kept = [nodes for nodes in components if len(nodes) >= min_size]
    too_small = sorted(
        (n for nodes in components if len(nodes) < min_size for n in nodes),
        key=positions.__getitem__,
    )
    unit_of, groups = _units(graph, kept, positions, prefix)
    order = order_units(graph, unit_of, effects, "split_by_support")  # acyclic by construction
    split, _ = build_split(gm, order, groups, unit_of)
    report = SupportSplit(
        partitions={g.name: tuple(n.name for n in g.unit.nodes) for g in groups.values()},
        unsupported=tuple(n.name for n in graph.nodes if n.op in CALL_OPS and n not in supported),
        too_small=tuple(n.name for n in too_small),
    )
    return split, report


def _ask_support(graph: Graph, is_supported: Callable[[Node], bool]) -> set[Node]:
    supported: set[Node] = set()
    for node in graph.nodes:
        if node.op not in CALL_OPS:
            continue
        try:
            answer = is_supported(node)
        except Exception as err:
            raise SplitError(
                f"is_supported raised {type(err).__name__} for %{node.name} "
                f"({node.format_node()}): {err}"
            ) from err
        if answer:
            supported.add(node)
    return supported


def _connected_runs(
    graph: Graph,
    supported: set[Node],
    effects: list[tuple[Node, Node]],
    positions: dict[Node, int],
) -> list[list[Node]]:
    """The connected components of each run of supported nodes in a greedy schedule."""
    run_of = _schedule_runs(graph, supported, effects, positions)
    parent = {node: node for node in run_of}

    def find(node: Node) -> Node:
        while parent[node] is not node:
            parent[node] = parent[parent[node]]  # path halving
            node = parent[node]
        return node

    def union(a: Node, b: Node) -> None:
        if run_of.get(a) is not None and run_of.get(a) == run_of.get(b):
            ra, rb = find(a), find(b)
            if ra is not rb:
                first, second = sorted((ra, rb), key=positions.__getitem__)
                parent[second] = first

    for node in run_of:
        for value in node.all_input_nodes:
            union(value, node)
    for before, after in effects:
        union(before, after)
    components: dict[Node, list[Node]] = {}
    for node in graph.nodes:  # graph order: members and components come out sorted
        if node in run_of:
            components.setdefault(find(node), []).append(node)
    return list(components.values())


def _schedule_runs(
    graph: Graph,
    supported: set[Node],
    effects: list[tuple[Node, Node]],
    positions: dict[Node, int],
) -> dict[Node, int]:
    """Schedule the call nodes, staying with one kind while it can; number the supported runs."""
    after: dict[Node, list[Node]] = {}
    waiting: dict[Node, int] = {}
    for node in graph.nodes:
        if node.op in CALL_OPS:
            inputs = [value for value in node.all_input_nodes if value.op in CALL_OPS]
            waiting[node] = len(inputs)
            for value in inputs:
                after.setdefault(value, []).append(node)
    for before, later in effects:
        waiting[later] += 1
        after.setdefault(before, []).append(later)
    ready: dict[bool, list[tuple[int, Node]]] = {True: [], False: []}
    for node, count in waiting.items():
        if count == 0:
            ready[node in supported].append((positions[node], node))
    for queue in ready.values():
        heapq.heapify(queue)
    run_of: dict[Node, int] = {}
    kind, run = False, -1
    while ready[True] or ready[False]:
        if not ready[kind]:
            kind = not kind
            run += kind  # a new run of supported nodes starts
        _, node = heapq.heappop(ready[kind])
        if kind:
            run_of[node] = run
        for later in after.get(node, ()):
            waiting[later] -= 1
            if waiting[later] == 0:
                heapq.heappush(ready[later in supported], (positions[later], later))
    return run_of


def _units(
    graph: Graph, components: list[list[Node]], positions: dict[Node, int], prefix: str
) -> tuple[dict[Node, Unit], dict[Unit, Group]]:
    """One unit per group (named by order of its first node), one per call node left over."""
    unit_of: dict[Node, Unit] = {}
    groups: dict[Unit, Group] = {}
    for index, nodes in enumerate(sorted(components, key=lambda c: positions[c[0]])):
        name = f"{prefix}{index}"
        unit = Unit(name, positions[nodes[0]], nodes)
        groups[unit] = Group(unit, name)
        unit_of.update(dict.fromkeys(nodes, unit))
    for node in graph.nodes:
        if node.op in CALL_OPS and node not in unit_of:
            unit_of[node] = Unit(f"%{node.name}", positions[node], [node])
    return unit_of, groups
