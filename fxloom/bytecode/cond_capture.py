"""``fxloom.cond`` under ``fxloom.compile``: each branch interpreted into a graph of its own, one node.

A call of ``fxloom.cond(pred, true_fn, false_fn, operands)`` or ``fxloom.cond_op`` (the
callee table's ``higher_order`` rows) is captured the way symbolic tracing and export capture
it (``fxloom.cond``):

- a Python bool ``pred`` (``x.shape[0] > 2``, guarded like any value): the chosen branch is
  interpreted inline, and no node is recorded;
- a tensor ``pred`` (``x.sum() > 0``): each branch is interpreted into a ``BranchBuilder``,
  a graph whose inputs are the operands' tensors, then every outer tensor the branch reads
  (a parameter, an input, a tensor computed before the cond, closed over), lifted in the same
  order for both branches; both must return the same structure, shapes and dtypes
  (``fxloom.cond.branch_mismatch``), and the graph records::

    %true_graph_0 = get_attr[target=true_graph_0]
    %false_graph_0 = get_attr[target=false_graph_0]
    %cond = call_function[target=fxloom.cond.cond_op](args = (%gt, %true_graph_0, %false_graph_0, (%x, %w)))
    %getitem = call_function[target=operator.getitem](args = (%cond, 0))

  The node picks the branch when the graph runs, so one entry serves both outcomes.

What a branch reads from outside goes through the compilation's one ``Recording``, so its
guards are the entry's, for both branches. A branch must be a function of what it reads:
while one is interpreted, only the objects it made are its own (``Recording.created``), and
whatever would change state outside it -- output such as ``print``, an attribute, global,
cell or container it did not make, grad mode left switched, an in-place write to a tensor --
is refused. Anything the branch cannot capture becomes a ``cond-branch`` graph break naming
the branch function, its line and the cause; the driver then runs the whole cond as Python,
as eager does, so the result is still right.

Depends on ``fxloom.bytecode.calls`` (to interpret a branch), ``graph_builder``,
``recording``, ``breaks``, ``fxloom.cond`` (the operator and the checks every capture
shares) and the values layer.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fxloom import pytree
from fxloom.bytecode import calls
from fxloom.bytecode.breaks import Break
from fxloom.bytecode.graph_builder import GraphBuilder
from fxloom.bytecode.sources import Source
from fxloom.cond import (
    branch_mismatch,
    check_arguments,
    cond,
    cond_op,
    free_branch_names,
    order_placeholders,
    output_leaves,
)
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.values.signature import code_bind
from fxloom.values.stand_in import StandIn

__all__ = ["BranchBuilder", "CAPTURES", "capture"]


class BranchBuilder(GraphBuilder):
    """The graph of one branch: its own operations; every tensor of an enclosing graph it
    uses is lifted to an input (``lifted``, in order of first use). Graph inputs and constants
    belong to the compiled entry, so reading one goes to the enclosing graph first."""

    takes_numbers = False  # a number the branch reads is guarded by value (not lifted)

    def __init__(self, outer: GraphBuilder, operands: list[StandIn]) -> None:
        super().__init__()
        self.outer = outer
        self.metadata = outer.metadata  # one metadata mode and module stack per compilation
        self.module_stack = outer.module_stack
        self.lifted: list[StandIn] = []
        for operand in operands:  # the operands first, in their order
            self.constant(operand)

    def node_of(self, value: Any) -> Node | None:
        node = self._node_of.get(id(value))
        if node is None and self.outer.node_of(value) is not None:
            node = self._node_of[id(self._lift(value))]
        return node

    def real_type(self, stand_in: StandIn) -> type:
        own = self.real_types.get(id(stand_in))
        return own if own is not None else self.outer.real_type(stand_in)

    def input(
        self, source: Source, tensor: torch.Tensor, held: bool = False, sizes: list | None = None
    ) -> StandIn:
        return self.outer.input(source, tensor, held, sizes)  # lifted where the branch uses it

    def constant(self, tensor: torch.Tensor) -> StandIn:
        """A tensor of an enclosing graph, or a real tensor (held by the outermost graph),
        as an input of this branch."""
        if id(tensor) in self._node_of:
            return tensor
        outer = self.outer
        return self._lift(tensor if outer.node_of(tensor) is not None else outer.constant(tensor))

    def _lift(self, stand_in: StandIn) -> StandIn:
        outer_node = self.outer.node_of(stand_in)
        self._register(stand_in, self.graph.placeholder(outer_node.name))
        self.lifted.append(stand_in)
        return stand_in

    def finish_branch(self, lifted: list[StandIn], outputs: list[Any], name: str) -> GraphModule:
        """The branch as a ``GraphModule`` taking ``lifted`` (both branches' inputs: the ones
        this branch does not use too), in that order."""
        for value in lifted:
            if id(value) not in self._node_of:
                self._lift(value)
        module = self.finish(outputs, name)
        order_placeholders(module.graph, [self._node_of[id(value)] for value in lifted])
        module.recompile()
        return module


@dataclass
class _Branch:
    builder: BranchBuilder
    leaves: list[StandIn]
    spec: Any


# ------------------------------------------------------------------ the operators
def capture(interp: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
    """The result of ``fn(*args, **kwargs)`` for a ``higher_order`` callee in the program
    being compiled (``fxloom.bytecode.calls``)."""
    captured = CAPTURES.get(fn)
    if captured is None:
        raise Break("unsupported-call", f"{fn!r} takes functions, and fxloom.compile has no "
                                        "capture of it")  # fmt: skip
    return captured(interp, args, kwargs)


def _cond(interp: Any, args: tuple, kwargs: dict) -> Any:
    """``fxloom.cond``: the chosen branch's output, in its structure (rebuilt, as eager)."""
    leaves, spec = _captured_cond(interp, args, kwargs)
    return _own(interp.recording, pytree.tree_unflatten(leaves, spec))


