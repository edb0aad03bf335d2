"""TorchScript-typed twins of the run-time checks traced code calls, and what the checks say.

``torch.jit.script`` compiles every global function a forward calls, after
asking it for ``__prepare_scriptable__()``; each guard of ``fxloom.guards`` and
input check of ``fxloom.runtime_checks`` whose row in ``fxloom.ops.runtime_functions``
names a twin answers with it, so a traced module carrying checks scripts and its
scripted form raises the same errors. The twins are never called from Python.

Written in the subset of Python TorchScript compiles (``typing`` annotations,
``isinstance`` refinement of ``Union``, ``str.format``): hence ``List``/``Union``
and no ``from __future__ import annotations``. The ``*_message`` functions build
each guard's error text; the Python guards call them too, so a message is
written once. fxloom never imports ``torch.jit``: only the user's scripting does.

Depends on torch only.
"""

from typing import Any, List, Optional, Union  # noqa: UP035 - TorchScript reads these annotations

import torch
from torch import Tensor

# What each kind of value a guard checks can be inside a scripted forward. ``Any`` takes every
# type (a fixed argument may be an Optional[Tensor]); ``Optional[Any]``, not ``Any``, lets
# ``is None`` see a None.
Number = Union[Tensor, bool, int, float]  # noqa: UP007
Literal = Optional[Union[bool, int, float, str]]  # noqa: UP007, UP045
AnyOrNone = Optional[Any]  # noqa: UP045


# ---------------------------------------------- messages (called from Python and TorchScript)
def specialized_message(conversion: str, where: str, expected: str, actual: str) -> str:
    return (
        f"this module was traced with example inputs for which {conversion}(...) at {where} "
        f"was {expected}; now it is {actual}, so the traced code does not apply. Retrace with "
        "inputs like these, or make that code a leaf module / wrapped function"
    )


def length_message(expected: int, where: str, actual: int) -> str:
    return (
        f"the traced code unpacks or iterates over exactly {expected} elements at {where}, "
        f"but got {actual}; retrace with inputs of this kind"
    )


def tensor_input_message(name: str, traced: str, got: str) -> str:
    return (
        f"input '{name}': this module was traced with a {traced} tensor, got {got}; "
        "retrace with an example of this kind"
    )


def fixed_message(name: str, expected: str, actual: str) -> str:
    return (
        f"argument '{name}' was fixed to {expected} when this module was traced "
        f"(concrete_args), but {actual} was passed; retrace to use another value"
    )


# ---------------------------------------------- conversions, as Python does them
def _as_bool(value: Number) -> bool:
    if isinstance(value, Tensor):
        return bool(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    return value != 0.0


def _as_float(value: Number) -> float:
    if isinstance(value, Tensor):
        return float(value)
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    return float(value)


def _as_int(value: Number) -> int:
    if isinstance(value, Tensor):
        return int(value)
    if isinstance(value, bool):
        return 1 if value else 0
    return int(value)


def _length(value: Any) -> int | None:
    """The number of elements of what was unpacked or iterated; None for a tuple, whose
    length is part of its TorchScript type (``values, indices = x.max(0)``), so compiling
    the forward checked it."""
    if isinstance(value, Tensor):
        return value.size(0)
    if isinstance(value, List[int]):  # noqa: UP006 - TorchScript refines on typing.List
        return len(value)
    if isinstance(value, List[Tensor]):  # noqa: UP006
        return len(value)
    if isinstance(value, List[float]):  # noqa: UP006
        return len(value)
    return None


# ---------------------------------------------- the twins
def check_bool(value: Number, expected: bool, where: str) -> None:
    actual = _as_bool(value)
    if actual != expected:
        raise RuntimeError(specialized_message("bool", where, str(expected), str(actual)))


def check_int(value: Number, expected: int, where: str) -> None:
    actual = _as_int(value)
    if actual != expected:
        raise RuntimeError(specialized_message("int", where, str(expected), str(actual)))


def check_index(value: Number, expected: int, where: str) -> None:
    actual = _as_int(value)
    if actual != expected:
        raise RuntimeError(specialized_message("index", where, str(expected), str(actual)))


def check_float(value: Number, expected: float, where: str) -> None:
    actual = _as_float(value)
    if actual != expected:
        raise RuntimeError(specialized_message("float", where, str(expected), str(actual)))


def check_len(value: Any, expected: int, where: str) -> None:
    actual = _length(value)
    if actual is not None and actual != expected:
        raise RuntimeError(specialized_message("len", where, str(expected), str(actual)))


def check_length(value: Any, expected: int, where: str) -> None:
    actual = _length(value)
    if actual is not None and actual != expected:
        raise ValueError(length_message(expected, where, actual))


def check_tensor_input(value: Tensor, dtype: torch.dtype, ndim: int, name: str) -> None:
    if value.dtype != dtype or value.dim() != ndim:
        # TorchScript prints a dtype as its ScalarType number; the Python guard names it.
        traced = f"{ndim}-d (dtype number {dtype})"
        got = f"a {value.dim()}-d tensor of dtype number {value.dtype}"
        raise TypeError(tensor_input_message(name, traced, got))


def _same_literal(value: AnyOrNone, expected: Literal) -> bool:
    """``value == expected`` as Python compares them (``1 == 1.0 == True``; a tensor is no literal)."""
    if expected is None:
        return value is None
    if isinstance(expected, str):
        if isinstance(value, str):
            return value == expected
        return False
    # One refinement per test: TorchScript does not refine ``Any`` through ``or``.
    if isinstance(value, bool):
        return _as_float(value) == _as_float(expected)
    if isinstance(value, int):
        return _as_float(value) == _as_float(expected)
    if isinstance(value, float):
        return _as_float(value) == _as_float(expected)
    return False


def _literal_text(value: AnyOrNone) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        return f"'{value}'"  # as Python's repr prints it
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(value)
    if isinstance(value, Tensor):
        return "a tensor"
    return "another value"


def check_fixed(value: AnyOrNone, expected: Literal, name: str) -> None:
    if not _same_literal(value, expected):
        raise ValueError(fixed_message(name, _literal_text(expected), _literal_text(value)))
