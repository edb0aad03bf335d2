"""The dispatch capture: run a program on stand-ins and record every operator it dispatches.

``Capture`` receives each ATen operator call (through a dispatch mode, so
factory calls like ``torch.zeros(3)`` are seen too, and through
``StandIn.__torch_dispatch__``) and records it as a ``call_function`` node
whose target is the operator overload, functionally:

* every live tensor the program holds is tracked by a ``Value``: the node
  that computes it now, and its ``Storage`` (the memory it shares with other
  tensors: a base and its views);
* a write (``add_``, ``out=``, a running-statistics update) is recorded as the
  functional operator, and the written tensor's storage takes the new value;
  a write through a view is carried back to the base with the view's scatter
  (``functionalize.SCATTERS``);
* a storage's other views are stale after a write: the next time the program
  reads one, it is recomputed from the base's new value by replaying its view
  operators.

So the recorded graph mutates nothing, and a storage that belongs to the
program's state or inputs tells, at the end, whether and how it was written.

Depends on ``fxloom.graph``, ``stand_in``, ``functionalize`` and ``provenance``.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C import DispatchKey, DispatchKeySet

from fxloom._torch_compat import (
    TorchDispatchMode,
    exclude_dispatch_keys,
    has_composite_implicit_kernel,
)
from fxloom.export.functionalize import (
    SCATTERS,
    UNARY_INVERSES,
    OpKind,
    UnsupportedOpError,
    ViewStep,
    classify,
)
from fxloom.export.sizes.runtime_asserts import assert_deferred
from fxloom.graph import Graph
from fxloom.node import Node
from fxloom.values.provenance import Provenance
from fxloom.values.stand_in import (
    DataDependentError,
    StandIn,
    compute_meta,
    device_of_result,
    wrap,
)
from fxloom.values.symbolic import ShapeEnv
from fxloom.values.symbolic.data_dependent import DATA_DEPENDENT_RULES, MASK_REWRITES
from fxloom.values.symbolic.meta import compute_symbolic_meta
from fxloom.values.symbolic.size_nodes import SizeNodes
from fxloom.values.symbolic_scalars import has_symbolic_size

__all__ = ["Capture", "ExportError"]

aten = torch.ops.aten
# Excluded to run an operator on a stand-in itself rather than send it to the capture.
_PYTHON_KEYS = DispatchKeySet(DispatchKey.Python) | DispatchKeySet(DispatchKey.PythonTLSSnapshot)


class ExportError(RuntimeError):
    """Export cannot capture the program as asked; the message names the operator and the line."""


class Storage:
    """Memory shared by a base tensor and its views: the node computing its current contents."""

    __slots__ = ("node", "version", "meta", "device", "initial")

    def __init__(self, node: Node, base: StandIn) -> None:
        self.node = node  # the base's value now
        self.initial = node  # its value when the program started (placeholders: itself)
        self.version = 0  # bumped by every write
        self.meta = base._meta  # the base's meta tensor (its shape and strides)
        self.device = base.device


@dataclass
class Value:
    """A tensor the program holds: the node computing it, as of its storage's ``version``."""

    stand_in: StandIn
    node: Node
    storage: Storage
    chain: tuple[ViewStep, ...] = ()  # the view operators from the storage's base to it
    version: int = 0


@dataclass
class Constant:
    """A real tensor the program used that is not a parameter or buffer (lifted to an input)."""

    name: str
    tensor: torch.Tensor
    node: Node


class _AllOperators(TorchDispatchMode):
    """Sends every operator, with or without stand-in arguments, to the capture."""

    def __init__(self, capture: Capture) -> None:
        super().__init__()
        self.capture = capture

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Else torch wraps the handler to keep torch.compile out of it, importing its compiler
        # (2 s) on the first operator; nothing is compiled inside an export.
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.capture.dispatch(func, args, kwargs or {})


