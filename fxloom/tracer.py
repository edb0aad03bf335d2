"""Symbolic tracing: ``Tracer``, ``symbolic_trace`` and ``wrap``.

``Tracer().trace(root)`` runs ``root`` (an ``nn.Module``'s forward, or a
function) on ``Proxy`` inputs and returns the ``Graph`` of what it did.
While it runs, a few things are patched — and always restored, also when
tracing fails:

* ``nn.Module.__call__``: a call of a *leaf* module (by default the built-in
  ``torch.nn`` layers) is recorded as one ``call_module`` node; other modules
  are traced through;
* ``nn.Module.__getattr__``: reading a parameter or buffer of a module
  (``self.weight``) becomes a ``get_attr`` node;
* functions registered with ``wrap`` and those of ``autowrap_modules``
  (``math``) and ``autowrap_functions``: called with a proxy, they are
  recorded as ``call_function`` instead of run;
* torch's tensor factories (``torch.zeros(x.shape[0], 4)``, ``torch.arange(n)``):
  called with a proxy among their sizes, they are recorded, never evaluated
  into constants.

Hooks to override, with their documented meaning: ``is_leaf_module``,
``call_module``, ``create_proxy``, ``create_node``, ``create_arg``,
``create_args_for_root``, ``path_of_module``, ``getattr``, ``to_bool``,
``iter``. Example — keep a custom block as one call::

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

import builtins
import functools
import gc
import inspect
import math
import os
import sys
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fxloom._examples import PH, ExampleRun, bind_examples, clone_tensors
from fxloom._patching import (
    Patcher,
    capturing,
    original_module_call,
    original_module_getattr,
    unwrapped,
    wrap,
    wrapped_names,
)
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.guards import (
    FixedArgument,
    check_guard,
    check_length,
    check_tensor_input,
    check_variadic_keys,
    check_variadic_length,
)
from fxloom.immutable_collections import immutable_dict
from fxloom.node import Argument, Node, Target
from fxloom.proxy import (
    NO_VALUE,
    PENDING,
    Proxy,
    TraceError,
    _find_tracer,
    describe_frame,
    unpack_length,
    user_frame,
)

__all__ = ["Tracer", "symbolic_trace", "wrap", "PH", "GraphAppendingTracer", "TraceError"]


# Tensor factories whose size/shape arguments may hold traced values.
_TENSOR_FACTORIES = (
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
    """

    def __init__(
        self,
        autowrap_modules: tuple[types.ModuleType, ...] = (math,),
        autowrap_functions: tuple[Callable[..., Any], ...] = (),
        param_shapes_constant: bool = False,
        *,
        record_stack_traces: bool = False,
    ) -> None:
        self.autowrap_modules = tuple(autowrap_modules)
        self.autowrap_functions = tuple(autowrap_functions)
        self.param_shapes_constant = param_shapes_constant
        self.record_stack_traces = record_stack_traces
        self.root: torch.nn.Module = torch.nn.Module()
        self.graph: Graph = Graph()
        self.tensor_attrs: dict[int, str] = {}
        self.submodule_paths: dict[torch.nn.Module, str] = {}
        self._param_paths_index: dict[int, str] | None = {}
        self._visited_globals: set[int] = set()
        self._watched_classes: set[type] = set()
        self._module_path_stack: list[str] = [""]
        self._module_stack: dict[str, tuple[str, type]] = {}
        self._parameter_proxy_cache: dict[str, Proxy] = {}
        self._examples: dict[str, Any] | None = None
        self._example_run: ExampleRun | None = None
        self._computing_value = False
        self._modules_by_path: dict[str, torch.nn.Module] | None = None
        # Qualified names recorded as call_module whatever is_leaf_module says (autoleaf).
        self.forced_leaves: set[str] = set()
        # Originals, not our wrappers, even if this tracer is made while another traces.
        self._autowrap_ids = {
            id(unwrapped(value))
            for module in self.autowrap_modules
            for value in vars(module).values()
            if callable(value) and not isinstance(value, type)
        } | {id(unwrapped(fn)) for fn in self.autowrap_functions}
        self._autowrap_ids |= {id(unwrapped(getattr(torch, name))) for name in _TENSOR_FACTORIES}

    # ================================================================ entry
    def trace(
        self,
        root: torch.nn.Module | Callable[..., Any],
        concrete_args: dict[str, Any] | None = None,
        *,
        example_inputs: tuple[Any, ...] | dict[str, Any] | None = None,
    ) -> Graph:
        """Trace ``root`` and return its ``Graph``; see ``symbolic_trace`` for the arguments.

        On failure raises ``TraceError`` (with ``partial_graph``) and leaves
        ``root`` and every patched global exactly as they were.
        """
        if isinstance(root, torch.nn.Module):
            self.root = root
            fn = type(root).forward
            is_module = True
        elif callable(root):
            self.root = torch.nn.Module()
            fn = root
            is_module = False
        else:
            raise TypeError(
                f"symbolic tracing needs an nn.Module or a function, got {type(root).__name__}"
            )
        self.graph = Graph()
        self.tensor_attrs = {}
        self.submodule_paths = {}
        for name, module in self.root.named_modules(remove_duplicate=False):
            self.submodule_paths.setdefault(module, name)
        self._param_paths_index = None
        self._visited_globals: set[int] = set()
        self._watched_classes: set[type] = set()
        self._traced_modules: set[torch.nn.Module] = {self.root}
        self._parameter_proxy_cache: dict[str, Proxy] = {}
        self._module_path_stack = [""]
        self._module_stack = {}
        self._patcher = Patcher()
        self._modules_by_path = None
        self._examples = bind_examples(fn, is_module, concrete_args, example_inputs)
        self._example_run = ExampleRun(self) if self._examples is not None else None
        self._computing_value = False
        _active_tracers.append(self)
        # Tracing makes many small objects and frees none of them: collections
        # during it are pure cost (they walk every object of the process).
        collecting = gc.isenabled()
        gc.disable()
        try:
            fn_globals = getattr(fn, "__globals__", {})
            callable_fn, args = self.create_args_for_root(fn, is_module, concrete_args)
            self._install_patches(fn_globals)
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
            raise self._wrap_failure(err) from err
        finally:
            if collecting:
                gc.enable()
            _active_tracers.remove(self)
            self._patcher.restore()
            self._forget_cached_proxies()
            if self._example_run is not None:
                self._example_run.restore()
                self._example_run = None  # values not computed by now never will be
        return self.graph

    def _forget_cached_proxies(self) -> None:
        """Drop traced values a module cached in a dict (``self.cache[key] = x``).

        Assignments are undone by the class watchers; entries added to a dict
        attribute are found here, so the eager module never sees a Proxy.
        """
        for module in self._traced_modules:
            for name, value in list(vars(module).items()):
                if type(value) is dict and name not in _MODULE_INTERNALS:
                    stale = [key for key, entry in value.items() if _holds_proxy((entry,))]
                    for key in stale:
                        del value[key]

    @property
    def _param_paths(self) -> dict[int, str]:
        """id(parameter or buffer) -> qualified name; built on first need (often never:
        the layers owning the parameters are usually leaves)."""
        index = self._param_paths_index
        if index is None:
            index = {}
            named = (
                *self.root.named_parameters(remove_duplicate=False),
                *self.root.named_buffers(remove_duplicate=False),
            )
            for name, value in named:
                index.setdefault(id(value), name)
            self._param_paths_index = index
        return index

    def _wrap_failure(self, err: Exception) -> TraceError:
        frame = _innermost_user_frame(err.__traceback__)
        location, source = describe_frame(frame)
        path = getattr(err, "_fxloom_module_path", self._module_path_stack[-1])
        where = f" at {location}{source}" if location else ""
        module = f" while tracing {'the root module' if not path else repr(path)}"
        return TraceError(
            f"{type(err).__name__}: {err}\n{module}{where}\n"
            "hint: if this code cannot run on traced values, make its module a leaf "
            "(Tracer.is_leaf_module), wrap the function (fxloom.wrap), fix the offending "
            "arguments with concrete_args",
            partial_graph=self.graph,
            location=location,
            module_path=path,
        )

    # ============================================================ patches
    def _install_patches(self, fn_globals: dict[str, Any]) -> None:
        tracer = self
        patcher = self._patcher

        @functools.wraps(original_module_call)
        def module_call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if tracer._computing_value or module not in tracer.submodule_paths:
                # A module made during forward (``nn.CrossEntropyLoss()(x, y)``) is no
                # attribute the graph could call: trace through it, its tensors become
                # constants.
                return original_module_call(module, *args, **kwargs)
            forward = module.forward
            tracer._autowrap_globals(getattr(forward, "__globals__", None))
            tracer._watch_attribute_writes(type(module))
            return tracer.call_module(module, forward, args, kwargs)

        @functools.wraps(original_module_getattr)
        def module_getattr(module: torch.nn.Module, name: str) -> Any:
            value = original_module_getattr(module, name)
            if tracer._computing_value:
                return value
            return tracer.getattr(name, value, tracer._parameter_proxy_cache)

        # Patched on the classes of the root's modules, not on nn.Module: a class
        # attribute set on nn.Module invalidates the type caches of every module class
        # loaded (hundreds with transformers imported), which dominates small traces.
        for cls in {type(module) for module in self.submodule_paths}:
            patcher.patch_attr(cls, "__call__", module_call)
            patcher.patch_attr(cls, "__getattr__", module_getattr)
        self._watch_attribute_writes(type(self.root))
        for globals_dict, name in list(wrapped_names.values()):
            original = unwrapped(globals_dict.get(name, getattr(builtins, name, None)))
            if original is not None:
                patcher.patch_global(globals_dict, name, _recording(original))
        # A TorchScript function cannot take a Proxy: record its call instead.
        script_call = unwrapped(torch._C.ScriptFunction.__call__)
        patcher.patch_attr(
            torch._C.ScriptFunction, "__call__", _recording(script_call, method=True)
        )
        # Libraries pick graph-capture-friendly code (no data-dependent shortcuts)
        # when they believe they are being compiled; we are capturing a graph.
        patcher.patch_attr(torch.compiler, "is_compiling", capturing)
        # Function transforms cannot batch a Proxy (torch would treat it as a tensor in
        # C++); refuse clearly instead.
        for owner in (torch, torch.func):
            transform = unwrapped(owner.vmap)
            patcher.patch_attr(owner, "vmap", self._refusing_transform(transform, "torch.vmap"))
        for name in _TENSOR_FACTORIES:
            original = unwrapped(getattr(torch, name))
            patcher.patch_attr(torch, name, _recording(original, always=True))
        self._autowrap_globals(fn_globals)

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
        tracer, patcher = self, self._patcher

        def watching_setattr(module: torch.nn.Module, name: str, value: Any) -> None:
            if not tracer._computing_value and _holds_proxy((value,)):
                patcher.remember_attr(module, name)  # put back the old value after tracing
            original(module, name, value)

        watching_setattr.__fxloom_original__ = original  # type: ignore[attr-defined]
        patcher.patch_attr(cls, "__setattr__", watching_setattr)

    def _autowrap_globals(self, globals_dict: dict[str, Any] | None) -> None:
        """Patch globals naming autowrapped functions (``from math import sqrt``)."""
        if not globals_dict or id(globals_dict) in self._visited_globals:
            return  # each module's globals are scanned once per trace
        self._visited_globals.add(id(globals_dict))
        for name, value in list(globals_dict.items()):
            if id(value) in self._autowrap_ids and callable(value):
                self._patcher.patch_global(globals_dict, name, _recording(value))
            elif type(value) is types.ModuleType and value in self.autowrap_modules:
                self._autowrap_module(value)  # ``import math`` then ``math.sqrt(x)``

    def _autowrap_module(self, module: types.ModuleType) -> None:
        """Patch an autowrap module's functions, once, for code reaching them as attributes."""
        if id(module) in self._visited_globals:
            return
        self._visited_globals.add(id(module))
        for name, value in list(vars(module).items()):
            if id(value) in self._autowrap_ids and not name.startswith("_"):
                self._patcher.patch_attr(module, name, _recording(value))

    def _refusing_transform(self, transform: Callable[..., Any], name: str) -> Callable[..., Any]:
        tracer = self

        @functools.wraps(transform)
        def patched(fn: Callable[..., Any], *t_args: Any, **t_kwargs: Any) -> Callable[..., Any]:
            transformed = transform(fn, *t_args, **t_kwargs)

            @functools.wraps(transformed)
            def call(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
                if not tracer._computing_value and (
                    _holds_proxy(args) or _holds_proxy(kwargs.values())
                ):
                    raise tracer.trace_error(
                        f"{name} cannot batch traced values: symbolic tracing records "
                        "operations one by one and cannot run a function transform over them",
                        hint="make the module calling it a leaf (Tracer.is_leaf_module), wrap "
                        "the function that calls it (fxloom.wrap)",
                    )
                return transformed(*args, **kwargs)

            return call

        patched.__fxloom_original__ = transform  # type: ignore[attr-defined]
        return patched

    # ============================================================ root args
    def create_args_for_root(
        self,
        root_fn: Callable[..., Any],
        is_module: bool,
        concrete_args: dict[str, Any] | None = None,
    ) -> tuple[Callable[..., Any], list[Any]]:
        """Create one placeholder per parameter of ``root_fn`` and return ``(fn, args)`` to call.

        Defaults become placeholder defaults; ``*args``/``**kwargs`` become
        variadic placeholders; a parameter named in ``concrete_args`` is fixed
        to that value (``PH`` keeps it an input). A fixed argument stays in the
        generated signature with its value as default, and passing anything
        else raises instead of being silently ignored.
        """
        concrete_args = dict(concrete_args or {})
        signature = inspect.signature(root_fn)
        parameters = list(signature.parameters.values())
        if is_module:
            parameters = parameters[1:]
        stars = next((p for p in parameters if p.kind is p.VAR_KEYWORD), None)
        unknown = set(concrete_args) - {p.name for p in parameters}
        if unknown and stars is not None:
            # ``forward(self, x, **kwargs)`` (decorated Hugging Face models): the other
            # names are keyword arguments that reach the function through ``**kwargs``.
            nested = _keyword_entries(stars.name, concrete_args.get(stars.name, PH))
            moved = {key: concrete_args.pop(key) for key in sorted(unknown)}
            concrete_args[stars.name] = {**nested, **moved}
            unknown = set()
        if unknown:
            raise TraceError(
                f"concrete_args names {sorted(unknown)}, which are not parameters of "
                f"{getattr(root_fn, '__qualname__', root_fn)}; its parameters are "
                f"{[p.name for p in parameters]} (and no **kwargs to take others)"
            )
        hints = _annotations(root_fn)
        positional: list[Any] = [self.root] if is_module else []
        keyword: dict[str, Any] = {}
        defaultable = _defaultable_parameters(parameters, concrete_args)
        for param in parameters:
            type_expr = hints.get(param.name)
            spec = concrete_args.get(param.name, PH)
            if param.kind is param.VAR_POSITIONAL:
                positional.extend(self._variadic_positional(param, spec, type_expr))
            elif param.kind is param.VAR_KEYWORD:
                keyword.update(self._variadic_keyword(param, spec, type_expr))
            else:
                if spec is not PH:
                    value = self._fixed_argument(param, spec, type_expr, param.name in defaultable)
                else:
                    default = () if param.default is param.empty else (param.default,)
                    value = self.create_proxy(
                        "placeholder", param.name, default, {}, type_expr=type_expr
                    )
                    self._attach_example(value, param)
                # By keyword where possible: decorators wrapping forward (*args, **kwargs)
                # often inspect keywords, and mixing would pass a value twice.
                if param.kind is param.POSITIONAL_ONLY or _has_variadic_positional(parameters):
                    positional.append(value)
                else:
                    keyword[param.name] = value
        return functools.partial(root_fn, *positional, **keyword), []

    def _attach_example(self, placeholder: Proxy, param: inspect.Parameter) -> None:
        """Give an input's proxy its example value; tensors get a dtype/rank guard."""
        if self._examples is None:
            return
        if param.name in self._examples:
            example = clone_tensors(self._examples[param.name])
        elif param.default is not param.empty:
            example = param.default
        else:
            return
        placeholder.value = example
        if isinstance(example, torch.Tensor):
            self.create_proxy(
                "call_function",
                check_tensor_input,
                (placeholder, example.dtype, example.dim(), param.name),
                {},
                "guard",
            )

    def _variadic_positional(
        self, param: inspect.Parameter, spec: Any, type_expr: Any
    ) -> list[Any]:
        """``*args``: traced with as many elements as ``concrete_args`` lists (none by default)."""
        elements = () if spec is PH or spec is None else spec
        if not isinstance(elements, (tuple, list)):
            raise TraceError(
                f"concrete_args[{param.name!r}] must be a tuple with one entry per extra "
                f"positional argument (PH for an input), got {spec!r}"
            )
        star = self.create_proxy("placeholder", f"*{param.name}", (), {}, type_expr=type_expr)
        self.create_proxy(
            "call_function", check_variadic_length, (star, len(elements), param.name), {}, "guard"
        )
        return [star[i] if value is PH else value for i, value in enumerate(elements)]

    def _variadic_keyword(
        self, param: inspect.Parameter, spec: Any, type_expr: Any
    ) -> dict[str, Any]:
        """``**kwargs``: traced with the keys ``concrete_args`` gives (none by default).

        A key given ``PH`` is an input the caller must pass; a key given a value
        is traced with that value, and the caller may omit it or pass the same
        value (another one raises, as for any fixed argument).
        """
        entries = _keyword_entries(param.name, spec)
        inputs = tuple(key for key, value in entries.items() if value is PH)
        fixed = tuple(key for key, value in entries.items() if value is not PH)
        stars = self.create_proxy("placeholder", f"**{param.name}", (), {}, type_expr=type_expr)
        self.create_proxy(
            "call_function", check_variadic_keys, (stars, inputs, param.name, fixed), {}, "guard"
        )
        for key in fixed:
            given = stars.get(key, entries[key])
            self.create_proxy(
                "call_function", FixedArgument(key, entries[key]), (given,), {}, "guard"
            )
        return {key: stars[key] if value is PH else value for key, value in entries.items()}

    def _fixed_argument(
        self, param: inspect.Parameter, value: Any, type_expr: Any, may_default: bool
    ) -> Any:
        """An input fixed to ``value``: tracing sees ``value``; the code checks it at run time.

        It stays in the signature, defaulting to ``value`` when that is a
        literal and no parameter without a default follows it.
        """
        default = (value,) if may_default and _is_literal(value) else ()
        placeholder = self.create_proxy("placeholder", param.name, default, {}, type_expr=type_expr)
        check = FixedArgument(param.name, value)
        self.create_proxy("call_function", check, (placeholder,), {}, "guard")
        return value

    # ============================================================= modules
    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        """Whether ``m`` is recorded as one ``call_module`` (True) or traced through.

        Default: modules defined in ``torch.nn`` (and ``torch.ao.nn``) are
        leaves, except ``Sequential``, which is traced through.
        """
        module = type(m).__module__ or ""
        is_torch_nn = module.startswith(("torch.nn", "torch.ao.nn"))
        return is_torch_nn and not isinstance(m, torch.nn.Sequential)

    def path_of_module(self, mod: torch.nn.Module) -> str:
        """The qualified name of ``mod`` in the root (a dictionary lookup)."""
        path = self.submodule_paths.get(mod)
        if path is None:
            raise TraceError(
                f"a {type(mod).__name__} module called during tracing is not a submodule of the "
                f"root {type(self.root).__name__}; register it as an attribute (self.name = module) "
                "so the graph can refer to it",
                partial_graph=self.graph,
                module_path=self._module_path_stack[-1],
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
        saved_stack = self._module_stack
        self._module_stack = {**saved_stack, path: (path, type(m))}
        self._module_path_stack.append(path)
        try:
            if path in self.forced_leaves or self.is_leaf_module(m, path):
                return self.create_proxy("call_module", path, args, kwargs)
            self._traced_modules.add(m)
            return original_module_call(m, *args, **kwargs)
        except Exception as err:
            if not hasattr(err, "_fxloom_module_path"):
                err._fxloom_module_path = path  # type: ignore[attr-defined]  # innermost wins
            raise
        finally:
            self._module_path_stack.pop()
            self._module_stack = saved_stack

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Proxy]) -> Any:
        """What reading module attribute ``attr`` (value ``attr_val``) yields during tracing.

        Parameters and buffers of the root become (cached) ``get_attr`` proxies.
        """
        if isinstance(attr_val, torch.Tensor):
            path = self._param_paths.get(id(attr_val))
            if path is not None:
                proxy = parameter_proxy_cache.get(path)
                if proxy is None:
                    proxy = self.create_proxy("get_attr", path, (), {})
                    parameter_proxy_cache[path] = proxy
                return proxy
        return attr_val

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

    def example_value(self, proxy: Proxy) -> Any:
        """``proxy``'s value for the example inputs, computed now if not yet
        (``NO_VALUE`` when tracing without examples)."""
        if self._example_run is None:
            return NO_VALUE
        return self._example_run.value_of(proxy)

    def module_at(self, path: str) -> torch.nn.Module:
        """The submodule of the root at qualified name ``path``."""
        modules = self._modules_by_path
        if modules is None:
            modules = self._modules_by_path = {p: m for m, p in self.submodule_paths.items()}
        module = modules.get(path)
        return module if module is not None else self.root.get_submodule(path)

    def proxy(self, node: Node) -> Proxy:
        return Proxy(node, self)

    def create_node(
        self,
        kind: str,
        target: Target,
        args: tuple[Argument, ...],
        kwargs: dict[str, Argument],
        name: str | None = None,
        type_expr: Any | None = None,
    ) -> Node:
        """Create the node and attach metadata (``nn_module_stack``, ``source_fn_stack``, ``stack_trace``)."""
        node = self.graph.create_node(kind, target, args, kwargs, name, type_expr)
        meta = node.meta
        if kind not in ("placeholder", "output"):
            # Every operation says which modules it came from ({} at the root's own level).
            meta["nn_module_stack"] = dict(self._module_stack)
        if kind in ("call_function", "call_method", "call_module"):
            source = self._module_class(target) if kind == "call_module" else target
            meta["source_fn_stack"] = [(node.name, source)]
        if self.record_stack_traces:
            meta["stack_trace"] = _format_user_stack()
        return node

    def _module_class(self, path: str) -> type:
        entry = self._module_stack.get(path)
        if entry is not None:
            return entry[1]
        try:  # recorded by an overriding call_module that skipped super()
            return type(self.root.get_submodule(path))
        except AttributeError:
            return torch.nn.Module

    def create_arg(self, a: Any) -> Argument:
        """Convert a value seen during tracing into a graph argument.

        Proxies become their nodes; containers are converted element-wise;
        parameters and buffers of the root become ``get_attr`` nodes; other
        tensors become constants (``_tensor_constant0``, ...) kept with the graph.
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
        if isinstance(a, tuple):
            items = [self.create_arg(x) for x in a]
            return t(*items) if hasattr(a, "_fields") else t(items)
        if isinstance(a, list):
            return [self.create_arg(x) for x in a]
        if isinstance(a, dict):
            entries = {k: self.create_arg(v) for k, v in a.items()}
            if t is dict or t is immutable_dict or not _keyword_keys(entries):
                return entries
            # A dict subclass (e.g. a model-output class) is rebuilt by its constructor,
            # so callers of the traced module get the same type back.
            return self.create_node("call_function", t, (), entries)
        if t is slice:
            return slice(self.create_arg(a.start), self.create_arg(a.stop), self.create_arg(a.step))
        if isinstance(a, torch.Tensor):
            return self._tensor_arg(a)
        if isinstance(a, torch.nn.Module):
            return self.create_proxy("get_attr", self.path_of_module(a), (), {}).node
        return a

    def _tensor_arg(self, tensor: torch.Tensor) -> Node:
        path = self._param_paths.get(id(tensor))
        if path is not None:
            return self._get_attr_node(path)
        name = self.tensor_attrs.get(id(tensor))
        if name is None:
            name = self._free_constant_name()
            self.graph.constants[name] = tensor
            self.tensor_attrs[id(tensor)] = name
        return self.create_node("get_attr", name, (), {})

    def _free_constant_name(self) -> str:
        """``_tensor_constantN`` for the first N that names nothing on the root yet."""
        constants = self.graph.constants
        index = len(constants)
        while True:
            name = f"_tensor_constant{index}"
            if name not in constants and not hasattr(self.root, name):
                return name
            index += 1

    def _get_attr_node(self, path: str) -> Node:
        proxy = self._parameter_proxy_cache.get(path)
        if proxy is None:
            proxy = self.create_proxy("get_attr", path, (), {})
            self._parameter_proxy_cache[path] = proxy
        return proxy.node

    def attribute_value(self, qualified_name: str) -> Any:
        """The real value behind a ``get_attr`` target (a root attribute or a captured constant)."""
        constants = self.graph.constants
        if qualified_name in constants:
            return constants[qualified_name]
        value: Any = self.root
        for part in qualified_name.split("."):
            value = (
                original_module_getattr(value, part)
                if isinstance(value, torch.nn.Module) and part not in value.__dict__
                else getattr(value, part)
            )
        return value

    # ======================================================== conversions
    def trace_error(self, message: str, hint: str | None = None) -> TraceError:
        """A ``TraceError`` naming the user's source line, the module being traced and a fix."""
        frame = user_frame(2)
        location, source = describe_frame(frame)
        path = self._module_path_stack[-1]
        module = "the root module" if not path else f"module {path!r}"
        hint = hint or (
            "make the module doing this a leaf (Tracer.is_leaf_module), wrap the function "
            "(fxloom.wrap), or fix the value it depends on with concrete_args"
        )
        where = f"\n  at {location}{source}" if location else ""
        return TraceError(
            f"{message}{where}\n  while tracing {module}\n  hint: {hint}",
            partial_graph=self.graph,
            location=location,
            module_path=path,
        )

    def to_bool(self, obj: Proxy) -> bool:
        """Called for ``bool(proxy)`` (``if x.sum() > 0:``).

        Without example inputs this refuses, as documented. With them, the
        branch the example takes is followed and a guard is recorded that
        raises at run time if the condition ever comes out differently.
        """
        if obj.value is NO_VALUE:
            raise self.trace_error(
                "symbolically traced variables cannot be used as inputs to control flow",
                hint=(
                    "make the module doing this a leaf (Tracer.is_leaf_module), wrap the function "
                    "(fxloom.wrap), fix its input with concrete_args, trace with autoleaf=True, "
                    "or pass example_inputs so the branch is specialised under a run-time guard"
                ),
            )
        return self._specialize(obj, bool)

    def length(self, obj: Proxy) -> int:
        """Called for ``len(proxy)``: refused without example inputs, as documented."""
        value = obj.value
        if value is NO_VALUE:
            raise self.trace_error(
                "'len' is not supported in symbolic tracing by default. If you want this call "
                "to be recorded, please call fxloom.wrap('len') at module scope",
                hint="use x.size(dim) / x.shape[dim], which are recorded, or pass example_inputs",
            )
        if isinstance(value, (torch.Size, tuple, list)):  # a rank or a tuple's arity: fixed
            return len(value)
        return self._specialize(obj, len)

    def to_python(self, obj: Proxy, convert: Callable[[Any], Any]) -> Any:
        """Called for ``int(proxy)``, ``float(proxy)`` and index use (``range(n)``)."""
        if obj.value is NO_VALUE:
            kind = {int: "int", float: "float"}.get(convert, "an index (int)")
            raise self.trace_error(
                f"a traced value (%{obj.node.name}) cannot be converted to {kind} during "
                "symbolic tracing: its value is only known when the traced code runs",
                hint="keep it a tensor/size expression, fix it with concrete_args, or pass "
                "example_inputs to specialise on it under a run-time guard",
            )
        return self._specialize(obj, convert)

    def _specialize(self, obj: Proxy, convert: Callable[[Any], Any]) -> Any:
        """``convert(example value)``, plus a graph guard that it stays so at run time."""
        expected = convert(obj.value)
        where = _short_location(user_frame(3))
        self.create_proxy(
            "call_function", check_guard, (obj, convert, expected, where), {}, "guard"
        )
        return expected

    def iter(self, obj: Proxy) -> Iterator[Proxy]:
        """Called for ``iter(proxy)``: unpacking of a known length works, loops do not."""
        if obj._value is PENDING:
            # ``a, b = x.shape``: the unpacking says how many, under a guard, without
            # running the examples up to here.
            count = unpack_length(user_frame(2))
            if count is not None:
                self._check_unpack(obj, count)
                return iter([obj[i] for i in range(count)])
        value = obj.value
        if value is not NO_VALUE:
            if isinstance(value, (tuple, list)):  # e.g. x.unbind(0): arity follows a size
                self._check_unpack(obj, len(value))
                return iter([obj[i] for i in range(len(value))])
            if isinstance(value, torch.Size):  # the rank, fixed by the input guards
                return iter([obj[i] for i in range(len(value))])
            return self._iterate_rows(obj, len(value))
        count = unpack_length(user_frame(2))
        if count is not None:
            self._check_unpack(obj, count)
            return iter([obj[i] for i in range(count)])
        raise self.trace_error(
            "Proxy object cannot be iterated: the number of elements of a traced value is "
            "unknown while tracing",
            hint="unpack into a fixed number of names (a, b = x.chunk(2)), index explicitly, "
            "or pass example_inputs",
        )

    def _check_unpack(self, obj: Proxy, count: int) -> None:
        where = _short_location(user_frame(3))
        self.create_proxy("call_function", check_length, (obj, count, where), {}, "guard")

    def _iterate_rows(self, obj: Proxy, count: int) -> Iterator[Proxy]:
        """Rows of a tensor, lazily: only a loop that runs to the end depends on the length,
        so only then is a guard on it recorded (code that peeks at the first row does not)."""
        for i in range(count):
            yield obj[i]
        self._specialize(obj, len)


