"""What a call does under ``fxloom.compile``: inline it, record it, run it natively, or break.

The decision is the callee table's (``fxloom.bytecode.callees``: one row per callable, a C
callable with no row is a break); this module carries it out. In order:

=====================================  ==============================================
callee                                 what happens
=====================================  ==============================================
in ``SPECIAL`` (``super``, ``getattr``, its interpreter-level implementation (Python
``print``, logging, ``warnings.warn``) output runs after the graph, in order;
                                       ``getattr`` is an attribute read, guarded)
bound method                           the function, with ``self`` first
a Tensor method on a stand-in          recorded as ``call_method`` (metadata queries
                                       such as ``size``, ``dim`` run natively; data
                                       reads such as ``item`` break)
``nn.Module`` that tracing keeps as a  recorded as ``call_module``
leaf (defined in ``torch.nn``)
any other ``nn.Module``                its ``forward`` inlined (no hooks), or its
                                       ``_call_impl`` inlined (hooks)
a callable with a row                  what the row's kind says (``_by_row``)
Python function                        inlined (standard-library ones run natively when
                                       every argument is a constant or the program's own)
class                                  instance made natively, ``__init__`` inlined; a C
                                       class by the row of the C base that makes it
any other C callable                   a break (``unknown-callable``)
=====================================  ==============================================

No native call (nor a native operator, ``handlers/operators.py``) receives a value whose type
alone is guarded (``Recording.unguarded``), unless its row says it uses identity and type only:
what C code read of it would be decided once, at capture.

Depends on ``fxloom.bytecode.interpreter``, ``callees``, ``recording``, ``breaks`` and the
values layer.
"""

from __future__ import annotations

import builtins
import collections
import functools
import inspect
import logging
import operator
import types
import warnings
from typing import Any

import torch

from fxloom.bytecode import callees
from fxloom.bytecode.breaks import Break
from fxloom.bytecode.callees import Callee
from fxloom.bytecode.dynamic import concrete
from fxloom.bytecode.interpreter import Frame, Interpreter
from fxloom.bytecode.recording import NOT_WRITTEN
from fxloom.bytecode.side_effects import storage_key
from fxloom.ops import state_effects
from fxloom.ops.identity import is_inplace_name
from fxloom.ops.mutation import (
    function_has_side_effect,
    module_has_side_effect,
    writes_through_keywords,
)
from fxloom.values.signature import code_bind, code_variadic_names
from fxloom.values.stand_in import DataDependentError, StandIn
from fxloom.values.symbolic_scalars import SYMBOLIC_TYPES

__all__ = [
    "call",
    "bind_frame",
    "holds_stand_in",
    "holds_unguarded",
    "inline",
    "one_by_one",
    "record",
    "refuse_unguarded",
]

_TENSOR_METHOD_TYPES = (types.BuiltinMethodType, types.MethodWrapperType)
_CONTAINER_TYPES = (list, dict, set, collections.OrderedDict, collections.deque)
_NESTING = (tuple, list)


def holds_stand_in(args: tuple, kwargs: dict | None = None) -> bool:
    """Whether a stand-in is among ``args``/``kwargs`` (containers two levels deep)."""
    for value in args if not kwargs else (*args, *kwargs.values()):
        if isinstance(value, StandIn):
            return True
        kind = type(value)
        if kind is tuple or kind is list:
            for item in value:
                if isinstance(item, StandIn) or (type(item) in _NESTING and holds_stand_in(item)):
                    return True
        elif kind is dict and holds_stand_in(tuple(value.values())):
            return True
    return False


def holds_unguarded(unguarded: set[int], values: tuple) -> bool:
    """Whether one of ``values`` (containers two levels deep) is in ``unguarded`` (ids)."""
    if not unguarded:
        return False
    for value in values:
        if id(value) in unguarded:
            return True
        kind = type(value)
        if kind is tuple or kind is list or kind is dict:
            items = value.values() if kind is dict else value
            for item in items:
                if id(item) in unguarded:
                    return True
                inner = type(item)
                if (inner is tuple or inner is list) and any(id(v) in unguarded for v in item):
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
        row = callees.method_row(type(fn.__self__), fn.__func__.__name__)
        if row is not None:  # a Python method the table lists (``os.environ.get``)
            return _by_row(interp, row, fn, args, kwargs)
        return call(interp, fn.__func__, (fn.__self__, *args), kwargs)
    if kind is functools.partial and _records(fn.func):  # partial(F.gelu, approximate=...)
        return call(interp, fn.func, (*fn.args, *args), {**fn.keywords, **kwargs})
    if kind in _TENSOR_METHOD_TYPES and isinstance(getattr(fn, "__self__", None), StandIn):
        return _tensor_method(interp, fn.__self__, fn.__name__, args, kwargs)
    if kind is types.MethodDescriptorType and args and isinstance(args[0], StandIn):
        return _tensor_method(interp, args[0], fn.__name__, args[1:], kwargs)
    if isinstance(fn, torch.nn.Module):
        return _module(interp, fn, args, kwargs)
    row = callees.lookup(fn)
    if row is not None:
        return _by_row(interp, row, fn, args, kwargs)
    if kind is types.FunctionType:
        return _python_function(interp, fn, args, kwargs, None)
    if isinstance(fn, type):
        return _construct(interp, fn, args, kwargs)
    python_call = vars(type(fn)).get("__call__") if hasattr(type(fn), "__dict__") else None
    python_call = python_call or type(fn).__call__
    if type(python_call) is types.FunctionType:
        return inline(interp, python_call, (fn, *args), kwargs)
    raise _unknown(fn)


