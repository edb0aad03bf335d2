"""Failures the differential suite found that this branch fixes in the interpreter's
handlers, each as its smallest case over varied calls (issue 33)."""

from __future__ import annotations

import pytest

import fxloom
from differential.harness import Call, Case, run_case
from differential.variations import sequence, tensor
from fxloom.bytecode.breaks import CompileError

pytestmark = pytest.mark.usefixtures("one_thread")

# Calls that differ from the one before (numbers, sizes): correct results and a bounded cache,
# without asking that a repeated call compile nothing (see test_known_cases.py for that).
VARIED = ["numbers changed", "size changed", "aliasing"]


def calls(*variations: str) -> list[Call]:
    base = Call((tensor((3, 3), 1), tensor((3, 3), 2), 2, 1.5), label="base")
    return sequence(base, list(variations))


def assert_agrees(source: str, *variations: str) -> None:
    failure = run_case(Case(source, calls(*variations)))
    assert failure is None, str(failure)


# ------------------------------------------------------------------ class statements
def test_a_class_defined_inside_the_function_is_made_at_every_call():
    source = "def f(x, y, n, s):\n    class Local:\n        scale = 2\n    return x * Local.scale\n"
    assert_agrees(source, *VARIED)


def test_a_class_made_at_every_call_starts_with_its_own_class_attributes():
    source = """
def f(x, y, n, s):
    class Local:
        count = 0
    Local.count += n
    return x * Local.count, Local.count
"""
    assert_agrees(source, *VARIED)


def test_a_module_class_defined_inside_the_function_and_called():
    source = """
import torch


def f(x, y, n, s):
    t = x + y
    class Double(torch.nn.Module):
        def forward(self, v):
            return v * 2
    return Double()(t) - n
"""
    assert_agrees(source, *VARIED)


def test_a_class_statement_is_a_break_that_fullgraph_names():
    def f(x):
        class Local:
            scale = 2

        return x * Local.scale

    with pytest.raises(CompileError, match="a class statement in f"):
        fxloom.compile(f, fullgraph=True)(tensor((2,), 0))
