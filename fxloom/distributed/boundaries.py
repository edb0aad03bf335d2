"""Make every value that crosses a stage boundary a tensor, and say which tensors cross where.

``torch.distributed.pipelining`` sends tensors between stages and nothing else. A traced
program passes all kinds of values along: sizes (``add_5 = size + (-1,)``), flags, dtypes,
tuples of tensors, and masks built from sizes. ``legalise(graph, stage_of, values, stages)``
rewrites the graph, for every value a stage uses from an earlier one:

1. a constant-like value (``None``, a string, a dtype or device) becomes a literal argument;
2. a value computed cheaply from what reaches the stage anyway (a size of a tensor that
   crosses, arithmetic on sizes, an integer or boolean mask from those) is **recomputed** in
   the stage: its producers are copied there;
3. numbers that cannot be recomputed are **carried** as a tensor (``fxloom.distributed.carried``);
4. a tuple or list of tensors is sent as its tensors and rebuilt after the cut;
5. anything else raises ``BoundaryError`` naming the value, the stages and what to do.

``crossings(graph, stage_of, stages)`` then lists, per stage, the tensors it receives: those
made before it and used by it *or by a later stage* — a tensor that skips stages is passed
through the ones between, so each stage talks only to its neighbours.

``stage_of`` maps every node but ``get_attr`` ones to its stage (placeholders to 0, the
output to the last); attributes are read by each stage that uses them. ``values`` holds what
each node produced on the example (``fxloom.distributed.costs``). Both are updated for the
nodes ``legalise`` adds.

Depends on: the IR.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from fxloom.distributed.carried import carry, is_carriable, layout_of, uncarry
from fxloom.distributed.costs import TensorSpec
from fxloom.graph import Graph
from fxloom.node import Node

__all__ = ["BoundaryError", "crossings", "legalise"]

# A recomputed value's producers are copied into the later stage; past this many, send it.
MAX_RECOMPUTED_NODES = 64
_LITERALS = (type(None), str, torch.dtype, torch.device, type(Ellipsis))
_RECOMPUTABLE_OPS = frozenset({"call_function", "call_method"})


class BoundaryError(ValueError):
    """A value cannot cross a stage boundary."""


def legalise(graph: Graph, stage_of: dict[Node, int], values: dict[Node, Any], stages: int) -> None:
    """Rewrite ``graph`` so that only tensors cross stage boundaries (see the module docstring)."""
    rewriter = _Rewriter(graph, stage_of, values)
    for stage in range(1, stages):
        rewriter.legalise_stage(stage)


class _Rewriter:
    """The graph being legalised, with each node's stage and example value kept current."""

    def __init__(self, graph: Graph, stage_of: dict[Node, int], values: dict[Node, Any]) -> None:
        self.graph, self.stage_of, self.values = graph, stage_of, values
        # what a producing stage sends, made once and shared by every later stage:
        # value -> its carry() node, (value, index) -> the getitem of a tuple's tensor
        self.sent: dict[Any, Node] = {}

    def legalise_stage(self, stage: int) -> None:
        incoming = _incoming(self.graph, self.stage_of, stage)
        # activations are sent whatever else happens; the rest may be recomputed from them
        available = {v for v in incoming if _is_activation(self.values.get(v))}
        copies: dict[Node, Node] = {}  # an earlier stage's node -> its copy in this stage
        position = {node: i for i, node in enumerate(self.graph.nodes)}
        for value, users in incoming.items():
            replacement = self.legal_form(value, users, stage, available, copies, position)
            if replacement is value:
                available.add(value)  # sent: later values may be recomputed from it
                continue
            if isinstance(replacement, Node) and _is_tensor(self.values.get(replacement)):
                available.add(replacement)
            for user in users:
                user.replace_input_with(value, replacement)

    def legal_form(
        self,
        value: Node,
        users: list[Node],
        stage: int,
        available: set[Node],
        copies: dict[Node, Node],
        position: dict[Node, int],
    ) -> Any:
        """What ``users`` (in ``stage``) read instead of ``value`` (from an earlier stage)."""
        described = self.values.get(value)
        if isinstance(described, _LITERALS):
            return described
        if _is_activation(described):
            return value  # sent as it is
        cone = _recomputable_cone(value, available, self.values)
        if cone is not None:
            for node in sorted(cone, key=position.__getitem__):
                if node not in copies:
                    with self.graph.inserting_before(users[0]):
                        copy = self.graph.node_copy(node, lambda arg: copies.get(arg, arg))
                    copies[node] = self.place(copy, stage, self.values.get(node))
            return copies[value]
        if _is_tensor(described):
            return value  # a mask or ids that cannot be recomputed here: sent
        if is_carriable(described):
            sent = self.sent_once(value, value, carry, (value,), _describe_tensor(carry(described)))
            return self.add(
                stage, "before", users[0], uncarry, (sent, layout_of(described)), described
            )
        if isinstance(described, (tuple, list)) and all(map(_is_tensor, described)):
            items = [
                self.sent_once((value, i), value, operator.getitem, (value, i), item)
                for i, item in enumerate(described)
            ]
            return self.add(stage, "before", users[0], type(described), (items,), described)
        raise BoundaryError(
            f"%{value.name} ({value.format_node()}) is made in stage {self.stage_of[value]} and "
            f"used by %{users[0].name} in stage {stage}, but a {type(described).__name__} "
            "cannot be sent between stages (only tensors, numbers and tuples of them can). Cut "
            "elsewhere (cut_at, or a balance that moves the cut), or make the model return "
            "tensors there"
        )

    def sent_once(self, key: Any, value: Node, target: Any, args: tuple, described: Any) -> Node:
        """``target(*args)`` in ``value``'s stage right after it, made once per ``key``."""
        if key not in self.sent:
            anchor = _after(self.graph, value)
            self.sent[key] = self.add(
                self.stage_of[value], "after", anchor, target, args, described
            )
        return self.sent[key]

    def add(
        self, stage: int, where: str, anchor: Node, target: Any, args: tuple, described: Any
    ) -> Node:
        """``target(*args)``, a new node of ``stage``, ``where`` ("before"/"after") ``anchor``."""
        insert = self.graph.inserting_before if where == "before" else self.graph.inserting_after
        with insert(anchor):
            node = self.graph.call_function(target, args)
        return self.place(node, stage, described)

    def place(self, node: Node, stage: int, described: Any) -> Node:
        """Record a node the rewrite added: its stage and its example value."""
        self.stage_of[node], self.values[node] = stage, described
        return node


