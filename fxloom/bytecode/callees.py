"""What every callable does under ``fxloom.compile``: one table, the single native-call policy.

A call in the program being compiled is looked up here (``lookup``): first the callee object
itself, then, for a method implemented in C, its (type, name) along the type's MRO, then the
module it comes from (``math``, ``random``, ``torch`` ...). Each row says what kind of callee
it is, and so what capture does with it:

========================  ====================================================================
kind                      what capture does
========================  ====================================================================
``record``                a torch operation: recorded into the graph when a tensor is involved;
                          without one it runs natively (a query of torch's state or constants)
``inline``                Python code: interpreted (standard-library and numpy Python functions
                          run natively when every argument is a constant or the program's own)
``native_pure``           C code whose result depends only on its arguments and which changes
                          nothing: runs at capture, its result a constant covered by the guards
                          on its arguments
``native_reads_outside``  C code that reads its ``target`` argument: on an object from outside,
                          what it read is guarded (``fn(source) == result``), or it breaks;
                          with no ``target`` (``os.getenv``), the result is always guarded
``native_mutating``       C code that changes its ``target`` argument (``self`` of a method): on
                          the program's own objects it runs natively; on an outside object it
                          goes to ``Recording.mutate_outside`` (a break, until replayed)
``changing_result``       another result at every call (time, randomness, ``next`` of an
                          outside iterator): a break, so the call runs as Python each time; with
                          a ``target``, a call on the program's own object runs natively
``break``                 cannot be followed (``Tensor.item``, ``exec``, ``open``): a break
``higher_order``          an operator that takes Python functions (``fxloom.cond``): each
                          function is interpreted into a graph of its own and the operator
                          recorded as one node (``fxloom.bytecode.cond_capture.CAPTURES``)
========================  ====================================================================

**A C callable with no row is a break** (kind ``unknown-callable``), whose message names it
and the fix: ``fxloom.bytecode.classify(fn, "native_pure")`` once the user has checked that
its result depends only on its arguments. A Python function with no row is inlined.

Two flags say what a native row may receive (``fxloom.bytecode.calls`` checks both, two levels
into tuples, lists and dicts): ``tensors``, stand-ins (safe only where the callable just moves
references: ``list.append``, ``isinstance``); ``identity``, values the guards know only the
type of (``Recording.unguarded``: objects from outside, numpy arrays, iterators, values Python
computed at a graph break), safe only where the callable uses nothing but identity and type.

Adding a callable is one row. The standard-library, numpy and builtin rows are listed here and
reviewed; tests/bytecode/test_callees.py checks that every builtin and every public callable
of ``math`` has a row, and that every row names a known kind.

Depends on torch, numpy (when installed) and ``fxloom.cond`` (the operator it lists).
"""

from __future__ import annotations

import builtins
import collections
import copy
import dataclasses
import functools
import inspect
import operator
import os
import sys
import threading
import types
from typing import Any

import torch

from fxloom.cond import cond, cond_op

__all__ = [
    "KINDS",
    "OUTSIDE_STATE",
    "Callee",
    "class_row",
    "classify",
    "lookup",
    "method_row",
    "is_library_module",
    "runs_natively",
    "tensor_method",
]

KINDS = (
    "record",
    "inline",
    "native_pure",
    "native_reads_outside",
    "native_mutating",
    "changing_result",
    "break",
    "higher_order",
)


class Callee:
    """One row: ``kind`` (one of ``KINDS``) and how a native call may be made; see the module
    docstring. ``tensors``: stand-ins may be passed (it only moves references to them);
    ``identity``: values whose type alone is guarded may be passed (it uses only identity and
    type); ``target``: the argument read or changed (0 is ``self`` of a bound method); with
    ``tensors``, the items of the target are only moved; ``new``: the result is a new object,
    the program's own (``"deep"``: with every container inside it); ``polyfill``: the Python
    function interpreted in its place (``inline`` rows; native rows: when given a Python
    function to call), called with the callee first; ``tensor_data``: for ``break`` rows, the
    callable reads a tensor's data."""

    __slots__ = ("kind", "tensors", "identity", "target", "new", "polyfill", "tensor_data")

    def __init__(
        self,
        kind: str,
        *,
        tensors: bool = False,
        identity: bool = False,
        target: int | None = None,
        new: bool | str = False,
        polyfill: Any = None,
        tensor_data: bool = False,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"no callee kind {kind!r}: one of {', '.join(KINDS)}")
        self.kind = kind
        self.tensors = tensors
        self.identity = identity
        self.target = target
        self.new = new
        self.polyfill = polyfill
        self.tensor_data = tensor_data

    def __repr__(self) -> str:
        flags = [
            name for name in ("tensors", "identity", "new", "tensor_data") if getattr(self, name)
        ]
        target = [] if self.target is None else [f"target={self.target}"]
        return f"Callee({self.kind!r}{''.join(f', {f}' for f in (*flags, *target))})"


