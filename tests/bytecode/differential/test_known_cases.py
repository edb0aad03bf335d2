"""The distinct failures the differential suite found on main, each as its smallest case.

Each is a strict xfail naming its kind and the part of issue 33 that fixes it: when a fix
lands, the case passes, the xfail turns into a failure, and the marker comes off (the case
stays, as the regression test). The generator's families that draw these are left out of
the CI slice (``run.KNOWN_FAILING``); the long run measures how often each one fails.
"""

from __future__ import annotations

import pytest

from differential.harness import Call, Case, run_case
from differential.variations import sequence, tensor

pytestmark = pytest.mark.usefixtures("one_thread")


def calls(*variations: str) -> list[Call]:
    base = Call((tensor((3, 3), 1), tensor((3, 3), 2), 2, 1.5), label="base")
    return sequence(base, list(variations))


def known(kind: str, owner: str):
    return pytest.mark.xfail(strict=True, reason=f"{kind} ({owner})")


def assert_agrees(source: str, *variations: str, write_only: frozenset = frozenset()) -> None:
    failure = run_case(Case(source, calls(*variations), write_only=write_only))
    assert failure is None, str(failure)


# ------------------------------------------------------------------ unguarded values
def test_next_of_a_global_counter_advances_at_every_call():
    source = "import itertools\nCOUNTER = itertools.count()\n\n\ndef f(x, y, n, s):\n    return x + next(COUNTER)\n"
    assert_agrees(source, "again")


def test_an_enum_setting_changed_between_calls_takes_the_other_branch():
    source = """
import enum


class Mode(enum.Enum):
    A = 1
    B = 2


SETTING = Mode.A


def f(x, y, n, s):
    if SETTING is Mode.A:
        return x + 1
    return x - 1
"""
    assert_agrees(source, "state advanced")


def test_a_set_membership_changed_between_calls_takes_the_other_branch():
    source = 'ACTIVE = {"a"}\n\n\ndef f(x, y, n, s):\n    if "b" in ACTIVE:\n        return x + 1\n    return x - 1\n'
    assert_agrees(source, "state advanced")


def test_a_numpy_round_trip_follows_new_input_values():
    source = "import torch\n\n\ndef f(x, y, n, s):\n    return torch.from_numpy(x.numpy() * 2)\n"
    assert_agrees(source, "aliasing")


def test_a_numpy_mean_follows_new_input_values():
    source = (
        "import numpy as np\n\n\ndef f(x, y, n, s):\n    return x * float(np.mean(x.numpy()))\n"
    )
    assert_agrees(source, "aliasing")


# ------------------------------------------------------------------ recompiles
def test_appending_to_a_global_list_compiles_once():
    source = "LOG = []\n\n\ndef f(x, y, n, s):\n    LOG.append(n)\n    return x + y\n"
    assert_agrees(source, "again", write_only=frozenset({"LOG"}))


def test_appending_a_tensor_to_a_global_list_compiles_once():
    source = "SEEN = []\n\n\ndef f(x, y, n, s):\n    SEEN.append(x)\n    return x + y\n"
    assert_agrees(source, "again", write_only=frozenset({"SEEN"}))


# ------------------------------------------------------------------ ordering and replay
def test_a_print_before_an_op_that_raises_is_still_printed():
    source = 'def f(x, y, n, s):\n    print("before")\n    y.add_(x)\n    return y\n'
    assert_agrees(source, "view and base")  # y.add_(y.t()): overlapping memory raises


def test_a_print_before_an_in_place_add_of_a_transpose_is_still_printed():
    source = 'def f(x, y, n, s):\n    print("before")\n    x.add_(x.t())\n    return x\n'
    assert_agrees(source)


def test_an_attribute_written_before_an_op_that_raises_is_still_written():
    source = """
import types

STATE = types.SimpleNamespace(hits=0)


def f(x, y, n, s):
    STATE.hits += n
    y.add_(x)
    return y
"""
    assert_agrees(source, "view and base")


def test_a_lazy_generator_expression_prints_when_consumed():
    source = 'def f(x, y, n, s):\n    gen = (print("item", i) or x * i for i in range(3))\n    print("made")\n    return sum(gen)\n'
    assert_agrees(source, "again")


