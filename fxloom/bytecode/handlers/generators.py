"""Handlers: generator expressions, run lazily as Python runs them.

A generator expression inside the compiled function (``all(x is None for x in xs)``,
``tuple(t * 2 for t in ts)``) becomes a ``GeneratorExpression``: an iterator over its
interpreted frame, which runs up to its next ``YIELD_VALUE`` each time it is advanced, by
interpreted code (``FOR_ITER``, unpacking) or by native code that calls ``__next__`` (``sum``,
``any``, ``"".join``...). Its body's prints, outside writes and recorded ops therefore happen
where eager Python would run them, and ``any()`` stops at the first true item.

Its frame lives only while the piece is interpreted. One live after the graph (returned,
stored in an outside object, held at a graph break) is made again by the generated code
(``rebuilt``, from ``entry._Emitter.expr``) as a plain generator of the same expression over
what is left of its iterator, where that is all its state (one ``for`` clause, no closure)
and one holder has it; otherwise it is a ``generator`` break and that piece runs as Python.
Native iterators made over one (``zip(gen, xs)``, ``map(str, gen)``) are ``StepIterator``s:
advanced step by step too, and never made again. Other generators are a ``generator`` break.
"""

from __future__ import annotations

from typing import Any

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.interpreter import Frame, Interpreter, Returned, handles

__all__ = [
    "MAX_ITEMS",
    "GeneratorExpression",
    "StepIterator",
    "is_lazy",
    "rebuilt",
    "step_wrapped",
]

MAX_ITEMS = 100_000

_SUSPENDED = object()  # what ``Interpreter.run`` returns when the frame yielded
_FRAME_KEY = ".generator"  # the frame's local naming the generator it runs


class _Lazy:
    """An iterator whose items come from interpreting the program: only to be advanced while
    its compilation interprets (after it, the graph would miss the work)."""

    __slots__ = ()

    def __iter__(self) -> _Lazy:
        return self

    def _check_interpreting(self, interp: Interpreter) -> None:
        if not interp.frames:
            raise RuntimeError(
                "fxloom.compile: a generator expression made inside a compiled function was "
                "advanced after its piece ended; consume it inside the function (or build a "
                "list)"
            )


class GeneratorExpression(_Lazy):
    """A generator expression the program made, run one item at a time in the interpreter."""

    __slots__ = ("interp", "frame", "yielded", "count", "running", "finished")

    def __init__(self, interp: Interpreter, frame: Frame) -> None:
        self.interp = interp
        self.frame = frame
        self.yielded: Any = None
        self.count = 0
        self.running = False
        self.finished = False
        frame.locals[_FRAME_KEY] = self

    def __next__(self) -> Any:
        if self.finished:
            raise StopIteration
        self._check_interpreting(self.interp)
        if self.running:  # CPython: ValueError, generator already executing
            raise Break("generator", f"{self.frame.code.co_qualname} advances itself")
        self.running = True
        try:
            outcome = self.interp.run(self.frame)
        except BaseException:
            self.finished = True  # a raising generator is done, as in CPython
            raise
        finally:
            self.running = False
        if outcome is _SUSPENDED:
            value, self.yielded = self.yielded, None
            return value
        self.finished = True
        raise StopIteration

    def rest(self) -> Any:
        """The iterator a fresh generator of the same expression would go on from to give the
        items this one has still to give, or None when its state holds more than that (a
        second ``for`` clause, a closure)."""
        frame = self.frame
        function = frame.function
        if self.running or function.__closure__ or frame.code.co_cellvars:
            return None
        if sum(instruction.op == "FOR_ITER" for instruction in frame.instructions) != 1:
            return None
        if self.finished:
            from fxloom.bytecode.handlers.control import ListIterator  # (control imports this)

            return ListIterator([])
        if frame.ip == 0:  # not started
            return frame.locals.get(".0")
        # Suspended at its yield: below the value ``send`` gave, only its loop's iterator.
        if len(frame.stack) == 2 and frame.stack[1] is None:
            return frame.stack[0]
        return None

    def __repr__(self) -> str:
        state = "finished" if self.finished else f"{self.count} items so far"
        return f"<generator expression {self.frame.code.co_qualname}, {state}>"


