"""Program scheduling on torch.distributed.rpc: ``rpc_sync`` traced as one call, started early, waited late.

The first tests read the graphs only (no process, no rpc agent): how a model's
``rpc.rpc_sync`` is recorded and how ``schedule_async`` rewrites it. The last ones run the
models between two processes on loopback, a trainer and a parameter server, in ONE spawned
session for the whole file (``rpc_session``: a spawn costs ~20 s), and compare the
scheduled modules with the blocking ones.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import fxloom
from fxloom._notes import notes_of
from fxloom.distributed import rpc_available, rpc_options, rpc_wait, run_local
from fxloom.passes.schedule import schedule_async

pytestmark = pytest.mark.skipif(
    not rpc_available(),
    reason="this torch build has no torch.distributed.rpc (torch.distributed.rpc.is_available() "
    "is False)",
)
if rpc_available():
    import torch.distributed.rpc as rpc
    from torch.distributed.rpc import rpc_sync as bare_rpc_sync

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "distributed.md"
EXAMPLES = ROOT / "examples"
if str(EXAMPLES) not in sys.path:  # examples/ is no package: import the example as a user runs it
    sys.path.insert(0, str(EXAMPLES))

import rpc_schedule as example  # noqa: E402 - needs the path above

ROWS = example.ROWS


def lookup_rows(ids: torch.Tensor) -> torch.Tensor:
    """Runs on the parameter server."""
    return example.embedding_table()[ids]


def failing_lookup(ids: torch.Tensor) -> torch.Tensor:
    """Runs on the parameter server and fails there."""
    raise KeyError(f"no rows for {ids.numel()} ids on this server")


class LateIds(nn.Module):
    """The ids to fetch are computed by the local work: the fetch cannot start before it."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(8, ROWS)
        self.after = nn.Linear(8, 8)

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        ids = self.score(dense).argmax(dim=1)
        h = self.after(dense).relu()
        embedded = rpc.rpc_sync("ps", lookup_rows, args=(ids,))
        return torch.cat([h, embedded], dim=1)


class TwoLookups(nn.Module):
    """Two fetches, one given a timeout and keyword arguments, and local work between."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        first = rpc.rpc_sync("ps", lookup_rows, args=(ids,))
        h = self.mlp(dense)
        second = rpc.rpc_sync("ps", lookup_rows, kwargs={"ids": ids + 1}, timeout=30.0)
        return torch.cat([h, first, second], dim=1)


class FailingLookup(nn.Module):
    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        h = dense.relu()
        return h + rpc.rpc_sync("ps", failing_lookup, args=(ids,)).sum()


@fxloom.has_side_effect
def push(value: torch.Tensor) -> torch.Tensor:
    """A local side effect (a log, a push): remote calls made for an effect stay behind it."""
    return value


fxloom.wrap("push")


def push_then_fetch(dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    pushed = push(dense.relu())
    return pushed.sum() + rpc.rpc_sync("ps", lookup_rows, args=(ids,)).sum()


def bare_call(ids: torch.Tensor) -> torch.Tensor:
    """rpc_sync imported into this module's globals, under another name."""
    return bare_rpc_sync("ps", lookup_rows, args=(ids,)) * 2


def calls(gm: fxloom.GraphModule) -> list[tuple[str, object]]:
    return [(n.name, n.target) for n in gm.graph.nodes if n.op == "call_function"]


def order(gm: fxloom.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes]


# ------------------------------------------------------------------ the rewrite, on graphs
def test_a_models_rpc_sync_is_traced_as_one_call():
    gm = fxloom.symbolic_trace(example.Ranker())
    (node,) = [n for n in gm.graph.nodes if n.target is rpc.rpc_sync]
    assert node.args == ("ps", example.lookup)
    assert node.kwargs == {"args": (gm.graph.find_nodes(op="placeholder")[1],)}


