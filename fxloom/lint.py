"""``Graph.lint``: the IR's invariants as an executable checker.

Each violation raises ``GraphLintError`` whose message says what is wrong, how
to fix it, and shows the offending node among its neighbours.

The rules about arguments live here too, read by node creation, code generation and the file
format: what each opcode takes in a file (``ARGUMENT_RULES``: checked by saving and loading,
not by ``lint``, which accepts what torch.fx's accepts, such as an output node given several
arguments by ``insert_arg``), which values an argument may hold
(``LEAF_ARGUMENT_TYPES``, ``OPAQUE_ARGUMENT_TYPES``, ``check_argument_value``) and which a
placeholder's default may be (``is_default_literal``).
"""

from __future__ import annotations

import enum
import types
from typing import TYPE_CHECKING, Any

import torch

from fxloom import attr_path

if TYPE_CHECKING:
    from fxloom.graph import Graph
    from fxloom.node import Node

__all__ = [
    "ARGUMENT_RULES",
    "DEFAULT_LITERAL_TYPES",
    "LEAF_ARGUMENT_TYPES",
    "OPAQUE_ARGUMENT_TYPES",
    "TORCH_VALUE_TYPES",
    "check_argument_value",
    "GraphLintError",
    "ForeignNodeError",
    "InvalidNodeError",
    "argument_rule_violation",
    "is_default_literal",
    "lint_graph",
]

# The opcodes that restrict their arguments: (most positional arguments, whether they may use
# nodes); none of them takes keywords. A placeholder's argument is its default value, evaluated
# where ``forward`` is defined, so a node there would name a global of the generated code; a
# get_attr reads its target and takes nothing; an output returns one value. Saving and loading
# check every node of a file against these rules; ``lint`` does not (torch.fx's lint accepts
# an output with several arguments, and graph surgery written for it makes them).
ARGUMENT_RULES: dict[str, tuple[int, bool]] = {
    "placeholder": (1, False),
    "get_attr": (0, False),
    "output": (1, True),
}

# A placeholder's default is printed in the generated signature (``def forward(self, x,
# flag=True)``): values of these types, and plain tuples and lists of them, print as Python
# literals that read back as the same value (``is_default_literal``).
DEFAULT_LITERAL_TYPES: frozenset[type] = frozenset({int, float, bool, str, type(None), complex})

# The legal argument values of every opcode, besides nodes and the containers of
# ``fxloom.pytree`` (tuples, lists, dicts, slices, registered types) holding them. Node
# creation refuses anything else (``check_argument_value``); code generation prints each of
# these; the file format saves each, and loading builds nodes through the same check.

# torch's enum-like values, by the name torch gives their type: printed and saved by name
# (``torch.float32``, ``torch.channels_last``).
TORCH_VALUE_TYPES: dict[str, type] = {
    "dtype": torch.dtype,
    "layout": torch.layout,
    "memory_format": torch.memory_format,
}

# Values stored as they are (immutable, printable as literals or simple expressions); the fast
# paths of node creation and the interpreter test ``type(x) in LEAF_ARGUMENT_TYPES``.
LEAF_ARGUMENT_TYPES: frozenset[type] = frozenset(
    {
        int,
        float,
        bool,
        complex,
        str,
        bytes,
        type(None),
        type(Ellipsis),
        range,
        torch.device,
        torch.Size,
        torch.SymInt,
        torch.SymFloat,
        torch.SymBool,
        *TORCH_VALUE_TYPES.values(),
    }
)

# Values that generated code can only reach through a global binding; allowed as arguments
# (a function passed to another, an enum member), printed by name. Any other callable is too.
OPAQUE_ARGUMENT_TYPES: tuple[type, ...] = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.ModuleType,
    type,
    enum.Enum,
)


class GraphLintError(RuntimeError):
    """A graph breaks one of the IR's invariants; the message names the node and the fix.

    A ``RuntimeError``, as torch.fx's ``lint`` raises. The edits below are
    refused when made rather than found by ``lint`` later; their errors are
    ``GraphLintError``s too, and also the type fxloom raised for them before
    (``ValueError``/``TypeError``) and the one torch.fx raises where it checks
    them at the edit (``AssertionError``).
    """


class ForeignNodeError(GraphLintError, ValueError, AssertionError):
    """A node of another graph, or an erased one, used as an argument, insert point or
    erase target (torch.fx: ``RuntimeError`` from ``lint``, ``AssertionError`` from
    ``inserting_before``)."""


class InvalidNodeError(GraphLintError, ValueError, TypeError, AssertionError):
    """A node made with an unknown opcode or a target its opcode cannot take
    (torch.fx: ``AssertionError`` from ``create_node``, ``RuntimeError`` from ``lint``)."""


def _context(node: Node, radius: int = 2) -> str:
    from fxloom._format import format_node

    root = node.graph._root
    start = node
    for _ in range(radius):
        if start._prev is root:
            break
        start = start._prev
    lines, current = [], start
    for _ in range(2 * radius + 1):
        if current is root:
            break
        marker = "-->" if current is node else "   "
        lines.append(f"  {marker} {format_node(current)}")
        current = current._next
    return "\n".join(lines)


def _fail(node: Node, problem: str) -> GraphLintError:
    return GraphLintError(f"{problem}\n\nin the graph:\n{_context(node)}")