# ------------------------------------------------------------------ the kinds of rows
RECORD = Callee("record", tensors=True)
INLINE = Callee("inline")
PURE = Callee("native_pure")
PURE_NEW = Callee("native_pure", new=True)  # makes a new object (a copy, a container)
# Stores and fetches references (stand-ins too): the items of its first argument are only
# moved, so they may be unguarded values (the argument itself may not).
MOVES = Callee("native_pure", tensors=True, target=0)
MOVES_NEW = Callee("native_pure", tensors=True, target=0, new=True)
IDENTITY = Callee("native_pure", tensors=True, identity=True)  # identity and type only
IDENTITY_NEW = Callee("native_pure", tensors=True, identity=True, new=True)
# ``Module.parameters()``, ``.modules()``, ...: generators over the module tree, which the
# compiled module's epoch guards: run natively, a new generator of the real objects.
MODULE_TREE_WALK = IDENTITY_NEW
READS = Callee("native_reads_outside", tensors=True, target=0)
MUTATES = Callee("native_mutating", tensors=True, target=0)
MUTATES_IDENTITY = Callee("native_mutating", tensors=True, identity=True, target=0)
CHANGING = Callee("changing_result")
CHANGING_OWN = Callee("changing_result", tensors=True, target=0)  # native on the program's own
UNSUPPORTED = Callee("break")
TENSOR_DATA = Callee("break", tensor_data=True)
HIGHER_ORDER = Callee("higher_order", tensors=True)


# Builtins that call a function they are given: with a Python function, interpreted here
# (``_native`` sends a native row that would call Python code to its polyfill, or breaks), so
# that what the function reads is guarded. Eager, as the builtins are.
_NO_DEFAULT = object()


def _sorted(sorted_fn: Any, iterable: Any, *, key: Any = None, reverse: bool = False) -> list:
    items = list(iterable)
    keys = [key(item) for item in items]
    order = sorted_fn(range(len(items)), key=keys.__getitem__, reverse=reverse)
    return [items[index] for index in order]


def _extreme(pick: Any, args: tuple, key: Any, default: Any) -> Any:
    items = list(args[0]) if len(args) == 1 else list(args)
    if not items and default is not _NO_DEFAULT:
        return default
    keys = [key(item) for item in items]
    return items[pick(range(len(items)), key=keys.__getitem__)]


def _min(min_fn: Any, *args: Any, key: Any = None, default: Any = _NO_DEFAULT) -> Any:
    return _extreme(min_fn, args, key, default)


def _max(max_fn: Any, *args: Any, key: Any = None, default: Any = _NO_DEFAULT) -> Any:
    return _extreme(max_fn, args, key, default)


def _reduce(reduce_fn: Any, function: Any, iterable: Any, *initial: Any) -> Any:
    # Listed, not iterated by name: a loop over an iterator the code also holds is a
    # ``held-iterator`` break (it could be advanced after the loop).
    items = list(iterable)
    if initial:
        value, rest = initial[0], items
    elif items:
        value, rest = items[0], items[1:]
    else:
        raise TypeError("reduce() of empty iterable with no initial value")
    for item in rest:
        value = function(value, item)
    return value


