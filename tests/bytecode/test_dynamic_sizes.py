"""Observed dynamism: a tensor size that changes between calls recompiles once, as a symbol.

The first call compiles a static entry; a call whose tensor has another size makes that
dimension symbolic (``fxloom.bytecode.dynamic``), and the entry compiled then serves every
size its guard admits: the guard checks what the program decided on the size (``if
x.shape[0] > 3``, a view's divisibility), and the graph computes the sizes it uses from its
inputs. Where the program needs the size as a plain number (``int(n)``, native code) the entry
is fixed to that value by a guard, and ``explain()`` says which line did it. Every test
compares each call with eager.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from like_eager import assert_same, graphs, run_calls
from torch import nn

import fxloom

pytestmark = pytest.mark.usefixtures("one_thread")


def rows(*sizes: int, columns: int = 8) -> list[tuple]:
    return [(torch.randn(size, columns),) for size in sizes]


# ------------------------------------------------------------------ observed dynamism
def test_an_mlp_over_batch_2_1_3_1_4_compiles_two_entries():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    compiled = run_calls(mlp, rows(2, 1, 3, 1, 4))
    assert graphs(compiled) == 2
    assert compiled.explain().dynamic_sizes == ["input.shape[0]: 2 -> 1 (now symbolic)"]


def test_the_first_call_is_static_and_stays_in_front_for_its_size():
    compiled = run_calls(lambda x: x * 2, rows(2, 3))
    static, symbolic = compiled.cache
    assert "x.shape == " in static.guard_source
    assert "_s0 := " in symbolic.guard_source
    run_calls_on(compiled, rows(2, 5, 9))
    assert graphs(compiled) == 2


def run_calls_on(compiled: Any, calls: list[tuple]) -> None:
    for args in calls:
        assert_same(compiled(*args), compiled.fn(*args))


def test_a_branch_on_the_batch_size_is_guarded_on_every_call():
    def f(x):
        if x.shape[0] > 3:
            return x * 2
        return x - 1

    compiled = run_calls(f, rows(2, 5, 6, 3, 1, 4, 9, 0))
    # static 2; symbolic with x.shape[0] > 3 (5, 6, 4, 9); symbolic with <= 3 (3, 1, 0)
    assert graphs(compiled) == 3
    report = compiled.explain()
    assert any(any("x.shape[0] > 3" in text for text in entry) for entry in report.guards)
    # the miss at size 3 names the condition and the line that decided it
    assert report.recompiles[1].startswith("x.shape[0] > 3 (test_dynamic_sizes.py:")


def test_a_view_by_the_batch_size_is_computed_from_the_input():
    def f(x):
        return x.view(x.shape[0], -1).sum(1)

    compiled = run_calls(f, [(torch.randn(n, 3, 4),) for n in (2, 5, 1, 7)])
    assert graphs(compiled) == 2
    assert "sym_size" in compiled.code  # the graph reads the size, not a constant


def test_a_reduction_over_a_dimension_that_changes():
    def f(x):
        return x.sum(dim=1) + x.mean(1) * x.shape[1]

    compiled = run_calls(f, [(torch.randn(3, n),) for n in (2, 5, 1, 7, 4)])
    assert graphs(compiled) == 2


def test_two_inputs_of_one_size_stay_one_entry():
    compiled = run_calls(
        lambda x, y: x + y, [(torch.randn(n, 2), torch.randn(n, 2)) for n in (2, 5, 3, 1)]
    )
    assert graphs(compiled) == 2


def test_a_size_of_one_broadcast_against_another_size():
    # y's first size is 1 on some calls: eager broadcasts it; the entry guards how it did.
    calls = [(torch.randn(2, 2), torch.randn(n, 2)) for n in (2, 1, 2, 1)]
    run_calls(lambda x, y: x + y, calls)


# ------------------------------------------------------------------ sizes as plain numbers
def test_int_of_a_size_fixes_the_entry_to_it_and_explain_says_why():
    def f(x):
        n = int(x.shape[0])
        return x * n

    compiled = run_calls(f, rows(2, 5, 3, 5))
    report = compiled.explain()
    assert report.graph_count == 3  # 2 static, then one entry per size int() fixed
    assert any("n = int(x.shape[0])" in line for line in report.why_static)
    assert "why static: x.shape[0] == " in str(report)


def test_a_range_over_a_size_is_unrolled_for_that_size():
    def f(x):
        y = x
        for i in range(x.shape[0]):
            y = y + i
        return y

    run_calls(f, rows(2, 5, 3, 5))


def test_a_size_given_to_native_code_is_fixed_by_a_guard():
    def f(x):
        return x / math.sqrt(x.shape[-1])

    compiled = run_calls(f, [(torch.randn(2, n),) for n in (4, 9, 16, 9)])
    assert compiled.explain().why_static


def test_a_returned_size_is_computed_by_the_graph():
    def f(x):
        return x + 1, x.shape[0] * 2, x.shape

    compiled = run_calls(f, rows(2, 5, 3))
    assert graphs(compiled) == 2
    assert not compiled.explain().why_static


def test_a_formatted_size_is_its_value():
    def f(x):
        return x * len(f"{x.shape[0]}")

    run_calls(f, rows(2, 5, 13, 7))


def test_a_size_is_an_int_to_the_program():
    def f(x):
        n = x.shape[0]
        return x * 2 if isinstance(n, int) and type(n) is int else x

    compiled = run_calls(f, rows(2, 5, 3))
    assert graphs(compiled) == 2


def test_factories_of_a_symbolic_size():
    def f(x):
        return torch.zeros(x.shape[0], 3) + x.sum(1, keepdim=True)

    compiled = run_calls(f, rows(2, 5, 3, 1))
    assert graphs(compiled) == 2


def test_pieces_after_a_graph_break_make_sizes_symbolic_too():
    def f(x):
        y = x * 2
        if y.sum() > 0:  # a break: each branch is a piece
            return y.view(y.shape[0], -1) + 1
        return y - 1

    calls = [(torch.rand(n, 3, 2) * sign,) for n in (2, 5, 3, 1, 4) for sign in (1, -1)]
    compiled = run_calls(f, calls)
    assert graphs(compiled) == 6  # start and each branch: static, then symbolic


# ------------------------------------------------------------------ dynamic=
def test_dynamic_true_makes_every_size_symbolic_from_the_first_call():
    compiled = run_calls(lambda x: x * 2, rows(2, 5, 3, 1), dynamic=True)
    assert graphs(compiled) == 1
    assert compiled.explain().dynamic_sizes == []


def test_dynamic_false_keeps_every_size_static():
    compiled = run_calls(lambda x: x * 2, rows(2, 5, 3), dynamic=False)
    assert graphs(compiled) == 3


def test_dynamic_takes_none_true_or_false():
    with pytest.raises(TypeError, match="dynamic"):
        fxloom.compile(lambda x: x, dynamic="yes")


def test_a_module_takes_dynamic_true():
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    compiled = run_calls(model, rows(2, 5, 1), dynamic=True)
    assert graphs(compiled) == 1


# ------------------------------------------------------------------ a Hugging Face model
def test_a_tiny_bert_over_sequence_lengths_5_7_9():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
    )
    model = transformers.BertModel(config).eval()
    compiled = fxloom.compile(model)
    with torch.no_grad():
        for length in (5, 7, 9):
            ids = torch.randint(0, 100, (1, length))
            got, expected = compiled(ids), model(ids)
            torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state)
            torch.testing.assert_close(got.pooler_output, expected.pooler_output)
    report = compiled.explain()
    assert (report.graph_count, report.break_count) == (2, 0)
    assert report.dynamic_sizes == ["args[0].shape[1]: 5 -> 7 (now symbolic)"]
