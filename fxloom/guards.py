"""Run-time checks that traced code carries for the values tracing specialised on.

Tracing with example inputs fixes what the code decided from them: the branch
an ``if`` took, an ``int()``/``float()``/index conversion, the length of an
unpacked or iterated value. The generated code calls one of these guards for
each, so a call that breaks an assumption raises a clear error instead of
silently computing something else::

    check_bool(gt, True, 'model.py:15')    # `if x.sum() > 0:` took the True branch

The checks of the inputs themselves (dtype and rank, ``concrete_args`` values, the
structure of ``*args``/``**kwargs``) are shared with export: ``fxloom.runtime_checks``.
What the rest of fxloom knows about each guard (a check: kept by dead-code elimination,
writing nothing; kept on the host by lowering; its TorchScript twin in
``fxloom._guards_torchscript``) is its row in ``fxloom.ops.runtime_functions``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from fxloom._guards_torchscript import length_message, specialized_message
from fxloom.runtime_checks import recorded_when_traced

__all__ = [
    "SPECIALIZATION_GUARDS",
    "check_bool",
    "check_float",
    "check_index",
    "check_int",
    "check_len",
    "check_length",
]


def _differs(conversion: str, where: str, expected: Any, actual: Any) -> RuntimeError:
    return RuntimeError(specialized_message(conversion, where, repr(expected), repr(actual)))


# One guard per conversion a trace specialises on with example inputs (``if x.sum() > 0:``
# records ``check_bool(gt, True, 'model.py:15')``): TorchScript cannot take the conversion
# itself as an argument, and the guard's name says what was fixed.
@recorded_when_traced
def check_bool(value: Any, expected: bool, where: str) -> None:
    """Raise if a condition the trace took a branch on comes out differently at run time."""
    if bool(value) != expected:
        raise _differs("bool", where, expected, bool(value))


@recorded_when_traced
def check_int(value: Any, expected: int, where: str) -> None:
    """Raise if ``int(value)``, fixed by the trace, comes out differently at run time."""
    if int(value) != expected:
        raise _differs("int", where, expected, int(value))


@recorded_when_traced
def check_index(value: Any, expected: int, where: str) -> None:
    """Raise if ``value`` used as an index (``operator.index``) changes from the traced one."""
    if operator.index(value) != expected:
        raise _differs("index", where, expected, operator.index(value))


@recorded_when_traced
def check_float(value: Any, expected: float, where: str) -> None:
    """Raise if ``float(value)``, fixed by the trace, comes out differently at run time."""
    if float(value) != expected:
        raise _differs("float", where, expected, float(value))


@recorded_when_traced
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


@recorded_when_traced
def check_length(value: Any, expected: int, where: str) -> None:
    """Raise if ``value`` does not have the ``expected`` number of elements.

    The traced code unpacks, or loops over, exactly as many elements as the
    trace saw; with another number it would silently do something else.
    """
    if len(value) != expected:
        raise ValueError(length_message(expected, where, len(value)))
