"""What one trace patches while the program runs, the gate that makes the patches stand aside, and the undo.

While a trace runs:

* the classes of the root's modules get a ``__call__`` that hands the call to
  ``Tracer.call_module`` (a class with a ``__call__`` of its own keeps it, and
  ``nn.Module.__call__``, which it reaches through ``super()``, is patched instead) and, where their modules hold parameters or buffers
  (or the class has a ``__getattr__`` of its own), a ``__getattr__`` that
  hands parameter reads to ``Tracer.getattr``; a class whose forward runs on
  proxies also gets a ``__setattr__`` that notes assignments of traced values,
  to undo them;
* functions registered with ``fxloom.wrap`` (or ``torch.fx.wrap``, see
  ``fxloom.values.fx_interop``) or ``wrap_library_function``, those of the
  autowrap modules (``math``) reached from the traced code's globals, TorchScript functions and
  torch's tensor factories are replaced by *recording wrappers*: called with a
  proxy (factories: called at all), they record a ``call_function`` instead of
  running;
* ``torch.vmap`` refuses proxies with a clear error;
* with example inputs, ``isinstance(x, torch.Tensor)`` answers True for a
  traced tensor in model and library code.

Each trace's ``Gate`` is open while the program is traced and closed while
example values are computed (``fxloom.tracing.examples``): then every patch
runs the original it replaced, as if no trace were running. ``TracePatches.restore``
puts everything back and removes traced values a module cached in a dict.

What libraries are told while a trace runs (``torch.compiler.is_compiling()``, torch.fx's
``is_fx_tracing()``) is no patch: the tracer captures inside ``fxloom.values.capturing``.

Depends on ``patcher``, ``wrapped``, ``fxloom.values.fx_interop``, ``fxloom.proxy`` and ``fxloom.pytree``.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import sys
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from fxloom.graph_module import GraphModule
from fxloom.ops.signatures import FORWARD_BINDING_CALLS
from fxloom.proxy import NO_VALUE, Proxy, tracer_of
from fxloom.pytree import tree_any
from fxloom.tracing.patcher import (
    Patcher,
    original_module_call,
    original_module_getattr,
    unwrapped,
)
from fxloom.tracing.wrapped import library_functions, register_library_leaves, wrapped_names
from fxloom.values.fx_interop import fx_wrapped_names

if TYPE_CHECKING:
    from fxloom.tracer import Tracer

__all__ = ["TENSOR_FACTORIES", "Gate", "TracePatches", "holds_proxy"]

# Tensor factories whose size/shape arguments may hold traced values.
TENSOR_FACTORIES = (
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
    "randint",
    "arange",
    "linspace",
    "eye",
    "tensor",
    "as_tensor",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
)

# nn.Module's own bookkeeping dicts (_modules, _parameters, hooks, ...): never caches.
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))


def _is_proxy(value: Any) -> bool:
    return isinstance(value, Proxy)


def holds_proxy(value: Any) -> bool:
    """Whether a traced value is somewhere inside ``value`` (a container, or the value itself)."""
    return tree_any(_is_proxy, value)


_builtin_isinstance = builtins.isinstance


def _names_tensor(classinfo: Any) -> bool:
    """Whether an ``isinstance`` question asks for ``torch.Tensor`` (alone or in a tuple)."""
    if classinfo is torch.Tensor:
        return True
    return type(classinfo) is tuple and torch.Tensor in classinfo


def _asked_by_torch_or_fxloom() -> bool:
    """Whether the caller of the patched ``isinstance`` (two frames up) is torch's or ours."""
    module = sys._getframe(2).f_globals.get("__name__", "")
    return module.partition(".")[0] in ("torch", "fxloom")


class Gate:
    """Whether one trace's patches record (open) or run the originals they replaced (closed).

    The example run closes it while it computes values: it runs real
    operations on real tensors, and the program must then behave as if no
    trace were running. The patches of the trace are built by ``route``; the
    recording wrappers, shared by all traces, read ``open`` of the trace they
    find at call time. Nothing else reads it, and only ``closed`` changes it.
    """

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open = True

    @contextlib.contextmanager
    def closed(self) -> Iterator[None]:
        was_open = self.open
        self.open = False
        try:
            yield
        finally:
            self.open = was_open

    def route(
        self, original: Callable[..., Any], while_open: Callable[..., Any]
    ) -> Callable[..., Any]:
        """A patch for ``original``: calls ``while_open`` while the gate is open, else ``original``."""
        gate = self

        def patched(*args: Any, **kwargs: Any) -> Any:
            if gate.open:
                return while_open(*args, **kwargs)
            return original(*args, **kwargs)

        patched.__fxloom_original__ = original  # type: ignore[attr-defined]
        return patched


