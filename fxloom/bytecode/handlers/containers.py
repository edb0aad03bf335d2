"""Handlers: building, extending and unpacking tuples, lists, sets, dicts and strings.

Containers the program builds hold whatever it puts in them, stand-ins included; they are
the program's own (``Recording.built``), so changing them later is no side effect.
"""

from __future__ import annotations

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.calls import record, refuse_unguarded
from fxloom.bytecode.dynamic import concrete
from fxloom.bytecode.interpreter import handles
from fxloom.values.stand_in import StandIn


def _pop(frame, count: int) -> list:
    if not count:
        return []
    items = frame.stack[-count:]
    del frame.stack[-count:]
    return items


@handles("BUILD_TUPLE")
def build_tuple(interp, frame, instruction):
    frame.stack.append(tuple(_pop(frame, instruction.arg)))


@handles("BUILD_LIST")
def build_list(interp, frame, instruction):
    frame.stack.append(interp.recording.built(_pop(frame, instruction.arg)))


@handles("BUILD_SET")
def build_set(interp, frame, instruction):
    items = _pop(frame, instruction.arg)
    if any(isinstance(item, StandIn) for item in items):
        raise Break("unknown-value", "a set of tensors (sets hash tensors by identity)")
    frame.stack.append(interp.recording.built(set(map(concrete, items))))  # hashed: a guard


@handles("BUILD_MAP")
def build_map(interp, frame, instruction):
    items = _pop(frame, 2 * instruction.arg)
    keys = [concrete(key) for key in items[::2]]  # hashed by their values (a guard each)
    frame.stack.append(interp.recording.built(dict(zip(keys, items[1::2]))))


@handles("BUILD_CONST_KEY_MAP")
def build_const_key_map(interp, frame, instruction):
    keys = frame.stack.pop()
    values = _pop(frame, instruction.arg)
    frame.stack.append(interp.recording.built(dict(zip(keys, values))))


@handles("BUILD_STRING")
def build_string(interp, frame, instruction):
    frame.stack.append("".join(_pop(frame, instruction.arg)))


@handles("LIST_APPEND")
def list_append(interp, frame, instruction):
    item = frame.stack.pop()
    frame.stack[-instruction.arg].append(item)


@handles("SET_ADD")
def set_add(interp, frame, instruction):
    item = frame.stack.pop()
    if isinstance(item, StandIn):
        raise Break("unknown-value", "a set of tensors (sets hash tensors by identity)")
    frame.stack[-instruction.arg].add(concrete(item))  # hashed by its value (a guard)


@handles("MAP_ADD")
def map_add(interp, frame, instruction):
    value = frame.stack.pop()
    key = concrete(frame.stack.pop())
    frame.stack[-instruction.arg][key] = value


@handles("LIST_EXTEND")
def list_extend(interp, frame, instruction):
    items = frame.stack.pop()
    frame.stack[-instruction.arg].extend(_iterable(interp, items))


@handles("SET_UPDATE")
def set_update(interp, frame, instruction):
    items = frame.stack.pop()
    frame.stack[-instruction.arg].update(map(concrete, _iterable(interp, items)))


@handles("DICT_UPDATE", "DICT_MERGE")
def dict_update(interp, frame, instruction):
    items = frame.stack.pop()
    refuse_unguarded(interp, f"unpacking a {type(items).__qualname__}", items, shallow=True)
    target = frame.stack[-instruction.arg]
    if instruction.op == "DICT_MERGE":
        repeated = set(target).intersection(items.keys())
        if repeated:
            raise Break(
                "exception", f"got multiple values for keyword argument {sorted(repeated)[0]!r}"
            )
    target.update(items)


@handles("LIST_TO_TUPLE")
def list_to_tuple(interp, frame, instruction):
    frame.stack.append(tuple(frame.stack.pop()))


@handles("UNPACK_SEQUENCE")
def unpack_sequence(interp, frame, instruction):
    items = list(_iterable(interp, frame.stack.pop()))
    if len(items) != instruction.arg:
        raise Break("exception", f"expected {instruction.arg} values to unpack, got {len(items)}")
    frame.stack.extend(reversed(items))


@handles("UNPACK_EX")
def unpack_ex(interp, frame, instruction):
    before, after = instruction.arg  # the decoder splits the counts around the starred name
    items = list(_iterable(interp, frame.stack.pop()))
    if len(items) < before + after:
        raise Break(
            "exception", f"expected at least {before + after} values to unpack, got {len(items)}"
        )
    rest = interp.recording.built(items[before : len(items) - after])
    unpacked = [*items[:before], rest, *items[len(items) - after :]]
    frame.stack.extend(reversed(unpacked))


def _iterable(interp, value):
    """The items of ``value`` (a tensor is iterated along its first dimension, recorded; a
    value whose type alone is guarded is not listed at capture)."""
    if isinstance(value, StandIn):
        return record(interp, "call_method", "unbind", (value, 0), {})
    refuse_unguarded(interp, f"unpacking a {type(value).__qualname__}", value, shallow=True)
    return value


@handles("FORMAT")
def format_value(interp, frame, instruction):
    convert, has_spec = instruction.arg
    spec = frame.stack.pop() if has_spec else ""
    value = frame.stack.pop()
    if isinstance(value, StandIn):
        raise Break("tensor-data", "formatting a tensor into a string reads its values")
    refuse_unguarded(interp, "formatting", value)
    value = concrete(value)  # a symbolic size prints as its value, fixed by a guard
    frame.stack.append(format(convert(value) if convert else value, spec))


@handles("CONVERT_VALUE")
def convert_value(interp, frame, instruction):
    value = frame.stack.pop()
    if isinstance(value, StandIn):
        raise Break("tensor-data", "formatting a tensor into a string reads its values")
    refuse_unguarded(interp, "formatting", value)
    frame.stack.append(instruction.arg(concrete(value)))


@handles("GET_LEN")
def get_len(interp, frame, instruction):
    frame.stack.append(len(frame.stack[-1]))  # a ``match`` statement's length check
