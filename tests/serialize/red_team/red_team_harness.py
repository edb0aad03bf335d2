"""The red-team harness: hostile files, loaded and called in a child process, judged here.

A ``Case`` is one hostile file (built in this process by a small function, so a case reads as
the attack it is), its kind (``graph_module`` for ``fxloom.load``, ``exported`` for
``fxloom.export.load(...).module()``, ``text`` for ``fxloom.parse_graph``) and the inputs it is
called with. ``run_cases`` writes the files of a batch to a fresh temporary directory and runs
``red_team_runner.py`` there (a fresh interpreter, cwd = that directory) which loads and calls
each file with recorders installed and limits set, and reports one verdict per file. If the
child dies (a signal, the CPU or wall-clock limit), the file it was on gets that verdict and the
rest of the batch runs in a new child. ``assert_refused`` is the one rule every case is held to.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

RUNNER = Path(__file__).with_name("red_team_runner.py")
REPO = Path(__file__).resolve().parents[3]
WALL_SECONDS_PER_FILE = 12  # the child's own CPU limit is 10 s per file
STARTUP_SECONDS = 90  # importing torch and fxloom, and the warm-up, on a busy machine
LIMIT_SECONDS = 10


@dataclass
class Case:
    """One hostile file: ``build()`` returns its bytes (or text, for ``kind="text"``)."""

    id: str
    doc: str
    build: Callable[[], bytes | str]
    kind: str = "graph_module"
    inputs: list = field(default_factory=lambda: [{"randn": [4, 3]}])
    engine: str | None = None  # torch.backends.quantized.engine while loading; None: as is


# family name -> its cases; each test module registers its own at import (collection) time.
FAMILIES: dict[str, list[Case]] = {}


def family(name: str, cases: list[Case]) -> list[Case]:
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), f"duplicate case ids in {name}"
    FAMILIES[name] = cases
    return cases


def case(
    id: str, kind: str = "graph_module", inputs: list | None = None, engine: str | None = None
):
    """Decorator: the function builds the file; its docstring says the attack."""

    def make(build: Callable[[], bytes | str]) -> Case:
        doc = (build.__doc__ or id).strip().splitlines()[0]
        given = inputs if inputs is not None else [{"randn": [4, 3]}]
        return Case(id, doc, build, kind, given, engine)

    return make


# ------------------------------------------------------------------- running
def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        MALLOC_ARENA_MAX="2",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
    )
    return env


def _launch(cases: list[Case], files: dict[str, str], workdir: Path, attempt: int):
    manifest = workdir / f"manifest{attempt}.json"
    results = workdir / f"results{attempt}.jsonl"
    manifest.write_text(
        json.dumps(
            {
                "cases": [
                    {
                        "id": c.id,
                        "kind": c.kind,
                        "file": files[c.id],
                        "inputs": c.inputs,
                        "engine": c.engine,
                    }
                    for c in cases
                ]
            }
        )
    )
    results.write_text("")
    log = open(workdir / f"child.{attempt}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, str(RUNNER), str(manifest), str(results)],
        cwd=workdir,
        env=_child_env(),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, results, log


def _read_lines(results: Path) -> list[dict]:
    lines = []
    for line in results.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a partial last line from a child that died mid-write
    return lines


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


_BUILDING = threading.Lock()


def run_cases(cases: list[Case]) -> dict[str, dict]:
    """A verdict per case id; see ``red_team_runner.run_case`` for its fields."""
    verdicts: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="fxloom-red-team-") as tmp:
        workdir = Path(tmp)
        files: dict[str, str] = {}
        runnable = []
        for number, c in enumerate(cases):
            try:
                with _BUILDING:  # tracing patches torch globally: one build at a time
                    content = c.build()
            except Exception:
                verdicts[c.id] = {
                    "id": c.id,
                    "outcome": "not_built",
                    "message": traceback.format_exc(limit=3)[-1500:],
                }
                continue
            name = f"case{number:03d}.{'txt' if c.kind == 'text' else 'fxl'}"
            mode = "w" if isinstance(content, str) else "wb"
            with open(workdir / name, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
                f.write(content)
            files[c.id] = name
            runnable.append(c)
        attempt = 0
        pending = runnable
        while pending:
            attempt += 1
            pending = _run_batch(pending, files, workdir, attempt, verdicts)
    return verdicts


def _run_batch(cases, files, workdir, attempt, verdicts) -> list[Case]:
    """Run ``cases`` in one child; return those still to run if it died on one of them."""
    proc, results, log = _launch(cases, files, workdir, attempt)
    current, since = None, time.monotonic()
    try:
        while True:
            code = proc.poll()
            lines = _read_lines(results)
            started = [line["start"] for line in lines if "start" in line]
            done = {line["verdict"]["id"]: line["verdict"] for line in lines if "verdict" in line}
            verdicts.update(done)
            if started and started[-1] != current:
                current, since = started[-1], time.monotonic()
            if code is not None:
                break
            limit = WALL_SECONDS_PER_FILE if current is not None and current not in done else None
            waited = time.monotonic() - since
            if current is None and waited > STARTUP_SECONDS:
                _kill(proc)
                raise RuntimeError(f"the red-team child did not start: {_tail(workdir, attempt)}")
            if limit is not None and waited > limit:
                _kill(proc)
                code = "timeout"
                break
            time.sleep(0.05)
    finally:
        log.close()
        if proc.poll() is None:
            _kill(proc)
    lines = _read_lines(results)
    verdicts.update({line["verdict"]["id"]: line["verdict"] for line in lines if "verdict" in line})
    if any(line.get("done") for line in lines):
        return []
    started = [line["start"] for line in lines if "start" in line]
    if not started:
        raise RuntimeError(
            f"the red-team child failed before the first file: {_tail(workdir, attempt)}"
        )
    culprit = started[-1]
    verdicts[culprit] = {
        "id": culprit,
        "outcome": "died",
        "how": _death(code),
        "log": _tail(workdir, attempt),
    }
    ids = [c.id for c in cases]
    return cases[ids.index(culprit) + 1 :]


def _death(code) -> str:
    if code == "timeout":
        return f"TIMEOUT: still running after {WALL_SECONDS_PER_FILE} s of wall-clock time"
    if isinstance(code, int) and code < 0:
        number = -code
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else "?"
        if number == signal.SIGXCPU:
            return f"CPU LIMIT: killed by {name} (signal {number}) after {LIMIT_SECONDS} s of CPU"
        return f"CRASH: killed by signal {number} ({name})"
    return f"the child exited with status {code} in the middle of the file"


def _tail(workdir: Path, attempt: int) -> str:
    path = workdir / f"child.{attempt}.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-1500:]


# ----------------------------------------------------------------- judging
def problems(verdict: dict, kind: str = "graph_module") -> list[str]:
    """What is wrong with ``verdict`` against: refused with SerializationError (GraphParseError
    for text) while loading, nothing recorded, no file changed, within 10 s and 1 GiB; and,
    an error message holding no character a terminal acts on; and, for the files ``fxloom
    show`` reads, shown without crashing, recording nothing, and printing no such character."""
    outcome = verdict.get("outcome")
    if outcome == "not_built":
        return [
            f"the hostile file could not be built (the case needs this to work):\n{verdict['message']}"
        ]
    if outcome == "died":
        return [
            f"{verdict['how']} while loading or calling the file; child log tail:\n{verdict['log']}"
        ]
    found = []
    expected = "GraphParseError" if kind == "text" else "SerializationError"
    message = verdict.get("message", "")
    if outcome == "loaded_and_ran":
        found.append(f"GOT THROUGH: loaded and ran (the call returned {verdict['result']})")
    elif outcome == "raised":
        error = verdict["error_type"].rsplit(".", 1)[-1]
        if verdict["stage"] == "call":
            found.append(f"GOT THROUGH: loaded; the call then raised {error}: {message[:300]}")
        elif "MemoryError" in error or "allocate" in message:
            found.append(f"MEMORY: loading ran out of its 1 GiB ({error}: {message[:200]})")
        else:
            found.append(f"loading raised {error}, not {expected}: {message[:300]}")
    while_loading = verdict.get("recorded_while_loading", [])
    at_call = verdict.get("recorded", [])[len(while_loading) :]
    if while_loading:
        found.append(f"RECORDED dangerous calls WHILE LOADING: {while_loading}")
    if at_call:
        found.append(f"RECORDED dangerous calls at the first call: {at_call}")
    if verdict.get("files_changed"):
        found.append(f"FILES CHANGED in the working directory: {verdict['files_changed']}")
    if verdict.get("seconds", 0) > LIMIT_SECONDS:
        found.append(f"SLOW: took {verdict['seconds']} s (limit {LIMIT_SECONDS} s)")
    return found + review_problems(verdict)


def review_problems(verdict: dict) -> list[str]:
    """What went wrong in what a reviewer reads: the error message and ``fxloom show``'s output
    (``red_team_runner.review_case``)."""
    found = []
    if verdict.get("message_printed"):
        found.append(f"the ERROR MESSAGE holds control characters: {verdict['message_printed']}")
    if verdict.get("show_crashed"):
        found.append(f"SHOW crashed: {verdict['show_crashed']}")
    if verdict.get("show_printed"):
        found.append(f"SHOW printed control characters: {verdict['show_printed'][:5]}")
    if verdict.get("recorded_while_showing"):
        found.append(f"RECORDED dangerous calls WHILE SHOWING: {verdict['recorded_while_showing']}")
    return found


def assert_refused(verdicts: dict[str, dict], c: Case) -> None:
    verdict = verdicts.get(c.id)
    assert verdict is not None, f"{c.id}: no verdict (the harness lost it)"
    found = problems(verdict, c.kind)
    assert not found, f"{c.id} ({c.doc}):\n  " + "\n  ".join(found)
