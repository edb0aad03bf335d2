"""Symbolic tracing: ``Tracer``, ``symbolic_trace`` and ``wrap``.

``Tracer().trace(root)`` runs ``root`` (an ``nn.Module``'s forward, or a
function) on ``Proxy`` inputs and returns the ``Graph`` of what it did.
While it runs, a few things are patched — and always restored, also when
tracing fails:

* ``nn.Module.__call__``: a call of a *leaf* module (by default the built-in
  ``torch.nn`` layers) is recorded as one ``call_module`` node; other modules
  are traced through;
* ``nn.Module.__getattr__``: reading a parameter of a module
  (``self.weight``) becomes a ``get_attr`` node (a buffer too, with
  ``proxy_buffer_attributes``);
* functions registered with ``wrap`` and those of ``autowrap_modules``
  (``math``) and ``autowrap_functions``: called with a proxy, they are
  recorded as ``call_function`` instead of run;
* torch's tensor factories (``torch.zeros(x.shape[0], 4)``, ``torch.arange(n)``):
  called with a proxy among their sizes, they are recorded, never evaluated
  into constants.

Hooks to override, with their documented meaning: ``is_leaf_module``,
``call_module``, ``create_proxy``, ``create_node``, ``create_arg``,
``create_args_for_root``, ``path_of_module``, ``getattr``, ``to_bool``,
``iter``. The work behind them — root arguments, patching, conversions,
example values, captured constants — lives in ``fxloom.tracing``, one module
per concern. Example — keep a custom block as one call::

    >>> import torch, fxloom
    >>> class Block(torch.nn.Module):
    ...     def forward(self, x):
    ...         return x.relu() if x.sum() > 0 else x   # data-dependent
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.block = Block()
    ...     def forward(self, x):
    ...         return self.block(x) * 2
    >>> class LeafBlocks(fxloom.Tracer):
    ...     def is_leaf_module(self, m, qualified_name):
    ...         return isinstance(m, Block) or super().is_leaf_module(m, qualified_name)
    >>> graph = LeafBlocks().trace(Net())
    >>> [n.op for n in graph.nodes]
    ['placeholder', 'call_module', 'call_function', 'output']
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import gc
import math
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fxloom import attr_path
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.immutable_collections import immutable_dict
from fxloom.node import Argument, Node, Target
from fxloom.ops.mutation import bound_mutable_schema
from fxloom.proxy import NO_VALUE, Proxy, ProxyableClassMeta, TraceError
from fxloom.pytree import container_type
from fxloom.tracing import (
    cond_trace,  # noqa: F401 - loaded with the tracer: its row of fxloom.cond.CAPTURES counts
    conversions,
    errors,
)
from fxloom.tracing.constants import TensorConstants
from fxloom.tracing.examples import ExampleRun, bind_examples
from fxloom.tracing.patcher import original_module_call
from fxloom.tracing.patches import TracePatches, holds_proxy
from fxloom.tracing.root_args import PH, concrete_args_by_name, root_arguments, root_function
from fxloom.tracing.root_index import RootIndex
from fxloom.tracing.wrapped import wrap
from fxloom.values.capturing import capturing
from fxloom.values.frames import is_plumbing
from fxloom.values.leaf_modules import is_torch_nn_leaf
from fxloom.values.module_stack import ModuleStack
from fxloom.values.provenance import SourceStamper, stamp_node

__all__ = [
    "Tracer",
    "symbolic_trace",
    "wrap",
    "PH",
    "GraphAppendingTracer",
    "ProxyableClassMeta",  # torch.fx defines it in _symbolic_trace, this module's counterpart
    "TraceError",
]


class Tracer:
    """Symbolic tracer; see the module docstring for what it patches and which hooks to override.

    Args:
        autowrap_modules: modules whose functions are recorded as calls when
            given a proxy (default: ``math``).
        autowrap_functions: more such functions.
        param_shapes_constant: evaluate ``.shape``/``.size()`` of parameters
            to constants instead of recording them.
        record_stack_traces: store the user's file/line/code of each node in
            ``node.meta["stack_trace"]``.

    Attributes of the current (or last) trace: ``root`` (the module traced; an
    empty one when tracing a function), ``graph``, ``submodule_paths``
    (module -> qualified name) and ``tensor_attrs`` (id of a captured tensor
    -> its constant's name). The hooks delegate to the pieces in
    ``fxloom.tracing``, one per concern.

    ``traced_func_name`` (class attribute, ``"forward"``): the method of a
    root module that is traced; a root without it is an error.

    ``proxy_buffer_attributes`` (class attribute, ``False``, as in torch.fx):
    reading a buffer of a module (``self.running_mean``) gives a ``get_attr``
    proxy, as a parameter does, instead of the tensor itself.

    ``record_inplace_operators`` (class attribute, ``False``; also a keyword of
    the constructor and of ``symbolic_trace``): how augmented assignment on a
    traced value is recorded. By default as torch.fx records it: a Proxy has
    no ``__iadd__``, so Python runs ``x += y`` as ``x = x + y`` and the graph
    gets ``operator.add`` — a new value, the tensor ``x`` named before is not
    changed (a node name written for torch.fx then selects the same value in
    fxloom). With ``True``, ``x += y`` is ``operator.iadd``, mutating the tensor
    as the program does (eager's semantics, visible through aliases of ``x``).
    A ``GraphAppendingTracer`` (a Transformer rebuilding a graph) keeps the
    in-place nodes it copies, so it records them in place.

    ``check_mutable_operations`` (class attribute, ``False``; set it on a
    subclass or an instance, as in torch.fx): refuse a torch function call that
    binds to a schema writing to its arguments (``torch.sigmoid(x, out=y)``,
    ``torch.log_(x)``), with ``TraceError`` (a ``RuntimeError``) naming the line.
    """

    traced_func_name: str = "forward"
    check_mutable_operations: bool = False
    record_inplace_operators: bool = False
    proxy_buffer_attributes: bool = False

    def __init__(
        self,
        autowrap_modules: tuple[types.ModuleType, ...] = (math,),
        autowrap_functions: tuple[Callable[..., Any], ...] = (),
        param_shapes_constant: bool = False,
        *,
        record_stack_traces: bool = False,
        record_inplace_operators: bool | None = None,
    ) -> None:
        if record_inplace_operators is not None:  # else the class's choice
            self.record_inplace_operators = record_inplace_operators
        self.autowrap_modules = tuple(autowrap_modules)
        self.autowrap_functions = tuple(autowrap_functions)
        self.param_shapes_constant = param_shapes_constant
        self.record_stack_traces = record_stack_traces
        # Qualified names recorded as call_module whatever is_leaf_module says (autoleaf).
        self.forced_leaves: set[str] = set()
        self._start(torch.nn.Module(), Graph())

    def _start(
        self, root: torch.nn.Module, graph: Graph, examples: dict[str, Any] | None = None
    ) -> None:
        """Create the state of one trace of ``root`` into ``graph``: the one place it is assigned.

        ``__init__`` starts with an empty root and graph, so a tracer that has
        not traced (the ``GraphAppendingTracer`` of a hand-built Proxy) has
        the same attributes; each ``trace`` starts afresh and shares nothing
        with the one before.
        """
        self.root = root
        self.graph = graph
        self._root_index = RootIndex(root)
        self.submodule_paths = self._root_index.submodule_paths
        self._constants = TensorConstants(graph, root)
        self.tensor_attrs = self._constants.names_by_id
        self._module_stack = ModuleStack()
        # The last three frames of the user's program, as torch.fx records them.
        self._sources = SourceStamper(is_plumbing, limit=3)
        self._parameter_proxy_cache: dict[str, Proxy] = {}
        # get_attr nodes of root tensors met as arguments (create_arg), one per path.
        self._argument_attrs: dict[str, Node] = {}
        self._patches = TracePatches(self, self._parameter_proxy_cache)
        self._example_run = (
            ExampleRun(self, examples, self._patches.gate) if examples is not None else None
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> Tracer:
        """A copy with its own root and graph (copied), before or after a trace.

        The per-trace machinery is not copied but started afresh around the
        copies (``_start``); modules in ``autowrap_modules`` are shared, as
        Python modules cannot be copied.
        """
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for module in self.autowrap_modules:
            memo.setdefault(id(module), module)
        new.__dict__.update(self.__dict__)
        new._start(copy.deepcopy(self.root, memo), copy.deepcopy(self.graph, memo))
        for key, value in self.__dict__.items():
            if new.__dict__[key] is value:  # not per-trace state: copy it as it is
                new.__dict__[key] = copy.deepcopy(value, memo)
        return new

    # ================================================================ entry
    def trace(
        self,
        root: torch.nn.Module | Callable[..., Any],
        concrete_args: dict[str, Any] | tuple[Any, ...] | None = None,
        *,
        example_inputs: tuple[Any, ...] | dict[str, Any] | None = None,
    ) -> Graph:
        """Trace ``root`` and return its ``Graph``; see ``symbolic_trace`` for the arguments.

        On failure raises ``TraceError`` (with ``partial_graph``) and leaves
        ``root`` and every patched global exactly as they were.
        """
        module, fn, is_module = root_function(root, self.traced_func_name)
        concrete_args = concrete_args_by_name(fn, is_module, concrete_args)
        self._start(module, Graph(), bind_examples(fn, is_module, concrete_args, example_inputs))
        patches = self._patches
        patches.activate()
        # Tracing makes many small objects and frees none of them: collections
        # during it are pure cost (they walk every object of the process).
        collecting = gc.isenabled()
        gc.disable()
        try:
            fn_globals = getattr(fn, "__globals__", {})
            callable_fn, args = self.create_args_for_root(fn, is_module, concrete_args)
            patches.install(fn_globals)
            with capturing("symbolic tracing", self._module_stack):
                result = callable_fn(*args)
                self.create_node(
                    "output",
                    "output",
                    (self.create_arg(result),),
                    {},
                    type_expr=getattr(fn, "__annotations__", {}).get("return"),
                )
        except TraceError as err:
            if err.partial_graph is None:
                err.partial_graph = self.graph
            raise
        except Exception as err:
            raise errors.failure(err, self.graph, self._module_stack.path) from err
        finally:
            if collecting:
                gc.enable()
            patches.restore()
            if self._example_run is not None:
                self._example_run.close()
        return self.graph

    def create_args_for_root(
        self,
        root_fn: Callable[..., Any],
        is_module: bool,
        concrete_args: dict[str, Any] | tuple[Any, ...] | None = None,
    ) -> tuple[Callable[..., Any], list[Any]]:
        """Create one placeholder per parameter of ``root_fn`` and return ``(fn, args)`` to call.

        Defaults become placeholder defaults; ``*args``/``**kwargs`` become
        variadic placeholders, passed to the body as the traced tuple/dict
        (``concrete_args`` may give them fixed entries); a parameter named in ``concrete_args`` is fixed
        to that value (``PH`` keeps it an input). A fixed argument stays in the
        generated signature with its value as default, and passing anything
        else raises instead of being silently ignored. With example inputs, a
        defaulted parameter they leave out is no input: the body sees its default.
        """
        return root_arguments(self, root_fn, is_module, concrete_args, self._example_run)

    # ============================================================= modules
    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        """Whether ``m`` is recorded as one ``call_module`` (True) or traced through.

        Default: modules defined in ``torch.nn`` (and ``torch.ao.nn``) are
        leaves, except ``Sequential``, which is traced through.
        """
        return is_torch_nn_leaf(m)

    def path_of_module(self, mod: torch.nn.Module) -> str:
        """The qualified name of ``mod`` in the root (a dictionary lookup)."""
        path = self.submodule_paths.get(mod)
        if path is None:
            raise TraceError(
                f"a {type(mod).__name__} module called during tracing is not a submodule of the "
                f"root {type(self.root).__name__}; register it as an attribute (self.name = module) "
                "so the graph can refer to it",
                partial_graph=self.graph,
                module_path=self._module_stack.path,
            )
        return path

    def call_module(
        self,
        m: torch.nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Record a leaf module as ``call_module``; trace through any other module."""
        path = self.path_of_module(m)
        saved = self._module_stack.enter(path, type(m))
        try:
            if path in self.forced_leaves or self.is_leaf_module(m, path):
                return self.create_proxy("call_module", path, args, kwargs)
            self._patches.traced_modules.add(m)
            return original_module_call(m, *args, **kwargs)
        except Exception as err:
            if not hasattr(err, "_fxloom_module_path"):
                err._fxloom_module_path = path  # type: ignore[attr-defined]  # innermost wins
            raise
        finally:
            self._module_stack.leave(saved)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Proxy]) -> Any:
        """What reading module attribute ``attr`` (value ``attr_val``) yields during tracing.

        Parameters of the root become (cached) ``get_attr`` proxies; buffers too with
        ``proxy_buffer_attributes``. Otherwise a buffer is read as the tensor it is, as in
        torch.fx: what the program computes from it alone is computed now (a constant of the
        graph, sharing the buffer's memory), and where it meets a traced value it becomes a
        ``get_attr`` node (``create_arg``).
        """
        if isinstance(attr_val, torch.Tensor):
            path = self._root_index.tensor_path(attr_val)
            if path is not None and (
                self.proxy_buffer_attributes or isinstance(attr_val, torch.nn.Parameter)
            ):
                return self._cached_get_attr(path, parameter_proxy_cache)
        return attr_val

    def module_at(self, path: str) -> torch.nn.Module:
        """The submodule of the root at qualified name ``path``."""
        return self._root_index.module_at(path)

    def attribute_value(self, qualified_name: str) -> Any:
        """The real value behind a ``get_attr`` target (a root attribute or a captured constant)."""
        constants = self.graph.constants
        if qualified_name in constants:
            return constants[qualified_name]
        return self._root_index.value_at(qualified_name)

    # ========================================================= recording
    def create_proxy(
        self,
        kind: str,
        target: Target,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None = None,
        type_expr: Any | None = None,
        proxy_factory_fn: Callable[[Node], Proxy] | None = None,
    ) -> Proxy:
        """Turn ``args``/``kwargs`` into graph arguments, create the node, return its proxy."""
        node = self.create_node(
            kind, target, self.create_arg(args), self.create_arg(kwargs), name, type_expr
        )
        proxy = proxy_factory_fn(node) if proxy_factory_fn is not None else self.proxy(node)
        if self._example_run is not None and kind != "placeholder":
            self._example_run.record(proxy, kind, target, args, kwargs)
        return proxy

    def proxy(self, node: Node) -> Proxy:
        return Proxy(node, self)

    def example_value(self, proxy: Proxy) -> Any:
        """``proxy``'s value for the example inputs, tensors as stand-ins (metadata, no data),
        computed now if not yet (``NO_VALUE`` when tracing without examples)."""
        if self._example_run is None:
            return NO_VALUE
        return self._example_run.value_of(proxy)

    def example_data(self, proxy: Proxy) -> Any:
        """``proxy``'s value for the example inputs with real tensors, for control flow on data."""
        if self._example_run is None:
            return NO_VALUE
        return self._example_run.data_of(proxy)

    def create_node(
        self,
        kind: str,
        target: Target,
        args: tuple[Argument, ...],
        kwargs: dict[str, Argument],
        name: str | None = None,
        type_expr: Any | None = None,
    ) -> Node:
        """Create the node and attach metadata (``nn_module_stack``, ``source_fn_stack``, and with
        ``record_stack_traces`` ``stack_trace`` and ``source_location``)."""
        if kind == "call_function" and self.check_mutable_operations:
            self._refuse_mutation(target, args, kwargs)
        node = self.graph.create_node(kind, target, args, kwargs, name, type_expr)
        # Every operation says which modules it came from ({} at the root's own level).
        operation = kind not in ("placeholder", "output")
        modules = dict(self._module_stack.entries) if operation else None
        made_by = None
        if kind in ("call_function", "call_method", "call_module"):
            made_by = (node.name, self._module_class(target) if kind == "call_module" else target)
        where = self._sources.locate(skip=1) if self.record_stack_traces else None
        stamp_node(node.meta, modules=modules, made_by=made_by, source=where)
        return node

    def _refuse_mutation(self, target: Target, args: tuple, kwargs: dict) -> None:
        schema = bound_mutable_schema(target, args, kwargs)
        if schema is not None:
            raise self.trace_error(
                f"Tried to trace mutable operation {schema}: it writes to an argument "
                "(in place, or through out=), and check_mutable_operations is set",
                "call the out-of-place form (y = torch.sigmoid(x) rather than out=y), or "
                "leave check_mutable_operations off to record the write",
                RuntimeError,
            )

    def _module_class(self, path: str) -> type:
        cls = self._module_stack.class_of(path)
        if cls is not None:
            return cls
        # Recorded by an overriding call_module that skipped super().
        module = attr_path.find(self.root, path)
        return type(module) if isinstance(module, torch.nn.Module) else torch.nn.Module

    def create_arg(self, a: Any) -> Argument:
        """Convert a value seen during tracing into a graph argument.

        Proxies become their nodes; an object with a ``__fx_create_arg__(tracer)``
        method becomes what that returns; containers (``fxloom.pytree``) are
        converted element by element, through this method; a dict subclass
        with identifier keys (a model-output class) and a dataclass instance
        become a call of their constructor; parameters, buffers and torchbind
        objects (``torch.ScriptObject``) of the root become ``get_attr`` nodes
        (a scripted submodule, owner of the TorchScript methods called on it,
        too); other tensors and torchbind objects become constants
        (``_tensor_constant0``, ``_torchbind_obj0``) kept with the graph;
        submodules become ``get_attr`` nodes. Other values (enum members, functions) stay as
        they are.
        """
        t = type(a)
        if t is Proxy:
            return a.node
        if t is tuple:
            return tuple([self.create_arg(x) for x in a])
        if isinstance(a, Proxy):
            return a.node
        if t in _SCALARS:
            return a
        if t is not list and t is not dict and hasattr(a, "__fx_create_arg__"):
            if not isinstance(a, type):  # a class defining the method is a plain value
                return a.__fx_create_arg__(self)
        container = container_type(t)
        if container is not None:
            if isinstance(a, dict):
                return self._dict_arg(a)
            children, context = container.flatten(a)
            # Rebuilt as generated code builds it: immutable lists become lists.
            return container.plain.unflatten([self.create_arg(x) for x in children], context)
        if isinstance(a, torch.Tensor):
            return self._tensor_arg(a)
        if isinstance(a, torch.ScriptObject):
            return self._script_object_arg(a)
        if isinstance(a, torch.nn.Module):
            return self.create_proxy("get_attr", self.path_of_module(a), (), {}).node
        if dataclasses.is_dataclass(a) and not isinstance(a, type):
            return self._dataclass_arg(a)
        return a

    def _dataclass_arg(self, a: Any) -> Node:
        # As in torch.fx: an unregistered dataclass instance becomes a call of
        # its class with its fields by keyword (those its constructor takes).
        fields = {
            f.name: self.create_arg(getattr(a, f.name)) for f in dataclasses.fields(a) if f.init
        }
        return self.create_node("call_function", type(a), (), fields)

    def _dict_arg(self, a: dict[Any, Any]) -> Argument:
        for key in a:
            if holds_proxy(key):
                raise self._traced_key_error(key)
        entries = {k: self.create_arg(v) for k, v in a.items()}
        t = type(a)
        if t is collections.OrderedDict and all(type(k) in _PLAIN_KEYS for k in entries):
            # Built from its (key, value) pairs, which keeps the order, takes any plain key and
            # is a form TorchScript compiles (torchvision's segmentation models return one;
            # ``OrderedDict(out=...)`` is not).
            return self.create_node("call_function", t, (list(entries.items()),), {})
        if t is dict or t is immutable_dict or not _keyword_keys(entries):
            return entries
        # A dict subclass (e.g. a model-output class) is rebuilt by its constructor,
        # so callers of the traced module get the same type back.
        return self.create_node("call_function", t, (), entries)

    def _traced_key_error(self, key: Any) -> TraceError:
        # A graph argument's keys are fixed values; a traced one would be kept as this
        # trace's Proxy object, a stale constant at run time. torch.fx refuses it too.
        shown = key.node.name if isinstance(key, Proxy) else repr(key)
        return self.trace_error(
            f"a dictionary passed on in the graph has a traced value (%{shown}) as a key; "
            "keys of dictionaries used as an argument cannot contain a Node, since a key "
            "must be the same on every run",
            "key the dictionary by a fixed value (a name, an index), or make the module "
            "building it a leaf (Tracer.is_leaf_module)",
            RuntimeError,
        )

    def _tensor_arg(self, tensor: torch.Tensor) -> Node:
        path = self._root_index.tensor_path(tensor)
        if path is not None:
            # A node, not a proxy (create_node, as torch.fx): nothing was done with the
            # tensor before it became an argument, so a create_proxy override sees no read.
            node = self._argument_attrs.get(path)
            if node is None:
                node = self._argument_attrs[path] = self.create_node("get_attr", path, (), {})
            return node
        return self.create_node("get_attr", self._constants.name_for(tensor), (), {})

    def _script_object_arg(self, obj: torch.ScriptObject) -> Node:
        path = self._root_index.script_object_path(obj)
        if path is None:  # from a global or made during forward: kept with the graph
            name = self._constants.name_for(obj, "_torchbind_obj")
            return self.create_node("get_attr", name, (), {})
        return self._get_attr_node(path)

    def _get_attr_node(self, path: str) -> Node:
        return self._cached_get_attr(path, self._parameter_proxy_cache).node

    def _cached_get_attr(self, path: str, cache: dict[str, Proxy]) -> Proxy:
        """One ``get_attr`` proxy per path and trace: a parameter read twice is one node."""
        proxy = cache.get(path)
        if proxy is None:
            proxy = cache[path] = self.create_proxy("get_attr", path, (), {})
        return proxy

    # ======================================================== conversions
    def trace_error(
        self, message: str, hint: str | None = None, kind: type[Exception] | None = None
    ) -> TraceError:
        """A ``TraceError`` naming the user's source line, the module being traced and a fix
        (also a ``kind``: the type torch.fx raises for the same mistake)."""
        return errors.trace_error(message, hint, self.graph, self._module_stack.path, kind)

    def to_bool(self, obj: Proxy) -> bool:
        """Called for ``bool(proxy)`` (``if x.sum() > 0:``).

        Without example inputs this refuses, as documented. With them, the
        branch the example takes is followed and a guard is recorded that
        raises at run time if the condition ever comes out differently.
        """
        return conversions.to_bool(self, obj)

    def length(self, obj: Proxy) -> int:
        """Called for ``len(proxy)``: refused without example inputs, as documented."""
        return conversions.length(self, obj)

    def to_python(self, obj: Proxy, convert: Callable[[Any], Any]) -> Any:
        """Called for ``int(proxy)``, ``float(proxy)`` and index use (``range(n)``)."""
        return conversions.to_python(self, obj, convert)

    def iter(self, obj: Proxy) -> Iterator[Proxy]:
        """Called for ``iter(proxy)``: unpacking of a known length works, loops do not."""
        return conversions.iterate(self, obj)


