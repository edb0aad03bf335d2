"""Observed dynamism for numbers: an int or float that changes between calls becomes a symbol.

The first call guards every int and float by value (a static entry). A call where one of them
has another value makes that source symbolic (``fxloom.bytecode.dynamic``): the recompile reads
it as a ``torch.SymInt`` (or ``SymFloat``), a graph input that tensor operations take as a
scalar (``x * n``, ``x[:, :n]``, ``torch.arange(n)``), and the static entry stays in front for
the value first seen. What the program decides on the number (``if n > 3``) is guarded as a
relation; where it needs the plain value (``range(n)``, a dict key, ``str(n)``) the entry is
fixed to that value by a guard, and ``explain()`` says which line did it. Every call is
compared with eager.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from like_eager import assert_same, graphs, run_calls
from torch import nn

import fxloom

pytestmark = pytest.mark.usefixtures("one_thread")


def with_x(values: Any, *shape: int) -> list[tuple]:
    torch.manual_seed(0)
    return [(torch.randn(*shape), value) for value in values]


# ------------------------------------------------------------------ ints
def test_an_int_argument_1_to_8_compiles_two_entries():
    compiled = run_calls(lambda x, n: x * n + n, with_x(range(1, 9), 3))
    assert graphs(compiled) == 2
    assert compiled.explain().dynamic_sizes == ["n: 1 -> 2 (now symbolic)"]


def test_the_static_entry_stays_in_front_for_the_first_value():
    compiled = run_calls(lambda x, n: x + n, with_x([4, 5], 3))
    static, symbolic = sorted(compiled.cache, key=lambda entry: "_s0 := " in entry.guard_source)
    assert "L_n == " in static.guard_source
    assert "type(_s0 := L_n)" in symbolic.guard_source
    run_calls_on(compiled, with_x([4, 9, 4, -3], 3))
    assert graphs(compiled) == 2


def run_calls_on(compiled: Any, calls: list[tuple]) -> None:
    for args in calls:
        assert_same(compiled(*args), compiled.fn(*args))


def test_the_symbolic_int_is_a_graph_input():
    compiled = run_calls(lambda x, n: x * n, with_x([2, 3], 4))
    symbolic = next(e for e in compiled.cache if "_s0 := " in e.guard_source)
    placeholders = [n.name for n in symbolic.graph_module.graph.nodes if n.op == "placeholder"]
    assert placeholders == ["x", "n"]


def test_a_slice_by_an_int_that_changes():
    compiled = run_calls(lambda x, n: x[:, :n] * 2, with_x(range(1, 9), 2, 10))
    assert graphs(compiled) == 2


def test_arange_of_an_int_that_changes():
    compiled = run_calls(lambda x, n: torch.arange(n) + x.sum(), with_x(range(1, 9), 3))
    assert graphs(compiled) == 2


def test_arithmetic_on_the_int_is_computed_by_the_graph():
    def f(x, n):
        return x * (n * 2 - 1), n + 1

    compiled = run_calls(f, with_x([1, 2, 3, 7, -4], 3))
    assert graphs(compiled) == 2


def test_a_branch_on_the_int_is_a_guarded_relation():
    def f(x, n):
        if n > 3:
            return x + n
        return x - n

    compiled = run_calls(f, with_x([1, 2, 5, 6, 3, 0, 9], 3))
    # static 1; symbolic with n <= 3 (2, 3, 0); symbolic with n > 3 (5, 6, 9)
    assert graphs(compiled) == 3
    guards = compiled.explain().guards
    assert any(any(text.startswith("n > 3 (") for text in entry) for entry in guards)


def test_a_range_loop_over_the_int_is_specialised_and_explained():
    def f(x, n):
        for i in range(n):
            x = x + i
        return x

    compiled = run_calls(f, with_x([1, 2, 3, 2], 3))
    assert graphs(compiled) == 3  # one per value: the loop's length shapes the graph
    why = compiled.explain().why_static
    assert why and all("for i in range(n)" in line for line in why)
    assert why[0].startswith("n == 2: test_scalar_promotion.py:")


def test_an_int_used_as_a_dict_key_is_specialised():
    def f(x, n):
        table = {n: x}
        return table[n] * 2

    compiled = run_calls(f, with_x([1, 2, 3, 2], 3))
    report = compiled.explain()
    assert report.break_count == 0
    assert report.why_static[0].startswith("n == 2: ")
    assert "table = {n: x}" in report.why_static[0]


def test_an_int_hashed_into_sets_and_dicts_the_program_makes_is_specialised():
    def f(x, n):
        seen = {n, 0}
        seen.add(n + 1)
        table: dict = {}
        table.setdefault(n, 1)
        return x * (len(seen) + table.get(n, 0) + (n in seen))

    compiled = run_calls(f, with_x([1, 2, 3, 2], 3))
    assert compiled.explain().break_count == 0


def test_an_int_added_to_an_outside_set_is_specialised():
    seen: set = set()

    def f(x, n):
        seen.add(n)
        return x * n

    compiled = fxloom.compile(f)
    for n in (1, 2, 3, 2):
        assert_same(compiled(torch.ones(2), n), torch.ones(2) * n)
    assert seen == {1, 2, 3}
    assert compiled.explain().break_count == 0


def test_an_int_made_a_string_is_specialised():
    compiled = run_calls(lambda x, n: x + len(str(n)), with_x([1, 2, 30, 2], 3))
    assert compiled.explain().why_static[0].startswith("n == 2: ")


def test_an_int_formatted_by_native_code_is_its_value():
    def f(x, n):
        return x, str([n, 1]), ",".join(map(str, (n, 2))), str({"n": n})

    compiled = run_calls(f, with_x([1, 2, 3, 2], 3))
    assert compiled.explain().why_static[0].startswith("n == 2: ")


def test_an_int_in_a_dict_argument_read_through_a_native_key_function():
    weights = {"a": 3, "b": 1, "c": 2}

    def ranked(x, table):
        best = max(table, key=table.get)
        return x + ord(best) + sum(table.values())

    calls = []
    for weight in (1, 10, 1, 5):
        calls.append((torch.zeros(1), {**weights, "b": weight}))
    compiled = run_calls(ranked, calls)
    assert compiled.explain().break_count == 0


def test_a_changed_global_counter_is_replayed_when_the_graph_raises():
    namespace: dict[str, Any] = {"CALLS": 0}
    exec(  # a module's global, written by the program
        "def f(x, y):\n    global CALLS\n    CALLS += 1\n    x.add_(y)\n    return x\n",
        namespace,
    )
    compiled = fxloom.compile(namespace["f"])
    x, y = torch.randn(2, 2), torch.randn(2, 2)
    for _ in range(3):
        compiled(x, y)
    assert namespace["CALLS"] == 3
    with pytest.raises(RuntimeError, match="single memory location"):
        compiled(x.t(), x)  # the graph raises; CALLS += 1 came before, as in eager
    assert namespace["CALLS"] == 4 and type(namespace["CALLS"]) is int


def test_bool_stays_static():
    compiled = run_calls(lambda x, flag: x + 1 if flag else x - 1, with_x([True, False, True], 3))
    assert graphs(compiled) == 2
    assert compiled.explain().dynamic_sizes == []


def test_an_int_promotion_with_a_size_promotion():
    def f(x, n):
        return x[:, :n].sum(1) * x.shape[0]

    calls = [(torch.randn(b, 10), n) for b, n in ((2, 1), (3, 2), (4, 3), (5, 5), (2, 7))]
    compiled = run_calls(f, calls)
    assert graphs(compiled) == 2
    assert compiled.explain().dynamic_sizes == [
        "x.shape[0]: 2 -> 3 (now symbolic)",
        "n: 1 -> 2 (now symbolic)",
    ]


# ------------------------------------------------------------------ module int attributes
class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.step = 0

    def forward(self, x):
        self.step += 1
        return x * self.step


def agrees_in_state(cls: type, attribute: str, calls: int):
    """Compile a ``cls()``, call it and an eager ``cls()`` ``calls`` times: the results and the
    ``attribute`` each keeps (value and type) agree after every call. Returns the compiled."""
    torch.manual_seed(0)
    module, eager = cls(), cls()
    compiled = fxloom.compile(module)
    for _ in range(calls):
        x = torch.randn(3)
        assert_same(compiled(x), eager(x))
        ours, theirs = getattr(module, attribute), getattr(eager, attribute)
        assert ours == theirs and type(ours) is type(theirs)
    return compiled


def test_a_counter_attribute_the_program_increments_is_symbolic_from_its_first_compile():
    # The first call changes self.step itself: the next call brings another value, so the
    # entry takes it as a symbol at once rather than compiling a static entry first.
    compiled = agrees_in_state(Counter, "step", 8)
    assert graphs(compiled) == 1
    assert compiled.explain().dynamic_sizes == [
        "self.step: 0 -> 1 (now symbolic: the program changes it)"
    ]


class Reset(nn.Module):
    """Sets an int attribute to the same value at every call: no change to observe."""

    def __init__(self) -> None:
        super().__init__()
        self.mode = 3

    def forward(self, x):
        self.mode = 3
        return x * self.mode


def test_an_attribute_written_back_unchanged_stays_static():
    compiled = run_calls(Reset(), [(torch.randn(3),) for _ in range(3)])
    assert graphs(compiled) == 1
    assert compiled.explain().dynamic_sizes == []


class Toggle(nn.Module):
    """Flips a bool attribute at every call: a bool is structure, never a symbol."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def forward(self, x):
        self.flag = not self.flag
        return x * 2 if self.flag else x - 1


