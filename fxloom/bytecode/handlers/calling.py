"""Handlers: calls, making functions and classes, ``with`` blocks.

A ``with`` block over a manager whose ``__enter__``/``__exit__`` fxloom would run natively
(``@contextmanager`` generators, the standard library's and numpy's managers: calls.py runs
their code as C) cannot be captured: run at compile time, its enter and exit would happen
once, not at every call. ``BEFORE_WITH`` is then a break, so the enter runs as Python at
every call, and the exit it pushes is an ``_ExitAsPython``, whose call is a break too; the
block's body between them is captured as usual.

The call layout differs between versions (3.11 and 3.12 put NULL below the callable, 3.13
above it); both are read the same way: of the two slots under the arguments, the one that
is not NULL is the callable, and if neither is, the second is ``self``.
"""

from __future__ import annotations

import builtins
import contextlib
import sys
import types

import torch

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.calls import call, records_autocast, refuse_unguarded
from fxloom.bytecode.interpreter import NULL, handles
from fxloom.bytecode.recording import made_at_break

# Packages whose context managers fxloom does not follow: their ``__enter__``/``__exit__``
# (``@contextmanager``'s generator, the standard library's and numpy's managers) run as
# Python at every call, each a graph break, while the block's body is still captured.
_NATIVE_MANAGER_PACKAGES = frozenset(sys.stdlib_module_names) | {"typing_extensions", "numpy"}


def _callable_and_self(frame):
    second = frame.stack.pop()
    first = frame.stack.pop()
    if first is NULL:
        return second, ()
    if second is NULL:
        return first, ()
    return first, (second,)


@handles("CALL")
def call_instruction(interp, frame, instruction):
    kwnames = instruction.kwnames
    count = instruction.nargs + len(kwnames)
    values = frame.stack[len(frame.stack) - count :] if count else []
    del frame.stack[len(frame.stack) - count :]
    fn, self_args = _callable_and_self(frame)
    _exit_as_python(interp, fn, frame)
    positional = values[: instruction.nargs]
    kwargs = dict(zip(kwnames, values[instruction.nargs :]))
    frame.stack.append(call(interp, fn, (*self_args, *positional), kwargs))


@handles("CALL_FUNCTION_EX")
def call_function_ex(interp, frame, instruction):
    kwargs = frame.stack.pop() if instruction.arg & 1 else {}
    args = frame.stack.pop()
    refuse_unguarded(interp, "unpacking call arguments", args, shallow=True)
    refuse_unguarded(interp, "unpacking call keywords", kwargs, shallow=True)
    fn, self_args = _callable_and_self(frame)
    _exit_as_python(interp, fn, frame)
    frame.stack.append(call(interp, fn, (*self_args, *tuple(args)), dict(kwargs)))


# MAKE_FUNCTION's flags (3.11, 3.12), in the order their values sit on the stack (top last).
_FUNCTION_PARTS = ((0x01, "__defaults__"), (0x02, "__kwdefaults__"), (0x04, "__annotations__"),
                   (0x08, "__closure__"))  # fmt: skip


@handles("MAKE_FUNCTION")
def make_function(interp, frame, instruction):
    code = frame.stack.pop()
    parts = {}
    for flag, name in reversed(_FUNCTION_PARTS):
        if instruction.arg & flag:
            parts[name] = frame.stack.pop()
    closure = parts.get("__closure__")
    if closure is None and code.co_freevars:  # 3.13 sets it next (SET_FUNCTION_ATTRIBUTE)
        closure = tuple(types.CellType() for _ in code.co_freevars)
    function = types.FunctionType(code, frame.globals, code.co_name, parts.get("__defaults__"),
                                  closure)  # fmt: skip
    function.__qualname__ = code.co_qualname
    if "__kwdefaults__" in parts:
        function.__kwdefaults__ = parts["__kwdefaults__"]
    if "__annotations__" in parts:
        function.__annotations__ = _annotations(parts["__annotations__"])
    frame.stack.append(interp.recording.built(function))


@handles("SET_FUNCTION_ATTRIBUTE")
def set_function_attribute(interp, frame, instruction):
    function = frame.stack.pop()
    value = frame.stack.pop()
    name = dict(_FUNCTION_PARTS)[instruction.arg]
    if name == "__closure__":  # a closure is fixed when a function is made: make it again
        remade = types.FunctionType(function.__code__, function.__globals__, function.__name__,
                                    function.__defaults__, value)  # fmt: skip
        remade.__kwdefaults__ = function.__kwdefaults__
        function = remade
        function.__qualname__ = function.__code__.co_qualname
        interp.recording.built(function)
    else:
        setattr(function, name, _annotations(value) if name == "__annotations__" else value)
    frame.stack.append(function)


def _annotations(value):
    # Python 3.11 and 3.12 give annotations as a flat tuple (name, value, name, value...).
    return dict(zip(value[::2], value[1::2])) if isinstance(value, tuple) else value


# Managers of natively run packages that are safe to run at compile time: no state outside
# themselves, nothing done on exit.
CAPTURED_MANAGERS = frozenset((contextlib.nullcontext,))

