"""``schedule_async``: blocking calls split into start/wait, starts hoisted, waits sunk."""

from __future__ import annotations

import operator
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch

import fxloom
from fxloom.passes.schedule import ASYNC_CALLS, AsyncPair, register_async, schedule_async

DELAY = 0.1  # seconds a fake remote fetch, and a piece of local work, take
POOL = ThreadPoolExecutor(max_workers=4)


def fetch(key):
    """A blocking remote fetch (a parameter server round trip)."""
    time.sleep(DELAY)
    return key * 10


def start_fetch(key) -> Future:
    return POOL.submit(fetch, key)


def wait_fetch(handle: Future):
    return handle.result()


def local_work(x):
    """Local compute that takes as long as a fetch (sleeping: timing holds on a busy machine)."""
    time.sleep(DELAY)
    return x + 1


@fxloom.has_side_effect
def logged_fetch(key):
    """A blocking call with a side effect: it must stay among the other side effects."""
    EVENTS.append("fetch")
    return key * 10


def start_logged_fetch(key) -> Future:
    return POOL.submit(logged_fetch, key)


EVENTS: list[str] = []


@fxloom.has_side_effect
def record(tag, value=None):
    EVENTS.append(tag)
    return value


fxloom.wrap("fetch")
fxloom.wrap("local_work")
fxloom.wrap("logged_fetch")

PAIRS = {fetch: (start_fetch, wait_fetch), logged_fetch: (start_logged_fetch, wait_fetch)}


def program(x):
    a = fetch(x)
    h = local_work(x)
    b = fetch(x + 1)
    h = local_work(h)
    return h + a + b


def order(gm: fxloom.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes]


def scheduled_program() -> fxloom.GraphModule:
    return schedule_async(fxloom.symbolic_trace(program), PAIRS)


# ------------------------------------------------------------------- rewrite
def test_each_blocking_call_becomes_a_start_and_a_wait() -> None:
    gm = scheduled_program()
    calls = {n.name: n.target for n in gm.graph.find_nodes(op="call_function")}
    assert calls["fetch_handle"] is start_fetch and calls["fetch"] is wait_fetch
    assert calls["fetch_1_handle"] is start_fetch and calls["fetch_1"] is wait_fetch
    assert fetch not in calls.values()
    gm.graph.lint()


def test_starts_are_hoisted_and_waits_sunk_to_their_first_user() -> None:
    assert order(scheduled_program()) == [
        "x",
        "fetch_handle",  # right after its input
        "local_work",
        "add",
        "fetch_1_handle",  # right after x + 1, its input
        "local_work_1",
        "fetch",  # just before the first use of its result
        "add_1",
        "fetch_1",
        "add_2",
        "output",
    ]


def test_the_scheduled_program_computes_the_same() -> None:
    x = torch.arange(3.0)
    assert torch.equal(scheduled_program()(x), program(x))


def test_the_scheduled_program_overlaps_fetches_with_local_work() -> None:
    # Unscheduled: fetch, work, fetch, work in a row (4 x DELAY); scheduled: both fetches run
    # while the two pieces of work do (about 2 x DELAY).
    plain, scheduled = fxloom.symbolic_trace(program), scheduled_program()
    x = torch.ones(2)
    plain(x), scheduled(x)  # generate the code outside the timed runs

    def seconds(module) -> float:
        start = time.perf_counter()
        module(x)
        return time.perf_counter() - start

    assert seconds(scheduled) < 0.75 * seconds(plain)


def test_a_start_needing_only_inputs_goes_right_after_the_placeholders() -> None:
    def f(x, y):
        h = local_work(x)
        return h + fetch(y)

    gm = schedule_async(fxloom.symbolic_trace(f), PAIRS)
    assert order(gm)[:3] == ["x", "y", "fetch_handle"]


def test_a_start_in_a_graph_without_inputs_goes_first() -> None:
    g = fxloom.Graph()
    h = g.call_function(torch.ones, (2,))
    g.output(g.call_function(operator.add, (h, g.call_function(fetch, (3,)))))
    gm = schedule_async(fxloom.GraphModule(torch.nn.Module(), g), PAIRS)
    assert order(gm) == ["fetch_handle", "ones", "fetch", "add", "output"]


