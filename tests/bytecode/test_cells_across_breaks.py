"""Cells across graph breaks: a function whose variables its own closures capture is split at
a break like any other.

The first piece makes the call's cells (real ``types.CellType`` objects, once per call) and
hands them on with the locals (``Next.cells``); every later piece, and the break's own
instruction run as Python, reads and writes those same cells, and the closures the call
makes close over them, as in eager. Each test compares with eager over several calls and
checks that something compiles.
"""

from __future__ import annotations

import pytest
import torch

import fxloom

pytestmark = pytest.mark.usefixtures("one_thread")


def compiled_agrees(fn, *calls) -> object:
    """``fxloom.compile(fn)`` on each call's arguments gives eager's result."""
    compiled = fxloom.compile(fn)
    for args in calls:
        torch.testing.assert_close(compiled(*args), fn(*args))
    return compiled


def all_compiled(compiled) -> bool:
    """Every piece compiled: no part of a call runs as Python (beyond the breaks' own)."""
    return compiled.eager_reason is None and not compiled.as_python


def ones(n: int) -> torch.Tensor:
    return torch.arange(float(n))


def test_a_closure_made_before_the_break_sees_a_write_made_after_it():
    def f(x):
        scale = 2
        g = lambda t: t * scale  # noqa: E731
        n = float(x.sum())
        scale = n
        return g(x)

    compiled = compiled_agrees(f, (ones(3),), (ones(3),), (ones(4),))
    assert compiled.explain().graph_count >= 1
    assert all_compiled(compiled)


def test_nonlocal_writes_before_and_after_the_break_add_up():
    def f(x):
        total = 0

        def add(v):
            nonlocal total
            total = total + v

        add(1)
        n = float(x.sum())
        add(2)
        return x * total + n

    compiled = compiled_agrees(f, (ones(3),), (ones(3),), (ones(5),))
    assert compiled.explain().graph_count >= 1
    assert all_compiled(compiled)


def test_the_break_run_as_python_reads_the_cell_the_piece_before_wrote():
    def f(x):
        scale = 1
        h = lambda t: float(t.sum()) * scale  # noqa: E731 - the call breaks: runs as Python
        scale = 3
        n = h(x)
        return x * n

    compiled = compiled_agrees(f, (ones(3),), (ones(3),))
    assert compiled.explain().graph_count >= 1
    assert all_compiled(compiled)


def test_a_returned_closure_keeps_its_own_cell_per_call():
    def make(x):
        count = 0

        def bump():
            nonlocal count
            count += 1
            return count

        n = float(x.sum())
        bump()
        return bump, x * n

    compiled = fxloom.compile(make)
    first, out = compiled(ones(3))
    torch.testing.assert_close(out, make(ones(3))[1])
    second, _ = compiled(ones(3))
    assert (first(), first(), second()) == (2, 3, 2)  # each call's own cell, as in eager
    assert compiled.explain().graph_count >= 1
    assert all_compiled(compiled)


def test_a_returned_closure_reads_a_tensor_the_graph_computed_after_the_break():
    def f(x):
        k = x * 2
        n = float(x.sum())
        k = k + n

        def get():
            return k

        return get

    compiled = fxloom.compile(f)
    for size in (3, 3, 4):
        torch.testing.assert_close(compiled(ones(size))(), f(ones(size))())
    assert compiled.explain().graph_count >= 1
    assert all_compiled(compiled)


def test_a_closure_called_in_a_loop_across_breaks():
    def f(x):
        acc = x * 0

        def step(t):
            nonlocal acc
            acc = acc + t

        for i in range(3):
            step(x * i)
            if float(x.sum()) > 100:  # a break at every step
                break
        return acc

    compiled = compiled_agrees(f, (ones(3),), (ones(3),), (ones(4),))
    assert compiled.explain().graph_count >= 1
    assert all_compiled(compiled)


def test_an_argument_captured_by_a_closure_crosses_the_break():
    def f(x, w):
        g = lambda t: t @ w  # noqa: E731 - ``w`` is a parameter in a cell
        n = float(x.sum())
        w = w * n
        return g(x)

    compiled = compiled_agrees(f, (ones(3), torch.eye(3)), (ones(3), torch.eye(3)))
    assert compiled.explain().graph_count >= 1
    assert all_compiled(compiled)


def test_the_closure_of_the_compiled_function_and_its_own_cells_together():
    offset = torch.ones(3)

    def f(x):
        scale = 2
        g = lambda t: t * scale + offset  # noqa: E731
        n = float(x.sum())
        scale = n
        return g(x)

    compiled = compiled_agrees(f, (ones(3),), (ones(3),))
    assert compiled.explain().graph_count >= 1
    assert all_compiled(compiled)


def test_a_recursive_nested_function_in_a_cell_compiles_once():
    def f(x):
        def fact(n):
            return 1 if n <= 1 else n * fact(n - 1)

        k = float(x.sum())
        return x * fact(3) + k

    compiled = compiled_agrees(f, (ones(3),), (ones(3),), (ones(3),))
    assert compiled.explain().graph_count == 2  # one piece each side of the break
    assert all_compiled(compiled)


def test_closures_calling_closures_across_the_break_compile_once():
    def f(x):
        scale = 2

        def helper(t):
            return t * scale

        def outer(t):
            return helper(t) + 1

        k = float(x.sum())
        scale = 3
        return outer(x) + k

    compiled = compiled_agrees(f, (ones(3),), (ones(3),), (ones(3),))
    assert compiled.explain().graph_count == 2
    assert all_compiled(compiled)


def test_a_closure_made_after_the_break_over_the_calls_cells():
    def f(x):
        n = float(x.sum())
        scale = n
        fn = lambda t: t * scale  # noqa: E731
        scale = scale + 1
        return fn

    compiled = fxloom.compile(f)
    for size in (3, 3):
        torch.testing.assert_close(compiled(ones(size))(ones(2)), f(ones(size))(ones(2)))
    assert compiled.explain().graph_count == 2


def test_a_list_in_a_cell_appended_to_on_both_sides_of_the_break_compiles_once():
    def f(x):
        items = []
        add = lambda v: items.append(v)  # noqa: E731
        add(x * 2)
        n = float(x.sum())
        add(x + n)
        return sum(items), len(items)

    compiled = fxloom.compile(f)
    for _ in range(3):
        got, want = compiled(ones(3)), f(ones(3))
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1]
    assert compiled.explain().graph_count == 2  # the call's own list: no identity guard
