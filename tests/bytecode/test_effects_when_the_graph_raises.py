"""fxloom.compile when an op of the graph raises: the program's output and its changes to
outside objects made before that op are done, those after it are not, as in eager.

The compiled entry runs the program's print, appends and attribute or global writes after
its graph (``fxloom.bytecode.side_effects``). When the graph raises -- here an in-place add
on overlapping memory, ``x.add_(x.t())``, which only the real tensors can tell -- the entry
finds the op that raised in the traceback and replays the effects the program made before
it (``fxloom.bytecode.entry.Raised``). Every case runs one copy of a program plainly and one
compiled (``make``: each copy its own module, so its own outside state) and compares the
exception, the printed text and the outside state.
"""

from __future__ import annotations

import contextlib
import io
import types

import pytest
import torch

import fxloom

pytestmark = pytest.mark.usefixtures("one_thread")


def make(source: str) -> types.ModuleType:
    """A fresh module running ``source`` (the program ``f`` and its outside state)."""
    module = types.ModuleType("program")
    module.torch = torch
    exec(compile(source, "<program>", "exec"), vars(module))  # noqa: S102
    return module


def outcome(fn, *args):
    """(the exception's type and message, the printed text) of ``fn(*args)``."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        try:
            fn(*args)
        except Exception as error:
            return (type(error), str(error)), printed.getvalue(), error
    return None, printed.getvalue(), None


def run_both(source: str, **compile_options):
    """The plain and the compiled run of ``source``'s ``f`` on a fresh 3x3 tensor each:
    (plain module, plain outcome), (compiled module, compiled outcome)."""
    plain, compiled = make(source), make(source)
    eager = outcome(plain.f, torch.arange(9.0).reshape(3, 3))
    got = outcome(fxloom.compile(compiled.f, **compile_options), torch.arange(9.0).reshape(3, 3))
    return (plain, eager), (compiled, got)


def assert_same_as_eager(source: str, *state: str):
    """Same exception (type and message), same printed text, same outside ``state``."""
    (plain, eager), (compiled, got) = run_both(source)
    assert eager[0] is not None, "the program is meant to raise"
    assert got[0] == eager[0]
    assert got[1] == eager[1]
    for name in state:
        want, have = getattr(plain, name), getattr(compiled, name)
        assert _same(have, want), f"{name}: {have!r} != {want!r}"
    return got[2]


def _same(have, want) -> bool:
    if isinstance(want, torch.Tensor):
        return type(have) is torch.Tensor and torch.equal(have, want)
    if isinstance(want, list):
        return type(have) is list and len(have) == len(want) and all(map(_same, have, want))
    if hasattr(want, "__dict__") and not isinstance(want, type):  # each copy has its classes
        return type(have).__qualname__ == type(want).__qualname__ and _same(vars(have), vars(want))
    if isinstance(want, dict):
        return list(have) == list(want) and all(_same(have[k], want[k]) for k in want)
    return type(have) is type(want) and have == want


# ----------------------------------------------------------------------------- output
def test_a_print_before_the_raising_op_is_printed():
    source = 'def f(x):\n    print("before")\n    x.add_(x.t())\n    return x\n'
    assert_same_as_eager(source)


def test_a_print_after_the_raising_op_is_not_printed():
    source = 'def f(x):\n    y = x * 2\n    x.add_(x.t())\n    print("after", y)\n    return y\n'
    assert_same_as_eager(source)


def test_a_print_of_a_tensor_computed_before_the_raising_op_shows_its_value():
    source = 'def f(x):\n    y = x * 2\n    print("y", y)\n    x.add_(x.t())\n    return y\n'
    assert_same_as_eager(source)


def test_prints_around_the_raising_op_print_only_those_before_it():
    source = """
def f(x):
    print("first")
    y = x + 1
    print("second", y.shape)
    x.add_(x.t())
    print("third")
    return y
"""
    assert_same_as_eager(source)


# ----------------------------------------------------------------------------- outside lists
def test_an_input_appended_before_the_raising_op_is_appended():
    source = "LOG = []\n\n\ndef f(x):\n    LOG.append(x)\n    x.add_(x.t())\n    return x\n"
    assert_same_as_eager(source, "LOG")


def test_a_computed_tensor_appended_before_the_raising_op_is_appended():
    source = "LOG = []\n\n\ndef f(x):\n    LOG.append(x * 2)\n    x.add_(x.t())\n    return x\n"
    assert_same_as_eager(source, "LOG")


def test_an_append_after_the_raising_op_is_not_made():
    source = "LOG = []\n\n\ndef f(x):\n    y = x * 2\n    x.add_(x.t())\n    LOG.append(y)\n    return y\n"
    assert_same_as_eager(source, "LOG")


def test_a_list_read_and_appended_around_the_raising_op_holds_the_items_before_it():
    source = """
LOG = [0]


def f(x):
    count = len(LOG)
    LOG.append(x + count)
    y = x * 2
    LOG.append(y)
    x.add_(x.t())
    LOG.append(y + 1)
    return y
"""
    assert_same_as_eager(source, "LOG")


def test_a_list_read_and_appended_in_a_loop_holds_the_items_appended_before_the_raising_op():
    source = """
LOG = [0]


def f(x):
    count = len(LOG)
    for i in range(4):
        x = x + i
        LOG.append(x)
    LOG.pop()
    x.add_(x.t())
    LOG.append(x * 2)
    return x