# ------------------------------------------------------- recording wrappers
# Tracers currently running, innermost last (a trace may start inside another).
_active_tracers: list[Tracer] = []
# (original, always, method) -> its recording wrapper; made once, shared by all traces.
_recording_wrappers: dict[tuple[int, bool, bool], tuple[Any, Callable[..., Any]]] = {}


def recording(
    original: Callable[..., Any], always: bool = False, method: bool = False
) -> Callable[..., Any]:
    """``original``, but recorded as ``call_function`` when any argument is a proxy.

    The trace is the one the proxies belong to, else the innermost running.
    With ``always`` (tensor factories) every call made while tracing is
    recorded: a tensor made during tracing must be made afresh on every run,
    not frozen into a constant that in-place ops would change between calls.
    With ``method``, ``original`` is a ``__call__`` whose first argument is the
    callable object itself, which becomes the recorded target.
    """
    key = (id(original), always, method)  # by identity: some callables are unhashable
    cached = _recording_wrappers.get(key)
    if cached is not None:
        return cached[1]

    @functools.wraps(original)
    def record(*args: Any, **kwargs: Any) -> Any:
        found = tracer_of(args, kwargs)  # the tracer of a proxy among the arguments, if any
        tracer = found or (_active_tracers[-1] if _active_tracers else None)
        if tracer is None or not tracer._patches.gate.open:
            return original(*args, **kwargs)
        if always or found is not None:
            if method:
                return tracer.create_proxy("call_function", args[0], args[1:], kwargs)
            return tracer.create_proxy("call_function", original, args, kwargs)
        return original(*args, **kwargs)

    record.__fxloom_original__ = original  # type: ignore[attr-defined]
    _recording_wrappers[key] = (original, record)  # holding original keeps its id valid
    return record


def _autowrap_ids(tracer: Tracer) -> set[int]:
    """Identities of the functions recorded when given a proxy: autowrap modules' and functions,
    library functions (``wrap_library_function``) and the tensor factories. Originals, not our
    wrappers, even while another trace runs."""
    ids = {
        id(unwrapped(value))
        for module in tracer.autowrap_modules
        for value in vars(module).values()
        if callable(value) and not isinstance(value, type)
    }
    ids |= {id(unwrapped(fn)) for fn in tracer.autowrap_functions}
    register_library_leaves()  # declared ones, before reading the registry
    ids.update(library_functions)  # their originals: registered unwrapped
    ids |= {id(unwrapped(getattr(torch, name))) for name in TENSOR_FACTORIES}
    return ids