class GraphAppendingTracer(Tracer):
    """The tracer of a ``Proxy`` built by hand around a node: appends nodes to that node's graph.

    With ``root``, modules and tensors of that module are recognised as such
    (``call_module`` paths, parameters as ``get_attr``), as during a trace.
    An in-place operator applied to its proxies (a Transformer copying an
    ``operator.iadd`` node) is recorded in place, as the node it copies.
    """

    record_inplace_operators = True

    def __init__(self, graph: Graph, root: torch.nn.Module | None = None) -> None:
        super().__init__()
        self._start(root if root is not None else torch.nn.Module(), graph)


# Values that are graph arguments as they are (create_arg's fast path).
_SCALARS = frozenset(
    {
        int,
        float,
        bool,
        complex,
        str,
        type(None),
        type(Ellipsis),
        torch.dtype,
        torch.device,
        torch.memory_format,
        torch.layout,
        torch.Size,
    }
)


# Keys an OrderedDict's pairs may hold as graph arguments.
_PLAIN_KEYS = frozenset({str, int, bool, float})


def _keyword_keys(entries: dict[Any, Any]) -> bool:
    return all(isinstance(k, str) and k.isidentifier() for k in entries)


def symbolic_trace(
    root: torch.nn.Module | Callable[..., Any],
    concrete_args: dict[str, Any] | tuple[Any, ...] | None = None,
    *,
    example_inputs: tuple[Any, ...] | dict[str, Any] | None = None,
    autoleaf: bool = False,
    record_inplace_operators: bool = False,
    proxy_buffer_attributes: bool = True,
) -> GraphModule:
    """Trace ``root`` into a ``GraphModule`` named after the root's class (or function).

    ``concrete_args`` fixes parameters to values (``{"use_cache": False}``) so
    code branching on them traces; ``PH`` keeps a parameter an input. A tuple
    (as torch.fx takes) gives one value per parameter in order, or, for a
    ``forward(self, *args)``, the positional arguments.

    ``example_inputs`` (beyond torch.fx; a tuple for the leading non-fixed
    positional parameters, or a dict by name) lets the tracer run the program
    alongside the recording. Questions about tensors that do not change between
    calls — ``x.dim()``, ``x.dtype``, ``x.device`` — are then answered from the
    examples, and control flow on traced values follows the examples' branch
    with a run-time guard in the graph that raises if another input would take
    another branch. Sizes stay symbolic unless control flow depends on them.
    Model and library code then also sees ``isinstance(x, torch.Tensor)``
    hold for a traced tensor, and attribute probes answered as for the example
    (``hasattr(x, "jax")`` is False).

    The examples name the inputs, as torch.export's kwargs do: the traced
    module takes exactly those (by name, or by position for a tuple; names
    beyond the parameters go to ``**kwargs``, extra positional examples to
    ``*args``), and the model sees every other parameter at its default, as in
    the call ``root(**example_inputs)``. To make a defaulted parameter an input
    anyway, give it an example, or name it ``PH`` in ``concrete_args`` (its
    default is then its example: where that is None, give an example instead).
    A parameter without a default stays an input. Without ``example_inputs``
    every parameter not in ``concrete_args`` is an input, as in torch.fx.

    >>> import torch, fxloom
    >>> class Scaled(torch.nn.Module):
    ...     def forward(self, x, mask=None, scale=2.0):
    ...         return x * scale if mask is None else x * mask * scale
    >>> gm = fxloom.symbolic_trace(Scaled(), example_inputs={"x": torch.ones(2)})
    >>> print(gm.code.strip())
    def forward(self, x):
        check_tensor_input(x, torch.float32, 1, 'x')
        mul = x * 2.0;  x = None
        return mul

    ``autoleaf`` (beyond torch.fx): when a submodule cannot be traced, keep the
    innermost user-defined module around the failure as a ``call_module`` and
    trace again; ``gm.meta["autoleaf"]`` lists those modules and why
    (``fxloom.autoleaf.LeafDecision``).

    ``record_inplace_operators`` (beyond torch.fx): record ``x += y`` on a
    traced value as ``operator.iadd``, mutating the tensor as the program does,
    instead of torch.fx's ``operator.add`` (see ``Tracer``).

    ``proxy_buffer_attributes`` (``Tracer``'s attribute; here ``True``, beyond
    torch.fx's ``symbolic_trace``): buffers read by the program are traced
    values, so code combining a buffer with traced sizes traces
    (``self.token_type_ids[:, :n].expand(batch, n)`` in Hugging Face's BERT);
    ``False`` reads them as tensors, as torch.fx does, where what is computed
    from a buffer alone becomes a constant. A ``Tracer`` (and a subclass, the
    way torchvision traces) reads them as torch.fx does unless told.
    """

    def make_tracer() -> Tracer:
        tracer = Tracer(record_inplace_operators=record_inplace_operators)
        tracer.proxy_buffer_attributes = proxy_buffer_attributes
        return tracer

    def attempt(tracer: Tracer) -> Graph:
        return tracer.trace(root, concrete_args, example_inputs=example_inputs)

    decisions = []
    if autoleaf and isinstance(root, torch.nn.Module):
        from fxloom.autoleaf import trace_with_autoleaf

        tracer, graph, decisions = trace_with_autoleaf(make_tracer, root, attempt)
    else:
        tracer = make_tracer()
        graph = attempt(tracer)
    name = (
        type(root).__name__
        if isinstance(root, torch.nn.Module)
        else getattr(root, "__name__", type(root).__name__)
    )
    gm = GraphModule(tracer.root, graph, name)
    if autoleaf:
        gm.meta["autoleaf"] = decisions
    return gm
