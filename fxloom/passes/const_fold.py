"""Constant folding: compute once what depends on no input, and keep the result as an attribute.

    >>> import torch, fxloom
    >>> from fxloom.passes.const_fold import const_fold
    >>> class Scaled(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.register_buffer("scale", torch.tensor(0.5))
    ...     def forward(self, x):
    ...         return x * (torch.arange(4) * self.scale)
    >>> gm = const_fold(fxloom.symbolic_trace(Scaled()))
    >>> print(gm.code.strip())
    def forward(self, x):
        _folded_mul = self._folded_mul
        mul_1 = x * _folded_mul;  x = _folded_mul = None
        return mul_1
    >>> gm._folded_mul
    tensor([0.0000, 0.5000, 1.0000, 1.5000])

Depends on: the IR, ``fxloom.interpreter`` (to evaluate) and ``fxloom.passes._effects``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fxloom import attr_path
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.interpreter import Interpreter
from fxloom.node import Node
from fxloom.passes._effects import AliasClasses, Effects, check_graph_module, is_literal

__all__ = ["FACTORY_FUNCTIONS", "const_fold"]

# Calls with no node inputs that are folded: they compute the same value on every call.
# Other calls without inputs (``torch.is_grad_enabled()``, ``time.time()``...) may read
# state that changes between calls, so they are left alone. Extend this set as needed.
FACTORY_FUNCTIONS: set[Callable[..., Any]] = {
    torch.arange,
    torch.zeros,
    torch.ones,
    torch.full,
    torch.eye,
    torch.tensor,
    torch.linspace,
    torch.logspace,
    torch.tril_indices,
    torch.triu_indices,
}

_INLINE = object()  # how a literal value is materialized: written into its users' arguments


def const_fold(gm: GraphModule, *, fold_parameters: bool | None = None) -> GraphModule:
    """Replace computations that depend on no input by their value; return ``gm`` (edited in place).

    A node is constant when its value depends only on attributes of ``gm`` and literals:
    a ``get_attr`` of a tensor or a literal, or a pure, non-random call (function, method or
    known-pure module, as for ``cse``) whose inputs are all constant. A call with no node
    input at all is constant only if it is in ``FACTORY_FUNCTIONS`` (``torch.arange(4)``:
    yes; ``torch.is_grad_enabled()``: no), and not with ``requires_grad=True``. Attributes
    that something in the graph may write to, and values computed from them, are never
    constant.

    The constant nodes that feed the rest of the program are evaluated once (under
    ``torch.no_grad``) and replaced:

    * a tensor becomes a new buffer of ``gm`` named after the node (``_folded_<name>``,
      made unique), read by a new ``get_attr`` node; a view using only part of its storage
      is copied, so the rest can be freed;
    * a literal (``int``, ``torch.Size``, tuples of these...) is written into its users'
      arguments (``x.view(self.w.shape)`` becomes ``x.view(torch.Size([...]))``);
    * anything else (a tuple of tensors, ...) stays computed at run time, and so do the
      constants it is computed from.

    The constant nodes used only by replaced ones are erased; constant nodes whose value no
    one uses are left alone (that is dead-code elimination's job). Attributes no longer
    read are kept: run ``fxloom.passes.dce.eliminate_dead_code`` to delete them.

    Tensors that require grad (parameters, usually) are folded through only with
    ``fold_parameters``; by default (``None``) when ``gm`` is in eval mode. Folding freezes
    them: the new buffers do not follow later changes of the parameters (training, loading
    a state dict), and no gradient flows through them.

    ``node.meta`` and names: a new ``get_attr`` node takes a copy of the meta (and the type
    annotation) of the node it replaces, whose value it has (so ``tensor_meta`` and ``val``
    stay right); other nodes keep theirs. Erased nodes' names are not reused.

    Evaluating a constant node that raises leaves ``gm`` unchanged and raises a
    ``RuntimeError`` naming the node.
    """
    check_graph_module(gm, "const_fold")
    if fold_parameters is None:
        fold_parameters = not gm.training
    graph = gm.graph
    constant = _constant_nodes(gm, fold_parameters)
    needed = _needed(graph, constant)
    values = _evaluate(gm, needed)
    replaced, materialized = _plan_replacements(needed, values)
    _apply(gm, replaced, materialized, values)  # the only step that edits gm
    return gm


# ------------------------------------------------------------------ analysis
def _constant_nodes(gm: GraphModule, fold_parameters: bool) -> dict[Node, None]:
    """Nodes whose value depends on no input, in graph order."""
    effects = Effects(gm)
    aliases = AliasClasses(gm.graph, effects)
    constant: dict[Node, None] = {}
    for node in gm.graph.nodes:
        if aliases.is_mutated(node):
            continue
        if node.op == "get_attr":
            foldable = _is_constant_attribute(attr_path.find(gm, node.target), fold_parameters)
        else:
            foldable = _is_constant_call(node, effects) and all(
                used in constant for used in node.all_input_nodes
            )
        if foldable:
            constant[node] = None
    return constant


def _is_constant_call(node: Node, effects: Effects) -> bool:
    op = node.op
    if op not in ("call_function", "call_method", "call_module"):
        return False
    if node.is_impure() or effects.is_random(node):
        return False
    if node.kwargs.get("requires_grad") is True:  # a new leaf for autograd on every call
        return False
    if op == "call_module" and not effects.is_pure_module(node.target):
        return False
    if not node.all_input_nodes:  # reads no value: only known factories are constant
        return op == "call_function" and _is_factory(node.target)
    return True


def _is_factory(target: Any) -> bool:
    try:
        return target in FACTORY_FUNCTIONS
    except TypeError:
        return False


def _is_constant_attribute(value: Any, fold_parameters: bool) -> bool:
    if isinstance(value, torch.Tensor):
        return fold_parameters or not value.requires_grad
    return is_literal(value)


def _needed(graph: Graph, constant: dict[Node, None]) -> list[Node]:
    """The constant nodes whose values reach a non-constant node (or the output), in order.

    Found walking backwards: a node is needed if a user is not constant or is needed.
    """
    needed: dict[Node, None] = {}
    for node in reversed(list(constant)):
        if any(user not in constant or user in needed for user in node.users):
            needed[node] = None
    return list(reversed(needed))


# ------------------------------------------------------------------ evaluation
def _evaluate(gm: GraphModule, needed: list[Node]) -> dict[Node, Any]:
    """The value of each needed constant node, computed once in graph order."""
    interpreter = Interpreter(gm)
    env = interpreter.env
    with torch.no_grad():
        for node in needed:
            try:
                env[node] = interpreter.run_node(node)
            except Exception as err:
                raise RuntimeError(
                    f"const_fold: evaluating the constant node %{node.name} failed "
                    f"({type(err).__name__}: {err}); the module is unchanged. The node:\n"
                    f"    {node.format_node()}\nIt would fail the same way when the module "
                    "runs: fix the model, or pass fold_parameters=False if it reads parameters"
                ) from err
    return env


def _plan_replacements(
    needed: list[Node], values: dict[Node, Any]
) -> tuple[dict[Node, None], dict[Node, Any]]:
    """Which constant nodes go (``replaced``), and how those read by the rest are materialized.

    Walking backwards: a node all of whose users go, goes too. A node read by a node that
    stays is materialized if its value can be (a tensor: as an attribute; a literal: inline);
    otherwise it stays computed, and its own inputs are then read by a node that stays.
    """
    replaced: dict[Node, None] = {}
    materialized: dict[Node, Any] = {}
    for node in reversed(needed):
        if all(user in replaced for user in node.users):
            replaced[node] = None
        elif node.op != "get_attr":  # an attribute read by the rest: already what we want
            how = _materialization(values[node])
            if how is not None:
                materialized[node] = how
                replaced[node] = None
    return replaced, materialized


def _materialization(value: Any) -> Any:
    """``_INLINE`` for a literal, the tensor to store for a tensor, ``None`` if neither."""
    if isinstance(value, torch.Tensor):
        return _compact(value.detach())
    if is_literal(value):
        return _INLINE
    return None


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or a copy if it uses only part of its storage (so the rest can be freed)."""
    try:
        storage_bytes = tensor.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return tensor
    if storage_bytes > tensor.numel() * tensor.element_size():
        return tensor.clone()
    return tensor


# ------------------------------------------------------------------ rewriting
def _apply(
    gm: GraphModule,
    replaced: dict[Node, None],
    materialized: dict[Node, Any],
    values: dict[Node, Any],
) -> None:
    graph = gm.graph
    taken: set[str] = set()
    for node in reversed(list(materialized)):  # back in graph order
        how = materialized[node]
        if how is _INLINE:
            node.replace_all_uses_with(values[node])  # type: ignore[arg-type]
            continue
        name = attr_path.free_name(gm, f"_folded_{node.name}", taken=taken)
        taken.add(name)
        gm.register_buffer(name, how)
        with graph.inserting_before(node):
            reader = graph.get_attr(name, type_expr=node.type)
        reader.meta = dict(node.meta)
        node.replace_all_uses_with(reader)
    for node in replaced:  # last first: users go before what they use
        graph.erase_node(node)
