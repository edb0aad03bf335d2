"""Common-subexpression elimination: compute each distinct pure expression once.

    >>> import torch, fxloom
    >>> from fxloom.passes.cse import cse
    >>> def f(x):
    ...     return torch.relu(x + 1) * torch.relu(x + 1)
    >>> gm = cse(fxloom.symbolic_trace(f))
    >>> print(gm.code.strip())
    def forward(self, x):
        add = x + 1;  x = None
        relu = torch.relu(add);  add = None
        mul = relu * relu;  relu = None
        return mul

Depends on: the IR and ``fxloom.passes._effects`` (purity, randomness, aliasing tables).
"""

from __future__ import annotations

from typing import Any

from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.passes._effects import AliasClasses, Effects, check_graph_module
from fxloom.pytree import container_type

__all__ = ["cse"]

_MERGEABLE_OPS = frozenset(("get_attr", "call_function", "call_method", "call_module"))


def cse(gm: GraphModule) -> GraphModule:
    """Merge nodes computing the same expression, keeping the first; return ``gm`` (edited in place).

    Two nodes are the same expression when they have the same op and target and equal
    arguments: the same nodes, and literals of the same type and value (``1``, ``1.0`` and
    ``True`` differ; so do ``0.0`` and ``-0.0``, and lists and tuples), looked up by hashing,
    so the pass is linear in the graph's size. Later uses of a merged node read the kept one.

    Never merged:

    * impure nodes (``Node.is_impure``: in-place ops, ``setitem``, guards, ``out=`` calls...);
    * random ones (``torch.rand``, dropout in training, ...: see
      ``fxloom.ops.effects.RANDOM_FUNCTIONS``);
    * calls of modules not known to be pure (``fxloom.ops.effects.MODULE_PURITY``: torch.nn
      modules are, unless in-place, random, hooked, or updating running statistics in training
      mode);
    * across a write: if something may write to an input (or a value sharing its storage)
      between two occurrences, both are kept (``a = x + 1; x.add_(1); b = x + 1``);
    * values that something may write to later (merging would make the write visible to both).

    Calls of functions and methods are assumed to be pure unless ``Node.is_impure`` or the
    random table says otherwise: the contract dead-code elimination relies on too. Mark a
    function with side effects with ``fxloom.has_side_effect``.

    ``node.meta`` and names: kept nodes keep theirs unchanged; merged nodes are erased.
    """
    check_graph_module(gm, "cse")
    graph = gm.graph
    duplicates = _find_duplicates(graph, Effects(gm))  # decided before any edit
    for node, kept in duplicates.items():
        node.replace_all_uses_with(kept)
        graph.erase_node(node)
    return gm


def _find_duplicates(graph: Any, effects: Effects) -> dict[Node, Node]:
    """Each node that repeats an earlier expression -> the earlier node, in graph order."""
    aliases = AliasClasses(graph, effects)
    versions: dict[Any, int] = {}  # alias class -> number of writes seen so far
    first_of: dict[tuple[Any, ...], Node] = {}
    duplicates: dict[Node, Node] = {}
    for node in graph.nodes:
        written = aliases.mutations.get(node)
        if written:
            for item in written:
                root = aliases.find(item)
                versions[root] = versions.get(root, 0) + 1
        if not _mergeable(node, effects, aliases):
            continue
        key = _expression_key(node, aliases, versions, duplicates)
        kept = first_of.setdefault(key, node)
        if kept is not node:
            duplicates[node] = kept
    return duplicates


def _mergeable(node: Node, effects: Effects, aliases: AliasClasses) -> bool:
    if node.op not in _MERGEABLE_OPS or node.is_impure() or effects.is_random(node):
        return False
    if node.op == "call_module" and not effects.is_pure_module(node.target):
        return False
    return not aliases.is_mutated(node)


def _expression_key(
    node: Node, aliases: AliasClasses, versions: dict[Any, int], merged: dict[Node, Node]
) -> tuple[Any, ...]:
    """A hashable key equal for nodes computing the same value at this point of the graph.

    Inputs already found to repeat an earlier node stand for that node (``merged``).
    """
    kwargs = tuple(sorted((name, literal_key(v, merged)) for name, v in node.kwargs.items()))
    key = (node.op, literal_key(node.target), literal_key(node.args, merged), kwargs)
    if aliases.mutations:  # the graph writes: an input written to in between is a new value
        written = tuple(versions.get(aliases.find(n), 0) for n in node.all_input_nodes)
        key += (written,)
    return key


_FAMILY_OF_KIND = {"list": list, "dict": dict}


def _hashable(context: Any, value: Any) -> Any:
    """``context`` if it can be part of a key, else the identity of the container it came from."""
    try:
        hash(context)
    except TypeError:
        return ("id", id(value))
    return context


def literal_key(value: Any, merged: dict[Node, Node] | None = None) -> Any:
    """A hashable stand-in for an argument, equal only for interchangeable arguments.

    Nodes stand for themselves (or for ``merged[node]``); literals carry their type (``1``/``1.0``/``True`` and
    tuples/lists differ); floats are compared by their bits (``-0.0`` differs from ``0.0``,
    a NaN equals itself); unhashable objects are compared by identity.

    >>> literal_key(1) == literal_key(1.0), literal_key([1, 2]) == literal_key([1, 2])
    (False, True)
    """
    kind = type(value)
    if kind is Node:
        return merged.get(value, value) if merged else value
    if kind is float:
        return (float, value.hex())
    if kind is complex:
        return (complex, value.real.hex(), value.imag.hex())
    entry = container_type(kind)
    if entry is not None:  # a container: its family, its context (dict keys...) and its items
        children, context = entry.flatten(value)
        items = tuple(literal_key(child, merged) for child in children)
        # Tuples, named tuples and dataclasses keep their type; lists and dicts of any kind
        # (immutable_list, OrderedDict...) are the same argument.
        family = _FAMILY_OF_KIND.get(entry.kind, kind)
        return (family, _hashable(context, value), items)
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return (kind, value)
