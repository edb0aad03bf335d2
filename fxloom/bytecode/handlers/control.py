"""Handlers: jumps, truth tests and for loops.

A branch on a plain value is taken natively (its value was guarded when it was read); a
branch on a tensor needs its data, which capture does not have: a ``tensor-branch`` break.
"""

from __future__ import annotations

from typing import Any

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.calls import record
from fxloom.bytecode.interpreter import handles
from fxloom.values.stand_in import DataDependentError, StandIn


def truth(value: Any) -> bool:
    if isinstance(value, StandIn):
        raise Break("tensor-branch", f"the truth of a tensor of shape {tuple(value.shape)}")
    try:
        return bool(value)
    except DataDependentError as err:
        raise Break("tensor-data", str(err)) from None


@handles("JUMP")
def jump(interp, frame, instruction):
    frame.ip = instruction.target


@handles("POP_JUMP_IF_TRUE")
def pop_jump_if_true(interp, frame, instruction):
    if truth(frame.stack.pop()):
        frame.ip = instruction.target


@handles("POP_JUMP_IF_FALSE")
def pop_jump_if_false(interp, frame, instruction):
    if not truth(frame.stack.pop()):
        frame.ip = instruction.target


@handles("POP_JUMP_IF_NONE")
def pop_jump_if_none(interp, frame, instruction):
    if frame.stack.pop() is None:
        frame.ip = instruction.target


@handles("POP_JUMP_IF_NOT_NONE")
def pop_jump_if_not_none(interp, frame, instruction):
    if frame.stack.pop() is not None:
        frame.ip = instruction.target


@handles("JUMP_IF_TRUE_OR_POP")
def jump_if_true_or_pop(interp, frame, instruction):
    if truth(frame.stack[-1]):
        frame.ip = instruction.target
    else:
        frame.stack.pop()


@handles("JUMP_IF_FALSE_OR_POP")
def jump_if_false_or_pop(interp, frame, instruction):
    if not truth(frame.stack[-1]):
        frame.ip = instruction.target
    else:
        frame.stack.pop()


@handles("TO_BOOL")
def to_bool(interp, frame, instruction):
    frame.stack.append(truth(frame.stack.pop()))


@handles("UNARY_NOT")
def unary_not(interp, frame, instruction):
    frame.stack.append(not truth(frame.stack.pop()))


@handles("GET_ITER")
def get_iter(interp, frame, instruction):
    value = frame.stack.pop()
    if isinstance(value, StandIn):
        value = record(interp, "call_method", "unbind", (value, 0), {})
    frame.stack.append(iter(value))


@handles("FOR_ITER")
def for_iter(interp, frame, instruction):
    iterator = frame.stack[-1]
    try:
        item = next(iterator)
    except StopIteration:
        frame.stack.pop()
        frame.ip = instruction.target
        return
    except DataDependentError as err:
        raise Break("tensor-data", str(err)) from None
    frame.stack.append(interp.recording.graph.adopt(item))


@handles("END_FOR")
def end_for(interp, frame, instruction):
    return None  # FOR_ITER's exit already popped the iterator and jumped past this
