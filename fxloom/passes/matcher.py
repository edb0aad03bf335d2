"""Subgraph matching: where a pattern graph occurs in a graph, and why a node is not one.

``SubgraphMatcher(pattern).match(graph)`` lists the non-overlapping occurrences of
``pattern`` (a ``Graph`` or ``GraphModule``); ``explain(node)`` says in words why ``node``
is not part of one. ``fxloom.subgraph_rewriter`` builds ``replace_pattern`` on this.

What matches what:

* a pattern **placeholder** matches any value: a graph node or a constant (``2``, ``None``,
  a list...). Where one placeholder is used twice, the graph must use the same value twice.
  Two placeholders may match the same value;
* a pattern **operation** matches a graph node with the same opcode and target
  (``call_function``/``call_method``), the same number of positional arguments and the same
  keyword names, whose arguments match the pattern's one by one (lists and tuples item by
  item). A ``call_module`` matches a call of a module of the same class when both graphs'
  owning modules have the submodules (a traced ``nn.Module`` pattern), else the same target; a
  ``get_attr`` matches any ``get_attr`` whose value is of the same kind (any tensor for a
  tensor; anything when the pattern graph has no owning module). Arguments are compared as
  written: ``torch.sum(x, 1)`` does not match ``torch.sum(x, dim=1)``;
* a pattern **constant** matches an equal constant of the same type (``1`` is not ``1.0``);
  ``ANY`` matches any constant (not a node); with ``ignore_literals=True`` every constant of
  the pattern is ``ANY``;
* different pattern operations match different graph nodes, and a graph node matched by an
  operation is not also a placeholder's value;
* only the pattern's returned values may be used outside the match: an operation the pattern
  does not return must have no users outside the match (replacing the match would orphan
  them). Returned values may be used anywhere;
* the match can be replaced in one place: its inputs are all computed before the first use
  of its outputs outside it (otherwise the replacement would need a value it produces).

Order (deterministic): the candidates for the anchor (the pattern's first returned value)
are taken in graph order, found from the graph's index by opcode and target, so nodes that
cannot be the anchor cost nothing. At each candidate the first complete match is taken that
shares no operation with a match taken before (so of overlapping candidates the earliest
wins); a match may use an earlier match's outputs as inputs. Match filters are applied as
each complete match is found, so a rejected match lets another combination be tried.

The cost is linear in the graph for a pattern whose only search steps are the anchor (any
single-output pattern): each candidate costs O(pattern size). Further outputs are searched
among the users of matched nodes.

    >>> import operator, torch, fxloom
    >>> from fxloom.passes.matcher import SubgraphMatcher
    >>> pattern = fxloom.symbolic_trace(lambda x: torch.relu(x + 1)).graph
    >>> gm = fxloom.symbolic_trace(lambda a, b: torch.relu(a + 1) * torch.relu(b + 2))
    >>> [m.anchor.name for m in SubgraphMatcher(pattern).match(gm.graph)]
    ['relu']
    >>> print(SubgraphMatcher(pattern).explain(gm.graph.find_nodes(op="call_function")[-2]))
    %relu_1 does not match the pattern:
      as %relu: %add_1: argument 1 is 2, the pattern's %add has 1

Depends on: the IR only; never on tracers (``fxloom.subgraph_rewriter`` traces callables).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fxloom import attr_path
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.passes._match_pattern import (
    ANY,
    Pattern,
    PatternError,
    Step,
    Wildcard,
)
from fxloom.passes._match_reasons import Constant, Place, Target, kind, shown
from fxloom.pytree import SEQUENCE_KINDS, ContainerType, container_type, tree_leaves

__all__ = [
    "ANY",
    "MatchExplanation",
    "MatchFilter",
    "PatternError",
    "SubgraphMatch",
    "SubgraphMatcher",
    "Wildcard",
    "replacement_site",
]

_REJECTED = "rejected"  # the reason given when not explaining (no text is built)
_UNBOUND = object()


class SubgraphMatch:
    """One occurrence of a pattern in a graph.

    Fields: ``anchor`` (the graph node matched to the pattern's first returned value);
    ``nodes_map`` (pattern node -> graph node, or the constant a placeholder matched; inputs
    first, then operations, in pattern order); ``placeholder_nodes`` (the values of the
    pattern's inputs, in order); ``returning_nodes`` (the graph nodes of the returned
    values, in order); ``nodes`` (the graph nodes of the pattern's operations).
    """

    __slots__ = ("anchor", "nodes_map", "placeholder_nodes", "returning_nodes", "nodes")

    def __init__(self, pattern: Pattern, bound: dict[Node, Any]) -> None:
        self.nodes_map: dict[Node, Any] = {p: bound[p] for p in pattern.inputs}
        self.nodes_map.update((p, bound[p]) for p in pattern.operations)
        self.placeholder_nodes: list[Any] = [bound[p] for p in pattern.inputs]
        self.returning_nodes: list[Node] = [bound[p] for p in pattern.outputs]
        self.nodes: list[Node] = [bound[p] for p in pattern.operations]
        self.anchor: Node = self.returning_nodes[0]

    @property
    def anchors(self) -> list[Node]:
        """``[anchor]``, for match filters written for torch.fx's ``InternalMatch``."""
        return [self.anchor]

    def __repr__(self) -> str:
        names = ", ".join(f"%{n.name}" for n in self.nodes)
        return f"<SubgraphMatch at %{self.anchor.name}: {names}>"


MatchFilter = Callable[[SubgraphMatch, Graph, Graph], bool]


@dataclass
class MatchExplanation:
    """Whether ``node`` is part of a match, and if not, why; ``str()`` gives the report.

    ``reasons`` holds one line per way the node was tried (as each pattern operation of
    the same kind), saying where that attempt failed. ``bool(explanation)`` is ``matched``.
    """

    node: Node
    matched: bool
    reasons: list[str] = field(default_factory=list)
    match: SubgraphMatch | None = None

    def __bool__(self) -> bool:
        return self.matched

    def __str__(self) -> str:
        if self.matched and self.match is not None:
            return f"%{self.node.name} matches the pattern (the match at %{self.match.anchor.name})"
        lines = [f"%{self.node.name} does not match the pattern:"]
        lines.extend(f"  {reason}" for reason in self.reasons)
        return "\n".join(lines)


class _State:
    """A partial match: pattern node -> graph value, and the undo trail for backtracking."""

    __slots__ = ("bound", "owner", "trail", "claimed")

    def __init__(self, claimed: set[Node]) -> None:
        self.bound: dict[Node, Any] = {}
        self.owner: dict[Node, Node] = {}  # graph node -> the pattern operation it matched
        self.trail: list[Node] = []
        self.claimed = claimed  # graph nodes of matches already taken

    def bind(self, p: Node, value: Any) -> None:
        self.bound[p] = value
        if p.op != "placeholder":
            self.owner[value] = p
        self.trail.append(p)

    def undo(self, mark: int) -> None:
        trail = self.trail
        while len(trail) > mark:
            p = trail.pop()
            value = self.bound.pop(p)
            if p.op != "placeholder":
                del self.owner[value]


class SubgraphMatcher:
    """Finds the occurrences of one pattern; see the module docstring for the rules.

    Args:
        pattern: the pattern, a ``Graph`` or ``GraphModule`` (trace functions first, or use
            ``fxloom.subgraph_rewriter``, which does).
        ignore_literals: let every constant in the pattern match any constant.
        match_filters: callables ``(match, graph, pattern_graph) -> bool``; a match is kept
            only if all return true.
    """

    def __init__(
        self,
        pattern: Graph | GraphModule,
        *,
        ignore_literals: bool = False,
        match_filters: Sequence[MatchFilter] = (),
    ) -> None:
        graph = pattern.graph if isinstance(pattern, GraphModule) else pattern
        if not isinstance(graph, Graph):
            raise TypeError(
                f"SubgraphMatcher needs the pattern as an fxloom Graph or GraphModule, got "
                f"{type(pattern).__name__}; trace a function with fxloom.symbolic_trace first"
            )
        for match_filter in match_filters:
            if not callable(match_filter):
                raise TypeError(
                    f"match filters are callables (match, graph, pattern_graph) -> bool, "
                    f"got {match_filter!r}"
                )
        self.pattern = Pattern(graph)
        self.pattern_graph = graph
        self.ignore_literals = ignore_literals
        self.match_filters = tuple(match_filters)
        self._explaining = False
        self._failures: list[str] = []

    # ------------------------------------------------------------- public API
    def match(self, graph: Graph | GraphModule) -> list[SubgraphMatch]:
        """The non-overlapping matches in ``graph``, in graph order of their anchors."""
        graph = graph.graph if isinstance(graph, GraphModule) else graph
        anchor = self.pattern.anchor
        plan = self.pattern.plan(anchor)
        claimed: set[Node] = set()
        matches = []
        for candidate in self._candidates(anchor, graph):
            if candidate in claimed:
                continue
            found = self._match_at(anchor, candidate, plan, _State(claimed))
            if found is not None:
                claimed.update(found.nodes)
                matches.append(found)
        return matches

    def explain(self, node: Node) -> MatchExplanation:
        """Say whether ``node`` is part of a match and, if not, why (one reason per attempt)."""
        taken = self.match(node.graph)
        for found in taken:
            if node in found.nodes:
                return MatchExplanation(node, True, match=found)
        same_kind = [p for p in self.pattern.operations if self._same_kind(p, node)]
        reasons = []
        self._explaining = True
        try:
            for p in same_kind or [self.pattern.anchor]:
                reasons.append(f"as %{p.name}: {self._attempt(p, node, taken)}")
        finally:
            self._explaining = False
        return MatchExplanation(node, False, reasons)

    # ------------------------------------------------------------- the search
    def _candidates(self, p: Node, graph: Graph) -> list[Node]:
        """Graph nodes that could match operation ``p``, from the graph's index."""
        if p.op == "get_attr" or self._module_class(p) is not None:
            return graph.find_nodes(op=p.op)  # matched by the value's kind, not the name
        return graph.find_nodes(op=p.op, target=p.target)

    def _match_at(
        self, p: Node, candidate: Node, plan: tuple[Step, ...], state: _State
    ) -> SubgraphMatch | None:
        """The first complete match with ``p`` at ``candidate`` (reasons go to _failures)."""
        reason = self._unify(p, candidate, state)
        if reason is not None:
            self._record(reason)
            return None
        return self._extend(plan, 0, state)

    def _extend(self, plan: tuple[Step, ...], index: int, state: _State) -> SubgraphMatch | None:
        """Search the remaining steps of ``plan`` depth first, undoing failed choices."""
        if index == len(plan):
            return self._accept(state)
        p, via = plan[index]
        source = state.bound.get(via)
        if type(source) is not Node:
            self._record(self._why("the pattern's {} is the constant {}", via, Constant(source)))
            return None
        tried = False
        for user in source.users:
            if not self._same_kind(p, user):
                continue
            tried = True
            mark = len(state.trail)
            reason = self._unify(p, user, state)
            if reason is None:
                found = self._extend(plan, index + 1, state)
                if found is not None:
                    return found
            else:
                self._record(reason)
            state.undo(mark)
        if not tried:
            reason = self._why(
                "no user of {} (the pattern's {}) is {}, as the pattern's {} is",
                source,
                via,
                kind(p),
                p,
            )
            self._record(reason)
        return None

    def _attempt(self, p: Node, node: Node, taken: list[SubgraphMatch]) -> str:
        """Match operation ``p`` at ``node`` alone; why that failed, or what it overlaps."""
        self._failures = []
        try:
            found = self._match_at(p, node, self.pattern.plan(p), _State(set()))
        finally:
            failures, self._failures = self._failures, []
        if found is None:
            return "; ".join(dict.fromkeys(failures)) or "no match"  # each reason once
        return _overlap_reason(found, taken)

    def _record(self, reason: str) -> None:
        if self._explaining:
            self._failures.append(reason)

    def _why(self, template: str, *values: Any) -> str:
        """The reason ``template.format(*values)`` when explaining, else a cheap token.

        Values show as in graph printing: nodes as ``%name``, constants (``Constant``) as
        literals; strings as they are.
        """
        if not self._explaining:
            return _REJECTED
        return template.format(*(shown(value) for value in values))

    # ---------------------------------------------------------------- unify
    def _unify(self, p: Node, g: Node, state: _State) -> str | None:
        """Match operation ``p`` to ``g`` and everything ``p`` depends on; a reason if not."""
        work = [(p, g)]
        bound = state.bound
        while work:
            p, g = work.pop()
            previous = bound.get(p, _UNBOUND)
            if previous is not _UNBOUND:
                if previous is g:
                    continue
                return self._why("the pattern's {} would be both {} and {}", p, previous, g)
            if g in state.owner:
                other = state.owner[g]
                return self._why("{} would match both {} and {} of the pattern", g, other, p)
            if g in state.claimed:
                return self._why("{} is part of a match taken earlier", g)
            reason = self._compare_node(p, g)
            if reason is not None:
                return reason
            state.bind(p, g)
            reason = self._unify_arguments(p, g, work, state)
            if reason is not None:
                return reason
        return None

    def _compare_node(self, p: Node, g: Node) -> str | None:
        """Opcode, target and argument shape of ``g`` against pattern operation ``p``."""
        if not self._same_kind(p, g):
            if p.op != g.op:
                return self._why("{} is a {} node, the pattern's {} is a {}", g, g.op, p, p.op)
            return self._why(
                "{}: {} differs from the pattern's {} at {}",
                g,
                Target(g),
                Target(p),
                p,
            )
        if len(p.args) != len(g.args):
            return self._why(
                "{} has {} positional arguments, the pattern's {} has {}",
                g,
                len(g.args),
                p,
                len(p.args),
            )
        if p.kwargs.keys() != g.kwargs.keys():
            return self._why(
                "{} has keyword arguments ({}), the pattern's {} has ({})",
                g,
                ", ".join(g.kwargs) or "none",
                p,
                ", ".join(p.kwargs) or "none",
            )
        return None

    def _unify_arguments(self, p: Node, g: Node, work: list, state: _State) -> str | None:
        for i, (pa, ga) in enumerate(zip(p.args, g.args)):
            reason = self._unify_value(pa, ga, p, g, i, work, state)
            if reason is not None:
                return reason
        for key, pa in p.kwargs.items():
            reason = self._unify_value(pa, g.kwargs[key], p, g, key, work, state)
            if reason is not None:
                return reason
        return None

    def _unify_value(
        self, pv: Any, gv: Any, p: Node, g: Node, where: Any, work: list, state: _State
    ) -> str | None:
        """One argument of ``g`` (at ``where``) against the pattern's at the same place."""
        if type(pv) is Node:
            if pv.op == "placeholder":
                return self._bind_input(pv, gv, g, where, state)
            if type(gv) is not Node:
                return self._why(
                    "{}: {} is {}, the pattern's {} has a computed value ({})",
                    g,
                    Place(where),
                    Constant(gv),
                    p,
                    pv,
                )
            work.append((pv, gv))
            return None
        if pv is ANY or (self.ignore_literals and not _holds_nodes(pv)):
            if _holds_nodes(gv):
                return self._why(
                    "{}: {} is {}, the pattern's {} has a constant ({})",
                    g,
                    Place(where),
                    Constant(gv),
                    p,
                    Constant(pv),
                )
            return None
        entry = container_type(type(pv))
        if entry is not None:
            pairs = _paired_children(entry, pv, gv)
            if pairs is None:
                return self._literal_mismatch(pv, gv, p, g, where)
            for place, item_p, item_g in pairs:
                reason = self._unify_value(item_p, item_g, p, g, f"{where}{place}", work, state)
                if reason is not None:
                    return reason
            return None
        if _same_constant(pv, gv):
            return None
        return self._literal_mismatch(pv, gv, p, g, where)

    def _literal_mismatch(self, pv: Any, gv: Any, p: Node, g: Node, where: Any) -> str:
        return self._why(
            "{}: {} is {}, the pattern's {} has {}",
            g,
            Place(where),
            Constant(gv),
            p,
            Constant(pv),
        )

    def _bind_input(self, pv: Node, gv: Any, g: Node, where: Any, state: _State) -> str | None:
        previous = state.bound.get(pv, _UNBOUND)
        if previous is _UNBOUND:
            state.bind(pv, gv)
            return None
        if previous is gv or (
            not _holds_nodes(previous) and not _holds_nodes(gv) and _same_constant(previous, gv)
        ):
            return None
        return self._why(
            "the pattern's input {} is {}, but {} has {} at {}",
            pv,
            Constant(previous),
            g,
            Constant(gv),
            Place(where),
        )

    # ---------------------------------------------------------- whole match
    def _accept(self, state: _State) -> SubgraphMatch | None:
        """Check a complete match (inputs, outside users, placement, filters); build it."""
        pattern = self.pattern
        reason = self._check_inputs(state) or self._check_outside_users(state)
        if reason is None:
            found = SubgraphMatch(pattern, state.bound)
            _, problem = replacement_site(found)
            if problem is not None:
                reason = self._why("{}", problem)
            else:
                reason = self._run_filters(found)
                if reason is None:
                    return found
        self._record(reason)
        return None

    def _check_inputs(self, state: _State) -> str | None:
        for p in self.pattern.inputs:
            value = state.bound[p]
            for leaf in _nodes_in(value):
                if leaf in state.owner:
                    return self._why(
                        "the pattern's input {} would be {}, which the match itself computes "
                        "(as the pattern's {})",
                        p,
                        leaf,
                        state.owner[leaf],
                    )
        return None

    def _check_outside_users(self, state: _State) -> str | None:
        returned = self.pattern.returned
        for p in self.pattern.operations:
            if p in returned:
                continue
            g = state.bound[p]
            for user in g.users:
                if user not in state.owner:
                    return self._why(
                        "{} has a user outside the match: {} (the pattern does not return {}, "
                        "so nothing could replace it)",
                        g,
                        user,
                        p,
                    )
        return None

    def _run_filters(self, found: SubgraphMatch) -> str | None:
        graph = found.anchor.graph
        for match_filter in self.match_filters:
            if not match_filter(found, graph, self.pattern_graph):
                name = getattr(match_filter, "__name__", repr(match_filter))
                return self._why("the match at {} was rejected by {}", found.anchor, name)
        return None

    # ------------------------------------------------------ opcode / target
    def _same_kind(self, p: Node, g: Node) -> bool:
        """Whether ``g`` has ``p``'s opcode and a compatible target (arguments aside)."""
        if p.op != g.op:
            return False
        if p.op == "call_module":
            cls = self._module_class(p)
            module = attr_path.find(g.graph.owning_module, g.target) if cls else None
            if module is None or module is attr_path.MISSING:  # no classes: names must agree
                return p.target == g.target
            return type(module) is cls
        if p.op == "get_attr":
            return _same_attribute_kind(
                attr_path.find(self.pattern.root, p.target),
                attr_path.find(g.graph.owning_module, g.target),
            )
        return p.target == g.target

    def _module_class(self, p: Node) -> type | None:
        if p.op != "call_module":
            return None
        module = attr_path.find(self.pattern.root, p.target)
        return type(module) if isinstance(module, torch.nn.Module) else None


# ------------------------------------------------------------------ helpers
def _overlap_reason(found: SubgraphMatch, taken: list[SubgraphMatch]) -> str:
    mine = set(found.nodes)
    for other in taken:
        shared = next((n for n in other.nodes if n in mine), None)
        if shared is not None:
            return (
                f"the match at %{found.anchor.name} would share %{shared.name} with the match "
                f"at %{other.anchor.name}, taken before it (matches are taken in graph order "
                "of their anchors and may not overlap)"
            )
    return f"the match at %{found.anchor.name} was not taken (a filter gave another answer)"


def replacement_site(match: SubgraphMatch, inputs: Sequence[Any] | None = None):
    """Where a replacement of ``match`` goes: ``(node, None)`` to insert before that node,
    or ``(None, reason)`` when no place works.

    The place is right after the match's last node, or earlier, before the first outside
    use of its outputs; every input (``inputs``, default ``match.placeholder_nodes``) must
    come before it.
    """
    matched = set(match.nodes)
    site = max(match.nodes, key=_position).next
    for returned in match.returning_nodes:
        for user in returned.users:
            if user not in matched and _position(user) < _position(site):
                site = user
    for value in match.placeholder_nodes if inputs is None else inputs:
        for leaf in _nodes_in(value):
            if not _position(leaf) < _position(site):
                return None, (
                    f"the match's input %{leaf.name} comes after %{site.name}, which uses "
                    "an output of the match: the replacement would need a value computed "
                    "from its own result"
                )
    return site, None


_END = (float("inf"),)


def _position(node: Node) -> tuple:
    return _END if node.op == "root" else node._sort_key


def _paired_children(entry: ContainerType, pv: Any, gv: Any) -> list[tuple[str, Any, Any]] | None:
    """The children of the pattern's container ``pv`` paired with ``gv``'s, each with its place.

    Places read ``[0]``, ``['key']``, ``.start``, ``.field``. None when ``gv`` is not a
    container of the same kind and shape. Lists and tuples (named or not, and ``torch.Size``)
    are interchangeable, as tracing may produce either; dicts pair by key.
    """
    g_entry = container_type(type(gv))
    family = entry.kind
    if family in SEQUENCE_KINDS:
        is_sequence = isinstance(gv, torch.Size) or (
            g_entry is not None and g_entry.kind in SEQUENCE_KINDS
        )
        if not is_sequence or len(pv) != len(gv):
            return None
        return [(f"[{i}]", item_p, item_g) for i, (item_p, item_g) in enumerate(zip(pv, gv))]
    if g_entry is None or g_entry.kind != family:
        return None
    if family == "dict":
        if pv.keys() != gv.keys():
            return None
        return [(f"[{key!r}]", item, gv[key]) for key, item in pv.items()]
    p_children, p_context = entry.flatten(pv)
    g_children, g_context = g_entry.flatten(gv)
    if g_entry.type is not entry.type or p_context != g_context:
        return None
    if family == "slice":
        places = [".start", ".stop", ".step"]
    elif family == "dataclass":
        places = [f".{name}" for name in p_context]
    else:
        places = [f"[{i}]" for i in range(len(p_children))]
    return list(zip(places, p_children, g_children))


def _nodes_in(value: Any) -> list[Node]:
    if type(value) is Node:
        return [value]
    if container_type(type(value)) is None:
        return []
    return [leaf for leaf in tree_leaves(value) if type(leaf) is Node]


def _holds_nodes(value: Any) -> bool:
    return bool(_nodes_in(value))


def _unknown(value: Any) -> bool:
    return value is None or value is attr_path.MISSING


def _same_constant(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b) or (a != a and b != b)  # NaN equals NaN here
    except Exception:  # a type whose == does not give a truth value
        return a is b


def _same_attribute_kind(pattern_value: Any, graph_value: Any) -> bool:
    """Whether two attributes may match: both tensors, or of one type; anything goes if one is
    unknown (missing, or None)."""
    if _unknown(pattern_value) or _unknown(graph_value):
        return True
    if isinstance(pattern_value, torch.Tensor):
        return isinstance(graph_value, torch.Tensor)
    return type(pattern_value) is type(graph_value)
