"""Failures the differential suite found that this branch fixes in the interpreter's
handlers, each as its smallest case over varied calls (issue 33)."""

from __future__ import annotations

import contextlib

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


# ------------------------------------------------------------------ context managers
CONTEXT = """
import contextlib

LOG = []


@contextlib.contextmanager
def tag():
    LOG.append("enter")
    yield
    LOG.append("exit")

"""


def test_a_contextmanager_enters_and_exits_at_every_call():
    body = "def f(x, y, n, s):\n    with tag():\n        y = x * 2\n    return y\n"
    assert_agrees(CONTEXT + body, "again", *VARIED)


def test_a_contextmanager_body_with_a_graph_break_runs_at_every_call():
    body = "def f(x, y, n, s):\n    with tag():\n        k = x.sum().item()\n    return x * k\n"
    assert_agrees(CONTEXT + body, "again", *VARIED)


def test_a_contextmanager_sees_the_exception_its_body_raises():
    body = """
def f(x, y, n, s):
    with contextlib.suppress(ValueError):
        with tag():
            if n == 3:
                raise ValueError("three")
            x = x + n
    return x
"""
    assert_agrees(CONTEXT + body, "again", "ints swept")


def test_a_null_context_is_captured_without_a_break():
    def f(x):
        with contextlib.nullcontext():
            return x * 2

    compiled = fxloom.compile(f)
    compiled(tensor((2,), 0))
    assert compiled.explain().break_count == 0


def test_a_with_block_over_a_standard_library_manager_is_a_break_that_fullgraph_names():
    import warnings

    def f(x):
        with warnings.catch_warnings():
            return x * 2

    with pytest.raises(CompileError, match="with catch_warnings"):
        fxloom.compile(f, fullgraph=True)(tensor((2,), 0))