class GraphAppendingTracer(Tracer):
    """The tracer of a ``Proxy`` built by hand around a node: appends nodes to that node's graph.

    With ``root``, modules and tensors of that module are recognised as such
    (``call_module`` paths, parameters as ``get_attr``), as during a trace.
    """

    def __init__(self, graph: Graph, root: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.graph = graph
        if root is not None:
            self.root = root
            for name, module in root.named_modules(remove_duplicate=False):
                self.submodule_paths.setdefault(module, name)
            self._param_paths_index = None  # built from the root on first need


# =================================================================== helpers
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


# nn.Module's own bookkeeping dicts (_modules, _parameters, hooks, ...): never caches.
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))

# Tracers currently running, innermost last (a trace may start inside another).
_active_tracers: list[Tracer] = []
# (original, always) -> its recording wrapper; made once, shared by all traces.
_recording_wrappers: dict[tuple[int, bool, bool], tuple[Any, Callable[..., Any]]] = {}


def _recording(
    original: Callable[..., Any], always: bool = False, method: bool = False
) -> Callable[..., Any]:
    """``original``, but recorded as ``call_function`` when any argument is a proxy.

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
    def recording(*args: Any, **kwargs: Any) -> Any:
        tracer = _find_tracer(args, kwargs) or (_active_tracers[-1] if _active_tracers else None)
        if tracer is None or tracer._computing_value:
            return original(*args, **kwargs)
        if always or _holds_proxy(args) or _holds_proxy(kwargs.values()):
            if method:
                return tracer.create_proxy("call_function", args[0], args[1:], kwargs)
            return tracer.create_proxy("call_function", original, args, kwargs)
        return original(*args, **kwargs)

    recording.__fxloom_original__ = original  # type: ignore[attr-defined]
    _recording_wrappers[key] = (original, recording)  # holding original keeps its id valid
    return recording


def _defaultable_parameters(
    parameters: list[inspect.Parameter], concrete_args: dict[str, Any]
) -> set[str]:
    """Positional parameters that may get a default: only ones followed by defaulted ones."""
    allowed: set[str] = set()
    for param in reversed(parameters):
        if param.kind is param.VAR_POSITIONAL:
            allowed.clear()
            break
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            continue
        spec = concrete_args.get(param.name, PH)
        fixed_literal = spec is not PH and _is_literal(spec)
        if not (fixed_literal or (spec is PH and param.default is not param.empty)):
            break
        allowed.add(param.name)
    return allowed


def _keyword_entries(name: str, spec: Any) -> dict[str, Any]:
    """``concrete_args[name]`` for a ``**name`` parameter: the keyword arguments to trace with."""
    entries = {} if spec is PH or spec is None else spec
    if not isinstance(entries, dict):
        raise TraceError(
            f"concrete_args[{name!r}] must be a dict of the keyword arguments to trace with "
            f"(PH for an input), got {spec!r}"
        )
    return entries


def _short_location(frame: types.FrameType | None) -> str:
    """``file.py:12`` (no directories: it is printed into generated code)."""
    if frame is None:
        return "traced code"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _keyword_keys(entries: dict[Any, Any]) -> bool:
    return all(isinstance(k, str) and k.isidentifier() for k in entries)


def _has_variadic_positional(parameters: list[inspect.Parameter]) -> bool:
    # With a *args after them, earlier parameters can only be filled positionally.
    return any(p.kind is p.VAR_POSITIONAL for p in parameters)


def _holds_proxy(values: Any) -> bool:
    for value in values:
        if isinstance(value, Proxy):
            return True
        if isinstance(value, (tuple, list)) and _holds_proxy(value):
            return True
        if isinstance(value, dict) and _holds_proxy(value.values()):
            return True
    return False


def _is_literal(value: Any) -> bool:
    if type(value) in (int, float, bool, str, type(None), complex):
        return True
    if type(value) in (tuple, list):
        return all(_is_literal(v) for v in value)
    return False


def _annotations(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return dict(inspect.get_annotations(fn, eval_str=True))
    except Exception:  # unresolvable string annotations: keep none rather than fail tracing
        return {}


def _innermost_user_frame(tb: types.TracebackType | None) -> types.FrameType | None:
    from fxloom.proxy import _is_plumbing

    found = None
    while tb is not None:
        if not _is_plumbing(tb.tb_frame.f_code.co_filename):
            found = tb.tb_frame
        tb = tb.tb_next
    return found


def _format_user_stack() -> str:
    from fxloom.proxy import _is_plumbing

    frames = [
        summary
        for summary in traceback.extract_stack(sys._getframe(2))
        if not _is_plumbing(summary.filename)
    ]
    return "".join(traceback.format_list(frames[-3:]))


def symbolic_trace(
    root: torch.nn.Module | Callable[..., Any],
    concrete_args: dict[str, Any] | None = None,
    *,
    example_inputs: tuple[Any, ...] | dict[str, Any] | None = None,
    autoleaf: bool = False,
) -> GraphModule:
    """Trace ``root`` into a ``GraphModule`` named after the root's class (or function).

    ``concrete_args`` fixes parameters to values (``{"use_cache": False}``) so
    code branching on them traces; ``PH`` keeps a parameter an input.

    ``example_inputs`` (beyond torch.fx; a tuple for the non-fixed parameters
    in order, or a dict by name) lets the tracer run the program alongside the
    recording. Questions about tensors that do not change between calls —
    ``x.dim()``, ``x.dtype``, ``x.device`` — are then answered from the
    examples, and control flow on traced values follows the examples' branch
    with a run-time guard in the graph that raises if another input would take
    another branch. Sizes stay symbolic unless control flow depends on them.

    ``autoleaf`` (beyond torch.fx): when a submodule cannot be traced, keep the
    innermost user-defined module around the failure as a ``call_module`` and
    trace again; ``gm.meta["autoleaf"]`` lists those modules and why
    (``fxloom.autoleaf.LeafDecision``).
    """

    def attempt(tracer: Tracer) -> Graph:
        return tracer.trace(root, concrete_args, example_inputs=example_inputs)

    decisions = []
    if autoleaf and isinstance(root, torch.nn.Module):
        from fxloom.autoleaf import trace_with_autoleaf

        tracer, graph, decisions = trace_with_autoleaf(Tracer, root, attempt)
    else:
        tracer = Tracer()
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
