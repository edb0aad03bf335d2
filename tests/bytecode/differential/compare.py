"""How the differential harness compares what eager and compiled runs did.

``compare(got, want)`` raises ``Mismatch`` naming the path where two values differ: tensors
with ``torch.testing.assert_close`` (NaNs equal) after dtype, shape, ``requires_grad`` and
layout-free checks; other values by exact type and then by structure (sequences, dicts,
sets, objects' attributes) or by ``==``. ``snapshot(value)`` copies outside state so it can
be compared after later calls changed it: iterators (which a deep copy cannot always take,
and reading would advance) by what ``__reduce__`` says of their position.
"""

from __future__ import annotations

import copy
import enum
import types
from typing import Any

import torch


class Mismatch(AssertionError):
    """Two values differ at ``path``."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


def compare(got: Any, want: Any, path: str = "result") -> None:
    """Raise ``Mismatch`` where ``got`` (compiled) differs from ``want`` (eager)."""
    if not _same_type(got, want):
        raise Mismatch(path, f"type {type(got).__name__}, eager {type(want).__name__}")
    if isinstance(want, enum.Enum):
        if got.name != want.name:
            raise Mismatch(path, f"{got!r}, eager {want!r}")
    elif isinstance(want, torch.Tensor):
        _compare_tensors(got, want, path)
    elif isinstance(want, (list, tuple)):
        if len(got) != len(want):
            raise Mismatch(path, f"length {len(got)}, eager {len(want)}")
        for index, (a, b) in enumerate(zip(got, want)):
            compare(a, b, f"{path}[{index}]")
    elif isinstance(want, dict):
        if list(got) != list(want):
            raise Mismatch(path, f"keys {list(got)}, eager {list(want)}")
        for key in want:
            compare(got[key], want[key], f"{path}[{key!r}]")
    elif _has_state(want):
        compare(vars(got), vars(want), f"{path}.__dict__")
    elif got != want and not (got != got and want != want):  # NaN is NaN
        raise Mismatch(path, f"{got!r}, eager {want!r}")


# The module a case's program is exec'd into (``harness.fresh_module``): each side has its
# own, so its classes are two classes of one name.
PROGRAM_MODULE = "differential_program"


def _same_type(got: Any, want: Any) -> bool:
    mine, theirs = type(got), type(want)
    if mine is theirs:
        return True
    return (mine.__module__, mine.__qualname__) == (PROGRAM_MODULE, theirs.__qualname__) and (
        theirs.__module__ == PROGRAM_MODULE
    )


def _has_state(value: Any) -> bool:
    return hasattr(value, "__dict__") and not isinstance(
        value, (type, types.FunctionType, types.ModuleType, enum.Enum)
    )


def _compare_tensors(got: torch.Tensor, want: torch.Tensor, path: str) -> None:
    for what in ("dtype", "shape", "requires_grad", "device"):
        if getattr(got, what) != getattr(want, what):
            raise Mismatch(path, f"{what} {getattr(got, what)}, eager {getattr(want, what)}")
    try:
        torch.testing.assert_close(got.detach(), want.detach(), equal_nan=True)
    except AssertionError as error:
        raise Mismatch(path, f"values differ: {error}") from None


def same_error(got: BaseException | None, want: BaseException | None) -> str | None:
    """What differs between two raised exceptions (type and message), or None."""
    if got is None and want is None:
        return None
    described = [None if e is None else f"{type(e).__name__}: {e}" for e in (got, want)]
    if described[0] != described[1]:
        return f"raised {described[0]}, eager raised {described[1]}"
    return None


# ------------------------------------------------------------------ state
def snapshot(value: Any) -> Any:
    """A copy of ``value`` that later changes to it do not reach, comparable with ``compare``."""
    if _is_iterator(value):
        return ("iterator", type(value).__name__, repr(value.__reduce__()[1:]))
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(snapshot(item) for item in value)
    if type(value) is dict:
        return {key: snapshot(item) for key, item in value.items()}
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if _has_state(value):
        return _Attributes(type(value).__name__, {k: snapshot(v) for k, v in vars(value).items()})
    return copy.deepcopy(value)


class _Attributes:
    """An object's attributes at one moment (compared as its ``__dict__``)."""

    def __init__(self, type_name: str, attributes: dict) -> None:
        self.type_name = type_name
        self.__dict__.update(attributes)


def _is_iterator(value: Any) -> bool:
    return (
        hasattr(value, "__next__")
        and not isinstance(value, (types.GeneratorType, torch.Tensor))
        and hasattr(value, "__reduce__")
    )


def module_state(namespace: dict) -> dict:
    """The outside state a program's module holds: its variables and its classes' attributes
    (functions, modules and the module's own dunder names left out)."""
    state = {}
    for name, value in namespace.items():
        if name.startswith("__") or isinstance(
            value, (types.FunctionType, types.ModuleType, types.BuiltinFunctionType)
        ):
            continue
        if isinstance(value, type):
            if issubclass(value, enum.Enum):
                continue
            attributes = {
                key: item
                for key, item in vars(value).items()
                if not key.startswith("__") and not callable(item)
            }
            state[name] = snapshot(attributes)
        else:
            state[name] = snapshot(value)
    return state
