"""Handlers: generator expressions, run to completion where they are made.

A generator expression inside the compiled function (``all(x is None for x in xs)``,
``tuple(t * 2 for t in ts)``) is consumed where it is made; the interpreter runs its frame
to the end and hands the consumer an iterator over what it yielded. Other generators are a
``generator`` break.
"""

from __future__ import annotations

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.interpreter import Frame, Interpreter, handles

MAX_ITEMS = 100_000


class _Yields(list):
    """The values a generator frame yielded so far (the frame's ``yields`` slot)."""


def run_generator(interp: Interpreter, frame: Frame) -> list:
    yields = _Yields()
    frame.locals[".yields"] = yields
    interp.run(frame)
    return yields


@handles("RETURN_GENERATOR")
def return_generator(interp, frame, instruction):
    frame.stack.append(None)  # what CPython's generator would be: popped by the next POP_TOP


@handles("YIELD_VALUE")
def yield_value(interp, frame, instruction):
    yields = frame.locals.get(".yields")
    if yields is None:
        raise Break("generator", f"yield in {frame.code.co_name}")
    yields.append(frame.stack.pop())
    if len(yields) > MAX_ITEMS:
        raise Break("generator", f"{frame.code.co_name} yields more than {MAX_ITEMS} items")
    frame.stack.append(None)  # the value ``send`` would give
