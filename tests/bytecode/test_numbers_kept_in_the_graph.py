"""``.item()`` whose number the program only computes with stays in the graph: no break.

The graph reads the number (a ``call_method item`` node) and the operators that use it take
it from there; capture holds a symbol with no example. Only where the program's Python
needs the number itself (a branch, ``int()``, ``math.sqrt``, a string) does capture break,
at that line, handing the number on to the next piece as a symbol (it is data: another
value at every call). Sizes that would depend on such a number (``torch.zeros(n)``) make
the ``.item()`` a break as before, since no guard could check them before the call.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import fxloom
from tests.bytecode.like_eager import graphs, run_calls

CALLS = [(torch.randn(4) + shift,) for shift in (0.0, 3.0, -3.0, 7.0, -1.0)]


def normalised(x):
    return x / (x.abs().max().item() + 1)


def test_an_item_only_computed_with_is_read_by_the_graph():
    compiled = run_calls(normalised, CALLS)
    report = compiled.explain()
    assert (graphs(compiled), report.break_count) == (1, 0)
    (entry,) = compiled.cache
    assert any(
        node.op == "call_method" and node.target == "item"
        for node in entry.graph_module.graph.nodes
    )


def test_the_item_breaks_of_issue_35_compile_one_graph_each():
    torch.manual_seed(0)
    linear = nn.Linear(4, 4)

    def closure(x):
        scale = 2.0
        shifted = lambda t: t * scale  # noqa: E731 - a closure over a cell of the function
        scale = x.sum().item()
        return shifted(x) + 1

    def under_no_grad(x):
        with torch.no_grad():
            y = linear(x)
            y = y / y.max().item()
        return y * 2

    def under_autocast(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = linear(x)
            y = linear(y / y.float().abs().max().item())
        return y.float()

    inputs = [(torch.randn(2, 4) + shift,) for shift in (0.0, 1.0, 2.0)]
    for fn in (closure, under_no_grad, under_autocast):
        assert graphs(run_calls(fn, inputs)) == 1, fn.__name__


def test_a_branch_on_an_item_breaks_at_the_branch_and_hands_the_number_on_as_a_symbol():
    def branch(x):
        m = x.sum().item()
        if m > 0:
            return x * 2 + m
        return x * 3 - m

    calls = [(torch.randn(4) + shift,) for shift in (-5.0, 5.0, -3.0, 4.0, 7.0, -1.0)]
    compiled = run_calls(branch, calls)
    # the piece up to the branch, and one piece for each side of it, whatever m is
    assert graphs(compiled) == 3
    (stop,) = compiled.explain().breaks
    assert stop.code == "if m > 0:" and "depends on tensor data" in stop.detail


@pytest.mark.parametrize(
    "fn, needs",
    [
        (lambda x: x * int(x.sum().item()), "int()"),
        (lambda x: x * math.sqrt(x.abs().sum().item()), "math.sqrt"),
        (lambda x: x * len(f"{x.sum().item():.3f}"), "a format"),
    ],
)
def test_python_that_needs_the_number_breaks_where_it_does(fn, needs):
    compiled = run_calls(fn, [(torch.ones(3) * k,) for k in (1.0, 2.0, 3.0)])
    (stop,) = compiled.explain().breaks
    assert "as a Python number" in stop.detail, needs


def test_an_item_that_becomes_a_size_breaks_at_the_item_and_compiles_once_per_piece():
    def zeros_of(x):
        n = x.abs().max().long().item()
        return torch.zeros(n) + 1, x * n

    compiled = run_calls(zeros_of, [(torch.tensor([1.0, 2.0, 3.0]) * k,) for k in (1, 2, 3)])
    (stop,) = compiled.explain().breaks
    assert "item" in stop.detail
    assert graphs(compiled) == 2  # before the break, and after it with n a symbol


def test_a_returned_or_stored_item_is_the_python_number_eager_gives():
    class Keeps(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.last = 0.0

        def forward(self, x):
            self.last = x.sum().item()
            return x * self.last, x.mean().item()

    module, eager = Keeps(), Keeps()
    compiled = fxloom.compile(module)
    for (x,) in CALLS:
        (got, mean), (expected, eager_mean) = compiled(x), eager(x)
        torch.testing.assert_close(got, expected)
        assert type(mean) is float and mean == eager_mean
        assert type(module.last) is float and module.last == eager.last
    assert graphs(compiled) == 1


LOG: list = []


class Tracker:
    def __enter__(self):
        LOG.append("enter")
        return self

    def __exit__(self, kind, value, traceback):
        LOG.append(("exit", kind))
        return False


def test_an_item_in_a_user_manager_with_no_op_that_raises_is_one_graph():
    def f(x):
        with Tracker():
            y = x * 2
            y = y - y.sum().item()
        return y

    LOG.clear()
    compiled = run_calls(f, CALLS)
    assert graphs(compiled) == 1
    assert LOG == ["enter", ("exit", None)] * (2 * len(CALLS))  # compiled and eager, once each


def test_float_arithmetic_on_an_item_gives_eagers_bits():
    # sympy would fold ``m * 0.1 * 3`` into ``0.3 * m`` (other bits): the chain breaks instead
    def chained(x):
        m = x.sum().item()
        k = m * 0.1 * 3
        return x * k, k

    compiled = fxloom.compile(chained)
    for shift in (0.0, 1.0, 2.0):
        x = torch.randn(5, dtype=torch.float64) + shift
        (got, k), (expected, eager_k) = compiled(x), chained(x)
        assert torch.equal(got, expected) and k == eager_k
    assert {stop.kind for stop in compiled.breaks} == {"tensor-data"}
