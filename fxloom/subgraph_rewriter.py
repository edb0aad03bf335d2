"""Find a pattern in a ``GraphModule`` and replace every occurrence: ``replace_pattern``.

The pattern and the replacement are functions or modules, traced with
``fxloom.symbolic_trace``, or ready graphs (``Graph``, ``GraphModule``). The replacement
takes the pattern's inputs, in the same order, and returns as many values as the pattern.
What matches what, and in which order, is in ``fxloom.passes.matcher``; in short: pattern
inputs match any value, operations match by opcode, target and arguments, constants must
be equal unless written ``ANY`` (or ``ignore_literals=True``), and only values the pattern
returns may be used outside a match.

    >>> import torch, fxloom
    >>> from fxloom import subgraph_rewriter
    >>> def model(x, w1, w2):
    ...     return x + torch.cat([w1, w2]).sum() + torch.cat([w2, w1]).sum()
    >>> def pattern(a, b):
    ...     return torch.cat([a, b])
    >>> def replacement(a, b):
    ...     return torch.stack([a, b])
    >>> gm = fxloom.symbolic_trace(model)
    >>> [m.anchor.name for m in subgraph_rewriter.replace_pattern(gm, pattern, replacement)]
    ['cat', 'cat_1']
    >>> print(gm.code.strip())
    def forward(self, x, w1, w2):
        stack = torch.stack([w1, w2])
        sum_1 = stack.sum();  stack = None
        add = x + sum_1;  x = sum_1 = None
        stack_1 = torch.stack([w2, w1]);  w2 = w1 = None
        sum_2 = stack_1.sum();  stack_1 = None
        add_1 = add + sum_2;  add = sum_2 = None
        return add_1

A constant in the pattern matches only an equal constant; ``ANY`` matches any constant
(to pass the constant on to the replacement, make it a pattern input instead). Dropout that
does nothing in evaluation, whatever its probability:

    >>> import torch.nn.functional as F
    >>> from fxloom.subgraph_rewriter import ANY
    >>> def net(x):
    ...     return F.dropout(x, 0.1, training=False) + F.dropout(x, 0.5, training=False)
    >>> gm = fxloom.symbolic_trace(net)
    >>> def dropout_off(x):
    ...     return F.dropout(x, ANY, training=False)
    >>> len(subgraph_rewriter.replace_pattern(gm, dropout_off, lambda x: x))
    2
    >>> print(gm.code.strip())
    def forward(self, x):
        add = x + x;  x = None
        return add

``explain_match(gm, pattern, node)`` says why a node is not part of a match.

What a rewrite does to the module:

* each match's operations are erased and the replacement's copied in their place (just
  after the match's last node, or before the first outside use of its outputs if that
  comes earlier); users of the pattern's returned values use the replacement's instead;
* new nodes are named after the replacement's nodes, made unique (``stack``, ``stack_1``);
  every other node keeps its name and its ``meta``;
* ``node.meta`` of new nodes: ``stack_trace``, ``source_location`` and ``nn_module_stack`` are copied from the
  match's anchor (so errors and module-stack-based tools point at the replaced code); no
  other key is set (run ``fxloom.passes.shape_prop`` again for ``tensor_meta``);
* a ``call_module``/``get_attr`` of the replacement whose target is also the target of a
  pattern node of the same opcode uses what that node matched (so a replacement can reuse
  the matched module, e.g. keep a conv and change its activation); any other is copied
  (``copy.deepcopy``) from the replacement module into ``gm`` once, under the same name or
  ``<name>_1``, ... if ``gm`` has something else there, and shared by all rewritten sites;
* inputs the replacement ignores stay in the graph, and submodules the graph stops calling
  stay on the module: run ``gm.graph.eliminate_dead_code()`` and
  ``gm.delete_all_unused_submodules()`` to drop them;
* the graph is linted and ``gm.recompile()`` is called (fxloom would regenerate lazily).

Bad input (a pattern that is not a graph or callable, one with no operations, a replacement
with other numbers of inputs or outputs) raises before anything changes: the module is
then exactly as it was.

Differences from torch.fx: ``Match.anchor`` is the graph node matched to the pattern's
first returned value (torch.fx gives the pattern's node); two pattern inputs may match the
same graph value; ``ANY``, ``explain_match`` and matching a ``call_module`` by the module's
class are additions.

Depends on: the IR, ``fxloom.passes.matcher`` and ``fxloom.tracer`` (to trace callables).
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from fxloom import attr_path
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node, map_arg
from fxloom.passes._match_pattern import Pattern, PatternError
from fxloom.passes.matcher import (
    ANY,
    MatchExplanation,
    MatchFilter,
    SubgraphMatch,
    SubgraphMatcher,
    replacement_site,
)
from fxloom.values.provenance import WHERE_KEYS

__all__ = [
    "ANY",
    "Match",
    "MatchExplanation",
    "PatternError",
    "ReplacedPatterns",
    "SubgraphMatch",
    "explain_match",
    "replace_pattern",
    "replace_pattern_with_filters",
]

# Keys of the anchor's meta that new nodes inherit: where the replaced code came from.
INHERITED_META = WHERE_KEYS

PatternLike = Callable[..., Any] | Graph | GraphModule


class Match(NamedTuple):
    """Where a pattern was replaced: ``anchor`` (the graph node matched to the pattern's first
    returned value, now erased) and ``nodes_map`` (pattern node -> graph node, or the constant
    a pattern input matched)."""

    anchor: Node
    nodes_map: dict[Node, Any]


@dataclass
class ReplacedPatterns:
    """A ``Match`` plus ``replacements``: the nodes inserted for it, in order."""

    anchor: Node
    nodes_map: dict[Node, Any]
    replacements: list[Node]


def replace_pattern(gm: GraphModule, pattern: PatternLike, replacement: PatternLike) -> list[Match]:
    """Replace every non-overlapping occurrence of ``pattern`` in ``gm`` by ``replacement``.

    See the module docstring for an example and for what happens to names, ``meta`` and
    attributes. Returns the matches replaced, in graph order of their anchors (empty if
    none; the module is then unchanged).
    """
    replaced = replace_pattern_with_filters(gm, pattern, replacement)
    return [Match(r.anchor, r.nodes_map) for r in replaced]


def replace_pattern_with_filters(
    gm: GraphModule,
    pattern: PatternLike,
    replacement: PatternLike,
    match_filters: Sequence[MatchFilter] | None = None,
    ignore_literals: bool = False,
) -> list[ReplacedPatterns]:
    """``replace_pattern`` keeping only matches every filter accepts; with the inserted nodes.

    ``match_filters`` are callables ``(match, original_graph, pattern_graph) -> bool``; the
    match is a ``SubgraphMatch`` (``anchor``, ``nodes_map``, ``placeholder_nodes``,
    ``returning_nodes``). With ``ignore_literals`` every constant of the pattern matches any
    constant (as if written ``ANY``).

    >>> import torch, fxloom
    >>> from fxloom.subgraph_rewriter import replace_pattern_with_filters
    >>> gm = fxloom.symbolic_trace(lambda x: (x * 2, x * 3))
    >>> def only_doubling(match, graph, pattern_graph):
    ...     return match.anchor.args[1] == 2
    >>> done = replace_pattern_with_filters(
    ...     gm, lambda x, k: x * k, lambda x, k: x + x, [only_doubling]
    ... )
    >>> [node.name for r in done for node in r.replacements]
    ['add']
    """
    if not isinstance(gm, GraphModule):
        raise TypeError(
            f"replace_pattern rewrites a GraphModule, got {type(gm).__name__}; "
            "wrap a graph with fxloom.GraphModule(root, graph)"
        )
    # A traced pattern's module stays alive while matching: its call_module targets name it.
    pattern_graph, _pattern_module = _load(pattern, "pattern")
    replacement_graph, replacement_root = _load(replacement, "replacement")
    matcher = SubgraphMatcher(
        pattern_graph, ignore_literals=ignore_literals, match_filters=match_filters or ()
    )
    rewrite = _Replacement(matcher.pattern, replacement_graph, replacement_root)
    matches = matcher.match(gm.graph)
    for found in matches:
        rewrite.check_outputs(found)
    if not matches:
        return []
    rewrite.install_attributes(gm)
    done = [r for r in (rewrite.apply(gm.graph, found) for found in matches) if r is not None]
    gm.graph.lint()
    gm.recompile()
    return done


def explain_match(
    gm: GraphModule | Graph,
    pattern: PatternLike,
    node: Node | str,
    *,
    match_filters: Sequence[MatchFilter] = (),
    ignore_literals: bool = False,
) -> MatchExplanation:
    """Why ``node`` (a node or its name) is, or is not, part of a match of ``pattern``.

    >>> import torch, fxloom
    >>> from fxloom.subgraph_rewriter import explain_match
    >>> def model(x):
    ...     y = torch.relu(x)
    ...     return y + y.sum()
    >>> gm = fxloom.symbolic_trace(model)
    >>> print(explain_match(gm, lambda x: torch.relu(x) * 2, "relu"))
    %relu does not match the pattern:
      as %relu: no user of %relu (the pattern's %relu) is a call of operator.mul, as the pattern's %mul is
    >>> print(explain_match(gm, lambda x: torch.relu(x).sum(), "relu"))
    %relu does not match the pattern:
      as %relu: %relu has a user outside the match: %add (the pattern does not return %relu, so nothing could replace it)
    """
    graph = gm.graph if isinstance(gm, GraphModule) else gm
    if not isinstance(graph, Graph):
        raise TypeError(f"explain_match needs a GraphModule or Graph, got {type(gm).__name__}")
    pattern_graph, _pattern_module = _load(pattern, "pattern")
    matcher = SubgraphMatcher(
        pattern_graph, ignore_literals=ignore_literals, match_filters=match_filters
    )
    return matcher.explain(_find_node(graph, node))


# ------------------------------------------------------------------ loading
def _load(obj: Any, role: str) -> tuple[Graph, torch.nn.Module | None]:
    """The graph of a pattern or replacement, and the module its attribute targets name."""
    if isinstance(obj, GraphModule):
        return obj.graph, obj
    if isinstance(obj, Graph):
        return obj, obj.owning_module
    if isinstance(obj, torch.nn.Module) or callable(obj):
        from fxloom.tracer import symbolic_trace

        name = getattr(obj, "__name__", type(obj).__name__)
        try:
            traced = symbolic_trace(obj)
        except Exception as err:
            raise PatternError(f"could not trace the {role} {name}: {err}") from err
        return traced.graph, traced
    raise TypeError(
        f"the {role} must be a function, an nn.Module, a Graph or a GraphModule, "
        f"got {type(obj).__name__}: {obj!r}"
    )


def _find_node(graph: Graph, node: Node | str) -> Node:
    if isinstance(node, Node):
        if node.graph is not graph:
            raise ValueError(f"%{node.name} belongs to another graph than the one given")
        return node
    names = {n.name: n for n in graph.nodes}
    if node in names:
        return names[node]
    close = difflib.get_close_matches(str(node), names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ValueError(f"the graph has no node named {node!r}{hint}")


# -------------------------------------------------------------- rewriting
class _Replacement:
    """A checked replacement graph, and how its attribute targets map into ``gm``."""

    def __init__(self, pattern: Pattern, graph: Graph, root: torch.nn.Module | None) -> None:
        self.pattern = pattern
        self.body = Pattern(graph, role="replacement")
        self.root = root
        self._check_signature()
        # Replacement node -> the pattern node whose matched target it reuses.
        self.reused: dict[Node, Node] = {}
        # Replacement node -> its target in the rewritten module (after install_attributes).
        self.targets: dict[Node, str] = {}
        # Graph node -> the node that replaced it: a match may take an earlier match's
        # output as an input.
        self.replaced_by: dict[Node, Node] = {}
        self._plan_attributes()

    def _check_signature(self) -> None:
        pattern, body = self.pattern, self.body
        if len(body.inputs) != len(pattern.inputs):
            raise PatternError(
                f"the replacement takes {len(body.inputs)} inputs ({_names(body.inputs)}) but "
                f"the pattern takes {len(pattern.inputs)} ({_names(pattern.inputs)}); give the "
                "replacement the pattern's parameters, in order, even those it does not use"
            )
        if len(body.outputs) != len(pattern.outputs):
            raise PatternError(
                f"the replacement returns {len(body.outputs)} values but the pattern returns "
                f"{len(pattern.outputs)}; return one replacement value for each"
            )

    def _plan_attributes(self) -> None:
        in_pattern = {}
        for p in self.pattern.operations:
            if p.op in ("call_module", "get_attr"):
                in_pattern.setdefault((p.op, p.target), p)
        for node in self.body.operations:
            if node.op not in ("call_module", "get_attr"):
                continue
            same = in_pattern.get((node.op, node.target))
            if same is not None:
                self.reused[node] = same
            elif attr_path.find(self.root, node.target) is attr_path.MISSING:
                raise PatternError(
                    f"replacement node %{node.name} uses {node.target!r}, which the replacement "
                    "does not hold; give the replacement as an nn.Module or GraphModule that "
                    "has it"
                )

    def check_outputs(self, found: SubgraphMatch) -> None:
        """Refuse (before any change) a match where the replacement would return a constant."""
        for value in self.body.outputs:
            if value.op != "placeholder":
                continue
            bound = found.placeholder_nodes[self.body.inputs.index(value)]
            if type(bound) is not Node:
                raise PatternError(
                    f"the replacement returns its input %{value.name}, which at the match at "
                    f"%{found.anchor.name} is the constant {bound!r}; a node's uses can only "
                    "be replaced by another node"
                )

    def install_attributes(self, gm: GraphModule) -> None:
        """Copy the attributes the replacement reads into ``gm`` (once per call)."""
        installed: dict[str, str] = {}
        for node in self.body.operations:
            if node.op not in ("call_module", "get_attr") or node in self.reused:
                continue
            if node.target not in installed:
                value = attr_path.get(self.root, node.target)
                installed[node.target] = _install(gm, node.target, value)
            self.targets[node] = installed[node.target]

    def apply(self, graph: Graph, found: SubgraphMatch) -> ReplacedPatterns | None:
        """Replace one match; None if earlier rewrites left it no place (see the docstring)."""
        inputs = [map_arg(value, self._current) for value in found.placeholder_nodes]
        site, problem = replacement_site(found, inputs)
        if problem is not None:
            return None
        new_nodes, outputs = self._insert(graph, site, found, inputs)
        matched = set(found.nodes)
        for old, new in zip(found.returning_nodes, outputs):
            old.replace_all_uses_with(new, lambda user: user not in matched)
            self.replaced_by[old] = new
        for node in reversed(found.nodes):
            graph.erase_node(node)
        nodes_map = dict(found.nodes_map)
        nodes_map.update(zip(self.pattern.inputs, inputs))
        return ReplacedPatterns(found.anchor, nodes_map, new_nodes)

    def _insert(
        self, graph: Graph, site: Node, found: SubgraphMatch, inputs: list[Any]
    ) -> tuple[list[Node], list[Node]]:
        env: dict[Node, Any] = dict(zip(self.body.inputs, inputs))
        anchor_meta = found.anchor.meta
        inherited = [key for key in INHERITED_META if key in anchor_meta]
        new_nodes = []
        with graph.inserting_before(site):
            for node in self.body.operations:
                target = self._target(node, found)
                args = map_arg(node.args, env.__getitem__)
                kwargs = map_arg(node.kwargs, env.__getitem__)
                new = graph.create_node(node.op, target, args, kwargs, node.name, node.type)
                for key in inherited:  # a copy each: a later pass may edit one node's
                    new.meta[key] = copy.copy(anchor_meta[key])
                env[node] = new
                new_nodes.append(new)
        return new_nodes, [env[value] for value in self.body.outputs]

    def _target(self, node: Node, found: SubgraphMatch) -> Any:
        same = self.reused.get(node)
        if same is not None:
            return found.nodes_map[same].target
        return self.targets.get(node, node.target)

    def _current(self, node: Node) -> Node:
        while node in self.replaced_by:
            node = self.replaced_by[node]
        return node


def _names(nodes: list[Node]) -> str:
    return ", ".join(n.name for n in nodes) or "none"


def _install(gm: GraphModule, target: str, value: Any) -> str:
    """Put a copy of ``value`` at ``target`` in ``gm`` (or a free variant of it); the target.

    The same object already there is reused as it is, not copied.
    """
    if attr_path.find(gm, target) is value:
        return target
    free = attr_path.free_name(gm, target)
    attr_path.install(gm, free, copy.deepcopy(value), as_buffer=True)
    return free
