"""Tensors (and torchbind objects) a trace meets that the root does not hold: captured as graph constants.

A tensor reached from a global, a closure or a module made during forward
becomes ``get_attr _tensor_constantN``; the tensor itself goes into
``Graph.constants`` (see ``fxloom.graph``), never onto the user's module, and
the ``GraphModule`` built from the graph holds it as a buffer. The same
tensor met twice is one constant. This is the only writer of ``Graph.constants``.

Where torch.fx sets each constant on the root module, fxloom notes it beside the
root instead (``fxloom.graph_module.captured_on``, weakly keyed by the root): so the constants of
several traces of one root get distinct names, as in torch.fx, and code written
for torch.fx that copies a graph's ``get_attr`` targets from the root
(``fxloom.graph_module._copy_attr``, torchvision's ``DualGraphModule``) finds them.

Depends on ``fxloom.graph`` (the constants' home) only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fxloom import attr_path
from fxloom.graph_module import captured_on

if TYPE_CHECKING:
    from fxloom.graph import Graph

__all__ = ["TensorConstants"]


class TensorConstants:
    """The constants one tracer adds to ``graph``; ``names_by_id`` is ``Tracer.tensor_attrs``."""

    __slots__ = ("graph", "root", "names_by_id")

    def __init__(self, graph: Graph, root: torch.nn.Module) -> None:
        self.graph = graph
        self.root = root
        # id(tensor) -> its constant's name; the graph holds the tensor, so the id stays valid.
        # (A graph may arrive with constants: a deep-copied tracer's.)
        self.names_by_id: dict[int, str] = {id(t): n for n, t in graph.constants.items()}

    def name_for(
        self, value: torch.Tensor | torch.ScriptObject, prefix: str = "_tensor_constant"
    ) -> str:
        """The ``get_attr`` target of ``value`` (a tensor, or a torchbind object with
        ``prefix="_torchbind_obj"``), capturing it on first sight."""
        name = self.names_by_id.get(id(value))
        if name is None:
            name = self._free_name(prefix)
            self.graph.constants[name] = value
            self.names_by_id[id(value)] = name
            captured_on(self.root)[name] = value
        return name

    def _free_name(self, prefix: str) -> str:
        """``<prefix>N`` for the first N that names nothing in the graph or on the root yet."""
        taken = self.graph.constants.keys() | captured_on(self.root).keys()
        return attr_path.free_name(self.root, prefix, taken=taken, start=len(taken))
