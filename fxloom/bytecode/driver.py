"""The driver: runs a function whose capture stops at graph breaks, piece by piece.

A captured piece ends just before an instruction the interpreter cannot capture (a branch
on a tensor, a ``print``, a call it cannot follow) and returns ``Next``: that instruction's
index, the locals and the stack. The driver runs that one instruction as Python, on the
real values, then looks up the piece that starts after it in the cache — keyed by where it
starts and the names of the locals it holds, most recently hit first, each with its guard —
or compiles one there on these values. A break inside a loop becomes a small cycle of
pieces, each compiled once; a piece that cannot be captured at all runs the rest of the
function as Python from where it stands.

Running "as Python" uses the same instruction handlers with ``Interpreter(native=True)``:
real values, every call made natively, nothing recorded.

Depends on ``fxloom.bytecode.interpreter``, ``entry`` and ``recording``.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from typing import Any

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.dynamic import compiling
from fxloom.bytecode.entry import CELLS, CacheEntry, Next, Start, compile_entry
from fxloom.bytecode.handlers.calling import runs_as_python
from fxloom.bytecode.interpreter import Frame, Interpreter
from fxloom.bytecode.recording import NOT_WRITTEN
from fxloom.bytecode.sources import local_name

__all__ = ["drive", "generator_dispatch", "run_as_python", "runs_piece_by_piece"]


class _Everything:
    def __contains__(self, item: Any) -> bool:
        return True

    def add(self, item: Any) -> None:
        pass


class _PlainGraph:
    metadata = contextlib.nullcontext()

    @staticmethod
    def adopt(value: Any) -> Any:
        return value


class _AsPython:
    """``Recording``'s interface for running as Python: every value is just itself."""

    created = _Everything()
    graph = _PlainGraph()
    writes: dict = {}

    def read(self, value: Any, source: Any) -> Any:
        return value

    def read_attribute(self, owner: Any, name: str, value: Any) -> Any:
        return value

    def read_item(self, container: Any, key: Any, value: Any) -> Any:
        return value

    def read_variadic(self, value: Any, source: Any) -> Any:
        return value

    def built(self, value: Any) -> Any:
        return value

    def is_outside(self, value: Any) -> bool:
        return False

    def source_of(self, value: Any) -> None:
        return None

    def written(self, owner: Any, name: str) -> Any:
        return NOT_WRITTEN


_AS_PYTHON = Interpreter(_AsPython(), native=True)


def _frame(compiled: Any, pending: Next) -> Frame:
    code = compiled.fn.__code__
    cells = dict(zip(code.co_freevars, compiled.fn.__closure__ or ()))
    cells.update(zip(code.co_cellvars, pending.cells))  # the call's own, from the first piece
    frame = Frame(compiled.fn, pending.locals, cells)
    frame.stack = pending.stack
    frame.ip = pending.index
    for instruction in reversed(frame.instructions[: frame.ip + 1]):  # the line it stands in
        if instruction.line is not None:
            frame.line = instruction.line
            break
    return frame


def run_as_python(compiled: Any, pending: Next) -> Any:
    """Run the rest of the function from ``pending`` as Python."""
    return _as_python(_frame(compiled, pending))


def _as_python(frame: Frame) -> Any:
    """Run ``frame`` on as Python to its return value, or, in a generator function, to its
    next ``yield``: then a ``Next`` there, for ``generator``."""
    if not frame.code.co_flags & inspect.CO_GENERATOR:
        return _AS_PYTHON.run(frame)
    _AS_PYTHON.frames.append(frame)
    try:
        while True:
            instruction = frame.instructions[frame.ip]
            if instruction.op == "YIELD_VALUE":
                cells = tuple(frame.cells[name] for name in frame.code.co_cellvars)
                return Next(frame.ip, frame.locals, frame.stack, cells)
            done = _AS_PYTHON.step(frame, instruction)
            if done is not None:
                return done.value
    finally:
        _AS_PYTHON.frames.pop()


