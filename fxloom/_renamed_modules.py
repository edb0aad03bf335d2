"""fxloom's modules that moved, still found under their old names: a pickle made before a move
names the old one.

A pickle names each function and class it needs by module and attribute (a stand-in tensor in a
node's ``meta["val"]`` pickles as ``fxloom.export.stand_in._rebuild``, its module before
issue 23 moved it to ``fxloom.values``), and loading imports that module by name. A finder at
the end of ``sys.meta_path`` (consulted only after every real module was looked for) answers an
old name with the module that now holds the code, the same module object, so what loads is
what fxloom defines today::

    >>> import importlib
    >>> importlib.import_module("fxloom.export.stand_in") is importlib.import_module(
    ...     "fxloom.values.stand_in"
    ... )
    True

When moving a module, add a row to ``RENAMED_MODULES`` (a package's row covers its modules).

Depends on nothing of fxloom (it imports the new modules by the names in the table).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

__all__ = ["RENAMED_MODULES", "install", "new_name"]

# old module or package -> where it lives now
RENAMED_MODULES: dict[str, str] = {
    # issue 23: the frontend-neutral layer of values (fxloom/values)
    "fxloom.export.stand_in": "fxloom.values.stand_in",
    "fxloom.export.provenance": "fxloom.values.provenance",
    "fxloom.export.symbolic": "fxloom.values.symbolic",
    "fxloom.tracing.frames": "fxloom.values.frames",
    "fxloom.tracing.fx_interop": "fxloom.values.fx_interop",
    "fxloom.tracing.metadata_mode": "fxloom.values.metadata_mode",
    "fxloom.tracing.module_stack": "fxloom.values.module_stack",
    # issue 23: the size files, frontend-neutral ones with the shape environment, the rest of
    # export's dynamic shapes under fxloom/export/sizes
    "fxloom.export.size_trees": "fxloom.values.symbolic.size_trees",
    "fxloom.export.size_nodes": "fxloom.values.symbolic.size_nodes",
    "fxloom.export.size_checks": "fxloom.values.symbolic.size_checks",
    "fxloom.export.shape_report": "fxloom.values.symbolic.shape_report",
    "fxloom.export.dims": "fxloom.values.symbolic.dims",
    "fxloom.export.dynamic_shapes": "fxloom.values.symbolic.dynamic_shapes",
    "fxloom.export.input_sizes": "fxloom.values.symbolic.input_sizes",
    "fxloom.export.data_dependent": "fxloom.values.symbolic.data_dependent",
    "fxloom.export.runtime_asserts": "fxloom.export.sizes.runtime_asserts",
    # issue 35: the size vocabulary (Dim, the dynamic_shapes argument, input sizes, sizes read
    # from data) under every frontend, so that fxloom.compile uses it without export
    "fxloom.export.sizes.dims": "fxloom.values.symbolic.dims",
    "fxloom.export.sizes.dynamic_shapes": "fxloom.values.symbolic.dynamic_shapes",
    "fxloom.export.sizes.input_sizes": "fxloom.values.symbolic.input_sizes",
    "fxloom.export.sizes.data_dependent": "fxloom.values.symbolic.data_dependent",
}


def new_name(name: str) -> str | None:
    """Where the module once called ``name`` lives now, or None if it never moved."""
    for old, new in RENAMED_MODULES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _Renamed(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name; loading it puts the module of the new name in its place."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if new_name(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder module, replaced by exec_module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system returns whatever sys.modules holds under the name once this
        # returns: the moved module itself, its own __spec__ untouched.
        sys.modules[module.__name__] = importlib.import_module(new_name(module.__name__))
        # An old name that is now a public name of its package (``fxloom.export.dims``,
        # a function) stays the function: the package's names are a lazy table
        # (``fxloom._lazy``), which keeps a name when the import system sets it to a module.


def install() -> None:
    """Put the finder last on ``sys.meta_path`` (once; ``import fxloom`` does this)."""
    if not any(isinstance(finder, _Renamed) for finder in sys.meta_path):
        sys.meta_path.append(_Renamed())
