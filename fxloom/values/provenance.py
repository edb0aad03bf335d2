"""Where each recorded operator came from: the spec's node metadata, gathered while export runs.

Export records operators far below the user's code, so it watches three
things as the program runs and stamps them on every node:

* ``stack_trace`` and ``source_location``: the user's frames (torch's and fxloom's own
  are left out), formatted like a traceback, and the innermost as fields (``SourceStamper``,
  which symbolic tracing stamps with too);
* ``nn_module_stack``: the modules whose forward is running, ``{path: (path,
  class)}`` outermost first (module hooks);
* ``source_fn_stack`` and ``torch_fn``: the torch-level function the user
  called (``torch.nn.functional.linear``, ``Tensor.add``), or the torch.nn
  module that called it, before it broke into operators (a torch-function
  mode).

``stamp_node`` writes these keys for every frontend (symbolic tracing and ``fxloom.compile``
find the facts their own way, and stamp them through it too).

Depends on ``fxloom.source_location``, ``fxloom.values.module_stack`` and ``fxloom.values.frames``.
"""

from __future__ import annotations

import linecache
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from fxloom.source_location import SourceLocation, format_stack_trace
from fxloom.values.frames import is_library
from fxloom.values.module_stack import ModuleStack

__all__ = [
    "WHERE_KEYS",
    "PROVENANCE_KEYS",
    "Provenance",
    "SourceStamper",
    "location_of",
    "stamp_node",
    "stamp_source",
]

_TORCH_NN = "torch.nn."

# The keys ``stamp_node`` writes, for the passes that copy them onto a node made in another's
# place. Where a node came from: what any node standing for it inherits (an item of a result,
# a replacement's nodes) ...
WHERE_KEYS = ("stack_trace", "source_location", "nn_module_stack")
# ... and what made it, which a node computing the same thing keeps (a moved or rerun node).
PROVENANCE_KEYS = (*WHERE_KEYS, "source_fn_stack")


class SourceStamper:
    """The one stamper of where a node came from: ``meta["stack_trace"]`` (the user's frames as a
    traceback prints them) and ``meta["source_location"]`` (the innermost, as fields).

    ``is_machinery(filename)`` says which frames are not the user's (``frames.is_plumbing`` for
    symbolic tracing, the stricter ``frames.is_library`` below the dispatcher, where export
    records); the walk stops at ``stop`` (the caller of the frontend) and after ``limit`` user
    frames. A stack seen before is formatted once.
    """

    def __init__(
        self,
        is_machinery: Callable[[str], bool],
        stop: types.FrameType | None = None,
        limit: int | None = None,
    ) -> None:
        self._is_machinery = is_machinery
        self._stop = stop
        self._limit = limit
        self._seen: dict[tuple, tuple[str, SourceLocation | None]] = {}

    def stamp(self, meta: dict[str, Any], skip: int = 0) -> None:
        """Stamp the user's frames on ``meta``, looked for from ``skip`` frames above the caller."""
        stamp_source(meta, *self.locate(skip + 1))

    def locate(self, skip: int = 0) -> tuple[str, SourceLocation | None]:
        """``(stack trace text, innermost location)`` of the user's frames, looked for from
        ``skip`` frames above the caller."""
        frames = self._user_frames(sys._getframe(skip + 1))
        key = tuple((frame.f_code, frame.f_lineno) for frame in frames)
        found = self._seen.get(key)
        if found is None:
            locations = [location_of(f.f_code, f.f_lineno, f.f_globals) for f in reversed(frames)]
            innermost = locations[-1] if locations else None
            found = self._seen[key] = (format_stack_trace(locations), innermost)
        return found

    def _user_frames(self, frame: types.FrameType | None) -> list[types.FrameType]:
        """The user's frames from ``frame`` outwards, innermost first."""
        frames: list[types.FrameType] = []
        while frame is not None and frame is not self._stop:
            if not self._is_machinery(frame.f_code.co_filename):
                frames.append(frame)
                if len(frames) == self._limit:
                    break
            frame = frame.f_back
        return frames


def stamp_node(
    meta: dict[str, Any],
    *,
    modules: dict[str, tuple[str, type]] | None,
    made_by: tuple[str, Any] | None = None,
    source: tuple[str, SourceLocation | None] | None = None,
) -> None:
    """Write the metadata every frontend gives a recorded node on its ``meta``, the one place
    each key is spelled: ``nn_module_stack`` (``modules``, the ``ModuleStack.entries`` the node
    was recorded inside, outermost first; None: the node gets none, as placeholders of
    symbolic tracing), ``source_fn_stack`` (``made_by``: ``(name, the function or module
    class that made it)``) and, from ``source`` (``SourceStamper.locate``'s pair),
    ``stack_trace`` and ``source_location``.

    Symbolic tracing (``Tracer.create_node``), export (``Provenance.stamp``) and
    ``fxloom.compile`` (``GraphBuilder``) all stamp through here; what differs between them is
    only how each finds the three facts."""
    if modules is not None:
        meta["nn_module_stack"] = modules
    if made_by is not None:
        meta["source_fn_stack"] = [made_by]
    if source is not None:
        stamp_source(meta, *source)


def stamp_source(meta: dict[str, Any], text: str, innermost: SourceLocation | None) -> None:
    """Write where a node came from on its ``meta``: the frames' text as ``stack_trace`` (for
    torch.fx's readers) and the innermost frame as ``source_location`` (for fxloom's).

    Every frontend stamps through here: ``SourceStamper`` for those that run the user's Python
    frames, and directly a frontend that knows its frames otherwise (by code and line)."""
    meta["stack_trace"] = text
    if innermost is not None:
        meta["source_location"] = innermost


def location_of(
    code: types.CodeType, line: int, module_globals: dict[str, Any] | None = None
) -> SourceLocation:
    """The frame running ``code`` at ``line`` as a ``SourceLocation``, its source line read
    through ``linecache`` (``module_globals`` finds the source of a module loaded by a loader)."""
    source = linecache.getline(code.co_filename, line, module_globals).strip()
    return SourceLocation(code.co_filename, line, code.co_name, source)


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
        # Below the dispatcher all of torch is library; frames from ``stop`` outwards are the
        # caller of export, not the program.
        self.sources = SourceStamper(is_library, stop=stop)
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
        meta: dict[str, Any] = {}
        where = self.sources.locate(skip=1)
        stamp_node(meta, modules=self.modules.entries, made_by=self._source_fn(), source=where)
        fn = self.torch_fn
        if fn is not None:
            meta["torch_fn"] = (self._fn_name(fn), _qualified(fn))
        return meta

    def stack_trace(self) -> str:
        """The user's frames running now, for an error message."""
        return self.sources.locate(skip=2)[0]

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


def _qualified(fn: Any) -> str:
    owner = getattr(fn, "__objclass__", None) or getattr(fn, "__self__", None)
    owner_name = getattr(owner, "__name__", None) or getattr(fn, "__module__", None) or "torch"
    return f"{owner_name}.{getattr(fn, '__name__', type(fn).__name__)}"
