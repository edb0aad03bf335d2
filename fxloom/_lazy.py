"""Packages whose public names load their modules when first read (PEP 562).

``import fxloom`` imports the core only; ``fxloom.export``, ``fxloom.distributed`` and the
rest name what they offer in a table, name -> the module that defines it, and each name's
module is imported the first time the name is read::

    _LAZY = {"pipeline": "fxloom.distributed.pipeline", ...}
    __getattr__, __dir__ = lazy_names(__name__, _LAZY)

A name shared with the module that defines it (``fxloom.distributed.pipeline``, the function
and the module) stays the name's value when that module is imported by path: the import
system sets the package's attribute to the module, which the package class installed here
turns back into the name.

Depends on nothing of fxloom.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, table: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose names ``table`` maps to the
    modules defining them; also keeps a name shared with its module the name's value."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's own name
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted({*namespace, *table})

    sys.modules[package].__class__ = _LazyPackage
    namespace["_lazy_table"] = table
    return __getattr__, __dir__


class _LazyPackage(types.ModuleType):
    """A package whose public name is never replaced by the module of the same name."""

    def __setattr__(self, name: str, value: Any) -> None:
        table = vars(self).get("_lazy_table", {})
        if isinstance(value, types.ModuleType) and table.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)