def _cond_op(interp: Any, args: tuple, kwargs: dict) -> tuple:
    """``fxloom.cond_op``: the chosen branch's output leaves, as a tuple."""
    return tuple(_captured_cond(interp, args, kwargs)[0])


def _captured_cond(interp: Any, args: tuple, kwargs: dict) -> tuple[list[Any], Any]:
    bound = code_bind(cond, args, kwargs)  # a TypeError as eager's
    pred, true_fn, false_fn, operands = (bound[name] for name in _PARAMETERS)
    check_arguments(pred, true_fn, false_fn, operands)  # eager's errors, raised where eager would
    if isinstance(pred, torch.SymBool):  # a test of symbolic sizes: decided now, under a guard
        pred = bool(pred)
    if isinstance(pred, bool):  # known now (guarded): nothing to choose when the graph runs
        chosen = true_fn if pred else false_fn
        return pytree.tree_flatten(calls.call(interp, chosen, tuple(operands), {}))
    if isinstance(pred, torch.Tensor):
        pred = interp.recording.graph.adopt(pred)  # a tensor made natively: a graph constant
    else:
        raise Break(
            "cond-branch",
            f"cond's pred is a {type(pred).__name__} ({pred}), which fxloom.compile does not "
            "record as a predicate yet; use a tensor predicate (x.new_tensor(...))",
        )
    return _both_branches(interp, pred, true_fn, false_fn, operands)


_PARAMETERS = ("pred", "true_fn", "false_fn", "operands")


