"""Symbolic tracing's implementation of ``fxloom.cond``: both branches traced into sub-GraphModules.

A ``cond`` whose predicate or operands are proxies is claimed by the tracer
that made them (this module's row of ``fxloom.cond.CAPTURES``: ``tracer_of``
claims, ``trace_cond`` records). Each branch is traced into a graph of its own; an outer value the
branch reads (a parameter, a node computed before the cond) is lifted to an
extra input, in the same order for both branches, and one ``cond_op`` node
calls the two branches held by the root (``true_graph_0``, ``false_graph_0``).

Depends on ``fxloom.cond`` (the operator and the checks every capture shares),
``fxloom.proxy`` and the IR.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fxloom import pytree
from fxloom.cond import (
    branch_mismatch,
    cond_op,
    free_branch_names,
    order_placeholders,
    output_leaves,
)
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node, map_arg
from fxloom.proxy import Proxy

if TYPE_CHECKING:
    from fxloom.tracer import Tracer

__all__ = ["trace_cond", "tracer_of"]


class _TracedBranch:
    """One branch being traced: its graph, and the outer nodes it reads, lifted to inputs."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.graph = Graph()
        self.lifted: dict[Node, Node] = {}  # outer node -> its placeholder here

    def local(self, node: Node) -> Node:
        """``node`` as seen inside the branch: an outer node becomes an input of the branch."""
        if node.graph is self.graph:
            return node
        placeholder = self.lifted.get(node)
        if placeholder is None:
            placeholder = self.lifted[node] = self.graph.placeholder(node.name)
        return placeholder

    def lift_attributes(self, tracer: Tracer) -> None:
        """Parameters and constants read inside become inputs (outer ``get_attr`` nodes)."""
        for node in list(self.graph.find_nodes(op="get_attr")):
            if node.target in self.graph.constants:  # a nested cond's branch
                continue
            outer = tracer.create_proxy("get_attr", node.target, (), {}).node
            node.replace_all_uses_with(self.local(outer))
            self.graph.erase_node(node)


@contextlib.contextmanager
def _tracing_into(tracer: Tracer, branch: _TracedBranch) -> Iterator[None]:
    """The tracer records into ``branch.graph``; outer nodes met are lifted, parameters read
    are recorded anew (the tracer's cache of them holds outer nodes)."""
    saved_graph, saved_hook = tracer.graph, tracer.__dict__.get("create_arg")
    cache = tracer._parameter_proxy_cache
    saved_cache = dict(cache)
    create_arg = type(tracer).create_arg.__get__(tracer)
    cache.clear()
    tracer.graph = branch.graph
    tracer.create_arg = lambda a: map_arg(create_arg(a), branch.local)  # type: ignore[method-assign]
    try:
        yield
    finally:
        tracer.graph = saved_graph
        if saved_hook is None:
            del tracer.create_arg
        else:
            tracer.create_arg = saved_hook  # type: ignore[method-assign]
        cache.clear()
        cache.update(saved_cache)


def trace_cond(
    tracer: Tracer, pred: Any, true_fn: Any, false_fn: Any, operands: Any
) -> tuple[list[Any], Any]:
    """Record a cond under ``tracer``: two sub-GraphModules and one ``cond_op`` node."""
    operand_leaves, operand_spec = pytree.tree_flatten(operands)
    branches, outputs = [], []
    for role, fn in (("true_fn", true_fn), ("false_fn", false_fn)):
        branch = _TracedBranch(role)
        with _tracing_into(tracer, branch):
            inputs = [
                _branch_input(tracer, branch, leaf, i) for i, leaf in enumerate(operand_leaves)
            ]
            leaves, spec = output_leaves(fn(*pytree.tree_unflatten(inputs, operand_spec)), role)
            branch.graph.output(tuple(tracer.create_arg(leaf) for leaf in leaves))
        branch.lift_attributes(tracer)
        branches.append((branch, inputs))
        outputs.append((leaves, spec))
    problem = branch_mismatch(*outputs)
    if problem is not None:
        raise tracer.trace_error(problem, "make both branches return the same structure")
    lifted = list(dict.fromkeys(node for branch, _ in branches for node in branch.lifted))
    names = free_branch_names(tracer.graph, lambda name: hasattr(tracer.root, name))
    for (branch, inputs), name in zip(branches, names):
        ordered = [proxy.node for proxy in inputs] + [branch.local(node) for node in lifted]
        order_placeholders(branch.graph, ordered)
        # From the root: leaf modules the branch calls (call_module) are shared with it.
        tracer.graph.constants[name] = GraphModule(tracer.root, branch.graph, name)
    getters = [tracer.create_proxy("get_attr", name, (), {}) for name in names]
    args = (pred, *getters, (*operand_leaves, *lifted))
    node = tracer.create_proxy("call_function", cond_op, args, {}, name="cond")
    leaves, spec = outputs[0]
    return [node[i] for i in range(len(leaves))], spec


def _branch_input(tracer: Tracer, branch: _TracedBranch, leaf: Any, index: int) -> Proxy:
    """A proxy for operand ``leaf`` inside the branch; with example inputs, it has the
    operand's example value, so the branch can ask about shapes and dtypes too."""
    name = leaf.node.name if isinstance(leaf, Proxy) else f"operand_{index}"
    proxy = tracer.proxy(branch.graph.placeholder(name))
    if isinstance(leaf, Proxy):
        proxy._fxloom_value = leaf._fxloom_example  # NO_VALUE when tracing without examples
    return proxy


def tracer_of(pred: Any, operands: Any) -> Tracer | None:
    """The tracer whose proxies the call is given, if any: it records the cond."""
    if isinstance(pred, Proxy):
        return pred.tracer
    for leaf in pytree.tree_leaves(operands):
        if isinstance(leaf, Proxy):
            return leaf.tracer
    return None
