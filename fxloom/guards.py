"""Run-time checks that traced code carries for the assumptions made while tracing.

Tracing fixes some things: an argument given in ``concrete_args``, the number
of ``*args``, the branch an example input took, the dtype and rank of an
example input, the length of an unpacked value. The generated code calls one
of these checks for each, so a call that breaks an assumption raises a clear
error instead of silently computing something else::

    check_fixed(flag, True, 'flag')        # concrete_args={"flag": True}: raises for False
    check_bool(gt, True, 'model.py:15')    # `if x.sum() > 0:` took the True branch

Every check is impure (dead-code elimination keeps it) and, when itself
traced again (a traced module used inside another one being traced), records
itself as a call instead of running on the proxies. The checks a traced module
can carry into TorchScript have twins there (``fxloom._guards_torchscript``):
all but ``FixedArgument`` (a fixed non-literal object), ``FlattenedInput`` and
the ``*args``/``**kwargs`` checks, whose modules TorchScript cannot script anyway.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

from fxloom import _guards_torchscript as twins
from fxloom._guards_torchscript import (
    fixed_message,
    length_message,
    specialized_message,
    tensor_input_message,
)
from fxloom.ops.mutation import READ_ONLY_EFFECT_TYPES, READ_ONLY_EFFECTS, has_side_effect
from fxloom.proxy import Proxy
from fxloom.pytree import TreeSpec, tree_flatten

__all__ = [
    "GUARDS",
    "SPECIALIZATION_GUARDS",
    "FixedArgument",
    "FixedArgumentError",
    "FlattenedInput",
    "check_bool",
    "check_fixed",
    "check_float",
    "check_index",
    "check_int",
    "check_len",
    "check_length",
    "check_tensor_input",
    "check_variadic_keys",
    "check_variadic_length",
    "is_guard",
]


def _recorded_when_traced(
    twin: Callable[..., None] | None,
) -> Callable[[Callable[..., None]], Callable[..., Any]]:
    """Make a check a leaf of tracing, kept through dead-code elimination, and scriptable.

    The checked value is always the first argument; only it can be a proxy
    (the others are constants), so one isinstance test keeps the common path cheap.
    ``twin`` is the check's TorchScript twin (``fxloom._guards_torchscript``),
    which ``torch.jit.script`` compiles in its place (``__prepare_scriptable__``);
    without one, a module calling the check does not script.
    """

    def record(check: Callable[..., None]) -> Callable[..., Any]:
        @functools.wraps(check)
        def run(value: Any, *rest: Any) -> Any:
            if isinstance(value, Proxy):
                return value.tracer.create_proxy("call_function", run, (value, *rest), {})
            return check(value, *rest)

        if twin is not None:
            run.__prepare_scriptable__ = lambda: twin  # type: ignore[attr-defined]
        READ_ONLY_EFFECTS.add(run)  # it raises or not; it writes nothing
        return has_side_effect(run)

    return record


def _differs(conversion: str, where: str, expected: Any, actual: Any) -> RuntimeError:
    return RuntimeError(specialized_message(conversion, where, repr(expected), repr(actual)))


# One guard per conversion a trace specialises on with example inputs (``if x.sum() > 0:``
# records ``check_bool(gt, True, 'model.py:15')``): TorchScript cannot take the conversion
# itself as an argument, and the guard's name says what was fixed.
@_recorded_when_traced(twins.check_bool)
def check_bool(value: Any, expected: bool, where: str) -> None:
    """Raise if a condition the trace took a branch on comes out differently at run time."""
    if bool(value) != expected:
        raise _differs("bool", where, expected, bool(value))


@_recorded_when_traced(twins.check_int)
def check_int(value: Any, expected: int, where: str) -> None:
    """Raise if ``int(value)``, fixed by the trace, comes out differently at run time."""
    if int(value) != expected:
        raise _differs("int", where, expected, int(value))


@_recorded_when_traced(twins.check_index)
def check_index(value: Any, expected: int, where: str) -> None:
    """Raise if ``value`` used as an index (``operator.index``) changes from the traced one."""
    if operator.index(value) != expected:
        raise _differs("index", where, expected, operator.index(value))


@_recorded_when_traced(twins.check_float)
def check_float(value: Any, expected: float, where: str) -> None:
    """Raise if ``float(value)``, fixed by the trace, comes out differently at run time."""
    if float(value) != expected:
        raise _differs("float", where, expected, float(value))


@_recorded_when_traced(twins.check_len)
def check_len(value: Any, expected: int, where: str) -> None:
    """Raise if ``len(value)`` (a loop over a tensor's rows) changes from the traced one."""
    if len(value) != expected:
        raise _differs("len", where, expected, len(value))


# The conversion a trace specialised on -> the guard it records (``tracing.conversions``).
SPECIALIZATION_GUARDS: dict[Callable[[Any], Any], Callable[..., Any]] = {
    bool: check_bool,
    int: check_int,
    operator.index: check_index,
    float: check_float,
    len: check_len,
}


@_recorded_when_traced(twins.check_tensor_input)
def check_tensor_input(value: Any, dtype: torch.dtype, ndim: int, name: str) -> None:
    """Raise if an input's dtype or rank differs from the example the module was traced with."""
    if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.dim() != ndim:
        got = (
            f"a {value.dim()}-d {value.dtype} tensor"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise TypeError(tensor_input_message(name, f"{ndim}-d {dtype}", got))


@_recorded_when_traced(twins.check_length)
def check_length(value: Any, expected: int, where: str) -> None:
    """Raise if ``value`` does not have the ``expected`` number of elements.

    The traced code unpacks, or loops over, exactly as many elements as the
    trace saw; with another number it would silently do something else.
    """
    if len(value) != expected:
        raise ValueError(length_message(expected, where, len(value)))


@_recorded_when_traced(None)  # only *args roots have it, and those do not script
def check_variadic_length(args: tuple[Any, ...], expected: int, name: str) -> None:
    """Raise if ``*name`` gets another number of arguments than it was traced with."""
    if len(args) != expected:
        raise TypeError(
            f"this module was traced with {expected} extra positional argument(s) in *{name}, "
            f"but {len(args)} were passed; retrace with concrete_args={{{name!r}: (PH, ...)}} "
            "listing one entry per argument"
        )


@_recorded_when_traced(None)  # only **kwargs roots have it, and those do not script
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


# Fixed values a guard can print in the code and TorchScript can type: other fixed objects
# (config objects, tensors...) are held by a FixedArgument.
_PRINTABLE_FIXED_TYPES = frozenset({type(None), bool, int, float, str})


class FixedArgumentError(ValueError, AssertionError):
    """An argument fixed by ``concrete_args`` got another value: a ``ValueError``, and the
    ``AssertionError`` torch.fx's generated check raises, so handlers of either catch it."""


@_recorded_when_traced(twins.check_fixed)
def check_fixed(value: Any, expected: Any, name: str) -> None:
    """Raise if an argument fixed by ``concrete_args`` to a literal gets another value.

    Generated code shows the value: ``check_fixed(flag, True, 'flag')``.
    """
    if value is not expected and not _same(value, expected):
        raise FixedArgumentError(fixed_message(name, repr(expected), repr(value)))


def fixed_argument_guard(name: str, expected: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The guard for argument ``name`` fixed to ``expected``, and its arguments after the value.

    >>> fixed_argument_guard("flag", True)[1]
    (True, 'flag')
    """
    if type(expected) in _PRINTABLE_FIXED_TYPES:
        return check_fixed, (expected, name)
    return FixedArgument(name, expected), ()


class FixedArgument:
    """Checks that an argument fixed by ``concrete_args`` to an object still gets that object.

    A callable holding the expected value itself (any object but a literal,
    which ``check_fixed`` prints instead; compared with ``is`` then ``==``), so
    a fixed config object is checked too. Generated code calls it on the
    argument: ``config_fixed(config)``. It does not script: TorchScript compiles
    no callable objects from a forward's globals.
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
            raise FixedArgumentError(fixed_message(self.name, repr(self.expected), repr(value)))
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

# Every guard: the functions, and the classes whose instances are guards.
GUARDS: tuple[Any, ...] = (
    *SPECIALIZATION_GUARDS.values(),
    check_length,
    check_tensor_input,
    check_fixed,
    check_variadic_keys,
    check_variadic_length,
    FixedArgument,
    FlattenedInput,
)


_GUARD_SET = frozenset(GUARDS)


def is_guard(target: Any) -> bool:
    """Whether ``target`` (a call_function node's target) is one of fxloom's run-time checks."""
    try:
        return target in _GUARD_SET or type(target) in _GUARD_SET
    except TypeError:  # an unhashable callable
        return False
