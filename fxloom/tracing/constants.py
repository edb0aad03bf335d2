"""Tensors a trace meets that are not the root's parameters or buffers: captured as graph constants.

A tensor reached from a global, a closure or a module made during forward
becomes ``get_attr _tensor_constantN``; the tensor itself goes into
``Graph.constants`` (see ``fxloom.graph``), never onto the user's module, and
the ``GraphModule`` built from the graph holds it as a buffer. The same
tensor met twice is one constant. This is the only writer of ``Graph.constants``.

Depends on ``fxloom.graph`` (the constants' home) only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fxloom import attr_path

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

    def name_for(self, tensor: torch.Tensor) -> str:
        """The ``get_attr`` target of ``tensor``, capturing it on first sight."""
        name = self.names_by_id.get(id(tensor))
        if name is None:
            name = self._free_name()
            self.graph.constants[name] = tensor
            self.names_by_id[id(tensor)] = name
        return name

    def _free_name(self) -> str:
        """``_tensor_constantN`` for the first N that names nothing in the graph or on the root yet."""
        constants = self.graph.constants
        return attr_path.free_name(
            self.root, "_tensor_constant", taken=constants, start=len(constants)
        )
