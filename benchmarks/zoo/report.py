"""Turn the zoo's results into ``RESULTS.md`` and the README's summary block.

A result is ``ok`` (captured, outputs match eager), ``mismatch`` (captured, outputs differ)
or ``error`` (capture or the captured program's run failed, timed out or crashed). The
summaries count ``ok`` as "captured correctly"; medians are over the ``ok`` results.

Depends on: the standard library, benchmarks.zoo.registry and .methods (names only).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.zoo.methods import ALL_METHODS, METHODS
from benchmarks.zoo.registry import FAMILIES, SPECS

Result = dict[str, Any]
README_BEGIN = "<!-- zoo:begin (written by python -m benchmarks.zoo.run) -->"
README_END = "<!-- zoo:end -->"
NOTES = (
    "fxloom: symbolic tracing with example inputs (control flow on traced values follows the "
    "example, under run-time guards); fxloom-autoleaf: the same, keeping untraceable "
    "submodules as leaves. Every method gets the same set-up: tensor inputs by name, other "
    "forward arguments fixed (`use_cache`, `output_attentions`, `output_hidden_states`, "
    "`return_dict` to False, the rest to their defaults) — `concrete_args` for the symbolic "
    "tracers, constant kwargs for torch.export (strict=False). Correct = every tensor leaf "
    "of the output matches eager (rtol 1e-4, atol 1e-5). Capture time includes fxloom's "
    "code generation; first = the first capture in the worker's fresh process (libraries "
    "imported, one-time costs paid inside), warm = the best of 5 more. Runtime ratio = captured / eager, medians of 10 calls, one thread. "
    "torch.export's and fxloom.export's node counts are of their ATen-level graphs; "
    "core = after `run_decompositions()` (torch's core ATen table)."
)


def sort_key(key: tuple[str, str]) -> tuple[int, int]:
    model, method = key
    methods = list(ALL_METHODS)
    return list(SPECS).index(model), methods.index(method) if method in methods else 99


def median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def summary_row(results: list[Result]) -> dict[str, Any]:
    ok = [r for r in results if r["status"] == "ok"]
    return {
        "n": len(results),
        "ok": len(ok),
        "mismatch": sum(r["status"] == "mismatch" for r in results),
        "error": sum(r["status"] == "error" for r in results),
        "capture_ms": median(r["capture_s"] * 1e3 for r in ok),
        "warm_ms": median(r["capture_warm_s"] * 1e3 for r in ok if "capture_warm_s" in r),
        "nodes": median(r["nodes"] for r in ok),
        "ratio": median(r["runtime_ratio"] for r in ok),
    }


def summary_table(results: list[Result], methods: list[str], by_family: bool) -> list[str]:
    head = "| family | method |" if by_family else "| method |"
    lines = [
        head
        + " correct | mismatch | error | median capture, first (ms) | median capture, warm (ms)"
        " | median nodes | median runtime ratio |",
        "|---" * (head.count("|") - 1) + "|---:" * 7 + "|",
    ]
    groups = (
        [(f, [r for r in results if r["family"] == f]) for f in FAMILIES]
        if by_family
        else [("", results)]
    )
    for family, members in groups:
        for method in methods:
            row = summary_row([r for r in members if r["method"] == method])
            if not row["n"]:
                continue
            percent = 100 * row["ok"] / row["n"]
            label = f"| {family} | {method} |" if by_family else f"| {method} |"
            lines.append(
                f"{label} {row['ok']}/{row['n']} ({percent:.0f}%) | {row['mismatch']} | "
                f"{row['error']} | {fmt(row['capture_ms'], '.0f')} | {fmt(row['warm_ms'], '.1f')} | "
                f"{fmt(row['nodes'], '.0f')} | "
                f"{fmt(row['ratio'], '.2f')} |"
            )
    return lines


def cell(result: Result | None) -> str:
    if result is None:
        return ""
    if result["status"] == "ok":
        core = f" ({result['core_nodes']} core)" if "core_nodes" in result else ""
        if "core_error" in result:
            core = f" (run_decompositions fails: {escape(result['core_error'])[:50]})"
        second = result.get("second_batch", "ok")
        second = "" if second == "ok" else f"; batch 5: {escape(second)[:50]}"
        return (
            f"ok {result['capture_s'] * 1e3:.0f} ms, {result['nodes']} n{core}, "
            f"{result['runtime_ratio']:.2f}x{second}"
        )
    if result["status"] == "mismatch":
        return "mismatch: " + escape(result["message"])[:60]
    eager = "eager fails: " if result.get("stage") == "eager" else ""
    return f"{eager}{result['error']}: " + escape(result.get("message", ""))[:60]


def escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def targets(results: list[Result]) -> list[str]:
    """The issue's targets, each with its figure and whether it is met."""
    by_key = {(r["model"], r["method"]): r for r in results}
    models = sorted({r["model"] for r in results}, key=list(SPECS).index)

    def ok(model: str, method: str) -> bool:
        return by_key.get((model, method), {}).get("status") == "ok"

    def count(method: str, among: list[str]) -> int:
        return sum(ok(m, method) for m in among)

    lines = []
    total = len(models)
    plain = count("fxloom", models)
    lines.append(
        mark(
            plain >= 0.95 * total,
            f"fxloom captures >= 95% correctly: {plain}/{total} ({100 * plain / total:.0f}%)",
        )
    )
    members = {f: [m for m in models if SPECS[m].family == f] for f in FAMILIES}
    behind = [f for f in FAMILIES if count("fxloom", members[f]) < count("torch.fx", members[f])]
    lines.append(
        mark(
            not behind,
            "fxloom >= torch.fx on every family"
            + (f" (behind on {', '.join(behind)})" if behind else ""),
        )
    )
    leaf = count("fxloom-autoleaf", models)
    lines.append(
        mark(leaf == total, f"fxloom-autoleaf runnable and equal to eager on 100%: {leaf}/{total}")
    )
    both = [m for m in models if ok(m, "fxloom") and ok(m, "torch.fx")]
    for key, label in (("capture_warm_s", "warm"), ("capture_s", "first in a fresh process")):
        timed = [m for m in both if key in by_key[m, "fxloom"] and key in by_key[m, "torch.fx"]]
        if not timed:
            continue
        ours = median(by_key[m, "fxloom"][key] for m in timed)
        theirs = median(by_key[m, "torch.fx"][key] for m in timed)
        # The issue's figure compares the two medians; the median of per-model ratios is
        # shown beside it because with few models the medians can come from different ones.
        ratios = {m: by_key[m, "fxloom"][key] / by_key[m, "torch.fx"][key] for m in timed}
        each = ", ".join(f"{m} {ratio:.2f}" for m, ratio in ratios.items())
        lines.append(
            mark(
                ours <= 0.5 * theirs,
                f"median fxloom capture time ({label}) <= 0.5x torch.fx's on the {len(timed)} "
                f"models both capture: {ours * 1e3:.1f} ms vs {theirs * 1e3:.1f} ms "
                f"= {ours / theirs:.2f}x (median of per-model ratios "
                f"{median(ratios.values()):.2f}x: {each})",
            )
        )
    return (
        lines
        + export_targets(by_key, models, members)
        + export_targets(by_key, models, members, dynamic=True)
    )


