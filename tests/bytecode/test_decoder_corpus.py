"""More of the decoder's corpus: with, super(), generators, lambdas, and the op sequences that
must read the same on CPython 3.11, 3.12 and 3.13 once normalised.

Only ``fxloom.bytecode.instructions`` is exercised (no tracing), so the file is cheap to run
in every cell of the test matrix.
"""

from __future__ import annotations

import sys

import pytest

from fxloom.bytecode.instructions import decode, offset_index

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.11+ bytecode")

# Ops whose presence differs between versions by design (documented in the module docstring);
# dropped before comparing sequences.
VERSION_NOISE = frozenset(("RESUME", "PUSH_NULL", "TO_BOOL", "NOP", "COPY_FREE_VARS", "MAKE_CELL"))


def ops(fn) -> list[str]:
    return [i.op for i in decode(fn.__code__) if i.op not in VERSION_NOISE]


def with_block(lock, xs):
    with lock:
        xs.append(1)
    return xs


class Base:
    def f(self, x):
        return x


class Child(Base):
    def f(self, x):
        return super().f(x) + 1


def generator(xs):
    for x in xs:
        yield x * 2


square = lambda x: x * x  # noqa: E731


def global_call(x):
    return len(x)


def method_call_with_keyword(self, x, y):
    return self.lin(x, bias=y)


def swap_locals(a, b):
    a, b = b, a
    return a, b


def try_finally(d):
    try:
        value = d["key"]
    except KeyError as error:
        value = str(error)
    finally:
        d.clear()
    return value


def loops(xs):
    total = 0
    for x in xs:
        if x is None:
            continue
        if x > 10:
            break
        total += x
    while total > 100:
        total -= 1
    return total


def list_comprehension(xs):
    return [x * 2 for x in xs]


def closure(n):
    def inc():
        nonlocal n
        n += 1
        return n

    return inc()


def fstrings(x, width):
    return f"{x!r:>{width}} {x!s} {x}"


def slices(xs, ys):
    ys[1:2] = xs[1:3]
    return ys


def star_call(f, *args, **kwargs):
    return f(1, *args, key=2, **kwargs)


def chained(a, b):
    return a < b <= 10


def is_none(a):
    return a is None


CORPUS = [with_block, Child.f, generator, square, global_call, method_call_with_keyword,
          swap_locals, try_finally, loops, list_comprehension, closure, fstrings, slices,
          star_call, chained, is_none]  # fmt: skip


@pytest.mark.parametrize("fn", CORPUS, ids=lambda fn: fn.__qualname__)
def test_jump_targets_and_handlers_are_instruction_indices(fn):
    instructions = decode(fn.__code__)
    for i in instructions:
        assert i.index == instructions.index(i)
        if i.target is not None:
            assert 0 <= i.target < len(instructions)
        if i.handler is not None:
            assert 0 <= i.handler.target < len(instructions)


@pytest.mark.parametrize("fn", CORPUS, ids=lambda fn: fn.__qualname__)
def test_offset_index_round_trips_to_the_first_instruction_at_each_offset(fn):
    instructions = decode(fn.__code__)
    for offset, index in offset_index(instructions).items():
        assert instructions[index].offset == offset
        assert index == 0 or instructions[index - 1].offset != offset


def test_a_global_call_reads_the_same_on_every_version():
    assert ops(global_call) == ["LOAD_GLOBAL", "LOAD_FAST", "CALL", "RETURN_VALUE"]
    load, call = decode(global_call.__code__)[-4], decode(global_call.__code__)[-2]
    assert (load.arg, load.push_null) == ("len", True)
    assert (call.nargs, call.kwnames) == (1, ())


def test_a_method_call_with_a_keyword_reads_the_same_on_every_version():
    assert ops(method_call_with_keyword) == [
        "LOAD_FAST", "LOAD_ATTR", "LOAD_FAST", "LOAD_FAST", "CALL", "RETURN_VALUE"
    ]  # fmt: skip
    attr = next(i for i in decode(method_call_with_keyword.__code__) if i.op == "LOAD_ATTR")
    call = next(i for i in decode(method_call_with_keyword.__code__) if i.op == "CALL")
    assert (attr.arg, attr.method) == ("lin", True)
    assert (call.nargs, call.kwnames) == (1, ("bias",))


def test_a_tuple_swap_of_locals_splits_into_single_loads_and_stores():
    # 3.13 fuses these into LOAD_FAST_LOAD_FAST / STORE_FAST_STORE_FAST; both halves are kept.
    body = [
        (i.op, i.arg) for i in decode(swap_locals.__code__) if i.op in ("LOAD_FAST", "STORE_FAST")
    ]
    assert body[:4] == [
        ("LOAD_FAST", "b"),
        ("LOAD_FAST", "a"),
        ("STORE_FAST", "b"),
        ("STORE_FAST", "a"),
    ]