def _incoming(graph: Graph, stage_of: dict[Node, int], stage: int) -> dict[Node, list[Node]]:
    """Values from earlier stages that nodes of ``stage`` use -> those nodes, in graph order."""
    incoming: dict[Node, list[Node]] = {}
    for node in graph.nodes:
        if stage_of.get(node) != stage:
            continue
        for value in node.all_input_nodes:
            if value.op != "get_attr" and stage_of[value] < stage:
                incoming.setdefault(value, []).append(node)
    return incoming


def _is_tensor(described: Any) -> bool:
    return isinstance(described, TensorSpec)


def _is_activation(described: Any) -> bool:
    return _is_tensor(described) and described.dtype.is_floating_point


def _recomputable_cone(
    value: Node, available: set[Node], values: dict[Node, Any]
) -> list[Node] | None:
    """The producers to copy to recompute ``value`` from what is available, or None."""
    cone: list[Node] = []
    seen: set[Node] = set()
    pending = [value]
    while pending:
        node = pending.pop()
        if node in seen or node.op == "get_attr" or (node in available and node is not value):
            continue
        seen.add(node)
        if not _recomputable(node, values.get(node)) or len(cone) >= MAX_RECOMPUTED_NODES:
            return None
        cone.append(node)
        pending.extend(node.all_input_nodes)
    return cone


def _recomputable(node: Node, described: Any) -> bool:
    if node.op not in _RECOMPUTABLE_OPS or node.is_impure():
        return False
    if _is_tensor(described):  # integer and boolean tensors (masks, positions) only
        return not described.dtype.is_floating_point and not described.requires_grad
    return described is not None and not isinstance(described, torch.nn.Module)


def _after(graph: Graph, value: Node) -> Node:
    """Where to put a node computed from ``value`` right away (placeholders stay first)."""
    if value.op != "placeholder":
        return value
    return [node for node in graph.nodes if node.op == "placeholder"][-1]


def _describe_tensor(tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(tuple(tensor.shape), tensor.dtype, False)


def crossings(graph: Graph, stage_of: dict[Node, int], stages: int) -> list[list[Node]]:
    """Per stage, the values it receives from the one before, in graph order (stage 0: none)."""
    last_use: dict[Node, int] = {}
    for node in graph.nodes:
        for value in node.all_input_nodes:
            if value.op != "get_attr":
                last_use[value] = max(last_use.get(value, -1), stage_of[node])
    received: list[list[Node]] = [[] for _ in range(stages)]
    for node in graph.nodes:
        if node.op == "get_attr" or node not in last_use:
            continue
        for stage in range(stage_of[node] + 1, last_use[node] + 1):
            received[stage].append(node)
    return received
