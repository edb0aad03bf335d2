"""The text form of graphs and nodes (``print(graph)``, ``Node.format_node``, ``print_tabular``),
and ``printable``, which makes a string read from a file safe to print.

Text form of one node::

    %name : [num_users=N] = op[target=T](args = (...), kwargs = {...})

with ``: <type>`` after the name when the node has a type annotation, and
``return <value>`` for the output node.
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch

from fxloom import attr_path
from fxloom.pytree import container_type

if TYPE_CHECKING:
    from fxloom.graph import Graph
    from fxloom.node import Node

__all__ = [
    "printable",
    "qualified_name",
    "describe_target",
    "format_arg",
    "format_node",
    "graph_lines",
    "graph_to_str",
    "print_tabular",
]


def printable(text: str) -> str:
    r"""``text`` with every character a terminal could act on written as ``repr`` writes it.

    A string from a file may hold escape sequences (clear the screen, hide text, write the
    clipboard), bidi overrides that reorder what is shown, or a newline that forges a line of
    output. Every character ``str.isprintable`` rejects is escaped: controls (C0 with newline
    and tab, DEL, C1, ESC), format characters (bidi overrides and isolates, zero-width ones),
    line and paragraph separators, spaces other than " ", surrogates, private-use and
    unassigned code points. Quotes and backslashes stay as they are, so a name reads as
    itself, and escaping printable text changes nothing (escaping twice is escaping once)::

        >>> printable("relu\x1b[2J\u202e")
        'relu\\x1b[2J\\u202e'
        >>> printable("layer.0")
        'layer.0'
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


# Modules whose functions are exposed under a friendlier public path.
_PUBLIC_MODULE = {
    "_operator": "operator",
    "torch._C._VariableFunctions": "torch",
    "torch._C._nn": "torch._C._nn",
    "torch.functional": "torch",
}


def qualified_name(obj: Any) -> str:
    """A readable dotted name for a callable (``operator.add``, ``torch.relu``, ``getattr``)."""
    if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{obj}"  # str() is "aten.add.Tensor" / "aten.add"
    name = getattr(obj, "__name__", None)
    if name is None:
        return repr(obj)
    if getattr(builtins, name, None) is obj:
        return name
    if getattr(torch, name, None) is obj:
        return f"torch.{name}"
    module = getattr(obj, "__module__", None)
    if module is None and isinstance(obj, types.BuiltinMethodType):
        owner = getattr(obj, "__self__", None)
        module = getattr(owner, "__name__", None)
    module = _PUBLIC_MODULE.get(module, module)
    qualname = getattr(obj, "__qualname__", name)
    if "<locals>" in qualname and _module_attribute(module, name) is obj:
        # Made by a factory but published under its name (``F.max_pool2d`` is a
        # ``boolean_dispatch.<locals>.fn``): the public name is the one to print.
        qualname = name
    return f"{module}.{qualname}" if module else qualname


def _module_attribute(module: str | None, name: str) -> Any:
    found = sys.modules.get(module) if module else None
    return vars(found).get(name) if found is not None else None


def format_arg(arg: Any, max_list_len: float = float("inf"), *, percent: bool = True) -> str:
    """One argument in the text form: nodes as ``%name`` (``name`` without ``percent``).

    Which values are containers is ``fxloom.pytree``'s to say; each kind
    prints its own way (a registered dataclass as ``Pair(left=%x, right=1)``,
    another registered type as ``Box(%x, 1)``); named tuples and leaves print
    by their ``repr``.
    """
    from fxloom.node import Node

    if isinstance(arg, Node):
        return f"%{arg.name}" if percent else arg.name
    entry = container_type(type(arg))
    printer = _CONTAINER_PRINTERS.get(entry.kind) if entry is not None else None
    if printer is not None:
        return printer(arg, max_list_len, percent)
    if isinstance(arg, type):  # by name, as functions are: graph text reads it back
        return qualified_name(arg)
    if callable(arg) and hasattr(arg, "__name__"):
        return qualified_name(arg)
    return repr(arg)


def _format_tuple(arg: tuple, max_list_len: float, percent: bool) -> str:
    items = ", ".join(format_arg(a, max_list_len, percent=percent) for a in arg)
    return f"({items},)" if len(arg) == 1 else f"({items})"


def _format_list(arg: list, max_list_len: float, percent: bool) -> str:
    shown = arg if len(arg) <= max_list_len else arg[: int(max_list_len)]
    items = ", ".join(format_arg(a, max_list_len, percent=percent) for a in shown)
    more = "" if len(shown) == len(arg) else f", ...[total_len={len(arg)}]"
    return f"[{items}{more}]"


def _format_dict(arg: dict, max_list_len: float, percent: bool) -> str:
    items = ", ".join(
        # Keys print bare, as torch.fx prints them; a key from a file may hold controls.
        f"{printable(str(k))}: {format_arg(v, max_list_len, percent=percent)}"
        for k, v in arg.items()
    )
    return f"{{{items}}}"


def _format_slice(arg: slice, max_list_len: float, percent: bool) -> str:
    parts = (format_arg(arg.start), format_arg(arg.stop), format_arg(arg.step))
    return f"slice({', '.join(parts)})"


def _format_dataclass(arg: Any, max_list_len: float, percent: bool) -> str:
    children, names = container_type(type(arg)).flatten(arg)
    fields = (
        f"{n}={format_arg(c, max_list_len, percent=percent)}" for n, c in zip(names, children)
    )
    return f"{type(arg).__name__}({', '.join(fields)})"