def drive(compiled: Any, pending: Next, resumed: bool = False) -> Any:
    """Run the function on from ``pending`` (see the module docstring); returns its value, or,
    in a generator function, ``pending`` at its next ``yield`` (``generator`` yields it).
    ``resumed``: ``pending`` is the frame just after a yield, with the sent value on the
    stack, and its next piece starts right there."""
    data = list(pending.data)  # the numbers this call read from tensors (``_promote``)
    while True:
        frame = _frame(compiled, pending)
        if resumed:
            resumed = False
        elif frame.instructions[frame.ip].op == "YIELD_VALUE":
            return pending
        else:
            reads_data = pending.index in _data_reads(compiled)
            _AS_PYTHON.frames.append(frame)
            try:
                done = _step_as_python(frame)
            finally:
                _AS_PYTHON.frames.pop()
            if done is not None:
                return done.value
            if reads_data and frame.stack and type(frame.stack[-1]) in _DATA_NUMBERS:
                data.append(frame.stack[-1])
        names = tuple(frame.locals)
        depth = len(frame.stack)
        key = (frame.ip, names, depth)
        values = (*frame.locals.values(), *frame.stack)
        if pending.cells:  # the next piece reads and writes the same cells (``Start.cells``)
            values = (*values, pending.cells)
        result = _run_piece(compiled, key, values, frame, bool(pending.cells), data)
        if type(result) is not Next:
            return result
        data.extend(result.data)
        pending = result


def _step_as_python(frame: Frame) -> Any:
    """Run the break's instruction as Python; if that lands in an ``except`` block, run the
    block to its end too (handling an exception is Python's business, one break, not one per
    instruction)."""
    handling = 0
    while True:
        instruction = frame.instructions[frame.ip]
        done = _AS_PYTHON.step(frame, instruction)
        if done is not None:
            return done
        if instruction.op == "PUSH_EXC_INFO":
            handling += 1
        elif instruction.op == "POP_EXCEPT":
            handling -= 1
        if handling <= 0 and frame.instructions[frame.ip].op != "PUSH_EXC_INFO":
            if not _enters_as_python(frame):
                return None


def _enters_as_python(frame: Frame) -> bool:
    """Whether the next instruction enters a ``with`` whose manager runs as Python (made by
    the break's call: ``with tracked(...)``): that would be a break of its own, so it runs
    here too, one piece boundary for both."""
    instruction = frame.instructions[frame.ip]
    return (
        instruction.op == "BEFORE_WITH"
        and bool(frame.stack)
        and runs_as_python(type(frame.stack[-1]))
    )


# A number read from a tensor's data (``.item()``, ``float(t)``, ``int(t)``) is data: another
# value at every call. Guarded by value it would recompile on the second call, then be
# promoted; it is a symbol from the first compile instead.
_DATA_NUMBERS = (int, float)


def _data_reads(compiled: Any) -> set[int]:
    """The function's instructions where a piece stopped to read a tensor's data."""
    return {stop.top_index for stop in compiled.breaks if stop.kind == "tensor-data"}


def _promote(compiled: Any, key: tuple, parameters: tuple, values: tuple, data: list) -> None:
    """Make the piece at ``key`` take as symbols the numbers among its ``values`` that this
    call read from tensors (``data``: the objects themselves, handed on through the pieces as
    they are). Sound as any symbolic number: what the program decides on it (a branch,
    ``range``, native code) still specialises it by a guard (``fxloom.bytecode.dynamic``)."""
    sizes = getattr(compiled, "sizes", None)
    if sizes is None or sizes.mode is False:
        return
    for parameter, value in zip(parameters, values):
        if type(value) in _DATA_NUMBERS and any(value is number for number in data):
            place = (key, local_name(parameter))
            if place not in sizes.scalars:
                sizes.scalars.add(place)
                sizes.history.append(
                    f"{parameter}: {value!r} read from a tensor at a graph break (symbolic "
                    "from its first compile)"
                )


