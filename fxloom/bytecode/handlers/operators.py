"""Handlers: Python's operators, subscripts and slices.

On plain values an operator runs natively; with a stand-in among its operands it is
recorded as a ``call_function`` of the ``operator`` module's function, as symbolic tracing
records it. An operand whose type alone is guarded (``Recording.unguarded``: an object from
outside, a numpy array made at a graph break) never reaches a native operator, whose result
would be decided once, at capture: a subscript or ``in`` written in Python
(``__getitem__``, ``__contains__``) is interpreted, anything else is an ``unguarded-value``
break. Changing an object from outside (``+=`` on a list, ``d[k] = v``, ``del d[k]``) goes to
``Recording.mutate_outside``.
"""

from __future__ import annotations

import operator
import types
from typing import Any

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.calls import call, holds_unguarded, one_by_one, record
from fxloom.bytecode.dynamic import concrete
from fxloom.bytecode.handlers.control import truth
from fxloom.bytecode.handlers.generators import is_lazy
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
# In-place operator -> the method by which a type changes its left operand in place.
_IN_PLACE = {
    fn: f"__{fn.__name__}__" for symbol, fn in BINARY_OPERATORS.items() if symbol.endswith("=")
}


def apply(interp, fn, *operands: Any) -> Any:
    """``fn(*operands)``: recorded if a stand-in is involved, else computed natively."""
    if interp.native:
        return fn(*operands)
    if any(isinstance(value, StandIn) for value in operands):
        return record(interp, "call_function", fn, operands, {})
    recording = interp.recording
    if (
        fn in _IN_PLACE
        and id(operands[0]) not in recording.created  # not the program's own: a side effect
        and hasattr(type(operands[0]), _IN_PLACE[fn])  # changes it (``list +=``), not rebinds
    ):
        return _change_outside(interp, operands[0], _IN_PLACE[fn], operands[1:])
    _refuse_unguarded(interp, fn.__name__, operands)
    try:
        result = fn(*operands)
    except DataDependentError as err:
        raise Break("tensor-data", str(err)) from None
    return _made(recording, result)


def _made(recording, result: Any) -> Any:
    """``result`` of an operator on plain values: a mutable container it made (``a + b``,
    ``a[1:]``) is the program's own; one it found (``a or b``) is what it was."""
    if type(result) in _MUTABLE and not recording.is_outside(result):
        recording.built(result)
    return result


_MUTABLE = frozenset((list, dict, set, bytearray))


_NOTHING = object()


def _refuse_unguarded(interp, what: str, operands: tuple, container: Any = _NOTHING) -> None:
    """Break if an operand is unguarded (two levels into tuples, lists and dicts; a
    ``container`` that is only indexed or hashed into: itself only)."""
    recording = interp.recording
    unguarded = recording.unguarded
    culprit = _NOTHING
    if container is not _NOTHING and id(container) in unguarded:
        culprit = container
    elif holds_unguarded(unguarded, operands):
        culprit = next(value for value in operands if holds_unguarded(unguarded, (value,)))
    if culprit is not _NOTHING:
        source = recording.source_of(culprit)
        named = (
            f"{source.text} (a {type(culprit).__qualname__})"
            if source
            else type(culprit).__qualname__
        )
        raise Break(
            "unguarded-value",
            f"operator {what} would read {named}, whose value the guards do not check",
        )


def _python_dunder(value: Any, name: str) -> Any:
    """``type(value).name`` when it is written in Python (else None)."""
    method = getattr(type(value), name, None)
    return method if type(method) is types.FunctionType else None


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
    item = concrete(item)  # hashed or compared by its value (a guard)
    if not interp.native and interp.recording.is_unguarded(container):
        if _python_dunder(container, "__contains__") is not None:  # the table's, or inlined
            found = truth(call(interp, container.__contains__, (item,), {}), interp)
            frame.stack.append(found != bool(instruction.arg))
            return
    if not interp.native:
        if type(container) in (dict, set, frozenset):  # hashes into it: its items stay apart
            _refuse_unguarded(interp, "in", (item,), container)
        else:
            _refuse_unguarded(interp, "in", (item, container))
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
    key = concrete(key)  # a symbolic number indexes a Python container by its value (a guard)
    if not interp.native and interp.recording.unguarded:
        if interp.recording.is_unguarded(container):
            if _python_dunder(container, "__getitem__") is not None:  # the table's, or inlined
                return call(interp, container.__getitem__, (key,), {})
        _refuse_unguarded(interp, "[]", (key,), container)
    value = container[key]
    if type(key) in (int, str):
        return interp.recording.read_item(container, key, value)
    if type(key) is slice:
        return _made(interp.recording, interp.recording.graph.adopt(value))
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
    key = concrete(key)  # a key is hashed by its value (a guard)
    if id(container) not in interp.recording.created:  # not the program's own: a side effect
        _change_outside(interp, container, "__setitem__", (key, value))
        return
    container[key] = value


def _change_outside(interp, container: Any, name: str, args: tuple) -> Any:
    """``container.name(*args)`` on an object that is not the program's own: a side effect,
    for ``Recording.mutate_outside`` (with the method bound to it). A method written in
    Python would run natively, unseen: a break."""
    method = getattr(type(container), name, None)
    if method is None or type(method) is types.FunctionType:
        raise Break(
            "outside-mutation",
            f"{type(container).__qualname__}.{name} changes a {type(container).__name__} that "
            "is not the program's own",
        )
    if any(is_lazy(arg) for arg in args):  # ``log += (... for ...)``: eager's order
        return one_by_one(interp, container, getattr(container, name), args, {})
    return interp.recording.mutate_outside(container, getattr(container, name), args, {})


@handles("DELETE_SUBSCR")
def delete_subscr(interp, frame, instruction):
    key = frame.stack.pop()
    container = frame.stack.pop()
    if isinstance(container, StandIn):
        raise Break("outside-mutation", f"an item of a {type(container).__name__} is deleted")
    if id(container) not in interp.recording.created:
        _change_outside(interp, container, "__delitem__", (key,))
        return
    del container[key]
