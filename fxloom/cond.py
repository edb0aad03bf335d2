"""``fxloom.cond``: structured control flow that a graph can hold — both branches, one node.

``cond(pred, true_fn, false_fn, operands)`` computes ``true_fn(*operands)``
if ``pred`` holds, else ``false_fn(*operands)``. Run eagerly it runs the
chosen branch. Captured — by ``fxloom.symbolic_trace``,
``fxloom.export.export`` or ``fxloom.compile`` — it records both branches as sub-``GraphModule``s
of the root (``true_graph_0``, ``false_graph_0``, then ``_1``, ...) and one
node calling ``cond_op``, the operator that picks a branch at run time::

    %true_graph_0 = get_attr[target=true_graph_0]
    %false_graph_0 = get_attr[target=false_graph_0]
    %cond = call_function[target=fxloom.cond.cond_op](args = (%gt, %true_graph_0, %false_graph_0, (%x, %weight)))
    %getitem = call_function[target=operator.getitem](args = (%cond, 0))

A branch takes the operands' tensors, then every outer value it reads (a
parameter, a tensor computed before the cond), lifted to an extra input in
the same order for both branches, and returns a flat tuple of tensors;
``getitem`` nodes read them and the caller gets them back in the branches'
structure. Both branches must return the same structure, shapes and dtypes.

``pred`` is a Python bool (the branch is simply run: no node), a tensor of
one element (``x.sum() > 0``), or a symbolic shape test (``x.shape[0] > 4``).

    >>> import torch, fxloom
    >>> def f(x):
    ...     return fxloom.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))
    >>> gm = fxloom.symbolic_trace(f)
    >>> [n.op for n in gm.graph.nodes if n.target is fxloom.cond_op or n.op == "get_attr"]
    ['get_attr', 'get_attr', 'call_function']
    >>> x = torch.randn(3)
    >>> torch.equal(gm(x), f(x)) and torch.equal(gm(-x.abs()), (-x.abs()).cos())
    True

This module holds the operator, its eager semantics and the checks every
capture shares; it imports no frontend. ``cond_op`` is a higher-order operator
(``fxloom.ops.higher_order``) declared with ``CAPTURES``, the table of how each
frontend records a cond, by the module and function names: symbolic tracing in
``fxloom.tracing.cond_trace``, export in ``fxloom.export.cond_capture`` (a row
counts once its module is loaded; nothing registers on import). ``fxloom.compile``'s interpreter decides a call
before it runs it, so it captures ``cond`` by its row in the callee table
(``fxloom.bytecode.cond_capture``), not through the operator. Depends on the IR and
``fxloom.pytree``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fxloom import pytree
from fxloom.graph import Graph
from fxloom.node import Node
from fxloom.ops.higher_order import HigherOrderOperator, Implementation

__all__ = ["cond", "cond_op", "CondOperator"]


# How each frontend records a cond call, asked in order of precedence (lowest first): an export
# capture in progress claims every cond under it, else the tracer of a proxy among the arguments.
CAPTURES = (
    Implementation(
        "symbolic trace",
        module="fxloom.tracing.cond_trace",
        claims="tracer_of",
        run="trace_cond",
        precedence=1,
        value_types=("Proxy",),
    ),
    Implementation(
        "export",
        module="fxloom.export.cond_capture",
        claims="capture_of",
        run="capture_cond",
        precedence=0,
    ),
)


class CondOperator(HigherOrderOperator):
    """The operator a cond node calls: ``cond_op(pred, true_gm, false_gm, operands)``.

    Runs ``true_gm(*operands)`` if ``pred`` holds, else ``false_gm(*operands)``,
    and returns the branch's flat tuple of tensors. On stand-ins under an
    export capture, or on proxies under a trace, it records itself again (its
    branches re-captured by the frontend's row of ``CAPTURES``), so a
    graph holding it can be re-exported, re-decomposed or re-traced.
    """

    _opname = "cond"  # the name of the nodes calling it

    def __init__(self) -> None:
        super().__init__(CAPTURES)
        # How printing and code generation name it: ``fxloom.cond.cond_op``.
        self.__name__ = self.__qualname__ = "cond_op"
        self.__module__ = __name__

    def __call__(
        self, pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any], operands: Any
    ) -> tuple[Any, ...]:
        leaves, _ = _cond(pred, true_fn, false_fn, operands)
        return tuple(leaves)

    def __repr__(self) -> str:
        return "fxloom.cond.cond_op"

    def __reduce__(self) -> str:
        return "cond_op"  # pickled by reference: the one instance of this module


cond_op = CondOperator()


def cond(
    pred: bool | torch.Tensor | torch.SymBool,
    true_fn: Callable[..., Any],
    false_fn: Callable[..., Any],
    operands: tuple[Any, ...] | list[Any],
) -> Any:
    """``true_fn(*operands)`` if ``pred`` holds, else ``false_fn(*operands)``; both
    branches recorded when traced or exported (see the module docstring).

        >>> import torch, fxloom
        >>> x = torch.ones(2)
        >>> fxloom.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))
        tensor([2., 2.])
    """
    leaves, spec = _cond(pred, true_fn, false_fn, operands)
    return pytree.tree_unflatten(leaves, spec)


def _cond(pred: Any, true_fn: Any, false_fn: Any, operands: Any) -> tuple[list[Any], Any]:
    """The chosen branch's output leaves and structure, recording both branches if captured."""
    check_arguments(pred, true_fn, false_fn, operands)
    if isinstance(pred, bool):  # known now: nothing to choose at run time
        return pytree.tree_flatten((true_fn if pred else false_fn)(*operands))
    captured = cond_op.captured_by(pred, operands)
    if captured is not None:
        record, capture = captured
        return record(capture, pred, true_fn, false_fn, operands)
    if _is_description(pred):
        return _described(true_fn, false_fn, operands)
    return pytree.tree_flatten((true_fn if bool(pred) else false_fn)(*operands))


