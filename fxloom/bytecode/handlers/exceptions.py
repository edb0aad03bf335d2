"""Handlers: raising and handling exceptions — run as Python only.

While capturing, an exception (raised by the program, or handled by a ``try``) ends the
piece: a graph cannot hold Python's exception handling. When the driver runs instructions
as Python (``Interpreter(native=True)``), these handlers do what CPython does, with the
exception table the decoder attached to each instruction (``Interpreter.route``): the
program's own ``try``/``except``/``finally`` and ``with`` blocks catch what a graph break's
instruction raises.
"""

from __future__ import annotations

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.interpreter import handles


def _only_as_python(interp, frame, instruction) -> None:
    if not interp.native:
        raise Break("exception", f"{instruction.op} in {frame.code.co_name}")


@handles("PUSH_EXC_INFO")
def push_exc_info(interp, frame, instruction):
    _only_as_python(interp, frame, instruction)
    raised = frame.stack.pop()
    frame.stack.append(current_exception(frame))
    frame.stack.append(raised)


@handles("POP_EXCEPT")
def pop_except(interp, frame, instruction):
    _only_as_python(interp, frame, instruction)
    frame.stack.pop()  # the exception handled before this one, which is current again


@handles("CHECK_EXC_MATCH")
def check_exc_match(interp, frame, instruction):
    _only_as_python(interp, frame, instruction)
    kinds = frame.stack.pop()
    frame.stack.append(isinstance(frame.stack[-1], kinds))


@handles("RERAISE")
def reraise(interp, frame, instruction):
    _only_as_python(interp, frame, instruction)
    raised = frame.stack.pop()
    if instruction.arg:
        frame.stack.pop()  # the offset the exception was raised at (f_lasti)
    raise raised


@handles("RAISE_VARARGS")
def raise_varargs(interp, frame, instruction):
    _only_as_python(interp, frame, instruction)
    if instruction.arg == 0:
        current = current_exception(frame)
        if current is None:
            raise RuntimeError("No active exception to reraise")
        raise current
    cause = frame.stack.pop() if instruction.arg == 2 else None
    raised = frame.stack.pop()
    if instruction.arg == 2:
        raise raised from cause
    raise raised


@handles("WITH_EXCEPT_START")
def with_except_start(interp, frame, instruction):
    _only_as_python(interp, frame, instruction)
    raised = frame.stack[-1]
    exit_ = frame.stack[-4]
    frame.stack.append(exit_(type(raised), raised, raised.__traceback__))


def current_exception(frame) -> BaseException | None:
    """The exception being handled: the nearest one on the stack (``PUSH_EXC_INFO`` keeps it
    there until ``POP_EXCEPT``)."""
    for value in reversed(frame.stack):
        if isinstance(value, BaseException):
            return value
    return None


@handles("LOAD_ASSERTION_ERROR")
def load_assertion_error(interp, frame, instruction):
    frame.stack.append(AssertionError)  # ``assert`` raising: RAISE_VARARGS follows
