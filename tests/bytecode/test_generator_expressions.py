"""fxloom.compile runs a generator expression lazily, where eager Python runs it.

A generator expression made inside the compiled function runs one item each time it is
advanced, by interpreted code (a for loop, unpacking) or by a native consumer (``sum``,
``any``, ``zip``...): its prints and outside changes come in eager's order, ``any()`` and
``all()`` stop at the deciding item, and one still alive where the piece ends (returned,
stored outside, held at a graph break) makes that piece run as Python.

Each test runs the program plainly and compiled, twice, and compares the results, the printed
text and the outside ``EVENTS`` log (``fxloom.bytecode.handlers.generators``).
"""

from __future__ import annotations

import contextlib
import io
import types

import pytest
import torch

import fxloom
from fxloom.bytecode.explain import explain
from fxloom.bytecode.handlers import generators

pytestmark = pytest.mark.usefixtures("one_thread")

EVENTS: list = []  # the outside log the programs below append to


class _Box:  # a plain class (SimpleNamespace has a __setattr__ of its own before 3.13)
    gen = None
    seen = 0


BOX = _Box()


def note(*what):
    EVENTS.append(what)
    return what[-1]


def _run(fn, args):
    EVENTS.clear()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            result = fn(*args)
        except Exception as error:  # the program's own exception: compared by type
            result = type(error)
    if isinstance(result, types.GeneratorType):  # a generator returned: compared by its items
        with contextlib.redirect_stdout(out):
            result = ("generator", list(result))
    return result, out.getvalue(), list(EVENTS)


def _same(got, want) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and torch.allclose(got, want)
    if isinstance(want, (list, tuple)):
        return type(got) is type(want) and len(got) == len(want) and all(map(_same, got, want))
    return got == want


def assert_as_eager(fn, *args):
    compiled = fxloom.compile(fn)
    for _ in range(2):
        want = _run(fn, args)
        got = _run(compiled, args)
        assert _same(got, want), f"compiled {got!r} != eager {want!r}"


X = torch.arange(6.0).reshape(2, 3)


# ------------------------------------------------------------------ order of effects
def test_prints_of_a_generator_expression_come_when_it_is_consumed():
    def f(x):
        gen = (print("item", i) or x * i for i in range(3))
        print("made")
        return sum(gen)

    assert_as_eager(f, X)
    assert explain(f, X).break_count == 0  # the prints run after the graph, in eager's order


def test_a_for_loop_over_a_generator_expression_interleaves_its_body_and_the_loop_s():
    def f(x):
        total = x
        for value in (note("yield", i) for i in range(3)):
            note("body", value)
            total = total + value
        return total

    assert_as_eager(f, X)


def test_a_generator_expression_reads_outside_state_set_after_it_was_made():
    def f(x):
        gen = (BOX.seen + i for i in range(3))
        BOX.seen = 10
        return x + sum(gen)

    BOX.seen = 0
    assert_as_eager(f, X)


def test_nested_generator_expressions_run_in_eager_s_order():
    def f(x):
        inner = (note("inner", i) for i in range(3))
        outer = (note("outer", j) * 2 for j in inner)
        note("made")
        return x + sum(outer)

    assert_as_eager(f, X)


def test_zip_over_a_generator_expression_advances_it_with_the_loop():
    def f(x):
        for a, b in zip((note("gen", i) for i in range(3)), "abc"):
            note("body", a, b)
        return x + 1

    assert_as_eager(f, X)


def test_map_over_a_generator_expression_advances_it_with_the_loop():
    def f(x):
        for text in map(str, (note("gen", i) for i in range(3))):
            note("body", text)
        return x + 1

    assert_as_eager(f, X)


def test_join_consumes_a_generator_expression_where_it_is_called():
    def f(x):
        gen = (note("gen", str(i)) for i in range(3))
        note("made")
        return x + len("-".join(gen))

    assert_as_eager(f, X)


def test_extending_an_outside_list_from_a_generator_expression_interleaves_as_eager():
    def f(x):
        EVENTS.extend(note("gen", i) for i in range(3))
        return x + 1

    assert_as_eager(f, X)
    assert explain(f, X).break_count == 0


def test_adding_a_generator_expression_to_an_outside_list_in_place_interleaves_as_eager():
    def f(x):
        log = EVENTS
        log += (note("gen", i) for i in range(3))
        return x + len(log)

    assert_as_eager(f, X)


def test_a_generator_expression_reading_the_list_it_extends_sees_it_grow():
    def f(x):
        EVENTS.extend(len(EVENTS) for i in range(3))
        return x + sum(EVENTS)

    assert_as_eager(f, X)


# ------------------------------------------------------------------ early stops
def test_any_stops_at_the_first_true_item():
    def f(x):
        return x + any(note("check", i) >= 1 for i in range(3))

    assert_as_eager(f, X)
    assert explain(f, X).break_count == 0


def test_all_stops_at_the_first_false_item():
    def f(x):
        return x + all(note("check", i) < 1 for i in range(3))

    assert_as_eager(f, X)


def test_a_break_out_of_a_for_loop_leaves_the_rest_unrun():
    def f(x):
        for i in (note("gen", i) for i in range(5)):
            if i == 2:
                break
        return x + i

    assert_as_eager(f, X)


# ------------------------------------------------------------------ tensors
def test_a_generator_expression_over_tensors_feeds_torch_stack_in_one_graph():
    def f(x):
        return torch.stack(list(row * 2 for row in x)) + sum(row.sin() for row in x)

    assert_as_eager(f, X)
    assert explain(f, X).break_count == 0


