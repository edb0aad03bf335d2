"""Submodules kept as instance attributes too, so generated ``self.layer1.conv1`` costs dict lookups.

``nn.Module`` holds submodules in ``_modules`` and returns them from
``__getattr__``, which Python calls only after the normal lookup has failed:
each part of a path like ``getattr(self.layers, "0").conv1`` raises and
catches an ``AttributeError`` (~0.8 us). Generated code reads such paths on
every call; at batch 1 that was a fifth of a small MLP's forward.

For the modules fxloom owns — a ``GraphModule`` and the empty parent modules
it creates for qualified paths — ``_modules`` is a ``MirroredModules``: every
write to it is repeated in the owner's ``__dict__``, where the normal lookup
finds the submodule at once. ``nn.Module`` keeps a name out of ``__dict__``
while it is in ``_modules`` (assignment and deletion go through ``_modules``),
so a name in both is always a mirror; a name the class defines (``forward``,
``train``) is never mirrored, so looking it up behaves as before. A copied or
unpickled module gets its own ``MirroredModules``, mirroring into the copy.

Depends on torch only.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import torch

__all__ = ["MirroredModules", "mirror", "without_mirrors"]


class MirroredModules(dict):
    """An owner's ``_modules`` that repeats each write in the owner's ``__dict__``."""

    __slots__ = ("_owner",)

    def __init__(self, owner: torch.nn.Module, modules: dict[str, Any]) -> None:
        super().__init__(modules)
        self._owner = weakref.ref(owner)  # the owner holds this dict: no cycle
        for name, module in modules.items():
            self._mirror(name, module)

    def _mirror(self, name: str, module: Any) -> None:
        owner = self._owner()
        if owner is not None and not hasattr(type(owner), name):
            owner.__dict__[name] = module

    def _unmirror(self, name: str) -> None:
        owner = self._owner()
        if owner is not None:
            owner.__dict__.pop(name, None)

    def __setitem__(self, name: str, module: Any) -> None:
        super().__setitem__(name, module)
        self._mirror(name, module)

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self._unmirror(name)

    def pop(self, name: str, *default: Any) -> Any:
        if name in self:
            self._unmirror(name)
        return super().pop(name, *default)

    def popitem(self) -> tuple[str, Any]:
        name, module = super().popitem()
        self._unmirror(name)
        return name, module

    def clear(self) -> None:
        for name in self:
            self._unmirror(name)
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        for name, module in dict(*args, **kwargs).items():
            self[name] = module

    def setdefault(self, name: str, default: Any = None) -> Any:
        if name not in self:
            self[name] = default
        return self[name]

    def __ior__(self, other: Any) -> MirroredModules:
        self.update(other)
        return self

    # Copies follow their owner: copying or pickling a module copies its __dict__ (this
    # dict with it), and the copy mirrors into the owner's copy, which exists by then.
    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        owner = self._owner()
        copied_owner = memo.get(id(owner)) if owner is not None else None
        modules = copy.deepcopy(dict(self), memo)
        if copied_owner is None:
            return modules
        return MirroredModules(copied_owner, modules)

    def __reduce__(self) -> tuple:
        owner = self._owner()
        if owner is None:
            return (dict, (dict(self),))
        return (MirroredModules, (owner, dict(self)))


def mirror(module: torch.nn.Module) -> None:
    """Make ``module``'s ``_modules`` a ``MirroredModules`` (once)."""
    modules = module.__dict__["_modules"]
    if type(modules) is not MirroredModules:
        module.__dict__["_modules"] = MirroredModules(module, modules)


def without_mirrors(state: dict[str, Any]) -> dict[str, Any]:
    """A module's ``__dict__`` without mirrors, its ``_modules`` a plain dict (to copy or pickle)."""
    modules = state["_modules"]
    stripped = {key: value for key, value in state.items() if key not in modules}
    stripped["_modules"] = dict(modules)
    return stripped
