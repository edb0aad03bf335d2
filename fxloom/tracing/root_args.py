"""The root's parameters as graph inputs: placeholders, defaults, ``*args``/``**kwargs``, fixed arguments.

``Tracer.create_args_for_root`` delegates to ``root_arguments``: one
placeholder per parameter of the traced function, its default kept; a
parameter named in ``concrete_args`` is fixed to that value (``PH`` keeps it
an input), stays in the generated signature and is checked at run time
(``fxloom.guards``); given a structure with ``PH`` leaves (``{"a": PH, "b": 3}``)
it stays one input whose ``PH`` leaves are traced and the rest fixed, the
structure flattened and checked at run time. ``*args`` and ``**kwargs`` are one placeholder each
(``*args``, ``**kwargs``): as in torch.fx, the body gets the traced tuple and
dict themselves (indexing works; expanding them is refused with a hint), or,
with ``concrete_args`` for them, the elements and keys given, under guards on
their count and keys. Through a decorator's ``(*args, **kwargs)`` wrapper
only the latter is possible, and no entries are the default.

With example inputs, they name the inputs (``examples.bind_examples``): a
parameter they leave out that ``concrete_args`` does not name and that has a
default is no input at all — not passed, so the function sees its default
(``*args``/``**kwargs``: empty) — as when the function is called with the
examples; their entries for ``*args``/``**kwargs`` are inputs as with ``PH``.

The root itself (``root_function``): a module's ``Tracer.traced_func_name``
method, a function, or a builtin (recorded as one call if it has a signature).

Depends on ``fxloom.proxy`` and ``fxloom.guards``; placeholders are made
through the tracer's ``create_proxy`` hook.
"""

from __future__ import annotations

import functools
import inspect
import types
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fxloom.lint import is_default_literal
from fxloom.ops.signatures import BUILTIN_CALLABLE_TYPES
from fxloom.proxy import TraceError
from fxloom.pytree import tree_any, tree_flatten, tree_unflatten
from fxloom.runtime_checks import (
    FlattenedInput,
    check_fixed,
    check_variadic_keys,
    check_variadic_length,
    fixed_argument_guard,
)
from fxloom.tracing.patches import recording
from fxloom.values.signature import parameters_of

if TYPE_CHECKING:
    from fxloom.tracer import Tracer
    from fxloom.tracing.examples import ExampleRun

__all__ = ["PH", "RootError", "concrete_args_by_name", "root_arguments", "root_function"]


class RootError(TraceError, AssertionError):
    """The root cannot be traced at all: a missing ``traced_func_name``, a builtin without a signature.

    An ``AssertionError`` too, the type torch.fx raises in these cases.
    """


class _PlaceholderMarker:
    """``concrete_args={"x": PH}`` keeps ``x`` an input while other arguments are fixed."""

    def __repr__(self) -> str:
        return "PH"


PH = _PlaceholderMarker()


def root_function(
    root: torch.nn.Module | Callable[..., Any], traced_func_name: str
) -> tuple[torch.nn.Module, Callable[..., Any], bool]:
    """``(module, fn, is_module)``: the root module (an empty one for a function) and what to trace.

    A module's ``traced_func_name`` method (``forward`` by default) is traced.
    A builtin (C) function becomes one recorded call of it, its parameters
    read from the signature Python and torch give it.
    """
    if isinstance(root, torch.nn.Module):
        fn = getattr(type(root), traced_func_name, None)
        if not callable(fn):
            raise RootError(
                f"the tracer's traced_func_name={traced_func_name!r} is no method of "
                f"{type(root).__qualname__}; define it or set Tracer.traced_func_name to "
                "the method to trace"
            )
        return root, fn, True
    if isinstance(root, BUILTIN_CALLABLE_TYPES):
        return torch.nn.Module(), _recorded_builtin(root), False
    if callable(root):
        return torch.nn.Module(), root, False
    raise TypeError(f"symbolic tracing needs an nn.Module or a function, got {type(root).__name__}")


