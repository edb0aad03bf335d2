"""A call's arguments and the parameters they bind to: one place for every frontend and consumer.

Symbolic tracing, export, ``fxloom.compile`` and the consumers that run a captured program
(pipeline stages, the command line) all ask the same questions of a call ``fn(*args,
**kwargs)``: which parameter gets which value (``bind``, defaults filled in or not), how to
call ``fn`` again with values by parameter (``unbind``), and the inputs as one flat list of
leaves with the structure that rebuilds them (``flatten`` / ``unflatten``, as export lifts
them)::

    >>> from fxloom.values.signature import bind, unbind, flatten, unflatten
    >>> def f(x, scale=2.0, *rest, bias=None, **options):
    ...     pass
    >>> bound = bind(f, (1, 3.0, 4), {"mode": "fast"})
    >>> bound
    {'x': 1, 'scale': 3.0, 'rest': (4,), 'bias': None, 'options': {'mode': 'fast'}}
    >>> unbind(f, bound)
    ((1, 3.0, 4), {'bias': None, 'mode': 'fast'})
    >>> leaves, spec = flatten(bound.values())
    >>> leaves
    [1, 3.0, 4, 'fast']
    >>> unflatten(leaves, spec) == tuple(bound.values())
    True

A call that does not fit raises ``BindError`` (a ``TypeError``) naming the parameter and the
callable, prefixed by what the caller was doing (``what=``)::

    >>> bind(f, (), {}, what="export")
    Traceback (most recent call last):
    ...
    fxloom.values.signature.BindError: export: f(x, scale=2.0, *rest, bias=None, **options): \
missing a required argument: 'x'

The inspect-based functions suit calls made once per capture. ``fxloom.compile`` binds on
every call it interprets, so the ``code_*`` functions read a plain function's code object
instead (no ``inspect.Signature`` built), with Python's own error words.

Depends on ``fxloom.pytree``.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fxloom import pytree

__all__ = [
    "BindError",
    "parameters_of",
    "bind",
    "unbind",
    "call_of",
    "flatten",
    "unflatten",
    "code_parameter_names",
    "code_variadic_names",
    "code_bind",
    "code_unbind",
]

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


class BindError(TypeError):
    """Arguments that do not fit a signature: the message names the parameter and callable."""


# ------------------------------------------------------------------ by inspect.Signature
def parameters_of(
    fn: Callable[..., Any] | inspect.Signature,
    *,
    skip_first: bool = False,
    follow_wrapped: bool = True,
) -> list[inspect.Parameter]:
    """``fn``'s parameters in order; ``skip_first`` leaves out a method's ``self`` (a module's
    unbound ``forward``), ``follow_wrapped=False`` reads a decorator's own signature. A
    callable without a signature raises as ``inspect.signature`` does (callers that probe
    builtins catch its ``ValueError``)."""
    if isinstance(fn, inspect.Signature):
        signature = fn
    else:
        signature = inspect.signature(fn, follow_wrapped=follow_wrapped)
    parameters = list(signature.parameters.values())
    return parameters[1:] if skip_first else parameters


def bind(
    fn: Callable[..., Any] | inspect.Signature,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    defaults: bool = True,
    partial: bool = False,
    what: str | None = None,
) -> dict[str, Any]:
    """The value each parameter of ``fn`` gets from ``fn(*args, **kwargs)``, in parameter order.

    ``defaults``: parameters left out get their defaults (``*args``: ``()``, ``**kwargs``:
    ``{}``); False binds only what was passed. ``partial``: required parameters may be left
    out. A call that does not fit raises ``BindError`` saying so, prefixed by ``what``.
    """
    signature = _signature(fn)
    binder = signature.bind_partial if partial else signature.bind
    try:
        bound = binder(*args, **dict(kwargs or {}))
    except TypeError as error:
        raise BindError(_misfit(fn, signature, args, error, what)) from None
    if defaults:
        bound.apply_defaults()
    return dict(bound.arguments)


def unbind(
    fn: Callable[..., Any] | inspect.Signature | list[inspect.Parameter],
    bound: Mapping[str, Any],
    positional: int | None = None,
) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` that bind ``fn``'s parameters to ``bound`` again: ``*args`` and
    ``**kwargs`` expanded, keyword-only parameters as keywords. ``positional``: how many of
    the leading parameters go by position (the rest by keyword, as the caller passed them);
    None: every one that can. A parameter missing from ``bound`` is not passed."""
    parameters = fn if isinstance(fn, list) else parameters_of(fn)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for index, parameter in enumerate(p for p in parameters if p.name in bound):
        value = bound[parameter.name]
        kind = parameter.kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            args.extend(value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            kwargs.update(value)
        elif kind is inspect.Parameter.KEYWORD_ONLY or (
            positional is not None and index >= positional
        ):
            kwargs[parameter.name] = value
        else:
            args.append(value)
    return tuple(args), kwargs


def call_of(inputs: Any) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` of inputs written as users write example inputs and batches: a dict
    passes by name, a tuple or list by position, anything else is the one positional input."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def flatten(values: Iterable[Any]) -> tuple[list[Any], pytree.TreeSpec]:
    """The leaves of the bound values (one per parameter, in order) and the spec that rebuilds
    their tuple; a None is a container of nothing (no input), as export lifts inputs."""
    return pytree.tree_flatten(tuple(values), none_is_leaf=False)


def unflatten(leaves: Iterable[Any], spec: pytree.TreeSpec) -> tuple:
    """The tuple of bound values ``flatten`` took apart, rebuilt from ``leaves``."""
    return pytree.tree_unflatten(list(leaves), spec)


def _signature(fn: Callable[..., Any] | inspect.Signature) -> inspect.Signature:
    if isinstance(fn, inspect.Signature):
        return fn
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError) as error:
        raise BindError(
            f"{_name(fn)} has no signature to bind arguments to ({error}); pass a Python "
            "function or module, or wrap this callable in one"
        ) from None


def _misfit(
    fn: Any, signature: inspect.Signature, args: tuple, error: TypeError, what: str | None
) -> str:
    """Why ``args`` do not fit: inspect's words, which name the parameter, except for too many
    positional arguments, where we name those that take them."""
    detail = str(error)
    if detail == "too many positional arguments":
        takers = [
            p.name
            for p in signature.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        detail = (
            f"too many positional arguments: {len(args)} given, but only {len(takers)} "
            f"parameters take them ({', '.join(takers) or 'none'})"
        )
    called = f"{_name(fn)}{signature}" if not isinstance(fn, inspect.Signature) else str(signature)
    return f"{what + ': ' if what else ''}{called}: {detail}"


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


# ------------------------------------------------------------------ by code object
def code_parameter_names(fn: types.FunctionType) -> tuple[str, ...]:
    """The names of ``fn``'s parameters in the order its frame holds them: positional,
    keyword-only, ``*args``, ``**kwargs`` (how ``fxloom.compile`` passes their values)."""
    code = fn.__code__
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[:count]


def code_variadic_names(fn: types.FunctionType) -> tuple[str, ...]:
    """The names of ``fn``'s ``*args`` and ``**kwargs`` parameters, in that order (the
    containers Python makes for each call)."""
    code = fn.__code__
    index = code.co_argcount + code.co_kwonlyargcount
    count = bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[index : index + count]


def code_bind(fn: types.FunctionType, args: tuple, kwargs: dict) -> dict[str, Any]:
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
    _fill_code_defaults(fn, bound, positional, keyword_only)
    return bound


def _fill_code_defaults(
    fn: types.FunctionType, bound: dict[str, Any], positional: tuple, keyword_only: tuple
) -> None:
    defaults = fn.__defaults__ or ()
    first_default = len(positional) - len(defaults)
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


def code_unbind(
    fn: types.FunctionType, names: tuple[str, ...], values: tuple
) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` that bind ``fn``'s parameters (``names``, as
    ``code_parameter_names`` gives them) to ``values`` again."""
    code = fn.__code__
    positional = list(values[: code.co_argcount])
    rest = code.co_argcount
    keyword_only = slice(rest, rest + code.co_kwonlyargcount)
    kwargs = dict(zip(names[keyword_only], values[keyword_only]))
    rest += code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        positional.extend(values[rest])
        rest += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(values[rest])
    return tuple(positional), kwargs