def _records(fn: Any) -> bool:
    """Whether the table records ``fn`` as a torch operation."""
    row = callees.lookup(fn)
    return row is not None and row.kind == "record"


def _unknown(fn: Any) -> Break:
    return Break(
        "unknown-callable",
        f"{_name(fn)} (from {callees.module_of(fn) or 'no module'}) is implemented in C and "
        f"not in fxloom's callee table; if its result depends only on its arguments, declare "
        f'it: fxloom.bytecode.classify({_name(fn)}, "native_pure")',
    )


def _by_row(interp: Interpreter, row: Callee, fn: Any, args: tuple, kwargs: dict) -> Any:
    """Carry out what ``row`` says ``fn`` does (``fxloom.bytecode.callees``)."""
    kind = row.kind
    if kind == "record":
        return _torch_function(interp, fn, args, kwargs)
    if kind == "inline":
        if row.polyfill is not None:
            if type(fn) is types.FunctionType and callees.runs_natively(fn):
                if _only_own_values(interp, args, kwargs):
                    return _python_function(interp, fn, args, kwargs, row)
            return inline(interp, row.polyfill, (fn, *args), kwargs)
        if type(fn) is types.FunctionType:
            return _python_function(interp, fn, args, kwargs, row)
        if isinstance(fn, type):
            return _construct(interp, fn, args, kwargs)
        raise _unknown(fn)
    if kind == "higher_order":
        from fxloom.bytecode.cond_capture import capture  # (it calls back into this module)

        return capture(interp, fn, args, kwargs)
    if kind == "break":
        if row.tensor_data:
            raise Break("tensor-data", f"{_name(fn)}() reads the data of a tensor")
        raise Break("unsupported-call", f"{_name(fn)}() cannot be followed by fxloom.compile")
    if kind == "changing_result":
        target = _target(row, fn, args)
        if (
            target is _NO_TARGET
            or id(target) not in interp.recording.created
            or (holds_unguarded(interp.recording.unguarded, (target,)))
        ):
            raise Break("changing-result", f"{_name(fn)}() gives another result at every call")
    return _native(interp, fn, args, kwargs, row)


_NO_TARGET = object()


def _target(row: Callee, fn: Any, args: tuple) -> Any:
    """The argument ``row`` reads or changes (0: ``self`` of a bound method), or _NO_TARGET."""
    if row.target is None:
        return _NO_TARGET
    owner = getattr(fn, "__self__", None)
    subject = args if owner is None or type(owner) is types.ModuleType else (owner, *args)
    return subject[row.target] if len(subject) > row.target else _NO_TARGET


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
        if code.co_flags & inspect.CO_GENERATOR and code.co_name == "<genexpr>":  # lazily
            return _generator_expression(interp, fn, args, kwargs)
        if fn.__module__ == "torch.nn.modules.module" and not holds_stand_in(args, kwargs):
            # Module.parameters(), .modules(), ...: walks over the module tree (guarded by its
            # epoch), run natively as a generator of the real objects.
            return _native(interp, fn, args, kwargs, callees.MODULE_TREE_WALK)
        raise Break("generator", f"{fn.__qualname__} is a generator function")
    return interp.run(bind_frame(interp, fn, args, kwargs))


def bind_frame(interp: Interpreter, fn: types.FunctionType, args: tuple, kwargs: dict) -> Frame:
    """A frame of ``fn`` with its parameters bound as Python would bind them."""
    try:
        local_values = code_bind(fn, args, kwargs)
    except TypeError as err:
        raise Break("exception", str(err)) from None
    code = fn.__code__
    recording = interp.recording
    for name in code_variadic_names(fn):  # *args and **kwargs: made for this call
        recording.built(local_values[name])
    cells: dict[str, Any] = {}
    for name in code.co_cellvars:
        cell = types.CellType()
        if name in local_values:  # an argument captured by an inner function
            cell.cell_contents = local_values.pop(name)
        cells[name] = recording.built(cell)
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        cells[name] = cell
    return Frame(fn, local_values, cells)


