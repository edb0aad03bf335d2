"""Handlers: globals, closure cells and attributes.

Stores to globals, outside cells and attributes of outside objects are side effects: kept
aside by the recording (later loads read them back) and replayed after the graph
(``fxloom.bytecode.side_effects``). A list, dict, set or deque loaded only to be changed by a
blind method next (``LOG.append(x)``, ``CACHE[key] = value``) is loaded with an identity
guard and no guard on its contents (``_loaded_to_change``), so an append log never recompiles.
"""

from __future__ import annotations

import builtins
import collections
import sys
import types
from typing import Any

import torch

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.calls import inline, record
from fxloom.bytecode.instructions import NULL_BELOW
from fxloom.bytecode.interpreter import NULL, handles
from fxloom.bytecode.recording import NOT_WRITTEN
from fxloom.bytecode.side_effects import kind_of
from fxloom.bytecode.sources import Attr, Cell, Global, Item, Source
from fxloom.values.stand_in import StandIn

_MISSING = object()


@handles("LOAD_GLOBAL")
def load_global(interp, frame, instruction):
    name = instruction.arg
    value = frame.globals.get(name, _MISSING)
    if value is _MISSING:
        value = frame.builtins.get(name, _MISSING)
        if value is _MISSING:
            raise Break("exception", f"name {name!r} is not defined")
        # Builtins are taken as Python's own: rebinding them is not guarded.
    elif not interp.native:
        value = _global(interp, frame, name, value)
    if instruction.push_null and NULL_BELOW:
        frame.stack.append(NULL)
    frame.stack.append(value)
    if instruction.push_null and not NULL_BELOW:
        frame.stack.append(NULL)


def _global_source(interp, frame, name: str) -> Source:
    if frame.globals is interp.frames[0].globals:
        return Global(name)
    return Global(name, module=frame.globals.get("__name__"))


def _global(interp, frame, name: str, value: Any) -> Any:
    recording = interp.recording
    stored = recording.global_value(frame.globals, name)
    if stored is not NOT_WRITTEN:
        return stored
    source = _global_source(interp, frame, name)
    changed = _loaded_to_change(interp, frame, value, source)
    return recording.read(value, source) if changed is None else changed


@handles("STORE_GLOBAL", "DELETE_GLOBAL")
def store_global(interp, frame, instruction):
    if not interp.native:
        if instruction.op == "DELETE_GLOBAL":
            raise Break("outside-mutation", f"global {instruction.arg} is deleted")
        source = _global_source(interp, frame, instruction.arg)
        if (
            frame.globals is not interp.frames[0].globals
            and getattr(sys.modules.get(source.module or ""), "__dict__", None) is not frame.globals
        ):  # replay names the globals by their module: a namespace no module has is a break
            raise Break(
                "outside-mutation",
                f"global {instruction.arg} of a namespace that is no module's is assigned",
            )
        interp.recording.store_global(frame.globals, instruction.arg, frame.stack.pop(), source)
        return
    if instruction.op == "STORE_GLOBAL":
        frame.globals[instruction.arg] = frame.stack.pop()
    else:
        del frame.globals[instruction.arg]


@handles("LOAD_CLOSURE")
def load_closure(interp, frame, instruction):
    frame.stack.append(frame.cells[instruction.arg])


@handles("MAKE_CELL", "COPY_FREE_VARS")
def cells_made_at_entry(interp, frame, instruction):
    return None  # ``bind_frame`` made the frame's cells and took its free variables


@handles("LOAD_DEREF")
def load_deref(interp, frame, instruction):
    name = instruction.arg
    cell = frame.cells[name]
    recording = interp.recording
    # What the program stored in a cell from outside is kept aside (the real cell may still
    # be empty: a variable of the call first set after a graph break)
    stored = NOT_WRITTEN if id(cell) in recording.created else recording.cell_value(cell)
    try:
        value = stored if stored is not NOT_WRITTEN else cell.cell_contents
    except ValueError:
        raise Break("exception", f"free variable {name!r} is read before it is set") from None
    if id(cell) in interp.cell_sources and stored is NOT_WRITTEN:
        # a cell of the call, from the piece before: its contents are the call's own (a list
        # it appends to is no outside log), read as the locals handed on are
        value = interp.read_handed_on(value, _cell_source(interp, frame, name))
    elif id(cell) not in recording.created and stored is NOT_WRITTEN:
        source = _cell_source(interp, frame, name)
        changed = None if source is None else _loaded_to_change(interp, frame, value, source)
        value = recording.read(value, source) if changed is None else changed
    frame.stack.append(value)


