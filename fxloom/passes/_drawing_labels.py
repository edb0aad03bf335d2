"""The text drawn by ``fxloom.passes.graph_drawer``: node labels and tensor shapes on edges.

Labels are built as lists of plain one-line rows, truncated, then escaped once by
``_dot.html_text`` into an HTML-like table; nothing here writes DOT syntax by hand, so any
target, string argument or module name renders literally.

Depends on: torch (dtypes), the IR's text form (``fxloom._format``), ``fxloom.node``,
``fxloom.pytree``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch

from fxloom._format import describe_target, format_arg
from fxloom.node import Node, map_arg
from fxloom.passes._dot import html_text
from fxloom.pytree import SEQUENCE_KINDS, container_type
from fxloom.source_location import source_location

__all__ = ["DTYPE_ABBREVIATIONS", "format_tensor_meta", "value_meta"]

# Short dtype names on edges (f32[2, 8]); a dtype missing here shows as its torch name.
DTYPE_ABBREVIATIONS: dict[torch.dtype, str] = {
    torch.float64: "f64",
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.complex128: "c128",
    torch.complex64: "c64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
    torch.qint8: "qi8",
    torch.quint8: "qu8",
    torch.qint32: "qi32",
}

_ELLIPSIS = "..."


def _dtype_name(dtype: Any) -> str:
    short = DTYPE_ABBREVIATIONS.get(dtype)
    return short if short is not None else str(dtype).removeprefix("torch.")


def format_tensor_meta(meta: Any, max_items: int = 4) -> str | None:
    """A short description of a value's tensor metadata, or None when it has none.

    Accepts anything with ``.shape`` and ``.dtype`` (the ``TensorMetadata`` that shape
    propagation stores in ``node.meta["tensor_meta"]``, tensors, meta tensors), and tuples,
    lists and dicts of those; at most ``max_items`` entries of a container are shown.

    >>> import torch
    >>> format_tensor_meta(torch.empty(2, 8))
    'f32[2, 8]'
    >>> format_tensor_meta((torch.empty(3, dtype=torch.int64), None, [torch.empty(())]))
    '(i64[3], -, [f32[]])'
    >>> format_tensor_meta({"logits": torch.empty(1, 5)})
    '{logits: f32[1, 5]}'
    """
    if hasattr(meta, "shape") and hasattr(meta, "dtype"):
        dims = ", ".join(str(size) for size in meta.shape)
        return f"{_dtype_name(meta.dtype)}[{dims}]"
    family = _container_kind(meta)
    if family in SEQUENCE_KINDS:
        parts = [format_tensor_meta(item, max_items) for item in meta[:max_items]]
        if all(part is None for part in parts):
            return None
        shown = [part or "-" for part in parts] + ([_ELLIPSIS] if len(meta) > max_items else [])
        opening, closing = ("[", "]") if family == "list" else ("(", ")")
        return opening + ", ".join(shown) + closing
    if family == "dict":
        items = list(meta.items())
        parts = [(key, format_tensor_meta(value, max_items)) for key, value in items[:max_items]]
        if all(part is None for _, part in parts):
            return None
        shown = [f"{key}: {part or '-'}" for key, part in parts]
        return "{" + ", ".join(shown + ([_ELLIPSIS] if len(items) > max_items else [])) + "}"
    return None


def _container_kind(value: Any) -> str | None:
    """``fxloom.pytree``'s kind of container ``value`` is (``"tuple"``, ``"dict"``...), or None."""
    entry = container_type(type(value))
    return entry.kind if entry is not None else None


def value_meta(node: Node) -> Any:
    """What is known about ``node``'s value: ``meta["tensor_meta"]``, else ``meta["val"]``."""
    meta = node.meta.get("tensor_meta")
    return meta if meta is not None else node.meta.get("val")


def edge_label(source: Node, user: Node) -> str | None:
    """The shape flowing from ``source`` to ``user``: one element when ``user`` indexes it."""
    meta = value_meta(source)
    if (
        user.op == "call_function"
        and user.target is operator.getitem
        and len(user.args) == 2
        and user.args[0] is source
        and isinstance(user.args[1], int)
        and _container_kind(meta) in SEQUENCE_KINDS
        and not hasattr(meta, "shape")  # a TensorMetadata is a NamedTuple: a tensor, not a tuple
        and -len(meta) <= user.args[1] < len(meta)
    ):
        meta = meta[user.args[1]]
    return format_tensor_meta(meta)


class _Elided:
    """Stands for a node in an argument summary when node names are skipped."""

    def __repr__(self) -> str:
        return "\N{MIDDLE DOT}"


_ELIDED = _Elided()


def _only_nodes(value: Any) -> bool:
    items = value.values() if isinstance(value, Mapping) else value
    return all(isinstance(item, Node) for item in items)


def argument_rows(node: Node, skip_node_names: bool) -> list[str]:
    """``args: ...`` and ``kwargs: ...`` rows; with ``skip_node_names`` nodes show as a dot
    (edges show which) and a row that holds only nodes is left out."""
    if node.op in ("placeholder", "get_attr", "output") and skip_node_names:
        return []
    rows = []
    for title, value in (("args", node.args), ("kwargs", node.kwargs)):
        if not value or (skip_node_names and _only_nodes(value)):
            continue
        shown = map_arg(value, lambda _: _ELIDED) if skip_node_names else value
        rows.append(f"{title}: {format_arg(shown, max_list_len=8)}")
    return rows


def target_row(node: Node) -> str:
    """``call_function[target=torch.relu]``: functions by their label (ATen operators by their
    short name, ``aten.convolution.default``: an exported graph calls nothing else), other
    targets as the graph's text form prints them."""
    style = "label" if node.op == "call_function" else "text"
    return f"{node.op}[target={describe_target(node, style)}]"


def module_row(module: torch.nn.Module | None) -> str:
    """``Conv2d(3, 8, kernel_size=(3, 3), ...)``: the module's type and first line of settings."""
    if module is None:
        return "(not a submodule of the root)"
    settings = module.extra_repr().splitlines()
    return f"{type(module).__name__}({settings[0] if settings else ''})"


def stack_trace_row(node: Node) -> str | None:
    """``folder/file.py:41 code`` for the innermost frame of the node's recorded stack trace."""
    location = source_location(node)
    if location is None:
        return None
    short_file = "/".join(location.file.replace("\\", "/").split("/")[-2:])
    return f"{short_file}:{location.line} {location.code}".rstrip()


def html_table(rows: list[str], max_width: int) -> str:
    """Rows as an HTML-like label: the first in bold, all left-aligned, each cut to ``max_width``."""
    cells = []
    for index, row in enumerate(rows):
        if len(row) > max_width:
            row = row[: max_width - len(_ELLIPSIS)] + _ELLIPSIS
        text = html_text(row)
        cells.append(
            f'<TR><TD ALIGN="LEFT">{"<B>" + text + "</B>" if index == 0 else text}</TD></TR>'
        )
    return '<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0">' + "".join(cells) + "</TABLE>"
