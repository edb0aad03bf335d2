"""Adding the checks an exported module runs on its inputs: the program is only sound for inputs like the examples.

``ExportedProgram.module()`` calls one per input before anything else, so a
tensor of another shape or dtype, or another value for an input that export
fixed (an int, a flag), fails with a message naming the input rather than
computing something else; ``ExportedCodeGen`` flattens the inputs with
``flatten_inputs``, which does the same for their structure. The checks
themselves are shared with symbolic tracing (``fxloom.runtime_checks``). A
dimension exported as dynamic is any size there (``check_tensor`` takes its
expression as text); ``size_checks.check_sizes``, added by ``add_size_check``,
then checks the symbolic sizes against each other and their ranges.

Depends on ``fxloom.runtime_checks``, ``fxloom.pytree_codegen`` and ``fxloom.values.symbolic.size_checks``.
"""

from __future__ import annotations

from typing import Any

import torch

from fxloom.graph import Graph
from fxloom.node import Node
from fxloom.pytree_codegen import PyTreeCodeGen
from fxloom.runtime_checks import check_tensor, check_value, flatten_inputs
from fxloom.values.symbolic.size_checks import add_size_check
from fxloom.values.symbolic_scalars import symbolic_expr

__all__ = ["ExportedCodeGen", "add_input_check", "add_input_checks", "add_size_check"]


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
    expr = symbolic_expr(size)
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