def test_starts_hoisted_to_the_same_place_keep_their_order() -> None:
    def f(x):
        h = local_work(x)
        a = fetch(x)
        h = local_work(h)
        return a + fetch(x * 2) + fetch(x) + h

    gm = schedule_async(fxloom.symbolic_trace(f), PAIRS)
    names = order(gm)
    assert names[:3] == ["x", "fetch_handle", "fetch_2_handle"]
    assert names[names.index("mul") + 1] == "fetch_1_handle"


def test_a_fetch_of_a_fetched_key_starts_once_the_key_arrives() -> None:
    def f(x):
        key = fetch(x)
        h = local_work(x)
        return fetch(key) + h

    gm = schedule_async(fxloom.symbolic_trace(f), PAIRS)
    assert order(gm) == [
        "x",
        "fetch_handle",
        "fetch",
        "fetch_1_handle",
        "local_work",
        "fetch_1",
        "add",
        "output",
    ]
    assert torch.equal(gm(torch.ones(1)), f(torch.ones(1)))


def test_keyword_arguments_go_to_the_start() -> None:
    def f(x):
        return fetch(key=x)

    gm = schedule_async(fxloom.symbolic_trace(f), PAIRS)
    handle = next(n for n in gm.graph.nodes if n.name == "fetch_handle")
    assert handle.kwargs == {"key": gm.graph.find_nodes(op="placeholder")[0]}
    assert torch.equal(gm(torch.ones(1)), torch.full((1,), 10.0))


def test_a_wait_whose_result_is_unused_stays_where_the_call_was() -> None:
    def f(x):
        fetch(x)
        return local_work(x)

    gm = schedule_async(fxloom.symbolic_trace(f), PAIRS)
    assert order(gm) == ["x", "fetch_handle", "fetch", "local_work", "output"]


# ------------------------------------------------------------ declaring pairs
def test_registered_pairs_apply_without_being_passed() -> None:
    register_async(fetch, start_fetch, wait_fetch)
    try:
        gm = schedule_async(fxloom.symbolic_trace(program))
    finally:
        del ASYNC_CALLS[fetch]
    assert order(gm)[1] == "fetch_handle"


def test_pairs_passed_win_over_registered_ones() -> None:
    register_async(fetch, print, print)
    try:
        gm = schedule_async(
            fxloom.symbolic_trace(program), {fetch: AsyncPair(start_fetch, wait_fetch)}
        )
    finally:
        del ASYNC_CALLS[fetch]
    assert {n.target for n in gm.graph.find_nodes(op="call_function")} >= {start_fetch, wait_fetch}


def test_a_bad_pair_is_refused_before_anything_changes() -> None:
    gm = fxloom.symbolic_trace(program)
    before = gm.code
    with pytest.raises(TypeError, match=r"'fetch' must be a \(start, wait\) pair of callables"):
        schedule_async(gm, {fetch: (start_fetch,)})
    with pytest.raises(TypeError, match="pair of callables"):
        register_async(fetch, start_fetch, "wait")
    assert gm.code == before and fetch not in ASYNC_CALLS


def test_a_module_that_is_not_traced_is_refused() -> None:
    with pytest.raises(TypeError, match=r"schedule_async works on an fxloom.GraphModule"):
        schedule_async(RemoteScale(), PAIRS)


def test_a_module_without_blocking_calls_is_left_as_it_was() -> None:
    gm = fxloom.symbolic_trace(lambda x: local_work(x) * 2)
    before = gm.code
    assert schedule_async(gm, PAIRS) is gm
    assert gm.code == before


# --------------------------------------------------------------- names, meta
def test_the_wait_keeps_the_blocking_node_and_the_start_gets_its_provenance() -> None:
    gm = fxloom.symbolic_trace(program)
    blocking = next(n for n in gm.graph.nodes if n.name == "fetch")
    blocking.meta.update(stack_trace="program.py:2", tensor_meta="shape of a", custom=1)
    schedule_async(gm, PAIRS)
    wait = next(n for n in gm.graph.nodes if n.name == "fetch")
    handle = next(n for n in gm.graph.nodes if n.name == "fetch_handle")
    assert wait is blocking
    assert wait.meta["tensor_meta"] == "shape of a" and wait.meta["custom"] == 1
    provenance = ("stack_trace", "nn_module_stack", "source_fn_stack")
    assert handle.meta == {key: blocking.meta[key] for key in provenance}