def export_targets(
    by_key: dict[tuple[str, str], Result],
    models: list[str],
    members: dict[str, list[str]],
    dynamic: bool = False,
) -> list[str]:
    """fxloom.export against torch.export on the same models (issue 11), or both with a
    dynamic batch dimension (issue 12), where correct also means correct at a second batch."""
    suffix = "-dynamic" if dynamic else ""
    ours_name, theirs_name = "fxloom.export" + suffix, "torch.export" + suffix
    if not any(method == ours_name for _, method in by_key):
        return []

    def ok(model: str, method: str) -> bool:
        result = by_key.get((model, method), {})
        second = result.get("second_batch", "ok") if dynamic else "ok"
        return result.get("status") == "ok" and second == "ok"

    lines = []
    behind = [
        f
        for f in FAMILIES
        if sum(ok(m, ours_name) for m in members[f]) < sum(ok(m, theirs_name) for m in members[f])
    ]
    ours_ok = sum(ok(m, ours_name) for m in models)
    theirs_ok = sum(ok(m, theirs_name) for m in models)
    lines.append(
        mark(
            not behind,
            f"{ours_name} correct{' at both batch sizes' if dynamic else ''} at least as often as "
            f"{theirs_name} on every family "
            f"({ours_ok} vs {theirs_ok} of {len(models)})"
            + (f"; behind on {', '.join(behind)}" if behind else ""),
        )
    )
    both = [m for m in models if ok(m, ours_name) and ok(m, theirs_name)]
    for key, label in (("capture_warm_s", "warm"), ("capture_s", "first in a fresh process")):
        timed = [m for m in both if key in by_key[m, ours_name] and key in by_key[m, theirs_name]]
        if not timed:
            continue
        ratios = [by_key[m, ours_name][key] / by_key[m, theirs_name][key] for m in timed]
        lines.append(
            mark(
                median(ratios) <= 0.5,
                f"{ours_name} time ({label}) <= 0.5x {theirs_name}'s, median of per-model "
                f"ratios on the {len(timed)} models both export: {median(ratios):.2f}x "
                f"(range {min(ratios):.2f}-{max(ratios):.2f})",
            )
        )
    counted = [m for m in both if "core_nodes" in by_key[m, ours_name]]
    counted = [m for m in counted if "core_nodes" in by_key[m, theirs_name]]
    if counted:
        ours = [by_key[m, ours_name]["core_nodes"] for m in counted]
        theirs = [by_key[m, theirs_name]["core_nodes"] for m in counted]
        equal = sum(a == b for a, b in zip(ours, theirs))
        lines.append(
            f"- nodes after run_decompositions(), median over {len(counted)} models: "
            f"{ours_name} {median(ours):.0f}, {theirs_name} {median(theirs):.0f}; equal on "
            f"{equal}, fewer on {sum(a < b for a, b in zip(ours, theirs))}, more on "
            f"{sum(a > b for a, b in zip(ours, theirs))}"
        )
    return lines