def _torch_cond(interp: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.cond`` compiles its branches with ``torch.compile``, which cannot run on
    stand-ins: a break, so that it runs as Python (eager's ``torch.cond``)."""
    raise Break(
        "unsupported-call",
        "torch.cond compiles its branches with torch.compile; write fxloom.cond(pred, "
        "true_fn, false_fn, operands) to keep both branches in fxloom.compile's graph",
    )


def _own(recording: Any, value: Any) -> Any:
    """``value``, a structure rebuilt for the program, marked as the program's own."""
    if type(value) in (list, dict):
        recording.built(value)
    if type(value) in (list, tuple):
        for item in value:
            _own(recording, item)
    elif type(value) is dict:
        for item in value.values():
            _own(recording, item)
    return value


# ------------------------------------------------------------------ both branches
def _both_branches(
    interp: Any, pred: StandIn, true_fn: Any, false_fn: Any, operands: Any
) -> tuple[list[StandIn], Any]:
    """Record the cond into the graph being recorded: its output leaves and structure."""
    outer = interp.recording.graph
    tensors = [
        outer.adopt(leaf) for leaf in pytree.tree_leaves(operands) if isinstance(leaf, torch.Tensor)
    ]
    branches = [
        _interpret(interp, role, fn, operands, tensors)
        for role, fn in (("true_fn", true_fn), ("false_fn", false_fn))
    ]
    problem = branch_mismatch(*((branch.leaves, branch.spec) for branch in branches))
    if problem is not None:
        raise Break("cond-branch", f"{problem} ({_named(true_fn)}, {_named(false_fn)})")
    lifted = list({id(v): v for branch in branches for v in branch.builder.lifted}.values())
    names = free_branch_names(outer.graph, lambda name: name in outer.constants)
    getters = [
        outer.hold(name, branch.builder.finish_branch(lifted, branch.leaves, name))
        for branch, name in zip(branches, names)
    ]
    results = tuple(map(_result, branches[0].leaves, branches[1].leaves))
    meta = {"raises_on_data": True} if any(map(_raises_on_data, branches)) else {}
    outer.record_known(cond_op, (pred, *getters, tuple(lifted)), results, "cond", **meta)
    return list(results), branches[0].spec


def _result(true_leaf: StandIn, false_leaf: StandIn) -> StandIn:
    """The stand-in of one output of the cond node: the true branch's, unless only the false
    branch's needs grad (what the program may ask of it afterwards should not be too little)."""
    if false_leaf.requires_grad and not true_leaf.requires_grad:
        return StandIn.like(false_leaf)
    return StandIn.like(true_leaf)


def _raises_on_data(branch: _Branch) -> bool:
    """Whether the branch keeps an operation that raises on its inputs' data: the cond node is
    kept too, unused (eager raises there)."""
    return any(node.meta.get("raises_on_data") for node in branch.builder.graph.nodes)


def _interpret(interp: Any, role: str, fn: Any, operands: Any, tensors: list) -> _Branch:
    """Interpret branch ``fn`` on the operands into a graph of its own."""
    recording = interp.recording
    builder = BranchBuilder(recording.graph, tensors)
    grad = torch.is_grad_enabled()
    try:
        with _inside(recording, builder):
            result = calls.call(interp, fn, tuple(operands), {})
            leaves, spec = output_leaves(result, role)
            leaves = [builder.adopt(leaf) for leaf in leaves]
            for leaf in leaves:
                builder.argument(leaf)  # a tensor from outside returned as it is: lifted
            if torch.is_grad_enabled() != grad:
                raise Break("cond-branch", "it leaves grad mode switched")
    except Break as stop:
        detail = stop.detail if stop.kind == "cond-branch" else f"{stop.row.title}: {stop.detail}"
        raise _refused(role, fn, detail, stop.where) from None
    except TypeError as error:  # a branch returning other than tensors (output_leaves)
        raise _refused(role, fn, str(error)) from None
    finally:
        torch.set_grad_enabled(grad)
    _refuse_writes(builder, role, fn)
    return _Branch(builder, leaves, spec)


def _refused(role: str, fn: Any, detail: str, where: Any = None) -> Break:
    return Break("cond-branch", f"cond's {role} {_named(fn)} cannot be captured: {detail}", where)


def _named(fn: Any) -> str:
    """A branch as the user wrote it: ``f.<locals>.<lambda> (model.py:12)``."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if isinstance(code, types.CodeType):
        name = getattr(fn, "__qualname__", code.co_name)
        return f"{name} ({code.co_filename.rpartition('/')[2]}:{code.co_firstlineno})"
    if isinstance(fn, torch.nn.Module):
        return f"the {type(fn).__qualname__} module"
    return repr(fn)


def _refuse_writes(builder: BranchBuilder, role: str, fn: Any) -> None:
    """A branch is functional (the cond node is): an in-place write, to an operand, to a tensor
    it closes over or to a view of one (which the graph cannot tell apart), is refused."""
    for node in builder.graph.nodes:
        if node.op in ("placeholder", "output") or node.target in _SWITCHES:
            continue
        if node.is_impure():
            raise _refused(
                role,
                fn,
                f"{_operation(node)} writes in place; a cond is functional: compute a new "
                "tensor (x + 1, not x.add_(1)) and return it",
                node.meta.get("source_location"),
            )


# Calls recorded for their effect that a branch may make: grad mode switched and switched back
# (``with torch.no_grad():`` inside a branch; left switched is refused).
_SWITCHES = frozenset((torch._C._set_grad_enabled,))


def _operation(node: Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", repr(target))


# ------------------------------------------------------------------ a branch's own world
# What ``Recording`` does to state outside the compiled function (kept aside, replayed after
# the graph): inside a branch, each is refused. The cond node must compute the same thing
# whichever branch the graph takes, and both are interpreted here.
_CHANGING = {
    "write_attribute": "assigns an attribute of an object it did not make",
    "store_global": "assigns a global variable",
    "store_cell": "assigns a nonlocal variable",
    "mutate_outside": "changes a container or object it did not make",
    "write_target": "changes a container it did not make",
}


class _RefusedOutput(list):
    """``Recording.deferred`` inside a branch: output (print, logging, warnings) is refused."""

    def append(self, entry: tuple) -> None:
        fn = entry[0]
        raise Break("cond-branch", f"it calls {getattr(fn, '__qualname__', fn)} (output)")


def _refuse_change(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise Break("cond-branch", f"it {what}; a branch may change only what it makes")

    return refuse


@contextlib.contextmanager
def _inside(recording: Any, builder: BranchBuilder) -> Iterator[None]:
    """While a branch is interpreted: operations go to ``builder``, only what the branch
    makes is its own, and changes to anything else are refused."""
    own = vars(recording)
    saved = {name: own.get(name, _ABSENT) for name in (*_CHANGING, "graph", "created", "deferred")}
    recording.graph = builder
    recording.created = set()
    recording.deferred = _RefusedOutput()
    for name, what in _CHANGING.items():
        setattr(recording, name, _refuse_change(what))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _ABSENT:
                delattr(recording, name)  # the class's method again
            else:
                setattr(recording, name, value)


_ABSENT = object()

# The operators taking functions that fxloom.compile captures, and how (``callees``'
# ``higher_order`` rows name the same callables).
CAPTURES: dict[Any, Callable[[Any, tuple, dict], Any]] = {
    cond: _cond,
    cond_op: _cond_op,
    **({torch.cond: _torch_cond} if hasattr(torch, "cond") else {}),
}