def _recorded_builtin(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for builtin ``fn`` with its signature, whose call records ``fn`` as one node."""
    try:
        inspect.signature(fn)
    except (ValueError, TypeError):
        module, name = getattr(fn, "__module__", None), getattr(fn, "__name__", repr(fn))
        spelled = f"{module}.{name}" if isinstance(module, str) else fn.__qualname__
        raise RootError(
            f"{spelled} is a builtin (C) function without a signature to make placeholders "
            f"from; trace a Python function that calls it (lambda x: {spelled}(x))"
        ) from None
    record = recording(fn, always=True)

    def call_builtin(*args: Any, **kwargs: Any) -> Any:
        return record(*args, **kwargs)

    functools.update_wrapper(call_builtin, fn)  # its name and (through __wrapped__) signature
    call_builtin.__annotations__ = {}  # a builtin has none; ours would leak into the code
    return call_builtin


def root_arguments(
    tracer: Tracer,
    root_fn: Callable[..., Any],
    is_module: bool,
    concrete_args: dict[str, Any] | tuple[Any, ...] | None,
    examples: ExampleRun | None,
) -> tuple[Callable[..., Any], list[Any]]:
    """``(fn, args)`` to call: ``root_fn`` with a placeholder or fixed value for each parameter.

    ``examples`` (tracing with example inputs) gives each placeholder its example.
    """
    parameters = parameters_of(root_fn, skip_first=is_module)
    concrete_args = concrete_args_by_name(root_fn, is_module, concrete_args)
    concrete_args = _check_concrete_args(root_fn, parameters, dict(concrete_args or {}))
    hints = _annotations(root_fn)
    # A plain function's own *args/**kwargs receive the traced tuple/dict itself, as in
    # torch.fx; through a decorator's wrapper only concrete elements can be passed.
    as_values = _takes_variadics_as_values(root_fn, parameters)
    values: dict[str, Any] = {}
    defaultable = _defaultable_parameters(parameters, concrete_args)
    for param in parameters:
        if examples is not None and _keeps_default(param, concrete_args, examples.inputs):
            values[param.name] = _default_of(param)
            continue
        type_expr = hints.get(param.name)
        spec = concrete_args.get(param.name, PH)
        if param.kind is param.VAR_POSITIONAL:
            spec = _with_example_entries(param, spec, examples)
            values[param.name] = _variadic_positional(
                tracer, param, spec, type_expr, as_values, examples
            )
        elif param.kind is param.VAR_KEYWORD:
            spec = _with_example_entries(param, spec, examples)
            if spec is PH and _examples_pass_no_keywords(examples, parameters):
                spec = {}  # the examples say what the caller passes: nothing
            values[param.name] = _variadic_keyword(
                tracer, param, spec, type_expr, as_values, examples
            )
        elif spec is not PH and tree_any(_is_placeholder_marker, spec):
            values[param.name] = _structured_input(tracer, param, spec, type_expr)
        elif spec is not PH:
            may_default = param.name in defaultable
            values[param.name] = _fixed_argument(tracer, param, spec, type_expr, may_default)
        else:
            default = () if param.default is param.empty else (param.default,)
            value = tracer.create_proxy("placeholder", param.name, default, {}, type_expr=type_expr)
            if examples is not None:
                examples.attach_input(value, param)
            values[param.name] = value
    leading = [tracer.root] if is_module else []
    if as_values:
        return _call_with_variadics_as_values(root_fn, parameters, values, leading)
    return _call(root_fn, parameters, values, leading)


def _examples_pass_no_keywords(examples: ExampleRun | None, parameters: list) -> bool:
    """Whether example inputs were given and none of them goes to ``**kwargs``.

    Hugging Face head models take ``**kwargs`` only to hand them on to their base model;
    traced as one unknown dict, the hand-on (``self.transformer(..., **kwargs)``) cannot
    be expanded. Examples that pass none fix it to ``{}``, under a guard on its keys.
    """
    if examples is None:
        return False
    named = {p.name for p in parameters if p.kind is not p.VAR_KEYWORD}
    return all(name in named for name in examples.inputs)


def concrete_args_by_name(
    root_fn: Callable[..., Any],
    is_module: bool,
    concrete_args: dict[str, Any] | tuple[Any, ...] | None,
) -> dict[str, Any] | None:
    """``concrete_args`` as a dict: a tuple (as torch.fx accepts) gives one value per parameter.

    The tuple lists the named parameters in order (``self`` left out), as
    torch.fx reads it; for a function taking only ``*args`` (``forward(self,
    *args, **kwargs)``), its entries are the positional arguments to trace with.
    """
    if not isinstance(concrete_args, tuple):
        return concrete_args
    parameters = parameters_of(root_fn, skip_first=is_module)
    named = [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    stars = [p.name for p in parameters if p.kind is p.VAR_POSITIONAL]
    if not named and stars and concrete_args:
        return {stars[0]: concrete_args}
    if len(named) != len(concrete_args):
        raise TraceError.like(RuntimeError)(
            f"concrete_args is a tuple of {len(concrete_args)} values, but "
            f"{getattr(root_fn, '__qualname__', root_fn)} has {len(named)} parameters to fix "
            f"({', '.join(named) or 'none'}); give one value per parameter, in order (PH keeps "
            "one an input), or a dict naming the parameters to fix"
        )
    return dict(zip(named, concrete_args))


# A parameter the example inputs leave out: not passed, so the function uses its own default.
_DEFAULT: Any = object()


def _keeps_default(
    param: inspect.Parameter, concrete_args: dict[str, Any], inputs: dict[str, Any]
) -> bool:
    """With example inputs, whether ``param`` is no input: not given, and it has a default.

    As with torch.export's kwargs, the examples name what the caller passes; the
    rest keep their defaults (variadics: none). ``concrete_args`` (``PH`` too)
    still decides for the parameters it names; one without a default stays an input.
    """
    if param.name in inputs or param.name in concrete_args:
        return False
    variadic = param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
    return variadic or param.default is not param.empty


def _default_of(param: inspect.Parameter) -> Any:
    if param.kind is param.VAR_POSITIONAL:
        return ()
    if param.kind is param.VAR_KEYWORD:
        return {}
    return _DEFAULT


def _with_example_entries(param: inspect.Parameter, spec: Any, examples: ExampleRun | None) -> Any:
    """``spec`` for ``*args``/``**kwargs`` plus the entries the example inputs give them (inputs)."""
    given = None if examples is None else examples.inputs.get(param.name)
    if given is None:
        return spec
    if param.kind is param.VAR_KEYWORD:
        return {**_keyword_entries(param.name, spec), **dict.fromkeys(given, PH)}
    if spec is PH or spec is None:
        return (PH,) * len(given)
    return spec


def _call(
    root_fn: Callable[..., Any],
    parameters: list[inspect.Parameter],
    values: dict[str, Any],
    leading: list[Any],
) -> tuple[Callable[..., Any], list[Any]]:
    """``root_fn`` bound to ``values``, ``*args`` and ``**kwargs`` given element by element."""
    positional, keyword = list(leading), {}
    after_variadic = _has_variadic_positional(parameters)
    for param in parameters:
        value = values[param.name]
        if param.kind is param.VAR_POSITIONAL:
            positional.extend(value)
        elif param.kind is param.VAR_KEYWORD:
            keyword.update(value)
        # By keyword where possible: decorators wrapping forward (*args, **kwargs)
        # often inspect keywords, and mixing would pass a value twice.
        elif param.kind is param.POSITIONAL_ONLY or after_variadic:
            positional.append(param.default if value is _DEFAULT else value)
        elif value is not _DEFAULT:  # left out, as the caller of the examples leaves it out
            keyword[param.name] = value
    return functools.partial(root_fn, *positional, **keyword), []


_VARIADIC_FLAGS = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS


def _takes_variadics_as_values(root_fn: Callable[..., Any], parameters: list) -> bool:
    """Whether ``root_fn`` is a plain function whose own code has the ``*args``/``**kwargs``."""
    code = getattr(root_fn, "__code__", None)
    return (
        isinstance(root_fn, types.FunctionType)
        and not hasattr(root_fn, "__wrapped__")
        and code is not None
        and bool(code.co_flags & _VARIADIC_FLAGS)
        and any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters)
    )


def _call_with_variadics_as_values(
    root_fn: types.FunctionType,
    parameters: list[inspect.Parameter],
    values: dict[str, Any],
    leading: list[Any],
) -> tuple[Callable[..., Any], list[Any]]:
    """``root_fn`` run with its ``*args`` tuple and ``**kwargs`` dict passed as they are.

    Python builds a fresh tuple/dict for variadic parameters, so a traced one
    cannot reach the body through a call. A copy of the function whose code
    takes every parameter positionally (the code's order: positional,
    keyword-only, ``*args``, ``**kwargs``) receives them as they are.
    """
    code = root_fn.__code__
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    positional_code = code.replace(
        co_argcount=count,
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_flags=code.co_flags & ~_VARIADIC_FLAGS,
    )
    fn = types.FunctionType(
        positional_code, root_fn.__globals__, root_fn.__name__, None, root_fn.__closure__
    )
    fn.__qualname__ = root_fn.__qualname__
    names = positional_code.co_varnames[len(leading) : count]
    defaults = {p.name: p.default for p in parameters}
    given = [defaults[name] if values[name] is _DEFAULT else values[name] for name in names]
    return functools.partial(fn, *leading, *given), []


def _check_concrete_args(
    root_fn: Callable[..., Any], parameters: list[inspect.Parameter], concrete_args: dict[str, Any]
) -> dict[str, Any]:
    """``concrete_args`` by parameter; names that are no parameter go to ``**kwargs`` if there is one."""
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
    return concrete_args


def _variadic_positional(
    tracer: Tracer,
    param: inspect.Parameter,
    spec: Any,
    type_expr: Any,
    as_value: bool,
    examples: ExampleRun | None,
) -> Any:
    """``*args``: the traced tuple itself (as torch.fx), or the elements ``concrete_args`` lists.

    With elements (none when the tuple cannot be passed as it is), a guard checks their count.
    """
    star = tracer.create_proxy("placeholder", f"*{param.name}", (), {}, type_expr=type_expr)
    if examples is not None:
        examples.attach_input(star, param)
    if (spec is PH or spec is None) and as_value:
        return star
    elements = () if spec is PH or spec is None else spec
    if not isinstance(elements, (tuple, list)):
        raise TraceError(
            f"concrete_args[{param.name!r}] must be a tuple with one entry per extra "
            f"positional argument (PH for an input), got {spec!r}"
        )
    tracer.create_proxy(
        "call_function", check_variadic_length, (star, len(elements), param.name), {}, "guard"
    )
    return tuple(star[i] if value is PH else value for i, value in enumerate(elements))


def _variadic_keyword(
    tracer: Tracer,
    param: inspect.Parameter,
    spec: Any,
    type_expr: Any,
    as_value: bool,
    examples: ExampleRun | None,
) -> Any:
    """``**kwargs``: the traced dict itself (as torch.fx), or the keys ``concrete_args`` gives.

    A key given ``PH`` is an input the caller must pass; a key given a value
    is traced with that value, and the caller may omit it or pass the same
    value (another one raises, as for any fixed argument).
    """
    stars = tracer.create_proxy("placeholder", f"**{param.name}", (), {}, type_expr=type_expr)
    if examples is not None:
        examples.attach_input(stars, param)
    if (spec is PH or spec is None) and as_value:
        return stars
    entries = _keyword_entries(param.name, spec)
    inputs = tuple(key for key, value in entries.items() if value is PH)
    fixed = tuple(key for key, value in entries.items() if value is not PH)
    tracer.create_proxy(
        "call_function", check_variadic_keys, (stars, inputs, param.name, fixed), {}, "guard"
    )
    for key in fixed:
        given = stars.get(key, entries[key])
        guard, expected = fixed_argument_guard(key, entries[key])
        tracer.create_proxy("call_function", guard, (given, *expected), {}, "guard")
    return {key: stars[key] if value is PH else value for key, value in entries.items()}


def _fixed_argument(
    tracer: Tracer, param: inspect.Parameter, value: Any, type_expr: Any, may_default: bool
) -> Any:
    """An input fixed to ``value``: tracing sees ``value``; the code checks it at run time.

    It stays in the signature, defaulting to ``value`` when that is a
    literal and no parameter without a default follows it. Unannotated and
    fixed to a bool, int, float or str, it is annotated with that type (the
    only one it may take), which TorchScript needs to script the signature.
    """
    guard, expected = fixed_argument_guard(param.name, value)
    if type_expr is None and guard is check_fixed and value is not None:
        type_expr = type(value)
    default = (value,) if may_default and is_default_literal(value) else ()
    placeholder = tracer.create_proxy("placeholder", param.name, default, {}, type_expr=type_expr)
    tracer.create_proxy("call_function", guard, (placeholder, *expected), {}, "guard")
    return value


def _structured_input(tracer: Tracer, param: inspect.Parameter, spec: Any, type_expr: Any) -> Any:
    """An input given as a structure with ``PH`` leaves (``{"a": PH, "b": 3}``).

    As in torch.fx, the ``PH`` leaves are inputs and the others fixed; the
    structure is flattened in the generated code (``fxloom.pytree``) and
    checked, with the fixed leaves, at run time.
    """
    leaves, structure = tree_flatten(spec)
    placeholder = tracer.create_proxy("placeholder", param.name, (), {}, type_expr=type_expr)
    fixed = {i: leaf for i, leaf in enumerate(leaves) if leaf is not PH}
    flat = tracer.create_proxy(
        "call_function", FlattenedInput(param.name, structure, fixed), (placeholder,), {}
    )
    traced = [flat[i] if leaf is PH else leaf for i, leaf in enumerate(leaves)]
    return tree_unflatten(traced, structure)


def _is_placeholder_marker(value: Any) -> bool:
    return value is PH


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
        fixed_literal = spec is not PH and is_default_literal(spec)
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


def _has_variadic_positional(parameters: list[inspect.Parameter]) -> bool:
    # With a *args after them, earlier parameters can only be filled positionally.
    return any(p.kind is p.VAR_POSITIONAL for p in parameters)


# Evaluating string annotations (``from __future__ import annotations``) costs more than the
# rest of a small trace's set-up: once per function. Weak: functions come and go.
_annotations_of: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _annotations(fn: Callable[..., Any]) -> dict[str, Any]:
    function = getattr(fn, "__func__", fn)
    try:
        found = _annotations_of.get(function)
    except TypeError:  # not weak-referenceable
        found = None
    if found is None:
        try:
            found = dict(inspect.get_annotations(fn, eval_str=True))
        except Exception:  # unresolvable string annotations: keep none rather than fail tracing
            found = {}
        try:
            _annotations_of[function] = found
        except TypeError:
            pass
    return dict(found)