def test_a_generator_expression_feeds_torch_cat_through_tuple():
    def f(x):
        return torch.cat(tuple(x * k for k in range(3)))

    assert_as_eager(f, X)


# ------------------------------------------------------------------ consumed twice, partly
def test_a_generator_expression_consumed_twice_is_empty_the_second_time():
    def f(x):
        gen = (x * i for i in range(3))
        first = list(gen)
        second = list(gen)
        return first, second

    assert_as_eager(f, X)


def test_next_takes_one_item_and_the_loop_the_rest():
    def f(x):
        gen = (note("gen", i) for i in range(4))
        first = next(gen)
        note("between")
        return x + first + sum(gen)

    assert_as_eager(f, X)


def test_a_partly_consumed_generator_expression_left_unused_runs_no_further():
    def f(x):
        gen = (note("gen", i) for i in range(4))
        a, b = next(gen), next(gen)
        return x + a + b

    assert_as_eager(f, X)


def test_isinstance_of_a_generator_expression_says_generator():
    def f(x):
        gen = (i for i in range(3))
        return x + isinstance(gen, types.GeneratorType) + (type(gen) is types.GeneratorType)

    assert_as_eager(f, X)


# ------------------------------------------------------------------ exceptions
def test_an_exception_in_the_body_while_sum_iterates_raises_as_in_eager():
    def f(x):
        return x + sum(note("gen", 1 // (i - 1)) for i in range(3))

    assert_as_eager(f, X)


def test_a_graph_break_in_the_body_while_sum_iterates_keeps_eager_s_order():
    def f(x):
        note("before")
        return sum(note("gen", row.sum().item()) for row in x)

    assert_as_eager(f, X)


# ------------------------------------------------------------------ alive where the piece ends
# One with a single ``for`` clause and no closure goes on after the graph as a plain generator
# over what is left of its iterator; any other one makes that piece run as Python.
def test_a_generator_expression_alive_at_a_graph_break_goes_on_after_it():
    def f(x):
        gen = (note("gen", i) for i in range(3))
        note("item", x.sum().item())  # a graph break, the generator not yet consumed
        return x + sum(gen)

    assert_as_eager(f, X)
    assert explain(f, X).graph_count >= 1


def test_a_partly_consumed_generator_expression_alive_at_a_graph_break_goes_on_after_it():
    def f(x):
        gen = (note("gen", i) for i in range(3))
        first = next(gen)
        note("item", x.sum().item())
        return x + first + sum(gen)

    assert_as_eager(f, X)
    assert explain(f, X).graph_count >= 1


def test_a_for_loop_over_a_generator_expression_with_a_graph_break_in_its_body():
    def f(x):
        total = x
        for value in (note("gen", i) for i in range(3)):
            note("body", value)
            total = total + x.sum().item() * value
        return total

    assert_as_eager(f, X)
    assert explain(f, X).graph_count >= 1


def test_a_generator_expression_with_a_closure_alive_at_a_graph_break_runs_as_python():
    def f(x):
        k = 2
        gen = (note("gen", i * k) for i in range(3))
        note("item", x.sum().item())
        return x + sum(gen)

    assert_as_eager(f, X)


def test_a_generator_expression_of_two_for_clauses_alive_at_a_graph_break():
    def f(x):
        gen = (note("gen", i * j) for i in range(2) for j in range(2))
        first = next(gen)
        note("item", x.sum().item())
        return x + first + sum(gen)

    assert_as_eager(f, X)


def test_returning_an_unconsumed_generator_expression_returns_a_real_generator():
    def f(x):
        return (note("gen", x * i) for i in range(3))

    assert_as_eager(f, X)
    assert isinstance(fxloom.compile(f)(X), types.GeneratorType)


def test_a_generator_expression_held_by_a_variable_and_its_loop_at_a_graph_break():
    def f(x):
        total = x
        gen = (note("gen", i) for i in range(4))
        for value in gen:
            total = total + x.sum().item()
            if value == 1:
                note("rest", list(gen))  # ends the loop too: one generator, not two copies
        return total

    assert_as_eager(f, X)


def test_an_inner_generator_expression_held_apart_from_the_outer_at_a_graph_break():
    def f(x):
        inner = (note("inner", i) for i in range(4))
        outer = (v * 10 for v in inner)
        first = next(outer)
        note("item", x.sum().item())
        return x + first + next(inner) + sum(outer)

    assert_as_eager(f, X)


def test_returning_a_generator_expression_without_closure_returns_a_lazy_generator():
    def f(x):
        note("made")
        return (note("gen", i) for i in range(3))

    assert_as_eager(f, X)
    assert explain(f, X).break_count == 0


def test_a_generator_expression_stored_outside_is_a_real_generator_there():
    def f(x):
        BOX.gen = (x * i for i in range(3))
        return x + 1

    compiled = fxloom.compile(f)
    for _ in range(2):
        compiled(X)
        assert isinstance(BOX.gen, types.GeneratorType)
        assert _same(list(BOX.gen), [X * 0, X * 1, X * 2])


def test_more_items_than_max_items_is_a_break_and_runs_as_python(monkeypatch):
    monkeypatch.setattr(generators, "MAX_ITEMS", 5)

    def f(x):
        return x + sum(i for i in range(10))

    assert_as_eager(f, X)
    assert explain(f, X).break_count == 1
