"""Which nodes ``Graph.eliminate_dead_code`` erases: unused values, and writes nobody reads.

A node whose value no live node uses is dead, unless it does something besides computing its
value that the program can observe. What counts, per kind of node:

* **Pure calls** (``Node.is_impure`` false: ``add``, ``conv2d``, a torch.nn layer): dead when
  unused, as in torch.fx. A module call's updates of its own state (a batch norm's running
  statistics in training) do not keep it, as in torch.fx: a feature extractor cut before a
  layer does not run that layer.
* **Writes to a value** (``x.add_(y)``, ``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``,
  ``operator.iadd``, ``setitem``): dead when nothing that may share the written value's memory
  (its *alias class*: views of it, what it is a view of, in-place results) is read by a live
  node after the write, and the class holds no input, parameter or buffer (a write to those
  outlives the call). torch.fx keeps fewer: it drops an in-place method whose result is unused
  even when the written tensor is read afterwards (timm's Swin ``DropPath`` in training divides
  its random mask in place with ``div_``, then multiplies by the mask: torch.fx's elimination
  drops the ``div_`` and changes the result; fxloom keeps it).
* **Run-time checks of a value's own later use** (``check_length``, the check that an unpacked
  sequence has as many items as names, ``a, b = x``): dead when every other reader of the
  checked value is dead — with no unpacked item used, there is nothing to protect.
* **Everything else impure** (``print``, other guards of fxloom — a guard on a branch condition
  protects the whole rest of the trace, not one value —, registered side effects, modules
  with ``_is_impure``, calls writing through ``out=``): kept.

Aliasing is assumed the cautious way (``fxloom.ops.effects``): a call whose result is not known
to be new memory may share memory with each of its inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fxloom import attr_path
from fxloom._union_find import UnionFind
from fxloom.node import Node
from fxloom.ops.effects import _CONTAINER_OPERATORS, module_returns_fresh, returns_fresh_call
from fxloom.ops.mutation import (
    is_read_only_effect,
    module_has_side_effect,
    module_is_inplace,
    writes_only_first_argument,
    writes_through_keywords,
)

if TYPE_CHECKING:
    from fxloom.graph import Graph

__all__ = ["SUBJECT_CHECKS", "dead_nodes"]

# Run-time checks (by qualified name: they live in the tracing layer, above this one) that
# protect only the later reads of their first argument, the subject: with every other reader
# of the subject dead, the check is dead too.
SUBJECT_CHECKS: set[str] = {"fxloom.guards.check_length"}

# Ops whose nodes are the program's state or inputs: a write to their alias class outlives
# the call, so it is never dead.
_EXTERNAL_OPS = ("placeholder", "get_attr")


def dead_nodes(graph: Graph) -> set[Node]:
    """The nodes of ``graph`` to erase (decided in one backward sweep; see the module)."""
    root = graph.owning_module
    classes = _AliasClasses(graph, root)
    external = {classes.find(n) for n in graph.nodes if n.op in _EXTERNAL_OPS}
    dead: set[Node] = set()
    read_later: set[Any] = set()  # alias classes a live node after the sweep point reads
    for node in reversed(graph.nodes):
        if _is_dead(node, dead, classes, external, read_later, root):
            dead.add(node)
        else:
            read_later.update(classes.find(used) for used in node.all_input_nodes)
    return dead


def _is_dead(
    node: Node,
    dead: set[Node],
    classes: _AliasClasses,
    external: set[Any],
    read_later: set[Any],
    root: torch.nn.Module | None,
) -> bool:
    if node.op in ("placeholder", "output") or node.meta.get("is_impure"):
        return False
    if any(user not in dead for user in node.users):
        return False
    written = _written_values(node, root)
    if written is None:  # computes its value only
        return True
    if written == "checks":
        return _qualified_name(node.target) in SUBJECT_CHECKS and _only_reader_left(node, dead)
    return all(
        isinstance(value, Node)
        and classes.find(value) not in external
        and classes.find(value) not in read_later
        for value in written
    )


def _qualified_name(target: Any) -> str:
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}"


def _only_reader_left(check: Node, dead: set[Node]) -> bool:
    subject = check.args[0] if check.args else None
    if not isinstance(subject, Node):
        return False
    return all(user is check or user in dead for user in subject.users)


def _written_values(node: Node, root: torch.nn.Module | None) -> Any:
    """``None`` for a node that only computes its value, ``"checks"`` for a read-only effect,
    else the values it writes (``("any",)`` where unknown: never dead)."""
    op = node.op
    if op == "call_module":
        module = attr_path.find(root, node.target) if root is not None else attr_path.MISSING
        if not isinstance(module, torch.nn.Module):
            return None
        if module_has_side_effect(module):
            return ("any",)
        if module_is_inplace(module):
            return node.args[:1]
        return None
    if op not in ("call_function", "call_method") or not node.is_impure():
        return None
    kwargs = node.kwargs
    if kwargs and writes_through_keywords(kwargs) and kwargs.get("inplace") is not True:
        return ("any",)  # out=: kept, as it always was
    if op == "call_function" and is_read_only_effect(node.target):
        return "checks"
    if writes_only_first_argument(op, node.target, kwargs):
        return node.args[:1]
    return ("any",)


class _AliasClasses(UnionFind):
    """Values that may share memory, joined (union-find): a call not known to return new
    memory joins its result to its inputs; an in-place call returns what it writes."""

    def __init__(self, graph: Graph, root: torch.nn.Module | None) -> None:
        super().__init__()
        tensors: set[Node] = set()  # nodes known to compute a tensor
        for node in graph.nodes:
            if _may_alias_inputs(node, root, tensors):
                for used in node.all_input_nodes:
                    self.union(node, used)
            elif node.op not in ("placeholder", "get_attr"):  # of unknown type
                tensors.add(node)


def _may_alias_inputs(node: Node, root: torch.nn.Module | None, tensors: set[Node]) -> bool:
    """Whether ``node``'s result may share memory with an input; where it is known not to, it
    is a new tensor (the caller notes it in ``tensors``)."""
    op = node.op
    if op in ("call_function", "call_method"):
        if node.target in _CONTAINER_OPERATORS and any(
            used in tensors for used in node.all_input_nodes
        ):
            return False  # ``a + b`` with a tensor operand: a new tensor, not list concatenation
        return not returns_fresh_call(node)
    if op == "call_module":
        module = attr_path.find(root, node.target) if root is not None else attr_path.MISSING
        if not isinstance(module, torch.nn.Module):
            return True
        return not _module_fresh(module)
    return False


def _module_fresh(module: torch.nn.Module) -> bool:
    """Whether ``module``'s result is new memory: a known layer (``FRESH_RESULT_MODULES``), or
    a ``Sequential`` whose first layer is one and whose later layers each make new memory or
    write their input in place (torchvision's ``Conv2dNormActivation``, kept as a leaf)."""
    if module_is_inplace(module):
        return False
    if type(module).forward is torch.nn.Sequential.forward:
        layers = list(module)
        return (
            bool(layers)
            and _module_fresh(layers[0])
            and all(module_is_inplace(layer) or _module_fresh(layer) for layer in layers[1:])
        )
    return module_returns_fresh(module)