def test_only_the_second_half_of_a_split_instruction_is_marked_as_its_continuation():
    instructions = decode(swap_locals.__code__)
    for i in instructions:
        shares_offset_with_previous = i.index > 0 and instructions[i.index - 1].offset == i.offset
        assert i.split_half == shares_offset_with_previous


def test_a_with_body_is_covered_by_a_handler_that_starts_with_push_exc_info():
    instructions = decode(with_block.__code__)
    append = next(i for i in instructions if i.op == "LOAD_ATTR" and i.arg == "append")
    assert append.handler is not None and append.handler.lasti
    assert instructions[append.handler.target].op == "PUSH_EXC_INFO"


def test_super_method_call_loads_a_method_named_f():
    # 3.11: LOAD_GLOBAL super; CALL 0; LOAD_ATTR(method). 3.12+: LOAD_SUPER_ATTR(method).
    instructions = decode(Child.f.__code__)
    load = next(
        i for i in instructions if i.op in ("LOAD_ATTR", "LOAD_SUPER_ATTR") and i.arg == "f"
    )
    assert load.method


def test_a_generator_yields_and_its_loop_exits_past_the_cleanup():
    instructions = decode(generator.__code__)
    assert "YIELD_VALUE" in [i.op for i in instructions]
    loop = next(i for i in instructions if i.op == "FOR_ITER")
    assert instructions[loop.target].op not in ("END_FOR", "POP_TOP")


def test_a_lambda_decodes_to_a_binary_op_with_its_symbol():
    assert ops(square) == ["LOAD_FAST", "LOAD_FAST", "BINARY_OP", "RETURN_VALUE"]
    assert next(i for i in decode(square.__code__) if i.op == "BINARY_OP").arg == "*"


def test_every_instruction_has_a_source_line():
    assert all(i.line is not None for i in decode(with_block.__code__))


def test_a_closure_loads_its_cells_with_load_closure_on_every_version():
    # 3.13 writes LOAD_CLOSURE as LOAD_FAST of the cell; the decoder renames it back.
    instructions = decode(closure.__code__)
    assert [(i.op, i.arg) for i in instructions if i.op in ("LOAD_CLOSURE", "LOAD_FAST")][0] == (
        "LOAD_CLOSURE",
        "n",
    )


def test_a_star_call_is_call_function_ex_with_its_mapping_flag():
    assert ops(star_call)[-2:] == ["CALL_FUNCTION_EX", "RETURN_VALUE"]
    assert decode(star_call.__code__)[-2].arg == 1
    assert "LIST_TO_TUPLE" in ops(star_call)


def test_is_none_is_an_is_op_on_the_none_constant():
    assert ops(is_none) == ["LOAD_FAST", "LOAD_CONST", "IS_OP", "RETURN_VALUE"]


def test_f_string_conversions_are_str_or_repr_on_format_or_convert_value():
    # 3.11/3.12 carry the conversion in FORMAT; 3.13 puts CONVERT_VALUE before FORMAT.
    instructions = decode(fstrings.__code__)
    conversions = [i.arg[0] for i in instructions if i.op == "FORMAT" and i.arg[0] is not None]
    conversions += [i.arg for i in instructions if i.op == "CONVERT_VALUE"]
    assert conversions == [repr, str]
    assert [i.arg[1] for i in instructions if i.op == "FORMAT"].count(True) == 1


def test_chained_comparison_carries_both_operators():
    assert [i.arg for i in decode(chained.__code__) if i.op == "COMPARE_OP"] == ["<", "<="]


def test_break_and_continue_jump_inside_the_function_and_the_loops_go_back():
    instructions = decode(loops.__code__)
    jumps = [i for i in instructions if i.op == "JUMP"]
    assert any(i.target < i.index for i in jumps)  # the for and while loops jump backwards
    assert {"POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE"} & set(ops(loops))


def test_finally_and_except_handlers_start_with_push_exc_info():
    instructions = decode(try_finally.__code__)
    subscript = next(i for i in instructions if i.op == "BINARY_SUBSCR")
    assert instructions[subscript.handler.target].op == "PUSH_EXC_INFO"
    assert not subscript.handler.lasti


def test_a_list_comprehension_loops_inline_or_in_its_own_code():
    # 3.11 makes a nested function; 3.12+ inline it (PEP 709): the loop is in one of the two.
    outer = decode(list_comprehension.__code__)
    nested = [i.arg for i in outer if i.op == "LOAD_CONST" and hasattr(i.arg, "co_code")]
    loop_ops = [i.op for i in (decode(nested[0]) if nested else outer)]
    assert "FOR_ITER" in loop_ops and "LIST_APPEND" in loop_ops
