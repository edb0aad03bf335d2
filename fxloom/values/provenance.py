"""Where each recorded operator came from: the spec's node metadata, gathered while export runs.

Export records operators far below the user's code, so it watches three
things as the program runs and stamps them on every node:

* ``stack_trace``: the user's frames (torch's and fxloom's own are left out),
  formatted like a traceback;
* ``nn_module_stack``: the modules whose forward is running, ``{path: (path,
  class)}`` outermost first (module hooks);
* ``source_fn_stack`` and ``torch_fn``: the torch-level function the user
  called (``torch.nn.functional.linear``, ``Tensor.add``), or the torch.nn
  module that called it, before it broke into operators (a torch-function
  mode).

Depends on ``fxloom.values.module_stack`` and ``fxloom.values.frames``.
"""

from __future__ import annotations

import linecache
import sys
import types
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from fxloom.values.frames import is_library
from fxloom.values.module_stack import ModuleStack

__all__ = ["Provenance"]

_TORCH_NN = "torch.nn."


class _TorchFunctions(TorchFunctionMode):
    """Remembers the outermost torch function running (inner ones are not seen: the mode is off
    while its handler runs)."""

    def __init__(self, provenance: Provenance) -> None:
        super().__init__()
        self.provenance = provenance

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        provenance = self.provenance
        saved = provenance.torch_fn
        provenance.torch_fn = func
        try:
            return func(*args, **(kwargs or {}))
        finally:
            provenance.torch_fn = saved


class Provenance:
    """The metadata of the operator being recorded now; ``active()`` installs the watchers."""

    def __init__(self, root: torch.nn.Module, stop: types.FrameType | None) -> None:
        self.modules = ModuleStack()
        self.paths = {id(m): path for path, m in root.named_modules(remove_duplicate=False)}
        self.paths.pop(id(root), None)  # the root's own level has no entry, as in tracing
        self.torch_fn: Any = None
        self._stop = stop  # frames from here outwards are the caller of export, not the program
        self._traces: dict[tuple, str] = {}
        self._fn_counts: dict[str, int] = {}
        self._saved: list[Any] = []

    # ------------------------------------------------------------ watchers
    def active(self) -> _Active:
        return _Active(self)

    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        path = self.paths.get(id(module))
        self._saved.append(None if path is None else self.modules.enter(path, type(module)))

    def _leave_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        saved = self._saved.pop()
        if saved is not None:
            self.modules.leave(saved)

    # ------------------------------------------------------------ metadata
    def stamp(self) -> dict[str, Any]:
        """The metadata of an operator dispatched now (shared by the nodes it becomes)."""
        meta: dict[str, Any] = {
            "stack_trace": self.stack_trace(),
            "nn_module_stack": self.modules.entries,
        }
        source = self._source_fn()
        if source is not None:
            meta["source_fn_stack"] = [source]
        fn = self.torch_fn
        if fn is not None:
            meta["torch_fn"] = (self._fn_name(fn), _qualified(fn))
        return meta

    def stack_trace(self) -> str:
        frames = []
        frame = sys._getframe(2)
        while frame is not None and frame is not self._stop:
            if not is_library(frame.f_code.co_filename):
                frames.append((frame.f_code, frame.f_lineno, frame.f_globals))
            frame = frame.f_back
        key = tuple((code, line) for code, line, _ in frames)
        text = self._traces.get(key)
        if text is None:
            text = self._traces[key] = "".join(_format_frame(*f) for f in reversed(frames))
        return text

    def _source_fn(self) -> tuple[str, Any] | None:
        # Inside a torch.nn module (a leaf of the model's own code): that module made the op.
        path = self.modules.path
        cls = self.modules.class_of(path) if path else None
        if cls is not None and cls.__module__.startswith(_TORCH_NN):
            return path.replace(".", "_"), cls
        fn = self.torch_fn
        if fn is None:
            return None
        return self._fn_name(fn, count=False), fn

    def _fn_name(self, fn: Any, count: bool = True) -> str:
        name = getattr(fn, "__name__", type(fn).__name__).strip("_") or "fn"
        if not count:
            return name
        seen = self._fn_counts.get(name, 0)
        self._fn_counts[name] = seen + 1
        return name if not seen else f"{name}_{seen}"


class _Active:
    """Module hooks and the torch-function mode, installed for the duration of a ``with``."""

    def __init__(self, provenance: Provenance) -> None:
        self.provenance = provenance
        self.handles: list[Any] = []
        self.mode = _TorchFunctions(provenance)

    def __enter__(self) -> Provenance:
        hooks = torch.nn.modules.module
        self.handles = [
            hooks.register_module_forward_pre_hook(self.provenance._enter_module),
            hooks.register_module_forward_hook(self.provenance._leave_module, always_call=True),
        ]
        self.mode.__enter__()
        return self.provenance

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)
        for handle in self.handles:
            handle.remove()


def _format_frame(code: types.CodeType, lineno: int, globals_: dict) -> str:
    source = linecache.getline(code.co_filename, lineno, globals_).strip()
    return f'  File "{code.co_filename}", line {lineno}, in {code.co_name}\n    {source}\n'


def _qualified(fn: Any) -> str:
    owner = getattr(fn, "__objclass__", None) or getattr(fn, "__self__", None)
    owner_name = getattr(owner, "__name__", None) or getattr(fn, "__module__", None) or "torch"
    return f"{owner_name}.{getattr(fn, '__name__', type(fn).__name__)}"