def _is_description(pred: Any) -> bool:
    """Whether ``pred`` is a tensor without data (a stand-in or a meta tensor)."""
    from fxloom.values.stand_in import StandIn

    return isinstance(pred, StandIn) or (isinstance(pred, torch.Tensor) and pred.is_meta)


def _described(true_fn: Any, false_fn: Any, operands: Any) -> tuple[list[Any], Any]:
    """The output's description where the branch is not known (ShapeProp in meta mode): both
    branches run, must agree, and the true branch's output stands for both."""
    true_out = output_leaves(true_fn(*operands), "true_fn")
    problem = branch_mismatch(true_out, output_leaves(false_fn(*operands), "false_fn"))
    if problem is not None:
        raise ValueError(problem)
    return true_out


# ------------------------------------------------------------------ checks
def check_arguments(pred: Any, true_fn: Any, false_fn: Any, operands: Any) -> None:
    """Refuse a ``pred``, branch or ``operands`` of the wrong kind, saying what is expected."""
    captured = cond_op.value_types()
    if isinstance(pred, torch.Tensor):
        if pred.numel() != 1:
            raise ValueError(
                f"cond's pred must have exactly one element, got a tensor of shape "
                f"{tuple(pred.shape)}; reduce it first (x.sum() > 0, x.any(), x.all())"
            )
    elif not isinstance(pred, (bool, torch.SymBool, *captured)):
        raise TypeError(
            f"cond's pred must be a bool, a one-element tensor (x.sum() > 0) or a shape test "
            f"(x.shape[0] > 4), got {type(pred).__name__} {pred!r}"
        )
    for role, fn in (("true_fn", true_fn), ("false_fn", false_fn)):
        if not callable(fn):
            raise TypeError(f"cond's {role} must be callable, got {type(fn).__name__} {fn!r}")
    if not isinstance(operands, (tuple, list)):
        raise TypeError(
            f"cond's operands must be a tuple or list of the branches' inputs, got "
            f"{type(operands).__name__} (write (x,) for one input)"
        )
    for index, leaf in enumerate(pytree.tree_leaves(operands)):
        if not isinstance(leaf, (*_OPERAND_TYPES, *captured)):
            raise TypeError(
                f"cond's operands must be tensors or sizes (ints), got {type(leaf).__name__} "
                f"{leaf!r} at position {index}; close over other values in the branch functions"
            )