# ------------------------------------------------------------ one trace
class TracePatches:
    """Everything one trace patches, installed by ``install`` and put back by ``restore``."""

    def __init__(self, tracer: Tracer, parameter_proxies: dict[str, Proxy]) -> None:
        self.gate = Gate()
        self._tracer = tracer
        self._parameter_proxies = parameter_proxies  # handed to Tracer.getattr
        self._patcher = Patcher()
        self._autowrap_ids: set[int] = set()
        # id -> global name and original of every ``fxloom.wrap``ped function.
        self._wrapped: dict[int, tuple[str, Callable[..., Any]]] = {}
        self._scanned: set[int] = set()  # globals dicts and autowrap modules, once each
        self._watched_classes: set[type] = set()
        # Modules whose forward ran on proxies: their dict attributes may cache some.
        self.traced_modules: set[torch.nn.Module] = {tracer.root}

    def activate(self) -> None:
        """Make this trace the one recording wrappers record into when no proxy says otherwise."""
        _active_tracers.append(self._tracer)

    def install(self, fn_globals: dict[str, Any]) -> None:
        """Patch everything listed in the module docstring; ``fn_globals``: the traced function's globals."""
        tracer, patcher = self._tracer, self._patcher
        self._autowrap_ids = _autowrap_ids(tracer)
        module_call = functools.wraps(original_module_call)(
            self.gate.route(original_module_call, self._module_call)
        )
        module_getattr = functools.wraps(original_module_getattr)(
            self.gate.route(original_module_getattr, self._module_getattr)
        )
        # Patched on the classes of the root's modules, not on nn.Module: a class
        # attribute set on nn.Module invalidates the type caches of every module class
        # loaded (hundreds with transformers imported), which dominates small traces.
        # Replacing a class's special method costs microseconds (CPython updates the
        # slots of its subclasses), so __getattr__ is left alone on classes whose modules
        # here hold no parameter or buffer themselves: it would read nothing but submodules
        # and plain attributes, which tracing passes through unchanged.
        modules = tracer.submodule_paths
        holders = {type(module) for module in modules if module._parameters or module._buffers}
        for cls in {type(module) for module in modules}:
            if cls.__call__ in FORWARD_BINDING_CALLS:
                patcher.patch_attr(cls, "__call__", module_call)
            else:
                # A class's own __call__ runs, as under torch.fx (which patches only
                # nn.Module.__call__); the tracer takes over where it calls nn.Module's.
                patcher.patch_attr(torch.nn.Module, "__call__", module_call)
            if cls in holders or cls.__getattr__ is not original_module_getattr:
                patcher.patch_attr(cls, "__getattr__", module_getattr)
        self._watch_attribute_writes(type(tracer.root))
        self._wrap_registered()
        self._answer_tensor_isinstance()
        # A TorchScript function cannot take a Proxy: record its call instead.
        script_call = unwrapped(torch._C.ScriptFunction.__call__)
        patcher.patch_attr(torch._C.ScriptFunction, "__call__", recording(script_call, method=True))
        # Function transforms cannot batch a Proxy (torch would treat it as a tensor in
        # C++); refuse clearly instead.
        for owner in (torch, torch.func):
            transform = unwrapped(owner.vmap)
            patcher.patch_attr(owner, "vmap", self._refusing_transform(transform, "torch.vmap"))
        factories = {
            name: recording(unwrapped(getattr(torch, name)), always=True)
            for name in TENSOR_FACTORIES
        }
        patcher.patch_namespace(vars(torch), factories)  # torch is a plain module: as setattr
        self._autowrap_globals(fn_globals)
        if isinstance(tracer.root, GraphModule):
            self._wrap_in_generated_code(fn_globals)

    def _answer_tensor_isinstance(self) -> None:
        """With example inputs, ``isinstance(x, torch.Tensor)`` holds for a traced tensor.

        Libraries check it before they compute (torchvision's box decoding
        asserts it). Only Python's ``isinstance`` is patched, and it answers so
        only to code outside torch and fxloom: torch hands what it takes for a
        tensor to C++, which cannot take a Proxy (C++'s own checks never see this).
        """
        if self._tracer._example_run is None:
            return
        gate = self.gate

        def isinstance(obj: Any, classinfo: Any, /) -> bool:  # noqa: A001 - it stands in for it
            if (
                _builtin_isinstance(obj, Proxy)
                and gate.open
                and _names_tensor(classinfo)
                and obj._fxloom_value is not NO_VALUE
                and not _asked_by_torch_or_fxloom()
            ):
                return _builtin_isinstance(obj._fxloom_example, torch.Tensor)
            return _builtin_isinstance(obj, classinfo)

        isinstance.__fxloom_original__ = _builtin_isinstance  # type: ignore[attr-defined]
        self._patcher.patch_attr(builtins, "isinstance", isinstance)

    def _wrap_registered(self) -> None:
        """Record the functions registered with ``fxloom.wrap`` and with ``torch.fx.wrap``."""
        patcher = self._patcher
        registered = [*wrapped_names.values(), *fx_wrapped_names()]
        for globals_dict, name in registered:
            original = unwrapped(globals_dict.get(name, getattr(builtins, name, None)))
            if original is not None:
                patcher.patch_global(globals_dict, name, recording(original))
                self._wrapped[id(original)] = (name, original)

    def restore(self) -> None:
        """Put back everything patched, and drop traced values cached in the traced modules."""
        if self._tracer in _active_tracers:
            _active_tracers.remove(self._tracer)
        self._patcher.restore()
        self._forget_cached_proxies()

    # --------------------------------------------------- the patches
    def _module_call(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        tracer = self._tracer
        if module not in tracer.submodule_paths:
            # A module made during forward (``nn.CrossEntropyLoss()(x, y)``) is no
            # attribute the graph could call: trace through it, its tensors become
            # constants.
            return original_module_call(module, *args, **kwargs)
        forward = module.forward
        globals_dict = getattr(forward, "__globals__", None)
        if globals_dict is not None and id(globals_dict) not in self._scanned:
            self._autowrap_globals(globals_dict)  # marks them scanned: this runs once per module
            if isinstance(module, GraphModule):
                self._wrap_in_generated_code(globals_dict)
        self._watch_attribute_writes(type(module))
        return tracer.call_module(module, forward, args, kwargs)

    def _module_getattr(self, module: torch.nn.Module, name: str) -> Any:
        value = original_module_getattr(module, name)
        return self._tracer.getattr(name, value, self._parameter_proxies)

    def _watch_attribute_writes(self, cls: type) -> None:
        """Undo, after tracing, assignments of traced values to attributes (``self.last = x``).

        Patched per module class whose forward runs with proxies, not on
        nn.Module itself: a class attribute set on nn.Module invalidates type
        caches of every module class loaded, which would dominate small traces.
        """
        if cls in self._watched_classes:
            return
        self._watched_classes.add(cls)
        original = cls.__setattr__
        patcher = self._patcher

        def watching_setattr(module: torch.nn.Module, name: str, value: Any) -> None:
            if holds_proxy(value):
                patcher.remember_attr(module, name)  # put back the old value after tracing
            original(module, name, value)

        patcher.patch_attr(cls, "__setattr__", self.gate.route(original, watching_setattr))

    def _autowrap_globals(self, globals_dict: dict[str, Any] | None) -> None:
        """Patch globals naming autowrapped functions (``from math import sqrt``)."""
        if not globals_dict or id(globals_dict) in self._scanned:
            return  # each module's globals are scanned once per trace
        self._scanned.add(id(globals_dict))
        for name, value in list(globals_dict.items()):
            if id(value) in self._autowrap_ids and callable(value):
                self._patcher.patch_global(globals_dict, name, recording(value))
            elif type(value) is types.ModuleType and value in self._tracer.autowrap_modules:
                self._autowrap_module(value)  # ``import math`` then ``math.sqrt(x)``

    def _wrap_in_generated_code(self, globals_dict: dict[str, Any]) -> None:
        """Record the wrapped functions a GraphModule's forward calls, as the first trace did.

        Generated code reaches a wrapped function through a global of its own
        (``my_kernel_1``) or, for a builtin (``len``), through the builtins;
        without this, tracing a GraphModule again would trace through it.
        """
        wrapped = self._wrapped
        for name, value in list(globals_dict.items()):
            entry = wrapped.get(id(unwrapped(value)))
            if entry is not None:
                self._patcher.patch_global(globals_dict, name, recording(entry[1]))
        for name, original in wrapped.values():
            if name not in globals_dict and getattr(builtins, name, None) is original:
                self._patcher.patch_global(globals_dict, name, recording(original))

    def _autowrap_module(self, module: types.ModuleType) -> None:
        """Patch an autowrap module's functions, once, for code reaching them as attributes."""
        if id(module) in self._scanned:
            return
        self._scanned.add(id(module))
        ids = self._autowrap_ids
        replacements = {
            name: recording(value)
            for name, value in vars(module).items()
            if id(value) in ids and not name.startswith("_")
        }
        if type(module) is types.ModuleType:  # setattr stores in vars(module): patch it at once
            self._patcher.patch_namespace(vars(module), replacements)
            return
        for name, replacement in replacements.items():  # a module class may hook setattr
            self._patcher.patch_attr(module, name, replacement)

    def _refusing_transform(self, transform: Callable[..., Any], name: str) -> Callable[..., Any]:
        """``transform`` (``torch.vmap``) whose transformed functions refuse proxies."""
        tracer, gate = self._tracer, self.gate

        @functools.wraps(transform)
        def patched(fn: Callable[..., Any], *t_args: Any, **t_kwargs: Any) -> Callable[..., Any]:
            transformed = transform(fn, *t_args, **t_kwargs)

            def refusing(*args: Any, **kwargs: Any) -> Any:
                if holds_proxy(args) or holds_proxy(kwargs):
                    raise tracer.trace_error(
                        f"{name} cannot batch traced values: symbolic tracing records "
                        "operations one by one and cannot run a function transform over them",
                        hint="make the module calling it a leaf (Tracer.is_leaf_module), wrap "
                        "the function that calls it (fxloom.wrap)",
                    )
                return transformed(*args, **kwargs)

            return functools.wraps(transformed)(gate.route(transformed, refusing))

        patched.__fxloom_original__ = transform  # type: ignore[attr-defined]
        return patched

    def _forget_cached_proxies(self) -> None:
        """Drop traced values a module cached in a dict (``self.cache[key] = x``).

        Assignments are undone by the class watchers; entries added to a dict
        attribute are found here, so the eager module never sees a Proxy.
        """
        for module in self.traced_modules:
            for name, value in list(vars(module).items()):
                if type(value) is dict and name not in _MODULE_INTERNALS:
                    stale = [key for key, entry in value.items() if holds_proxy(entry)]
                    for key in stale:
                        del value[key]
