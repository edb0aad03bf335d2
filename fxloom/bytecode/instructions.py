"""Reading bytecode: one instruction form for CPython 3.11, 3.12 and 3.13.

``decode(code)`` reads a code object with the standard library's ``dis`` and fxloom's own
exception-table decoder (the format CPython documents in ``InternalDocs/exception_handling``),
and normalises what differs between versions at decode time, so that no handler of the
interpreter asks which Python runs. Instructions are numbered (``index``); jumps and
exception handlers name the index they go to; ``offset`` keeps the original byte offset.

The normalised dialect, where it differs from ``dis``:

==========================  ===================================================================
op                          covers
==========================  ===================================================================
``CALL``                    3.11 ``PRECALL``+``KW_NAMES``+``CALL``, 3.12 ``KW_NAMES``+``CALL``,
                            3.13 ``CALL`` and ``CALL_KW`` (whose names tuple, a ``LOAD_CONST``
                            just before, is folded in): ``nargs`` positional values and
                            ``kwnames``; below them the two slots callable/``self`` or NULL
                            (3.11 and 3.12 put NULL below the callable, 3.13 above it: a
                            handler takes whichever slot is not NULL)
``LOAD_ATTR``               ``LOAD_ATTR`` and 3.11's ``LOAD_METHOD`` (``method=True``)
``LOAD_GLOBAL``             ``push_null`` from the low bit; ``NULL_BELOW`` says where it goes
``LOAD_SUPER_ATTR``         ``method`` from the low bit
``JUMP``                    ``JUMP_FORWARD``, ``JUMP_BACKWARD``, ``JUMP_BACKWARD_NO_INTERRUPT``
``POP_JUMP_IF_<X>``         3.11's ``POP_JUMP_FORWARD_IF_<X>``/``POP_JUMP_BACKWARD_IF_<X>``
``FOR_ITER``                ``target`` is the first instruction after the loop's cleanup
                            (3.12's ``END_FOR``, 3.13's ``END_FOR`` + ``POP_TOP``): the handler
                            pops the iterator itself when it is exhausted
``LOAD_FAST`` and           3.13's superinstructions ``LOAD_FAST_LOAD_FAST``,
``STORE_FAST``              ``STORE_FAST_LOAD_FAST``, ``STORE_FAST_STORE_FAST``, split in two
                            (both halves keep the offset; ``offset_index`` names the first;
                            the second has ``split_half=True``)
``LOAD_CLOSURE``            push a cell (for a closure's tuple); 3.13 writes it as ``LOAD_FAST``
                            of a cell or free variable, renamed back here
``FORMAT``                  ``arg = (conversion, has_spec)``: 3.11/3.12 ``FORMAT_VALUE``,
                            3.13 ``FORMAT_SIMPLE`` (no spec) and ``FORMAT_WITH_SPEC``
``CONVERT_VALUE``           3.13 only (``arg``: ``str``, ``repr`` or ``ascii``), before ``FORMAT``
``LIST_TO_TUPLE``,          3.12+ ``CALL_INTRINSIC_1`` with those intrinsics; other intrinsics
``UNARY_POSITIVE``,         keep ``CALL_INTRINSIC_1`` with the intrinsic's name as ``arg``
``STOPITERATION_ERROR``
``BINARY_OP``               ``arg`` is the operator as Python writes it (``+``, ``@=``)
``COMPARE_OP``              ``arg`` is the comparison (``<``, ``==``), whatever bits it carries
==========================  ===================================================================

Kept as ``dis`` reads them (so they exist on some versions only; a handler for each is enough):
``RESUME`` (``arg`` its int), 3.13's ``TO_BOOL`` (not folded into the jump that follows),
3.12+ ``RETURN_CONST``, ``BINARY_SLICE``/``STORE_SLICE`` (not expanded into ``BUILD_SLICE``),
``MAKE_FUNCTION`` (``arg`` the 3.11/3.12 flags; 0 on 3.13, where ``SET_FUNCTION_ATTRIBUTE``
with the flag as ``arg`` follows), ``CALL_FUNCTION_EX`` (``arg`` 1 when a ``**`` mapping is on
the stack), ``LOAD_SUPER_ATTR`` (3.12+; ``method`` from bit 0, ``arg`` the name; the bit-1
two-argument flag is not exposed).

Dropped: ``CACHE``, ``EXTENDED_ARG`` (folded by ``dis``), ``PRECALL``, ``KW_NAMES``. Names are
strings (``arg`` of name ops), constants their value, counts ints. Every instruction in a
``try`` (or ``with``, or a comprehension's cleanup) carries its ``handler``: the index to go
to, the stack depth to cut back to, and whether to push the raising instruction's offset.

Decoding is cached per code object. On Python 3.10, ``decode`` raises ``UnsupportedPython``.

Depends on the standard library only.
"""