# torch's managers of global state whose switch a graph does not record (inference mode is
# set by a C++ guard object; an autocast made outside the function would have its attributes
# written at capture): entered and exited as Python at piece boundaries, like
# ``_NATIVE_MANAGER_PACKAGES``' managers, so that the pieces between them run under the state
# they switch, as eager. Grad mode is recorded (``torch._C._set_grad_enabled`` is a graph
# effect): ``no_grad`` and the like are captured; so is an autocast the function makes
# (``calls.records_autocast``, ``fxloom.bytecode.state_effects``).
STATE_AT_PIECE_BOUNDARIES = (
    torch.amp.autocast_mode.autocast,
    torch.autograd.grad_mode.inference_mode,
)

# torch's managers whose whole state is a ``__dict__`` of constants (grad mode saved in
# ``prev``, autocast's device and dtypes...): one the program made and still holds at a graph
# break (the exit of a ``with`` it is inside, pending) is made again after the piece's graph
# with the same attributes (``entry._Emitter``), without running its ``__init__``.
REMADE_MANAGERS = (
    torch.autograd.grad_mode.no_grad,
    torch.autograd.grad_mode.enable_grad,
    torch.autograd.grad_mode.set_grad_enabled,
    *STATE_AT_PIECE_BOUNDARIES,
)  # (the first three: ``_GRAD_MANAGERS``)


class _ExitAsPython:
    """The exit of a ``with`` block whose manager runs as Python (see the module docstring)."""

    __slots__ = ("exit",)

    def __init__(self, exit_) -> None:
        self.exit = exit_

    def __call__(self, *args):
        return self.exit(*args)


def runs_as_python(cls: type) -> bool:
    """Whether a ``with`` over a ``cls`` enters and exits as Python (module docstring)."""
    if issubclass(cls, STATE_AT_PIECE_BOUNDARIES):
        return True
    module = (getattr(cls, "__module__", None) or "").partition(".")[0]
    return module in _NATIVE_MANAGER_PACKAGES and cls not in CAPTURED_MANAGERS


def _exit_as_python(interp, fn, frame) -> None:
    if interp.native:
        return
    if type(fn) is _ExitAsPython:
        raise Break("context-manager", f"the exit of a with block in {frame.code.co_name}")
    if id(fn) in interp.pending_exits:
        raise Break(
            "context-manager",
            f"the exit of a with block entered before a graph break in {frame.code.co_name}",
        )


# Managers whose exit only switches global state back (grad mode's ``set_grad_enabled(prev)``,
# autocast's ``state_effects.autocast_back``): recorded in the graph; where an op after it
# raises, ``run`` puts the state back as the graph found it and the exit is done again as
# Python (``driver._unwind``), which leaves the state eager's exit would.
_GRAD_MANAGERS = (
    torch.autograd.grad_mode.no_grad,
    torch.autograd.grad_mode.enable_grad,
    torch.autograd.grad_mode.set_grad_enabled,
    torch.amp.autocast_mode.autocast,
)


def pending_exit(value) -> bool:
    """Whether ``value``, on the stack at a graph break, is the exit of a ``with`` block whose
    manager's exit must run once, as Python, at a piece boundary: any but grad mode's (which
    a graph records). Run there, an op of the piece that raises cannot have run it already,
    so the driver sends that exception to it (``driver._unwind``) as eager would."""
    return (
        type(value) is types.MethodType
        and value.__name__ == "__exit__"
        and not isinstance(value.__self__, _GRAD_MANAGERS)
    )


@handles("BEFORE_WITH")
def before_with(interp, frame, instruction):
    manager = frame.stack[-1]
    cls = type(manager)
    enter, exit_ = getattr(cls, "__enter__", None), getattr(cls, "__exit__", None)
    if enter is None or exit_ is None:
        raise Break("exception", f"{cls.__qualname__} is not a context manager")
    as_python = runs_as_python(cls) and (interp.native or not records_autocast(interp, manager))
    if as_python and not interp.native:
        raise Break("context-manager", f"with {cls.__qualname__}(...) in {frame.code.co_name}")
    frame.stack.pop()
    exit_ = types.MethodType(exit_, manager)
    frame.stack.append(_ExitAsPython(exit_) if as_python else exit_)
    frame.stack.append(call(interp, enter, (manager,), {}))


@handles("LOAD_BUILD_CLASS")
def load_build_class(interp, frame, instruction):
    """A ``class`` statement inside the function. Captured, the class would be made once, at
    compile time, and shared by every call (each call of the function makes a new one, with
    its own class attributes): a break, so it is made as Python at every call. As Python, the
    whole statement runs here, up to the call that makes the class, so no piece is captured
    between ``LOAD_BUILD_CLASS`` and that call (it would make the class at compile time).
    The class made is noted (``made_at_break``): the next piece reads it with its type and
    the attributes it reads guarded, not its identity (new at every call: a recompile each)."""
    if not interp.native:
        raise Break("class-statement", f"a class statement in {frame.code.co_name}")
    depth = len(frame.stack)
    frame.stack.append(builtins.__build_class__)
    while True:  # to the call that leaves the class where __build_class__ was (3.13: + NULL)
        done = frame.instructions[frame.ip]
        returned = interp.step(frame, done)
        if returned is not None or len(frame.stack) < depth:  # returned, or an exception went
            return returned  # to a handler outside the statement: the driver goes on from there
        if done.op in ("CALL", "CALL_FUNCTION_EX") and len(frame.stack) <= depth + 1:
            if isinstance(frame.stack[-1], type):  # (a metaclass may make something else)
                made_at_break(frame.stack[-1])
            return None
