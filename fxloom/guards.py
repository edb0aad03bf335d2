"""Run-time checks that traced code carries for the assumptions made while tracing.

Tracing fixes some things: an argument given in ``concrete_args``, the number
of ``*args``, the branch an example input took, the dtype and rank of an
example input, the length of an unpacked value. The generated code calls one
of these checks for each, so a call that breaks an assumption raises a clear
error instead of silently computing something else::

    flag_fixed(flag)     # a FixedArgument("flag", True): raises for flag=False

Every check is impure (dead-code elimination keeps it) and, when itself
traced again (a traced module used inside another one being traced), records
itself as a call instead of running on the proxies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from fxloom.ops.mutation import READ_ONLY_EFFECT_TYPES, READ_ONLY_EFFECTS, has_side_effect
from fxloom.proxy import Proxy
from fxloom.pytree import TreeSpec, tree_flatten

__all__ = [
    "FixedArgument",
    "FlattenedInput",
    "check_guard",
    "check_length",
    "check_tensor_input",
    "check_variadic_keys",
    "check_variadic_length",
]


def _recorded_when_traced(check: Callable[..., None]) -> Callable[..., Any]:
    """Make ``check`` a leaf of tracing and keep it through dead-code elimination.

    The checked value is always the first argument; only it can be a proxy
    (the others are constants), so one isinstance test keeps the common path cheap.
    """

    @functools.wraps(check)
    def run(value: Any, *rest: Any) -> Any:
        if isinstance(value, Proxy):
            return value.tracer.create_proxy("call_function", run, (value, *rest), {})
        return check(value, *rest)

    READ_ONLY_EFFECTS.add(run)  # it raises or not; it writes nothing
    return has_side_effect(run)


@_recorded_when_traced
def check_guard(value: Any, convert: Callable[[Any], Any], expected: Any, where: str) -> None:
    """Raise if a value the trace was specialised on comes out differently at run time."""
    actual = convert(value)
    if actual != expected:
        raise RuntimeError(
            f"this module was traced with example inputs for which {convert.__name__}(...) at "
            f"{where} was {expected!r}; now it is {actual!r}, so the traced code does not apply. "
            "Retrace with inputs like these, or make that code a leaf module / wrapped function"
        )


@_recorded_when_traced
def check_tensor_input(value: Any, dtype: torch.dtype, ndim: int, name: str) -> None:
    """Raise if an input's dtype or rank differs from the example the module was traced with."""
    if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.dim() != ndim:
        got = (
            f"a {value.dim()}-d {value.dtype} tensor"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise TypeError(
            f"input {name!r}: this module was traced with a {ndim}-d {dtype} tensor, got {got}; "
            "retrace with an example of this kind"
        )


@_recorded_when_traced
def check_length(value: Any, expected: int, where: str) -> None:
    """Raise if ``value`` does not have the ``expected`` number of elements.

    The traced code unpacks, or loops over, exactly as many elements as the
    trace saw; with another number it would silently do something else.
    """
    if len(value) != expected:
        raise ValueError(
            f"the traced code unpacks or iterates over exactly {expected} elements at {where}, "
            f"but got {len(value)}; retrace with inputs of this kind"
        )


@_recorded_when_traced
def check_variadic_length(args: tuple[Any, ...], expected: int, name: str) -> None:
    """Raise if ``*name`` gets another number of arguments than it was traced with."""
    if len(args) != expected:
        raise TypeError(
            f"this module was traced with {expected} extra positional argument(s) in *{name}, "
            f"but {len(args)} were passed; retrace with concrete_args={{{name!r}: (PH, ...)}} "
            "listing one entry per argument"
        )


@_recorded_when_traced
def check_variadic_keys(
    kwargs: dict[str, Any], expected: tuple[str, ...], name: str, fixed: tuple[str, ...] = ()
) -> None:
    """Raise if ``**name`` lacks a key it was traced with, or gets one it was not.

    ``fixed`` keys were traced with a value of their own: they may be left out.
    """
    missing = set(expected) - set(kwargs)
    unexpected = set(kwargs) - set(expected) - set(fixed)
    if missing or unexpected:
        traced = sorted(expected) + [f"{key} (fixed)" for key in fixed]
        raise TypeError(
            f"this module was traced with keyword arguments {traced} in **{name}, but "
            f"got {sorted(kwargs)}; retrace with concrete_args={{{name!r}: {{key: PH, ...}}}}"
        )


def _same(value: Any, expected: Any) -> bool:
    """Whether an argument is the value it was fixed to (``is``, then ``==``)."""
    if value is expected:
        return True
    try:
        return bool(value == expected)
    except Exception:  # == that does not give a bool (tensors, arrays): not the same
        return False


class FixedArgument:
    """Checks that an argument fixed by ``concrete_args`` still gets the value it was traced with.

    A callable holding the expected value itself (any object, compared with
    ``is`` then ``==``), so a fixed config object is checked as well as a bool.
    Generated code calls it on the argument: ``use_cache_fixed(use_cache)``.
    """

    _is_impure = True  # kept by dead-code elimination (see Node.is_impure)

    def __init__(self, name: str, expected: Any) -> None:
        self.name = name
        self.expected = expected
        self.__name__ = f"{name}_fixed"  # how generated code names it

    def __call__(self, value: Any) -> Any:
        if isinstance(value, Proxy):  # traced again: record the check, do not run it
            return value.tracer.create_proxy("call_function", self, (value,), {})
        if not _same(value, self.expected):
            raise ValueError(
                f"argument {self.name!r} was fixed to {self.expected!r} when this module was "
                f"traced (concrete_args), but {value!r} was passed; retrace to use another value"
            )
        return None

    def __repr__(self) -> str:
        return f"FixedArgument({self.name}={self.expected!r})"


class FlattenedInput:
    """The leaves of an argument given as a structure with ``PH`` inside (``concrete_args``).

    Traced with ``{"x": {"a": PH, "b": 3}}``, the generated code flattens
    ``x`` with ``fxloom.pytree`` and reads its ``PH`` leaves; this checks that
    ``x`` has the traced structure and the fixed leaves their traced values:
    ``x_leaves(x)`` returns the list of leaves.
    """

    _is_impure = True  # kept by dead-code elimination (see Node.is_impure)

    def __init__(self, name: str, spec: TreeSpec, fixed: dict[int, Any]) -> None:
        self.name = name
        self.spec = spec
        self.fixed = fixed  # leaf index -> the value it was traced with
        self.__name__ = f"{name}_leaves"  # how generated code names it

    def __call__(self, value: Any) -> Any:
        if isinstance(value, Proxy):  # traced again: record the call, do not run it
            return value.tracer.create_proxy("call_function", self, (value,), {})
        leaves, spec = tree_flatten(value)
        if spec != self.spec:
            raise TypeError(
                f"argument {self.name!r} was traced as {self.spec} (concrete_args), but "
                f"{value!r} has the structure {spec}; pass it in the traced structure or retrace"
            )
        for index, expected in self.fixed.items():
            if not _same(leaves[index], expected):
                raise ValueError(
                    f"entry {index} of argument {self.name!r} (flattened) was fixed to "
                    f"{expected!r} when this module was traced (concrete_args), but "
                    f"{leaves[index]!r} was passed; retrace to use another value"
                )
        return leaves

    def __repr__(self) -> str:
        return f"FlattenedInput({self.name}: {self.spec})"


# Fixed-argument and flattened-input checks raise or not; they write nothing (the passes may
# reorder and merge around them).
READ_ONLY_EFFECT_TYPES.update((FixedArgument, FlattenedInput))
