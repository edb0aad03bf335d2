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

import sys
import types
from dataclasses import dataclass
from typing import Any

from fxloom._notes import add_note
from fxloom.bytecode.breaks import Break
from fxloom.bytecode.instructions import decode
from fxloom.source_location import SourceLocation

__all__ = ["Frame", "Interpreter", "NULL", "Returned", "Stopped", "HANDLERS", "handles"]

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


def _decides_on_data(error: BaseException) -> bool:
    """Whether ``error`` is the ShapeEnv refusing to decide on a number read from tensor data
    (a branch, ``int()``, native code on the symbol of a ``.item()`` kept in the graph). Its
    module is only loaded once a symbol exists."""
    errors = sys.modules.get("fxloom.values.symbolic.errors")
    return errors is not None and isinstance(error, errors.DataDependentGuardError)


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


class Stopped:
    """``run`` reached its ``stop_at`` instruction: the frame holds the state just before it."""

    __slots__ = ("frame",)

    def __init__(self, frame: Frame) -> None:
        self.frame = frame


class Interpreter:
    """Interprets frames for one compilation (``recording`` collects the graph and guards).

    ``native=True`` makes an interpreter that runs instructions on real values and calls
    every callee natively: how the driver executes a graph break's own instruction, and the
    rest of a function whose next piece cannot be captured (``fxloom.bytecode.driver``).
    """

    def __init__(self, recording: Any, native: bool = False) -> None:
        self.recording = recording
        self.native = native
        self.frames: list[Frame] = []
        # id(cell) -> where a piece after a graph break reads the frame's own cell (one of
        # ``Next.cells``, handed on by the piece before; ``fxloom.bytecode.entry``)
        self.cell_sources: dict[int, Any] = {}
        # ids of the exits of ``with`` blocks entered before a graph break, handed on by the
        # piece before (``fxloom.bytecode.entry``): called, they run as Python (a break)
        self.pending_exits: set[int] = set()
        # how a value the piece before handed on (a local, a stack value, a cell's contents)
        # is read: ``Recording.read``, but a function the call made by what it is made of
        self.read_handed_on = recording.read

    def run(self, frame: Frame, stop_at: int | None = None) -> Any:
        """Interpret ``frame`` to its return value, or (top frame only) to instruction
        ``stop_at``, returning ``Stopped``. A ``Break`` leaving the top frame carries the index
        of the top frame's instruction it happened in (``top_index``)."""
        if len(self.frames) >= MAX_DEPTH:
            raise Break("inline-depth", f"{frame.code.co_name} is call number {MAX_DEPTH} deep")
        self.frames.append(frame)
        is_top = len(self.frames) == 1
        instructions = frame.instructions
        try:
            while True:
                if frame.ip == stop_at and is_top:
                    return Stopped(frame)
                result = self.step(frame, instructions[frame.ip])
                if result is not None:
                    return result.value
        except Break as stop:
            if stop.where is None:
                stop.where = frame.location()
            if is_top:
                stop.top_index = frame.ip - 1
            raise
        finally:
            self.frames.pop()

    def step(self, frame: Frame, instruction: Any) -> Returned | None:
        """Execute one instruction of ``frame`` (whose ``ip`` points at it)."""
        frame.ip += 1
        if instruction.line is not None:
            frame.line = instruction.line
        handler = HANDLERS.get(instruction.op)
        if handler is None:
            raise Break("unsupported-instruction", f"{instruction.op} in {frame.code.co_name}")
        try:
            return handler(self, frame, instruction)
        except Break:
            raise
        except BaseException as err:
            if self.native:  # as Python: ``finally`` blocks see GeneratorExit too (``close``)
                return self.route(frame, instruction, err)
            if not isinstance(err, Exception):
                raise
            if _decides_on_data(err):  # a number read from data (``.item()``) asked for
                # (the ShapeEnv's own "at file:line" is capture's frame: the break names the user's)
                detail = str(err).split("\nFix:")[0].rsplit(", at ", 1)[0]
                raise Break("tensor-data", detail) from None
            # The program itself raised (a failed lookup, a bad argument...): capture cannot
            # follow it; the function runs as Python, where it raises for the user.
            raise Break("exception", f"{type(err).__name__}: {err}") from err

    def route(self, frame: Frame, instruction: Any, error: Exception) -> None:
        """Send ``error`` to the handler the exception table names for ``instruction`` (the
        program's ``except``, ``finally`` or ``with`` exit), or raise it on."""
        handler = instruction.handler
        if handler is None:
            location = frame.location()
            add_note(
                error,
                f"raised at {location.short}: {location.code} (fxloom.compile ran this line as Python)",
            )
            raise error
        del frame.stack[handler.depth :]
        if handler.lasti:
            frame.stack.append(instruction.offset)
        frame.stack.append(error)
        frame.ip = handler.target
        return None

    def where(self) -> tuple[tuple[types.CodeType, int | None], ...]:
        """The interpreted frames, outermost first, as (code, line): nodes' stack traces."""
        return tuple((frame.code, frame.line) for frame in self.frames)
