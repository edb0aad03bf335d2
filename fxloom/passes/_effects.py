"""What a node does besides computing its value: randomness, mutation, aliasing, module state.

Shared by ``cse``, ``const_fold`` and ``dce``. Op-specific knowledge lives in the tables
below, keyed by target; extend them for your own functions and modules::

    RANDOM_FUNCTIONS[my_noise] = None                   # always random
    MODULE_PURITY[MyBlock] = lambda module: True        # calls are pure and deterministic
    FRESH_RESULT_FUNCTIONS[my_op] = None                # never returns a view of an input

Three questions are answered for a node:

* ``Effects.is_random(node)``: does it draw random numbers (so two calls differ, and dropping
  one shifts the random stream)?
* ``Effects.mutated_inputs(node)``: which values may it write to (``None``: it writes nothing)?
* ``Effects.may_alias_input(node)``: may its result share storage with an input?

``AliasClasses`` combines the last two over a graph: values that may share storage are put in
one class, and a class is *mutated* if any write reaches it. What the tables do not know is
assumed the cautious way: unknown functions may return views of their inputs, unknown modules
may write to their inputs and their own state, and only torch.nn modules are pure. (An entry
that claims too much, say a view-returning function listed as fresh, makes passes wrong.)

Depends on: the IR, ``fxloom.guards`` (to recognise run-time checks) and torch.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxloom import guards
from fxloom.graph_module import GraphModule
from fxloom.node import _LEAF_TYPES, IN_PLACE_OPERATORS, Node, _is_inplace_name
from fxloom.pytree import container_type, tree_any, tree_leaves

__all__ = [
    "RANDOM_FUNCTIONS",
    "RANDOM_METHODS",
    "RANDOM_MODULES",
    "READ_ONLY_EFFECTS",
    "WRITES_FIRST_ARGUMENT",
    "MODULE_PURITY",
    "FRESH_RESULT_FUNCTIONS",
    "FRESH_RESULT_METHODS",
    "FRESH_RESULT_MODULES",
    "Effects",
    "AliasClasses",
    "check_graph_module",
    "is_literal",
]

NodePredicate = Callable[[Node], bool]


def call_argument(node: Node, index: int, name: str, default: Any) -> Any:
    """The argument ``name`` of a call, given by keyword or at position ``index``, or ``default``."""
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[index] if len(node.args) > index else default


def _unless_false(index: int, name: str, default: bool) -> NodePredicate:
    # ``training``-style flags: random unless the flag is literally False.
    return lambda node: call_argument(node, index, name, default) is not False


def _unless_zero(index: int, name: str) -> NodePredicate:
    # ``dropout_p``-style rates: random unless the rate is literally zero.
    return lambda node: call_argument(node, index, name, 0.0) not in (0, 0.0)


# ------------------------------------------------------------------ randomness
# target -> None (always random) or predicate(node) (random for this call?).
RANDOM_FUNCTIONS: dict[Any, NodePredicate | None] = {
    **dict.fromkeys(
        (
            torch.rand,
            torch.rand_like,
            torch.randn,
            torch.randn_like,
            torch.randint,
            torch.randint_like,
            torch.randperm,
            torch.normal,
            torch.bernoulli,
            torch.multinomial,
            torch.poisson,
            F.gumbel_softmax,
        )
    ),
    F.dropout: _unless_false(2, "training", True),
    F.dropout1d: _unless_false(2, "training", True),
    F.dropout2d: _unless_false(2, "training", True),
    F.dropout3d: _unless_false(2, "training", True),
    F.alpha_dropout: _unless_false(2, "training", False),
    F.feature_alpha_dropout: _unless_false(2, "training", False),
    torch.dropout: _unless_false(2, "train", True),
    torch.alpha_dropout: _unless_false(2, "train", True),
    torch.feature_dropout: _unless_false(2, "train", True),
    torch.feature_alpha_dropout: _unless_false(2, "train", True),
    F.rrelu: _unless_false(3, "training", False),
    torch.rrelu: _unless_false(3, "training", False),
    F.scaled_dot_product_attention: _unless_zero(4, "dropout_p"),
}

# Tensor method name -> None or predicate, as above (in-place ones are impure anyway).
RANDOM_METHODS: dict[str, NodePredicate | None] = dict.fromkeys(
    ("bernoulli", "multinomial", "bernoulli_", "uniform_", "normal_", "random_")
    + ("exponential_", "geometric_", "cauchy_", "log_normal_")
)

# Module class (matched along the MRO) -> predicate(module): are its calls random?
RANDOM_MODULES: dict[type, Callable[[nn.Module], bool]] = {
    nn.modules.dropout._DropoutNd: lambda m: m.training and m.p > 0,
    nn.RReLU: lambda m: m.training,
    nn.MultiheadAttention: lambda m: m.training and m.dropout > 0,
    nn.modules.rnn.RNNBase: lambda m: m.training and m.dropout > 0,
}

# ------------------------------------------------------------------ mutation
# Impure calls that write to no value of the program: run-time checks and printing.
READ_ONLY_EFFECTS: set[Any] = {
    builtins.print,
    torch._assert,
    torch.manual_seed,  # changes the random stream, which random nodes account for
    guards.check_guard,
    guards.check_tensor_input,
    guards.check_length,
    guards.check_variadic_length,
    guards.check_variadic_keys,
}
_READ_ONLY_EFFECT_TYPES = (guards.FixedArgument,)

# Impure functions that write to their first argument only.
WRITES_FIRST_ARGUMENT: set[Any] = {
    operator.setitem,
    operator.delitem,
    builtins.setattr,
    builtins.delattr,
    *IN_PLACE_OPERATORS,
}

# Module class (matched along the MRO) -> predicate(module): are its calls pure (deterministic,
# no writes to inputs or state)? Classes of torch.nn not listed are pure; others are not,
# unless registered here. Random modules, in-place ones (``inplace=True``) and modules with
# forward hooks are never pure.
MODULE_PURITY: dict[type, Callable[[nn.Module], bool]] = {
    # Running statistics are updated by calls in training mode.
    nn.modules.batchnorm._NormBase: lambda m: not (m.training and m.track_running_stats),
    # Lazy modules create their parameters on the first call.
    nn.modules.lazy.LazyModuleMixin: lambda m: not m.has_uninitialized_params(),
}

# ------------------------------------------------------------------ aliasing
_METADATA_ATTRIBUTES = frozenset(
    ("shape", "dtype", "device", "ndim", "layout", "is_cuda", "requires_grad", "is_leaf")
)


def _produces_tensor(node: Node) -> bool:
    # ``+``, ``*``, ``|``... also concatenate, repeat or merge tuples, lists and dicts, and
    # the new container holds the very same tensors: fresh only if the result is a tensor,
    # as analyses record it (``ShapeProp``: ``meta["type"]``; ``meta["val"]``).
    recorded = node.meta.get("type")
    if isinstance(recorded, type):
        return issubclass(recorded, torch.Tensor)
    return isinstance(node.meta.get("val"), torch.Tensor)


# target -> None or predicate(node): the result never shares storage with an input.
FRESH_RESULT_FUNCTIONS: dict[Any, NodePredicate | None] = {
    **dict.fromkeys((operator.add, operator.mul, operator.and_, operator.or_), _produces_tensor),
    operator.xor: _produces_tensor,
    **dict.fromkeys(
        (
            operator.sub,
            operator.truediv,
            operator.floordiv,
            operator.mod,
            operator.pow,
            operator.matmul,
            operator.neg,
            operator.invert,
            operator.eq,
            operator.ne,
            operator.lt,
            operator.le,
            operator.gt,
            operator.ge,
            builtins.len,
            torch.add,
            torch.sub,
            torch.mul,
            torch.div,
            torch.matmul,
            torch.mm,
            torch.bmm,
            torch.addmm,
            torch.baddbmm,
            torch.cat,
            torch.stack,
            torch.where,
            torch.softmax,
            torch.log_softmax,
            torch.relu,
            torch.sigmoid,
            torch.tanh,
            torch.exp,
            torch.log,
            torch.sqrt,
            torch.rsqrt,
            torch.pow,
            torch.sum,
            torch.mean,
            torch.clone,
            torch.masked_fill,
            torch.cumsum,
            torch.arange,
            torch.zeros,
            torch.ones,
            torch.full,
            torch.eye,
            torch.zeros_like,
            torch.ones_like,
            torch.full_like,
            torch.conv1d,
            torch.conv2d,
            torch.conv3d,
            torch.layer_norm,
            torch.embedding,
            F.linear,
            F.gelu,
            F.silu,
            F.softmax,
            F.log_softmax,
            F.layer_norm,
            F.embedding,
            F.scaled_dot_product_attention,
        )
    ),
    builtins.getattr: lambda node: len(node.args) > 1 and node.args[1] in _METADATA_ATTRIBUTES,
}

# Tensor method name -> None or predicate(node), as above.
FRESH_RESULT_METHODS: dict[str, NodePredicate | None] = dict.fromkeys(
    ("add", "sub", "mul", "div", "matmul", "bmm", "mm", "pow", "neg", "abs", "exp", "log")
    + ("sqrt", "rsqrt", "relu", "sigmoid", "tanh", "softmax", "log_softmax", "sum", "mean")
    + ("cumsum", "clone", "masked_fill", "eq", "ne", "lt", "le", "gt", "ge", "size", "dim")
    + ("numel", "new_ones", "new_zeros", "new_full", "new_empty", "new_tensor", "argmax")
    + ("argmin", "all", "any", "norm")
)

# Module classes (matched along the MRO) whose pure calls return new tensors.
FRESH_RESULT_MODULES: set[type] = {
    nn.Linear,
    nn.modules.conv._ConvNd,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.batchnorm._NormBase,
    nn.Embedding,
    nn.ReLU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.Softmax,
    nn.LogSoftmax,
    nn.modules.pooling._MaxPoolNd,
    nn.modules.pooling._AvgPoolNd,
    nn.modules.pooling._AdaptiveAvgPoolNd,
}


def _lookup_mro(table: dict[type, Any] | set[type], cls: type) -> Any:
    """The entry for the nearest class of ``cls``'s MRO in ``table`` (``None`` if none)."""
    for base in cls.__mro__:
        if base in table:
            return table[base] if isinstance(table, dict) else True
    return None


