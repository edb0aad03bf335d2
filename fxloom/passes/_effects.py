"""Effects of the nodes of one graph: purity, randomness, writes and aliasing, for the passes.

Shared by ``cse``, ``const_fold``, ``dce`` and ``normalize``. The knowledge is in the tables of
``fxloom.ops.effects`` (randomness, module purity, fresh results) and ``fxloom.ops.mutation``
(what calls write); extend those. This module asks them about nodes of a graph:

* ``Effects.is_random(node)``, ``Effects.is_pure_module(target)`` (a submodule and everything
  under it), cached per module;
* ``Effects.mutated_inputs(node)``: which values may it write to (``None``: it writes nothing)?
* ``Effects.may_alias_input(node)``: may its result share storage with an input?

``AliasClasses`` combines the last two over a graph: values that may share storage are put in
one class, and a class is *mutated* if any write reaches it.

Depends on: the IR and ``fxloom.ops`` (whose registry of run-time functions says that
fxloom's guards and input checks are read-only effects).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from fxloom import attr_path
from fxloom._union_find import UnionFind
from fxloom.graph_module import GraphModule
from fxloom.lint import LEAF_ARGUMENT_TYPES
from fxloom.node import Node
from fxloom.ops.effects import (
    is_random_call,
    module_is_pure,
    module_is_random,
    module_returns_fresh,
    returns_fresh_call,
)
from fxloom.ops.mutation import is_read_only_effect, writes_only_first_argument
from fxloom.pytree import container_type, tree_any, tree_leaves

__all__ = ["AliasClasses", "Effects", "attribute_key", "check_graph_module", "is_literal"]


def is_literal(value: Any) -> bool:
    """Whether ``value`` can be written into a node's arguments as it is (no nodes, no tensors).

    >>> import torch
    >>> is_literal((1, 2.0, None)), is_literal([torch.float32]), is_literal(torch.ones(1))
    (True, True, False)
    """
    return not tree_any(_not_literal, value, is_leaf=_not_literal_container)


def _not_literal(leaf: Any) -> bool:
    return type(leaf) not in LEAF_ARGUMENT_TYPES


def _not_literal_container(value: Any) -> bool:
    """Containers other than plain tuples and lists (a named tuple, a dict...) are not literals."""
    entry = container_type(type(value))
    return entry.type is not type(value) or entry.kind not in ("tuple", "list")


def check_graph_module(gm: Any, pass_name: str) -> GraphModule:
    """``gm`` itself if it is a GraphModule; else a TypeError saying how to get one."""
    if not isinstance(gm, GraphModule):
        raise TypeError(
            f"{pass_name} works on an fxloom.GraphModule, got {type(gm).__name__}; "
            "trace the model first: fxloom.symbolic_trace(model)"
        )
    return gm


class Effects:
    """Answers purity questions about the nodes of one module's graph, caching per module."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self._pure_modules: dict[str, bool] = {}
        self._random_modules: dict[str, bool] = {}

    # --------------------------------------------------------------- modules
    def module(self, target: str) -> nn.Module | None:
        module = attr_path.find(self.root, target)
        return module if isinstance(module, nn.Module) else None

    def is_pure_module(self, target: str) -> bool:
        """Whether calls to the submodule at ``target`` are deterministic and write nothing."""
        pure = self._pure_modules.get(target)
        if pure is None:
            module = self.module(target)
            pure = module is not None and all(module_is_pure(m) for m in module.modules())
            self._pure_modules[target] = pure
        return pure

    # ------------------------------------------------------------ randomness
    def is_random(self, node: Node) -> bool:
        """Whether ``node`` draws random numbers (dropout in training, ``torch.rand``, ...)."""
        if node.op == "call_module":
            return self._is_random_module(node.target)
        return is_random_call(node)

    def _is_random_module(self, target: str) -> bool:
        random = self._random_modules.get(target)
        if random is None:
            module = self.module(target)
            random = module is not None and any(module_is_random(m) for m in module.modules())
            self._random_modules[target] = random
        return random

    # -------------------------------------------------------------- mutation
    def mutated_inputs(self, node: Node) -> tuple[Any, ...] | None:
        """What ``node`` may write to: input nodes and module-state keys; ``None``: nothing.

        A module-state key ``("attr", "layer1")`` stands for every attribute under that path.
        """
        op = node.op
        if op == "call_module":
            if self.is_pure_module(node.target):
                return None
            return (*node.all_input_nodes, attribute_key(node.target))
        if op not in ("call_function", "call_method") or not node.is_impure():
            return None
        if node.meta.get("is_impure"):
            return tuple(node.all_input_nodes)
        if "out" in node.kwargs:
            return tuple(n for n in tree_leaves(node.kwargs["out"]) if isinstance(n, Node))
        target = node.target
        if op == "call_function" and is_read_only_effect(target):
            return ()
        if writes_only_first_argument(op, target, node.kwargs):
            first = node.args[0] if node.args else None
            return (first,) if isinstance(first, Node) else ()
        return tuple(node.all_input_nodes)  # an unknown effect: it may write to any input

    def may_alias_input(self, node: Node) -> bool:
        """Whether ``node``'s result may share storage with one of its inputs."""
        op = node.op
        if op in ("call_function", "call_method"):
            return not returns_fresh_call(node)
        if op == "call_module":
            module = self.module(node.target)
            fresh = module is not None and module_returns_fresh(module)
            return not (fresh and self.is_pure_module(node.target))
        return False


def attribute_key(qualified_name: str) -> tuple[str, str]:
    """The alias-class key standing for the module attribute (or submodule) at a path."""
    return ("attr", qualified_name)


class AliasClasses(UnionFind):
    """Values of a graph that may share storage, and which of those sets the graph writes to.

    Built in one pass (union-find, near-linear): an in-place op joins its result to what it
    writes; a call that may return a view joins its result to its inputs; ``get_attr`` nodes
    join the key of their attribute, and each attribute key the keys of its parent modules
    (a module call that may write to its state writes to everything under it).
    """

    def __init__(self, graph: Any, effects: Effects) -> None:
        super().__init__()
        self.mutations: dict[Node, tuple[Any, ...]] = {}
        for node in graph.nodes:
            written = effects.mutated_inputs(node)
            if written is not None:
                self.mutations[node] = written
                for item in written:
                    self._join_item(node, item)
            elif node.op == "get_attr":
                self._join_item(node, attribute_key(node.target))
            elif effects.may_alias_input(node):
                for used in node.all_input_nodes:
                    self.union(node, used)
        self._mutated_roots = {
            self.find(item) for written in self.mutations.values() for item in written
        }

    def _join_item(self, node: Node, item: Any) -> None:
        if isinstance(item, tuple):  # an attribute key: also join its parent modules' keys
            for parent in reversed(attr_path.prefixes(item[1])[:-1]):
                self.union(item, attribute_key(parent))
        self.union(node, item)

    def is_mutated(self, node: Node) -> bool:
        """Whether anything in the graph may write to ``node``'s value (or one sharing storage)."""
        return self.find(node) in self._mutated_roots