# ------------------------------------------------------------------ builtins
# Every callable in ``builtins`` (a test checks the list is complete).
_BUILTINS: dict[str, Callee] = {
    # identity and type only
    "isinstance": IDENTITY, "issubclass": IDENTITY, "type": IDENTITY, "callable": IDENTITY,
    "super": IDENTITY, "classmethod": IDENTITY_NEW, "staticmethod": IDENTITY_NEW,
    "property": IDENTITY_NEW, "object": IDENTITY_NEW, "__build_class__": UNSUPPORTED,
    "__import__": IDENTITY,
    # values: the result depends only on the arguments
    "abs": PURE, "all": PURE, "any": PURE, "ascii": PURE, "bin": PURE, "chr": PURE,
    "divmod": PURE, "format": PURE, "hash": PURE, "hex": PURE, "oct": PURE, "ord": PURE,
    "pow": PURE, "repr": PURE, "round": PURE,
    "max": Callee("native_pure", polyfill=_max), "min": Callee("native_pure", polyfill=_min),
    "sorted": Callee("native_pure", new=True, polyfill=_sorted),
    "sum": PURE, "bool": PURE, "int": PURE, "float": PURE, "complex": PURE, "str": PURE,
    "bytes": PURE, "bytearray": PURE_NEW, "frozenset": PURE_NEW, "set": PURE_NEW,
    "range": PURE, "slice": MOVES, "map": PURE_NEW, "filter": PURE_NEW,
    # containers of references (stand-ins may pass)
    "tuple": MOVES, "list": MOVES_NEW, "dict": MOVES_NEW, "enumerate": MOVES_NEW,
    "zip": MOVES_NEW, "reversed": MOVES_NEW, "iter": MOVES_NEW,
    # read or change their first argument
    "len": READS, "hasattr": READS, "getattr": READS, "setattr": MUTATES_IDENTITY,
    "delattr": MUTATES_IDENTITY, "next": CHANGING_OWN, "anext": CHANGING_OWN,
    "aiter": UNSUPPORTED,
    # the result changes between calls, or the call cannot be followed
    "id": CHANGING, "input": CHANGING, "open": CHANGING, "breakpoint": UNSUPPORTED,
    "print": MOVES,  # (calls.SPECIAL: deferred to after the graph)
    "compile": UNSUPPORTED, "eval": UNSUPPORTED, "exec": UNSUPPORTED,
    "globals": UNSUPPORTED, "locals": UNSUPPORTED, "vars": UNSUPPORTED, "dir": UNSUPPORTED,
    "memoryview": UNSUPPORTED, "help": UNSUPPORTED, "quit": UNSUPPORTED, "exit": UNSUPPORTED,
    "copyright": UNSUPPORTED, "credits": UNSUPPORTED, "license": UNSUPPORTED,
    "__loader__": UNSUPPORTED,
}  # fmt: skip

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def _lock_not_taken(method: Any, *args: Any, **kwargs: Any) -> Any:
    """A lock's ``__enter__``/``acquire`` (True) or ``__exit__``/``release`` (None), at capture."""
    return True if method.__name__ in ("__enter__", "acquire") else None


_NOT_TAKEN = Callee("inline", tensors=True, identity=True, polyfill=_lock_not_taken)
# Methods of builtin types, by (type, name). ``None`` as the name: every method of the type.
_IMMUTABLE_TYPES = (str, bytes, int, float, complex, bool, tuple, frozenset, range, slice,
                    type(None), torch.Size, torch.dtype, torch.device, torch.layout,
                    torch.memory_format)  # fmt: skip
