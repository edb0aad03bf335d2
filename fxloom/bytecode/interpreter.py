"""The symbolic interpreter: runs a function's bytecode on real values, recording tensor work.

Values on the stack and in locals are the program's own Python values, operated on natively
(an ``int`` addition is one ``operator.add``, never an emulation of CPython's protocol);
tensors are ``StandIn``s, and every operation on one is recorded into the graph. What the
program reads from outside goes through ``Recording.read``, which adds the guards. The loop
is the whole semantics::

    instruction = instructions[frame.ip]; frame.ip += 1
    result = HANDLERS[instruction.op](interpreter, frame, instruction)

A handler returns None to go on, or ``Returned(value)`` when the frame returns. Handlers live
in ``fxloom/bytecode/handlers/``, one family per file; what a call does (inline it, record
it, run it natively, or break) is ``fxloom.bytecode.calls``. Anything the interpreter cannot
follow raises ``Break`` with a ``BREAKS`` kind; ``run`` fills in the user's line.

Depends on ``fxloom.bytecode.instructions`` (the decoded form), ``recording`` and ``breaks``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.instructions import decode
from fxloom.bytecode.recording import Recording
from fxloom.source_location import SourceLocation

__all__ = ["Frame", "Interpreter", "NULL", "Returned", "HANDLERS", "handles"]

MAX_DEPTH = 64  # inlined calls deeper than this break (recursion is rarely meant to unroll)


class _Null:
    """The empty slot CPython pushes below (or above) a callable that takes no ``self``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()


@dataclass(slots=True)
class Returned:
    value: Any


HANDLERS: dict[str, Any] = {}


def handles(*ops: str):
    """Register the decorated function as the handler of the normalised ops ``ops``."""

    def register(handler):
        for op in ops:
            if op in HANDLERS:
                raise ValueError(
                    f"two handlers for {op}: {HANDLERS[op].__name__}, {handler.__name__}"
                )
            HANDLERS[op] = handler
        return handler

    return register


class Frame:
    """One function activation being interpreted."""

    __slots__ = ("function", "code", "instructions", "locals", "cells", "stack", "ip", "globals",
                 "builtins", "line")  # fmt: skip

    def __init__(
        self, function: types.FunctionType, local_values: dict[str, Any], cells: dict[str, Any]
    ) -> None:
        self.function = function
        self.code = function.__code__
        self.instructions = decode(self.code)
        self.locals = local_values
        self.cells = (
            cells  # name -> the cell (a real ``types.CellType``) of a cell or free variable
        )
        self.stack: list[Any] = []
        self.ip = 0
        self.globals = function.__globals__
        builtins = self.globals.get("__builtins__", __builtins__)
        self.builtins = builtins if isinstance(builtins, dict) else vars(builtins)
        self.line: int | None = self.code.co_firstlineno

    def location(self) -> SourceLocation:
        import linecache

        line = self.line or self.code.co_firstlineno
        text = linecache.getline(self.code.co_filename, line).strip()
        return SourceLocation(self.code.co_filename, line, self.code.co_name, text)


class Interpreter:
    """Interprets frames for one compilation (``recording`` collects the graph and guards)."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.frames: list[Frame] = []

    def run(self, frame: Frame) -> Any:
        """Interpret ``frame`` to its return value."""
        if len(self.frames) >= MAX_DEPTH:
            raise Break("inline-depth", f"{frame.code.co_name} is call number {MAX_DEPTH} deep")
        self.frames.append(frame)
        instructions = frame.instructions
        try:
            while True:
                instruction = instructions[frame.ip]
                frame.ip += 1
                if instruction.line is not None:
                    frame.line = instruction.line
                handler = HANDLERS.get(instruction.op)
                if handler is None:
                    raise Break(
                        "unsupported-instruction", f"{instruction.op} in {frame.code.co_name}"
                    )
                result = handler(self, frame, instruction)
                if result is not None:
                    return result.value
        except Break as stop:
            if stop.where is None:
                stop.where = frame.location()
            raise
        finally:
            self.frames.pop()

    def where(self) -> tuple[tuple[types.CodeType, int | None], ...]:
        """The interpreted frames, outermost first, as (code, line): nodes' stack traces."""
        return tuple((frame.code, frame.line) for frame in self.frames)