def _generator_expression(
    interp: Interpreter, fn: types.FunctionType, args: tuple, kwargs: dict
) -> Any:
    """The generator a generator expression makes: its frame, run one item at a time as the
    program advances it (``fxloom.bytecode.handlers.generators``)."""
    from fxloom.bytecode.handlers.generators import generator_expression

    return generator_expression(interp, bind_frame(interp, fn, args, kwargs))


# ------------------------------------------------------------------ tensors
def _tensor_method(
    interp: Interpreter, tensor: StandIn, name: str, args: tuple, kwargs: dict
) -> Any:
    row = callees.tensor_method(name)
    if row.kind == "record":
        return record(interp, "call_method", name, (tensor, *args), kwargs)
    if row.kind == "break":
        if name == "item" and not args and not kwargs:
            number = _data_number(interp, tensor)
            if number is not None:
                return number
        raise Break("tensor-data", f"Tensor.{name}() reads the data of a tensor")
    return getattr(tensor, name)(*args, **kwargs)  # answered from the stand-in's metadata


# The dtypes whose ``.item()`` stays in the graph: real numbers. A bool is read to branch on
# (the break would only move to the ``if``); a complex number has no symbol.
_DATA_NUMBER_DTYPES = frozenset(
    (torch.float16, torch.bfloat16, torch.float32, torch.float64,
     torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
)  # fmt: skip


# Python's number types: called on a tensor, they read its data (``float(t)``).
_NUMBER_TYPES = frozenset((float, int, bool, complex))


def _data_number(interp: Interpreter, tensor: StandIn) -> Any:
    """``tensor.item()`` kept in the graph as a symbol with no example (``GraphBuilder.
    data_number``), so that a number read only to compute with tensors (``y / y.max().item()``)
    costs no graph break; None where it breaks at once: no size policy is active, the capture
    runs again because sizes came to depend on such a number (``entry._capture``), inside a
    ``fxloom.cond`` branch, the tensor may hold other than one element, or its dtype is not a
    real number."""
    sizes, graph = interp.recording.guards.sizes, interp.recording.graph
    if (
        sizes is None
        or not interp.recording.keeps_data
        or not graph.takes_numbers  # a ``fxloom.cond`` branch: its graph takes tensors only
        or tensor.dtype not in _DATA_NUMBER_DTYPES
        or type(tensor.numel()) is not int
        or tensor.numel() != 1
    ):
        return None
    node = graph.node_of(tensor)
    what = f"{node.name}.item()" if node is not None else "Tensor.item()"
    return graph.data_number(tensor, sizes.shape_env(), what)


def _torch_function(interp: Interpreter, fn: Any, args: tuple, kwargs: dict) -> Any:
    if not holds_stand_in(args, kwargs):
        _refuse_unguarded(interp, fn, args, kwargs)  # (``record`` checks its own arguments)
        with interp.recording.graph.metadata:
            result = _guarded(fn, args, kwargs)
        if not _holds_stand_in_result(result):
            return result  # a query of torch's state or of constants: nothing to record
    return record(interp, "call_function", fn, args, kwargs)


def record(interp: Interpreter, op: str, target: Any, args: tuple, kwargs: dict) -> Any:
    """A graph node for ``target`` on ``args``; an unguarded value among them would become a
    constant of the graph (the first call's object): a break instead."""
    recording = interp.recording
    if recording.unguarded:
        values = (*args, *kwargs.values()) if kwargs else args
        for value in values:
            if holds_unguarded(recording.unguarded, (value,)):
                raise _unguarded_break(recording, target, value)
    if recording.changes.log and _writes_printed(recording, op, target, args, kwargs):
        raise Break("changed-after-print", f"{_name(target)} changes a tensor printed before it")
    graph = recording.graph
    if graph.raises_on_data(op, target, args) and inside_python_exit(interp):
        raise Break("raises-inside-with", f"{_name(target)} inside a with block")
    graph.where = interp.where()
    try:
        return graph.call(op, target, args, kwargs)
    except DataDependentError as err:
        raise Break("data-dependent-op", f"{_name(target)}: {err}") from None


def inside_python_exit(interp: Interpreter) -> bool:
    """Whether capture stands inside a ``with`` block this piece entered whose manager's exit
    is Python code (a class of the user's, a ``@contextmanager``): a graph op raising there
    would skip that exit, which eager runs with the exception (``record`` breaks before an op
    that may raise on data; an exit entered before the piece is ``driver._unwind``'s)."""
    from fxloom.bytecode.handlers.calling import pending_exit  # (it imports this module)

    return any(
        pending_exit(value) and id(value) not in interp.pending_exits
        for frame in interp.frames
        for value in frame.stack
    )


def _writes_printed(recording: Any, op: str, target: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``target`` writes in place (the IR's impurity rules: ``add_``, ``setitem``,
    ``out=``, ``inplace=True``) into a tensor whose storage deferred output shows."""
    written: list[StandIn] = []
    first_written = _writes_its_first_argument(recording, op, target)
    if kwargs and writes_through_keywords(kwargs):
        written += [value for value in kwargs.values() if isinstance(value, StandIn)]
        first_written = True
    if first_written and args and isinstance(args[0], StandIn):
        written.append(args[0])
    if not written:
        return False
    printed = recording.changes.printed_storages()
    return any(storage_key(value) in printed for value in written)


def _writes_its_first_argument(recording: Any, op: str, target: Any) -> bool:
    if op == "call_method":
        return is_inplace_name(target)
    if op == "call_function":
        return function_has_side_effect(target)
    module = recording.graph.modules.get(target)
    return module is not None and module_has_side_effect(module)


def _holds_stand_in_result(result: Any) -> bool:
    return isinstance(result, StandIn) or (
        isinstance(result, tuple | list) and any(isinstance(item, StandIn) for item in result)
    )


def _name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__qualname__", repr(target))


# ------------------------------------------------------------------ modules and classes
def _module(interp: Interpreter, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """A module call, inside its entry of the graph's module stack (``nn_module_stack`` of
    the nodes it records, as symbolic tracing and export stamp it)."""
    path = interp.recording.root_path(module)
    if not path:  # the root's own level, or a module from outside the root: no entry
        return _module_call(interp, module, path, args, kwargs)
    stack = interp.recording.graph.module_stack
    saved = stack.enter(path, type(module))
    try:
        return _module_call(interp, module, path, args, kwargs)
    finally:
        stack.leave(saved)


def _module_call(
    interp: Interpreter, module: torch.nn.Module, path: str | None, args: tuple, kwargs: dict
) -> Any:
    recording = interp.recording
    # a leaf read by its type (``Recording._module_by_type``): its forward is inlined
    if _is_leaf(module) and id(module) not in recording.by_type:
        target = recording.graph.module_path(
            module, path if path is not None else type(module).__name__
        )
        return record(interp, "call_module", target, args, kwargs)
    source = recording.source_of(module)
    if source is not None:
        recording.guards.hooks(source, module)  # (and no forward of the instance's own)
    own = getattr(module, "__dict__", {}).get("forward")
    if own is not None:  # ``nn.Module.__call__`` runs the instance's forward, not the class's
        if _has_hooks(module):
            raise Break(
                "opaque-call",
                f"{type(module).__qualname__} has hooks and a forward of the instance's own",
            )
        return call(interp, recording.read_attribute(module, "forward", own), args, kwargs)
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


def _construct(interp: Interpreter, cls: type, args: tuple, kwargs: dict) -> Any:
    # (a class made at a graph break: its __new__, __init__ and MRO are read here unguarded)
    refuse_unguarded(interp, f"making a {cls.__qualname__}", cls, shallow=True)
    new = cls.__new__
    if type(cls) is not type and not issubclass(type(cls), type(collections.OrderedDict)):
        # a metaclass decides what calling means (an Enum's lookup by value, ...)
        return _native(interp, cls, args, kwargs, _METACLASS_CALL)
    if type(new) is types.FunctionType:  # named tuples, ...
        instance = inline(interp, new, (cls, *args), kwargs)
    elif type(cls.__init__) is types.FunctionType and _allocates(new):
        instance = new(cls)  # then the Python ``__init__``, interpreted
    else:  # made by C: the row of the C class that makes it (``class Point(tuple)``: tuple's)
        row = callees.class_row(_maker(cls))
        if row is None:
            raise _unknown(cls)
        return _native(interp, cls, args, kwargs, row, made=True)
    interp.recording.built(instance)
    init = cls.__init__
    if isinstance(instance, cls) and type(init) is types.FunctionType:
        inline(interp, init, (instance, *args), kwargs)
    return instance


def _allocates(new: Any) -> bool:
    """Whether ``__new__`` of a builtin base only allocates (its row: new, identity only):
    ``object.__new__``, ``dict.__new__``..., called with the class alone."""
    row = callees.lookup(new)
    return row is not None and bool(row.new) and row.identity


# Calling a class whose metaclass is written in Python: the metaclass's Python code, run
# natively on values that are constants or the program's own.
_METACLASS_CALL = Callee("native_pure", new=True)


def _maker(cls: type) -> type:
    """The first class of ``cls``'s MRO that defines ``__new__`` or ``__init__`` in C."""
    for klass in cls.__mro__:
        own = vars(klass)
        if ("__new__" in own and type(own["__new__"]) is not staticmethod) or (
            "__init__" in own and type(own["__init__"]) is not types.FunctionType
        ):
            return klass
    return object


# ------------------------------------------------------------------ Python functions
def _python_function(
    interp: Interpreter, fn: types.FunctionType, args: tuple, kwargs: dict, row: Callee | None
) -> Any:
    """Inline ``fn``; a standard-library (or numpy) one runs natively instead when every
    argument is a constant or the program's own value (what it reads is then fixed)."""
    if callees.runs_natively(fn) and _only_own_values(interp, args, kwargs):
        result = _guarded(fn, args, kwargs)
        _adopt_new(interp.recording, result, row is not None and row.new)
        return _over_generators(interp, interp.recording.graph.adopt(result), args, kwargs)
    return inline(interp, fn, args, kwargs)


_VALUE_TYPES = frozenset(
    (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), torch.dtype,
     torch.device, torch.Size)
)  # fmt: skip