from __future__ import annotations

import bisect
import dis
import sys
import types
from dataclasses import dataclass
from typing import Any

from fxloom.bytecode.breaks import CompileError  # torch-free, like this module

__all__ = [
    "Handler",
    "Instruction",
    "NULL_BELOW",
    "SUPPORTED_OPS",
    "UnsupportedPython",
    "decode",
    "exception_table",
    "offset_index",
    "unnormalised_opnames",
]

NULL_BELOW = sys.version_info < (3, 13)  # where LOAD_GLOBAL's NULL goes: below the callable


class UnsupportedPython(CompileError):
    """fxloom.compile reads the bytecode of Python 3.11 and newer only."""


@dataclass(frozen=True, slots=True)
class Handler:
    """Where an exception raised by an instruction goes: ``target`` (an index), the stack cut
    back to ``depth`` items, and the raising instruction's offset pushed first if ``lasti``."""

    target: int
    depth: int
    lasti: bool


@dataclass(frozen=True, slots=True)
class Instruction:
    """One normalised instruction; see the module docstring for the dialect."""

    index: int
    offset: int
    op: str
    arg: Any
    target: int | None
    line: int | None
    handler: Handler | None = None
    nargs: int = 0
    kwnames: tuple[str, ...] = ()
    push_null: bool = False
    method: bool = False
    split_half: bool = False  # the second half of a split superinstruction (same offset)


_RENAMED = {
    "JUMP_FORWARD": "JUMP", "JUMP_BACKWARD": "JUMP", "JUMP_BACKWARD_NO_INTERRUPT": "JUMP",
    "POP_JUMP_FORWARD_IF_TRUE": "POP_JUMP_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_FORWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_FORWARD_IF_NONE": "POP_JUMP_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_BACKWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "LOAD_METHOD": "LOAD_ATTR", "CALL_KW": "CALL",
    "FORMAT_VALUE": "FORMAT", "FORMAT_SIMPLE": "FORMAT", "FORMAT_WITH_SPEC": "FORMAT",
}  # fmt: skip
_DROPPED = frozenset(("CACHE", "EXTENDED_ARG", "PRECALL", "KW_NAMES"))
_SPLIT = {  # superinstruction -> its two halves
    "LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
    "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST"),
    "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST"),
}
_INTRINSICS = {
    "INTRINSIC_LIST_TO_TUPLE": "LIST_TO_TUPLE",
    "INTRINSIC_UNARY_POSITIVE": "UNARY_POSITIVE",
    # 3.12+: a generator's body-wide handler turns a StopIteration leaving it into RuntimeError
    "INTRINSIC_STOPITERATION_ERROR": "STOPITERATION_ERROR",
}
_CONVERSIONS = (None, str, repr, ascii)  # FORMAT_VALUE's and CONVERT_VALUE's numbering
_COUNTED = frozenset(  # ops whose arg is a plain count or flag
    ("BUILD_TUPLE", "BUILD_LIST", "BUILD_SET", "BUILD_MAP", "BUILD_STRING", "BUILD_CONST_KEY_MAP",
     "BUILD_SLICE", "LIST_APPEND", "SET_ADD", "MAP_ADD", "LIST_EXTEND", "SET_UPDATE",
     "DICT_UPDATE", "DICT_MERGE", "UNPACK_SEQUENCE", "COPY", "SWAP", "IS_OP", "CONTAINS_OP",
     "RAISE_VARARGS", "RERAISE", "MAKE_FUNCTION", "SET_FUNCTION_ATTRIBUTE", "CALL_FUNCTION_EX",
     "RESUME")
)  # fmt: skip