def _cell_source(interp, frame, name: str) -> Source | None:
    own = interp.cell_sources.get(id(frame.cells[name]))
    if own is not None:  # a cell of the frame, made by the piece before a graph break
        return Attr(own, "cell_contents")
    code = frame.code
    index = code.co_freevars.index(name) if name in code.co_freevars else None
    if index is None:
        return None
    if frame is interp.frames[0]:
        return Cell(index, name)
    # A cell of the compiled function's own closure, reached through a function the program
    # made (a method of a class defined in the call): the compiled function's cell.
    top = interp.frames[0]
    for top_index, cell in enumerate(top.function.__closure__ or ()):
        if cell is frame.cells[name]:
            return Cell(top_index, top.code.co_freevars[top_index])
    function_source = interp.recording.source_of(frame.function)
    if function_source is None:
        return None
    return Attr(Item(Attr(function_source, "__closure__"), index), "cell_contents")


@handles("STORE_DEREF", "DELETE_DEREF")
def store_deref(interp, frame, instruction):
    cell = frame.cells[instruction.arg]
    if id(cell) not in interp.recording.created:
        source = _cell_source(interp, frame, instruction.arg)
        if source is None or instruction.op == "DELETE_DEREF":
            raise Break(
                "outside-mutation",
                f"nonlocal variable {instruction.arg} of an outside function is assigned",
            )
        interp.recording.store_cell(cell, frame.stack.pop(), source)
        return
    if instruction.op == "STORE_DEREF":
        cell.cell_contents = frame.stack.pop()
    else:
        del cell.cell_contents


@handles("LOAD_ATTR")
def load_attr(interp, frame, instruction):
    owner = frame.stack.pop()
    value = None if interp.native else _attribute_to_change(interp, frame, owner, instruction.arg)
    frame.stack.append(attribute(interp, owner, instruction.arg) if value is None else value)
    if instruction.method:
        frame.stack.append(NULL)


def attribute(interp, owner: Any, name: str) -> Any:
    """``owner.name`` as the program sees it (a property of a Python class is inlined)."""
    if interp.native:
        return getattr(owner, name)
    if isinstance(owner, StandIn):
        if name == "__class__":
            return interp.recording.graph.real_type(owner)
        value = _native_getattr(owner, name)
        if isinstance(value, StandIn):  # .T, .mT, .real, .grad...: a tensor-valued attribute
            return record(interp, "call_function", builtins.getattr, (owner, name), {})
        return value
    written = _written(interp.recording, owner, name)
    if written is not NOT_WRITTEN:
        return written
    if type(owner) in _CHANGED_TYPES:
        method = _native_getattr(owner, name)
        if type(method) is types.BuiltinMethodType:  # list.append...: the type's own, guarded
            return method  # with the container's type (a new bound method at every call)
    static = _class_attribute(type(owner), name)
    if type(static) is property and static.fget is not None and hasattr(static.fget, "__code__"):
        return inline(interp, static.fget, (owner,), {})
    value = _native_getattr(owner, name)
    return interp.recording.read_attribute(owner, name, value)


def _written(recording, owner: Any, name: str) -> Any:
    """What the program assigned to ``owner.name`` so far: on the object itself, or (not
    shadowed by the instance's own attribute) on its class, or ``NOT_WRITTEN``."""
    written = recording.written(owner, name)
    if written is not NOT_WRITTEN or isinstance(owner, type) or not recording.writes:
        return written
    own = getattr(owner, "__dict__", None)
    if isinstance(own, dict) and name in own:
        return NOT_WRITTEN
    for klass in type(owner).__mro__:
        written = recording.written(klass, name)
        if written is not NOT_WRITTEN:
            return written
    return NOT_WRITTEN


