"""``Proxy``: the stand-in value that records operations during symbolic tracing.

A ``Proxy`` wraps a ``Node`` of the graph being built. Every operation applied
to it — a torch function (through ``__torch_function__``), a Tensor method, a
Python operator, attribute access, indexing — creates a new node through its
tracer and returns a new ``Proxy`` for the result::

    x + 1        -> call_function operator.add (x, 1)
    x.relu()     -> call_method relu (x,)
    x.shape      -> call_function getattr (x, "shape")
    x[:, 0] = v  -> call_function operator.setitem (x, (slice(None), 0), v)
    x += y       -> call_function operator.add (x, y)    # x = x + y, as in torch.fx
    x += y       -> call_function operator.iadd (x, y)   # in place, with the tracer's
                                                         # record_inplace_operators

What cannot be recorded — turning a proxy into a Python ``bool``, ``int`` or
``len``, or iterating over it an unknown number of times — raises
``TraceError`` naming the user's source line and what to do instead.
Unpacking with a length visible at the call site (``a, b = x.chunk(2)``) works.
"""

from __future__ import annotations

import inspect
import operator
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from fxloom.node import Node
from fxloom.ops.python_operators import PYTHON_OPERATORS
from fxloom.pytree import tree_leaves
from fxloom.values.frames import user_frame

if TYPE_CHECKING:
    from fxloom.graph import Graph
    from fxloom.tracer import Tracer

__all__ = [
    "Proxy",
    "Attribute",
    "ProxyableClassMeta",
    "TraceError",
    "NO_VALUE",
    "PENDING",
    "user_frame",
]


class _NoValue:
    """A proxy's example value when tracing runs without example inputs."""

    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE: Any = _NoValue()


class _Pending:
    """A proxy's example value not computed yet: example values are computed on first need."""

    def __repr__(self) -> str:
        return "PENDING"


PENDING: Any = _Pending()

# Tensor properties treated as fixed by the example inputs (an input guard
# checks dtype and rank at run time): read from the example value, not recorded.
STATIC_TENSOR_ATTRIBUTES = frozenset(
    {
        "dtype",
        "device",
        "ndim",
        "layout",
        "is_cuda",
        "is_cpu",
        "is_meta",
        "is_sparse",
        "is_sparse_csr",
        "is_nested",
        "is_mkldnn",
        "is_xpu",
        "is_mps",
        "is_quantized",
        "dim",
        "ndimension",
        "is_floating_point",
        "is_complex",
        "element_size",
        "get_device",
    }
)


class TraceError(ValueError, RuntimeError):
    """Symbolic tracing could not record the program.

    A ``ValueError`` like torch.fx's ``TraceError`` and a ``RuntimeError`` like
    its refusal of ``len(proxy)``, so handlers written for either catch it. An
    exception raised by the traced code itself comes out as ``TraceError.like``
    its type: ``except TypeError`` and ``except TraceError`` both catch it, and
    ``__cause__`` is the original.

    Attributes:
        partial_graph: the graph captured up to the failure (or ``None``).
        location: ``"file:line"`` of the user code that failed (or ``None``).
        module_path: qualified name of the module being traced (``""`` is the root).

    Example::

        >>> err = TraceError.like(KeyError)("no key 'k' at net.py:3")
        >>> isinstance(err, KeyError), isinstance(err, TraceError), str(err)
        (True, True, "no key 'k' at net.py:3")
    """

    # The message as given: KeyError (and others) would print it quoted.
    __str__ = BaseException.__str__

    def __init__(
        self,
        message: str,
        *,
        partial_graph: Graph | None = None,
        location: str | None = None,
        module_path: str | None = None,
    ) -> None:
        # Only BaseException's initialiser: the other base of a ``like`` class
        # may want arguments of its own (UnicodeDecodeError, user exceptions).
        BaseException.__init__(self, message)
        self.partial_graph = partial_graph
        self.location = location
        self.module_path = module_path

    @staticmethod
    def like(kind: type[BaseException]) -> type[TraceError]:
        """``TraceError`` that is also a ``kind`` (one class per ``kind``, made once).

        Falls back to ``TraceError`` itself where Python cannot combine the two
        (a ``kind`` whose instances are laid out differently).
        """
        return _trace_error_like(kind)

    def __reduce__(self) -> tuple[Any, ...]:
        # A ``like`` class is made at run time and has no importable name.
        kind = type(self).__dict__.get("_kind")
        state = dict(self.__dict__, partial_graph=None)  # graphs do not travel
        return (_rebuild_trace_error, (kind, self.args[0] if self.args else ""), state)


