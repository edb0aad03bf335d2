"""The decoder reads CPython 3.11-3.13 bytecode into one instruction form.

``fxloom.bytecode.instructions.decode`` normalises at decode time what differs between
versions (the call forms, superinstructions, jump directions, loop cleanup, formatting),
so these tests read the same on every version the test matrix runs.
"""

from __future__ import annotations

import dis
import sys

import pytest

from fxloom.bytecode import interpreter
from fxloom.bytecode.entry import compile_entry  # noqa: F401 - registers the handlers
from fxloom.bytecode.handlers.unsupported import NOT_IN_FUNCTION_CODE, NOT_IN_FUNCTION_PREFIXES
from fxloom.bytecode.instructions import (
    SUPPORTED_OPS,
    decode,
    exception_table,
    offset_index,
    unnormalised_opnames,
)

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.11+ bytecode")


# The decoder's corpus lives in one place: test_decoder_corpus.py (each function a shape of
# code whose bytecode differs between versions).
from test_decoder_corpus import (  # noqa: E402
    CORPUS,
    chained,
    loops,
    method_call_with_keyword,
    try_finally,
)


@pytest.mark.parametrize("fn", CORPUS, ids=lambda fn: fn.__name__)
def test_no_version_specific_op_is_left(fn):
    ops = {instruction.op for instruction in decode(fn.__code__)}
    left = ops & {"PRECALL", "KW_NAMES", "CALL_KW", "LOAD_METHOD", "JUMP_FORWARD", "JUMP_BACKWARD",
                  "LOAD_FAST_LOAD_FAST", "FORMAT_VALUE", "FORMAT_SIMPLE", "CACHE"}  # fmt: skip
    assert not left


def test_a_keyword_call_is_one_call_with_its_names():
    calls = [i for i in decode(method_call_with_keyword.__code__) if i.op == "CALL"]
    assert [(call.nargs, call.kwnames) for call in calls] == [(1, ("bias",))]


def test_a_method_load_is_marked():
    loads = [i for i in decode(method_call_with_keyword.__code__) if i.op == "LOAD_ATTR"]
    assert [(load.arg, load.method) for load in loads] == [("lin", True)]


def test_binary_and_compare_ops_carry_their_operator():
    ops = {(i.op, i.arg) for i in decode(chained.__code__)}
    assert ("COMPARE_OP", "<") in ops and ("COMPARE_OP", "<=") in ops


def test_a_for_loop_exits_past_its_cleanup():
    instructions = decode(loops.__code__)
    exit_ = instructions[next(i.target for i in instructions if i.op == "FOR_ITER")]
    assert exit_.op not in ("END_FOR", "POP_TOP")


def test_the_exception_table_matches_dis():
    # dis's own reading (undocumented) as the reference for fxloom's decoder.
    expected = [
        (e.start, e.end, e.target, e.depth, e.lasti)
        for e in dis.Bytecode(try_finally).exception_entries
    ]
    assert exception_table(try_finally.__code__) == expected


def test_instructions_in_a_try_carry_the_handler():
    instructions = decode(try_finally.__code__)
    subscript = next(i for i in instructions if i.op == "BINARY_SUBSCR")
    assert subscript.handler is not None
    assert instructions[subscript.handler.target].op == "PUSH_EXC_INFO"


def test_offset_index_names_the_first_instruction_at_each_offset():
    instructions = decode(loops.__code__)
    for offset, index in offset_index(instructions).items():
        assert instructions[index].offset == offset


def test_decoding_is_cached_per_code_object():
    assert decode(loops.__code__) is decode(loops.__code__)


def test_every_opcode_is_handled_or_never_in_a_function():
    # The interpreter has a handler (or a named graph break, handlers/unsupported.py) for
    # every op the decoder leaves as it is; what remains only occurs outside function code.
    missing = [
        name
        for name in unnormalised_opnames()
        if name not in interpreter.HANDLERS
        and name not in NOT_IN_FUNCTION_CODE
        and not name.startswith(NOT_IN_FUNCTION_PREFIXES)
    ]
    assert not missing, f"opcodes with no handler and no break reason: {missing}"


def test_the_normalised_ops_all_have_handlers():
    assert set(SUPPORTED_OPS) <= set(interpreter.HANDLERS)