# ------------------------------------------------------------------ loaded to be changed
def _loaded_to_change(interp, frame, value: Any, source: Source) -> Any:
    """``value`` as loaded for a blind change next (``X.append(...)``, ``X[k] = v``; see the
    module docstring), or None when the next instructions do something else with it."""
    if type(value) not in _CHANGED_TYPES:
        return None
    method = _method_next(frame)
    if method is None or method not in kind_of(value).blind:
        return None
    return interp.recording.write_target(value, source)


_CHANGED_TYPES = frozenset((list, dict, set, collections.deque, collections.OrderedDict))


def _method_next(frame) -> str | None:
    """The method the next instructions call on the value just pushed: ``X.name(...)``, or
    ``X[key] = value`` (``__setitem__``) with a constant or local key."""
    instructions, ip = frame.instructions, frame.ip
    following = instructions[ip] if ip < len(instructions) else None
    if following is None:
        return None
    if following.op == "LOAD_ATTR" and following.method:
        return following.arg
    if (
        following.op in ("LOAD_CONST", "LOAD_FAST")
        and ip + 1 < len(instructions)
        and instructions[ip + 1].op == "STORE_SUBSCR"
    ):
        return "__setitem__"
    return None


def _attribute_to_change(interp, frame, owner: Any, name: str) -> Any:
    """``owner.name`` loaded for a blind change next (``self.log.append(x)``), or None."""
    recording = interp.recording
    if isinstance(owner, StandIn) or id(owner) in recording.created:
        return None
    if _written(recording, owner, name) is not NOT_WRITTEN:
        return None
    source = recording.source_of(owner)
    static = _class_attribute(type(owner), name)
    if source is None or hasattr(type(static), "__get__"):
        return None  # a property, a method, a descriptor: read as usual
    value = getattr(owner, name, _MISSING)
    if value is _MISSING:
        return None
    return _loaded_to_change(interp, frame, value, Attr(source, name))


def _class_attribute(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        found = klass.__dict__.get(name, _MISSING)
        if found is not _MISSING:
            return found
    return _MISSING


def _native_getattr(owner: Any, name: str) -> Any:
    try:
        return getattr(owner, name)
    except AttributeError as err:
        raise Break("exception", str(err)) from None


@handles("LOAD_SUPER_ATTR")
def load_super_attr(interp, frame, instruction):
    stack = frame.stack
    self_object, cls = stack.pop(), stack.pop()
    stack.pop()  # the global ``super``
    stack.append(_native_getattr(super(cls, self_object), instruction.arg))
    if instruction.method:
        stack.append(NULL)


@handles("STORE_ATTR")
def store_attr(interp, frame, instruction):
    owner = frame.stack.pop()
    value = frame.stack.pop()
    if isinstance(owner, torch.Tensor):
        raise Break("unknown-value", f"setting attribute {instruction.arg} of a tensor")
    if id(owner) in interp.recording.created:
        setattr(owner, instruction.arg, value)
    else:
        interp.recording.write_attribute(owner, instruction.arg, value)


@handles("DELETE_ATTR")
def delete_attr(interp, frame, instruction):
    owner = frame.stack.pop()
    _check_settable(interp, owner, instruction.arg)
    delattr(owner, instruction.arg)


def _check_settable(interp, owner: Any, name: str) -> None:
    if isinstance(owner, torch.Tensor):
        raise Break("unknown-value", f"setting attribute {name} of a tensor")
    if id(owner) not in interp.recording.created:
        source = interp.recording.source_of(owner)
        where = source.text if source is not None else f"a {type(owner).__name__}"
        raise Break("outside-mutation", f"{where}.{name} is assigned")


@handles("IMPORT_NAME")
def import_name(interp, frame, instruction):
    # An import inside a function runs each call, but after the first it only looks the
    # module up: done once here, its result is the same module object every time.
    from_list = frame.stack.pop()
    level = frame.stack.pop()
    frame.stack.append(__import__(instruction.arg, frame.globals, None, from_list, level))


@handles("IMPORT_FROM")
def import_from(interp, frame, instruction):
    frame.stack.append(_native_getattr(frame.stack[-1], instruction.arg))
