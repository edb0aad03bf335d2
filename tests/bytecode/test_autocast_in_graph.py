"""``with torch.autocast(...)`` inside a compiled function is recorded in the graph.

Its enter and exit are graph effects (``fxloom.ops.state_effects.autocast_on`` and
``autocast_back``), as grad mode's switches are, not piece boundaries: a block without a
break is one graph, and a block with a break is two (the piece before the break enters, the
break runs as Python under autocast, the piece after it leaves). Results equal eager's,
dtypes included, and autocast is off after the call as in eager, also when an op raises.
"""

from __future__ import annotations

import pytest
import torch

import fxloom
from fxloom.ops import state_effects
from tests.bytecode.like_eager import assert_same

pytestmark = pytest.mark.usefixtures("one_thread")

torch.manual_seed(0)
LINEAR = torch.nn.Linear(4, 4)
CALLS = [(torch.randn(2, 4) + i,) for i in range(3)]


def agrees(fn, calls=CALLS):
    """``fxloom.compile(fn)`` gives eager's results (and dtypes) on each call and leaves
    autocast as it found it; returns the compiled function."""
    compiled = fxloom.compile(fn)
    for args in calls:
        before = state_effects.saved_autocast()
        want = fn(*args)
        got = compiled(*args)
        assert state_effects.saved_autocast() == before
        assert_same(got, want)
    return compiled


def effects(compiled) -> list:
    return [
        node.target
        for graph in compiled.explain().graphs
        for node in graph.graph.nodes
        if node.target in (state_effects.autocast_on, state_effects.autocast_back)
    ]


def whole_block(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = LINEAR(x)
    return y, y.float() + 1


def test_a_block_without_a_break_is_one_graph_with_both_switches():
    compiled = agrees(whole_block)
    report = compiled.explain()
    assert (report.graph_count, report.break_count) == (1, 0)
    assert effects(compiled) == [state_effects.autocast_on, state_effects.autocast_back]


def break_inside(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = LINEAR(x)
        m = float(y.float().abs().max())  # a break inside the block
        y = LINEAR(y / m)
    return y.float()


def test_a_break_inside_the_block_makes_two_graphs_not_four():
    compiled = agrees(break_inside)
    report = compiled.explain()
    assert (report.graph_count, report.piece_count) == (2, 2)
    assert effects(compiled) == [state_effects.autocast_on, state_effects.autocast_back]


def test_the_break_runs_under_autocast_as_in_eager():
    seen = []

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = LINEAR(x)
            seen.append(torch.is_autocast_enabled("cpu"))  # runs as Python: a break
            y = LINEAR(y)
        return y

    agrees(f)
    assert seen and all(seen)


def test_a_disabled_autocast_casts_nothing():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
            return LINEAR(x)

    agrees(f)


def test_nested_autocast_regions_switch_back_in_order():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = LINEAR(x)
            with torch.autocast("cpu", enabled=False):
                z = LINEAR(y.float())
            w = LINEAR(z)
        return y, z, w

    agrees(f)


def test_an_outer_autocast_of_another_dtype_is_not_given_the_same_graph():
    compiled = fxloom.compile(break_inside)
    (x,) = CALLS[0]
    assert_same(compiled(x), break_inside(x))
    for dtype in (torch.float16, torch.bfloat16):
        with torch.autocast("cpu", dtype=dtype):
            want = break_inside(x)
            got = compiled(x)
            assert torch.get_autocast_dtype("cpu") == dtype  # the inner exit put it back
        assert_same(got, want)
    assert not torch.is_autocast_enabled("cpu")


def test_the_manager_bound_by_as_is_the_autocast():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16) as mode:
            y = LINEAR(x)
        return y, mode.fast_dtype == torch.bfloat16

    agrees(f)


def raises_inside(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = LINEAR(x)
        return y @ torch.ones(5, 5)  # a shape error, raised by the graph


def test_an_op_raising_in_the_graph_leaves_autocast_off():
    compiled = fxloom.compile(raises_inside)
    before = state_effects.saved_autocast()  # nesting depth included
    for _ in range(2):  # captured, then the compiled graph
        with pytest.raises(RuntimeError):
            compiled(CALLS[0][0])
        assert not torch.is_autocast_enabled("cpu")
        assert state_effects.saved_autocast() == before


def test_an_autocast_made_outside_the_function_is_entered_as_python():
    mode = torch.autocast("cpu", dtype=torch.bfloat16)

    def f(x, mode):
        with mode:
            return LINEAR(x)

    agrees(f, [(x, mode) for (x,) in CALLS])


def test_a_backend_that_translates_ops_keeps_autocast_at_piece_boundaries():
    seen = []

    def translating(graph_module, example_inputs):  # a backend fxloom cannot see into
        seen.append(graph_module)
        return graph_module.forward

    compiled = fxloom.compile(whole_block, backend=translating)
    for (x,) in CALLS:
        assert_same(compiled(x), whole_block(x))
    assert effects(compiled) == []
