"""What a call does under ``fxloom.compile``: inline it, record it, run it natively, or break.

In order (the first row that applies decides):

=====================================  ==============================================
callee                                 what happens
=====================================  ==============================================
in ``SPECIAL`` (``super``; ``print``,  its interpreter-level implementation (Python
logging, ``warnings.warn``)            output runs after the graph, in order)
bound method                           the function, with ``self`` first
a Tensor method on a stand-in          recorded as ``call_method`` (metadata queries
                                       such as ``size``, ``dim`` run natively)
a function of torch                    recorded as ``call_function`` when a tensor is
                                       involved (argument or result), else run natively
``nn.Module`` that tracing keeps as a  recorded as ``call_module``
leaf (defined in ``torch.nn``)
any other ``nn.Module``                its ``forward`` inlined (no hooks), or its
                                       ``_call_impl`` inlined (hooks)
Python function                        inlined (standard-library ones run natively when
                                       no tensor is involved)
class                                  instance made natively, ``__init__`` inlined
function implemented in C              run natively, unless it would see a tensor and is
                                       not in ``HOLDS_TENSORS`` (a break)
=====================================  ==============================================

Depends on ``fxloom.bytecode.interpreter``, ``recording``, ``breaks`` and the values layer.
"""

from __future__ import annotations

import builtins
import collections
import copy
import functools
import inspect
import logging
import operator
import sys
import types
import warnings
from typing import Any

import torch

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.interpreter import Frame, Interpreter
from fxloom.values.stand_in import DataDependentError, StandIn

__all__ = ["call", "bind_frame", "holds_stand_in", "inline", "record"]

_TENSOR_METHOD_TYPES = (types.BuiltinMethodType, types.MethodWrapperType)
# Tensor methods that answer from metadata: run natively on the stand-in, nothing recorded.
METADATA_METHODS = frozenset(
    ("size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous", "element_size",
     "is_floating_point", "is_complex", "get_device", "storage_offset", "type", "__len__",
     "is_signed")
)  # fmt: skip
# ... and those that need data: a break.
DATA_METHODS = frozenset(
    (
        "item",
        "tolist",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "numpy",
        "__format__",
        "__repr__",
        "__str__",
        "data_ptr",
    )
)

# Functions implemented in C that only move references around: safe to run natively on
# values that hold stand-ins (they never read a tensor's data).
HOLDS_TENSORS = frozenset(
    (builtins.len, builtins.isinstance, builtins.issubclass, builtins.getattr, builtins.hasattr,
     builtins.setattr, builtins.id, builtins.callable, builtins.iter, builtins.next,
     builtins.type, object.__setattr__, object.__getattribute__, object.__new__)
)  # fmt: skip
_HOLDING_TYPES = frozenset(
    (tuple, list, dict, collections.OrderedDict, zip, enumerate, reversed, type, slice)
)
_CONTAINER_TYPES = (list, dict, set, collections.OrderedDict, collections.deque)
MUTATING_METHODS = frozenset(
    ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update",
     "setdefault", "popitem", "add", "discard", "__setitem__", "__delitem__", "__iadd__",
     "move_to_end", "appendleft", "extendleft", "popleft")
)  # fmt: skip
_NATIVE_PACKAGES = frozenset(sys.stdlib_module_names) | {"typing_extensions", "numpy"}
# Functions whose result changes from call to call (clocks, randomness, the environment, the
# user): a captured constant would be wrong, so each call runs as Python between pieces.
CHANGING_MODULES = frozenset(
    ("random", "time", "datetime", "uuid", "secrets", "os", "socket", "getpass")
)
CHANGING_RESULTS = frozenset((builtins.input, builtins.open, builtins.id))


def _module_of(fn: Any) -> str:
    module = getattr(fn, "__module__", None)
    if module is None:  # a bound builtin method: its owner's module (random.Random().random)
        module = type(getattr(fn, "__self__", None)).__module__
    return (module or "").partition(".")[0].lstrip("_")


# Native functions whose result is always a new object (the program's own, free to change).
MAKES_NEW = frozenset((copy.copy, copy.deepcopy))


def holds_stand_in(args: tuple, kwargs: dict | None = None) -> bool:
    """Whether a stand-in is among ``args``/``kwargs`` (containers two levels deep)."""
    for value in args if not kwargs else (*args, *kwargs.values()):
        if isinstance(value, StandIn):
            return True
        kind = type(value)
        if kind is tuple or kind is list:
            for item in value:
                if isinstance(item, StandIn) or (
                    type(item) in (tuple, list) and holds_stand_in(item)
                ):
                    return True
        elif kind is dict and holds_stand_in(tuple(value.values())):
            return True
    return False


