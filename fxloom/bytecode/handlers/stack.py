"""Handlers: the value stack and local variables."""

from __future__ import annotations

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.interpreter import NULL, Returned, handles


@handles("NOP", "RESUME", "EXTENDED_ARG", "CACHE")
def nothing(interp, frame, instruction):
    return None


@handles("POP_TOP")
def pop_top(interp, frame, instruction):
    frame.stack.pop()


@handles("PUSH_NULL")
def push_null(interp, frame, instruction):
    frame.stack.append(NULL)


@handles("COPY")
def copy(interp, frame, instruction):
    frame.stack.append(frame.stack[-instruction.arg])


@handles("SWAP")
def swap(interp, frame, instruction):
    stack = frame.stack
    stack[-1], stack[-instruction.arg] = stack[-instruction.arg], stack[-1]


@handles("LOAD_CONST")
def load_const(interp, frame, instruction):
    frame.stack.append(instruction.arg)


@handles("LOAD_FAST", "LOAD_FAST_CHECK")
def load_fast(interp, frame, instruction):
    try:
        frame.stack.append(frame.locals[instruction.arg])
    except KeyError:
        raise Break(
            "exception", f"local variable {instruction.arg!r} is read before it is set"
        ) from None


@handles("LOAD_FAST_AND_CLEAR")
def load_fast_and_clear(interp, frame, instruction):
    # Comprehensions inlined by Python 3.12 save the outer variable of the same name.
    frame.stack.append(frame.locals.pop(instruction.arg, NULL))


@handles("STORE_FAST")
def store_fast(interp, frame, instruction):
    value = frame.stack.pop()
    if value is NULL:  # the saved "unset" of LOAD_FAST_AND_CLEAR coming back
        frame.locals.pop(instruction.arg, None)
    else:
        frame.locals[instruction.arg] = value


@handles("DELETE_FAST")
def delete_fast(interp, frame, instruction):
    del frame.locals[instruction.arg]


@handles("RETURN_VALUE")
def return_value(interp, frame, instruction):
    return Returned(frame.stack.pop())


@handles("RETURN_CONST")
def return_const(interp, frame, instruction):
    return Returned(instruction.arg)