"""
    assert_same_as_eager(source, "LOG")


# ----------------------------------------------------------------------------- writes
def test_a_global_written_before_the_raising_op_is_written():
    source = "N = 0\n\n\ndef f(x):\n    global N\n    N += 1\n    x.add_(x.t())\n    return x\n"
    assert_same_as_eager(source, "N")


def test_a_global_written_on_both_sides_of_the_raising_op_keeps_the_value_before_it():
    source = """
N = 0


def f(x):
    global N
    N = 1
    y = x * 2
    N = 2
    x.add_(x.t())
    N = 3
    return y
"""
    assert_same_as_eager(source, "N")


def test_an_attribute_written_before_the_raising_op_is_written():
    source = """
import types

STATE = types.SimpleNamespace(hits=0, last=None)


def f(x):
    STATE.hits += 1
    STATE.last = x + 1
    x.add_(x.t())
    STATE.hits += 10
    return x
"""
    assert_same_as_eager(source, "STATE")


def test_a_nonlocal_counter_keeps_the_value_it_had_before_the_raising_op():
    source = """
def make():
    n = 0

    def f(x):
        nonlocal n
        n += 1
        y = x + 1
        n += 1
        x.add_(x.t())
        n += 1
        return y

    return f


f = make()


def counter():
    return f.__closure__[0].cell_contents
"""
    (plain, eager), (compiled, got) = run_both(source)
    assert got[0] == eager[0]
    assert compiled.counter() == plain.counter() == 2


def test_a_dict_item_set_before_the_raising_op_is_set_and_one_after_it_is_not():
    source = """
D = {"a": 1}


def f(x):
    keys = list(D)
    D["b"] = x + 1
    y = x * 3
    D["a"] = y
    x.add_(x.t())
    D["c"] = 5
    return y
"""
    assert_same_as_eager(source, "D")


def test_a_property_setter_runs_for_the_assignments_before_the_raising_op():
    source = """
class Box:
    def __init__(self):
        self._v = 0

    @property
    def v(self):
        return self._v

    @v.setter
    def v(self, value):
        print("set", value)
        self._v = value


BOX = Box()


def f(x):
    BOX.v = 1
    y = x + 1
    BOX.v = 2
    x.add_(x.t())
    BOX.v = 3
    return y
"""
    assert_same_as_eager(source, "BOX")


def test_a_piece_after_a_graph_break_does_its_own_effects_before_the_raising_op():
    source = """
def f(x):
    print("a")
    y = x * 2
    if x.sum() > 0:
        print("b", y.shape)
    z = y + 1
    print("c")
    x.add_(x.t())
    print("d")
    return z
"""
    assert_same_as_eager(source)


def test_effects_around_the_raising_op_keep_their_order():
    source = """
LOG = []
N = 0


def f(x):
    global N
    print("start")
    LOG.append("a")
    N = 1
    print("logged", len(LOG), N)
    y = x + 1
    LOG.append(y)
    x.add_(x.t())
    LOG.append("b")
    N = 2
    print("end")
    return y
"""
    assert_same_as_eager(source, "LOG", "N")


# ----------------------------------------------------------------------------- the exception
def test_the_exception_is_eagers_with_a_note_naming_the_op():
    source = 'def f(x):\n    print("before")\n    x.add_(x.t())\n    return x\n'
    error = assert_same_as_eager(source)
    assert isinstance(error, RuntimeError)
    assert any("fxloom: raised by %add_" in note for note in error.__notes__)


def test_an_effect_whose_value_the_graph_did_not_keep_is_named_in_a_note():
    # the list's state between the append and the pop holds x + 1, which no later op uses
    source = """
LOG = []


def f(x):
    count = len(LOG)
    LOG.append(x + 1)
    y = x * 2
    LOG.pop()
    x.add_(x.t())
    return y
"""
    (_, eager), (compiled, got) = run_both(source)
    assert got[0] == eager[0]
    notes = got[2].__notes__
    assert any("were not done" in note and "LOG" in note for note in notes)


def test_a_backend_whose_failing_op_cannot_be_located_does_the_effects_before_every_op():
    def failing_backend(graph_module, example_inputs):
        def run(*args):
            raise RuntimeError("the backend failed")

        return run

    source = 'LOG = []\n\n\ndef f(x):\n    print("first")\n    y = x + 1\n    LOG.append(y)\n    return y\n'
    compiled = make(source)
    (_, printed, error) = outcome(
        fxloom.compile(compiled.f, backend=failing_backend), torch.ones(3, 3)
    )
    assert printed == "first\n"  # before every op of the graph: eager printed it
    assert compiled.LOG == []
    assert any("cannot locate" in note and "LOG.append" in note for note in error.__notes__)


# ----------------------------------------------------------------------------- no exception
def test_a_program_with_no_effects_runs_its_graph_without_a_handler():
    compiled = fxloom.compile(lambda x, y: x + y)
    compiled(torch.ones(2), torch.ones(2))
    assert "try:" not in compiled.cache[0].run_source


def test_effects_still_run_after_the_graph_when_nothing_raises():
    source = 'LOG = []\n\n\ndef f(x):\n    print("before")\n    LOG.append(x * 2)\n    x.add_(1)\n    return x\n'
    (plain, eager), (compiled, got) = run_both(source)
    assert eager[0] is None and got[0] is None
    assert got[1] == eager[1]
    assert _same(compiled.LOG, plain.LOG)
