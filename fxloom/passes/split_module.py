"""``split_module``: cut a traced module into submodules chosen by a callback, as torch.fx does.

``split_callback(node)`` returns a partition id (an int or any hashable value)
for every call node; the result is a new ``GraphModule`` whose ``forward`` calls
one submodule ``submod_<id>`` per partition, values crossing partitions passed
as submodule inputs and outputs::

    >>> import torch, fxloom
    >>> from fxloom.passes.split_module import split_module
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a = torch.nn.Linear(4, 4)
    ...         self.b = torch.nn.Linear(4, 2)
    ...     def forward(self, x):
    ...         return self.b(torch.relu(self.a(x)))
    >>> net = Net()
    >>> gm = fxloom.symbolic_trace(net)
    >>> split = split_module(gm, net, lambda node: 0 if node.name in ("a", "relu") else 1)
    >>> print(split.code.strip())
    def forward(self, x):
        submod_0 = self.submod_0(x);  x = None
        submod_1 = self.submod_1(submod_0);  submod_0 = None
        return submod_1
    >>> print(split.submod_1.code.strip())
    def forward(self, relu):
        b = self.b(relu);  relu = None
        return b
    >>> x = torch.randn(3, 4)
    >>> torch.equal(split(x), gm(x))
    True

What goes where:

* placeholders stay in the parent, in their order; a partition receives the
  values it uses from outside as placeholders named after them (``relu`` above),
  in order of first use;
* run-time checks (tracing's guards, an exported module's input checks:
  ``fxloom.ops.runtime_functions.stays_on_host``) are not given to the callback
  either: they stay in the parent, where they check the inputs before any
  partition runs;
* the parent keeps ``m``'s calling convention: it takes and returns what ``m``
  does (an exported module's nested inputs and dict or ``ModelOutput``), through
  ``m``'s code generator;
* get_attr nodes are not given to the callback: each partition that uses an
  attribute reads it itself (the same tensor object, not a copy), under a
  flattened name (``layer1.0.conv.weight`` -> ``layer1_0_conv_weight``); so are
  call_module targets. ``qualname_map`` receives new -> old qualified names;
* a partition returns its values used elsewhere, in definition order: one value
  as it is, several as a tuple, unpacked in the parent by ``getitem`` nodes;
* partitions run in a topological order of their dependencies, ties going to
  the one whose first node comes first — which is the original order of
  first appearance whenever that order is possible;
* side effects keep their order (see ``fxloom.passes._ordering``): impure nodes
  do not pass each other, and a value's readers stay on their side of an
  in-place update of it. A callback that would break this, or that makes two
  partitions need each other's values, raises ``SplitError`` naming the nodes.

Names and ``node.meta``: every node copied into a partition keeps its name and a
shallow copy of its ``meta``; a partition placeholder gets the meta of the value
it receives. In the parent, placeholders keep theirs; the node that carries an
original value (the submodule call when it returns one value, else the
``getitem``) is named after that value and gets a copy of its meta. Submodule
calls are named ``submod_<id>``. Nothing is recomputed; nothing is dropped.

The original module is never modified.

Depends on: the IR and the shared ``_ordering``/``_partition`` steps.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from fxloom.export.program import ExportedProgram
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.ops.runtime_functions import stays_on_host
from fxloom.passes._ordering import (
    CALL_OPS,
    ORDER_FREE_TARGETS,
    SplitError,
    Unit,
    first_out_of_order,
    node_positions,
    order_units,
    side_effect_edges,
)
from fxloom.passes._partition import Group, build_split, identifier_part
from fxloom.passes.captured import captured_module

__all__ = ["ORDER_FREE_TARGETS", "SplitError", "split_module"]


def split_module(
    m: GraphModule | ExportedProgram,
    root_m: torch.nn.Module | None,
    split_callback: Callable[[Node], Hashable],
    qualname_map: dict[str, str] | None = None,
    keep_original_order: bool = False,
) -> GraphModule:
    """Split ``m`` into one submodule per partition id that ``split_callback`` returns.

    Args:
        m: the traced module, or an exported program (split as ``ep.module()``); its
            graph and attributes are read, never changed.
        root_m: accepted for compatibility with torch.fx (which does not use it
            either): attributes are read from ``m``.
        split_callback: called once per call_function/call_method/call_module
            node, in graph order; returns the node's partition id (hashable).
        qualname_map: if given, filled with ``"submod_0.layer1_0_conv"`` ->
            ``"layer1.0.conv"`` for every attribute copied into a partition.
        keep_original_order: run the partitions in the order their first nodes
            appear in ``m`` — and raise ``SplitError`` if dependencies forbid it
            — rather than in any valid order (which equals it when possible).

    Returns:
        A new ``GraphModule`` computing what ``m`` computes. See the module
        docstring for the layout, names and ``meta``.
    """
    m = captured_module(m, "split_module")
    graph = m.graph
    positions = node_positions(graph)
    unit_of, groups = _assign_partitions(graph, positions, split_callback)
    order = order_units(graph, unit_of, side_effect_edges(graph, positions), "split_callback")
    if keep_original_order:
        _check_original_order(order)
    split, qualnames = build_split(m, order, groups, unit_of)
    if qualname_map is not None:
        qualname_map.update(qualnames)
    return split


def _assign_partitions(
    graph: Graph, positions: dict[Node, int], split_callback: Callable[[Node], Hashable]
) -> tuple[dict[Node, Unit], dict[Unit, Group]]:
    """Ask the callback about every call node; one unit and group per partition id."""
    units: dict[Hashable, Unit] = {}
    groups: dict[Unit, Group] = {}
    id_of_name: dict[str, Hashable] = {}
    unit_of: dict[Node, Unit] = {}
    for node in graph.nodes:
        if node.op not in CALL_OPS:
            continue
        if node.op == "call_function" and stays_on_host(node.target):
            unit_of[node] = Unit(f"%{node.name}", positions[node], [node])  # in the parent
            continue
        partition = _partition_of(node, split_callback)
        unit = units.get(partition)
        if unit is None:
            name = f"submod_{identifier_part(partition)}"
            if id_of_name.setdefault(name, partition) is not partition:
                raise SplitError(
                    f"split_callback returned the partition ids {id_of_name[name]!r} and "
                    f"{partition!r} (for %{node.name}), which both make the submodule name "
                    f"{name!r}; return ids whose str() differ"
                )
            unit = units[partition] = Unit(f"partition {partition!r}", positions[node])
            groups[unit] = Group(unit, name)
        unit.nodes.append(node)
        unit_of[node] = unit
    return unit_of, groups


def _partition_of(node: Node, split_callback: Callable[[Node], Hashable]) -> Hashable:
    try:
        partition = split_callback(node)
    except Exception as err:
        raise SplitError(
            f"split_callback raised {type(err).__name__} for %{node.name} "
            f"({node.format_node()}): {err}"
        ) from err
    try:
        hash(partition)
    except TypeError:
        raise SplitError(
            f"split_callback returned {partition!r} ({type(partition).__name__}) for "
            f"%{node.name}; a partition id must be hashable, e.g. an int or a str"
        ) from None
    return partition


def _check_original_order(order: list[Unit]) -> None:
    conflict = first_out_of_order(order)
    if conflict is None:
        return
    waiting, blocker, (here, there, why) = conflict
    raise SplitError(
        f"keep_original_order=True: {waiting.label} starts before {blocker.label} in the "
        f"original graph but needs it: %{here.name} (in {blocker.label}) {why} "
        f"%{there.name} (in {waiting.label}). Pass keep_original_order=False to run the "
        "partitions in a valid order"
    )