@dataclass
class Capture:
    """The graph being recorded and the values the program holds; see the module docstring."""

    provenance: Provenance
    constant_names: dict[int, str] = field(default_factory=dict)  # id(tensor) -> attribute path
    graph: Graph = field(default_factory=Graph)
    values: dict[int, Value] = field(default_factory=dict)  # id(stand-in) -> Value
    constants: dict[int, Constant] = field(default_factory=dict)  # id(real tensor) -> Constant
    decompositions: dict[Any, Any] = field(default_factory=dict)
    reserved_names: set[str] = field(default_factory=set)  # constant names already taken
    shape_env: ShapeEnv = field(default_factory=ShapeEnv)
    # Whether any size is symbolic: operators then compute their metadata symbolically.
    symbolic: bool = False
    asserted: int = 0  # how many of the ShapeEnv's deferred assertions have a node
    _meta: dict[str, Any] = field(default_factory=dict)  # provenance of the operator being recorded

    def __post_init__(self) -> None:
        self.sizes = SizeNodes(self.graph, self.shape_env, lambda: self._meta)

    # --------------------------------------------------------------- inputs
    def placeholder(
        self, name: str, example: Any, sizes: list[Any] | None = None
    ) -> tuple[Node, Any]:
        """A graph input standing for ``example``; a tensor gets a tracked stand-in, whose
        sizes are ``sizes`` (ints and ``torch.SymInt``) when given."""
        node = self.graph.placeholder(name)
        if not isinstance(example, torch.Tensor):
            node.meta["val"] = example
            return node, example
        if sizes is not None:
            stand_in = StandIn.with_sizes(example, sizes)
        else:
            stand_in = StandIn.like(example)  # a stand-in (meta["val"]) keeps its symbolic sizes
        if has_symbolic_size(stand_in):
            self.symbolic = True
            self.sizes.bind_sizes(node, stand_in.shape)
        node.meta["val"] = stand_in
        self._track(stand_in, node)
        return node, stand_in

    def _track(self, stand_in: StandIn, node: Node) -> Value:
        value = Value(stand_in, node, Storage(node, stand_in))
        self.values[id(stand_in)] = value
        return value

    def constant(self, tensor: torch.Tensor) -> StandIn:
        """The stand-in of a real tensor the program uses, lifted to a constant input once."""
        found = self.constants.get(id(tensor))
        if found is None:
            name = self.constant_names.get(id(tensor)) or self._fresh_constant_name()
            self.reserved_names.add(name)
            # Placeholders stay first: before the first operator, if there is one yet.
            first_operator = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
            place = (
                self.graph.inserting_before(first_operator)
                if first_operator is not None
                else contextlib.nullcontext()
            )
            with place:
                node = self.graph.placeholder("c_" + name.replace(".", "_"))
            node.meta["val"] = StandIn.like(tensor)
            found = self.constants[id(tensor)] = Constant(name, tensor, node)
            self._track(node.meta["val"], node)
        return found.node.meta["val"]

    def _fresh_constant_name(self) -> str:
        index = len(self.constants)
        while f"lifted_tensor_{index}" in self.reserved_names:
            index += 1
        return f"lifted_tensor_{index}"

    # ------------------------------------------------------------- dispatch
    def mode(self) -> _AllOperators:
        return _AllOperators(self)

    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Record one operator call from the program and return its stand-in result."""
        if len(self.shape_env.deferred_assertions) > self.asserted:
            assert_deferred(self)  # torch._check(...) promises made since the last operator
        if func in SIZE_QUERIES:
            return self._size_query(func, args[0])
        decomposition = self.decompositions.get(func)
        if decomposition is None and _is_composite(func):
            # Only reached below autograd (inside a decomposition), where torch does not break
            # composite operators up itself.
            decomposition = func.decompose
        if decomposition is not None:
            with self.mode():
                return decomposition(*args, **kwargs)
        rewrite = MASK_REWRITES.get(func)
        if rewrite is not None:
            with self.mode():
                result = rewrite(*args, **kwargs)
            if result is not NotImplemented:
                return result
        kind = classify(func)
        self._meta = self.provenance.stamp()
        if func is aten.lift_fresh.default:  # torch.tensor(data): the data is a constant
            return self._input(args[0])
        args, kwargs = self._inputs(args), self._inputs(kwargs)
        try:
            return _HANDLERS[kind.kind](self, func, kind, args, kwargs)
        except (DataDependentError, UnsupportedOpError) as err:
            raise self.error(str(err)) from None

    def _size_query(self, func: Any, tensor: Any) -> list[int]:
        """The answer to a C++ kernel reading ``tensor``'s sizes or strides as ints: the
        ints if they are known; a symbolic one cannot be an int without fixing it."""
        values = SIZE_QUERIES[func](tensor)
        if all(type(value) is int for value in values):
            return list(values)
        raise self.error(
            f"a C++ kernel read the sizes of a tensor of shape {list(tensor.shape)} as plain "
            f"ints ({func}), which dynamic dimensions cannot be; this torch "
            f"({torch.__version__}) lacks the Python kernel export runs instead. Make those "
            "dimensions static, or use a torch release from docs/compatibility.md"
        )

    def error(self, message: str) -> ExportError:
        trace = self._meta.get("stack_trace") or self.provenance.stack_trace()
        where = f"\n{trace.rstrip()}" if trace else ""
        return ExportError(f"{message}{where}")

    def _input(self, value: Any) -> Any:
        if isinstance(value, StandIn):
            if id(value) not in self.values:
                raise ExportError(
                    f"{value} belongs to another export (a node's meta['val']?): it has no "
                    "value in this program; pass real tensors to export"
                )
            return value
        return self.constant(value)

    def _inputs(self, tree: Any) -> Any:
        """``args``/``kwargs`` with real tensors lifted to constants (lists one level deep)."""
        if type(tree) is dict:
            return {k: self._inputs(v) for k, v in tree.items()}
        if type(tree) in (tuple, list):
            return type(tree)(
                self._input(v) if isinstance(v, torch.Tensor) else self._inputs(v) for v in tree
            )
        return self._input(tree) if isinstance(tree, torch.Tensor) else tree

    # ------------------------------------------------------------- reading
    def read(self, stand_in: StandIn) -> Node:
        """The node computing ``stand_in`` now (recomputing a view whose base was written)."""
        value = self.values[id(stand_in)]
        storage = value.storage
        if value.version != storage.version:
            value.node = self._replay(storage, value.chain)[0]
            value.version = storage.version
        return value.node

    def _replay(self, storage: Storage, chain: tuple[ViewStep, ...]) -> tuple[Node, torch.Tensor]:
        node, meta = storage.node, storage.meta
        for step in chain:
            node, meta = self._view_step(step, node, meta, storage.device)
        return node, meta

    def _view_step(
        self, step: ViewStep, node: Node, meta: torch.Tensor, device: torch.device
    ) -> tuple[Node, Any]:
        out = self._on_meta(step.func, (meta, *step.args), step.kwargs)
        node = self._node(
            step.func, (node, *self._arg(step.args)), self._arg(step.kwargs), wrap(out, device)
        )
        if step.index is not None:
            out = out[step.index]
            node = self._node(operator.getitem, (node, step.index), {}, wrap(out, device))
        return node, out

    def _arg(self, value: Any) -> Any:
        """``value`` for a node's arguments: nodes for stand-ins and symbolic sizes."""
        if isinstance(value, StandIn):
            return self.read(value)
        if type(value) in (tuple, list):
            return type(value)(self._arg(v) for v in value)
        if type(value) is dict:
            return {k: self._arg(v) for k, v in value.items()}
        return self.sizes.value(value)

    def _on_meta(self, func: Any, args: tuple, kwargs: dict | None = None) -> Any:
        """``func`` on meta tensors (the metadata of its result), symbolically if sizes are."""
        if self.symbolic:
            return compute_symbolic_meta(func, args, kwargs or {})
        return func(*args, **(kwargs or {}))

    # ------------------------------------------------------------- recording
    def _node(self, func: Any, args: tuple, kwargs: dict, val: Any) -> Node:
        name = "getitem" if func is operator.getitem else func._opname
        node = self.graph.create_node("call_function", func, args, kwargs, name=name)
        node.meta.update(self._meta)
        node.meta["val"] = val
        return node

    def emit(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Record a functional call and return stand-ins for its result, each tracked anew."""
        meta_out = compute_meta(func, args, kwargs, symbolic=self.symbolic)
        node = self._node(func, self._arg(args), self._arg(kwargs), None)
        device = device_of_result(func, args, kwargs)
        result = wrap(meta_out, device)
        node.meta["val"] = result
        if isinstance(result, StandIn):
            self._track(result, node)
        elif isinstance(result, (tuple, list)):
            for index, item in enumerate(result):
                if isinstance(item, StandIn):
                    self._track(item, self._node(operator.getitem, (node, index), {}, item))
        return result

    def write(self, target: StandIn, new: StandIn) -> None:
        """``target``'s memory now holds ``new``: its storage (and base) takes the value."""
        value = self.values[id(target)]
        if new.dtype != target.dtype:  # in-place keeps the written tensor's dtype
            new = self.emit(aten._to_copy.default, (new,), {"dtype": target.dtype})
        if new.shape != target.shape:
            new = self.emit(aten.expand.default, (new, list(target.shape)), {})
        new_node = self.read(new)
        storage = value.storage
        if value.chain:
            storage.node = self._scatter_back(storage, value.chain, new_node)
        else:
            storage.node = new_node
        storage.version += 1
        value.node, value.version = new_node, storage.version

    def _scatter_back(self, storage: Storage, chain: tuple[ViewStep, ...], new: Node) -> Node:
        """The base's value with ``new`` written where the view ``chain`` reads."""
        device = storage.device
        bases = [(storage.node, storage.meta)]
        for step in chain[:-1]:
            bases.append(self._view_step(step, *bases[-1], device))
        src = new
        for step, (base, base_meta) in zip(reversed(chain), reversed(bases)):
            scatter = SCATTERS.get(step.func)
            if scatter is None:
                raise UnsupportedOpError(
                    f"a write through a view made by {step.func} cannot be carried back to the "
                    "tensor it views; write to a copy (.clone()) or extend "
                    "fxloom.export.functionalize.SCATTERS"
                )
            src_meta = src.meta["val"]._meta
            if step.func in UNARY_INVERSES:
                func, extra = scatter(step, base_meta)
                out = self._on_meta(func, (src_meta, *extra))
                src = self._node(func, (src, *self._arg(extra)), {}, wrap(out, device))
                continue
            found = scatter(step, base_meta)
            if found is None:  # same elements, another shape
                if tuple(src_meta.shape) != tuple(base_meta.shape):
                    shape = list(base_meta.shape)
                    out = self._on_meta(aten.view.default, (src_meta.contiguous(), shape))
                    src = self._node(
                        aten.view.default, (src, self._arg(shape)), {}, wrap(out, device)
                    )
                continue
            func, extra = found
            out = self._on_meta(func, (base_meta, src_meta, *extra))
            src = self._node(func, (base, src, *self._arg(extra)), {}, wrap(out, device))
        return src


# Operators with a schema and no kernel (torch answers "operator aten::size does not exist"):
# a C++ kernel calls them for the sizes of a tensor whose sizes are symbolic, as plain ints.
SIZE_QUERIES: dict[Any, Callable[[torch.Tensor], Any]] = {
    aten.size.default: lambda tensor: tensor.shape,
    aten.stride.default: lambda tensor: tensor.stride(),
}

_composite: dict[Any, bool] = {}


def _is_composite(func: Any) -> bool:
    """Whether ``func`` is defined in terms of other operators (CompositeImplicitAutograd)."""
    found = _composite.get(func)
    if found is None:
        found = _composite[func] = has_composite_implicit_kernel(func)
    return found


# ------------------------------------------------------------------ handlers by OpKind.kind


def _functional(capture: Capture, func: Any, kind: OpKind, args: tuple, kwargs: dict) -> Any:
    return capture.emit(func, args, kwargs)


def _view(capture: Capture, func: Any, kind: OpKind, args: tuple, kwargs: dict) -> Any:
    base = capture.values[id(args[0])]
    node = capture.read(args[0])
    if func is aten.alias.default:  # the same value under another name: no node needed
        result = StandIn(func(args[0]._meta), args[0].device)
        capture.values[id(result)] = Value(result, node, base.storage, base.chain, base.version)
        return result
    result = capture.emit(func, args, kwargs)
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    for index, item in enumerate(outputs):
        if isinstance(item, StandIn):
            value = capture.values[id(item)]
            step = ViewStep(func, args[1:], kwargs, index if outputs is result else None)
            value.storage, value.chain = base.storage, (*base.chain, step)
            value.version = base.storage.version
    return result


def _inplace(capture: Capture, func: Any, kind: OpKind, args: tuple, kwargs: dict) -> Any:
    result = capture.emit(kind.functional, args, kwargs)
    capture.write(args[0], result)
    return args[0]


def _out(capture: Capture, func: Any, kind: OpKind, args: tuple, kwargs: dict) -> Any:
    outs = [kwargs[name] for name in kind.written]
    inputs = {k: v for k, v in kwargs.items() if k not in kind.written}
    result = capture.emit(kind.functional, args, inputs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    for target, new in zip(outs, results):
        capture.write(target, new)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _mutable(capture: Capture, func: Any, kind: OpKind, args: tuple, kwargs: dict) -> Any:
    if kind.writes is not None and not kind.writes(args, kwargs):
        if kind.otherwise is None:
            return capture.emit(func, args, kwargs)
        return capture.emit(*kind.otherwise(args, kwargs))
    result = capture.emit(kind.functional, args, kwargs)
    returned = len(func._schema.returns)
    positions = {a.name: i for i, a in enumerate(func._schema.arguments)}
    for name, new in zip(kind.written, result[returned:]):
        position = positions[name]
        target = args[position] if position < len(args) else kwargs.get(name)
        if isinstance(target, StandIn) and isinstance(new, StandIn):
            capture.write(target, new)
    return result[0] if returned == 1 else tuple(result[:returned])


def _metadata(capture: Capture, func: Any, kind: OpKind, args: tuple, kwargs: dict) -> Any:
    """``x.unsqueeze_(0)``: ``x`` becomes the view ``unsqueeze(x, 0)`` of the same memory."""
    target = args[0]
    value = capture.values[id(target)]
    if not value.chain and value.node.op == "placeholder":
        raise capture.error(
            f"{func} changes the shape of an input or of the module's state in place, which an "
            "exported program cannot do to its caller's tensors; use the out-of-place form"
        )
    view = _view(capture, kind.functional, classify(kind.functional), args, kwargs)
    with exclude_dispatch_keys(_PYTHON_KEYS):  # the stand-in's own sizes and strides
        func(target, *args[1:], **kwargs)
    target._meta = view._meta
    became = capture.values.pop(id(view))
    value.node, value.chain, value.version = became.node, became.chain, became.version
    return target


def _data_dependent(capture: Capture, func: Any, kind: OpKind, args: tuple, kwargs: dict) -> Any:
    """An operator whose result's sizes or value come from data: new unbacked symbols."""
    capture.symbolic = True
    rule = DATA_DEPENDENT_RULES[func]
    meta_args = [arg._meta if isinstance(arg, StandIn) else arg for arg in args]
    meta_out = rule(capture.shape_env, *meta_args, **kwargs)
    node = capture._node(func, capture._arg(args), capture._arg(kwargs), None)
    if not isinstance(meta_out, torch.Tensor | tuple):  # a scalar read from data
        node.meta["val"] = meta_out
        capture.sizes.bind_scalar(meta_out.node.expr.free_symbols.pop(), node)
        return meta_out
    result = wrap(meta_out, device_of_result(func, args, kwargs))
    node.meta["val"] = result
    if isinstance(result, StandIn):
        capture._track(result, node)
        capture.sizes.bind_sizes(node, result.shape)
        return result
    for index, item in enumerate(result):
        item_node = capture._node(operator.getitem, (node, index), {}, item)
        capture._track(item, item_node)
        capture.sizes.bind_sizes(item_node, item.shape)
    return result


def _refused(capture: Capture, func: Any, kind: OpKind, args: tuple, kwargs: dict) -> Any:
    hint = (
        "export knows shapes, not data: keep the value a tensor (torch.where instead of "
        "an if on it); data-dependent values arrive with dynamic shapes"
        if "data" in kind.reason
        else "change the program as suggested"
    )
    raise capture.error(f"{func} {kind.reason}; {hint}")


_HANDLERS = {
    "functional": _functional,
    "view": _view,
    "inplace": _inplace,
    "out": _out,
    "mutable": _mutable,
    "metadata": _metadata,
    "data_dependent": _data_dependent,
    "refused": _refused,
}