def lint_graph(graph: Graph, root: torch.nn.Module | None) -> None:
    sentinel = graph._root
    defined: set[Node] = set()
    names: set[str] = set()
    output: Node | None = None
    count = 0
    # Every (node -> input) edge is checked to be in input.users below; if the
    # totals match too, users holds nothing else.
    edges = user_entries = 0
    previous, node = sentinel, sentinel._next
    while node is not sentinel:
        if node._prev is not previous:
            raise _fail(node, f"the node list is broken at %{node._name} (prev pointer mismatch)")
        if node.graph is not graph or node._erased:
            raise _fail(node, f"%{node._name} is linked into this graph but is erased or foreign")
        if node._name in names:
            raise _fail(node, f"two nodes are named {node._name!r}; names must be unique")
        names.add(node._name)
        if output is not None:
            raise _fail(
                node,
                f"%{node._name} comes after the output %{output._name}; the output must be the "
                f"last node (move it: %{node._name}.append(%{output._name}), or erase the stray "
                "node)",
            )
        inputs = node._input_nodes
        for arg in inputs:
            if arg not in defined or node not in arg.users:
                _explain_bad_input(node, arg, defined)
        edges += len(inputs)
        user_entries += len(node.users)
        if node._op == "output":
            output = node
        defined.add(node)
        count += 1
        previous, node = node, node._next
    if edges != user_entries:
        _explain_extra_users(graph)
    if count != len(graph.nodes):
        raise GraphLintError(
            f"the graph counts {len(graph.nodes)} nodes but {count} are linked; "
            "nodes were linked or unlinked behind the Graph API's back"
        )
    if output is None:
        raise GraphLintError(
            "the graph has no output node; add one with graph.output(value) "
            "(return None with graph.output(None))"
        )
    if root is not None:
        _check_targets(graph, root)


def argument_rule_violation(node: Node) -> str | None:
    """Which rule of ``ARGUMENT_RULES`` ``node``'s arguments break, or None."""
    rule = ARGUMENT_RULES.get(node.op)
    if rule is None:
        return None
    most, nodes_allowed = rule
    if len(node.args) > most or node.kwargs or not nodes_allowed and node.all_input_nodes:
        return (
            f"a {node.op} node takes at most {most} argument(s)"
            f"{'' if nodes_allowed else ', none of them a node'}, and no keywords"
        )
    return None


def is_default_literal(value: Any) -> bool:
    """Whether ``value`` can be a placeholder's default: a scalar of ``DEFAULT_LITERAL_TYPES``,
    or a plain tuple or list of them."""
    t = type(value)
    if t in DEFAULT_LITERAL_TYPES:
        return True
    return (t is tuple or t is list) and all(is_default_literal(v) for v in value)


def check_argument_value(value: Any, owner: Node | None) -> None:
    """Refuse ``value``, a leaf of ``owner``'s arguments outside ``LEAF_ARGUMENT_TYPES``, unless
    it is an opaque constant (``OPAQUE_ARGUMENT_TYPES`` or a callable); the ``TypeError`` says
    where such a value belongs instead."""
    where = f"%{owner._name} ({owner._op})" if owner is not None else "a node"
    if isinstance(value, torch.Tensor):
        raise TypeError(
            f"{where} was given a tensor of shape {tuple(value.shape)} as an argument; tensors "
            "are not graph arguments. Register it on the root module (as a parameter, buffer or "
            "attribute) and read it with graph.get_attr('<name>')"
        )
    if isinstance(value, torch.nn.Module):
        raise TypeError(
            f"{where} was given the module {type(value).__name__} as an argument; modules are "
            "called with graph.call_module('<qualified name>') or read with graph.get_attr"
        )
    if isinstance(value, OPAQUE_ARGUMENT_TYPES) or callable(value):
        return
    raise TypeError(
        f"{where} was given {value!r} of type {type(value).__name__} as an argument; arguments "
        "are nodes, Python scalars, strings, None, slices, Ellipsis, torch dtypes/devices/"
        "layouts/memory formats, torch.Size and tuples/lists/dicts of these (or containers "
        "registered with fxloom.pytree); fxloom.lint.LEAF_ARGUMENT_TYPES lists them. Store "
        "other objects as attributes of the root module and read them with graph.get_attr"
    )


def _explain_extra_users(graph: Graph) -> None:
    for node in graph.nodes:
        for user in node.users:
            if node not in user._input_nodes or user._erased:
                raise _fail(node, f"%{node.name}.users lists %{user.name}, which does not use it")
    raise GraphLintError("users entries and argument edges disagree in number")


def _explain_bad_input(node: Node, arg: Node, defined: set[Node]) -> None:
    """Raise the error describing why ``arg`` is not a valid input of ``node``."""
    if arg.graph is not node.graph:
        raise _fail(
            node,
            f"%{node.name} uses %{arg.name}, which belongs to another graph; "
            "copy nodes across graphs with Graph.node_copy or Graph.graph_copy",
        )
    if arg._erased:
        raise _fail(node, f"%{node.name} uses %{arg.name}, which was erased")
    if arg not in defined:
        raise _fail(
            node,
            f"%{node.name} uses %{arg.name} before it is defined (graph is not in topological "
            f"order); move the node with %{arg.name}.append(...) / prepend, or create it "
            "under graph.inserting_after(...)",
        )
    raise _fail(node, f"%{node.name} uses %{arg.name} but is missing from its users")


def _check_targets(graph: Graph, root: torch.nn.Module) -> None:
    for op in ("get_attr", "call_module"):
        for node in graph.find_nodes(op=op):
            try:
                value = attr_path.get(root, node.target)
            except attr_path.MissingAttributeError as err:
                raise _fail(
                    node, f"%{node.name} ({op}) targets {node.target!r}, but {err}"
                ) from None
            if op == "call_module" and not isinstance(value, torch.nn.Module):
                raise _fail(
                    node,
                    f"%{node.name} calls {node.target!r} as a module, but it is a "
                    f"{type(value).__name__}; use call_function or call_method for it",
                )