_LIKE: dict[type[BaseException], type[TraceError]] = {}


def _trace_error_like(kind: type[BaseException]) -> type[TraceError]:
    if issubclass(TraceError, kind) or not issubclass(kind, Exception):
        return TraceError
    cls = _LIKE.get(kind)
    if cls is None:
        try:
            cls = type(f"TraceError({kind.__name__})", (TraceError, kind), {"_kind": kind})
            cls.__module__ = TraceError.__module__
            cls("")  # the other base accepts TraceError's way of being made
        except TypeError:
            cls = TraceError
        _LIKE[kind] = cls
    return cls


def _rebuild_trace_error(kind: type[BaseException] | None, message: str) -> TraceError:
    cls = TraceError if kind is None else _trace_error_like(kind)
    return cls(message)


def is_tensor_method(func: Any) -> bool:
    """Whether ``__torch_function__`` got a ``Tensor`` method or property (recorded as
    ``call_method``) rather than a function such as ``torch.add``.

    Same answer as ``torch.overrides.is_tensor_method_or_property``, without the
    table of every overridable function that it builds on first use (milliseconds,
    paid by the first trace of a process).
    """
    name = getattr(func, "__name__", None)
    if name == "__get__":  # a property's getter: ``x.shape``, ``x.T``
        return True
    if name is None:
        return False
    method = getattr(torch.Tensor, name, None)
    # ``Tensor.__pow__`` wraps ``Tensor.pow`` (keeping its name) to return NotImplemented.
    return method is not None and (method is func or method is getattr(func, "__wrapped__", None))