def call(interp: Interpreter, fn: Any, args: tuple, kwargs: dict) -> Any:
    """The result of ``fn(*args, **kwargs)`` in the program being compiled; see the module docstring."""
    if interp.native:
        return fn(*args, **kwargs)
    special = SPECIAL.get(_key(fn))
    if special is not None:
        return special(interp, args, kwargs)
    kind = type(fn)
    if kind is types.MethodType:
        return call(interp, fn.__func__, (fn.__self__, *args), kwargs)
    if kind is functools.partial and _is_torch(fn.func):  # partial(F.gelu, approximate=...)
        return call(interp, fn.func, (*fn.args, *args), {**fn.keywords, **kwargs})
    if kind in _TENSOR_METHOD_TYPES and isinstance(getattr(fn, "__self__", None), StandIn):
        return _tensor_method(interp, fn.__self__, fn.__name__, args, kwargs)
    if kind is types.MethodDescriptorType and args and isinstance(args[0], StandIn):
        return _tensor_method(interp, args[0], fn.__name__, args[1:], kwargs)
    if isinstance(fn, torch.nn.Module):
        return _module(interp, fn, args, kwargs)
    if _is_torch(fn):
        return _torch_function(interp, fn, args, kwargs)
    if kind is types.FunctionType:
        if _runs_natively(fn) and not holds_stand_in(args, kwargs):
            return _native(interp, fn, args, kwargs)
        return inline(interp, fn, args, kwargs)
    if isinstance(fn, type):
        return _construct(interp, fn, args, kwargs)
    python_call = vars(type(fn)).get("__call__") if hasattr(type(fn), "__dict__") else None
    python_call = python_call or type(fn).__call__
    if type(python_call) is types.FunctionType:
        return inline(interp, python_call, (fn, *args), kwargs)
    return _native(interp, fn, args, kwargs)


def _key(fn: Any) -> Any:
    try:
        hash(fn)
    except TypeError:
        return None
    return fn


def inline(interp: Interpreter, fn: types.FunctionType, args: tuple, kwargs: dict) -> Any:
    """Interpret ``fn``'s body with ``args`` bound to its parameters."""
    code = fn.__code__
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        if code.co_name == "<genexpr>":
            return iter(_exhaust(interp, fn, args, kwargs))
        if fn.__module__ == "torch.nn.modules.module" and not holds_stand_in(args, kwargs):
            # Module.parameters(), .modules(), ...: walks over the module tree (guarded by its
            # epoch), run natively as a generator of the real objects.
            return _native(interp, fn, args, kwargs)
        raise Break("generator", f"{fn.__qualname__} is a generator function")
    return interp.run(bind_frame(interp, fn, args, kwargs))


def bind_frame(interp: Interpreter, fn: types.FunctionType, args: tuple, kwargs: dict) -> Frame:
    """A frame of ``fn`` with its parameters bound as Python would bind them."""
    try:
        local_values = bind_arguments(fn, args, kwargs)
    except TypeError as err:
        raise Break("exception", str(err)) from None
    code = fn.__code__
    cells: dict[str, Any] = {}
    for name in code.co_cellvars:
        cell = types.CellType()
        if name in local_values:  # an argument captured by an inner function
            cell.cell_contents = local_values.pop(name)
        cells[name] = interp.recording.built(cell)
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        cells[name] = cell
    return Frame(fn, local_values, cells)