def test_a_bool_attribute_the_program_flips_stays_static():
    assert graphs(agrees_in_state(Toggle, "flag", 4)) == 2


# ------------------------------------------------------------------ floats
def test_a_float_argument_over_8_values_compiles_two_entries():
    values = [0.5, 1.5, 2.25, -1.0, 3.0, 0.1, 7.7, 1e-3]
    compiled = run_calls(lambda x, s: x * s + s / 3, with_x(values, 3))
    assert graphs(compiled) == 2
    assert compiled.explain().dynamic_sizes == ["s: 0.5 -> 1.5 (now symbolic)"]


def test_a_float_scales_an_int_tensor_as_eager_does():
    # a Python float keeps int * float at the default dtype (a 0-d float64 tensor would not)
    calls = [(torch.arange(6), s) for s in (0.5, 1.5, 2.5)]
    compiled = run_calls(lambda x, s: x * s, calls)
    assert graphs(compiled) == 2


def test_a_branch_on_a_float_is_guarded_without_rounding():
    def f(x, s):
        if s > 1.0:
            return x * s
        return x - s

    # 1.5 > 1.0 and 1.25 > 1.0: one entry serves both (no integer range ``s >= 2``)
    compiled = run_calls(f, with_x([0.5, 1.5, 1.25, 3.0, 0.75, 1.0, -2.0], 3))
    assert graphs(compiled) == 3


