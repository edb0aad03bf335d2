"""Fast start: a fresh process to `import fxloom`, and to the first compiled `x + y`, beside Dynamo.

Each case runs in a new interpreter, ``--repeats`` times (cases interleaved, so a burst of load
on the machine hits every case alike); the tables give medians. A case's wall time runs from
just before the parent starts the child to the moment the child has its result (read on the
wall clock both share), so it counts the interpreter's start and every import, but not its exit.
The child also reports when each step ended, measured from its own start:

    python        the interpreter alone (``pass``)
    torch         ``import torch``
    fxloom        ``import torch; import fxloom``
    fxloom x + y  ``fxloom.compile(lambda x, y: x + y)(a, b)`` after both imports
    dynamo x + y  ``torch.compile(lambda x, y: x + y, backend="eager")(a, b)`` after ``import torch``

Modules are read from bytecode caches, as from an installed package: the children write and
read them under a scratch ``PYTHONPYCACHEPREFIX`` (the repository is not written), after one
discarded warm-up run of each case. ``--source`` compiles every module from source instead
(``PYTHONDONTWRITEBYTECODE``, no prefix), which is how a checkout runs with the bytecode cache
turned off.

Target (issue 35): a fresh process to the first compiled ``x + y`` in at most 1.6 s,
fxloom's first compile (the ``first result`` column: from the end of the imports to the
result) at most 0.25x Dynamo's, and ``x + y``'s per-call overhead (compiled minus eager, timed
in the same child after its first result) at most Dynamo's. The report also says which of
``torch._dynamo`` and ``sympy`` each compiler had imported by its first result.

    python benchmarks/bench_start.py [--repeats 5] [--source] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, load_average, machine_line, noise_line, publish

# Child programs: each prints one JSON object of {step: seconds since the interpreter started},
# the wall-clock time of its result, the heavy modules loaded by then, and (compiling cases)
# the per-call time of the compiled function and of eager, measured after the result.
# ``START`` is the child's own start (``-X importtime`` would slow the imports it measures).
# ``mark`` also notes the child's CPU time (``time.process_time``), which a loaded machine
# disturbs far less than the wall clock.
_PRELUDE = (
    "import sys, time\nSTART = time.time()\nSTEPS = {}\nCPU = {}\n"
    "DONE = None\nLOADED = []\nPER_CALL = {}\n"
    "def mark(step):\n"
    "    STEPS[step] = time.time() - START\n"
    "    CPU[step] = time.process_time()\n"
)
_REPORT = (
    "import json\n"
    "print(json.dumps({'done': DONE or time.time(), 'steps': STEPS, 'cpu': CPU,"
    " 'loaded': LOADED, 'per_call': PER_CALL}))\n"
)
# Per-call time: best of 5 rounds of 2,000 calls, compiled and eager rounds interleaved.
_PER_CALL = (
    "DONE = time.time()\n"
    "LOADED = [m for m in ('torch._dynamo', 'sympy') if m in sys.modules]\n"
    "import timeit\n"
    "eager = lambda x, y: x + y\n"
    "for _ in range(5):\n"
    "    for name, fn in (('compiled', compiled), ('eager', eager)):\n"
    "        seconds = timeit.timeit(lambda: fn(a, b), number=2000) / 2000\n"
    "        PER_CALL[name] = min(PER_CALL.get(name, seconds), seconds)\n"
)
CASES: dict[str, str] = {
    "python": "pass\n",
    "torch": "import torch\nmark('import torch')\n",
    "fxloom": ("import torch\nmark('import torch')\nimport fxloom\nmark('import fxloom')\n"),
    "fxloom x + y": (
        "import torch\nmark('import torch')\n"
        "import fxloom\nmark('import fxloom')\n"
        "a, b = torch.randn(8), torch.randn(8)\n"
        "compiled = fxloom.compile(lambda x, y: x + y)\n"
        "result = compiled(a, b)\n"
        "assert torch.equal(result, a + b)\n"
        "mark('first result')\n" + _PER_CALL
    ),
    "dynamo x + y": (
        "import torch\nmark('import torch')\n"
        "a, b = torch.randn(8), torch.randn(8)\n"
        "compiled = torch.compile(lambda x, y: x + y, backend='eager')\n"
        "result = compiled(a, b)\n"
        "assert torch.equal(result, a + b)\n"
        "mark('first result')\n" + _PER_CALL
    ),
}
STEPS = ("import torch", "import fxloom", "first result")


def child_environment(source: bool) -> dict[str, str]:
    """The children's environment: this checkout's fxloom first; bytecode cached or not."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if source:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "fxloom-bench-start")
    return env


def run_case(case: str, env: dict[str, str]) -> dict:
    """One fresh process: its wall time to the result, the child's own step times (wall and
    CPU clocks), what it had imported by its result, and its per-call times."""
    program = _PRELUDE + CASES[case] + _REPORT
    started = time.time()
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=ROOT
    )
    if completed.returncode != 0:
        raise RuntimeError(f"case {case!r} failed:\n{completed.stderr}")
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    per_call = {f"{name} per call": seconds for name, seconds in report["per_call"].items()}
    cpu = {f"cpu {step}": seconds for step, seconds in report["cpu"].items()}
    return {
        "wall": report["done"] - started,
        "loaded": report["loaded"],
        **report["steps"],
        **cpu,
        **per_call,
    }


def measure(repeats: int, source: bool) -> dict[str, list[dict]]:
    env = child_environment(source)
    for case in CASES:  # warm-up: fills the bytecode cache and the OS file cache
        run_case(case, env)
    runs: dict[str, list[dict]] = {case: [] for case in CASES}
    for _ in range(repeats):
        for case in CASES:
            runs[case].append(run_case(case, env))
    return runs


