"""A compiled generator function: its call returns a generator whose code runs as compiled
pieces, each ``yield`` a piece boundary.

The first ``next`` runs the function's entry up to its first ``yield``; the value goes to the
consumer, the value it sends (None for ``next``) is pushed where the ``yield`` leaves it, and
the next piece starts just after the ``yield``. Values, their order, the order of effects,
``send``, ``close``, exceptions thrown in and the return value in ``StopIteration`` are as in
eager. A generator function fxloom cannot suspend (``yield from``) runs as Python, saying why.
"""

from __future__ import annotations

import types

import pytest
import torch

import fxloom
from tests.bytecode.like_eager import assert_same

X = [torch.randn(4) + i for i in range(3)]


def three_values(x):
    yield x + 1
    yield x * 2
    yield x.sum()


def test_its_values_are_eagers_in_order():
    compiled = fxloom.compile(three_values)
    for x in X:
        assert_same(list(compiled(x)), list(three_values(x)))


def test_each_piece_between_yields_compiles_once():
    compiled = fxloom.compile(three_values)
    for x in X:
        list(compiled(x))
    report = compiled.explain()
    assert report.graph_count == 3  # one per value: the piece after the last yield is empty
    assert report.runs_as_python is None
    assert {stop.reason for stop in report.breaks} == {fxloom.bytecode.breaks.BREAKS["yield"].title}


def test_calling_it_returns_a_generator_and_runs_nothing():
    ran = []

    def f(x):
        ran.append("started")
        yield x

    generator = fxloom.compile(f)(X[0])
    assert isinstance(generator, types.GeneratorType) and not ran
    assert_same(next(generator), X[0])
    assert ran == ["started"]


def test_a_wrong_call_raises_at_the_call_as_in_python():
    with pytest.raises(TypeError):
        fxloom.compile(three_values)(X[0], X[1])


def accumulate(x):
    total = 0
    while True:
        sent = yield x * total
        if sent is None:
            return total
        total += sent


def run_sends(fn, x):
    generator = fn(x)
    seen = [next(generator), generator.send(2), generator.send(3)]
    with pytest.raises(StopIteration) as stop:
        next(generator)
    return seen, stop.value.value


def test_send_gives_the_yield_its_value_and_return_ends_it():
    compiled = fxloom.compile(accumulate)
    for x in X:
        assert_same(run_sends(compiled, x), run_sends(accumulate, x))


def with_cleanup(log, x):
    try:
        yield x + 1
        yield x + 2
    except ValueError as error:
        log.append(f"caught {error}")
        yield x - 1
    finally:
        log.append("cleanup")


def test_close_runs_the_finally_block_as_in_eager():
    logs = []
    for fn in (with_cleanup, fxloom.compile(with_cleanup)):
        log = []
        generator = fn(log, X[0])
        next(generator)
        generator.close()
        logs.append(log)
    assert logs[0] == logs[1] == ["cleanup"]


def test_an_exception_thrown_in_goes_to_the_except_block():
    results = []
    for fn in (with_cleanup, fxloom.compile(with_cleanup)):
        log = []
        generator = fn(log, X[0])
        next(generator)
        results.append((generator.throw(ValueError("boom")), log[:]))
        assert list(generator) == [] and log[-1] == "cleanup"
    assert_same(results[0][0], results[1][0])
    assert results[0][1] == results[1][1] == ["caught boom"]


def test_an_exception_thrown_in_and_not_handled_reaches_the_consumer():
    for fn in (three_values, fxloom.compile(three_values)):
        generator = fn(X[0])
        next(generator)
        with pytest.raises(KeyError):
            generator.throw(KeyError("k"))
        assert list(generator) == []


def logs_between(log, x):
    log.append("a")
    yield x + 1
    log.append("b")
    yield x + 2


def test_effects_between_yields_happen_as_the_consumer_advances():
    for fn in (logs_between, fxloom.compile(logs_between)):
        log = []
        generator = fn(log, X[0])
        next(generator)
        assert log == ["a"]
        next(generator)
        assert log == ["a", "b"]


def test_a_break_between_yields_is_a_piece_of_its_own():
    def f(x):
        m = x.abs().max().item()  # a graph break
        yield x / m
        yield x * m

    compiled = fxloom.compile(f)
    for x in X:
        assert_same(list(compiled(x)), list(f(x)))


def test_a_loop_of_yields_reuses_its_pieces():
    def f(x, n):
        for i in range(n):
            yield x * i

    compiled = fxloom.compile(f)
    for x in X:
        assert_same(list(compiled(x, 4)), list(f(x, 4)))
    assert compiled.explain().graph_count <= 4


def delegates(x):
    yield from three_values(x)


def test_yield_from_runs_as_python_saying_why():
    compiled = fxloom.compile(delegates)
    assert_same(list(compiled(X[0])), list(delegates(X[0])))
    assert "yield from" in compiled.explain().runs_as_python


def test_generators_of_one_compiled_function_run_interleaved():
    compiled = fxloom.compile(three_values)
    a, b = compiled(X[0]), compiled(X[1])
    got = [next(a), next(b), next(a), next(b)]
    want = [X[0] + 1, X[1] + 1, X[0] * 2, X[1] * 2]
    assert_same(got, want)
