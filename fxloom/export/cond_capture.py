"""Export capture of ``fxloom.cond``: each branch recorded by a child capture, one node in the parent.

While ``export`` runs, a ``cond`` whose predicate is not known (a tensor, a
symbolic shape test) records both branches. Each runs under a
``BranchCapture`` whose inputs are the operands; a value of an enclosing
capture the branch uses — a parameter, a buffer, a tensor computed earlier
and closed over, a constant — is lifted: it becomes an input of the branch
and an operand of the cond node, in the same order for both branches (a
branch not using it takes it unused). A branch may not write to a tensor it
did not create: the cond node is functional, like every exported node.

The branch graphs become ``GraphModule``s held in the parent graph's
``constants`` (``true_graph_0``, ``false_graph_0``) and read by ``get_attr``;
the node ``cond_op(pred, true_graph_0, false_graph_0, (operands..., lifted...))``
returns a tuple read by ``getitem`` nodes, whose stand-ins are the true
branch's. A cond inside a branch nests: its subgraphs belong to the branch.

Registered on ``fxloom.cond_op`` when imported (by ``exporter`` and ``decompose``,
where captures start): a cond called while a capture records is captured here.

Depends on ``capture``, ``stand_in``, ``fxloom.cond`` and the IR.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from fxloom import pytree
from fxloom._torch_compat import current_dispatch_mode, dispatch_mode_set_aside
from fxloom.cond import branch_mismatch, cond_op, free_branch_names, order_placeholders
from fxloom.cond import output_leaves as branch_output_leaves
from fxloom.export.capture import Capture
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.values.stand_in import StandIn, wrap
from fxloom.values.symbolic import wrap_expr

__all__ = ["BranchCapture", "active_capture", "capture_cond", "capture_of"]


# A branch's capture records its own graph and values; the rest of a capture (provenance,
# decompositions, constants' names, and what later work adds, like a shape environment) is
# the parent's, shared.
_OWN = frozenset({"graph", "values", "constants", "reserved_names", "_meta"})


def active_capture() -> Capture | None:
    """The capture recording now (``StandIn.active`` is its ``dispatch``), or None."""
    receiver = getattr(StandIn.active, "__self__", None)
    return receiver if isinstance(receiver, Capture) else None


@dataclass
class BranchCapture(Capture):
    """The capture of one branch: outer values are lifted to inputs, writes to them refused."""

    parent: Capture | None = None
    role: str = "true_fn"
    # Parent stand-ins and symbolic sizes (SymInt), in order of first use.
    lifted: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sizes.lift_symbol = self.lift_symbol  # a size the branch has no input for

    def _input(self, value: Any) -> Any:
        if isinstance(value, StandIn) and id(value) in self.values:
            return value
        outer = self.parent._input(value)  # a real tensor becomes the parent's constant
        if id(outer) in self.values:
            return outer
        return self.lift(outer)

    def lift(self, outer: StandIn) -> StandIn:
        """Make the parent's ``outer`` an input of this branch (the same stand-in object)."""
        node = self.graph.placeholder(self.parent.read(outer).name)
        node.meta["val"] = outer
        self._track(outer, node)
        _bind_sizes(self, node, outer)
        self.lifted.append(outer)
        return outer

    def lift_symbol(self, symbol: Any) -> Node:
        """Make a size of the parent (``n = x.nonzero().shape[0]`` read before the cond) an
        input of this branch: the cond node passes its value."""
        outer = wrap_expr(self.shape_env, symbol)
        node = self.graph.placeholder(self.parent.sizes.node(symbol).name)
        node.meta["val"] = outer
        self.sizes.bind_scalar(symbol, node)
        self.lifted.append(outer)
        return node

    def lift_value(self, outer: Any) -> None:
        """Lift a stand-in or a symbolic size another branch lifted."""
        if isinstance(outer, StandIn):
            self.lift(outer)
        else:
            self.lift_symbol(outer.node.expr)

    def write(self, target: StandIn, new: StandIn) -> None:
        initial = self.values[id(target)].storage.initial
        if initial.op == "placeholder":
            raise self.error(
                f"cond's {self.role} writes in place to %{initial.name}, which it did not "
                "create (an operand, a parameter or buffer, or a tensor from outside the "
                "branch); a cond is functional: compute a new tensor (x + 1, not x.add_(1)) "
                "and return it"
            )
        super().write(target, new)


def capture_cond(
    parent: Capture, pred: Any, true_fn: Any, false_fn: Any, operands: Any
) -> tuple[list[StandIn], pytree.TreeSpec]:
    """Record ``cond(pred, true_fn, false_fn, operands)`` into ``parent``: the output leaves
    (tracked stand-ins of the parent) and their structure."""
    parent._meta = parent.provenance.stamp()  # the cond's line: its nodes' and errors' source
    pred_node = _predicate(parent, pred)
    if isinstance(pred_node, bool):
        return pytree.tree_flatten((true_fn if pred_node else false_fn)(*operands))
    leaves, spec = pytree.tree_flatten(operands)
    leaves = [parent._input(leaf) for leaf in leaves]
    branches = [
        _capture_branch(parent, role, fn, leaves, spec)
        for role, fn in (("true_fn", true_fn), ("false_fn", false_fn))
    ]
    problem = branch_mismatch(*(outputs for _, outputs in branches))
    if problem is not None:
        raise parent.error(problem)
    lifted = list({_key(v): v for branch, _ in branches for v in branch.lifted}.values())
    names = free_branch_names(parent.graph)
    for (branch, _), name in zip(branches, names):
        _finish_branch(branch, len(leaves), lifted)
        parent.graph.constants[name] = GraphModule(torch.nn.Module(), branch.graph, name)
    return _record_node(parent, pred_node, names, leaves + lifted, branches[0][1])