_METHODS: dict[tuple[type, str | None], Callee] = {
    **{(kind, None): PURE for kind in _IMMUTABLE_TYPES},
    (tuple, "__getitem__"): MOVES, (tuple, "__len__"): MOVES, (tuple, "__iter__"): MOVES_NEW,
    # list
    **{(list, name): MUTATES for name in (
        "extend", "pop", "remove", "clear", "sort", "reverse", "__delitem__", "__iadd__",
        "__imul__")},
    **{(list, name): MUTATES_IDENTITY for name in ("append", "insert", "__setitem__")},
    **{(list, name): MOVES for name in ("__getitem__", "__len__", "__add__", "__mul__",
                                        "__rmul__", "__sizeof__", "__class_getitem__")},
    # (comparing items reads them: none may be unguarded or a tensor)
    **{(list, name): PURE for name in ("__contains__", "index", "count", "__eq__", "__ne__",
                                       "__lt__", "__le__", "__gt__", "__ge__", "__repr__")},
    **{(list, name): MOVES_NEW for name in ("copy", "__iter__", "__reversed__")},
    (list, "__init__"): MUTATES, (list, "__new__"): IDENTITY_NEW, (set, "__new__"): IDENTITY_NEW,
    # dict (and its views)
    **{(dict, name): MUTATES for name in ("pop", "popitem", "update", "clear", "__delitem__",
                                          "__ior__")},
    **{(dict, name): MUTATES_IDENTITY for name in ("setdefault", "__setitem__")},
    **{(dict, name): MOVES for name in ("get", "keys", "values", "items", "__getitem__",
                                        "__len__", "__contains__", "__sizeof__", "__or__",
                                        "__ror__", "__class_getitem__")},
    **{(dict, name): PURE for name in ("__eq__", "__ne__", "__repr__")},
    **{(dict, name): MOVES_NEW for name in ("copy", "fromkeys", "__iter__", "__reversed__")},
    (dict, "__init__"): MUTATES, (dict, "__new__"): IDENTITY_NEW,
    **{(view, None): MOVES for view in (type({}.keys()), type({}.values()), type({}.items()))},
    # a read-only view of a mapping (``inspect.signature(fn).parameters``, a class's __dict__)
    **{(types.MappingProxyType, name): MOVES for name in (
        "get", "keys", "values", "items", "__getitem__", "__len__", "__contains__")},
    # OrderedDict, defaultdict, deque (their other methods: dict's and list's rows above)
    (collections.OrderedDict, "move_to_end"): MUTATES,
    (collections.OrderedDict, "popitem"): MUTATES,
    (collections.OrderedDict, "setdefault"): MUTATES,
    (collections.OrderedDict, "pop"): MUTATES,
    (collections.OrderedDict, "__new__"): IDENTITY_NEW,
    (collections.defaultdict, "__missing__"): MUTATES,
    (collections.defaultdict, "copy"): MOVES_NEW,
    **{(collections.deque, name): MUTATES for name in (
        "extend", "extendleft", "pop", "popleft", "clear", "rotate", "remove", "reverse",
        "__delitem__", "__iadd__", "__init__")},
    **{(collections.deque, name): MUTATES_IDENTITY for name in (
        "append", "appendleft", "insert", "__setitem__")},
    **{(collections.deque, name): MOVES for name in ("__getitem__", "__len__")},
    **{(collections.deque, name): PURE for name in ("__contains__", "index", "count")},
    **{(collections.deque, name): MOVES_NEW for name in ("copy", "__iter__", "__reversed__",
                                                         "__copy__")},
    # set
    **{(set, name): MUTATES for name in (
        "add", "discard", "remove", "pop", "clear", "update", "difference_update",
        "intersection_update", "symmetric_difference_update", "__ior__", "__iand__",
        "__isub__", "__ixor__", "__init__")},
    **{(set, name): PURE_NEW for name in ("union", "intersection", "difference",
                                          "symmetric_difference", "copy", "__or__", "__and__",
                                          "__sub__", "__xor__", "__iter__")},
    **{(set, name): PURE for name in ("issubset", "issuperset", "isdisjoint", "__contains__",
                                      "__len__", "__eq__", "__ne__", "__le__", "__lt__",
                                      "__ge__", "__gt__")},
    # object: what user classes inherit
    (object, "__init__"): IDENTITY, (object, "__new__"): IDENTITY_NEW,
    (object, "__init_subclass__"): IDENTITY, (object, "__subclasshook__"): IDENTITY,
    (object, "__setattr__"): MUTATES_IDENTITY, (object, "__delattr__"): MUTATES_IDENTITY,
    (object, "__getattribute__"): READS, (object, "__eq__"): IDENTITY,
    (object, "__ne__"): IDENTITY, (object, "__hash__"): IDENTITY,
    # the whole state of an object (copy, pickle): no guard can check it on an outside object
    (object, "__reduce_ex__"): READS, (object, "__reduce__"): READS,
    (object, "__getstate__"): READS, (object, "__sizeof__"): READS,
    (object, "__repr__"): READS, (object, "__str__"): READS, (object, "__format__"): READS,
    (object, "__dir__"): READS,
    (type, "__call__"): IDENTITY_NEW, (type, "__instancecheck__"): IDENTITY,
    (type, "__subclasscheck__"): IDENTITY, (type, "mro"): IDENTITY,
    (type, "__subclasses__"): CHANGING,
    # functions and methods as values
    (types.FunctionType, "__get__"): IDENTITY_NEW, (types.MethodType, "__get__"): IDENTITY_NEW,
    # the process environment: what is read is guarded (``os.environ.get(key) == value``)
    (type(os.environ), "get"): READS, (type(os.environ), "__getitem__"): READS,
    (type(os.environ), "__contains__"): READS, (type(os.environ), "__len__"): READS,
    # locks: not taken at capture (a capture cut short by a break would never release one);
    # what they guard against, another thread, is not modelled
    **{(lock, name): _NOT_TAKEN for lock in _LOCK_TYPES
       for name in ("__enter__", "__exit__", "acquire", "release")},
    **{(lock, "locked"): CHANGING for lock in _LOCK_TYPES},
    # Tensor methods called on real tensors (on stand-ins: ``tensor_method``)
    (torch._C.TensorBase, None): RECORD,
}  # fmt: skip

# Tensor methods: recorded (no row needed), except those answered from metadata (natively, on
# the stand-in) and those that need data (a break).
_TENSOR_METADATA = ("size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous",
                    "element_size", "is_floating_point", "is_complex", "get_device",
                    "storage_offset", "type", "__len__", "is_signed")  # fmt: skip
_TENSOR_DATA = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy",
                "__format__", "__repr__", "__str__", "data_ptr", "__array__")  # fmt: skip
_TENSOR_METHODS: dict[str, Callee] = {
    **{name: MOVES for name in _TENSOR_METADATA},
    **{name: TENSOR_DATA for name in _TENSOR_DATA},
}


