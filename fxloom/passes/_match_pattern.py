"""Patterns for the subgraph matcher: the ``ANY`` wildcard, validation, and search plans.

A pattern is a ``Graph``. Its placeholders stand for any value (a node or a constant); its
other nodes, the *operations*, must appear in the matched graph with the same opcode and
target and the same argument structure; its output lists the values it produces. The first
value returned is the *anchor*: the matcher tries each node of a graph that could be it.

A *plan* says how to grow a match from one operation to the whole pattern. Matching an
operation's arguments reaches all the operations it depends on, so the plan only lists the
*steps* that need a search: an operation not reached that way (a second output of the
pattern) is found among the users of the graph node matched to one of its inputs.

Depends on: the IR only (``fxloom.node``, ``fxloom.graph``, ``fxloom.pytree``).
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from fxloom.graph import Graph
from fxloom.node import Node
from fxloom.pytree import tree_any, tree_leaves

__all__ = ["ANY", "Pattern", "PatternError", "Step", "Wildcard"]


class Wildcard(enum.Enum):
    """The type of ``ANY``: written in a pattern where any constant may appear.

    >>> import torch, fxloom
    >>> from fxloom.subgraph_rewriter import ANY
    >>> print(fxloom.symbolic_trace(lambda x: torch.sum(x, dim=ANY)).graph)
    graph():
        %x : [num_users=1] = placeholder[target=x]
        %sum_1 : [num_users=1] = call_function[target=torch.sum](args = (%x,), kwargs = {dim: ANY})
        return sum_1
    """

    ANY = "ANY"

    def __repr__(self) -> str:
        return self.name

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # Having this hook makes torch's argument parser accept ANY where it wants a number
        # (``torch.sum(x, dim=ANY)``) and offer the call to the traced value beside it,
        # whose own hook records the call: declining here lets that happen.
        return NotImplemented


ANY = Wildcard.ANY


class PatternError(ValueError):
    """A pattern or replacement graph that cannot be used; the message says what to change."""


class Step(NamedTuple):
    """Extend a match to ``node``, searching the users of the graph value matched to ``via``."""

    node: Node
    via: Node


def _mentions_any(value: Any) -> bool:
    return tree_any(lambda leaf: leaf is ANY, value)


class Pattern:
    """A validated pattern (or replacement) graph; built by ``Pattern(graph, role)``.

    Fields: ``graph``; ``inputs`` (placeholders, in order); ``operations`` (every other node
    but the output, in graph order); ``outputs`` (the returned values, flattened, in order);
    ``anchor`` (``outputs[0]``); ``returned`` (the set of returned operations); ``root``
    (the graph's owning module, which ``call_module``/``get_attr`` targets name, or None).
    """

    __slots__ = ("graph", "role", "inputs", "operations", "outputs", "returned", "root", "_plans")

    def __init__(self, graph: Graph, role: str = "pattern") -> None:
        self.graph = graph
        self.role = role
        self.inputs: list[Node] = []
        self.operations: list[Node] = []
        output_node = None
        for node in graph.nodes:
            if node.op == "placeholder":
                self.inputs.append(node)
            elif node.op == "output":
                output_node = node
            else:
                self.operations.append(node)
        if output_node is None:
            raise PatternError(
                f"the {role} graph has no output node; end it with graph.output(...)"
            )
        self.outputs: list[Any] = tree_leaves(output_node.args[0])
        self.returned = frozenset(v for v in self.outputs if isinstance(v, Node))
        self.root = graph.owning_module
        self._plans: dict[Node, tuple[Step, ...]] = {}
        if role == "pattern":
            self._check_pattern()
        else:
            self._check_replacement()

    @property
    def anchor(self) -> Node:
        return self.outputs[0]

    # ----------------------------------------------------------------- checks
    def _check_pattern(self) -> None:
        if not self.operations:
            raise PatternError(
                "the pattern has no operations (it only returns its inputs); "
                "a pattern must compute something to match"
            )
        for value in self.outputs:
            if not isinstance(value, Node) or value.op == "placeholder":
                shown = f"%{value.name}, an input" if isinstance(value, Node) else repr(value)
                raise PatternError(
                    f"the pattern returns {shown}; a pattern may return only values it "
                    "computes (their uses are what the replacement takes over)"
                )
        if len(self.returned) != len(self.outputs):
            raise PatternError("the pattern returns the same value twice; return each once")
        for node in (*self.inputs, *self.operations):
            if not node.users and node not in self.returned:
                what = "input" if node.op == "placeholder" else "node"
                raise PatternError(
                    f"pattern {what} %{node.name} is neither used nor returned; remove it "
                    "(every pattern input and operation must feed the returned values)"
                )
        self.plan(self.anchor)  # raises if the pattern is not connected

    def _check_replacement(self) -> None:
        for value in self.outputs:
            if not isinstance(value, Node):
                raise PatternError(
                    f"the replacement returns the constant {value!r}; a replacement returns "
                    "values it computes or receives as inputs"
                )
        for node in self.operations:
            if _mentions_any(node.args) or _mentions_any(node.kwargs):
                raise PatternError(
                    f"replacement node %{node.name} uses the wildcard ANY; ANY belongs in "
                    "patterns. To reuse the matched constant, make it an input of the "
                    "pattern and of the replacement"
                )

    # ------------------------------------------------------------------ plans
    def plan(self, start: Node) -> tuple[Step, ...]:
        """The steps that extend a match of ``start`` (an operation) to the whole pattern."""
        plan = self._plans.get(start)
        if plan is None:
            plan = self._plans[start] = self._make_plan(start)
        return plan

    def _make_plan(self, start: Node) -> tuple[Step, ...]:
        covered: set[Node] = set()
        _add_with_inputs(start, covered)
        steps = []
        remaining = [op for op in self.operations if op not in covered]
        while remaining:
            step = _next_step(remaining, covered)
            if step is None:
                names = ", ".join(f"%{op.name}" for op in remaining)
                raise PatternError(
                    f"pattern nodes {names} are not connected to %{start.name}; a pattern must "
                    "be one connected piece (its parts may share inputs). Match unconnected "
                    "parts with separate patterns"
                )
            steps.append(step)
            _add_with_inputs(step.node, covered)
            remaining = [op for op in remaining if op not in covered]
        return tuple(steps)


def _add_with_inputs(node: Node, covered: set[Node]) -> None:
    """Add ``node`` and everything it depends on to ``covered``."""
    work = [node]
    while work:
        current = work.pop()
        if current in covered:
            continue
        covered.add(current)
        work.extend(current.all_input_nodes)


def _next_step(remaining: list[Node], covered: set[Node]) -> Step | None:
    """The first remaining operation with a covered input; an operation input beats a
    placeholder (a graph value has fewer users than a popular input like ``x``)."""
    fallback = None
    for node in remaining:
        for source in node.all_input_nodes:
            if source not in covered:
                continue
            if source.op != "placeholder":
                return Step(node, source)
            if fallback is None:
                fallback = Step(node, source)
    return fallback