class StepIterator(_Lazy):
    """A native iterator over a generator expression (``zip(gen, xs)``), advanced one step
    at a time as the program advances it, never listed ahead."""

    __slots__ = ("inner", "interp")

    def __init__(self, inner: Any, interp: Interpreter) -> None:
        self.inner = inner
        self.interp = interp

    def __next__(self) -> Any:
        self._check_interpreting(self.interp)
        return next(self.inner)


def rebuilt(value: Any, emitter: Any) -> str:
    """Python that makes, after the graph, a generator that goes on as ``value`` would (its
    items still to come from a plain generator over what is left of its iterator), for
    ``entry._Emitter.expr``; a ``generator`` break where that would not be the same."""
    iterator = value.rest() if isinstance(value, GeneratorExpression) else None
    if iterator is None:
        raise Break(
            "generator",
            "a generator expression not run to its end is live after the graph (returned, "
            "stored or held at a graph break), and its state cannot be made again",
        )
    # Held twice (a variable and the for loop over it): two copies would go on apart.
    made = emitter.__dict__.setdefault("generators_rebuilt", set())
    if id(value) in made:
        raise Break(
            "generator",
            "a generator expression is held twice at a graph break (a variable and a for "
            "loop over it, say): after the graph it would be two",
        )
    made.add(id(value))
    function = emitter.constant(value.frame.function)
    return f"{emitter.constant(_remade)}({function}, {emitter.expr(iterator)})"


def _remade(function: Any, iterator: Any) -> Any:
    return function(iterator)  # a generator expression's function takes its iterator only


def is_lazy(value: Any) -> bool:
    """Whether ``value`` is advanced by interpreting the program (see the module docstring)."""
    return isinstance(value, _Lazy)


def step_wrapped(interp: Interpreter, result: Any, args: tuple, kwargs: dict) -> Any:
    """``result`` of a native call on ``args``: an iterator it made over a generator expression
    among them wrapped as a ``StepIterator`` (built by the program), otherwise itself."""
    if is_lazy(result) or not any(is_lazy(value) for value in (*args, *kwargs.values())):
        return result
    if not hasattr(type(result), "__next__"):
        return result
    return interp.recording.built(StepIterator(result, interp))


def generator_expression(interp: Interpreter, frame: Frame) -> GeneratorExpression:
    """The generator a generator expression's call makes: nothing of its body runs yet."""
    return interp.recording.built(GeneratorExpression(interp, frame))


@handles("RETURN_GENERATOR")
def return_generator(interp, frame, instruction):
    frame.stack.append(None)  # what CPython's generator would be: popped by the next POP_TOP


@handles("YIELD_VALUE")
def yield_value(interp, frame, instruction):
    generator = frame.locals.get(_FRAME_KEY)
    if generator is None and interp.frames and interp.frames[0] is frame:
        # the compiled generator function's own yield: a piece boundary (``driver``)
        raise Break("yield", f"yield in {frame.code.co_name}")
    if generator is None:
        raise Break("generator", f"yield in {frame.code.co_name}")
    generator.count += 1
    if generator.count > MAX_ITEMS:
        raise Break("generator", f"{frame.code.co_name} yields more than {MAX_ITEMS} items")
    generator.yielded = frame.stack.pop()
    frame.stack.append(None)  # the value ``send`` gives when the frame resumes
    return Returned(_SUSPENDED)


@handles("STOPITERATION_ERROR")
def stopiteration_error(interp, frame, instruction):
    """A generator's exception on its way out (3.12+): a ``StopIteration`` becomes a
    ``RuntimeError``, as PEP 479 has it; reached only when the frame runs as Python (capture
    stops at the exception before)."""
    error = frame.stack.pop()
    if isinstance(error, StopIteration):
        replaced = RuntimeError("generator raised StopIteration")
        replaced.__cause__ = error
        error = replaced
    frame.stack.append(error)