def _format_registered(arg: Any, max_list_len: float, percent: bool) -> str:
    children, _ = container_type(type(arg)).flatten(arg)
    items = ", ".join(format_arg(c, max_list_len, percent=percent) for c in children)
    return f"{type(arg).__name__}({items})"


# How each kind of container (``ContainerType.kind``) prints; named tuples print by ``repr``.
_CONTAINER_PRINTERS: dict[str, Callable[[Any, float, bool], str]] = {
    "tuple": _format_tuple,
    "list": _format_list,
    "dict": _format_dict,
    "slice": _format_slice,
    "dataclass": _format_dataclass,
    "custom": _format_registered,
}


# How ``describe_target`` may word a target: for a message (the default), for a table
# column or a count (``label``), or as the graph's text form prints it (``text``).
TargetStyle = Literal["message", "label", "text"]


def describe_target(
    node: Node, style: TargetStyle = "message", *, module_class: str | None = None
) -> str:
    """What ``node`` calls or reads, worded in one of three styles::

    node calls            message (the default)        label               text
    a function            torch.relu                   (as message)        torch.relu
    an ATen operator      torch.ops.aten.add.Tensor    aten.add.Tensor     torch.ops.aten.add.Tensor
    a builtin             getattr                      (as message)        builtins.getattr
    a method              Tensor.view                  (as message)        view
    a module              block.lin, a Linear          Linear              block.lin
    (reads) anything else its target: weight, x, output

    ``message`` names things for errors and reports; ``label`` is short enough for a table
    column or a count of what a graph calls (modules by class); ``text`` is the target as
    ``print(graph)`` and ``print_tabular`` show it. A module's class is read from the graph's
    owning module (``a missing module`` where it has none at that path); where no live module
    exists (a saved file's description), the caller passes ``module_class``.

        >>> import torch, fxloom
        >>> gm = fxloom.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
        >>> [describe_target(node) for node in gm.graph.nodes]
        ['input', '0, a ReLU', 'output']
        >>> [describe_target(node, "label") for node in gm.graph.nodes]
        ['input', 'ReLU', 'output']
    """
    if style == "text":
        return _text_target(node)
    if node.op == "call_function":
        return _function_label(node.target) if style == "label" else qualified_name(node.target)
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        kind = module_class or _module_class(node)
        if style == "label":
            return kind or str(node.target)
        return f"{node.target}, a {kind}" if kind else str(node.target)
    return str(node.target)


def _function_label(target: Any) -> str:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        # aten.add.Tensor: in a table column or a drawn box, "torch.ops." only adds width
        return str(target)
    return qualified_name(target)


def _module_class(node: Node) -> str | None:
    """The called module's class name; ``None`` where the graph has no owning module."""
    owner = node.graph.owning_module
    if owner is None:
        return None
    module = attr_path.find(owner, str(node.target))
    return type(module).__name__ if isinstance(module, torch.nn.Module) else "missing module"


def _text_target(node: Node) -> str:
    if node.op == "call_function":
        target = node.target
        if getattr(target, "__module__", None) == "builtins":  # as torch.fx prints them
            return f"builtins.{target.__name__}"
        return qualified_name(target)
    return str(node.target)


def _type_str(t: Any) -> str:
    if isinstance(t, type):
        return qualified_name(t) if t.__module__ != "builtins" else t.__name__
    return repr(t)


def format_node(
    node: Node,
    placeholder_names: list[str] | None = None,
    maybe_return_typename: list[str] | None = None,
) -> str | None:
    op = node.op
    if op == "placeholder" and placeholder_names is not None:
        placeholder_names.append(str(node.target))
        return None
    if op == "output":
        if node.type is not None and maybe_return_typename is not None:
            maybe_return_typename[0] = f" -> {_type_str(node.type)}"
        return f"return {format_arg(node.args[0], percent=False) if node.args else None}"
    typed = f" : {_type_str(node.type)}" if node.type is not None else " :"
    head = f"%{node.name}{typed} [num_users={len(node.users)}] = {op}[target={_text_target(node)}]"
    if op == "placeholder":
        return head + (f"(default={format_arg(node.args[0])})" if node.args else "")
    if op == "get_attr":
        return head
    return f"{head}(args = {format_arg(node.args)}, kwargs = {format_arg(node.kwargs)})"


def graph_lines(graph: Graph) -> list[str]:
    """The lines of ``print(graph)``, one a node: a reader that must not print a string as
    it is (``fxloom show``, which passes each line through ``printable``) can escape a node's
    line whole, newlines inside its names or arguments included."""
    return ["graph():", *(f"    {format_node(node)}" for node in graph.nodes)]


def graph_to_str(graph: Graph) -> str:
    return "\n".join(graph_lines(graph))


def print_tabular(graph: Graph, file: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text  # plain cells: "[%a, %b]" is not rich markup

    table = Table(title=f"graph ({len(graph.nodes)} nodes)", show_lines=False)
    for column in ("opcode", "name", "target", "args", "kwargs"):
        table.add_column(column, overflow="fold")
    for node in graph.nodes:
        cells = (
            node.op,
            node.name,
            _text_target(node),
            format_arg(node.args),
            format_arg(node.kwargs),
        )
        table.add_row(*(Text(cell) for cell in cells))
    console = Console(file=file, soft_wrap=False) if file is not None else Console()
    console.print(table)