def test_float_arithmetic_returns_eagers_bits_exactly():
    # sympy would fold s * 0.1 * 3 into 0.3*s and n / 3 + n / 7 into 10*n/21, which round
    # differently: such chains are fixed to their values (a guard); one operation stays symbolic
    def f(x, s, n):
        return x, s * 0.1 * 3, (s + 0.1) + 0.2, n / 3 + n / 7, s / 3, n / 7, -s

    values = [(0.7, 3), (1.3, 5), (2.9, 7), (0.7, 3), (7.1, 11)]
    compiled = fxloom.compile(f)
    for s, n in values:
        got, expected = compiled(torch.zeros(1), s, n), f(torch.zeros(1), s, n)
        assert got[1:] == expected[1:]  # exactly, and the same types
        assert [type(v) for v in got[1:]] == [type(v) for v in expected[1:]]
    assert any(line.startswith("s == ") for line in compiled.explain().why_static)


def test_a_branch_on_a_float_computed_from_the_argument_is_decided_as_eager():
    def f(x, s):
        return x * 2 if s / 3 > 1 else x - 1

    # s / 3 > 1 must not become s > 3 (they differ where s / 3 rounds to 1.0): a comparison
    # of a float computed from s fixes s to its value, and explain() says where
    compiled = run_calls(f, with_x([1.5, 3.0000000000000004, 3.0, 4.5, 2.0], 3))
    assert any("s / 3 > 1" in line for line in compiled.explain().why_static)


def test_infinite_and_nan_floats_are_never_symbolic():
    # sympy's algebra takes symbols as finite (s - s == 0); inf - inf is nan
    def f(x, s):
        return x + (s - s), s * 0

    values = [1.0, 2.0, float("inf"), 3.0, float("-inf"), float("nan"), 4.0]
    compiled = fxloom.compile(f)
    for s in values:
        got, expected = compiled(torch.zeros(1), s), f(torch.zeros(1), s)
        torch.testing.assert_close(got[0], expected[0], equal_nan=True)
        assert repr(got[1]) == repr(expected[1])


def test_a_float_passed_to_math_is_specialised():
    import math

    compiled = run_calls(lambda x, s: x * math.sqrt(s), with_x([4.0, 9.0, 2.0, 9.0], 3))
    assert compiled.explain().why_static[0].startswith("s == 9.0: ")


STEPS = 0


def global_counter(x):
    global STEPS
    STEPS += 1
    return x * STEPS


def test_a_global_counter_the_program_increments_is_symbolic_from_its_first_compile():
    global STEPS
    STEPS = 0
    compiled = fxloom.compile(global_counter)
    for _ in range(5):
        x = torch.randn(3)
        got = compiled(x)
        assert_same(got, x * STEPS)
        assert type(STEPS) is int
    assert graphs(compiled) == 1
    assert compiled.explain().dynamic_sizes == [
        "STEPS: 0 -> 1 (now symbolic: the program changes it)"
    ]


def test_a_nonlocal_counter_is_symbolic_from_its_first_compile():
    def counting():
        calls = 0

        def step(x):
            nonlocal calls
            calls += 1
            return x + calls

        return step

    compiled, eager = fxloom.compile(counting()), counting()
    for _ in range(5):
        x = torch.randn(3)
        assert_same(compiled(x), eager(x))
    assert graphs(compiled) == 1