def _run_piece(
    compiled: Any, key: tuple, values: tuple, frame: Frame, cells: bool, data: list = ()
) -> Any:
    pieces: list[CacheEntry] | None = compiled.pieces.get(key)
    if pieces is None:
        pieces = compiled.pieces[key] = []
    for index, piece in enumerate(pieces):
        if piece.guard(*values):
            if index:
                pieces.insert(0, pieces.pop(index))
            piece.hits += 1
            return _run(piece, values, frame)
    if key in compiled.as_python:
        return _as_python(frame)
    if len(pieces) >= compiled.recompile_limit:
        _give_up(compiled, key, frame, f"recompiled {len(pieces)} times (recompile_limit)")
        return _as_python(frame)
    parameters = (*key[1], *(f"stack[{i}]" for i in range(key[2])), *((CELLS,) if cells else ()))
    sizes = getattr(compiled, "sizes", None)  # which tensor sizes are symbolic (``dynamic``)
    if data:
        _promote(compiled, key, parameters, values, data)
    if pieces and sizes is not None:
        call = (values, parameters, compiled.fn.__globals__, compiled.fn.__closure__)
        sizes.observe(key, pieces[0].guards.changed_sizes(*call, pieces[0].held))
    try:
        with compiling(sizes, key):
            piece, stop = compile_entry(
                compiled.fn,
                parameters,
                values,
                compiled.backend,
                compiled.root,
                Start(key[0], key[2], cells),
            )
    except Break as error:
        compiled.breaks.append(error)
        _give_up(compiled, key, frame, f"{error.row.title}: {error.detail}", error.where)
        return _as_python(frame)
    if stop is not None and stop.top_index != key[0]:
        # (a piece that stops where it starts only hands on to Python: no new break)
        compiled.breaks.append(stop)
    pieces.insert(0, piece)
    return _run(piece, values, frame)


def _run(piece: CacheEntry, values: tuple, frame: Frame) -> Any:
    try:
        return piece.run(*values)
    except Exception as error:
        _unwind(frame, error)
        raise


def _unwind(frame: Frame, error: Exception) -> None:
    """An op of a piece's graph raised ``error`` inside ``with`` blocks entered before the
    piece (their exits on the stack it started with, ``calling.pending_exit``): send it to
    their exits, as Python, through the exception table, as eager does. The piece's own code
    cannot have reached those exits (each is a piece boundary; grad mode's, recorded, only
    switches grad mode back, harmlessly done again). Where the exception would reach code
    that reads the function's variables (an ``except`` block; an exit that suppresses it,
    after which the function goes on), the values the piece left are not there to give:
    ``error`` is raised with a note saying so, never handled on stale values."""
    instruction = frame.instructions[frame.ip]
    if instruction.handler is None or not _with_cleanup(frame, instruction.handler.target):
        return
    _AS_PYTHON.frames.append(frame)
    try:
        _AS_PYTHON.route(frame, instruction, error)
        while True:  # the exits, each re-raising to the next handler, to the caller
            instruction = frame.instructions[frame.ip]
            if instruction.op == "PUSH_EXC_INFO" and not _with_cleanup(frame, frame.ip):
                break
            _AS_PYTHON.step(frame, instruction)
            if instruction.op == "WITH_EXCEPT_START" and frame.stack[-1]:
                break  # suppressed
    finally:
        _AS_PYTHON.frames.pop()
    error.add_note(
        "fxloom: an op of a compiled graph raised this inside a with or try block that "
        "handles it; the values the graph computed before it are gone, so fxloom cannot go "
        "on as eager does and raises it instead (run the block as Python, or move the op "
        "out of the compiled function)"
    )


def _with_cleanup(frame: Frame, index: int) -> bool:
    """Whether instruction ``index`` starts a ``with`` block's exception cleanup."""
    instructions = frame.instructions
    return (
        instructions[index].op == "PUSH_EXC_INFO"
        and index + 1 < len(instructions)
        and instructions[index + 1].op == "WITH_EXCEPT_START"
    )


def _give_up(compiled: Any, key: tuple, frame: Frame, reason: str, where: Any = None) -> None:
    """No piece runs from ``key``: this call finishes as interpreted Python, and from the next
    call on the whole function runs as plain Python (natively, at Python's speed, where
    interpreting the rest of every call would be many times slower than eager). Recorded
    with the line (the failure's own, else where the piece would have started), for
    ``explain()``."""
    if where is None:
        frame.line = frame.instructions[key[0]].line
        where = frame.location()
    location = where
    text = f"{location.short}: {reason}" + (f"\n    {location.code}" if location.code else "")
    compiled.as_python[key] = text
    compiled.give_up(
        f"no piece could be captured after the graph break at {location.short} ({reason}); "
        "the function runs as Python from the next call"
    )