def test_a_lazy_generator_expression_reads_state_when_consumed():
    source = """
import types

STATE = types.SimpleNamespace(order=0, seen=0)


def bump(i):
    STATE.seen = STATE.order
    return i


def f(x, y, n, s):
    gen = (bump(i) for i in range(3))
    STATE.order = 5
    return x + sum(gen)
"""
    assert_agrees(source, "again")


def test_any_over_a_generator_expression_stops_at_the_first_true_item():
    # Once wrong on 3.13 only: on 3.11 and 3.12 ``SimpleNamespace`` has a ``__setattr__`` of
    # its own, so the second ``STATE.checked += 1`` read back an attribute a setter assigned
    # (an ``outside-mutation`` break) and the function ran as Python.
    source = """
import types

STATE = types.SimpleNamespace(checked=0)


def check(i):
    STATE.checked += 1
    return i >= 1


def f(x, y, n, s):
    return x + any(check(i) for i in range(3))
"""
    assert_agrees(source, "again")


# ------------------------------------------------------------------ exceptions
def test_an_unused_matmul_of_mixed_dtypes_raises_as_in_eager():
    source = "def f(x, y, n, s):\n    unused = x @ y\n    return x + 1\n"
    assert_agrees(source, "dtypes mixed")


# ------------------------------------------------------------------ class statements
def test_a_class_statement_inside_the_function_compiles_once():
    source = "def f(x, y, n, s):\n    class Local:\n        scale = 2\n    return x * Local.scale\n"
    assert_agrees(source, "again")


# ------------------------------------------------------------------ cells across breaks
def assert_agrees_on_every_variation(source: str) -> None:
    base = Call((tensor((3, 3), 1), tensor((3, 3), 2), 2, 1.5), label="base")
    failure = run_case(Case(source, sequence(base)))
    assert failure is None, str(failure)


def test_a_closure_made_before_a_break_sees_the_write_after_it():
    source = """
def f(x, y, n, s):
    scale = n
    g = lambda t: t * scale + y
    m = float(x.sum() > 0)
    scale = m + s
    return g(x)
"""
    assert_agrees_on_every_variation(source)


def test_nonlocal_writes_on_both_sides_of_a_break():
    source = """
def f(x, y, n, s):
    total = x * 0

    def add(v):
        nonlocal total
        total = total + v

    add(x)
    if y.sum() > 0:
        add(y)
    add(n)
    return total
"""
    assert_agrees_on_every_variation(source)


# ------------------------------------------------------------------ context managers across breaks
def test_a_break_inside_no_grad():
    source = """
import torch


def f(x, y, n, s):
    with torch.no_grad():
        z = x * y
        m = float(z.sum() > 0)
        w = z + m * n
    return w + x, torch.is_grad_enabled()
"""
    assert_agrees_on_every_variation(source)


def test_a_break_inside_autocast_on_cpu():
    source = """
import torch


def f(x, y, n, s):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = x @ y
        m = float(z.float().sum() > 0)
        w = z @ y + m
    return w, z
"""
    assert_agrees_on_every_variation(source)


def test_a_break_inside_inference_mode():
    source = """
import torch


def f(x, y, n, s):
    with torch.inference_mode():
        z = x * y
        m = float(z.sum() > 0)
        w = z + m
    return w
"""
    assert_agrees_on_every_variation(source)


def test_a_break_inside_a_user_manager():
    source = """
LOG = []


class Tracker:
    def __enter__(self):
        LOG.append("enter")
        return self

    def __exit__(self, kind, value, traceback):
        LOG.append("exit")
        return False


def f(x, y, n, s):
    with Tracker():
        z = x * y
        m = float(z.sum() > 0)
        w = z + m * s
    return w
"""
    assert_agrees_on_every_variation(source)


def test_a_break_inside_a_contextmanager_generator():
    source = """
import contextlib

LOG = []


@contextlib.contextmanager
def tracked(name):
    LOG.append(("enter", name))
    try:
        yield name
    finally:
        LOG.append(("exit", name))


def f(x, y, n, s):
    with tracked("b") as name:
        z = x * len(name)
        m = float(z.sum() > 0)
        w = z + m * n
    return w
"""
    assert_agrees_on_every_variation(source)