def _only_own_values(interp: Interpreter, args: tuple, kwargs: dict) -> bool:
    """Whether each argument is a constant, a function or class, or an object the program
    built (no stand-in, nothing from outside, two levels into tuples, lists and dicts)."""
    recording = interp.recording
    created = recording.created
    for value in (*args, *kwargs.values()):
        kind = type(value)
        if kind in _VALUE_TYPES or isinstance(value, _CODE_TYPES):
            continue
        if isinstance(value, StandIn) or recording.is_outside(value):
            return False
        if kind is tuple or kind is list or kind is dict:
            items = tuple(value.values()) if kind is dict else value
            if not _only_own_values(interp, tuple(items), {}):
                return False
        elif id(value) not in created:
            return False
    return True


_CODE_TYPES = (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType)
# Containers whose methods hash their first argument (``add``, ``get``, ``setdefault``...).
_HASHING = (dict, set, frozenset)


# ------------------------------------------------------------------ native calls
def _native(
    interp: Interpreter, fn: Any, args: tuple, kwargs: dict, row: Callee, made: bool = False
) -> Any:
    """``fn`` (a C callable, or Python run natively) called on real values, as ``row`` allows."""
    recording = interp.recording
    if not row.tensors:  # C code reads a symbolic size as its value: fixed by a guard
        args, kwargs = concrete(args), {key: concrete(value) for key, value in kwargs.items()}
    elif args and isinstance(getattr(fn, "__self__", None), _HASHING):
        args = (concrete(args[0]), *args[1:])  # ``seen.add(n)``: hashed by its value (a guard)
    if not row.identity and _calls_python(args, kwargs):  # it would run Python code unseen
        if row.polyfill is not None:
            return inline(interp, row.polyfill, (fn, *args), kwargs)
        raise Break(
            "unsupported-call", f"{_name(fn)} would call a Python function natively, unseen"
        )
    if not row.tensors and holds_stand_in(args, kwargs):
        if fn in _NUMBER_TYPES and len(args) == 1 and isinstance(args[0], StandIn):
            # ``float(t)``: the number is data, handed on as a symbol (``driver._promote``)
            raise Break("tensor-data", f"{_name(fn)}() reads the data of a tensor")
        raise Break("opaque-call", f"{_name(fn)} received a tensor")
    target = _target(row, fn, args)
    reads = row.kind == "native_reads_outside"
    if not row.identity:  # the target of a row that only moves references: itself only
        shallow = target if row.tensors else _NO_TARGET
        _refuse_unguarded(interp, fn, args, kwargs, target if reads else shallow, not reads)
    if row.kind == "native_mutating" and target is not _NO_TARGET:
        if isinstance(target, StandIn) and callees.module_of(fn).lstrip("_") == "operator":
            return record(interp, "call_function", fn, args, kwargs)  # ``operator.iadd(x, y)``
        if id(target) not in recording.created:  # not the program's own: a side effect
            if any(_is_lazy(value) for value in (*args, *kwargs.values())):
                return one_by_one(interp, target, fn, args, kwargs)
            return recording.mutate_outside(target, fn, args, kwargs)
    result = _guarded(fn, args, kwargs)
    if reads and (target is _NO_TARGET or _needs_guard(recording, target)):
        owner = getattr(fn, "__self__", None)
        call_args = args if owner is None or type(owner) is types.ModuleType else (owner, *args)
        callee = fn if owner is None or type(owner) is types.ModuleType else _unbound(fn)
        if callee is None or not recording.guard_call(callee, call_args, result):
            raise Break("unguarded-value", f"{_name(fn)} reads {_described(recording, target)}, "
                                           "and no guard can check what it read")  # fmt: skip
    if _unrecorded(interp, result):
        raise Break(
            "opaque-call", f"{_name(fn)} computed a tensor where fxloom could not record it"
        )
    _adopt_new(recording, result, made or row.new)
    if fn is builtins.next:  # an item of a generator expression: not made over it
        return recording.graph.adopt(result)
    return _over_generators(interp, recording.graph.adopt(result), args, kwargs)