def test_an_rpc_sync_imported_under_another_name_is_traced_as_a_call_too():
    gm = fxloom.symbolic_trace(bare_call)
    assert [target for _, target in calls(gm)][0] is rpc.rpc_sync


def test_schedule_async_knows_the_pair_of_rpc_sync_without_being_told():
    gm = schedule_async(fxloom.symbolic_trace(example.Ranker()))
    targets = dict(calls(gm))
    assert targets["rpc_sync_handle"] is rpc.rpc_async
    assert targets["rpc_sync"] is rpc_wait
    assert rpc.rpc_sync not in targets.values()


def test_the_rpc_starts_before_the_local_work_and_is_waited_for_right_before_use():
    gm = schedule_async(fxloom.symbolic_trace(example.Ranker()))
    names = order(gm)
    assert names[:3] == ["dense", "ids", "rpc_sync_handle"]
    assert names[names.index("cat") - 1] == "rpc_sync"
    assert names.index("rpc_sync") > max(i for i, n in enumerate(names) if n.startswith("mlp"))


def test_the_start_keeps_every_argument_of_the_blocking_call():
    gm = schedule_async(fxloom.symbolic_trace(TwoLookups()))
    start = next(n for n in gm.graph.nodes if n.name == "rpc_sync_1_handle")
    assert start.args == ("ps", lookup_rows)
    assert set(start.kwargs) == {"kwargs", "timeout"} and start.kwargs["timeout"] == 30.0


def test_an_rpc_whose_argument_is_computed_late_starts_right_after_it():
    gm = schedule_async(fxloom.symbolic_trace(LateIds()))
    names = order(gm)
    assert names.index("rpc_sync_handle") == names.index("argmax") + 1
    assert names.index("after") > names.index("rpc_sync_handle")  # local work still overlaps


def test_a_fetch_is_taken_for_a_read_and_starts_before_a_side_effect():
    names = order(schedule_async(fxloom.symbolic_trace(push_then_fetch)))
    assert names.index("rpc_sync_handle") < names.index("push")


def test_a_fetch_marked_impure_keeps_its_place_after_a_side_effect():
    gm = fxloom.symbolic_trace(push_then_fetch)
    (fetch,) = gm.graph.find_nodes(op="call_function", target=rpc.rpc_sync)
    fetch.meta["is_impure"] = True  # made for its effect: it must stay behind the push
    names = order(schedule_async(gm))
    assert names.index("push") < names.index("rpc_sync_handle")


def test_rpc_wait_gives_the_value_of_the_finished_call():
    done = torch.futures.Future()
    done.set_result(torch.ones(2))
    assert torch.equal(rpc_wait(done), torch.ones(2))


def test_rpc_wait_raises_the_error_of_the_failed_call():
    failed = torch.futures.Future()
    failed.set_exception(KeyError("no rows"))
    with pytest.raises(KeyError, match="no rows"):
        rpc_wait(failed)


def test_a_scheduled_module_traced_again_keeps_its_remote_calls_as_calls():
    gm = fxloom.symbolic_trace(schedule_async(fxloom.symbolic_trace(example.Ranker())))
    targets = [target for _, target in calls(gm)]
    assert rpc.rpc_async in targets and rpc_wait in targets


@pytest.mark.parametrize("scheduled", [False, True], ids=["blocking", "scheduled"])
def test_saving_a_graph_that_calls_rpc_is_refused_naming_the_remote_call(scheduled):
    gm = fxloom.symbolic_trace(example.Ranker())
    if scheduled:
        schedule_async(gm)
    with pytest.raises(fxloom.SerializationError, match=r"%rpc_sync.*reaches other processes"):
        fxloom.save(gm, io.BytesIO())


def docs_section() -> str:
    """The program-scheduling section of docs/distributed.md (up to the next section)."""
    text = DOCS.read_text()
    start = text.index("## Program scheduling")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_docs_example_prints_the_code_the_docs_show():
    section = docs_section()
    (example_code,) = re.findall(r"```python\n(.*?)```", section, re.S)[:1]
    (printed,) = re.findall(r"```text\n(.*?)```", section, re.S)[:1]
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        # dont_inherit: the snippet runs as a user would run it, without this file's __future__.
        exec(compile(example_code, str(DOCS), "exec", dont_inherit=True), {"__name__": "docs"})
    assert output.getvalue().strip() == printed.strip()


