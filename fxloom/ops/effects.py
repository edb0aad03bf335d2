"""What a call does besides computing its value: randomness, module purity, fresh results.

Op-specific knowledge lives in the tables below, keyed by target; extend them for your own
functions and modules::

    RANDOM_FUNCTIONS[my_noise] = None                   # always random
    MODULE_PURITY[MyBlock] = lambda module: True        # calls are pure and deterministic
    FRESH_RESULT_FUNCTIONS[my_op] = None                # never returns a view of an input
    FRESH_RESULT_FUNCTIONS["erf"] = None                # a torch operator: every spelling

A table entry is ``None`` (always) or a predicate of the node (for this call?). The
questions asked of one call or one module:

* ``is_random_call(node)``, ``module_is_random(module)``: does it draw random numbers (so two
  calls differ, and dropping one shifts the random stream)?
* ``module_is_pure(module)``: are its calls deterministic, with no writes to their inputs or
  the module's state (submodules not included)?
* ``returns_fresh_call(node)``, ``module_returns_fresh(module)``: is the result a new value,
  sharing storage with no input?
* ``view_kind(op, target, module)``: is the result a view of the first argument
  (``VIEW_OPS``), or one only when that is contiguous (``VIEW_IF_CONTIGUOUS``)?

Torch operators are keyed by their ``fxloom.ops.identity`` key, so ``torch.add``, ``"add"``,
``operator.add`` and ``aten.add.Tensor`` share one row. Tables whose predicates read arguments
by position (``RANDOM_FUNCTIONS``) keep a row per spelling, as spellings place them apart.

What a call writes is in ``fxloom.ops.mutation``; ``fxloom.passes._effects`` combines both
over a graph (``Effects``, ``AliasClasses``) for ``cse``, ``const_fold`` and ``dce``. What
the tables do not know is assumed the cautious way: unknown functions may return views of
their inputs, unknown modules may write to their inputs and their own state, and only
torch.nn modules are pure. (An entry that claims too much, say a view-returning function
listed as fresh, makes passes wrong.)

Depends on: torch, ``fxloom.ops.identity`` and ``fxloom.ops.mutation``. Nodes are read (``op``, ``target``, ``args``,
``kwargs``, ``meta``), never imported.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from fxloom.ops.identity import OpSet, OpTable
from fxloom.ops.mutation import module_has_side_effect, module_is_inplace, schema_is_view

if TYPE_CHECKING:
    from fxloom.node import Node

__all__ = [
    "RANDOM_FUNCTIONS",
    "RANDOM_METHODS",
    "RANDOM_MODULES",
    "MODULE_PURITY",
    "FRESH_RESULT_FUNCTIONS",
    "FRESH_RESULT_MODULES",
    "VIEW_IF_CONTIGUOUS",
    "VIEW_OPS",
    "is_random_call",
    "module_is_pure",
    "module_is_random",
    "module_returns_fresh",
    "returns_fresh_call",
    "view_kind",
]

NodePredicate = Callable[["Node"], bool]


def _call_argument(node: Node, index: int, name: str, default: Any) -> Any:
    """The argument ``name`` of a call, given by keyword or at position ``index``, or ``default``."""
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[index] if len(node.args) > index else default


def _unless_false(index: int, name: str, default: bool) -> NodePredicate:
    # ``training``-style flags: random unless the flag is literally False.
    return lambda node: _call_argument(node, index, name, default) is not False


def _unless_zero(index: int, name: str) -> NodePredicate:
    # ``dropout_p``-style rates: random unless the rate is literally zero.
    return lambda node: _call_argument(node, index, name, 0.0) not in (0, 0.0)


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

# ------------------------------------------------------------------ purity
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

# ------------------------------------------------------------------ views
# Operator keys (``fxloom.ops.identity``) whose result shares its first argument's storage, and
# those that do only when their input is contiguous (else they copy); ``nn.Identity`` has no key.
_VIEWS = (
    "view", "view_as", "transpose", "permute", "expand", "expand_as", "unsqueeze", "squeeze",
    "t", "narrow", "select", "split", "chunk", "unbind", "movedim", "unflatten", "detach",
    "as_strided", "diagonal", "unfold", "T", "mT", "getitem", nn.Identity,
)  # fmt: skip
# modules=True: nn.Unflatten is a view as Tensor.unflatten is; nn.Flatten one if contiguous.
VIEW_OPS: OpSet = OpSet(_VIEWS, modules=True)
VIEW_IF_CONTIGUOUS: OpSet = OpSet({"reshape", "reshape_as", "contiguous", "flatten"}, modules=True)

# ------------------------------------------------------------------ aliasing
_METADATA_ATTRIBUTES = frozenset(
    ("shape", "dtype", "device", "ndim", "layout", "is_cuda", "requires_grad", "is_leaf")
)


def _produces_tensor(node: Node) -> bool:
    # As analyses record it (``ShapeProp``: ``meta["type"]``; ``meta["val"]``).
    recorded = node.meta.get("type")
    if isinstance(recorded, type):
        return issubclass(recorded, torch.Tensor)
    return isinstance(node.meta.get("val"), torch.Tensor)


# Operator key (``fxloom.ops.identity``: every out-of-place spelling) or other target -> None or
# predicate(node): the result never shares storage with an input.
FRESH_RESULT_FUNCTIONS: OpTable = OpTable(
    {
        **dict.fromkeys(
            ("add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "matmul", "neg")
            + ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "eq", "ne", "lt", "le")
            + ("gt", "ge", "mm", "bmm", "addmm", "baddbmm", "cat", "stack", "where", "softmax")
            + ("log_softmax", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs")
            + ("sum", "mean", "clone", "masked_fill", "cumsum", "arange", "zeros", "ones", "full")
            + ("eye", "zeros_like", "ones_like", "full_like", "conv1d", "conv2d", "conv3d")
            + ("layer_norm", "embedding", "linear", "gelu", "silu", "scaled_dot_product_attention")
            + ("size", "dim", "numel", "new_ones", "new_zeros", "new_full", "new_empty")
            + ("new_tensor", "argmax", "argmin", "all", "any", "norm")
        ),
        builtins.len: None,
        builtins.getattr: lambda node: len(node.args) > 1 and node.args[1] in _METADATA_ATTRIBUTES,
    }
)
# Python's ``+``, ``*``, ``&``, ``|``, ``^`` also concatenate, repeat or merge tuples, lists and
# dicts, and the new container holds the very same tensors: fresh only for a tensor result.
_CONTAINER_OPERATORS = frozenset(
    (operator.add, operator.mul, operator.and_, operator.or_, operator.xor)
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


# ------------------------------------------------------------------ questions
def is_random_call(node: Node) -> bool:
    """Whether a ``call_function``/``call_method`` node draws random numbers (``torch.rand``)."""
    if node.op == "call_method":
        return _table_says(RANDOM_METHODS, node.target, node)
    if node.op != "call_function":
        return False
    target = node.target
    tags = getattr(target, "tags", None)  # torch.ops overloads carry their own tag
    if tags is not None and torch.Tag.nondeterministic_seeded in tags:
        return True
    return _table_says(RANDOM_FUNCTIONS, target, node)


def returns_fresh_call(node: Node) -> bool:
    """Whether a ``call_function``/``call_method`` node's result shares storage with no input.

    In-place spellings (``add_``) return their input: never fresh.
    """
    if node.op not in ("call_function", "call_method"):
        return False
    if not _table_says(FRESH_RESULT_FUNCTIONS, node.target, node):
        return False
    return node.target not in _CONTAINER_OPERATORS or _produces_tensor(node)


def view_kind(op: str, target: Any, module: nn.Module | None = None) -> str | None:
    """``"view"`` if a call's result is a view of its first argument (no new memory),
    ``"if_contiguous"`` if it is one only for a contiguous input (``reshape``), else ``None``.

    Every spelling of an operator answers alike (``VIEW_OPS`` holds operator keys); ATen
    overloads not in the tables answer from their schemas (``schema_is_view``).
    """
    if op == "call_module":
        if module is None:
            return None
        target = type(module)
    elif op not in ("call_function", "call_method"):
        return None
    if target in VIEW_OPS:
        return "view"
    if target in VIEW_IF_CONTIGUOUS:  # aten.reshape's schema says "may alias": it may copy
        return "if_contiguous"
    return "view" if schema_is_view(target) else None


def module_is_random(module: nn.Module) -> bool:
    """Whether calls of ``module`` itself (not its submodules) draw random numbers."""
    rule = _lookup_mro(RANDOM_MODULES, type(module))
    return rule is not None and bool(rule(module))


def module_is_pure(module: nn.Module) -> bool:
    """Whether calls of ``module`` itself (not its submodules) are deterministic and write nothing.

    Never for modules with side effects or ``inplace=True``, forward hooks, or randomness;
    then ``MODULE_PURITY``; else only torch.nn's own modules are pure.
    """
    if module_has_side_effect(module) or module_is_inplace(module):
        return False
    if module._forward_hooks or module._forward_pre_hooks or module_is_random(module):
        return False
    rule = _lookup_mro(MODULE_PURITY, type(module))
    if rule is not None:
        return bool(rule(module))
    return type(module).__module__.startswith("torch.nn.modules.")


def module_returns_fresh(module: nn.Module) -> bool:
    """Whether ``module``'s calls, when pure, return new tensors (``FRESH_RESULT_MODULES``)."""
    return bool(_lookup_mro(FRESH_RESULT_MODULES, type(module)))
