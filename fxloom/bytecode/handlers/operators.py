"""Handlers: Python's operators, subscripts and slices.

On plain values an operator runs natively; with a stand-in among its operands it is
recorded as a ``call_function`` of the ``operator`` module's function, as symbolic tracing
records it.
"""

from __future__ import annotations

import operator
from types import FunctionType
from typing import Any

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.calls import record
from fxloom.bytecode.interpreter import handles
from fxloom.values.stand_in import DataDependentError, StandIn

# BINARY_OP's operator (as the decoder spells it) -> the function that computes it.
BINARY_OPERATORS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift,
    ">>=": operator.irshift,
}  # fmt: skip
COMPARISONS = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">": operator.gt, ">=": operator.ge,
}  # fmt: skip
UNARY_OPERATORS = {"UNARY_NEGATIVE": operator.neg, "UNARY_INVERT": operator.invert,
                   "UNARY_POSITIVE": operator.pos}  # fmt: skip
_IN_PLACE = frozenset(fn for symbol, fn in BINARY_OPERATORS.items() if symbol.endswith("="))


def apply(interp, fn, *operands: Any) -> Any:
    """``fn(*operands)``: recorded if a stand-in is involved, else computed natively."""
    if any(isinstance(value, StandIn) for value in operands):
        return record(interp, "call_function", fn, operands, {})
    if (
        fn in _IN_PLACE
        and interp.recording.is_outside(operands[0])
        and not isinstance(operands[0], int | float | complex | str | bytes | tuple | frozenset)
    ):
        return _change_outside(interp, operands[0], f"__{fn.__name__}__", operands[1:])
    try:
        return fn(*operands)
    except DataDependentError as err:
        raise Break("tensor-data", str(err)) from None


@handles("BINARY_OP")
def binary_op(interp, frame, instruction):
    right = frame.stack.pop()
    left = frame.stack.pop()
    frame.stack.append(apply(interp, BINARY_OPERATORS[instruction.arg], left, right))


@handles("COMPARE_OP")
def compare_op(interp, frame, instruction):
    right = frame.stack.pop()
    left = frame.stack.pop()
    frame.stack.append(apply(interp, COMPARISONS[instruction.arg], left, right))


@handles("UNARY_NEGATIVE", "UNARY_INVERT", "UNARY_POSITIVE")
def unary(interp, frame, instruction):
    frame.stack.append(apply(interp, UNARY_OPERATORS[instruction.op], frame.stack.pop()))


@handles("IS_OP")
def is_op(interp, frame, instruction):
    right = frame.stack.pop()
    left = frame.stack.pop()
    frame.stack.append((left is right) != bool(instruction.arg))


@handles("CONTAINS_OP")
def contains_op(interp, frame, instruction):
    container = frame.stack.pop()
    item = frame.stack.pop()
    if isinstance(container, StandIn) or isinstance(item, StandIn):
        raise Break("tensor-data", "`in` with a tensor compares tensors' values")
    frame.stack.append((item in container) != bool(instruction.arg))


@handles("BINARY_SUBSCR")
def binary_subscr(interp, frame, instruction):
    key = frame.stack.pop()
    container = frame.stack.pop()
    frame.stack.append(subscript(interp, container, key))


def subscript(interp, container: Any, key: Any) -> Any:
    if isinstance(container, StandIn):
        return record(interp, "call_function", operator.getitem, (container, key), {})
    if isinstance(key, StandIn):
        raise Break("tensor-data", f"indexing a {type(container).__name__} with a tensor")
    value = container[key]
    if type(key) in (int, str):
        return interp.recording.read_item(container, key, value)
    return interp.recording.graph.adopt(value)


@handles("BINARY_SLICE")
def binary_slice(interp, frame, instruction):
    stop = frame.stack.pop()
    start = frame.stack.pop()
    container = frame.stack.pop()
    frame.stack.append(subscript(interp, container, slice(start, stop)))


@handles("BUILD_SLICE")
def build_slice(interp, frame, instruction):
    parts = [frame.stack.pop() for _ in range(instruction.arg)][::-1]
    frame.stack.append(slice(*parts))


@handles("STORE_SUBSCR")
def store_subscr(interp, frame, instruction):
    key = frame.stack.pop()
    container = frame.stack.pop()
    value = frame.stack.pop()
    store_item(interp, container, key, value)


@handles("STORE_SLICE")
def store_slice(interp, frame, instruction):
    stop = frame.stack.pop()
    start = frame.stack.pop()
    container = frame.stack.pop()
    value = frame.stack.pop()
    store_item(interp, container, slice(start, stop), value)


def store_item(interp, container: Any, key: Any, value: Any) -> None:
    if isinstance(container, StandIn):
        record(interp, "call_function", operator.setitem, (container, key, value), {})
        return
    if interp.recording.is_outside(container):
        _change_outside(interp, container, "__setitem__", (key, value))
        return
    container[key] = value


def _change_outside(interp, container: Any, name: str, args: tuple) -> Any:
    """``container.name(*args)`` on a container from outside: a change the recording keeps
    aside and replays after the graph (``Recording.mutate_outside``). A container whose class
    defines the method in Python is a break: running it natively would skip capturing it."""
    method = getattr(type(container), name, None)
    if method is None or type(method) is FunctionType:
        raise Break(
            "outside-mutation",
            f"{type(container).__qualname__}.{name} changes a container from outside",
        )
    return interp.recording.mutate_outside(container, getattr(container, name), args, {})


@handles("DELETE_SUBSCR")
def delete_subscr(interp, frame, instruction):
    key = frame.stack.pop()
    container = frame.stack.pop()
    if isinstance(container, StandIn):
        raise Break("outside-mutation", f"an item of a {type(container).__name__} is deleted")
    if interp.recording.is_outside(container):
        _change_outside(interp, container, "__delitem__", (key,))
        return
    del container[key]