# ------------------------------------------------ two processes: trainer and parameter server
def run_on_the_trainer() -> dict:
    """Every check that needs the parameter server, in one session; results by name."""
    results = {"example": example.trainer()}
    dense, ids = torch.randn(4, 8), torch.randint(0, ROWS - 1, (4,))
    for model, inputs in (("late_ids", (dense,)), ("two_lookups", (dense, ids))):
        module = {"late_ids": LateIds, "two_lookups": TwoLookups}[model]()
        blocking = fxloom.symbolic_trace(module)
        scheduled = schedule_async(fxloom.symbolic_trace(module))
        results[model] = (module(*inputs), blocking(*inputs), scheduled(*inputs))
    failing = FailingLookup()
    results["errors"] = [
        _error_of(gm, dense, ids)
        for gm in (fxloom.symbolic_trace(failing), schedule_async(fxloom.symbolic_trace(failing)))
    ]
    return results


def _error_of(gm: fxloom.GraphModule, *inputs: torch.Tensor) -> tuple[str, str] | None:
    try:
        gm(*inputs)
    except Exception as e:  # the remote error, as rpc re-raises it here (with the remote traceback)
        return type(e).__name__, _without_notes(e)
    return None


def _without_notes(error: Exception) -> str:
    """The error's own text. Where the graph ran it fxloom adds a note naming the node (which
    differs between the blocking and the scheduled module); before Python 3.11 a note is
    written into the message, so it is cut off here."""
    text = str(error)
    for note in notes_of(error):
        text = text.replace(f"\n{note}", "")
    return text


def session(rank: int, world_size: int) -> dict | None:
    rpc.init_rpc(
        ("trainer", "ps")[rank], rank=rank, world_size=world_size, rpc_backend_options=rpc_options()
    )
    try:
        return run_on_the_trainer() if rank == 0 else None
    finally:
        rpc.shutdown()


@pytest.fixture(scope="module")
def on_the_trainer() -> dict:
    return run_local(session, 2, init="rpc")[0]


def test_the_scheduled_example_computes_what_the_blocking_one_does(on_the_trainer):
    assert on_the_trainer["example"]["equal"]
    assert on_the_trainer["example"]["equal_to_eager"]


def test_the_scheduled_code_starts_the_rpc_before_the_mlp_and_waits_right_before_cat(
    on_the_trainer,
):
    lines = [line.strip() for line in on_the_trainer["example"]["code"].splitlines()]
    start = next(i for i, line in enumerate(lines) if "rpc_async(" in line)
    wait = next(i for i, line in enumerate(lines) if "rpc_wait(" in line)
    first_mlp = next(i for i, line in enumerate(lines) if "self.mlp" in line)
    assert start < first_mlp < wait
    assert lines[wait + 1].startswith("cat = torch.cat(")


def test_a_late_argument_fetch_computes_the_same_scheduled(on_the_trainer):
    eager, blocking, scheduled = on_the_trainer["late_ids"]
    assert torch.equal(blocking, eager) and torch.equal(scheduled, eager)


def test_two_fetches_with_keywords_and_a_timeout_compute_the_same_scheduled(on_the_trainer):
    eager, blocking, scheduled = on_the_trainer["two_lookups"]
    assert torch.equal(blocking, eager) and torch.equal(scheduled, eager)


def test_a_remote_error_is_raised_by_the_scheduled_module_as_by_the_blocking_one(on_the_trainer):
    blocking, scheduled = on_the_trainer["errors"]
    assert blocking is not None and "no rows for 4 ids" in blocking[1]
    assert scheduled == blocking  # the same type (rpc's wrapper) and text, remote traceback too
