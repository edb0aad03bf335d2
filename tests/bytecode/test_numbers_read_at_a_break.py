"""A number the program reads from a tensor at a graph break (``float(t)``, ``int(t)``; an
``.item()`` whose number Python needs, test_numbers_kept_in_the_graph.py) is data, another
value at every call: the piece after the break takes it as a symbol from its first
compile, so the second call does not recompile. What the program decides on the number (a
branch, ``range``, a string) still specialises it by a guard: never a stale result.
"""

from __future__ import annotations

import torch

import fxloom
from tests.bytecode.like_eager import assert_same, graphs, run_calls

CALLS = [(torch.randn(4) + i,) for i in (0.0, 3.0, -3.0, 7.0)]


def scaled_by_its_sum(x):
    total = float(x.sum())  # a break: total is a Python float
    return x * total + 1


def test_a_number_read_at_a_break_compiles_once():
    compiled = run_calls(scaled_by_its_sum, CALLS)
    assert graphs(compiled) == 2  # one each side of the break, for every call
    assert any("read from a tensor" in line for line in compiled.explain().dynamic_sizes)


def under_no_grad(x):
    with torch.no_grad():
        y = x * 2
        m = float(y.abs().max())
        y = y / m
    return y * 2


def test_a_number_read_inside_no_grad_compiles_once():
    compiled = run_calls(under_no_grad, CALLS)
    assert graphs(compiled) == 2


def handed_on_through_pieces(x):
    m = float(x.abs().max())
    y = x / m
    n = float(y.sum())  # a second break: m reaches the third piece through the second
    return y * m + n


def test_a_number_handed_on_to_later_pieces_stays_symbolic():
    compiled = run_calls(handed_on_through_pieces, CALLS)
    assert graphs(compiled) == 3


def branches_on_it(x):
    m = x.sum().item()
    if m > 0:  # a branch on the number: guarded, each side its own entry
        return x * 2
    return x - 1


def test_a_branch_on_the_number_is_still_guarded():
    compiled = run_calls(branches_on_it, CALLS)
    positive, negative = torch.ones(3), -torch.ones(3)
    assert_same(compiled(negative), branches_on_it(negative))
    assert_same(compiled(positive), branches_on_it(positive))


def loops_over_it(x):
    n = int(x.abs().sum().item()) % 4
    for _ in range(n):  # range needs the plain value: specialised by a guard
        x = x * 2
    return x


def test_a_loop_bound_read_at_a_break_is_specialised_by_a_guard():
    run_calls(loops_over_it, CALLS + [(torch.ones(4),), (torch.ones(4) / 4,)])


def formats_it(x):
    m = round(x.sum().item(), 1)
    return x + 1, f"sum {m}"


def test_a_number_made_into_text_is_its_value():
    run_calls(formats_it, CALLS)


def test_dynamic_false_keeps_it_static():
    compiled = run_calls(scaled_by_its_sum, CALLS, dynamic=False)
    assert graphs(compiled) > 2
    report = compiled.explain()
    assert not any("read from a tensor" in line for line in report.dynamic_sizes)


def test_eager_value_types_are_kept():
    def as_int(x):
        n = int(x.sum().item() > 0)  # an int from a tensor
        return x * n, type(n)

    compiled = fxloom.compile(as_int)
    for (x,) in CALLS:
        assert_same(compiled(x), as_int(x))
