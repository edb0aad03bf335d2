"""Context managers across graph breaks: a break inside a ``with`` splits the function, and
the manager's state holds in every piece, as in eager.

Grad mode (``no_grad``, ``enable_grad``, ``set_grad_enabled``) is recorded: the piece before
the break switches it in its graph and leaves it switched, the break's instruction runs as
Python under it, and the next piece starts under it with the ``with``'s exit still on the
stack (the manager made again with its saved state), so the exit restores it once. An
autocast the function makes is recorded the same way (tests/bytecode/test_autocast_in_graph.py);
inference mode, whose switch a graph does not record, and an autocast from outside are
entered and exited as Python at piece boundaries, and the pieces between run under them. An exception inside the block
goes to the ``with``'s exit through the exception table, as in eager.

Each test compares results, ``requires_grad``, dtypes and the grad mode after the call with
eager, and checks that something compiles.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import fxloom

pytestmark = pytest.mark.usefixtures("one_thread")


def assert_same(got, want) -> None:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
        assert (a.requires_grad, a.dtype, a.is_inference()) == (
            b.requires_grad,
            b.dtype,
            b.is_inference(),
        )


def compiled_agrees(fn, *calls):
    """``fxloom.compile(fn)`` gives eager's results on each call, and leaves grad mode as
    eager does; returns the compiled function."""
    compiled = fxloom.compile(fn)
    for args in calls:
        want = fn(*args)
        mode = torch.is_grad_enabled()
        got = compiled(*args)
        assert torch.is_grad_enabled() == mode
        assert_same(got, want)
    return compiled


def leaf(n: int = 3) -> torch.Tensor:
    return torch.arange(float(n)).requires_grad_()


def test_a_float_break_inside_no_grad_splits_the_function():
    def f(x):
        with torch.no_grad():
            y = x * 2
            n = float(y.sum())
            z = y + n
        return z, x * 3

    compiled = compiled_agrees(f, (leaf(),), (leaf(),), (leaf(4),))
    assert compiled.explain().graph_count >= 2


def test_a_float_break_inside_enable_grad_under_no_grad():
    def f(x):
        with torch.enable_grad():
            y = x * 2
            n = float(y.sum())
            z = y + n
        return z

    with torch.no_grad():
        compiled = compiled_agrees(f, (leaf(),), (leaf(),))
    assert compiled.explain().graph_count >= 2


def test_a_break_inside_set_grad_enabled():
    def f(x, mode):
        with torch.set_grad_enabled(mode):
            y = x * 2
            n = float(y.sum())
            z = y + n
        return z

    compiled = compiled_agrees(f, (leaf(), False), (leaf(), False), (leaf(), True))
    assert compiled.explain().graph_count >= 2


def test_autocast_on_cpu_with_a_break_gives_eagers_dtypes():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
            n = float(y.float().sum())
            z = y @ x + n
        return z, y

    compiled = compiled_agrees(f, (torch.ones(3, 3),), (torch.ones(3, 3),))
    assert compiled(torch.ones(3, 3))[0].dtype == torch.bfloat16
    assert compiled.explain().graph_count >= 1


def test_autocast_without_a_break_gives_eagers_dtypes():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return x @ x

    compiled = compiled_agrees(f, (torch.ones(3, 3),), (torch.ones(3, 3),))
    assert compiled.explain().graph_count >= 1


def test_inference_mode_with_a_break_makes_inference_tensors():
    def f(x):
        with torch.inference_mode():
            y = x * 2
            n = float(y.sum())
            z = y + n
        return z

    compiled = compiled_agrees(f, (leaf(),), (leaf(),))
    assert compiled(leaf()).is_inference()
    assert compiled.explain().graph_count >= 1


def test_an_exception_after_the_break_inside_no_grad_restores_grad_mode():
    def f(x):
        with torch.no_grad():
            y = x * 2
            n = float(y.sum())
            if n > 100:
                raise ValueError(f"too big: {n}")
            z = y + n
        return z

    compiled = compiled_agrees(f, (leaf(),), (leaf(),))
    for _ in range(2):
        with pytest.raises(ValueError, match="too big: 380.0"):
            compiled(leaf(20))
        assert torch.is_grad_enabled()
    assert compiled.explain().graph_count >= 1


def test_an_exception_after_the_break_inside_autocast_restores_autocast():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
            if float(y.float().sum()) > 100:
                raise ValueError("too big")
            z = y @ x
        return z

    compiled = fxloom.compile(f)
    with pytest.raises(ValueError, match="too big"):
        compiled(torch.ones(9, 9))
    assert not torch.is_autocast_enabled("cpu")
    assert_same(compiled(torch.ones(3, 3)), f(torch.ones(3, 3)))


def test_an_exception_caught_inside_the_function_after_a_break_inside_no_grad():
    def f(x):
        try:
            with torch.no_grad():
                n = float(x.sum())
                if n > 1:
                    raise KeyError("caught")
                y = x * n
        except KeyError:
            y = x * 0
        return y, torch.is_grad_enabled()

    compiled = fxloom.compile(f)
    for size in (3, 3, 1):
        got, want = compiled(leaf(size)), f(leaf(size))
        assert_same(got[0], want[0])
        assert got[1] == want[1] is True


def test_nested_no_grad_and_enable_grad_with_a_break_in_the_inner_block():
    def f(x):
        with torch.no_grad():
            a = x * 2
            with torch.enable_grad():
                b = x * 3
                n = float(b.sum())
                c = b + n
            d = a + c
        return a, b, c, d

    compiled = compiled_agrees(f, (leaf(),), (leaf(),))
    assert compiled.explain().graph_count >= 2


# ------------------------------------------------------------------ torch's other switches
class DefaultDtype:
    """A manager of the program's own that switches torch's default dtype."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.prev = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.prev)