# The normalised ops, with what each does (the interpreter has one handler per row).
SUPPORTED_OPS: dict[str, str] = {
    "CALL": "call a callable with positional values and keyword names",
    "LOAD_ATTR": "read an attribute (method=True: load a method for a call)",
    "LOAD_GLOBAL": "read a global or builtin (push_null: and a NULL for a call)",
    "JUMP": "jump to target",
    "POP_JUMP_IF_TRUE": "pop; jump if true", "POP_JUMP_IF_FALSE": "pop; jump if false",
    "POP_JUMP_IF_NONE": "pop; jump if None", "POP_JUMP_IF_NOT_NONE": "pop; jump if not None",
    "FOR_ITER": "push the iterator's next item, or pop it and jump past the loop",
    "FORMAT": "format a value (arg: conversion, has_spec)",
    "CONVERT_VALUE": "str(), repr() or ascii() of the value before FORMAT",
    "LIST_TO_TUPLE": "turn the list on top into a tuple",
    "STOPITERATION_ERROR": "3.12+: a StopIteration leaving a generator becomes RuntimeError",
    "BINARY_OP": "a binary operator (arg: '+', '@=', ...)",
    "COMPARE_OP": "a comparison (arg: '<', '==', ...)",
}  # fmt: skip

# Keyed by id(code), the code object kept alive in the value: hashing a code object hashes its
# bytes, constants and names on every lookup (microseconds for a forward), an id does not.
_CACHE: dict[int, tuple[types.CodeType, tuple[Instruction, ...]]] = {}


def decode(code: types.CodeType) -> tuple[Instruction, ...]:
    """The normalised instructions of ``code`` (cached per code object)."""
    entry = _CACHE.get(id(code))
    if entry is not None and entry[0] is code:
        return entry[1]
    if sys.version_info < (3, 11):
        raise UnsupportedPython(
            "fxloom.compile reads Python 3.11+ bytecode (exception tables, the CALL forms); "
            f"this is Python {sys.version_info.major}.{sys.version_info.minor}"
        )
    found = _decode(code)
    _CACHE[id(code)] = (code, found)
    return found


def offset_index(instructions: tuple[Instruction, ...]) -> dict[int, int]:
    """Byte offset -> the index of the (first) instruction at it."""
    index: dict[int, int] = {}
    for instruction in instructions:
        index.setdefault(instruction.offset, instruction.index)
    return index


def _decode(code: types.CodeType) -> tuple[Instruction, ...]:
    drafts = _drafts(code)
    index_of: dict[int, int] = {}
    for position, draft in enumerate(drafts):
        index_of.setdefault(draft["offset"], position)
    handlers = _handlers(code, drafts, index_of)
    result = []
    for position, draft in enumerate(drafts):
        target = draft.pop("target_offset", None)
        if target is not None:
            target = _after_loop_cleanup(drafts, _index_at(index_of, target)) if draft["op"] == "FOR_ITER" else _index_at(index_of, target)  # fmt: skip
        result.append(
            Instruction(index=position, target=target, handler=handlers[position], **draft)
        )
    return tuple(result)


def _index_at(index_of: dict[int, int], offset: int) -> int:
    # A jump to a dropped instruction (EXTENDED_ARG, PRECALL...) lands on the next one kept.
    while offset not in index_of:
        offset += 2
    return index_of[offset]


def _after_loop_cleanup(drafts: list[dict], position: int) -> int:
    if position < len(drafts) and drafts[position]["op"] == "END_FOR":
        position += 1
        if (
            sys.version_info >= (3, 13)
            and position < len(drafts)
            and drafts[position]["op"] == "POP_TOP"
        ):
            position += 1
    return position


def _drafts(code: types.CodeType) -> list[dict[str, Any]]:
    """The instructions as dicts of Instruction's fields (no index, target as an offset)."""
    drafts: list[dict[str, Any]] = []
    kwnames: tuple[str, ...] = ()
    cells = frozenset(code.co_cellvars + code.co_freevars)
    line = code.co_firstlineno
    for raw in dis.get_instructions(code):
        positions = raw.positions
        if positions is not None and positions.lineno is not None:
            line = positions.lineno
        name = raw.opname
        if name == "KW_NAMES":
            kwnames = code.co_consts[raw.arg]
        if name in _DROPPED:
            continue
        if name in _SPLIT:
            first, second = _SPLIT[name]
            for op, value, split_half in zip((first, second), raw.argval, (False, True)):
                if op == "LOAD_FAST" and value in cells:
                    op = "LOAD_CLOSURE"
                drafts.append(
                    {"offset": raw.offset, "op": op, "arg": value, "line": line,
                     "split_half": split_half}
                )  # fmt: skip
            continue
        draft: dict[str, Any] = {"offset": raw.offset, "op": _RENAMED.get(name, name), "arg": raw.argval, "line": line}  # fmt: skip
        if name == "CALL_KW":  # 3.13: the names tuple was the last value pushed
            kwnames = drafts.pop()["arg"]
        if name in ("CALL", "CALL_KW"):
            draft["nargs"] = raw.arg - len(kwnames)
            draft["kwnames"] = tuple(kwnames)
            kwnames = ()
        if name == "LOAD_FAST" and raw.argval in cells:
            draft["op"] = "LOAD_CLOSURE"  # 3.13 compiles LOAD_CLOSURE to LOAD_FAST of the cell
        _fields(draft, raw, name)
        drafts.append(draft)
    return drafts


