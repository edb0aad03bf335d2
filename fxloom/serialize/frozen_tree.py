"""A loaded module tree is frozen while its graph runs: what a graph may do with what it reads.

A graph reaches the module tree in two ways: ``call_module`` (calling a submodule at a path)
and ``get_attr`` (reading what a path holds). The loader checks, per ``get_attr`` node,
what its value may flow into, so that no node of the graph can write to a module or to a
module's attributes whatever operator, method or builtin it calls:

* a **tensor** (parameter, buffer, tensor attribute, parametrized tensor) may go anywhere:
  computing with it, in place included, is what graphs do (a buffer's running statistics);
* a **module** may only be a branch that a run-time function calls (``fxloom.cond``'s
  ``graph_arguments``): nothing else receives it, so no ``setitem``/``delitem``, in-place
  dunder or ``nn.Module`` method (``double``, ``to``, ``register_buffer``) ever has a module
  or a module container (``Sequential``, ``ModuleDict``, ``ParameterDict``) as its receiver
  or argument;
* any **other value** must be immutable (numbers, strings, dtypes, devices, sizes, and tuples
  of those: ``IMMUTABLE_TYPES``), so writing to it is impossible rather than refused.

Graph-made values (lists, dicts a node builds) and the caller's inputs are the caller's to
change. Nothing else in the table can reach a module: ``getattr`` reads only
``attribute_table`` names, which lead from tensors to sizes, dtypes and numbers, and
``call_module`` targets are checked, at load, to be the modules the file declared at those
paths (``graph_module_files.check_loaded``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fxloom.lint import LEAF_ARGUMENT_TYPES
from fxloom.node import Node, map_arg
from fxloom.ops.runtime_functions import runtime_function
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.module_members import ParametrizedTensor

__all__ = ["IMMUTABLE_TYPES", "check_get_attr_uses"]

# Values a get_attr may read besides tensors and branch modules: none can be written to.
IMMUTABLE_TYPES: frozenset[type] = LEAF_ARGUMENT_TYPES | {frozenset}


def check_get_attr_uses(node: Node, value: Any, where: str) -> None:
    """Refuse ``node`` (a get_attr reading ``value``) if anything could write through it."""
    if isinstance(value, (torch.Tensor, ParametrizedTensor)):
        return
    if isinstance(value, nn.Module):
        _check_branch_uses(node, where)
    elif not _immutable(value):
        raise SerializationError(
            f"{where}: %{node.name} reads {node.target!r}, a {type(value).__name__}; a graph "
            "from a file may read tensors and immutable values (numbers, strings, tuples) "
            "from its module, never a value it could change; refused"
        )


def _check_branch_uses(node: Node, where: str) -> None:
    for user in node.users:
        positions = _branch_positions(user)
        others = [a for i, a in enumerate(user.args) if i not in positions]
        if not positions or _mentions((others, user.kwargs), node):
            raise SerializationError(
                f"{where}: %{node.name} reads the module {node.target!r} and passes it to "
                f"%{user.name} ({user.op} {_label(user)}); a graph from a file may hand a module "
                "only to fxloom.cond as a branch (call it with call_module instead): the loaded "
                "module tree is frozen while its graph runs; refused"
            )


def _mentions(arguments: Any, node: Node) -> bool:
    """Whether ``node`` appears anywhere in ``arguments`` (nested containers included)."""
    found = []
    map_arg(arguments, lambda n: found.append(n) if n is node else None)
    return bool(found)


def _branch_positions(user: Node) -> tuple[int, ...]:
    if user.op != "call_function":
        return ()
    row = runtime_function(user.target)
    return row.graph_arguments if row is not None else ()


def _immutable(value: Any) -> bool:
    if type(value) in (tuple, frozenset):
        return all(_immutable(item) for item in value)
    return type(value) in IMMUTABLE_TYPES


def _label(node: Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", repr(target))