@pytest.mark.parametrize("with_break", [False, True], ids=["whole", "with a break"])
def test_a_default_dtype_switch_holds_for_the_code_after_it(with_break):
    def f(x):
        with DefaultDtype(torch.float64):
            y = x + torch.ones(3)
            if with_break:
                y = y * float(y.sum())
        return y, torch.ones(2)

    compiled = compiled_agrees(f, (torch.ones(3),), (torch.ones(3),))
    assert torch.get_default_dtype() == torch.float32
    assert compiled.explain().graph_count >= 1


# ------------------------------------------------------------------ user managers
LOG: list = []


class Tracker:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        LOG.append(("enter", self.name))
        return self

    def __exit__(self, kind, value, traceback):
        LOG.append(("exit", self.name, kind))
        return False


class Suppress:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        LOG.append(("suppressed", kind))
        return True


@contextlib.contextmanager
def tracked(name):
    LOG.append(("enter", name))
    try:
        yield name
    finally:
        LOG.append(("exit", name))


def agrees_with_log(fn, *sizes):
    """Results and the managers' log of enters and exits as eager's, call by call."""
    compiled = fxloom.compile(fn)
    for size in sizes:
        LOG.clear()
        want = fn(torch.arange(float(size)))
        eager_log = list(LOG)
        LOG.clear()
        got = compiled(torch.arange(float(size)))
        assert LOG == eager_log
        torch.testing.assert_close(got, want)
    return compiled


def test_a_user_manager_enters_and_exits_once_around_a_break():
    def f(x):
        with Tracker("a"):
            y = x * 2
            n = float(y.sum())
            z = y + n
        return z

    compiled = agrees_with_log(f, 3, 3, 4)
    assert compiled.explain().graph_count >= 2


def test_a_contextmanager_generator_enters_and_exits_once_around_a_break():
    def f(x):
        with tracked("b") as name:
            y = x * len(name)
            n = float(y.sum())
            z = y + n
        return z

    compiled = agrees_with_log(f, 3, 3, 4)
    assert compiled.explain().graph_count >= 2


