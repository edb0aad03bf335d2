"""Where the root's modules, parameters and buffers are: lookups by identity and by qualified name.

Built once per trace; the indexes nobody may need (parameters by identity,
modules by name) are built on first use. Depends on ``patcher`` (the
unpatched ``nn.Module.__getattr__``) only.
"""

from __future__ import annotations

from typing import Any

import torch

from fxloom import attr_path

__all__ = ["RootIndex"]


class RootIndex:
    """Lookups into one root module; ``submodule_paths`` is ``Tracer.submodule_paths``."""

    __slots__ = (
        "root",
        "submodule_paths",
        "_tensor_paths",
        "_script_object_paths",
        "_scripted_modules",
        "_modules_by_path",
    )

    def __init__(self, root: torch.nn.Module) -> None:
        self.root = root
        # module -> qualified name (the first, when a module is reachable by several).
        self.submodule_paths: dict[torch.nn.Module, str] = _first_paths(root)
        self._tensor_paths: dict[int, str] | None = None
        self._script_object_paths: dict[int, str] | None = None
        self._scripted_modules: dict[torch.ScriptModule, str] | None = None
        self._modules_by_path: dict[str, torch.nn.Module] | None = None

    def tensor_path(self, tensor: torch.Tensor) -> str | None:
        """The qualified name of ``tensor`` if it is a parameter or buffer of the root.

        The index is built on first need (often never: the layers owning the
        parameters are usually leaves).
        """
        index = self._tensor_paths
        if index is None:
            index = {}
            named = (
                *self.root.named_parameters(remove_duplicate=False),
                *self.root.named_buffers(remove_duplicate=False),
            )
            for name, value in named:
                index.setdefault(id(value), name)
            self._tensor_paths = index
        return index.get(id(tensor))

    def script_object_path(self, obj: torch.ScriptObject) -> str | None:
        """The qualified name of torchbind object ``obj`` if a module of the root holds it.

        Built on first need: torchbind attributes (packed quantized weights,
        custom C++ classes) are plain attributes, found in the modules' ``__dict__``.
        A TorchScript submodule's C++ half (its ``_c``, the owner of its methods)
        stands for the submodule itself: the graph holds the module, which can be
        copied as modules are.
        """
        if isinstance(obj, torch.ScriptModule):
            # Each read of ``_c`` (or of a method's ``owner``) makes a new Python object for
            # the same C++ module; those compare and hash by the module.
            return self._scripted_module_paths().get(obj)
        index = self._script_object_paths
        if index is None:
            index = {}
            for module, path in self.submodule_paths.items():
                for name, value in vars(module).items():
                    if isinstance(value, torch.ScriptObject):
                        index.setdefault(id(value), f"{path}.{name}" if path else name)
            self._script_object_paths = index
        return index.get(id(obj))

    def _scripted_module_paths(self) -> dict[torch.ScriptModule, str]:
        index = self._scripted_modules
        if index is None:
            index = {}
            for module, path in self.submodule_paths.items():
                inner = vars(module).get("_c")
                if path and isinstance(inner, torch.ScriptModule):
                    index.setdefault(inner, path)
            self._scripted_modules = index
        return index

    def module_at(self, path: str) -> torch.nn.Module:
        """The submodule at qualified name ``path``."""
        modules = self._modules_by_path
        if modules is None:
            modules = self._modules_by_path = {p: m for m, p in self.submodule_paths.items()}
        module = modules.get(path)
        return module if module is not None else attr_path.get(self.root, path)

    def value_at(self, path: str) -> Any:
        """The attribute of the root at dotted ``path``, read without any tracing patch."""
        # attr_path reads a module's own tables and __dict__ before any __getattr__, so the
        # patched one (which would answer with proxies) is never asked for what exists.
        return attr_path.get(self.root, path)


def _first_paths(root: torch.nn.Module) -> dict[torch.nn.Module, str]:
    """Each module under ``root`` (``""`` for itself) -> its first qualified name, in
    ``named_modules`` order.

    A walk of ``_modules`` with a stack: ``named_modules`` nests a generator per
    level, and every trace builds this. A module reached again (shared, or a
    cycle) is not entered again: everything under it already has a name.
    """
    paths: dict[torch.nn.Module, str] = {}
    stack = [(root, "")]
    while stack:
        module, path = stack.pop()
        if module in paths:
            continue
        paths[module] = path
        children = module._modules
        if children:
            prefix = f"{path}." if path else ""
            stack.extend(
                [
                    (child, prefix + name)
                    for name, child in reversed(children.items())
                    if child is not None
                ]
            )
    return paths