def _fields(draft: dict[str, Any], raw: dis.Instruction, name: str) -> None:
    """The op-specific fields of one draft (jump targets, flags, decoded arguments)."""
    op = draft["op"]
    if raw.opcode in _JUMPS:
        draft["target_offset"] = raw.argval
    if op in _COUNTED:
        draft["arg"] = raw.arg or 0  # 3.13's MAKE_FUNCTION has none
    elif name == "LOAD_GLOBAL":
        draft["push_null"] = bool(raw.arg & 1)
    elif name == "LOAD_METHOD":
        draft["method"] = True
    elif name in ("LOAD_ATTR", "LOAD_SUPER_ATTR"):
        draft["method"] = bool(raw.arg & 1) and sys.version_info >= (3, 12)
    elif name == "BINARY_OP":
        draft["arg"] = raw.argrepr
    elif name == "COMPARE_OP":
        draft["arg"] = raw.argrepr.removeprefix("bool(").removesuffix(")")
    elif name == "UNPACK_EX":
        draft["arg"] = (raw.arg & 0xFF, raw.arg >> 8)
    elif name == "FORMAT_VALUE":
        draft["arg"] = (_CONVERSIONS[raw.arg & 3], bool(raw.arg & 4))
    elif name in ("FORMAT_SIMPLE", "FORMAT_WITH_SPEC"):
        draft["arg"] = (None, name == "FORMAT_WITH_SPEC")
    elif name == "CONVERT_VALUE":
        draft["arg"] = _CONVERSIONS[raw.arg]
    elif name == "CALL_INTRINSIC_1" and raw.argrepr in _INTRINSICS:
        draft["op"], draft["arg"] = _INTRINSICS[raw.argrepr], None
    elif name == "CALL_INTRINSIC_1":
        draft["arg"] = raw.argrepr


_JUMPS = frozenset(getattr(dis, "hasjump", None) or (*dis.hasjrel, *dis.hasjabs))


# ------------------------------------------------------------------ the exception table
def exception_table(code: types.CodeType) -> list[tuple[int, int, int, int, bool]]:
    """``(start, end, target, depth, lasti)`` byte offsets of each entry of ``code``'s
    exception table, read from ``co_exceptiontable``: each entry is four variable-length
    numbers (start, length, target in code units, then depth << 1 | lasti), written six bits at
    a time, most significant first, 0x40 marking that more follow and 0x80 the entry's start."""
    data = code.co_exceptiontable
    entries = []
    position = 0

    def number() -> int:
        nonlocal position
        byte = data[position]
        position += 1
        value = byte & 0x3F
        while byte & 0x40:
            byte = data[position]
            position += 1
            value = (value << 6) | (byte & 0x3F)
        return value

    while position < len(data):
        start = number() * 2
        end = start + number() * 2
        target = number() * 2
        depth_lasti = number()
        entries.append((start, end, target, depth_lasti >> 1, bool(depth_lasti & 1)))
    return entries


def _handlers(
    code: types.CodeType, drafts: list[dict], index_of: dict[int, int]
) -> list[Handler | None]:
    handlers: list[Handler | None] = [None] * len(drafts)
    offsets = [draft["offset"] for draft in drafts]  # ascending
    for start, end, target, depth, lasti in exception_table(code):
        handler = Handler(_index_at(index_of, target), depth, lasti)
        for position in range(bisect.bisect_left(offsets, start), bisect.bisect_left(offsets, end)):
            handlers[position] = handler
    return handlers


def unnormalised_opnames() -> list[str]:
    """The running version's opnames that the decoder passes through as they are (the
    interpreter handles each, or names it as a graph-break reason)."""
    changed = set(_RENAMED) | _DROPPED | set(_SPLIT) | {"CALL_INTRINSIC_1"}
    return sorted(name for name in dis.opmap if name not in changed)