def test_a_user_manager_that_suppresses_an_exception_raised_after_a_break():
    def f(x):
        y = x
        with Suppress():
            y = x * 2
            if float(y.sum()) > 5:
                raise ValueError("suppressed")
            y = y + 1
        return y

    compiled = agrees_with_log(f, 2, 2, 5, 5)
    assert compiled.explain().graph_count >= 1


def test_a_user_manager_sees_the_exception_raised_after_a_break():
    def f(x):
        with Tracker("c"):
            if float(x.sum()) > 5:
                raise KeyError("seen")
            return x + 1

    compiled = fxloom.compile(f)
    for _ in range(2):
        LOG.clear()
        with pytest.raises(KeyError):
            compiled(torch.arange(5.0))
        assert LOG == [("enter", "c"), ("exit", "c", KeyError)]
    torch.testing.assert_close(compiled(torch.arange(2.0)), f(torch.arange(2.0)))


# ------------------------------------------------------------------ an op of a graph raises
@pytest.mark.parametrize(
    "read",
    [float, lambda t: t.item()],
    ids=["after a float() break", "with no break (.item() stays in the graph)"],
)
def test_an_op_raising_in_the_graph_reaches_the_user_managers_exit(read):
    # With no break in the block, an op that may raise on data (an index out of range) runs
    # as Python (``raises-inside-with``): in the graph, its raising would skip the exit.
    def f(x, index):
        with Tracker("d"):
            n = read(x.sum())
            return torch.index_select(x, 0, index) + n

    compiled = fxloom.compile(f)
    torch.testing.assert_close(compiled(torch.ones(3), torch.tensor([1])), torch.tensor([4.0]))
    LOG.clear()
    with pytest.raises(IndexError):
        compiled(torch.ones(3), torch.tensor([7]))
    assert LOG == [("enter", "d"), ("exit", "d", IndexError)]
    assert any(stop.kind == "raises-inside-with" for stop in compiled.breaks) == (read is not float)


def test_an_op_raising_in_the_graph_inside_autocast_leaves_autocast_off():
    def f(x, index):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.index_select(x @ x, 0, index)

    compiled = fxloom.compile(f)
    compiled(torch.ones(3, 3), torch.tensor([1]))
    with pytest.raises(IndexError):
        compiled(torch.ones(3, 3), torch.tensor([7]))
    assert not torch.is_autocast_enabled("cpu")


def test_an_op_raising_in_the_graph_inside_a_suppressing_manager_is_raised_with_a_note():
    def f(x, index):
        with Suppress():
            n = float(x.sum())
            x = torch.index_select(x, 0, index) + n
        return x

    compiled = fxloom.compile(f)
    compiled(torch.ones(3), torch.tensor([1]))
    with pytest.raises(IndexError) as raised:
        compiled(torch.ones(3), torch.tensor([7]))
    assert any("cannot go on as eager does" in note for note in raised.value.__notes__)


def test_an_op_that_raises_inside_a_no_grad_block_one_graph_holds_restores_grad_mode():
    def f(x, index):
        with torch.no_grad():
            y = x * 2
            picked = y[index]  # raises for an index out of range, inside the graph
        return picked + 1

    compiled = fxloom.compile(f)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x, torch.tensor([1])), f(x, torch.tensor([1])))
    with pytest.raises(IndexError):
        compiled(x, torch.tensor([10]))
    assert torch.is_grad_enabled()
    assert compiled.explain().graph_count == 1


def test_a_piece_starting_inside_autocast_runs_on_real_weights_not_capture_casts():
    # Capture inside an autocast region the program entered leaves autocast's weight cache
    # as it found it: the real run casts the real weight, not a stand-in of it.
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 4)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = linear(x)
            largest = float(y.float().abs().max())  # a graph break inside the region
            y = linear(y / largest)
        return y.float()

    compiled = fxloom.compile(f)
    for x in (torch.randn(2, 4), torch.randn(2, 4) + 1):
        torch.testing.assert_close(compiled(x), f(x))