def _predicate(parent: Capture, pred: Any) -> Node | bool:
    """The node computing ``pred`` in ``parent``, or its value where it is known statically."""
    if isinstance(pred, torch.SymBool):
        known = pred.node.maybe_as_bool()
        return known if known is not None else symbolic_predicate(parent, pred)
    return parent.read(parent._input(pred))


def symbolic_predicate(parent: Capture, pred: torch.SymBool) -> Node | bool:
    """The node computing a symbolic shape test (``x.shape[0] > 4`` under dynamic shapes).

    Symbolic sizes (issue 12) give a capture ``sizes`` (``SizeNodes``), whose
    ``value(sym)`` is the node computing a SymInt/SymBool from the inputs' sizes.
    """
    sizes = getattr(parent, "sizes", None)
    if sizes is None:
        raise parent.error(
            f"cond on the symbolic shape test {pred} needs the capture to record symbolic "
            "sizes, which it does not yet; use a tensor predicate (x.new_tensor(...)) for now"
        )
    return sizes.value(pred)


def _bind_sizes(capture: Capture, node: Node, stand_in: StandIn) -> None:
    """Symbols in ``stand_in``'s sizes are read from ``node`` in ``capture``'s graph (under
    symbolic sizes: a branch reads them from its own inputs, not from the parent's)."""
    sizes = getattr(capture, "sizes", None)
    if sizes is not None:
        sizes.bind_sizes(node, stand_in.shape)


def _capture_branch(
    parent: Capture, role: str, fn: Callable[..., Any], operands: list[StandIn], spec: Any
) -> tuple[BranchCapture, tuple[list[StandIn], Any]]:
    """Run ``fn`` on the operands under a child capture; the capture and the output leaves."""
    shared = {f.name: getattr(parent, f.name) for f in fields(Capture) if f.name not in _OWN}
    branch = BranchCapture(**shared, parent=parent, role=role)
    for operand in operands:
        node = branch.graph.placeholder(parent.read(operand).name)
        node.meta["val"] = operand
        branch._track(operand, node)
        _bind_sizes(branch, node, operand)
    with _recording_into(parent, branch):
        result = fn(*pytree.tree_unflatten(operands, spec))
        leaves, out_spec = branch_output_leaves(result, role)
        leaves = [branch._input(leaf) for leaf in leaves]  # a constant returned: lifted
        nodes = tuple(branch.read(leaf) for leaf in leaves)
    branch.graph.output(nodes)
    branch.graph.eliminate_dead_code()
    return branch, (leaves, out_spec)


@contextlib.contextmanager
def _recording_into(parent: Capture, branch: BranchCapture) -> Iterator[None]:
    """Operators go to ``branch`` instead of ``parent``, both ways they arrive."""
    top = current_dispatch_mode()
    standing_aside = (
        dispatch_mode_set_aside()
        if getattr(top, "capture", None) is parent
        else contextlib.nullcontext()
    )
    previous = StandIn.active
    with standing_aside, branch.mode():
        StandIn.active = branch.dispatch
        try:
            yield
        finally:
            StandIn.active = previous


def _finish_branch(branch: BranchCapture, operand_count: int, lifted: list[StandIn]) -> None:
    """Inputs in the cond node's order: operands, then every lifted value (unused ones too)."""
    own = {_key(value) for value in branch.lifted}
    for outer in lifted:
        if _key(outer) not in own:
            branch.lift_value(outer)
    placeholders = branch.graph.find_nodes(op="placeholder")
    by_value = {_key(node.meta["val"]): node for node in placeholders[operand_count:]}
    ordered = list(placeholders[:operand_count]) + [by_value[_key(v)] for v in lifted]
    order_placeholders(branch.graph, ordered)


def _key(value: Any) -> Any:
    """What identifies a lifted value: the stand-in itself, or a size's symbol."""
    return id(value) if isinstance(value, StandIn) else value.node._expr


def _record_node(
    parent: Capture,
    pred: Node,
    names: tuple[str, str],
    operands: list[StandIn],
    outputs: tuple[list[StandIn], Any],
) -> tuple[list[StandIn], Any]:
    args = (
        pred,
        *(parent.graph.get_attr(name) for name in names),
        tuple(
            parent.read(value) if isinstance(value, StandIn) else parent.sizes.value(value)
            for value in operands
        ),
    )
    leaves, spec = outputs
    results = tuple(wrap(leaf._meta, leaf.device) for leaf in leaves)
    node = parent._node(cond_op, args, {}, results)
    for index, result in enumerate(results):
        getitem = parent._node(operator.getitem, (node, index), {}, result)
        parent._track(result, getitem)
        _bind_sizes(parent, getitem, result)
    return list(results), spec


def capture_of(pred: Any, operands: Any) -> Capture | None:
    """The capture recording now claims every cond called under it."""
    return active_capture()