# ------------------------------------------------------------------ generator functions
# Instructions of a generator function the driver cannot suspend at (``yield from`` and
# ``await`` hand the consumer's ``send``/``throw`` on to another generator): such a function
# runs as Python.
_DELEGATES = frozenset(("SEND", "GET_YIELD_FROM_ITER", "GET_AWAITABLE", "YIELD_FROM"))


def runs_piece_by_piece(fn: types.FunctionType) -> str | None:
    """None where ``fn``, a generator function, is compiled with each ``yield`` a piece
    boundary (``generator``); otherwise why it runs as Python."""
    code = fn.__code__
    if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        return f"{fn.__qualname__} is a coroutine function, which fxloom.compile runs as Python"
    from fxloom.bytecode.instructions import decode

    delegates = sorted({i.op for i in decode(code) if i.op in _DELEGATES})
    if delegates:
        return (
            f"{fn.__qualname__} is a generator function that delegates to another ('yield "
            f"from', {', '.join(delegates)}), which fxloom.compile runs as Python; compile the "
            "functions it calls, or yield the items one by one"
        )
    return None


def generator_dispatch(compiled: Any, dispatch: Any) -> Any:
    """The call of a compiled generator function: binds the arguments at once (a wrong call
    raises there, as Python's) and returns a generator whose code runs as compiled pieces,
    ``generator``."""
    signature = inspect.signature(dispatch)

    def call(*args: Any, **kwargs: Any) -> Any:
        signature.bind(*args, **kwargs)
        return generator(compiled, dispatch, args, kwargs)

    return call


def generator(compiled: Any, dispatch: Any, args: tuple, kwargs: dict) -> Any:
    """What eager's generator does, piece by piece: the first ``next`` runs the function's
    entry (the cache, as any call) up to its first ``yield``, which ends the piece (a ``yield``
    break); the value is yielded to the consumer, and the value it sends (None for ``next``)
    is pushed where the ``yield`` leaves it, the next piece starting just after it. An
    exception thrown in (``throw``, ``close``'s ``GeneratorExit``) goes where eager sends
    it, through the exception table at the ``yield``, and the function goes on as Python to
    its next ``yield`` or its end. Its return value ends the generator (``StopIteration``)."""
    result = dispatch(*args, **kwargs)
    if _eager_generator(compiled, result):  # the function runs as Python (``eager_reason``)
        return (yield from result)
    while type(result) is Next:
        frame = _frame(compiled, result)
        value = frame.stack.pop()
        try:
            sent = yield value
        except BaseException as error:  # noqa: BLE001 - thrown in: the program's to handle
            result = _thrown(frame, error)
            continue
        frame.stack.append(sent)
        frame.ip += 1  # past the yield
        cells = tuple(frame.cells[name] for name in frame.code.co_cellvars)
        result = drive(compiled, Next(frame.ip, frame.locals, frame.stack, cells), resumed=True)
    return result


def _thrown(frame: Frame, error: BaseException) -> Any:
    """``error`` thrown in at the ``yield`` ``frame`` stands at: to its handler (or out, to the
    consumer), then on as Python (``_as_python``)."""
    instruction = frame.instructions[frame.ip]
    frame.ip += 1
    _AS_PYTHON.frames.append(frame)
    try:
        _AS_PYTHON.route(frame, instruction, error)
    finally:
        _AS_PYTHON.frames.pop()
    return _as_python(frame)


def _eager_generator(compiled: Any, result: Any) -> bool:
    """Whether the entry's ``result`` is the generator that running the function as Python made
    (not yet started: the function's own return value is only ever seen after a ``yield``
    or at its end, through ``StopIteration``)."""
    return (
        type(result) is types.GeneratorType
        and result.gi_code is compiled.fn.__code__
        and inspect.getgeneratorstate(result) == inspect.GEN_CREATED
    )