# ----------------------------------------------------------------- Proxy
class Proxy:
    """A value under symbolic tracing; see the module docstring.

    ``Proxy(node, tracer)`` can also be built by hand around a node of a graph
    being edited, to write new nodes with ordinary operators.

    When tracing with example inputs, ``_fxloom_example`` is the value this
    proxy takes for them (``NO_VALUE`` otherwise), with every tensor a
    ``StandIn`` (shape, dtype, device, no data); the tracer uses it to answer
    questions a program asks about its tensors (``x.dim()``, ``x.dtype``,
    ``hasattr(x, "jax")``). Where control flow depends on data, the tracer asks
    for the real value (``Tracer.example_data``) and specialises under a
    run-time guard. Both are computed on first read: a program that never asks
    costs no more to trace than without examples.

    fxloom's own attributes are ``node`` and ``tracer`` (torch.fx's) and names
    starting with ``_fxloom_``: any other name read on a proxy is the traced
    value's attribute (``x.value`` of a traced enum or result object is recorded).
    """

    # _fxloom_value: the example value so far (PENDING: not computed yet; NO_VALUE: none).
    # _fxloom_data: the real example value, once the examples had to run for real.
    __slots__ = ("node", "tracer", "_fxloom_value", "_fxloom_data")

    def __init__(self, node: Node, tracer: Tracer | None = None) -> None:
        if tracer is None:
            from fxloom.tracer import GraphAppendingTracer

            tracer = GraphAppendingTracer(node.graph)
        self.node = node
        self.tracer = tracer
        self._fxloom_value = NO_VALUE
        self._fxloom_data = PENDING

    @property
    def _fxloom_example(self) -> Any:
        """The example value (stand-ins for tensors), computed now if it is not yet."""
        value = self._fxloom_value
        if value is PENDING:
            value = self.tracer.example_value(self)
        return value

    def _fxloom_record_call(self, target: Callable[..., Any], args: tuple) -> Proxy:
        """Record ``target(*args)`` as a call: how fxloom's run-time checks, used inside a
        module being traced again, meet this value (``fxloom.runtime_checks``)."""
        return self.tracer.create_proxy("call_function", target, args, {})

    def __repr__(self) -> str:
        return f"Proxy({self.node.name})"

    def __hash__(self) -> int:
        return id(self)

    def __getattr__(self, name: str) -> Attribute:
        if (name.startswith("__") and name.endswith("__")) or name.startswith("_fxloom_"):
            # copy, pickle and friends probe for dunders; recording them would lie. fxloom's
            # own names are only missing while a proxy is being built.
            raise AttributeError(name)
        tracer = self.tracer
        if name in STATIC_TENSOR_ATTRIBUTES:
            value = self._fxloom_example
            if isinstance(value, torch.Tensor):
                return getattr(value, name)  # fixed by the example inputs (guarded at run time)
        if (
            tracer.param_shapes_constant
            and name in _SHAPE_ATTRIBUTES
            and self.node.op == "get_attr"
        ):
            # Parameter shapes are fixed: read them instead of recording them.
            return getattr(tracer.attribute_value(self.node.target), name)
        if name in TENSOR_DATA_ATTRIBUTES:
            # Read now, not at first use: an in-place op in between must not change it.
            return tracer.create_proxy("call_function", getattr, (self, name), {})
        if name not in _TENSOR_ATTRIBUTES and self._fxloom_value is not NO_VALUE:
            _check_example_has(self, name)
        return Attribute(self, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Proxy:
        return self.tracer.create_proxy("call_method", "__call__", (self, *args), kwargs)

    # -------------------------------------------------- torch functions
    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        tracer = tracer_of(args, kwargs)
        if tracer is None:  # pragma: no cover - torch only calls us when a proxy is present
            return func(*args, **kwargs)
        if is_tensor_method(func):
            return tracer.create_proxy("call_method", func.__name__, args, kwargs)
        if isinstance(func, torch.ScriptMethod):
            # A TorchScript method (a scripted submodule's forward, a torchbind object's
            # method): called on its owner, which the graph reads with get_attr, as in
            # torch.fx; the method object itself could be neither copied nor pickled.
            return tracer.create_proxy("call_method", func.name, (func.owner, *args), kwargs)
        return tracer.create_proxy("call_function", func, args, kwargs)

    # --------------------------------------------- unrecordable conversions
    def __bool__(self) -> bool:
        return self.tracer.to_bool(self)

    def __iter__(self) -> Iterator[Proxy]:
        return self.tracer.iter(self)

    def __len__(self) -> int:
        return self.tracer.length(self)

    def __int__(self) -> int:
        return self.tracer.to_python(self, int)

    def __index__(self) -> int:
        return self.tracer.to_python(self, operator.index)

    def __float__(self) -> float:
        return self.tracer.to_python(self, float)

    def __contains__(self, item: Any) -> bool:
        return self.tracer.to_bool(
            self.tracer.create_proxy("call_function", operator.contains, (self, item), {})
        )

    # ------------------------------------------------------------- numpy
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        # np.sqrt(x.shape[-1]) in model code: recorded like any other call.
        if method != "__call__":
            return NotImplemented
        return self.tracer.create_proxy("call_function", ufunc, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        return self.tracer.create_proxy("call_function", func, args, kwargs)


# Tensor attributes that are data, not methods (shape, T, grad, ...): getattr
# nodes for them are created where they are read.
TENSOR_DATA_ATTRIBUTES = (
    frozenset(
        name
        for name in dir(torch.Tensor)
        if not name.startswith("_")
        and isinstance(
            inspect.getattr_static(torch.Tensor, name, None),
            (property, types.GetSetDescriptorType, types.MemberDescriptorType),
        )
    )
    - STATIC_TENSOR_ATTRIBUTES
)

_SHAPE_ATTRIBUTES = frozenset({"shape", "size", "dim", "ndim", "numel", "dtype"})

# Every name a tensor answers: reading one of them needs no example value to be computed.
_TENSOR_ATTRIBUTES = frozenset(dir(torch.Tensor))


def _check_example_has(proxy: Proxy, name: str) -> None:
    """Raise ``AttributeError`` where the example value has no attribute ``name``.

    Libraries probe values (``hasattr(x, "jax")``, ``getattr(x, "numpy", None)``) to
    learn what they are; a proxy answering yes to everything would send them down the
    wrong branch and record a call that fails at run time. With example inputs the
    answer is the eager one; the attribute is still recorded when it exists.
    """
    value = proxy._fxloom_example
    if value is NO_VALUE:
        return
    try:
        getattr(value, name)
    except AttributeError:
        kind = "Tensor" if isinstance(value, torch.Tensor) else type(value).__name__
        raise AttributeError(
            f"{kind!r} object has no attribute {name!r} (the example value of "
            f"{_spelled(proxy)}, as the model would see it when run eagerly)"
        ) from None
    except Exception:  # a property failing on stand-ins: record the read, as without examples
        pass


def _spelled(proxy: Proxy) -> str:
    """``%node`` or ``%node.attr``: an attribute not yet used has no node, and naming it
    must not record one."""
    if isinstance(proxy, Attribute) and proxy._lazy_node is None:
        return f"{_spelled(proxy.root)}.{proxy.attr}"
    return f"%{proxy.node.name}"


class Attribute(Proxy):
    """``proxy.name``: becomes a ``getattr`` node when used as a value, or a method call when called."""

    __slots__ = ("root", "attr", "_lazy_node")

    def __init__(self, root: Proxy, attr: str) -> None:
        self.root = root
        self.attr = attr
        self.tracer = root.tracer
        self._lazy_node: Node | None = None
        self._fxloom_value = NO_VALUE if root._fxloom_value is NO_VALUE else PENDING
        self._fxloom_data = PENDING

    @property
    def _fxloom_example(self) -> Any:
        value = self._fxloom_value
        if value is PENDING:
            value = NO_VALUE
            root_value = self.root._fxloom_example
            if root_value is not NO_VALUE:
                try:
                    value = getattr(root_value, self.attr)
                except Exception:  # the recorded program will fail the same way when run
                    pass
            self._fxloom_value = value
        return value

    @property
    def node(self) -> Node:  # type: ignore[override]
        if self._lazy_node is None:
            proxy = self.tracer.create_proxy("call_function", getattr, (self.root, self.attr), {})
            self._lazy_node = proxy.node
        return self._lazy_node

    def __call__(self, *args: Any, **kwargs: Any) -> Proxy:
        return self.tracer.create_proxy("call_method", self.attr, (self.root, *args), kwargs)


def tracer_of(args: tuple, kwargs: dict) -> Tracer | None:
    """The tracer of the first proxy among ``args`` and ``kwargs`` (inside containers too), if any."""
    for value in args:  # the usual case, checked first: a proxy among the arguments themselves
        if isinstance(value, Proxy):
            return value.tracer
    for value in tree_leaves((args, kwargs)):
        if isinstance(value, Proxy):
            return value.tracer
    return None


class ProxyableClassMeta(type):
    """Metaclass whose classes, constructed from proxies, are recorded as one call.

    Building an instance with a ``Proxy`` among the arguments (inside
    containers too) records ``call_function(cls, args, kwargs)`` and returns
    its proxy; with no proxy, the class is constructed as usual.

    >>> import torch, fxloom
    >>> class Pair(metaclass=fxloom.ProxyableClassMeta):
    ...     def __init__(self, left, right):
    ...         self.left, self.right = left, right
    >>> def pair_up(x):
    ...     return Pair(x, x + 1)
    >>> gm = fxloom.symbolic_trace(pair_up)
    >>> [n.op for n in gm.graph.nodes]
    ['placeholder', 'call_function', 'call_function', 'output']
    >>> gm(torch.zeros(1)).right
    tensor([1.])
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        tracer = tracer_of(args, kwargs)
        if tracer is None:
            return super().__call__(*args, **kwargs)
        return tracer.create_proxy("call_function", cls, args, kwargs)


# ------------------------------------------------------------- operators
# Every Python operator with a hook (``fxloom.ops.python_operators``) records its function:
# ``x + 1`` -> ``operator.add(x, 1)``; reflected forms (``1 + x`` calls ``x.__radd__(1)``)
# record the same function, arguments swapped. ``x += y`` -> ``operator.iadd``, so the tensor
# is mutated where the user mutated it, only where the tracer's ``record_inplace_operators``
# asks for it; else the hook answers NotImplemented and Python runs ``x = x + y``, recording
# ``operator.add`` as torch.fx (whose Proxy has no ``__iadd__``) does. ``in`` is the exception:
# Python turns the result into a bool, so ``Proxy.__contains__`` is written out above.
def _forward_method(fn: Any) -> Any:
    def method(self: Proxy, *operands: Any) -> Proxy:
        return self.tracer.create_proxy("call_function", fn, (self, *operands), {})

    return method


def _in_place_method(fn: Any) -> Any:
    def method(self: Proxy, operand: Any) -> Proxy:
        if not self.tracer.record_inplace_operators:
            return NotImplemented  # Python falls back to the binary operator: torch.fx's add
        return self.tracer.create_proxy("call_function", fn, (self, operand), {})

    return method


def _reflected_method(fn: Any) -> Any:
    def method(self: Proxy, other: Any) -> Proxy:
        return self.tracer.create_proxy("call_function", fn, (other, self), {})

    return method


def _install_operators() -> None:
    for fn, entry in PYTHON_OPERATORS.items():
        if entry.hook is None or entry.kind == "contains":
            continue
        make = _in_place_method if entry.kind == "augmented" else _forward_method
        setattr(Proxy, entry.hook, make(fn))
        if entry.reflected_hook is not None:
            setattr(Proxy, entry.reflected_hook, _reflected_method(fn))


_install_operators()
