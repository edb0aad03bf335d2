"""The root's parameters as graph inputs: placeholders, defaults, ``*args``/``**kwargs``, fixed arguments.

``Tracer.create_args_for_root`` delegates to ``root_arguments``: one
placeholder per parameter of the traced function, its default kept; a
parameter named in ``concrete_args`` is fixed to that value (``PH`` keeps it
an input), stays in the generated signature and is checked at run time
(``fxloom.guards``); ``*args`` and ``**kwargs`` are traced with the elements
and keys ``concrete_args`` gives them, under guards on their count and keys.

Depends on ``fxloom.proxy`` and ``fxloom.guards``; placeholders are made
through the tracer's ``create_proxy`` hook.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fxloom.guards import FixedArgument, check_variadic_keys, check_variadic_length
from fxloom.proxy import TraceError

if TYPE_CHECKING:
    from fxloom.tracer import Tracer
    from fxloom.tracing.examples import ExampleRun

__all__ = ["PH", "root_arguments"]


class _PlaceholderMarker:
    """``concrete_args={"x": PH}`` keeps ``x`` an input while other arguments are fixed."""

    def __repr__(self) -> str:
        return "PH"


PH = _PlaceholderMarker()


def root_arguments(
    tracer: Tracer,
    root_fn: Callable[..., Any],
    is_module: bool,
    concrete_args: dict[str, Any] | None,
    examples: ExampleRun | None,
) -> tuple[Callable[..., Any], list[Any]]:
    """``(fn, args)`` to call: ``root_fn`` with a placeholder or fixed value for each parameter.

    ``examples`` (tracing with example inputs) gives each placeholder its example.
    """
    signature = inspect.signature(root_fn)
    parameters = list(signature.parameters.values())
    if is_module:
        parameters = parameters[1:]
    concrete_args = _check_concrete_args(root_fn, parameters, dict(concrete_args or {}))
    hints = _annotations(root_fn)
    positional: list[Any] = [tracer.root] if is_module else []
    keyword: dict[str, Any] = {}
    defaultable = _defaultable_parameters(parameters, concrete_args)
    for param in parameters:
        type_expr = hints.get(param.name)
        spec = concrete_args.get(param.name, PH)
        if param.kind is param.VAR_POSITIONAL:
            positional.extend(_variadic_positional(tracer, param, spec, type_expr))
        elif param.kind is param.VAR_KEYWORD:
            keyword.update(_variadic_keyword(tracer, param, spec, type_expr))
        else:
            if spec is not PH:
                may_default = param.name in defaultable
                value = _fixed_argument(tracer, param, spec, type_expr, may_default)
            else:
                default = () if param.default is param.empty else (param.default,)
                value = tracer.create_proxy(
                    "placeholder", param.name, default, {}, type_expr=type_expr
                )
                if examples is not None:
                    examples.attach_input(value, param)
            # By keyword where possible: decorators wrapping forward (*args, **kwargs)
            # often inspect keywords, and mixing would pass a value twice.
            if param.kind is param.POSITIONAL_ONLY or _has_variadic_positional(parameters):
                positional.append(value)
            else:
                keyword[param.name] = value
    return functools.partial(root_fn, *positional, **keyword), []


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
    tracer: Tracer, param: inspect.Parameter, spec: Any, type_expr: Any
) -> list[Any]:
    """``*args``: traced with as many elements as ``concrete_args`` lists (none by default)."""
    elements = () if spec is PH or spec is None else spec
    if not isinstance(elements, (tuple, list)):
        raise TraceError(
            f"concrete_args[{param.name!r}] must be a tuple with one entry per extra "
            f"positional argument (PH for an input), got {spec!r}"
        )
    star = tracer.create_proxy("placeholder", f"*{param.name}", (), {}, type_expr=type_expr)
    tracer.create_proxy(
        "call_function", check_variadic_length, (star, len(elements), param.name), {}, "guard"
    )
    return [star[i] if value is PH else value for i, value in enumerate(elements)]


def _variadic_keyword(
    tracer: Tracer, param: inspect.Parameter, spec: Any, type_expr: Any
) -> dict[str, Any]:
    """``**kwargs``: traced with the keys ``concrete_args`` gives (none by default).

    A key given ``PH`` is an input the caller must pass; a key given a value
    is traced with that value, and the caller may omit it or pass the same
    value (another one raises, as for any fixed argument).
    """
    entries = _keyword_entries(param.name, spec)
    inputs = tuple(key for key, value in entries.items() if value is PH)
    fixed = tuple(key for key, value in entries.items() if value is not PH)
    stars = tracer.create_proxy("placeholder", f"**{param.name}", (), {}, type_expr=type_expr)
    tracer.create_proxy(
        "call_function", check_variadic_keys, (stars, inputs, param.name, fixed), {}, "guard"
    )
    for key in fixed:
        given = stars.get(key, entries[key])
        tracer.create_proxy(
            "call_function", FixedArgument(key, entries[key]), (given,), {}, "guard"
        )
    return {key: stars[key] if value is PH else value for key, value in entries.items()}


def _fixed_argument(
    tracer: Tracer, param: inspect.Parameter, value: Any, type_expr: Any, may_default: bool
) -> Any:
    """An input fixed to ``value``: tracing sees ``value``; the code checks it at run time.

    It stays in the signature, defaulting to ``value`` when that is a
    literal and no parameter without a default follows it.
    """
    default = (value,) if may_default and _is_literal(value) else ()
    placeholder = tracer.create_proxy("placeholder", param.name, default, {}, type_expr=type_expr)
    check = FixedArgument(param.name, value)
    tracer.create_proxy("call_function", check, (placeholder,), {}, "guard")
    return value


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


def _has_variadic_positional(parameters: list[inspect.Parameter]) -> bool:
    # With a *args after them, earlier parameters can only be filled positionally.
    return any(p.kind is p.VAR_POSITIONAL for p in parameters)


# Values printable as a default in the generated signature.
_LITERAL_TYPES = frozenset({int, float, bool, str, type(None), complex})


def _is_literal(value: Any) -> bool:
    """A scalar literal, or a plain tuple/list of them: printable as a parameter default."""
    t = type(value)
    if t in _LITERAL_TYPES:
        return True
    return (t is tuple or t is list) and all(_is_literal(v) for v in value)


def _annotations(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return dict(inspect.get_annotations(fn, eval_str=True))
    except Exception:  # unresolvable string annotations: keep none rather than fail tracing
        return {}
