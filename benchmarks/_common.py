"""What the benchmark scripts share: timing, the machine description, recording results.

Every ``benchmarks/bench_*.py`` times fxloom (and usually torch.fx) the same way and reports
the same way; this module is that common part, so the scripts hold only what they measure:

    timed, timed_call     one run of a callable, garbage collector off inside it
    rotated               the order of the sides for a repeat, each going first in turn
    Samples               every timed run by label: best, spread, paired ratios
    compute_nodes         graph nodes other than placeholders and the output
    freeze_startup_heap   keep the collections between timed regions short
    machine_line          "Machine: ...; Python ...; torch ...; fxloom ... (commit ...)"
    cpu_count, load_average
    publish               print a markdown report; with ``record``, append it to RESULTS.md

The scripts run both as ``python benchmarks/bench_x.py`` and as ``benchmarks.bench_x``; run
as a script, each first puts the repository root on ``sys.path`` so that
``from benchmarks._common import ...`` works from anywhere.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

import fxloom

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"

T = TypeVar("T")


# ----------------------------------------------------------------------------- timing
def timed_call(fn: Callable[[], T]) -> tuple[float, T]:
    """(seconds, result) of one ``fn()``, with the garbage collector off while it runs.

    Collecting just before keeps a collection triggered by earlier work out of the timing.
    """
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        result = fn()
        return time.perf_counter() - start, result
    finally:
        gc.enable()


def timed(fn: Callable[[], Any]) -> float:
    """Seconds of one ``fn()``, as :func:`timed_call` times it."""
    return timed_call(fn)[0]


def rotated(items: list[T], shift: int) -> list[T]:
    """``items`` rotated by ``shift``: in repeat ``shift``, a different one goes first.

    With two sides this alternates them, which matters: the second to run finds the memory
    state the first left.
    """
    shift %= len(items)
    return items[shift:] + items[:shift]


@dataclass
class Samples:
    """Every timed run, by label, so a table can show the best and the notes the spread."""

    runs: dict[str, list[float]] = field(default_factory=dict)

    def add(self, label: str, seconds: float) -> None:
        self.runs.setdefault(label, []).append(seconds)

    def best(self, label: str) -> float:
        return min(self.runs[label])

    def spread(self, label: str) -> float:
        """How far the median run is above the best one (0.1: 10%); a noise indicator."""
        runs = self.runs[label]
        return statistics.median(runs) / min(runs) - 1.0

    def noisiest(self) -> tuple[str, float]:
        label = max(self.runs, key=self.spread)
        return label, self.spread(label)

    def typical_spread(self) -> float:
        return statistics.median(self.spread(label) for label in self.runs)

    def paired_ratio(self, label: str, baseline: str) -> float:
        """Median over repeats of run i of ``label`` / run i of ``baseline``.

        The two are timed next to each other in each repeat, so a machine that is slower for
        a while (a busy neighbour on a shared core) slows both and cancels out of the ratio.
        """
        return statistics.median(a / b for a, b in zip(self.runs[label], self.runs[baseline]))


def freeze_startup_heap() -> None:
    """Move what is alive now (torch's import leaves a big heap) out of the collector's sight.

    Each ``gc.collect()`` between timed regions then takes milliseconds instead of a tenth
    of a second. Call it once, after the imports and before timing.
    """
    gc.collect()
    gc.freeze()


def compute_nodes(gm: Any) -> int:
    """Graph nodes other than placeholders and the output (fxloom or torch.fx module)."""
    return sum(node.op not in ("placeholder", "output") for node in gm.graph.nodes)


# ----------------------------------------------------------------------------- reporting
def cpu_count() -> int:
    """CPUs this process may run on (its affinity where the platform says)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def load_average() -> float:
    """The 1-minute load average; NaN where the platform has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def noise_line(loads: tuple[float, float], detail: str) -> str:
    """The "Noise:" sentence under a recorded table: load before and after, then ``detail``."""
    return (
        f"Noise: 1-minute load average {loads[0]:.2f} before, {loads[1]:.2f} after the run "
        f"({cpu_count()} cores){detail}"
    )


SPREAD_IS = "; spread = how far the median run is above the best."


def commit() -> str:
    """The checkout's short commit, '+' if fxloom/ has uncommitted changes; '?' without git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "fxloom"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "?"
    if head.returncode:
        return "?"
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def cpu_model() -> str:
    """The CPU's model name and the vector features the kernels key on, e.g. ``AMD EPYC
    (AVX2, no VNNI)``: figures from CPUs with and without VNNI differ in kind."""
    name = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    capability = torch.backends.cpu.get_cpu_capability()
    vnni = "VNNI" if torch.cpu._is_vnni_supported() else "no VNNI"
    return f"{name} ({capability}, {vnni})"


# the code a benchmark measures is the code it imported: read at import, not when printing
# (a commit made while a long run goes on would otherwise name code that never ran)
COMMIT_AT_START = commit()


def machine_line() -> str:
    """What a recorded table was measured on and with, for the line under its heading.

    ``Machine: x86_64, cpu, 2 cores; Python 3.11.7; torch 2.13.0+cpu; fxloom 0.1.0
    (commit ec9677f)`` (on one line); the caller adds its command and method.
    """
    machine = f"{platform.machine()}, {cpu_model()}, {cpu_count()} cores"
    return (
        f"Machine: {machine}; Python {platform.python_version()}; torch {torch.__version__}; "
        f"fxloom {fxloom.__version__} (commit {COMMIT_AT_START})"
    )


def append_to_results(markdown: str, results: Path = RESULTS) -> Path:
    """Append ``markdown`` to ``results`` (created with a title if missing); return its path."""
    existing = results.read_text() if results.exists() else "# Benchmark results\n\n"
    results.write_text(existing.rstrip() + "\n\n" + markdown)
    return results


def publish(markdown: str, record: bool) -> None:
    """Print the report after a blank line; with ``record``, also append it to RESULTS.md."""
    print()
    print(markdown)
    if record:
        print(f"recorded in {append_to_results(markdown)}")
