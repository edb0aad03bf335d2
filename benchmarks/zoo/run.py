"""Run every (model, method) pair of the zoo in a fresh subprocess; write the results.

    python -m benchmarks.zoo.run                   # everything; or: make zoo
    python benchmarks/zoo/run.py --models bert vit --methods fxloom torch.fx --jobs 2
    python -m benchmarks.zoo.run --report-only     # rewrite the report from results.json

Each pair runs ``benchmarks.zoo.worker`` in its own interpreter under ``--timeout``, so a
crash, a hang or leaked state (patched functions, caches) stays with that pair. Results go
to ``results.json`` (a partial run updates only its pairs) and the report, regenerated from
all results, to ``RESULTS.md``; the overall table and the targets also replace the block
between the zoo markers in docs/benchmarks.md.

Depends on: the standard library; the workers import torch, transformers and fxloom.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks.zoo` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.zoo import report
from benchmarks.zoo.methods import ALL_METHODS
from benchmarks.zoo.registry import SPECS
from benchmarks.zoo.worker import RESULT_PREFIX

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS_JSON = HERE / "results.json"
RESULTS_MD = HERE / "RESULTS.md"
README = ROOT / "docs" / "benchmarks.md"  # its zoo block (the README keeps a summary)


def run_pair(model: str, method: str, timeout: float) -> dict[str, Any]:
    """One worker subprocess: its JSON result, or a record of how it failed to give one."""
    command = [sys.executable, "-m", "benchmarks.zoo.worker", model, method]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    base = {"model": model, "method": method, "family": SPECS[model].family}
    start = time.perf_counter()
    try:
        process = subprocess.run(
            command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {**base, "status": "error", "error": "Timeout", "message": f"over {timeout:g} s"}
    wall = time.perf_counter() - start
    for line in reversed(process.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return {**json.loads(line[len(RESULT_PREFIX) :]), "wall_s": wall}
    last = (process.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {
        **base,
        "status": "error",
        "error": "WorkerCrash",
        "message": f"exit {process.returncode}: {last[:300]}",
        "wall_s": wall,
    }


def versions() -> str:
    from importlib.metadata import version

    return ", ".join(f"{name} {version(name)}" for name in ("torch", "transformers", "fxloom"))


def load_results() -> dict[tuple[str, str], dict[str, Any]]:
    if not RESULTS_JSON.exists():
        return {}
    records = json.loads(RESULTS_JSON.read_text())["results"]
    return {(r["model"], r["method"]): r for r in records if r["model"] in SPECS}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(SPECS), default=list(SPECS))
    parser.add_argument("--methods", nargs="+", choices=ALL_METHODS, default=ALL_METHODS)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per pair")
    parser.add_argument("--jobs", type=int, default=1, help="pairs run at once")
    parser.add_argument(
        "--record",
        action="store_true",
        help="also append the compile targets (fxloom.compile vs torch.compile) to "
        "benchmarks/RESULTS.md",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: rewrite RESULTS.md and the README block from results.json",
    )
    return parser.parse_args(argv)


LOADS: list[float] = []  # the 1-minute load average after each pair, for the report


def run_all(pairs: list[tuple[str, str]], timeout: float, jobs: int) -> list[dict[str, Any]]:
    """Every pair's result, in order, printing one progress line per pair."""
    results = []
    LOADS.append(os.getloadavg()[0])
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_pair, model, method, timeout) for model, method in pairs]
        for done, future in enumerate(futures, 1):
            result = future.result()
            results.append(result)
            LOADS.append(os.getloadavg()[0])
            detail = "" if result["status"] == "ok" else result.get("error", "")
            print(
                f"[{done}/{len(pairs)}] {result['model']:<18} {result['method']:<16} "
                f"{result['status']:<8} {detail}",
                flush=True,
            )
    return results


def _history(
    previous: dict[str, Any] | None, run: dict[str, Any], methods: set[str], models: set[str]
) -> list[dict[str, Any]]:
    """The runs the results come from: earlier ones still holding pairs, then this one."""
    earlier = (previous or {}).get("history") or ([previous] if previous else [])
    kept = []
    for entry in earlier:
        entry = {k: v for k, v in entry.items() if k != "history"}
        covered = entry.get("methods"), entry.get("models")
        if covered[0] is not None and set(covered[0]) <= methods and set(covered[1]) <= models:
            continue  # every pair it measured was measured again
        kept.append(entry)
    this = {k: v for k, v in run.items() if k != "history"}
    return [*kept, {**this, "methods": sorted(methods), "models": sorted(models)}]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = load_results()
    previous = json.loads(RESULTS_JSON.read_text())["run"] if RESULTS_JSON.exists() else None
    if args.report_only:
        run_info = previous
    else:
        pairs = [(model, method) for model in args.models for method in args.methods]
        start = time.perf_counter()
        for result in run_all(pairs, args.timeout, args.jobs):
            results[result["model"], result["method"]] = result
        arguments = sys.argv[1:] if argv is None else argv
        run_info = {
            "command": " ".join(["python -m benchmarks.zoo.run", *arguments]),
            "date": date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores; "
            f"Python {platform.python_version()}",
            "versions": versions(),
            "pairs": len(pairs),
            "jobs": args.jobs,
            "elapsed_s": round(time.perf_counter() - start, 1),
            "load": f"1-minute load average {LOADS[0]:.2f} at the start, median "
            f"{sorted(LOADS)[len(LOADS) // 2]:.2f} and max {max(LOADS):.2f} over the run "
            f"({os.cpu_count()} cores, shared with other work)",
        }
        run_info["history"] = _history(previous, run_info, set(args.methods), set(args.models))
    ordered = [results[key] for key in sorted(results, key=report.sort_key)]
    RESULTS_JSON.write_text(json.dumps({"run": run_info, "results": ordered}, indent=1) + "\n")
    report.write(ordered, run_info, RESULTS_MD, README)
    print(f"{len(ordered)} results; wrote {RESULTS_JSON.name} and {RESULTS_MD.name}")
    if args.record:
        from benchmarks._common import append_to_results, commit

        summary = report.compile_summary(ordered, run_info, commit())
        print(f"recorded in {append_to_results(summary)}")


if __name__ == "__main__":
    main()
