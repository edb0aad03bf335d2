"""A ``class`` statement inside a compiled function: made as Python at every call, reused.

``LOAD_BUILD_CLASS`` is a graph break (``class-statement``): each call of the function makes
a new class, so the class is made as Python at every call. The piece after it reads the
class as a value the break made (``Recording.read``: ``made_at_break``), not as an outside
object: its type and the attributes the piece reads are guarded, not its identity, so an
identical call compiles nothing, and a class whose attributes differ (its body read a
global that changed) recompiles instead of reusing the first call's. What would read more
of the class than its attributes (making an instance, ``isinstance``) is a break. Every
test compares with eager.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import fxloom

pytestmark = pytest.mark.usefixtures("one_thread")

SCALE = 2


def _scaled(x):
    y = x + 1

    class Local:  # noqa: E306
        scale = SCALE

    return y * Local.scale


def _returns_the_class(x):
    class Local:  # noqa: E306
        scale = 2

    return x * Local.scale, Local


def _makes_an_instance(x):
    class Local:  # noqa: E306
        def __init__(self):
            self.scale = 3

    made = Local()
    return x * made.scale, isinstance(made, Local)


def _writes_an_attribute(x):
    class Local:  # noqa: E306
        scale = 2

    Local.scale = Local.scale + 1
    return x * Local.scale, Local


def graphs(compiled) -> int:
    return compiled.explain().graph_count


def test_an_identical_call_compiles_nothing():
    compiled, x = fxloom.compile(_scaled), torch.ones(3)
    torch.testing.assert_close(compiled(x), _scaled(x))
    first = graphs(compiled)
    torch.testing.assert_close(compiled(x), _scaled(x))
    assert graphs(compiled) == first


def test_the_break_is_still_reported():
    compiled = fxloom.compile(_scaled)
    compiled(torch.ones(3))
    assert [error.kind for error in compiled.breaks] == ["class-statement"]


def test_a_class_attribute_read_from_a_changed_global_follows_it(monkeypatch):
    compiled, x = fxloom.compile(_scaled), torch.ones(3)
    for scale in (2, 5, 2):
        monkeypatch.setitem(globals(), "SCALE", scale)
        torch.testing.assert_close(compiled(x), _scaled(x))
    assert graphs(compiled) == 3  # the first piece, then one per value of the attribute


def test_each_call_returns_its_own_new_class():
    compiled, x = fxloom.compile(_returns_the_class), torch.ones(3)
    _, first = compiled(x)
    result, second = compiled(x)
    torch.testing.assert_close(result, x * 2)
    assert first is not second
    assert second.__qualname__ == "_returns_the_class.<locals>.Local"


def test_an_instance_of_the_class_is_made_as_python():
    compiled, x = fxloom.compile(_makes_an_instance), torch.ones(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # recompiles: the instance's class is new each call
        for _ in range(3):
            result, is_instance = compiled(x)
            torch.testing.assert_close(result, x * 3)
            assert is_instance is True


def test_an_attribute_written_reaches_this_calls_class():
    compiled, x = fxloom.compile(_writes_an_attribute), torch.ones(3)
    for _ in range(2):
        result, cls = compiled(x)
        torch.testing.assert_close(result, x * 3)
        assert cls.scale == 3