def _table_says(table: dict[Any, NodePredicate | None], key: Any, node: Node) -> bool:
    try:
        if key not in table:
            return False
    except TypeError:  # an unhashable callable: in no table
        return False
    predicate = table[key]
    return predicate is None or bool(predicate(node))


def is_literal(value: Any) -> bool:
    """Whether ``value`` can be written into a node's arguments as it is (no nodes, no tensors).

    >>> is_literal((1, 2.0, None)), is_literal([torch.float32]), is_literal(torch.ones(1))
    (True, True, False)
    """
    return not tree_any(_not_literal, value, is_leaf=_not_literal_container)


def _not_literal(leaf: Any) -> bool:
    return type(leaf) not in _LEAF_TYPES


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
        try:
            return self.root.get_submodule(target)
        except AttributeError:
            return None

    def is_pure_module(self, target: str) -> bool:
        """Whether calls to the submodule at ``target`` are deterministic and write nothing."""
        pure = self._pure_modules.get(target)
        if pure is None:
            module = self.module(target)
            pure = module is not None and all(_module_alone_is_pure(m) for m in module.modules())
            self._pure_modules[target] = pure
        return pure

    # ---------------------------------------------------------------- purity
    def is_impure(self, node: Node) -> bool:
        """``Node.is_impure`` (one place to refine it for the passes)."""
        return node.is_impure()

    # ------------------------------------------------------------ randomness
    def is_random(self, node: Node) -> bool:
        """Whether ``node`` draws random numbers (dropout in training, ``torch.rand``, ...)."""
        op = node.op
        if op == "call_function":
            target = node.target
            tags = getattr(target, "tags", None)  # torch.ops overloads carry their own tag
            if tags is not None and torch.Tag.nondeterministic_seeded in tags:
                return True
            return _table_says(RANDOM_FUNCTIONS, target, node)
        if op == "call_method":
            return _table_says(RANDOM_METHODS, node.target, node)
        if op == "call_module":
            return self._is_random_module(node.target)
        return False

    def _is_random_module(self, target: str) -> bool:
        random = self._random_modules.get(target)
        if random is None:
            module = self.module(target)
            random = module is not None and any(
                _module_alone_is_random(m) for m in module.modules()
            )
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
        if op not in ("call_function", "call_method") or not self.is_impure(node):
            return None
        if node.meta.get("is_impure"):
            return tuple(node.all_input_nodes)
        if "out" in node.kwargs:
            return tuple(n for n in tree_leaves(node.kwargs["out"]) if isinstance(n, Node))
        target = node.target
        if op == "call_function" and _is_read_only_effect(target):
            return ()
        if _writes_first_argument(node):
            first = node.args[0] if node.args else None
            return (first,) if isinstance(first, Node) else ()
        return tuple(node.all_input_nodes)  # an unknown effect: it may write to any input

    def may_alias_input(self, node: Node) -> bool:
        """Whether ``node``'s result may share storage with one of its inputs."""
        op = node.op
        if op == "call_function":
            return not _table_says(FRESH_RESULT_FUNCTIONS, node.target, node)
        if op == "call_method":
            return not _table_says(FRESH_RESULT_METHODS, node.target, node)
        if op == "call_module":
            module = self.module(node.target)
            fresh = module is not None and _lookup_mro(FRESH_RESULT_MODULES, type(module))
            return not (fresh and self.is_pure_module(node.target))
        return False


