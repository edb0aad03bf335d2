"""The generative red team (issue 32): mutants of every kind of valid file are refused with
``SerializationError``, or load as a module that computes what ``fxloom show`` displays.

Beside the hand-written families, hypothesis mutates one small valid file of every kind fxloom
writes (``generative_corpus``: traced, traced with real container modules, exported plain, with
a dynamic batch and with ``fxloom.cond``, quantized, lowered to ONNX Runtime, and a pipeline's
two stage modules) with the edits of ``generative_mutations.MUTATIONS``: names replaced by
look-alikes Python folds to another name (``self``, ``torch``, a builtin, a keyword, another
name of the file), nodes inserted before the output that write into the module tree or call
classes, and module attributes changed within their types. A quantized file is loaded on a
quantized engine drawn among those torch has (fbgemm, qnnpack, onednn, x86).

The mutants are drawn and judged in ONE child interpreter (``generative_driver.py``; a mutant
may kill it, with SIGFPE in a native kernel) with a seed, so every run tries the same files.
The driver's docstring says how a mutant is judged; in short, loading must raise
``SerializationError``, or give a module ``M`` that, called on the file's inputs with an audit
hook recording process, library, pickle, import and file-writing events, records nothing,
leaves its module tree as it was, and gives the result of the graphs ``fxloom show`` prints
(parsed back with ``fxloom.parse_graph``, built over ``M``'s modules and run node by node by
``fxloom.Interpreter``, so no generated Python stands between the text and what it computes)
on the same inputs, or raises as they do. For an exported program ``M`` is ``program.module()`` and the shown
graph is the lifted one, called with the inputs its printed ``graph_signature`` names (state
from ``program.state_dict`` and ``program.constants``); its user outputs are compared with
the tensors of ``M``'s result.

If the child dies or hangs on a mutant, that mutant is a failure and a new child goes on
after it (the same draws, the ones before not judged again, but compared with the first
child's: the draws of a seed do not depend on the process). Every run simulates one such
crash (``CRASH_AT``) to show it. Every mutant that got through is named in the failure,
grouped by the kind of file, the mutations and the outcome. The corpus is built once per
version of fxloom and kept in pytest's cache.

CI draws ``CI_EXAMPLES`` mutants (well within a minute on two cores); a longer run sets
``FXLOOM_RED_TEAM_EXAMPLES`` (``make red-team``), and ``FXLOOM_RED_TEAM_SEED`` another seed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from red_team_harness import REPO, _child_env

HERE = Path(__file__).parent
DRIVER = HERE / "generative_driver.py"
CI_EXAMPLES = 500
EXAMPLES = int(os.environ.get("FXLOOM_RED_TEAM_EXAMPLES", CI_EXAMPLES))
SEED = int(os.environ.get("FXLOOM_RED_TEAM_SEED", "0"))
STARTUP_SECONDS = 120  # importing torch, building the corpus, on a busy machine
SECONDS_PER_MUTANT = 20  # the driver's own CPU limit is 10 s per mutant
MAX_CHILDREN = 12  # a crash per child at most: beyond, the run stops and says so
# The driver kills itself at the first mutant from this index on, as a native crash would:
# every run shows that a crash is named and the run goes on after it.
CRASH_AT = 100
OK = {"refused", "equal", "both_raised"}


@dataclass
class Run:
    """What the driver children reported: controls, one record per mutant, and the deaths."""

    controls: dict[str, dict] = field(default_factory=dict)
    mutants: dict[int, dict] = field(default_factory=dict)  # index -> start line + verdict
    mutation_errors: list[dict] = field(default_factory=list)
    redrawn: dict[int, bool] = field(default_factory=dict)  # index -> drawn alike again
    simulated_crash: int | None = None  # the mutant the driver killed itself on
    seconds: float = 0.0
    stopped: str = ""

    def got_through(self) -> list[dict]:
        """The mutants not refused nor the same as shown (the simulated crash left out)."""
        return [
            m
            for i, m in self.mutants.items()
            if m["verdict"]["outcome"] not in OK and i != self.simulated_crash
        ]


def corpus_folder(cache: Path) -> Path:
    """Where the corpus is kept between runs under ``cache``: one folder per version of what
    writes it (fxloom's sources, the corpus builders, torch), so a change builds it anew."""
    digest = hashlib.sha256(importlib.metadata.version("torch").encode())
    sources = sorted((REPO / "fxloom").rglob("*.py"))
    sources += [HERE / "generative_corpus.py", HERE / "red_team_files.py"]
    for path in sources:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return cache / digest.hexdigest()[:16]


def run_driver(
    folder: Path, examples: int, seed: int, crash_at: int = -1, corpus: Path | None = None
) -> Run:
    """Run driver children until every mutant has a verdict (a crash: the next child skips
    past the mutant it died on)."""
    run, skip, started = Run(), 0, time.perf_counter()
    for attempt in range(MAX_CHILDREN):
        results = folder / f"results{attempt}.jsonl"
        died = _one_child(folder, results, [examples, seed, skip, crash_at], run, corpus)
        if died is None:
            break
        skip = died + 1
    else:
        run.stopped = f"stopped after {MAX_CHILDREN} children died"
    run.seconds = time.perf_counter() - started
    return run


def _one_child(folder: Path, results: Path, numbers: list[int], run: Run, corpus: Path | None):
    """One driver child (``numbers``: examples, seed, skip, crash_at); the index of the mutant
    it died or hung on, or None if it finished."""
    results.write_text("")
    command = [sys.executable, str(DRIVER), str(folder), str(results)]
    command += ["--corpus", str(corpus)] if corpus is not None else []
    for option, number in zip(("--examples", "--seed", "--skip", "--crash-at"), numbers):
        command += [option, str(number)]
    with open(folder / f"{results.stem}.log", "wb") as log:
        proc = subprocess.Popen(
            command, cwd=folder, env={**_child_env(), "PYTHONBREAKPOINT": "0"},
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        hung = _wait(proc, results)
    lines = _read(results)
    _collect(lines, run)
    last_start = next((line for line in reversed(lines) if "start" in line), None)
    finished = any("summary" in line for line in lines)
    if finished:
        return None
    if last_start is None or last_start["start"] in run.mutants or "mutation_error" in last_start:
        log_tail = (folder / f"{results.stem}.log").read_text(errors="replace")[-1500:]
        run.stopped = f"the driver died before judging a mutant (rc {proc.returncode}): {log_tail}"
        return None
    how = "hung" if hung else f"died (rc {proc.returncode})"
    run.mutants[last_start["start"]] = {**last_start, "verdict": {"outcome": f"child {how}"}}
    return last_start["start"]


def _wait(proc: subprocess.Popen, results: Path) -> bool:
    """Wait for the child; kill it (and say so) when it spends too long on one mutant."""
    deadline = time.monotonic() + STARTUP_SECONDS
    seen = 0
    while proc.poll() is None:
        time.sleep(0.2)
        size = results.stat().st_size
        if size != seen:
            seen, deadline = size, time.monotonic() + SECONDS_PER_MUTANT
        elif time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
    return False


def _read(results: Path) -> list[dict]:
    lines = []
    for text in results.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            break  # a partial last line from a child that died mid-write
    return lines


def _collect(lines: list[dict], run: Run) -> None:
    started = {}
    for line in lines:
        if "control" in line:
            run.controls[line["control"]] = line["verdict"]
        elif "mutation_error" in line:
            run.mutation_errors.append(line)
        elif "start" in line:
            started[line["start"]] = line
        elif "verdict" in line:
            run.mutants[line["index"]] = {**started[line["index"]], "verdict": line["verdict"]}
        elif "simulated_crash" in line:
            run.simulated_crash = line["simulated_crash"]
        elif "drawn" in line:
            first = run.mutants.get(line["drawn"])
            if first is not None:
                run.redrawn[line["drawn"]] = (first["entry"], first["did"]) == (
                    line["entry"],
                    line["did"],
                )


# ------------------------------------------------------------------ reporting
def grouped(mutants: list[dict]) -> dict[tuple, list[dict]]:
    """Mutants by (kind of file, mutations, outcome)."""
    groups = defaultdict(list)
    for m in mutants:
        groups[
            (m["kind"], " + ".join(sorted(set(m["mutations"]))), m["verdict"]["outcome"])
        ].append(m)
    return dict(sorted(groups.items()))


def describe(mutants: list[dict], examples_per_group: int = 2) -> str:
    lines = []
    for (kind, mutations, outcome), members in grouped(mutants).items():
        lines.append(f"- {kind} / {mutations} / {outcome}: {len(members)} mutant(s)")
        for m in members[:examples_per_group]:
            detail = m["verdict"].get("error") or m["verdict"].get("changed") or ""
            recorded = m["verdict"].get("recorded")
            lines.append(f"    #{m['start']} {m['entry']}: {'; '.join(m['did'])}")
            lines.append(f"        -> {recorded or ''} {str(detail)[:400]}")
    return "\n".join(lines)


def counts(run: Run) -> str:
    """Per kind of file: mutants tried, refused, loaded and equal (or both raised), got through
    (the simulated crash left out)."""
    table = defaultdict(Counter)
    for i, m in run.mutants.items():
        if i == run.simulated_crash:
            continue
        outcome = m["verdict"]["outcome"]
        column = (
            "refused"
            if outcome == "refused"
            else "loaded, same"
            if outcome in OK
            else "got through"
        )
        table[m["entry"]][column] += 1
        table[m["entry"]]["tried"] += 1
    rows = [
        "| entry | tried | refused | loaded, same as shown | got through |",
        "|---|---|---|---|---|",
    ]
    for entry, c in sorted(table.items()):
        rows.append(
            f"| {entry} | {c['tried']} | {c['refused']} | {c['loaded, same']} | {c['got through']} |"
        )
    total = sum((c for c in table.values()), Counter())
    rows.append(
        f"| all | {total['tried']} | {total['refused']} | {total['loaded, same']} | {total['got through']} |"
    )
    return "\n".join(rows)


# ------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def red_team_run(tmp_path_factory, pytestconfig) -> Run:
    cache = getattr(pytestconfig, "cache", None)  # None under -p no:cacheprovider
    kept = cache.mkdir("generative-red-team-corpus") if cache is not None else None
    folder = tmp_path_factory.mktemp("generative-red-team")
    corpus = corpus_folder(kept or tmp_path_factory.mktemp("generative-red-team-corpus"))
    run = run_driver(folder, EXAMPLES, SEED, CRASH_AT, corpus)
    if EXAMPLES != CI_EXAMPLES:  # a long run (make red-team): the figures for RESULTS.md
        print(f"\n{len(run.mutants)} mutants (seed {SEED}) in {run.seconds:.0f} s\n{counts(run)}")
        print(describe(run.got_through(), examples_per_group=3))
    return run


def test_every_valid_file_of_the_corpus_computes_what_show_displays(red_team_run):
    """The judge's control: the unmutated files load, record nothing, and are 'equal'."""
    assert red_team_run.controls, red_team_run.stopped or "the driver judged no control"
    assert {name: v["outcome"] for name, v in red_team_run.controls.items()} == {
        name: "equal" for name in red_team_run.controls
    }, red_team_run.controls


def test_the_mutants_are_drawn_alike_on_every_run_of_a_seed(red_team_run):
    """The driver started again after the (simulated) crash draws the mutants before it anew,
    in another process, without judging them: the same ones as the first driver."""
    redrawn = red_team_run.redrawn
    assert len(redrawn) >= CRASH_AT // 2, red_team_run.stopped
    assert all(redrawn.values()), [i for i, same in redrawn.items() if not same]


def test_a_mutant_that_kills_the_driver_is_named_and_the_run_goes_on(red_team_run):
    """The driver kills itself at a mutant (as SIGFPE in a native kernel would): that mutant
    gets the verdict 'child died', and the mutants after it are still judged."""
    crashed = red_team_run.simulated_crash
    assert crashed is not None and crashed >= CRASH_AT, red_team_run.stopped
    assert (
        red_team_run.mutants[crashed]["verdict"]["outcome"] == f"child died (rc {-signal.SIGFPE})"
    )
    assert max(red_team_run.mutants) > crashed


def test_every_mutant_is_refused_or_computes_what_show_displays(red_team_run):
    run = red_team_run
    assert not run.stopped, run.stopped
    assert not run.mutation_errors, run.mutation_errors[0]["mutation_error"]
    assert len(run.mutants) >= EXAMPLES * 0.9, f"only {len(run.mutants)} mutants were judged"
    through = run.got_through()
    assert not through, f"{len(through)} of {len(run.mutants)} mutants got through:\n" + describe(
        through
    )


def test_every_mutation_and_every_kind_of_file_is_tried(red_team_run):
    """The sample reaches every file of the corpus and every family of mutations; the long run
    (``make red-team``) every row of the table. Which rare rows a 500-mutant slice draws
    depends on the hypothesis release and the corpus bytes (another torch), so CI asks for
    the families only."""
    from generative_mutations import MUTATIONS

    tried = {name for m in red_team_run.mutants.values() for name in m.get("mutations", [])}
    if EXAMPLES == CI_EXAMPLES:
        families = {m.family for m in MUTATIONS if m.name in tried}
        assert families == {m.family for m in MUTATIONS}
    else:
        assert tried == {m.name for m in MUTATIONS}
    assert {m["entry"] for m in red_team_run.mutants.values()} == set(red_team_run.controls)


@settings(max_examples=200, derandomize=True, database=None)
@given(
    st.sampled_from(["self", "torch", "getattr", "lambda", "weight", "p_lin_bias", "x"]), st.data()
)
def test_a_look_alike_is_another_identifier_that_python_folds_to_its_target(target, data):
    from generative_mutations import look_alike

    spelled = look_alike(target, data.draw)
    assert spelled != target and spelled.isidentifier()
    assert unicodedata.normalize("NFKC", spelled) == target