def mark(met: bool, text: str) -> str:
    return f"- {'met' if met else '**not met**'}: {text}"


def failures(results: list[Result], methods: Iterable[str]) -> list[str]:
    lines = []
    for r in results:
        if r["method"] not in methods:
            continue
        if r["status"] != "ok":
            where = f" at `{r['where']}`" if r.get("where") else ""
            what = r.get("error", "mismatch")
            lines.append(
                f"- {r['model']} ({r['method']}): {what}: {escape(r.get('message', ''))}{where}"
            )
        elif r.get("second_batch", "ok") != "ok":
            lines.append(
                f"- {r['model']} ({r['method']}): wrong at batch 5: {escape(r['second_batch'])}"
            )
    return lines or ["- none"]


def specialisations(models: list[str]) -> list[str]:
    lines = []
    for model in models:
        for reason in dict.fromkeys(SPECS[model].xfail.values()):  # once each, in order
            if reason.startswith("LIMITATION: "):
                lines.append(f"- {model}: {escape(reason.removeprefix('LIMITATION: '))}")
    return lines or ["- none"]


def overall_block(results: list[Result], methods: list[str], run: dict[str, Any]) -> list[str]:
    return [
        f"Model zoo ({len({r['model'] for r in results})} models: Hugging Face architectures from "
        f"tiny configs with random weights, and fxloom.zoo), "
        + "; ".join(f"`{r['command']}`, {r['date']}" for r in run.get("history", [run]))
        + ":",
        "",
        *summary_table(results, methods, by_family=False),
        "",
        *targets(results),
    ]


def write(results: list[Result], run: dict[str, Any], path: Path, readme: Path | None) -> None:
    everything = results
    results = [r for r in results if r["method"] in METHODS]  # the captures' tables
    methods = [m for m in METHODS if any(r["method"] == m for r in results)]
    models = sorted({r["model"] for r in results}, key=list(SPECS).index)
    by_key = {(r["model"], r["method"]): r for r in results}
    lines = [
        "# Model zoo: capture methods side by side",
        "",
        f"Machine: {run['machine']}; {run['versions']}. Each (model, method) pair runs in a "
        "fresh subprocess. Runs whose results this report holds (a later run replaces the "
        "pairs it measured):",
        "",
        *(
            f"- {r['date']}: `{r['command']}` ({r['pairs']} pairs, {r['jobs']} at a time, "
            f"{r['elapsed_s'] / 60:.1f} min)"
            for r in run.get("history", [run])
        ),
        "",
        NOTES,
        "",
        "## Overall",
        "",
        *summary_table(results, methods, by_family=False),
        "",
        "## Targets",
        "",
        *targets(results),
        "",
        "## By family",
        "",
        *summary_table(results, methods, by_family=True),
        "",
        "## By model",
        "",
        "Cells: ok, capture time, node count (n), runtime ratio to eager; else the error class "
        "and the start of its first line.",
        "",
        "| model | family | " + " | ".join(methods) + " |",
        "|---|---|" + "---|" * len(methods),
        *(
            f"| {m} | {SPECS[m].family} | "
            + " | ".join(cell(by_key.get((m, x))) for x in methods)
            + " |"
            for m in models
        ),
        "",
        "## fxloom failures",
        "",
        *failures(results, ("fxloom", "fxloom-autoleaf", "fxloom.export", "fxloom.export-dynamic")),
        "",
        "## Captured, but specialised",
        "",
        "These models capture correctly for the benchmark's inputs, but their code turns a "
        "traced size into a Python int, so the graph is fixed to the example's size by a "
        "run-time guard (another size raises instead of computing something else). Each "
        "entry names the construct and what to do:",
        "",
        *specialisations(models),
        "",
        *compile_section(everything, run),
    ]
    path.write_text("\n".join(lines))
    if readme is not None and readme.exists():
        update_readme(readme, overall_block(results, methods, run))


