"""Checks an exported module runs on its inputs: the program is only sound for inputs like the examples.

``ExportedProgram.module()`` calls one per input before anything else, so a
tensor of another shape or dtype, or another value for an input that export
fixed (an int, a flag), fails with a message naming the input rather than
computing something else.

``flatten_inputs`` does the same for the structure of the inputs (the
module takes the nested inputs the program was exported with).

Depends on ``fxloom.ops.mutation``, ``fxloom.pytree`` and ``fxloom.pytree_codegen``.
"""

from __future__ import annotations

from typing import Any

import torch

from fxloom import pytree
from fxloom.graph import Graph
from fxloom.node import Node
from fxloom.ops.mutation import READ_ONLY_EFFECTS, has_side_effect
from fxloom.pytree_codegen import PyTreeCodeGen

__all__ = ["check_tensor", "check_value", "add_input_check", "flatten_inputs", "ExportedCodeGen"]


@has_side_effect
def check_tensor(value: Any, shape: tuple[int, ...], dtype: torch.dtype, name: str) -> None:
    """Raise unless ``value`` is a tensor of ``shape`` and ``dtype``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"input {name!r}: the program was exported with a tensor here, got "
            f"{type(value).__name__}"
        )
    if value.dtype != dtype:
        raise TypeError(
            f"input {name!r}: the program was exported with dtype {dtype}, got {value.dtype}"
        )
    if tuple(value.shape) != shape:
        differing = [
            f"dimension {dim}: {got} instead of {expected}"
            for dim, (expected, got) in enumerate(zip(shape, value.shape))
            if expected != got
        ]
        where = f" ({differing[0]})" if differing else ""
        raise ValueError(
            f"input {name!r}: the program was exported for shape {list(shape)}, got "
            f"{list(value.shape)}{where}; export again with an example of this shape (dynamic "
            "shapes are not supported yet)"
        )


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
        args = (placeholder, tuple(val.shape), val.dtype, placeholder.name)
        graph.create_node("call_function", check_tensor, args, {}, name=name)
    else:
        graph.create_node(
            "call_function", check_value, (placeholder, val, placeholder.name), {}, name=name
        )