# ------------------------------------------------------------------ standard library, numpy
# copy.copy and copy.deepcopy of plain objects and builtin containers, written so that the
# interpreter reads (and guards) every attribute and item it copies; anything else goes to
# the standard library's own code (a copy of the function object, so that this table does
# not send it back here).
_ATOMIC_COPIES = frozenset(
    (type(None), int, float, bool, complex, str, bytes, type, range, type(Ellipsis),
     type(NotImplemented), types.FunctionType, types.BuiltinFunctionType, property,
     torch.dtype, torch.device, torch.layout, torch.memory_format)
)  # fmt: skip


def _library_copy(fn: Any) -> types.FunctionType:
    return types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)  # fmt: skip


_COPY, _DEEPCOPY = _library_copy(copy.copy), _library_copy(copy.deepcopy)


def _plain_class(cls: type) -> bool:
    """Whether ``copy`` copies instances of ``cls`` as their ``__dict__`` (no hook of their
    own: ``__copy__``, ``__deepcopy__``, ``__reduce_ex__``, ``__setstate__``, slots ...)."""
    import copyreg

    return (
        type(cls) is type
        and cls.__new__ is object.__new__
        and cls.__reduce_ex__ is object.__reduce_ex__
        and cls.__reduce__ is object.__reduce__
        and getattr(cls, "__getstate__", object.__getstate__) is object.__getstate__
        and not any(hasattr(cls, name) for name in ("__copy__", "__deepcopy__", "__setstate__",
                                                     "__slots__"))
        and cls not in copyreg.dispatch_table
        and "__dict__" in dir(cls)
    )  # fmt: skip


def _copy(copy_fn: Any, x: Any) -> Any:
    """``copy.copy(x)``, interpreted."""
    cls = type(x)
    if cls in _ATOMIC_COPIES or cls is tuple or cls is frozenset:
        return x
    if cls is list:
        return list(x)
    if cls is dict:
        return dict(x)
    if cls is set:
        return set(x)
    if _plain_class(cls):
        new = object.__new__(cls)
        for key, value in x.__dict__.items():
            object.__setattr__(new, key, value)
        return new
    return _COPY(x)


def _deepcopy(deepcopy_fn: Any, x: Any, memo: Any = None) -> Any:
    """``copy.deepcopy(x)``, interpreted (an explicit ``memo``: the library's own)."""
    if memo is not None:
        return _DEEPCOPY(x, memo)
    return _deepcopy_value(x, [])


def _deepcopy_value(x: Any, copies: list) -> Any:
    cls = type(x)
    if cls in _ATOMIC_COPIES:
        return x
    for old, new in copies:  # an object met twice is copied once, as deepcopy's memo does
        if old is x:
            return new
    if cls is list:
        new = []
        copies.append((x, new))
        for item in x:
            new.append(_deepcopy_value(item, copies))
        return new
    if cls is tuple:
        items = [_deepcopy_value(item, copies) for item in x]
        return x if all(new is old for new, old in zip(items, x)) else tuple(items)
    if cls is dict:
        new = {}
        copies.append((x, new))
        for key, value in x.items():
            new[_deepcopy_value(key, copies)] = _deepcopy_value(value, copies)
        return new
    if _plain_class(cls):
        new = object.__new__(cls)
        copies.append((x, new))
        for key, value in x.__dict__.items():
            object.__setattr__(new, key, _deepcopy_value(value, copies))
        return new
    return _DEEPCOPY(x)