def update_readme(readme: Path, block: list[str]) -> None:
    text = readme.read_text()
    pattern = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        return  # no markers: leave the README alone
    replacement = "\n".join([README_BEGIN, *block, README_END])
    readme.write_text(pattern.sub(lambda _: replacement, text))


# ----------------------------------------------------------------------------- compilers
OURS, PEER = "fxloom.compile", "torch.compile"
COMPILE_NOTES = (
    "Each model in a fresh process per compiler: `fxloom.compile(model)` against "
    '`torch.compile(model, backend="eager")`, each after its one-time start-up was paid on a '
    "small model of its own. Calls: the example inputs (the call that compiles), the same "
    "inputs again (an identical call), then a batch 3 larger. Graphs = graphs compiled so "
    "far after each call (fxloom: `explain().graph_count`, every cache entry and piece; "
    "Dynamo: `counters['stats']['unique_graphs']`). First call = compiling and running the "
    "first call. Runtime ratio = compiled / eager at the example: the median over 30-300 "
    "rounds of one eager and one compiled call each (paired, so the shared machine's load "
    "hits both sides of each ratio), one thread, after the three calls."
)


def _graphs(result: Result) -> str:
    stages = ("first", "identical", "other_batch")
    return "/".join(str(result.get(f"graphs_{stage}", "?")) for stage in stages)


def compile_cell(result: Result | None) -> str:
    if result is None:
        return ""
    if result["status"] == "error":
        return f"{result['error']}: " + escape(result.get("message", ""))[:60]
    wrong = (
        "" if result["status"] == "ok" else "WRONG " + escape(result.get("message", ""))[:50] + "; "
    )
    return (
        f"{wrong}{_graphs(result)}, {result['first_call_s'] * 1e3:.0f} ms, "
        f"{result['runtime_ratio']:.2f}x"
    )


def _graphs_at_most(ours: Result, peer: Result) -> bool:
    stages = ("first", "identical", "other_batch")
    return all(ours[f"graphs_{s}"] <= peer[f"graphs_{s}"] for s in stages)


