"""What symbolic tracing patches while it runs, and how it puts everything back.

``Patcher`` records each attribute or global it replaces and restores them all,
in reverse order, whatever happens; ``wrap`` registers the module-level
functions that tracing records as calls instead of running.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "MISSING",
    "Patcher",
    "capturing",
    "original_module_call",
    "original_module_getattr",
    "unwrapped",
    "wrap",
    "wrapped_names",
]

# (globals dict, name) of every function registered with ``wrap``.
wrapped_names: dict[tuple[int, str], tuple[dict[str, Any], str]] = {}


def wrap(fn_or_name: str | Callable[..., Any]) -> Any:
    """Make a global function a leaf of symbolic tracing: calls become ``call_function`` nodes.

    Call at module scope, with the function's name or the function itself, or
    use as a decorator::

        fxloom.wrap("len")            # len(proxy) is recorded, not refused

        @fxloom.wrap
        def my_kernel(x, k): ...      # traced code calls it; the graph shows the call
    """
    frame = sys._getframe(1)
    if frame.f_code.co_name != "<module>":
        raise RuntimeError(
            "fxloom.wrap must be called at the top level of a module, where the "
            f"function's global name is visible (called from {frame.f_code.co_name!r})"
        )
    name = fn_or_name if isinstance(fn_or_name, str) else getattr(fn_or_name, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"fxloom.wrap needs a named global function, got {fn_or_name!r}")
    globals_dict = frame.f_globals
    wrapped_names[(id(globals_dict), name)] = (globals_dict, name)
    return fn_or_name


class Patcher:
    """Records every attribute/global it replaces and puts them all back on exit."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any, bool]] = []
        self._patched: set[tuple[int, str]] = set()

    def patch_attr(self, owner: Any, name: str, replacement: Any) -> None:
        key = (id(owner), name)
        if key in self._patched:
            return
        self._patched.add(key)
        self._undo.append((owner, name, owner.__dict__.get(name, MISSING), False))
        setattr(owner, name, replacement)

    def remember_attr(self, module: torch.nn.Module, name: str) -> None:
        """Note a module attribute about to be assigned, to put it back on restore."""
        key = (id(module), name)
        if key in self._patched:
            return
        self._patched.add(key)
        try:
            previous = (
                original_module_getattr(module, name)
                if name not in module.__dict__
                else module.__dict__[name]
            )
        except AttributeError:
            previous = MISSING
        self._undo.append((module, name, previous, False))

    def patch_global(self, globals_dict: dict[str, Any], name: str, replacement: Any) -> None:
        key = (id(globals_dict), name)
        if key in self._patched:
            return
        self._patched.add(key)
        self._undo.append((globals_dict, name, globals_dict.get(name, MISSING), True))
        globals_dict[name] = replacement

    def restore(self) -> None:
        while self._undo:
            owner, name, original, is_dict = self._undo.pop()
            if is_dict:
                if original is MISSING:
                    owner.pop(name, None)
                else:
                    owner[name] = original
            elif original is MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._patched.clear()


MISSING = object()
original_module_call = torch.nn.Module.__call__
original_module_getattr = torch.nn.Module.__getattr__


def capturing() -> bool:
    return True


def unwrapped(fn: Any) -> Any:
    """The function behind one of our tracing wrappers (a trace started inside a trace)."""
    while hasattr(fn, "__fxloom_original__"):
        fn = fn.__fxloom_original__
    return fn
