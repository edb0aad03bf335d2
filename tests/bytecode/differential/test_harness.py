"""The harness itself: it finds each kind of difference, and the call sequences vary what
they say they vary. A stand-in ``compile`` that is wrong in one known way must be caught."""

from __future__ import annotations

import copy
import enum
import itertools
import types

import pytest
import torch

from differential.harness import Call, Case, compiles, describe_calls, run_case
from differential.variations import VARIATIONS, advance, sequence, tensor

pytestmark = pytest.mark.usefixtures("one_thread")

PLAIN = """
import torch
LOG = []
def f(x, y, n, s):
    print("n is", n)
    LOG.append(n)
    return x + y * s, n
"""


def base() -> Call:
    return Call((tensor((3, 3), 1), tensor((3, 3), 2), 2, 1.5), label="base")


def case(source: str = PLAIN) -> Case:
    return Case(source, sequence(base()))


class _Counting:
    """A stand-in compiled function: runs ``fn`` and counts a compile whenever ``compile``
    says so, with the attributes the harness reads from a CompiledFunction."""

    def __init__(self, fn, call=None, compile_every_call: bool = False) -> None:
        self.fn, self.cache, self.pieces, self.as_python, self.misses = fn, [], {}, set(), []
        self._call, self._every = call or fn, compile_every_call

    def __call__(self, *args, **kwargs):
        if self._every or not self.cache:
            self.cache.append(object())
        return self._call(*args, **kwargs)


def test_a_correct_compile_passes_every_variation():
    assert run_case(case(), compile=lambda fn: fn) is None


def test_a_result_frozen_at_the_first_call_is_a_result_failure():
    def freezing(fn):
        first = []

        def compiled(*args):
            if not first:
                first.append(fn(*args))
            else:
                fn(*args)  # the side effects happen, the result is the first one
            return first[0]

        return compiled

    failure = run_case(case(), compile=freezing)
    assert failure.kind == "result" and failure.call == 3  # "aliased": the first new tensors


def test_a_lost_print_is_a_printed_text_failure():
    def quiet(fn):
        def compiled(*args):
            import contextlib
            import io

            with contextlib.redirect_stdout(io.StringIO()):
                return fn(*args)

        return compiled

    assert run_case(case(), compile=quiet).kind == "printed text"


def test_an_error_of_the_compiler_is_a_crash():
    def crashing(fn):
        def compiled(*args):
            raise RuntimeError("internal")

        return compiled

    failure = run_case(case(), compile=crashing)
    assert (failure.kind, failure.call, failure.detail) == ("crash", 0, "RuntimeError: internal")


def test_an_outside_write_done_twice_is_an_outside_state_failure():
    def twice(fn):
        def compiled(*args):
            fn.__globals__["LOG"].append("extra")
            return fn(*args)

        return compiled

    assert run_case(case(), compile=twice).kind == "outside state"


def test_an_in_place_change_to_an_argument_not_made_is_an_arguments_failure():
    source = "def f(x, y, n, s):\n    x.add_(1)\n    return y\n"

    def on_copies(fn):
        return lambda x, y, n, s: fn(x.clone(), y, n, s)

    assert run_case(case(source), compile=on_copies).kind == "arguments"


def test_a_compile_on_an_identical_call_is_a_recompile_failure():
    source = "def f(x, y, n, s):\n    return x * n\n"
    failure = run_case(case(source), compile=lambda fn: _Counting(fn, compile_every_call=True))
    assert (failure.kind, failure.call) == ("recompiled on an identical call", 1)


def test_a_compile_on_each_call_that_only_grew_a_log_fails_the_second_time():
    failure = run_case(
        Case(PLAIN, sequence(base()), write_only=frozenset({"LOG"})),
        compile=lambda fn: _Counting(fn, compile_every_call=True),
    )
    assert (failure.kind, failure.call) == ("recompiled on every repeated call", 2)


def test_one_compile_in_all_passes_the_cache_checks():
    assert run_case(case(), compile=_Counting) is None


def test_compiles_counts_entries_pieces_and_places_given_up():
    fake = _Counting(lambda: None)
    fake.cache, fake.pieces, fake.as_python = [1, 2], {"a": [1], "b": [1, 2]}, {"c"}
    assert compiles(fake) == 6


# ------------------------------------------------------------------ the call sequences
def test_the_calls_are_described_with_each_tensor_named_once():
    calls = sequence(base(), ["aliasing"])
    text = describe_calls(calls)
    assert "0: f(t0=float32[3, 3], t1=float32[3, 3], 2, 1.5)  # base" in text
    assert "1: f(t0, t0, 2, 1.5)  # aliased: one tensor twice" in text
    assert "f(t0, t0, 2, 1.5)  # aliased again" in text


def test_a_deep_copy_of_the_calls_keeps_aliases_and_views():
    calls = copy.deepcopy(sequence(base(), ["aliasing", "view and base"]))
    x = calls[0].args[0]
    assert calls[1].args[0] is calls[1].args[1] is x
    view, viewed = calls[4].args[:2]
    assert viewed is x and view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_the_layout_variations_keep_the_values():
    calls = VARIATIONS["strides changed"](base())
    x = base().args[0]
    assert calls[0].args[0].stride() == (1, 3) and torch.equal(calls[0].args[0], x)
    assert not calls[1].args[0].is_contiguous() and torch.equal(calls[1].args[0], x)


def test_every_variation_makes_calls_of_the_base_signature():
    for name, variation in VARIATIONS.items():
        for call in variation(base()):
            assert len(call.args) == 4 and call.label, name


class Mode(enum.Enum):
    A = 1
    B = 2


def test_advancing_outside_state_moves_each_kind_of_value():
    counter = itertools.count()
    assert next(advance(counter)) == 1
    assert advance(3) == 4 and advance(True) is False and advance(Mode.B) is Mode.A
    assert advance({"a"}) == {"a", "b"} and advance([1, 2]) == [2, 2]
    assert advance({"k": "v"}) == {"k": "v", "key1": 1}
    assert vars(advance(types.SimpleNamespace(hits=0, name="n"))) == {"hits": 1, "name": "n"}
