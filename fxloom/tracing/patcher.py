"""Replacing attributes and globals for the length of a trace, and putting every one back.

``Patcher`` records what it replaces and restores it all, in reverse order,
whatever happened in between. Also here: nn.Module's own ``__call__`` and
``__getattr__`` as they were before any trace (tracing patches module classes,
and runs these originals where a module must run eagerly). Depends on torch only.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MISSING", "Patcher", "original_module_call", "original_module_getattr", "unwrapped"]

MISSING = object()  # "there was no such attribute or global": delete it on restore
original_module_call = torch.nn.Module.__call__
original_module_getattr = torch.nn.Module.__getattr__


class Patcher:
    """Records every attribute/global it replaces and puts them all back on ``restore``.

    Each (owner, name) is recorded once: patching it again while patched keeps
    the first original.
    """

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


def unwrapped(fn: Any) -> Any:
    """The function behind one of our tracing wrappers (a trace started inside a trace)."""
    while hasattr(fn, "__fxloom_original__"):
        fn = fn.__fxloom_original__
    return fn