# Tensors, and sizes (an export lifts a size read before the cond as an operand); a frontend's
# own values (the tracer's Proxy) come with its implementation.
_OPERAND_TYPES = (torch.Tensor, int, float, torch.SymInt, torch.SymFloat)


def branch_mismatch(true_out: tuple[list, Any], false_out: tuple[list, Any]) -> str | None:
    """Why the branches' outputs ``(leaves, spec)`` cannot be one node's results, or None."""
    (true_leaves, true_spec), (false_leaves, false_spec) = true_out, false_out
    if true_spec != false_spec:
        return (
            "cond's branches must return the same structure: true_fn returns "
            f"{_describe(true_spec)}, false_fn returns {_describe(false_spec)}"
        )
    for path, a, b in zip(leaf_paths(true_spec), true_leaves, false_leaves):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            continue  # a trace's proxies know no shapes; others are refused where read
        if a.dtype != b.dtype:
            return f"cond's output {path} has dtype {a.dtype} in true_fn but {b.dtype} in false_fn"
        if not same_shape(a.shape, b.shape):
            return (
                f"cond's output {path} has shape {tuple(a.shape)} in true_fn but "
                f"{tuple(b.shape)} in false_fn"
            )
    return None


def same_shape(a: Any, b: Any) -> bool:
    """Whether two sizes are equal for every input: ints compare with ``==``, symbolic sizes
    must be equal statically (an equality that holds for the examples only is no proof)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, int) and isinstance(y, int):
            if x != y:
                return False
            continue
        equal = x == y
        node = getattr(equal, "node", None)
        known = getattr(node, "statically_known_true", None)
        if not (known() if known is not None else bool(equal)):
            return False
    return True


def leaf_paths(spec: Any, where: str = "") -> list[str]:
    """``[0]``, ``['logits']``, ``[1][0]``: how to reach each leaf of a branch's output."""
    if spec.is_leaf():
        return [where or "[0]"]
    keys = spec.context if isinstance(spec.context, (list, tuple)) else None
    paths = []
    for index, child in enumerate(spec.children):
        step = repr(keys[index]) if keys is not None and len(keys) == len(spec.children) else index
        paths.extend(leaf_paths(child, f"{where}[{step}]"))
    return paths


def _describe(spec: Any) -> str:
    return "one tensor" if spec.is_leaf() else repr(spec)


def output_leaves(result: Any, role: str) -> tuple[list[Any], Any]:
    """A branch's output flattened; every leaf must be a tensor."""
    leaves, spec = pytree.tree_flatten(result)
    for path, leaf in zip(leaf_paths(spec), leaves):
        if not isinstance(leaf, (torch.Tensor, *cond_op.value_types())):
            raise TypeError(
                f"cond's {role} returns {type(leaf).__name__} {leaf!r} at output {path}; "
                "branches return tensors (or tuples, lists, dicts of them)"
            )
    return leaves, spec


# ------------------------------------------------------- shared by the captures
def order_placeholders(graph: Graph, ordered: list[Node]) -> None:
    """Move ``ordered`` (placeholders of ``graph``) to the front, in that order."""
    chosen = set(ordered)
    anchor = next(n for n in graph.nodes if n not in chosen)  # the output at the latest
    for node in ordered:
        anchor.prepend(node)


def free_branch_names(graph: Graph, taken: Callable[[str], bool] = lambda name: False) -> tuple:
    """``("true_graph_N", "false_graph_N")`` with the first N free in ``graph.constants``."""
    index = 0
    while any(
        name in graph.constants or taken(name)
        for name in (f"true_graph_{index}", f"false_graph_{index}")
    ):
        index += 1
    return f"true_graph_{index}", f"false_graph_{index}"
