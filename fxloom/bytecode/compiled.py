"""``fxloom.compile``: compile a function or module on its first call, reuse it while its guards hold.

    >>> import torch, fxloom
    >>> def f(x, y):
    ...     return torch.relu(x) + y * 2
    >>> compiled = fxloom.compile(f)
    >>> x, y = torch.randn(3), torch.randn(3)
    >>> torch.equal(compiled(x, y), f(x, y))
    True
    >>> len(compiled.cache)                       # one entry: guards + graph + generated code
    1

Each call binds its arguments through a generated function with the compiled function's
own signature (Python binds them, defaults and keywords included), then tries the cache
entries, the most recently hit first: the first whose guard holds runs. On a miss the
function is interpreted again on the new arguments and a new entry is added
(``fxloom.bytecode.entry``); past ``recompile_limit`` entries it runs as plain Python, with
one warning that names the guard that kept failing. Where the interpreter cannot capture
the function (a graph break), ``fullgraph=True`` raises ``CompileError`` naming the line,
and otherwise the function runs as Python; ``explain()`` lists why.

Depends on ``fxloom.bytecode.entry`` and ``fxloom.bytecode.explain``.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

from fxloom.bytecode import dynamic as dynamic_sizes
from fxloom.bytecode.breaks import Break, CompileError, DynamicDimError
from fxloom.bytecode.budget import ON_LIMIT, Budget, Recompile
from fxloom.bytecode.driver import drive, generator_dispatch, runs_piece_by_piece
from fxloom.bytecode.entry import CacheEntry, Next, compile_entry
from fxloom.bytecode.guards import watch_modules
from fxloom.values.signature import code_parameter_names, code_unbind, parameters_of

__all__ = ["compile", "CompiledFunction", "CompiledModule", "eager_backend"]


def eager_backend(graph_module: Any, example_inputs: list) -> Callable[..., Any]:
    """The default backend: run the captured GraphModule's generated code (what
    ``fxloom.backends.EagerBackend.compile_program`` gives)."""
    return graph_module.forward


# Backends by name have one registry, ``fxloom.backends.BACKENDS``, in the layer above this
# frontend: ``fxloom.compile`` (the surface) resolves a name there and hands this frontend the
# backend's ``compile_program``, a callable. The frontend itself knows "eager" alone, its
# default, so that it runs without the backends layer.
_OWN_BACKEND = "eager"


def compile(  # noqa: A001 - the documented name, as torch.compile
    fn_or_module: Callable[..., Any] | torch.nn.Module,
    *,
    backend: str | Callable[..., Callable[..., Any]] = "eager",
    fullgraph: bool = False,
    recompile_limit: int = 8,
    dynamic: Any = None,
    on_limit: str = "eager",
) -> Any:
    """Compile ``fn_or_module`` on first call and on each cache miss; see the module docstring.

    ``backend``: ``"eager"`` (run fxloom's GraphModule) or ``backend(graph_module,
    example_inputs) -> callable`` (``fxloom.compile`` also takes ``"onnxruntime"``). ``fullgraph=True``: a graph
    break raises ``CompileError`` naming the line and why, instead of running as Python.
    ``dynamic``: None (the default) compiles static sizes first and makes a tensor size that
    changes between calls symbolic at the recompile; True makes every tensor size symbolic from
    the first call; False keeps every size static (``fxloom.bytecode.dynamic``); a
    ``dynamic_shapes`` spec as ``fxloom.export`` takes it (``{"x": {0: Dim("batch")}}``, a
    tuple by position) makes those sizes symbolic from the first call, in the Dim's range,
    and observes the others as None does. Tensors marked with ``fxloom.mark_dynamic``/
    ``mark_static``/``maybe_mark_dynamic`` (or torch's) are honoured in every mode.
    ``recompile_limit``: how many compiles, counted by reason (``fxloom.bytecode.budget``);
    ``on_limit``: at the limit, ``"eager"`` runs the function as Python from then on (one
    warning), ``"raise"`` raises ``RecompileLimitError`` from the call that would compile.
    """
    spec = None
    if isinstance(dynamic, (dict, tuple, list)):
        spec, dynamic = dynamic, None
    elif dynamic not in (None, True, False):
        raise TypeError(
            "fxloom.compile(dynamic=...) takes None, True, False or a dynamic_shapes spec "
            f"(a dict by parameter name, or a tuple), not {dynamic!r}"
        )
    if on_limit not in ON_LIMIT:
        raise ValueError(f"fxloom.compile(on_limit=...) takes 'eager' or 'raise', not {on_limit!r}")
    if sys.version_info < (3, 11):
        raise CompileError(
            "fxloom.compile reads Python 3.11+ bytecode (its exception tables and call forms); "
            f"this is Python {sys.version_info.major}.{sys.version_info.minor}. Use "
            "fxloom.symbolic_trace or fxloom.export.export here, or Python 3.11 or newer"
        )
    chosen = _backend(backend)
    watch_modules()
    if isinstance(fn_or_module, torch.nn.Module):
        compiled = CompiledModule(fn_or_module, chosen, fullgraph, recompile_limit, on_limit)
        compiled.compiled_forward.sizes.mode = dynamic
        compiled.compiled_forward.spec = spec
        return compiled
    compiled = CompiledFunction(fn_or_module, chosen, fullgraph, recompile_limit, on_limit=on_limit)
    compiled.sizes.mode = dynamic
    compiled.spec = spec
    return compiled


def _backend(backend: Any) -> Callable[..., Any]:
    if callable(backend):
        return backend
    if backend != _OWN_BACKEND:
        raise ValueError(
            f"no fxloom.compile backend {backend!r} here: fxloom.bytecode.compile takes "
            f"{_OWN_BACKEND!r} or a callable(graph_module, example_inputs); fxloom.compile "
            "finds a backend by name in fxloom.backends.BACKENDS"
        )
    return eager_backend


class CompiledFunction:
    """A function compiled on demand; see the module docstring."""

    def __init__(self, fn: Callable[..., Any], backend: Callable[..., Any], fullgraph: bool,
                 recompile_limit: int, root: torch.nn.Module | None = None,
                 on_limit: str = "eager") -> None:  # fmt: skip
        if isinstance(fn, types.MethodType):
            root = fn.__self__ if isinstance(fn.__self__, torch.nn.Module) else root
            bound_self, fn = fn.__self__, fn.__func__
        else:
            bound_self = None
        if not isinstance(fn, types.FunctionType):
            raise TypeError(
                f"fxloom.compile needs a Python function or an nn.Module, got {type(fn).__name__}"
            )
        self.fn = fn
        self.root = root
        self.backend = backend
        self.fullgraph = fullgraph
        self.recompile_limit = recompile_limit
        self.cache: list[CacheEntry] = []  # entries that start the function
        # entries no longer tried since the function runs as Python (kept for explain())
        self.retired: list[CacheEntry] = []
        # (instruction index, local names, stack depth) -> entries that start after a break
        self.pieces: dict[tuple, list[CacheEntry]] = {}
        # where no piece could be captured -> "file:line: why" (then the function runs as Python)
        self.as_python: dict[tuple, str] = {}
        self.breaks: list[Break] = []
        self.misses: list[str] = []  # why each recompilation happened (the failing guard)
        self.eager_reason: str | None = None
        # Which tensor sizes are symbolic (``dynamic=``; those seen to change)
        self.sizes = dynamic_sizes.SizePolicy()
        self.spec: Any = None  # a dynamic_shapes spec (``dynamic={...}``), resolved at call 1
        # How many compiles are left, counted by reason; each miss's reason (``explain()``)
        self.budget = Budget(recompile_limit, on_limit)
        if fn.__code__.co_flags & _SUSPENDS:  # a generator or coroutine: its frames suspend
            self.eager_reason = runs_piece_by_piece(fn)  # (None: each yield ends a piece)
        self.parameters = code_parameter_names(fn)
        self._bound_self = bound_self
        self._dispatch = self._make_dispatch()
        if fn.__code__.co_flags & inspect.CO_GENERATOR and self.eager_reason is None:
            self._dispatch = generator_dispatch(self, self._dispatch)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._dispatch(*args, **kwargs)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    # ------------------------------------------------------------ the paths of a call
    def _make_dispatch(self) -> Callable[..., Any]:
        # The dispatch function takes the parameters as the user's function does (Python binds
        # them, so every call binds once); ``code_unbind`` passes them on to run it as Python.
        parameters = parameters_of(self.fn, follow_wrapped=False)
        into_varargs = bool(parameters) and parameters[0].kind is parameters[0].VAR_POSITIONAL
        if self._bound_self is not None and not into_varargs:
            parameters = parameters[1:]
        header = _header(parameters)
        # The user's own parameter names (keywords bind by them); the namespace's names are
        # ones no program uses.
        passed = ", ".join(self.parameters)
        bind_self = ""
        if self._bound_self is not None:  # a method of a module: self is its first argument
            first = self.parameters[0]
            bind_self = (
                f"    {first} = (_fx_SELF, *{first})\n"
                if into_varargs
                else f"    {first} = _fx_SELF\n"
            )
        source = (
            f"def dispatch({header}):\n{bind_self}"
            f"    if _fx_CACHE and _fx_CACHE[0].guard({passed}):\n"
            f"        result = _fx_CACHE[0].run({passed})\n"
            f"        return result if type(result) is not _fx_NEXT else _fx_DRIVE(_fx_COMPILED, result)\n"
            f"    return _fx_MISS({passed})\n"
        )
        namespace = {"_fx_CACHE": self.cache, "_fx_MISS": self._miss, "_fx_SELF": self._bound_self,
                     "_fx_DEFAULTS": [p.default for p in parameters], "_fx_NEXT": Next,
                     "_fx_DRIVE": drive, "_fx_COMPILED": self}  # fmt: skip
        exec(
            builtins.compile(source, f"<fxloom dispatch {self.fn.__qualname__}>", "exec"), namespace
        )  # noqa: S102
        dispatch = namespace["dispatch"]
        return dispatch

    def _miss(self, *values: Any) -> Any:
        if self.eager_reason is not None:
            return self._eager(values)
        for index, entry in enumerate(self.cache[1:], start=1):
            if entry.guard(*values):
                self.cache.insert(0, self.cache.pop(index))
                entry.hits += 1
                result = entry.run(*values)
                return result if type(result) is not Next else drive(self, result)
        promoted = False
        if self.cache:
            front = self.cache[0]
            call = (values, self.parameters, self.fn.__globals__, self.fn.__closure__)
            failing = front.guards.first_failing(*call, front.held)
            recompile = self.budget.miss(front, failing, call, self.fn)
            self.misses.append(str(recompile))
            # Promotion first: a size seen to change becomes a symbol, which the budget counts
            # once for its source (``fxloom.bytecode.budget``). Against every entry: the one
            # the call missed by a size need not be the front one (a static prefill stays in
            # front of the decode entry whose cache length the call changed).
            changed = [
                change
                for entry in self.cache
                for change in entry.guards.changed_sizes(*call, entry.held)
            ]
            promoted = self.sizes.observe(dynamic_sizes.START, changed)
            if not self.budget.allows(recompile, promoted):
                return self._at_limit(recompile, values)
        elif self.spec is not None and not self.retired:
            self._declare(values)
        try:
            with dynamic_sizes.compiling(self.sizes):
                entry, stop = compile_entry(
                    self.fn, self.parameters, values, self.backend, self.root
                )
        except Break as error:
            self._refuse(error)
            self.breaks.append(error)
            self.eager_reason = f"graph break: {error.message()}"
            return self._eager(values)
        self._check_marked(entry)
        if stop is not None:
            self._refuse(stop)
            self.breaks.append(stop)
        # A promoted (symbolic) entry goes after the static one it generalises, which stays in
        # front for the inputs that still match it.
        self.cache.insert(1 if promoted and self.cache else 0, entry)
        result = entry.run(*values)
        return result if type(result) is not Next else drive(self, result)

    def _at_limit(self, recompile: Recompile, values: tuple) -> Any:
        """The budget is spent: raise (``on_limit="raise"``), or warn once and run as Python
        from now on (the entries made still serve the calls that match them)."""
        self.eager_reason = self.budget.at_limit(self.fn.__qualname__, recompile)
        warnings.warn(
            f"{self.eager_reason}\n  running it as Python from now on", stacklevel=_user_level()
        )
        return self._eager(values)

    def _declare(self, values: tuple) -> None:
        """Resolve ``dynamic=``'s spec against the first call's arguments (as export does):
        the dims it names are symbolic from this first compile, in their Dim's range."""
        from fxloom.values.symbolic.dynamic_shapes import resolve_dynamic_shapes

        skip = 1 if self._bound_self is not None else 0  # a method's self is not an input
        names, given = list(self.parameters[skip:]), list(values[skip:])
        leaves = resolve_dynamic_shapes(names, given, self.spec)
        exprs = [expr for name, value in zip(names, given) for expr in _leaf_exprs(name, value)]
        self.sizes.declared = {expr: dims for expr, dims in zip(exprs, leaves) if dims and expr}

    def _check_marked(self, entry: CacheEntry) -> None:
        """A size marked dynamic (``mark_dynamic``, a Dim) that the program fixed is an error,
        as with torch.compile; ``maybe_mark_dynamic`` allows it."""
        symbols = entry.guards.sizes
        fixed = symbols.strict_fixed() if symbols is not None else []
        if fixed:
            raise DynamicDimError(
                f"fxloom.compile({self.fn.__qualname__}): a size marked dynamic is fixed to one "
                "value by the program:\n  " + "\n  ".join(fixed) + "\n  fix: use "
                "fxloom.maybe_mark_dynamic (the entry then guards the value) or Dim.AUTO, or "
                "change the program so that it does not need the size as a plain number"
            )

    def give_up(self, reason: str) -> None:
        """Run as plain Python from the next call on: the cache is emptied (its entries kept
        in ``retired`` for ``explain()``), so every call takes the miss path, which runs the
        function natively."""
        self.eager_reason = reason
        self.retired.extend(self.cache)
        self.cache.clear()

    def _refuse(self, stop: Break) -> None:
        if self.fullgraph:
            raise CompileError(
                f"fxloom.compile(fullgraph=True) cannot capture {self.fn.__qualname__}:\n"
                f"  {stop.message()}"
            ) from None

    def _eager(self, values: tuple) -> Any:
        args, kwargs = code_unbind(self.fn, self.parameters, values)
        return self.fn(*args, **kwargs)

    # ------------------------------------------------------------ reports
    def explain(self) -> Any:
        from fxloom.bytecode.explain import Explanation

        return Explanation.of(self)

    @property
    def code(self) -> str:
        """The generated Python of every cache entry: guard, run and graph, with the user's
        file:line beside each graph statement."""
        parts = []
        pieces = (piece for entries in self.pieces.values() for piece in entries)
        entries = [*self.cache, *self.retired, *pieces]
        for number, entry in enumerate(entries):
            graph_code = entry.graph_module.graph.python_code("self", verbose=True).src
            parts.append(
                f"# ---- entry {number}: {self.fn.__qualname__}\n{entry.guard_source}\n{entry.run_source}\n# GRAPH:\n{graph_code}"
            )
        return "\n".join(parts)


# nn.Module method -> whether it returns self (then the wrapper returns itself, for chaining)
_TO_MODULE = {
    "train": True,
    "apply": True,
    "_apply": True,
    "named_modules": False,
    "state_dict": False,
    "load_state_dict": False,
    "_save_to_state_dict": False,
    "_load_from_state_dict": False,
}


def _to_module(name: str, chains: bool) -> Callable[..., Any]:
    """The wrapper's ``name``: the module's ``name``, returning the wrapper where that
    returns the module."""

    def method(self: CompiledModule, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self._orig_mod, name)(*args, **kwargs)
        return self if chains else result

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"nn.Module.{name}, run by the module itself (see _TO_MODULE)."
    return method


class CompiledModule(torch.nn.Module):
    """``module`` with its ``forward`` compiled; everything else reads and writes ``module``.

    As ``torch.compile``'s wrapper: an attribute the wrapper does not own (``config``,
    ``device``, ``generate``, a submodule, a parameter) is read from, set on and deleted from
    ``module``, and its methods are bound to ``module`` (so ``compiled.generate(...)`` runs
    ``module``'s own, uncompiled forward, as ``torch.compile(model).generate`` does). Unlike
    it, the parameters, buffers, submodules and hooks are ``module``'s own dicts, shared, and
    the methods that act on the module as a whole (``_TO_MODULE``) are ``module``'s, so
    ``state_dict()`` keys, ``named_parameters()`` names and ``load_state_dict`` are
    ``module``'s, without torch's ``_orig_mod.`` prefix (checkpoints move between the
    compiled and the plain module unchanged), ``modules()`` and ``apply`` meet ``module``
    itself, and ``module``'s hooks run around the compiled forward. ``train()``/``eval()``/
    ``training`` are ``module``'s. The wrapper owns ``forward`` (the compiled one), ``compiled_forward``,
    ``explain``, ``code``, ``cache`` and ``_orig_mod`` (the module), and
    ``isinstance(compiled, type(module))`` is False, as with torch.

    A call goes ``nn.Module.__call__`` -> ``forward``, an instance attribute holding the
    ``CompiledFunction``: ``__getattr__`` is never on that path (it runs only for names
    the wrapper lacks).
    """

    # the wrapper's own instance attributes; every other name set on it goes to the module
    _OWN = frozenset({"_orig_mod", "compiled_forward", "forward", "_fx_settings"})
    # nn.Module's dicts that are the module's own, so that every nn.Module method of the
    # wrapper (state_dict, named_parameters, to, apply...) works on the module's contents,
    # and the module's hooks run around the compiled forward as they ran around its own
    # (the compiled function is ``module.forward``, which hooks are not part of)
    _SHARED = (
        "_parameters",
        "_buffers",
        "_non_persistent_buffers_set",
        "_modules",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    )

    def __init__(
        self,
        module: torch.nn.Module,
        backend: Callable[..., Any],
        fullgraph: bool,
        recompile_limit: int,
        on_limit: str = "eager",
    ) -> None:
        super().__init__()  # before _orig_mod is set: its `training = True` is not the module's
        own = self.__dict__
        own["_orig_mod"] = module
        for name in self._SHARED:
            if name in module.__dict__:  # each torch release has them; skip one that does not
                own[name] = module.__dict__[name]
        own["compiled_forward"] = CompiledFunction(
            module.forward, backend, fullgraph, recompile_limit, root=module, on_limit=on_limit
        )
        # an instance attribute: nn.Module.__call__ finds it without a bound-method frame
        own["forward"] = own["compiled_forward"]
        own["_fx_settings"] = (backend, fullgraph, recompile_limit, on_limit)

    # ------------------------------------------------------------ passing through
    def __getattr__(self, name: str) -> Any:
        module = self.__dict__.get("_orig_mod")
        if module is None:  # during __init__, or on a half-built copy
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN or hasattr(type(self), name):
            super().__setattr__(name, value)
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._OWN or hasattr(type(self), name):
            super().__delattr__(name)
        else:
            delattr(self._orig_mod, name)

    @property  # type: ignore[override]
    def training(self) -> bool:
        return self._orig_mod.training

    @training.setter
    def training(self, mode: bool) -> None:
        module = self.__dict__.get("_orig_mod")
        if module is not None:  # nn.Module.__init__ sets it before the module is known
            module.training = mode

    @property
    def _is_full_backward_hook(self) -> bool | None:  # read beside the shared backward hooks
        return self._orig_mod._is_full_backward_hook

    @_is_full_backward_hook.setter
    def _is_full_backward_hook(self, value: bool | None) -> None:
        module = self.__dict__.get("_orig_mod")
        if module is not None:  # nn.Module.__init__ sets it before the module is known
            module._is_full_backward_hook = value

    def __len__(self) -> int:
        return len(self._orig_mod)

    def __dir__(self) -> list[str]:
        return sorted({*dir(self._orig_mod), *super().__dir__()})

    def __repr__(self) -> str:
        return f"CompiledModule({self._orig_mod!r})"

    def __reduce__(self) -> tuple:
        # copy.deepcopy and pickle rebuild the wrapper around the copied module: the
        # generated code holds the module it was compiled for, and must not be shared
        return (_compiled_module, (self._orig_mod, *self._fx_settings))

    # ------------------------------------------------------------ reports
    def explain(self) -> Any:
        return self.compiled_forward.explain()

    @property
    def code(self) -> str:
        return self.compiled_forward.code

    @property
    def cache(self) -> list[CacheEntry]:
        return self.compiled_forward.cache


# nn.Module methods that act on the module as a whole: the module's own run (its class may
# override them: RNNs' _apply, BatchNorm's _load_from_state_dict, a model's train), so
# ``modules()`` and ``apply`` meet the module itself, not the wrapper
for _name, _chains in _TO_MODULE.items():
    setattr(CompiledModule, _name, _to_module(_name, _chains))


def _compiled_module(
    module: torch.nn.Module, backend: Any, fullgraph: bool, recompile_limit: int,
    on_limit: str = "eager",
) -> CompiledModule:  # fmt: skip
    return CompiledModule(module, backend, fullgraph, recompile_limit, on_limit)


def _leaf_exprs(name: str, value: Any) -> list[str]:
    """The source expression of each leaf of argument ``name``'s value, in
    ``resolve_dynamic_shapes``'s order (``fxloom.pytree``'s); "" where a leaf is reached
    through a container fxloom's sources do not index (its spec then names no source)."""
    from fxloom import pytree
    from fxloom.bytecode.sources import Item, Local

    found: list[str] = []

    def walk(source: Any, item: Any) -> None:
        if item is None:
            return
        container = pytree.container_type(type(item))
        if container is None:
            found.append(source.expr if source is not None else "")
            return
        children, context = container.flatten(item)
        indexable = container.kind == "dict" or type(item) in (tuple, list)
        keys = list(context) if container.kind == "dict" else range(len(children))
        for key, child in zip(keys, children):
            walk(Item(source, key) if indexable and source is not None else None, child)

    walk(Local(name), value)
    return found


def _user_level() -> int:
    """The ``stacklevel`` of the first frame outside fxloom and torch.nn (the user's call)."""
    import os

    ours = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.nn.__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None:
        file = frame.f_code.co_filename
        if not file.startswith(ours) and not file.startswith("<fxloom"):
            return level
        frame, level = frame.f_back, level + 1
    return 1


# ------------------------------------------------------------------ signatures
_SUSPENDS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _header(parameters: list[inspect.Parameter]) -> str:
    """A parameter list with the same names and binding rules, defaults from ``_fx_DEFAULTS``."""
    parts: list[str] = []
    saw_positional_only = saw_star = False
    for index, parameter in enumerate(parameters):
        name = parameter.name
        default = "" if parameter.default is parameter.empty else f"=_fx_DEFAULTS[{index}]"
        kind = parameter.kind
        if kind is parameter.POSITIONAL_ONLY:
            saw_positional_only = True
        elif saw_positional_only:
            parts.append("/")
            saw_positional_only = False
        if kind is parameter.VAR_POSITIONAL:
            parts.append(f"*{name}")
            saw_star = True
        elif kind is parameter.KEYWORD_ONLY:
            if not saw_star:
                parts.append("*")
                saw_star = True
            parts.append(f"{name}{default}")
        elif kind is parameter.VAR_KEYWORD:
            parts.append(f"**{name}")
        else:
            parts.append(f"{name}{default}")
    if saw_positional_only:
        parts.append("/")
    return ", ".join(parts)
