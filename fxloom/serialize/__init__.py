"""Saving and loading captured programs safely: ``save``, ``load``, ``register_serializable``.

A saved file is a zip of JSON (the graph, the module tree, node meta) and
safetensors (the weights); see ``archive`` for the layout, ``graphs``,
``modules``, ``values`` and ``meta`` for the documents, and ``allowlist`` for
what a file may name. Loading never unpickles and never runs code from the
file. ``fxloom.export.save``/``load`` do the same for exported programs.
"""

from __future__ import annotations

from fxloom.serialize.allowlist import register_serializable
from fxloom.serialize.archive import FORMAT_VERSION
from fxloom.serialize.errors import DisallowedNameError, SerializationError
from fxloom.serialize.graph_module_files import load, save

__all__ = [
    "save",
    "load",
    "register_serializable",
    "SerializationError",
    "DisallowedNameError",
    "FORMAT_VERSION",
]
