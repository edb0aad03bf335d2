"""Checks an exported module runs on its inputs: the program is only sound for inputs like the examples.

``ExportedProgram.module()`` calls one per input before anything else, so a
tensor of another shape or dtype, or another value for an input that export
fixed (an int, a flag), fails with a message naming the input rather than
computing something else.

``flatten_inputs`` does the same for the structure of the inputs (the
module takes the nested inputs the program was exported with). A dimension
exported as dynamic is any size here (``check_tensor`` takes its expression as
text); ``size_checks.check_sizes``, added by ``add_size_check``, then checks
the symbolic sizes against each other and their ranges.

Depends on ``fxloom.ops.mutation``, ``fxloom.pytree``, ``fxloom.pytree_codegen`` and
``size_checks``.
"""

from __future__ import annotations

from typing import Any

import torch

from fxloom import pytree
from fxloom.export.size_checks import add_size_check, check_sizes, size_expr
from fxloom.graph import Graph
from fxloom.node import Node
from fxloom.ops.mutation import READ_ONLY_EFFECTS, has_side_effect
from fxloom.pytree_codegen import PyTreeCodeGen

__all__ = [
    "ExportedCodeGen",
    "add_input_check",
    "add_input_checks",
    "add_size_check",
    "check_sizes",
    "check_tensor",
    "check_value",
    "flatten_inputs",
]


@has_side_effect
def check_tensor(value: Any, shape: tuple[int | str, ...], dtype: torch.dtype, name: str) -> None:
    """Raise unless ``value`` is a tensor of ``dtype`` whose sizes are ``shape``'s ints.

    A string in ``shape`` is a symbolic size (its expression, e.g. ``"2*s0"``): any size
    passes here, ``check_sizes`` checks it against the others.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"input {name!r}: the program was exported with a tensor here, got "
            f"{type(value).__name__}"
        )
    if value.dtype != dtype:
        raise TypeError(
            f"input {name!r}: the program was exported with dtype {dtype}, got {value.dtype}"
        )
    sizes = value.shape
    if tuple(sizes) == shape:  # every size static and right: the common case, first
        return
    if len(sizes) == len(shape) and all(
        expected == got or isinstance(expected, str) for expected, got in zip(shape, sizes)
    ):
        return
    differing = [
        f"dimension {dim}: {got} instead of {expected}"
        for dim, (expected, got) in enumerate(zip(shape, sizes))
        if expected != got and not isinstance(expected, str)
    ]
    if len(sizes) != len(shape):
        where, fix = "", "export again with an example of this shape"
    else:
        where = f" ({differing[0]})"
        fix = (
            "export again with an example of this shape, or declare this dimension dynamic "
            "with dynamic_shapes"
        )
    raise ValueError(
        f"input {name!r}: the program was exported for shape {_shape_text(shape)}, got "
        f"{list(sizes)}{where}; {fix}"
    )


def _shape_text(shape: tuple[int | str, ...]) -> str:
    return f"[{', '.join(str(size) for size in shape)}]"


@has_side_effect
def check_value(value: Any, expected: Any, name: str) -> None:
    """Raise unless a non-tensor input is the value the program was exported with."""
    if value is not expected and value != expected:
        raise ValueError(
            f"input {name!r}: the program was exported with {expected!r}, which its graph "
            f"depends on; got {value!r}. Export again with this value"
        )


READ_ONLY_EFFECTS.update((check_tensor, check_value))


def flatten_inputs(values: tuple, spec: pytree.TreeSpec, names: tuple[str, ...]) -> list[Any]:
    """The leaves of the forward's arguments ``values``, which must have the structure ``spec``;
    else a ``ValueError`` naming the argument, what it is and what was exported."""
    try:
        return pytree.tree_flatten_spec(values, spec)
    except ValueError:
        pass
    for name, value, expected in zip(names, values, spec.children):
        try:
            pytree.tree_flatten_spec(value, expected)
        except ValueError as err:
            raise ValueError(
                f"input {name!r}: the program was exported with the structure {expected}, "
                f"but {_describe(value)} was passed ({err}); pass it as exported, or export again"
            ) from None
    raise ValueError(f"the inputs do not have the exported structure {spec}")


def _describe(value: Any) -> str:
    _, spec = pytree.tree_flatten(value)
    return f"a {type(value).__name__} {spec}" if not spec.is_leaf() else f"a {type(value).__name__}"


class ExportedCodeGen(PyTreeCodeGen):
    """``PyTreeCodeGen`` whose forward refuses inputs of another structure by name."""

    def flatten_inputs(self, arguments: str, names: list[str]) -> str:
        return f"flatten_inputs({arguments}, self._in_spec, {tuple(names)!r})"

    def additional_globals(self) -> list[tuple[str, Any]]:
        return [*super().additional_globals(), ("flatten_inputs", flatten_inputs)]


def add_input_check(graph: Graph, placeholder: Node, val: Any) -> None:
    """Add to ``graph`` a call checking that ``placeholder``'s input is what the export saw
    (``val``): a tensor's shape and dtype, or the value itself."""
    # Named for the input, so the checks' own names stay free for the functions.
    name = f"check_{placeholder.name}"
    if isinstance(val, torch.Tensor):
        shape = tuple(_static_or_text(size) for size in val.shape)
        args = (placeholder, shape, val.dtype, placeholder.name)
        graph.create_node("call_function", check_tensor, args, {}, name=name)
    else:
        graph.create_node(
            "call_function", check_value, (placeholder, val, placeholder.name), {}, name=name
        )


def _static_or_text(size: Any) -> int | str:
    """A size as ``check_tensor`` takes it: an int, or a symbolic size's expression as text."""
    expr = size_expr(size)
    return int(size) if expr is None else str(expr)


def add_input_checks(
    graph: Graph,
    inputs: dict[Node, Node],
    ranges: dict[Any, tuple[int, int | None, str | None]],
) -> None:
    """The checks an exported module runs on its inputs: one per input (``add_input_check``)
    against the export's placeholder it stands for (``inputs``: exported -> new), then one
    of the symbolic sizes against each other and ``ranges`` (``add_size_check``)."""
    for old, new in inputs.items():
        add_input_check(graph, new, old.meta.get("val"))
    vals = [old.meta.get("val") for old in inputs]
    add_size_check(graph, list(inputs.values()), vals, ranges)