_OBJECTS: dict[Any, Callee] = {
    # copy: new objects, the program's own (run natively on constants and the program's own
    # values, else interpreted so that what is copied is guarded)
    copy.copy: Callee("inline", new=True, polyfill=_copy),
    copy.deepcopy: Callee("inline", new="deep", polyfill=_deepcopy),
    _plain_class: IDENTITY,
    # operator: the functions behind Python's operators. Recorded on tensors like the
    # operators themselves; the in-place ones change their first argument.
    **{
        getattr(operator, name): MUTATES
        for name in ("setitem", "delitem", "iadd", "iand", "iconcat", "ifloordiv", "ilshift",
                     "imod", "imul", "imatmul", "ior", "ipow", "irshift", "isub", "itruediv",
                     "ixor", "__setitem__", "__delitem__", "__iadd__", "__iand__",
                     "__iconcat__", "__ifloordiv__", "__ilshift__", "__imod__", "__imul__",
                     "__imatmul__", "__ior__", "__ipow__", "__irshift__", "__isub__",
                     "__itruediv__", "__ixor__")
    },
    operator.attrgetter: IDENTITY_NEW, operator.itemgetter: IDENTITY_NEW,
    operator.methodcaller: IDENTITY_NEW, operator.is_: IDENTITY, operator.is_not: IDENTITY,
    operator.length_hint: READS,
    # functools
    functools.partial: IDENTITY_NEW, functools.cmp_to_key: PURE_NEW,
    functools.reduce: Callee("native_pure", polyfill=_reduce),
    # collections
    collections.deque: MOVES_NEW, collections.OrderedDict: MOVES_NEW,
    collections.defaultdict: MOVES_NEW,
    # types
    types.MethodType: IDENTITY_NEW, types.SimpleNamespace: MOVES_NEW,
    types.MappingProxyType: MOVES_NEW,
    # dataclasses: Python, interpreted so that every field read is guarded
    dataclasses.fields: INLINE, dataclasses.asdict: INLINE, dataclasses.astuple: INLINE,
    dataclasses.replace: INLINE, dataclasses.is_dataclass: INLINE,
    # inspect: what a callable's code and type say (fixed by its identity, which is guarded)
    **{
        getattr(inspect, name): IDENTITY
        for name in ("signature", "getfullargspec", "isfunction", "ismethod", "isclass",
                     "ismodule", "isbuiltin", "isroutine", "iscoroutinefunction",
                     "isgeneratorfunction", "isabstract", "isdatadescriptor", "unwrap",
                     "getmro")
    },
    os.getenv: Callee("native_reads_outside"),  # no target: always guarded
    # sys
    sys.getrecursionlimit: PURE, sys.intern: PURE, sys.getsizeof: PURE,
    # torch's global state: guarded as a whole (``guards.global_state``)
    torch.is_grad_enabled: PURE,
    # fxloom's structured control flow: both branches in the graph, one node
    cond: HIGHER_ORDER, cond_op: HIGHER_ORDER,
    # torch's own cond (its capture: a break, see ``cond_capture``)
    **({torch.cond: HIGHER_ORDER} if hasattr(torch, "cond") else {}),
}  # fmt: skip

# Exceptions: constructing one keeps references to its arguments.
_OBJECTS.update(
    {
        cls: IDENTITY_NEW
        for cls in vars(builtins).values()
        if isinstance(cls, type) and issubclass(cls, BaseException)
    }
)
_METHODS.update(
    {
        (cls, "__new__"): IDENTITY_NEW
        for cls in vars(builtins).values()
        if isinstance(cls, type) and issubclass(cls, BaseException)
    }
)
_OBJECTS.update({getattr(builtins, name): row for name, row in _BUILTINS.items()})

# Whole modules, by dotted prefix (the longest listed prefix of a callable's module decides).
# A leading underscore is ignored (``_operator`` is ``operator``).
_MODULES: dict[str, Callee] = {
    "math": PURE, "cmath": PURE, "operator": RECORD, "itertools": MOVES_NEW,
    "string": PURE, "keyword": PURE, "unicodedata": PURE, "re": PURE,
    "random": CHANGING, "time": CHANGING, "datetime": CHANGING, "uuid": CHANGING,
    "secrets": CHANGING, "os": CHANGING, "socket": CHANGING, "getpass": CHANGING,
    "select": CHANGING, "signal": CHANGING, "threading": CHANGING, "thread": CHANGING,
    "torch": RECORD,
    # Python code of torch that switches global state: interpreted, so that the switch it
    # makes (``torch._C._set_grad_enabled``) is recorded
    "torch.autograd.grad_mode": INLINE, "torch.utils._contextlib": INLINE,
    # a module class's Python method called as a function (``super().forward(x)`` in a
    # subclass of nn.Embedding, ``self.register_buffer(...)``): interpreted, never recorded
    # with the module as an argument
    "torch.nn.modules": INLINE,
}  # fmt: skip