def test_other_nodes_keep_their_names_and_meta() -> None:
    gm = fxloom.symbolic_trace(program)
    others = {n.name: n for n in gm.graph.nodes if n.target is not fetch}
    metas = {name: dict(n.meta) for name, n in others.items()}
    schedule_async(gm, PAIRS)
    kept = {n.name: n for n in gm.graph.nodes if n.name in others}
    assert kept == others
    assert {name: dict(n.meta) for name, n in kept.items()} == metas


# ------------------------------------------------------------- side effects
def effects_graph(blocking) -> fxloom.GraphModule:
    """h = x + 1; record("before"); h2 = h * 2; v = blocking(x); record("after"); w = h2 - 1."""
    g = fxloom.Graph()
    x = g.placeholder("x")
    h = g.call_function(operator.add, (x, 1))
    g.call_function(record, ("before",))
    h2 = g.call_function(operator.mul, (h, 2))
    v = g.call_function(blocking, (x,))
    g.call_function(record, ("after",))
    w = g.call_function(operator.sub, (h2, 1))
    g.output(g.call_function(operator.add, (v, w)))
    return fxloom.GraphModule(torch.nn.Module(), g)


def test_a_pure_blocking_call_moves_past_side_effects() -> None:
    gm = schedule_async(effects_graph(fetch), PAIRS)
    assert order(gm) == [
        "x",
        "fetch_handle",
        "add",
        "record",
        "mul",
        "record_1",
        "sub",
        "fetch",
        "add_1",
        "output",
    ]


def test_an_impure_blocking_call_stays_between_its_neighbouring_side_effects() -> None:
    gm = schedule_async(effects_graph(logged_fetch), PAIRS)
    assert order(gm) == [
        "x",
        "add",  # reads x before the call: an impure call may update its arguments
        "record",
        "logged_fetch_handle",  # no earlier than the side effect before it
        "mul",
        "logged_fetch",  # no later than the side effect after it
        "record_1",
        "sub",
        "add_1",
        "output",
    ]
    EVENTS.clear()
    gm(torch.ones(1))
    assert EVENTS == ["before", "fetch", "after"]


def test_impure_blocking_calls_do_not_overlap_each_other() -> None:
    def f(x, y, z):
        a = logged_fetch(x)
        h = local_work(z)
        b = logged_fetch(y)
        return a + b + h

    gm = schedule_async(fxloom.symbolic_trace(f), PAIRS)
    assert order(gm) == [
        "x",
        "y",
        "z",
        "logged_fetch_handle",
        "logged_fetch",  # done before the next impure call starts ...
        "logged_fetch_1_handle",
        "local_work",  # ... which still overlaps the local work
        "logged_fetch_1",
        "add",
        "add_1",
        "output",
    ]


def test_both_halves_of_an_impure_call_survive_dead_code_elimination() -> None:
    g = fxloom.Graph()
    x = g.placeholder("x")
    g.call_function(logged_fetch, (x,))
    g.output(x)
    gm = schedule_async(fxloom.GraphModule(torch.nn.Module(), g), PAIRS)
    assert not gm.graph.eliminate_dead_code()
    assert order(gm) == ["x", "logged_fetch_handle", "logged_fetch", "output"]


def test_in_place_updates_of_an_argument_hold_both_halves() -> None:
    def f(x):
        key = x + 1
        key.add_(1)  # the fetch must see the updated key ...
        v = fetch(key)
        h = local_work(x)
        key.mul_(2)  # ... and be done before the next update
        return v + h + key

    gm = schedule_async(fxloom.symbolic_trace(f), PAIRS)
    assert order(gm) == [
        "x",
        "add",
        "add_",
        "fetch_handle",
        "local_work",
        "fetch",
        "mul_",
        "add_1",
        "add_2",
        "output",
    ]
    assert torch.equal(gm(torch.ones(1)), f(torch.ones(1)))


# -------------------------------------------------------------- a module
class RemoteScale(torch.nn.Module):
    """A linear layer whose output scale lives on a parameter server."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        batch = x.shape[0]
        y = torch.relu(self.linear(x))
        return y * fetch(batch)


def test_a_traced_module_with_a_wrapped_fetch_is_scheduled() -> None:
    module = RemoteScale()
    gm = schedule_async(fxloom.symbolic_trace(module), PAIRS)
    names = order(gm)
    assert names.index("fetch_handle") < names.index("linear") < names.index("fetch")
    x = torch.randn(2, 4)
    torch.testing.assert_close(gm(x), module(x))