def bind_arguments(fn: types.FunctionType, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``fn``'s parameters bound to ``args`` and ``kwargs`` (defaults filled in), as Python
    binds them; a ``TypeError`` in Python's words when they do not fit."""
    code = fn.__code__
    names, count = code.co_varnames, code.co_argcount
    positional, keyword_only = names[:count], names[count : count + code.co_kwonlyargcount]
    star = count + code.co_kwonlyargcount
    has_star, has_star_star = (
        code.co_flags & inspect.CO_VARARGS,
        code.co_flags & inspect.CO_VARKEYWORDS,
    )
    if len(args) > count and not has_star:
        raise TypeError(
            f"{fn.__qualname__}() takes {count} positional arguments but {len(args)} were given"
        )
    bound = dict(zip(positional, args))
    if has_star:
        bound[names[star]] = tuple(args[count:])
    extra: dict[str, Any] = {}
    by_keyword = positional[code.co_posonlyargcount :]
    for key, value in kwargs.items():
        if key in by_keyword or key in keyword_only:
            if key in bound:
                raise TypeError(f"{fn.__qualname__}() got multiple values for argument {key!r}")
            bound[key] = value
        elif has_star_star:
            extra[key] = value
        else:
            raise TypeError(f"{fn.__qualname__}() got an unexpected keyword argument {key!r}")
    if has_star_star:
        bound[names[star + (1 if has_star else 0)]] = extra
    defaults = fn.__defaults__ or ()
    first_default = count - len(defaults)
    for index, name in enumerate(positional):
        if name not in bound:
            if index < first_default:
                raise TypeError(f"{fn.__qualname__}() missing required argument {name!r}")
            bound[name] = defaults[index - first_default]
    keyword_defaults = fn.__kwdefaults__ or {}
    for name in keyword_only:
        if name not in bound:
            if name not in keyword_defaults:
                raise TypeError(f"{fn.__qualname__}() missing keyword-only argument {name!r}")
            bound[name] = keyword_defaults[name]
    return bound


def _exhaust(interp: Interpreter, fn: types.FunctionType, args: tuple, kwargs: dict) -> list[Any]:
    """The items a generator expression yields, computed now (it is consumed where it is made)."""
    from fxloom.bytecode.handlers.generators import run_generator

    return run_generator(interp, bind_frame(interp, fn, args, kwargs))


# ------------------------------------------------------------------ tensors
def _tensor_method(
    interp: Interpreter, tensor: StandIn, name: str, args: tuple, kwargs: dict
) -> Any:
    if name in METADATA_METHODS:
        return getattr(tensor, name)(*args, **kwargs)
    if name in DATA_METHODS:
        raise Break("tensor-data", f"Tensor.{name}() reads the data of a tensor")
    return record(interp, "call_method", name, (tensor, *args), kwargs)


def _torch_function(interp: Interpreter, fn: Any, args: tuple, kwargs: dict) -> Any:
    if not holds_stand_in(args, kwargs):
        with interp.recording.graph.metadata:
            result = _guarded(fn, args, kwargs)
        if not _holds_stand_in_result(result):
            return result  # a query of torch's state or of constants: nothing to record
    return record(interp, "call_function", fn, args, kwargs)


def record(interp: Interpreter, op: str, target: Any, args: tuple, kwargs: dict) -> Any:
    graph = interp.recording.graph
    graph.where = interp.where()
    try:
        return graph.call(op, target, args, kwargs)
    except DataDependentError as err:
        raise Break("data-dependent-op", f"{_name(target)}: {err}") from None


def _holds_stand_in_result(result: Any) -> bool:
    return isinstance(result, StandIn) or (
        isinstance(result, tuple | list) and any(isinstance(item, StandIn) for item in result)
    )


# Python code in torch that changes global state rather than computing tensors: interpreted,
# so the state switch it makes (``torch._C._set_grad_enabled``) is recorded.
_INTERPRETED_TORCH_MODULES = frozenset(("torch.autograd.grad_mode", "torch.utils._contextlib"))


def _is_torch(fn: Any) -> bool:
    if isinstance(fn, type) or getattr(fn, "__module__", None) in _INTERPRETED_TORCH_MODULES:
        return False
    module = getattr(fn, "__module__", None)
    if type(fn) is types.FunctionType and (module or "").startswith("torch.nn.modules."):
        # A module class's Python method called as a function (``super().forward(x)`` in a
        # subclass of nn.Embedding, ``self.register_buffer(...)``): interpreted, never
        # recorded with the module as an argument (or run on stand-ins to record it).
        return False
    if module is None:
        owner = getattr(fn, "__self__", None)
        module = getattr(owner, "__name__", None) if isinstance(owner, types.ModuleType) else None
    return isinstance(module, str) and (
        module == "torch" or module.startswith(("torch.", "torch._C"))
    )


def _name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__qualname__", repr(target))


# ------------------------------------------------------------------ modules and classes
def _module(interp: Interpreter, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    recording = interp.recording
    path = recording.root_path(module)
    if _is_leaf(module):
        target = recording.graph.module_path(
            module, path if path is not None else type(module).__name__
        )
        return record(interp, "call_module", target, args, kwargs)
    source = recording.source_of(module)
    if source is not None:
        recording.guards.hooks(source, module)
    forward = type(module).forward
    if type(forward) is not types.FunctionType:
        raise Break("opaque-call", f"{type(module).__qualname__}.forward is not a Python function")
    if not _has_hooks(module):
        return inline(interp, forward, (module, *args), kwargs)
    return _with_hooks(interp, module, forward, args, kwargs)


def _with_hooks(
    interp: Interpreter, module: torch.nn.Module, forward: Any, args: tuple, kwargs: dict
) -> Any:
    """A module call with its forward hooks, as ``nn.Module.__call__`` runs them: each
    pre-hook may replace the arguments, each hook the result; all are inlined."""
    if module._backward_hooks or module._backward_pre_hooks:
        raise Break("opaque-call", f"{type(module).__qualname__} has backward hooks")
    for key, hook in list(module._forward_pre_hooks.items()):
        if key in module._forward_pre_hooks_with_kwargs:
            replaced = call(interp, hook, (module, args, kwargs), {})
            if replaced is not None:
                args, kwargs = replaced
        else:
            replaced = call(interp, hook, (module, args), {})
            if replaced is not None:
                args = replaced if isinstance(replaced, tuple) else (replaced,)
    result = inline(interp, forward, (module, *args), kwargs)
    for key, hook in list(module._forward_hooks.items()):
        if key in module._forward_hooks_with_kwargs:
            replaced = call(interp, hook, (module, args, kwargs, result), {})
        else:
            replaced = call(interp, hook, (module, args, result), {})
        if replaced is not None:
            result = replaced
    return result


def _is_leaf(module: torch.nn.Module) -> bool:
    from fxloom.values.leaf_modules import is_torch_nn_leaf

    return is_torch_nn_leaf(module)


def _has_hooks(module: torch.nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)  # fmt: skip


# ``__new__`` of builtin bases that only allocate: called with the class alone, then the
# Python ``__init__`` runs interpreted.
_ALLOCATING_NEW = frozenset(
    (object.__new__, dict.__new__, list.__new__, collections.OrderedDict.__new__, set.__new__)
)


def _construct(interp: Interpreter, cls: type, args: tuple, kwargs: dict) -> Any:
    new = cls.__new__
    if type(cls) is not type and not issubclass(type(cls), type(collections.OrderedDict)):
        return _native(interp, cls, args, kwargs)  # a metaclass decides what calling means
    if type(new) is types.FunctionType:  # named tuples, ...
        instance = inline(interp, new, (cls, *args), kwargs)
    elif _key(new) in _ALLOCATING_NEW and type(cls.__init__) is types.FunctionType:
        instance = new(cls)
    else:
        return _native(interp, cls, args, kwargs, made=True)
    interp.recording.built(instance)
    init = cls.__init__
    if isinstance(instance, cls) and type(init) is types.FunctionType:
        inline(interp, init, (instance, *args), kwargs)
    return instance


# ------------------------------------------------------------------ native calls
def _runs_natively(fn: types.FunctionType) -> bool:
    module = getattr(fn, "__module__", None) or ""
    return module.partition(".")[0] in _NATIVE_PACKAGES


def _native(interp: Interpreter, fn: Any, args: tuple, kwargs: dict, made: bool = False) -> Any:
    recording = interp.recording
    owner = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", "")
    if _key(fn) in CHANGING_RESULTS or _module_of(fn) in CHANGING_MODULES:
        raise Break("changing-result", f"{_name(fn)}() gives another result at every call")
    if owner is not None and name in MUTATING_METHODS and recording.is_outside(owner):
        raise Break(
            "outside-mutation",
            f"{type(owner).__name__}.{name} on {recording.source_of(owner).text if recording.source_of(owner) else 'an outside object'}",
        )
    if holds_stand_in(args, kwargs) and not _holds_safely(fn, owner):
        raise Break("opaque-call", f"{_name(fn)} received a tensor")
    result = _guarded(fn, args, kwargs)
    if _unrecorded(interp, result):
        raise Break(
            "opaque-call", f"{_name(fn)} computed a tensor where fxloom could not record it"
        )
    if made or type(result) in _CONTAINER_TYPES or _key(fn) in MAKES_NEW:  # the program's own
        recording.built(result)
    return recording.graph.adopt(result)


def _unrecorded(interp: Interpreter, result: Any) -> bool:
    """Whether native code made a stand-in the graph does not know (it did tensor work)."""
    graph = interp.recording.graph
    items = result if type(result) in (tuple, list) else (result,)
    return any(isinstance(item, StandIn) and graph.node_of(item) is None for item in items)


def _holds_safely(fn: Any, owner: Any) -> bool:
    if _key(fn) in HOLDS_TENSORS or fn in _HOLDING_TYPES:
        return True
    # Methods of containers (the program's own or outside ones) store and fetch references.
    return isinstance(owner, _CONTAINER_TYPES + (tuple,)) or (
        type(fn) in (types.MethodDescriptorType, types.WrapperDescriptorType)
        and getattr(fn, "__objclass__", None) in (dict, list, collections.OrderedDict, object)
    )


def _guarded(fn: Any, args: tuple, kwargs: dict) -> Any:
    try:
        return fn(*args, **kwargs)
    except DataDependentError as err:
        raise Break("tensor-data", f"{_name(fn)}: {err}") from None


# ------------------------------------------------------------------ special callees
def _super(interp: Interpreter, args: tuple, kwargs: dict) -> Any:
    if args:
        return super(*args)
    frame = interp.frames[-1]
    cell = frame.cells.get("__class__")
    first = frame.code.co_varnames[0] if frame.code.co_argcount else None
    if cell is None or first is None:
        raise Break("unknown-value", "super() without arguments outside a method")
    if first in frame.locals:
        return super(cell.cell_contents, frame.locals[first])
    # ``self`` captured by an inner function or generator expression lives in its cell
    return super(cell.cell_contents, frame.cells[first].cell_contents)


def _deferred(fn: Any) -> Any:
    """Python output (print, logging, warnings): no graph break; it runs after the graph, in
    program order, with the tensors it shows computed by the graph."""

    def defer(interp: Interpreter, args: tuple, kwargs: dict) -> None:
        interp.recording.deferred.append((fn, args, dict(kwargs)))

    return defer


_LOGGER_METHODS = ("debug", "info", "warning", "warn", "error", "critical", "exception", "log")
DEFERRED_OUTPUT = (
    builtins.print,
    warnings.warn,
    *(getattr(logging.Logger, name) for name in _LOGGER_METHODS),
    *(getattr(logging, name) for name in _LOGGER_METHODS if hasattr(logging, name)),
)


def _set_grad_enabled(interp: Interpreter, args: tuple, kwargs: dict) -> None:
    """Grad mode switched inside the function (``with torch.no_grad():``): recorded, so the
    graph switches it too, and switched now, so what is recorded next sees it."""
    graph = interp.recording.graph
    graph.where = interp.where()
    graph.record_effect(torch._C._set_grad_enabled, args)
    torch._C._set_grad_enabled(*args, **kwargs)


def _sum(interp: Interpreter, args: tuple, kwargs: dict) -> Any:
    """``sum`` of tensors: one recorded ``+`` per item (natively, C would add unrecorded)."""
    items = list(args[0])
    total = args[1] if len(args) > 1 else kwargs.get("start", 0)
    if not any(isinstance(item, StandIn) for item in (*items, total)):
        return sum(items, total)
    for item in items:
        if isinstance(total, StandIn) or isinstance(item, StandIn):
            total = record(interp, "call_function", operator.add, (total, item), {})
        else:
            total = total + item
    return total


def _type(interp: Interpreter, args: tuple, kwargs: dict) -> Any:
    """``type(x)`` of a stand-in is the class of the tensor it stands for, not ``StandIn``."""
    if len(args) == 1 and isinstance(args[0], StandIn):
        return interp.recording.graph.real_type(args[0])
    return type(*args, **kwargs)


def _isinstance(interp: Interpreter, args: tuple, kwargs: dict) -> bool:
    value, classes = args
    if isinstance(value, StandIn):
        return issubclass(interp.recording.graph.real_type(value), classes)
    return isinstance(value, classes)


def _rows_taken(make: Any) -> Any:
    """``enumerate``, ``zip``, ``reversed``, ``list``, ``tuple`` of a tensor iterate its rows:
    recorded as ``unbind(0)`` first (natively, C would make rows the graph never sees)."""

    def call_with_rows(interp: Interpreter, args: tuple, kwargs: dict) -> Any:
        rows = tuple(
            record(interp, "call_method", "unbind", (arg, 0), {})
            if isinstance(arg, StandIn)
            else arg
            for arg in args
        )
        result = make(*rows, **kwargs)
        return interp.recording.built(result) if type(result) is list else result

    return call_with_rows


SPECIAL: dict[Any, Any] = {
    builtins.sum: _sum,
    builtins.type: _type,
    builtins.isinstance: _isinstance,
    **{make: _rows_taken(make) for make in (enumerate, zip, reversed, list, tuple)},
    builtins.super: _super,
    torch._C._set_grad_enabled: _set_grad_enabled,
    **{fn: _deferred(fn) for fn in DEFERRED_OUTPUT},
}