def _numpy_rows() -> dict[Any, Callee]:
    """numpy's functions that compute a value from their arguments (ufuncs included), listed
    one by one: a numpy function not listed breaks like any unknown C callable."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is optional
        return {}
    pure = (
        "array", "asarray", "ascontiguousarray", "zeros", "ones", "full", "zeros_like",
        "ones_like", "full_like", "arange", "linspace", "eye", "identity", "mean", "sum",
        "prod", "max", "min", "amax", "amin", "argmax", "argmin", "std", "var", "median",
        "cumsum", "cumprod", "sqrt", "exp", "log", "log2", "log10", "log1p", "expm1", "tanh",
        "sinh", "cosh", "sin", "cos", "tan", "arcsin", "arccos", "arctan", "arctan2", "abs",
        "absolute", "sign", "clip", "where", "concatenate", "stack", "hstack", "vstack",
        "reshape", "transpose", "squeeze", "expand_dims", "dot", "matmul", "outer", "add",
        "subtract", "multiply", "divide", "true_divide", "floor_divide", "negative", "power",
        "maximum", "minimum", "floor", "ceil", "round", "rint", "trunc", "isfinite", "isnan",
        "isinf", "all", "any", "allclose", "isclose", "array_equal", "equal", "not_equal",
        "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or",
        "logical_not", "shape", "ndim", "size", "broadcast_to", "tile", "repeat", "flip",
        "sort", "argsort", "unique", "count_nonzero", "nonzero", "diag", "tril", "triu",
        "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool_",
        "dtype", "result_type", "promote_types", "iinfo", "finfo", "pad", "einsum",
        "square", "reciprocal", "exp2", "cbrt", "fmod", "mod", "remainder", "hypot",
        "deg2rad", "rad2deg", "copy", "float_power",
    )  # fmt: skip
    rows: dict[Any, Callee] = {
        getattr(numpy, name): PURE_NEW for name in pure if hasattr(numpy, name)
    }
    # Random numbers: another result at every call.
    for name in ("rand", "randn", "randint", "random", "normal", "uniform", "choice", "seed",
                 "permutation", "shuffle", "default_rng"):  # fmt: skip
        if hasattr(numpy.random, name):
            rows[getattr(numpy.random, name)] = CHANGING
    rows[(numpy.ndarray, None)] = PURE_NEW  # methods compute new arrays, except:
    for name in ("fill", "sort", "resize", "put", "itemset", "setflags", "partition",
                 "__setitem__", "__delitem__", "__iadd__", "__isub__", "__imul__",
                 "__itruediv__", "__ifloordiv__", "__ipow__", "__imatmul__"):  # fmt: skip
        rows[(numpy.ndarray, name)] = MUTATES
    return rows


for _key, _row in _numpy_rows().items():
    if type(_key) is tuple:
        _METHODS[_key] = _row
    else:
        _OBJECTS[_key] = _row
del _key, _row

# A ``functools.lru_cache`` function: called natively, as eager calls it: its cache decides
# (a value cached now is what eager's later calls get too, until the cache is cleared).
_METHODS[(functools._lru_cache_wrapper, "__call__")] = PURE

# OrderedDict and defaultdict define some of dict's methods again: the same rows.
for _sub in (collections.OrderedDict, collections.defaultdict):
    for _name in vars(_sub):
        if (dict, _name) in _METHODS and (_sub, _name) not in _METHODS:
            _METHODS[(_sub, _name)] = _METHODS[(dict, _name)]
del _sub, _name

# Packages whose modules' functions, classes and submodules are taken as they are when read
# from the module (rebinding ``torch.relu`` or ``math.sqrt`` between calls is not something
# programs do), and those of them whose Python functions may run natively on constants.
_LIBRARIES = frozenset(sys.stdlib_module_names) | {"torch", "transformers", "numpy", "fxloom",
                                                   "typing_extensions"}  # fmt: skip
# Objects of library modules that hold the process's outside state: never library state
# (``Recording``), always guarded like any object from outside.
OUTSIDE_STATE = frozenset((type(os.environ),))
_NATIVE_PYTHON = (frozenset(sys.stdlib_module_names) | {"typing_extensions", "numpy"}) - {
    "dataclasses",  # interpreted: their field reads must be guarded
    "functools",  # wraps user functions
    "contextlib",  # runs user code
}


# ------------------------------------------------------------------ lookup
_CLASSIFIED: dict[Any, Callee] = {}  # rows added by ``classify``: looked up first
_MODULE_ROWS: dict[str, Callee | None] = {}  # module name -> its row (a cache of _MODULES)
_METHOD_ROWS: dict[tuple[type, str], Callee | None] = {}  # cache of _METHODS along the MRO
_MISSING = object()


def lookup(fn: Any) -> Callee | None:
    """The row of ``fn``: by the object, then by (type, method name) for a method implemented
    in C, then by module; None when no row applies (a Python function: inline it; a C
    callable: a break)."""
    try:
        row = _CLASSIFIED.get(fn) or _OBJECTS.get(fn)
    except TypeError:  # unhashable
        row = None
    if row is not None:
        return row
    method = _method_of(fn)
    if method is not None:
        row = method_row(*method)
        if row is not None:
            return row
    if isinstance(fn, type):
        return None  # classes: by object only (calls._construct asks for their C base)
    kind = type(fn)
    if kind not in _PLAIN_CALLABLES:  # an object whose type says what calling it does
        row = method_row(kind, "__call__")
        if row is not None:
            return row
    return _module_row(module_of(fn))


def class_row(cls: type) -> Callee | None:
    """The row of calling class ``cls`` made by C code: its own, or its module's
    (``torch.finfo``: torch's)."""
    return lookup(cls) or _module_row(getattr(cls, "__module__", None) or "")


def method_row(owner: type, name: str) -> Callee | None:
    """The row of method ``name`` of ``owner``: along the MRO, a row for (class, name), up to
    the class that defines ``name``, whose every-method row ``(class, None)`` applies too (a
    subclass that defines the method itself has no row by its base's)."""
    key = (owner, name)
    row = _METHOD_ROWS.get(key, _MISSING)
    if row is _MISSING:
        row = None
        for klass in owner.__mro__:
            row = _METHODS.get((klass, name))
            if row is not None:
                break
            if name in vars(klass):
                row = _METHODS.get((klass, None))
                break
        _METHOD_ROWS[key] = row
    return row  # type: ignore[return-value]


def tensor_method(name: str) -> Callee:
    """What a Tensor method called on a stand-in does: answered from metadata, a break, or
    (every other method) recorded."""
    return _TENSOR_METHODS.get(name, RECORD)


def _method_of(fn: Any) -> tuple[type, str] | None:
    """(type, name) of a method implemented in C, bound (``[].append``) or not
    (``list.append``); None for anything else."""
    kind = type(fn)
    if kind is types.BuiltinMethodType or kind is types.MethodWrapperType:
        owner = fn.__self__
        if owner is None or type(owner) is types.ModuleType:
            return None  # a module-level builtin function
        return _c_owner(owner if isinstance(owner, type) else type(owner), fn.__name__)
    if kind in _DESCRIPTOR_TYPES:
        return fn.__objclass__, fn.__name__
    return None


_C_OWNERS: dict[tuple[type, str], tuple[type, str]] = {}


def _c_owner(cls: type, name: str) -> tuple[type, str]:
    """(the class of ``cls``'s MRO whose C method ``name`` is, name): a bound C method reached
    through ``super()`` from a Python override is the base's (``dict.get``), not the override."""
    key = (cls, name)
    found = _C_OWNERS.get(key)
    if found is None:
        found = key
        for klass in cls.__mro__:
            if type(vars(klass).get(name)) in _DESCRIPTOR_TYPES:
                found = (klass, name)
                break
        _C_OWNERS[key] = found
    return found


_PLAIN_CALLABLES = frozenset((types.FunctionType, types.BuiltinFunctionType,
                              types.MethodWrapperType))  # fmt: skip
_DESCRIPTOR_TYPES = frozenset(
    (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType)
)


def module_of(fn: Any) -> str:
    """The module ``fn`` comes from (for a bound method of a C object: its type's)."""
    module = getattr(fn, "__module__", None)
    if not isinstance(module, str):
        owner = getattr(fn, "__self__", None)
        if type(owner) is types.ModuleType:
            module = owner.__name__
        else:  # a bound method of a C object (random.Random().random): its type's module
            module = type(owner).__module__ if owner is not None else ""
    return module


def _module_row(module: str) -> Callee | None:
    row = _MODULE_ROWS.get(module, _MISSING)
    if row is _MISSING:
        row = None
        name = module
        while name:
            row = _MODULES.get(name.lstrip("_")) or _MODULES.get(name)
            if row is not None:
                break
            name = name.rpartition(".")[0]
        _MODULE_ROWS[module] = row
    return row  # type: ignore[return-value]


def is_library_module(module_name: str) -> bool:
    """Whether functions and classes read from module ``module_name`` are taken as they are
    (no identity guard)."""
    return module_name.partition(".")[0] in _LIBRARIES


def runs_natively(fn: types.FunctionType) -> bool:
    """Whether Python function ``fn`` (standard library, numpy) may run natively when every
    argument is a constant or the program's own value (faster than interpreting it)."""
    module = getattr(fn, "__module__", None) or ""
    return module.partition(".")[0] in _NATIVE_PYTHON


def classify(fn: Any, kind: str) -> None:
    """Declare what ``fn`` does under ``fxloom.compile`` (one of ``KINDS``), for a callable
    the table does not list, typically a C function of an extension::

        fxloom.bytecode.classify(zlib.crc32, "native_pure")

    ``native_pure`` promises that the result depends only on the arguments and that nothing
    changes; ``changing_result`` or ``break`` make every call run as Python. Applies to
    compilations from now on."""
    if kind == "inline" and type(fn) is not types.FunctionType:
        raise ValueError(f"only a Python function can be inlined, not {fn!r}")
    if kind == "higher_order":
        raise ValueError(
            "higher_order rows are fxloom's own operators that take functions (fxloom.cond), "
            "each with its capture in fxloom.bytecode.cond_capture; classify another kind"
        )
    if kind in ("native_reads_outside", "native_mutating"):
        row = Callee(kind, target=0)
    else:
        row = Callee(kind)
    _CLASSIFIED[fn] = row


def rows() -> dict[Any, Callee]:
    """Every row of the table (objects, (type, method) pairs and module names), for tests and
    documentation."""
    return {**_OBJECTS, **_METHODS, **_MODULES, **_CLASSIFIED}