def _median(runs: list[dict], key: str) -> float | None:
    values = [run[key] for run in runs if key in run]
    return statistics.median(values) if values else None


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def report(runs: dict[str, list[dict]], source: bool, loads: tuple[float, float]) -> str:
    rows = [
        "| case | wall to result, median s | min | max | import torch | import fxloom "
        "| first result | first result - imports |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    compile_cost: dict[str, float] = {}
    for case, case_runs in runs.items():
        walls = [run["wall"] for run in case_runs]
        steps = [_median(case_runs, step) for step in STEPS]
        imports = steps[1] if steps[1] is not None else steps[0]
        after_imports = None if steps[2] is None else steps[2] - imports
        if after_imports is not None:
            compile_cost[case] = after_imports
        rows.append(
            f"| {case} | {statistics.median(walls):.3f} | {min(walls):.3f} | {max(walls):.3f} | "
            + " | ".join(_cell(step) for step in steps)
            + f" | {_cell(after_imports)} |"
        )
    first = statistics.median(run["wall"] for run in runs["fxloom x + y"])
    ratio = compile_cost["fxloom x + y"] / compile_cost["dynamo x + y"]
    modules = "compiled from source each run" if source else "read from bytecode caches"
    repeats = len(runs["python"])
    return "\n".join(
        [
            "## Fast start: a fresh process to the first compiled result",
            "",
            f"{machine_line()}. Date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
            f"Command: `python benchmarks/bench_start.py --repeats {repeats}"
            f"{' --source' if source else ''}`: each case in a fresh interpreter, {repeats} "
            f"runs interleaved after a warm-up run, medians; modules {modules}. Step columns: "
            "seconds from the child's start to the end of that step.",
            noise_line(loads, "."),
            "",
            *rows,
            "",
            f"A fresh process to fxloom's first compiled `x + y`: {first:.3f} s (target <= 1.6 s: "
            f"{'met' if first <= 1.6 else 'not met'}); fxloom's first compile after the imports "
            f"is {ratio:.2f}x Dynamo's (target <= 0.25x: {'met' if ratio <= 0.25 else 'not met'}).",
            "",
            *_cpu_table(runs),
            "",
            _loaded_line(runs),
            "",
            _per_call_line(runs),
        ]
    )


COMPILING = {"fxloom x + y": "fxloom", "dynamo x + y": "Dynamo"}


def _cpu_table(runs: dict[str, list[dict]]) -> list[str]:
    """The same steps on the child's CPU clock (interpreter start included), and the targets
    read on it: what the wall clock would show on a quiet machine, less waiting for files."""
    rows = [
        "CPU seconds of the child (``time.process_time``) at the end of each step, medians:",
        "",
        "| case | import torch | import fxloom | first result | first result - imports |",
        "|---|---:|---:|---:|---:|",
    ]
    compile_cost = {}
    for case in ("torch", "fxloom", *COMPILING):
        steps = [_median(runs[case], f"cpu {step}") for step in STEPS]
        imports = steps[1] if steps[1] is not None else steps[0]
        after_imports = None if steps[2] is None else steps[2] - imports
        compile_cost[case] = after_imports
        rows.append(
            f"| {case} | "
            + " | ".join(_cell(step) for step in steps)
            + f" | {_cell(after_imports)} |"
        )
    first = _median(runs["fxloom x + y"], "cpu first result")
    ratio = compile_cost["fxloom x + y"] / compile_cost["dynamo x + y"]
    rows += [
        "",
        f"On the CPU clock: fxloom's first compiled `x + y` at {first:.3f} s (target <= 1.6 s: "
        f"{'met' if first <= 1.6 else 'not met'}), its first compile {ratio:.2f}x Dynamo's "
        f"(target <= 0.25x: {'met' if ratio <= 0.25 else 'not met'}).",
    ]
    return rows


def _loaded_line(runs: dict[str, list[dict]]) -> str:
    """Which of torch._dynamo and sympy each compiler had imported by its first result."""
    parts = []
    for case, name in COMPILING.items():
        loaded = sorted({module for run in runs[case] for module in run["loaded"]})
        parts.append(f"{name}: {', '.join(f'`{m}`' for m in loaded) or 'neither'}")
    return (
        "Imported by the first result (of `torch._dynamo` and `sympy`, in any run): "
        + "; ".join(parts)
        + "."
    )


def _per_call_line(runs: dict[str, list[dict]]) -> str:
    """`x + y` per call after the first: compiled and eager, and the overhead of each compiler."""
    overhead = {}
    parts = []
    for case, name in COMPILING.items():
        compiled = _median(runs[case], "compiled per call") * 1e6
        eager = _median(runs[case], "eager per call") * 1e6
        overhead[name] = compiled - eager
        parts.append(f"{name} {compiled:.1f} (eager {eager:.1f}: overhead {compiled - eager:+.1f})")
    met = "met" if overhead["fxloom"] <= overhead["Dynamo"] else "not met"
    return (
        "`x + y` per call after the first, us (in each run the best of 5 rounds of 2,000 calls, "
        f"compiled and eager interleaved; median over runs): {'; '.join(parts)}. Target: "
        f"fxloom's overhead <= Dynamo's: {met}."
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--source", action="store_true", help="no bytecode cache")
    parser.add_argument("--record", action="store_true", help="append to benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    load_before = load_average()
    runs = measure(args.repeats, args.source)
    publish(report(runs, args.source, (load_before, load_average())), args.record)


if __name__ == "__main__":
    main()
