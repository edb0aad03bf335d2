"""Replacing attributes and globals for the length of a trace, and putting every one back.

``Patcher`` records what it replaces and restores it all, in reverse order,
whatever happened in between. Also here: nn.Module's own ``__call__`` and
``__getattr__`` as they were before any trace (tracing patches module classes,
and runs these originals where a module must run eagerly). Depends on torch only.
"""

from __future__ import annotations

from types import BuiltinFunctionType
from typing import Any

import torch

__all__ = ["MISSING", "Patcher", "original_module_call", "original_module_getattr", "unwrapped"]

MISSING = object()  # "there was no such attribute or global": delete it on restore
_MANY = object()  # the name of a patch_namespace undo entry: its original is a dict of them
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

    def patch_namespace(self, namespace: dict[str, Any], replacements: dict[str, Any]) -> None:
        """``patch_global`` for many names of one namespace at once (one undo entry).

        For a plain Python module, ``vars(module)`` is its namespace: an
        autowrap module (``math``) has dozens of functions to patch on every
        trace, and one bulk update costs a fraction of as many ``setattr`` calls.
        """
        namespace_id = id(namespace)
        fresh = {
            name: value
            for name, value in replacements.items()
            if (namespace_id, name) not in self._patched
        }
        if not fresh:
            return
        self._patched.update((namespace_id, name) for name in fresh)
        originals = {name: namespace.get(name, MISSING) for name in fresh}
        self._undo.append((namespace, _MANY, originals, True))
        namespace.update(fresh)

    def restore(self) -> None:
        while self._undo:
            owner, name, original, is_dict = self._undo.pop()
            if name is _MANY:
                owner.update(original)
                for each, value in original.items():
                    if value is MISSING:
                        del owner[each]
            elif is_dict:
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
    if type(fn) is BuiltinFunctionType:  # no attributes of its own: no wrapper (most asked)
        return fn
    while hasattr(fn, "__fxloom_original__"):
        fn = fn.__fxloom_original__
    return fn