def compile_targets(results: list[Result]) -> list[str]:
    """The targets of issue 33 on the zoo, each with its figure and whether it is met."""
    by_key = {(r["model"], r["method"]): r for r in results}
    models = sorted({r["model"] for r in results if r["method"] in (OURS, PEER)},
                    key=list(SPECS).index)  # fmt: skip
    ours = {m: by_key[m, OURS] for m in models if (m, OURS) in by_key}
    peer = {m: by_key[m, PEER] for m in models if (m, PEER) in by_key}
    if not ours:
        return []
    ran = {m: r for m, r in ours.items() if r["status"] != "error"}
    both = [m for m in ran if m in peer and peer[m]["status"] != "error"]
    lines = []
    correct = [m for m, r in ours.items() if r["status"] == "ok"]
    wrong = [m for m in ours if m not in correct]
    lines.append(mark(not wrong, f"fxloom.compile equal to eager on all three calls: "
                      f"{len(correct)}/{len(ours)}" + (f" (not: {', '.join(wrong)})" if wrong else "")))  # fmt: skip
    again = [m for m, r in ran.items() if r["graphs_identical"] != r["graphs_first"]]
    lines.append(mark(not again, f"an identical second call compiles nothing: "
                      f"{len(ran) - len(again)}/{len(ran)}" + (f" (recompiled: {', '.join(again)})" if again else "")))  # fmt: skip
    more = [m for m in both if not _graphs_at_most(ran[m], peer[m])]
    lines.append(mark(not more, f"graphs <= Dynamo's after each call: {len(both) - len(more)}/{len(both)}"
                      + (f" (more: {', '.join(f'{m} {_graphs(ran[m])} vs {_graphs(peer[m])}' for m in more)})" if more else "")))  # fmt: skip
    timed = [m for m in both if "runtime_ratio" in ran[m] and "runtime_ratio" in peer[m]]
    slow = [m for m in timed if ran[m]["runtime_ratio"] > 1.1]
    slower = ", ".join(f"{m} {ran[m]['runtime_ratio']:.2f}x" for m in slow)
    lines.append(mark(not slow, "no model slower than 1.1x eager in steady state: "
                      f"{len(timed) - len(slow)}/{len(timed)}"
                      + (f" (slower: {slower})" if slow else "")))  # fmt: skip
    if timed:
        mine = statistics.geometric_mean(ran[m]["runtime_ratio"] for m in timed)
        theirs = statistics.geometric_mean(peer[m]["runtime_ratio"] for m in timed)
        worst = max(timed, key=lambda m: ran[m]["runtime_ratio"])
        behind = [m for m in timed if ran[m]["runtime_ratio"] > peer[m]["runtime_ratio"]]
        lines.append(
            f"- per model, fxloom's runtime ratio <= Dynamo's on {len(timed) - len(behind)} of "
            f"{len(timed)}" + (f" (above: {', '.join(behind)})" if behind else "")
        )
        lines.append(mark(mine <= theirs, f"geometric mean of compiled/eager over the {len(timed)} "
                          f"models both run: fxloom {mine:.2f}, Dynamo {theirs:.2f} "
                          f"(fxloom's worst: {worst} {ran[worst]['runtime_ratio']:.2f}x)"))  # fmt: skip
        ratios = [ran[m]["first_call_s"] / peer[m]["first_call_s"] for m in timed]
        lines.append(mark(median(ratios) <= 0.25, "first-call compile time, median of per-model "
                          f"ratios fxloom / Dynamo: {median(ratios):.2f}x (range "
                          f"{min(ratios):.2f}-{max(ratios):.2f}; medians {median(ran[m]['first_call_s'] for m in timed) * 1e3:.0f} ms "
                          f"vs {median(peer[m]['first_call_s'] for m in timed) * 1e3:.0f} ms)"))  # fmt: skip
    return lines


def compile_section(results: list[Result], run: dict[str, Any]) -> list[str]:
    """The ``fxloom.compile`` / ``torch.compile`` section of RESULTS.md."""
    compiled = [r for r in results if r["method"] in (OURS, PEER)]
    if not compiled:
        return []
    by_key = {(r["model"], r["method"]): r for r in compiled}
    models = sorted({r["model"] for r in compiled}, key=list(SPECS).index)
    lines = [
        "## fxloom.compile against torch.compile",
        "",
        COMPILE_NOTES,
        *([f"Load: {run['load']}."] if run.get("load") else []),
        "",
        *compile_targets(results),
        "",
        "Cells: graphs after the first / identical / other-batch call, first call (ms), "
        "steady-state runtime ratio to eager.",
        "",
        f"| model | family | {OURS} | {PEER} | fxloom: breaks, pieces run as Python |",
        "|---|---|---|---|---|",
    ]
    for model in models:
        ours = by_key.get((model, OURS))
        notes = ""
        if ours is not None and ours["status"] != "error":
            notes = "; ".join([*ours.get("breaks", []), *ours.get("pieces_as_python", [])])
            if ours.get("as_python"):
                notes = f"{notes}; runs as Python: {ours['as_python']}".lstrip("; ")
        lines.append(
            f"| {model} | {SPECS[model].family} | {compile_cell(ours)} | "
            f"{compile_cell(by_key.get((model, PEER)))} | {escape(notes)[:160]} |"
        )
    return [*lines, ""]


def compile_summary(results: list[Result], run: dict[str, Any], commit: str = "?") -> str:
    """The zoo's compile targets for benchmarks/RESULTS.md: date, machine, command, load;
    ``commit``: the checkout the report is written from."""
    lines = [
        f'## Model zoo: fxloom.compile against torch.compile(backend="eager") — {run["date"]}',
        "",
        f"Machine: {run['machine']}; {run['versions']} (commit {commit}). "
        f"`{run['command']}` ({run['pairs']} "
        f"pairs, {run['jobs']} at a time, {run['elapsed_s'] / 60:.1f} min). "
        + (f"Load: {run['load']}. " if run.get("load") else "")
        + COMPILE_NOTES,
        "",
        *compile_targets(results),
        "",
        'Per model: benchmarks/zoo/RESULTS.md, section "fxloom.compile against torch.compile".',
    ]
    return "\n".join(lines) + "\n"