def _over_generators(interp: Interpreter, result: Any, args: tuple, kwargs: dict) -> Any:
    """``result``, or, where it is an iterator made over a generator expression among
    ``args`` (``zip(gen, xs)``), that iterator to be advanced one step at a time."""
    from fxloom.bytecode.handlers.generators import step_wrapped

    return step_wrapped(interp, result, args, kwargs)


# An outside container filled from a generator expression: eager adds the items one at a
# time, between steps of the generator's body (which may print, or read the container), so
# the change is made (and replayed) as one call of the single-item method per item.
_ONE_BY_ONE = {
    (list, "extend"): "append",
    (list, "__iadd__"): "append",
    (collections.deque, "__iadd__"): "append",
    (set, "__ior__"): "add",
    (collections.deque, "extend"): "append",
    (collections.deque, "extendleft"): "appendleft",
    (set, "update"): "add",
    (dict, "update"): "__setitem__",
}


def one_by_one(interp: Interpreter, target: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
    """``target.extend(gen)`` (``update``, ``+=``...) of an outside container, item by item;
    what the call returns (``+=``: the program's view of the container)."""
    name = getattr(fn, "__name__", "")
    own = args if getattr(fn, "__self__", None) is target else args[1:]
    single = _ONE_BY_ONE.get((type(target), name))
    if single is None or kwargs or len(own) != 1 or not _is_lazy(own[0]):
        raise Break(
            "outside-mutation",
            f"{type(target).__name__}.{name} of an outside object with a generator expression: "
            "build a list first (eager interleaves the generator's body with the change)",
        )
    add = getattr(target, single)
    for item in own[0]:
        pair = tuple(item) if single == "__setitem__" else (item,)
        interp.recording.mutate_outside(target, add, pair, {})
    if not name.startswith("__i"):
        return None
    view = interp.recording.changes.view_of(target)
    return target if view is None else view


def _calls_python(args: tuple, kwargs: dict) -> bool:
    """Whether an argument is a Python function or method (a callable native code would call)."""
    for value in (*args, *kwargs.values()) if kwargs else args:
        kind = type(value)
        if kind is types.FunctionType or kind is types.MethodType:
            return True
        if kind is functools.partial and _calls_python((value.func,), {}):
            return True
    return False


def _adopt_new(recording: Any, result: Any, new: bool | str) -> None:
    """Mark what a native call made as the program's own: its result when the row says it
    is new (``"deep"``: every container inside it too, ``copy.deepcopy``) or when it is a
    container no source knows (a list from ``str.split``); never an object from outside."""
    if (new or type(result) in _CONTAINER_TYPES) and not recording.is_outside(result):
        recording.built(result)
        if new == "deep":
            _built_inside(recording, result, set())


def _built_inside(recording: Any, value: Any, seen: set[int]) -> None:
    kind = type(value)
    if kind not in _NESTED or id(value) in seen:
        return
    seen.add(id(value))
    for item in value.values() if kind is dict else value:
        if type(item) in _NESTED:
            if type(item) is not tuple:
                recording.built(item)
            _built_inside(recording, item, seen)


_NESTED = frozenset((list, dict, set, tuple))


def _needs_guard(recording: Any, target: Any) -> bool:
    """Whether what a native call read of ``target`` needs its own guard: an object from
    outside, other than a list, tuple or dict (whose length and items are guarded)."""
    return recording.is_outside(target) and type(target) not in (list, tuple, dict)


def _unbound(fn: Any) -> Any:
    """The unbound form of a bound C method (``d.get`` -> ``dict.get``), or None."""
    owner = fn.__self__
    return getattr(type(owner), getattr(fn, "__name__", ""), None)


def _refuse_unguarded(
    interp: Interpreter,
    fn: Any,
    args: tuple,
    kwargs: dict,
    apart: Any = _NO_TARGET,
    shallow: bool = False,
) -> None:
    """Break if a value whose type alone is guarded would reach native ``fn`` (two levels
    into tuples, lists and dicts); ``apart``, when given, is skipped, or with ``shallow``
    only checked itself (its items are only moved)."""
    recording = interp.recording
    unguarded = recording.unguarded
    if not unguarded:
        return
    owner = getattr(fn, "__self__", None)
    values = (*args, *kwargs.values()) if kwargs else args
    if owner is not None and type(owner) is not types.ModuleType:
        values = (owner, *values)
    if apart is not _NO_TARGET:
        if shallow and id(apart) in unguarded:
            raise _unguarded_break(recording, fn, apart)
        values = tuple(value for value in values if value is not apart)
    for value in values:
        if holds_unguarded(unguarded, (value,)):
            raise _unguarded_break(recording, fn, value)


def refuse_unguarded(interp: Interpreter, what: str, value: Any, shallow: bool = False) -> None:
    """Break if ``value`` is unguarded (two levels into tuples, lists and dicts, or with
    ``shallow`` itself only: its items are only moved) and native code (``what``: an
    instruction's work, such as unpacking) is about to read it."""
    if interp.native:
        return
    unguarded = interp.recording.unguarded
    if id(value) in unguarded if shallow else holds_unguarded(unguarded, (value,)):
        raise Break(
            "unguarded-value",
            f"{what} would read {_described(interp.recording, value)}, whose value the guards "
            "do not check",
        )


def _unguarded_break(recording: Any, fn: Any, value: Any) -> Break:
    return Break(
        "unguarded-value",
        f"{_name(fn)} would read {_described(recording, value)}, whose value the guards do "
        "not check",
    )


def _described(recording: Any, value: Any) -> str:
    source = recording.source_of(value)
    kind = type(value).__qualname__
    return f"{source.text} (a {kind})" if source is not None else f"a {kind}"


def _unrecorded(interp: Interpreter, result: Any) -> bool:
    """Whether native code made a stand-in the graph does not know (it did tensor work)."""
    graph = interp.recording.graph
    items = result if type(result) in (tuple, list) else (result,)
    return any(isinstance(item, StandIn) and graph.node_of(item) is None for item in items)


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


_AUTOCAST = torch.amp.autocast_mode.autocast


def records_autocast(interp: Interpreter, manager: Any) -> bool:
    """Whether a ``with`` over ``manager`` is recorded in the graph (``state_effects``): a
    ``torch.autocast`` this piece made (one from outside, whose attributes the enter would
    write at capture, is entered as Python at a piece boundary instead), for a backend that
    runs the graph's own code."""
    recording = interp.recording
    return (
        type(manager) is _AUTOCAST
        and id(manager) in recording.created
        and getattr(recording, "state_in_graph", False)  # (``entry._runs_graph_as_is``)
    )


def _autocast_enter(interp: Interpreter, args: tuple, kwargs: dict) -> Any:
    """``torch.autocast.__enter__``: entered now, so that the ops recorded next are cast as
    at run time, and recorded, so that the graph switches it too."""
    (manager,) = args
    if not records_autocast(interp, manager):
        raise Break("global-state", "entering a torch.autocast made outside the function")
    entered = _AUTOCAST.__enter__(manager)
    graph = interp.recording.graph
    graph.where = interp.where()
    state = (manager.device, manager._enabled, manager.fast_dtype, manager._cache_enabled)
    graph.record_effect(state_effects.autocast_on, state)
    return entered


# what ``torch.autocast.__exit__`` puts back: the state its enter found
_AUTOCAST_PREVIOUS = ("device", "prev", "prev_fastdtype", "prev_cache_enabled")


def _autocast_exit(interp: Interpreter, args: tuple, kwargs: dict) -> Any:
    """``torch.autocast.__exit__``: left now and recorded. The manager may come from the
    piece before (a break inside the block): what it puts back is read from it, guarded."""
    manager = args[0]
    recording = interp.recording
    if (
        type(manager) is not _AUTOCAST
        or not getattr(recording, "state_in_graph", False)
        or (id(manager) not in recording.created and recording.source_of(manager) is None)
    ):
        raise Break("global-state", "leaving a torch.autocast made outside the function")
    state = tuple(
        recording.read_attribute(manager, name, getattr(manager, name))
        for name in _AUTOCAST_PREVIOUS
    )
    graph = recording.graph
    graph.where = interp.where()
    graph.record_effect(state_effects.autocast_back, state)
    state_effects.autocast_back(*state)
    return None  # an exception is never suppressed


# torch's global-state switches other than grad mode: a graph would not record them (they
# ran at capture, once, and the ops recorded after them would not follow them at run time).
# Each is a break: it runs as Python, and the next piece is compiled under the state it set
# (which the ``global state`` guard checks).
GLOBAL_STATE_SWITCHES = tuple(
    fn
    for fn in (
        getattr(torch, name, None)
        for name in (
            "set_default_dtype", "set_default_tensor_type", "set_default_device",
            "use_deterministic_algorithms", "set_autocast_enabled", "set_autocast_dtype",
            "set_autocast_cpu_enabled", "set_autocast_cpu_dtype", "set_autocast_gpu_dtype",
            "set_autocast_cache_enabled", "autocast_increment_nesting",
            "autocast_decrement_nesting", "clear_autocast_cache",
        )
    )
    if fn is not None
)  # fmt: skip


def _global_state_switch(fn: Any):
    def switch(interp: Interpreter, args: tuple, kwargs: dict) -> None:
        if interp.native:
            return fn(*args, **kwargs)
        raise Break("global-state", f"{_name(fn)}() switches torch's global state")

    return switch


def _sum(interp: Interpreter, args: tuple, kwargs: dict) -> Any:
    """``sum`` of tensors: one recorded ``+`` per item (natively, C would add unrecorded)."""
    _refuse_unguarded(interp, builtins.sum, args, kwargs)
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
    if len(args) == 1 and _is_lazy(args[0]):
        return _eager_type(args[0])
    if len(args) == 1 and type(args[0]) in SYMBOLIC_TYPES:  # a symbolic size is an int
        return args[0].node.pytype
    result = type(*args, **kwargs)
    if len(args) == 1 and not kwargs:  # ``type(x).flag`` is then read, and guarded, from there
        interp.recording.remember_type(result, args[0])
    return result


def _isinstance(interp: Interpreter, args: tuple, kwargs: dict) -> bool:
    value, classes = args
    _refuse_unguarded(interp, builtins.isinstance, (classes,), {})  # its identity decides
    if isinstance(value, StandIn):
        return issubclass(interp.recording.graph.real_type(value), classes)
    if _is_lazy(value):
        return issubclass(_eager_type(value), classes)
    if type(value) in SYMBOLIC_TYPES:  # a symbolic size is an int
        return issubclass(value.node.pytype, classes)
    return isinstance(value, classes)


def _eager_type(lazy: Any) -> type:
    """The type eager Python gives what the interpreter runs as a lazy iterator
    (``handlers/generators.py``): a generator, or the native iterator a ``StepIterator`` wraps."""
    inner = getattr(lazy, "inner", None)
    return types.GeneratorType if inner is None else type(inner)


def _is_lazy(value: Any) -> bool:
    from fxloom.bytecode.handlers.generators import is_lazy

    return is_lazy(value)


def _rows_taken(make: Any) -> Any:
    """``enumerate``, ``zip``, ``reversed``, ``list``, ``tuple`` of a tensor iterate its rows:
    recorded as ``unbind(0)`` first (natively, C would make rows the graph never sees)."""

    def call_with_rows(interp: Interpreter, args: tuple, kwargs: dict) -> Any:
        _refuse_unguarded(interp, make, args, kwargs)
        rows = tuple(
            record(interp, "call_method", "unbind", (arg, 0), {})
            if isinstance(arg, StandIn)
            else arg
            for arg in args
        )
        made = interp.recording.built(make(*rows, **kwargs))  # a new object, the program's own
        return _over_generators(interp, made, args, kwargs)

    return call_with_rows


def _getattr(interp: Interpreter, args: tuple, kwargs: dict) -> Any:
    """``getattr(owner, name[, default])``: an attribute read like ``owner.name`` (guarded,
    properties inlined); the default where ``hasattr`` says there is none."""
    from fxloom.bytecode.handlers.names import attribute

    if len(args) < 2 or type(args[1]) is not str or kwargs:
        return _native(interp, builtins.getattr, args, kwargs, callees.lookup(builtins.getattr))
    if len(args) > 2 and not _hasattr(interp, args[:2], {}):
        return args[2]
    return attribute(interp, args[0], args[1])


def _setattr(interp: Interpreter, args: tuple, kwargs: dict) -> None:
    """``setattr(owner, name, value)``: an attribute assignment like ``owner.name = value``
    (on an object from outside: kept aside and replayed after the graph)."""
    owner, name, value = args
    if isinstance(owner, torch.Tensor) or type(name) is not str:
        return _native(interp, builtins.setattr, args, kwargs, callees.lookup(builtins.setattr))
    if id(owner) in interp.recording.created:
        setattr(owner, name, value)
    else:
        interp.recording.write_attribute(owner, name, value)


def _hasattr(interp: Interpreter, args: tuple, kwargs: dict) -> bool:
    """``hasattr(owner, name)``: on an object from outside, the answer is guarded."""
    owner, name = args
    recording = interp.recording
    if (
        not isinstance(owner, StandIn)
        and type(name) is str
        and recording.written(owner, name) is not NOT_WRITTEN
    ):
        return True
    return _native(interp, builtins.hasattr, args, kwargs, callees.lookup(builtins.hasattr))


def _id(interp: Interpreter, args: tuple, kwargs: dict) -> int:
    """``id(x)`` of an object from outside: its identity guarded, so the number is too; of any
    other object (made by this call: another number at every call), a break."""
    (value,) = args
    recording = interp.recording
    source = None if isinstance(value, StandIn) else recording.source_of(value)
    if source is None:
        raise Break("changing-result", "id() of an object made by the call changes every call")
    recording.guards.identity(source, value)
    return id(value)


SPECIAL: dict[Any, Any] = {
    builtins.id: _id,
    builtins.getattr: _getattr,
    builtins.hasattr: _hasattr,
    builtins.setattr: _setattr,
    builtins.sum: _sum,
    builtins.type: _type,
    builtins.isinstance: _isinstance,
    **{make: _rows_taken(make) for make in (enumerate, zip, reversed, list, tuple)},
    builtins.super: _super,
    torch._C._set_grad_enabled: _set_grad_enabled,
    _AUTOCAST.__enter__: _autocast_enter,
    _AUTOCAST.__exit__: _autocast_exit,
    **{fn: _global_state_switch(fn) for fn in GLOBAL_STATE_SWITCHES},
    **{fn: _deferred(fn) for fn in DEFERRED_OUTPUT},
}