def _module_alone_is_random(module: nn.Module) -> bool:
    rule = _lookup_mro(RANDOM_MODULES, type(module))
    return rule is not None and bool(rule(module))


def _module_alone_is_pure(module: nn.Module) -> bool:
    if getattr(module, "_is_impure", False) or getattr(module, "inplace", False) is True:
        return False
    if module._forward_hooks or module._forward_pre_hooks or _module_alone_is_random(module):
        return False
    rule = _lookup_mro(MODULE_PURITY, type(module))
    if rule is not None:
        return bool(rule(module))
    return type(module).__module__.startswith("torch.nn.modules.")


def _in_set(table: set[Any], target: Any) -> bool:
    try:
        return target in table
    except TypeError:  # an unhashable callable: in no table
        return False


def _is_read_only_effect(target: Any) -> bool:
    return isinstance(target, _READ_ONLY_EFFECT_TYPES) or _in_set(READ_ONLY_EFFECTS, target)


def _writes_first_argument(node: Node) -> bool:
    if node.op == "call_method" or node.kwargs.get("inplace") is True:
        return True
    target = node.target
    if _in_set(WRITES_FIRST_ARGUMENT, target):
        return True
    return _is_inplace_name(getattr(target, "__name__", ""))


def attribute_key(qualified_name: str) -> tuple[str, str]:
    """The alias-class key standing for the module attribute (or submodule) at a path."""
    return ("attr", qualified_name)


class AliasClasses:
    """Values of a graph that may share storage, and which of those sets the graph writes to.

    Built in one pass (union-find, near-linear): an in-place op joins its result to what it
    writes; a call that may return a view joins its result to its inputs; ``get_attr`` nodes
    join the key of their attribute, and each attribute key the keys of its parent modules
    (a module call that may write to its state writes to everything under it).
    """

    def __init__(self, graph: Any, effects: Effects) -> None:
        self._parent: dict[Any, Any] = {}
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
            path = item[1].split(".")
            for length in range(len(path) - 1, 0, -1):
                self.union(item, attribute_key(".".join(path[:length])))
        self.union(node, item)

    def find(self, item: Any) -> Any:
        """The representative of ``item``'s class (path-halving union-find)."""
        parent = self._parent
        while True:
            up = parent.get(item, item)
            if up is item or up == item:
                return item
            grand = parent.get(up, up)
            parent[item] = grand
            item = grand

    def union(self, a: Any, b: Any) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a is not root_b and root_a != root_b:
            self._parent[root_a] = root_b

    def is_mutated(self, node: Node) -> bool:
        """Whether anything in the graph may write to ``node``'s value (or one sharing storage)."""
        return self.find(node) in self._mutated_roots
