"""Subgraph rewriting benchmark: fxloom's replace_pattern against torch.fx's, in one run.

Both libraries rewrite the same program, built node by node with each one's own Graph API:

    chain   a chain of additions in which every 10th step is x * sigmoid(x) (the pattern)
            and every 10th + 1 a near miss, x * sigmoid(y): every multiplication is a
            candidate anchor, half of them fail one step in.
            Pattern x * torch.sigmoid(x) -> F.silu(x) (one output).
    dag     residual blocks x + relu(a) * sigmoid(a) with a = x + 1, every 4th block (the
            others use tanh/neg). Pattern (relu(x), sigmoid(x)) -> (clamp(x, min=0),
            special.expit(x)): two outputs, matched together.

What is timed is one call of ``replace_pattern(gm, pattern, replacement)`` as users make it:
tracing the pattern and the replacement, matching, rewriting, linting and ``recompile``
(both libraries regenerate code before returning). Each run gets a freshly built graph
(built outside the timed region); the garbage collector is off inside timed regions. Best
of several runs, alternating which library goes first. The ``match`` column is fxloom's
matcher alone and ``codegen`` fxloom's ``recompile`` of the result, to show where the time
goes; ``us/node`` = fxloom's total per graph node (flat when the cost is linear).

torch.fx's rewriter scans the graph for each match it replaces (and tries every pair of
candidates for a two-output pattern), so its time grows quadratically: a size whose
projected time (the previous size's x the square of the growth) exceeds ``--torch-limit``
seconds is skipped for it and shown as "-". The rewritten modules of both libraries are
checked against the original program on a small input before timing.

    python benchmarks/bench_rewrite.py                  # 1e3, 1e4, 1e5 nodes
    python benchmarks/bench_rewrite.py --quick          # smoke run: small sizes, one run
    python benchmarks/bench_rewrite.py --sizes 1000 10000 --shapes chain
    python benchmarks/bench_rewrite.py --record         # append the table to RESULTS.md

torch.fx is imported here only as the comparison.
"""

from __future__ import annotations

import argparse
import operator
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.fx
import torch.fx.subgraph_rewriter
import torch.nn.functional as F

import fxloom
import fxloom.subgraph_rewriter
from fxloom.passes.matcher import SubgraphMatcher

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import freeze_startup_heap, machine_line, publish, rotated, timed_call

LIBRARIES = {
    "fxloom": (fxloom, fxloom.subgraph_rewriter.replace_pattern),
    "torch.fx": (torch.fx, torch.fx.subgraph_rewriter.replace_pattern),
}


# --------------------------------------------------------------- programs
def silu_pattern(x):
    return x * torch.sigmoid(x)


def silu_replacement(x):
    return F.silu(x)


def two_output_pattern(x):
    return torch.relu(x), torch.sigmoid(x)


def two_output_replacement(x):
    return torch.clamp(x, min=0), torch.special.expit(x)


def build_chain(graph: Any, nodes: int) -> None:
    x, y = graph.placeholder("x"), graph.placeholder("y")
    count, step = 3, 0
    while count < nodes:
        kind = step % 10
        if kind in (0, 1):  # the pattern, then a near miss (sigmoid of another value)
            s = graph.call_function(torch.sigmoid, (x if kind == 0 else y,))
            x = graph.call_function(operator.mul, (x, s))
            count += 2
        else:
            x = graph.call_function(operator.add, (x, 1))
            count += 1
        step += 1
    graph.output(x)


def build_dag(graph: Any, nodes: int) -> None:
    x = graph.placeholder("x")
    count, block = 2, 0
    while count < nodes:
        a = graph.call_function(operator.add, (x, 1))
        first, second = (torch.relu, torch.sigmoid) if block % 4 == 0 else (torch.tanh, torch.neg)
        gate = graph.call_function(
            operator.mul,
            (graph.call_function(first, (a,)), graph.call_function(second, (a,))),
        )
        x = graph.call_function(operator.add, (x, gate))
        count += 5
        block += 1
    graph.output(x)


SHAPES: dict[str, tuple[Callable, Callable, Callable, int]] = {
    # shape: (builder, pattern, replacement, number of placeholders)
    "chain": (build_chain, silu_pattern, silu_replacement, 2),
    "dag": (build_dag, two_output_pattern, two_output_replacement, 1),
}


def build(lib: Any, shape: str, nodes: int) -> Any:
    graph = lib.Graph()
    SHAPES[shape][0](graph, nodes)
    return lib.GraphModule(torch.nn.Module(), graph)


# ----------------------------------------------------------------- timing
def rewrite_once(name: str, shape: str, nodes: int) -> tuple[float, int, Any]:
    lib, replace = LIBRARIES[name]
    _, pattern, replacement, _ = SHAPES[shape]
    gm = build(lib, shape, nodes)
    seconds, found = timed_call(lambda: replace(gm, pattern, replacement))
    return seconds, len(found), gm


def check_numerics(shape: str) -> None:
    """Both rewritten modules compute what the original program computes."""
    arity = SHAPES[shape][3]
    inputs = [torch.randn(8) for _ in range(arity)]
    expected = build(fxloom, shape, 60)(*inputs)
    for name in LIBRARIES:
        _, count, gm = rewrite_once(name, shape, 60)
        assert count > 0, f"{name} found no match in {shape}"
        torch.testing.assert_close(gm(*inputs), expected, msg=f"{name} changed {shape}'s result")


def fxloom_parts(shape: str, nodes: int) -> tuple[float, float]:
    """fxloom's matcher alone, and its recompile of a rewritten graph (seconds)."""
    _, pattern, _, _ = SHAPES[shape]
    matcher = SubgraphMatcher(fxloom.symbolic_trace(pattern))
    gm = build(fxloom, shape, nodes)
    match_seconds, _ = timed_call(lambda: matcher.match(gm.graph))
    _, _, rewritten = rewrite_once("fxloom", shape, nodes)
    codegen_seconds, _ = timed_call(rewritten.recompile)
    return match_seconds, codegen_seconds


def repeats_for(nodes: int, quick: bool) -> int:
    if quick:
        return 1
    return 5 if nodes <= 1_000 else 3 if nodes <= 10_000 else 2


def run(sizes: list[int], shapes: list[str], quick: bool, torch_limit: float) -> list[dict]:
    rows = []
    for shape in shapes:
        check_numerics(shape)
        previous: tuple[int, float] | None = None  # torch.fx's last (size, seconds)
        for nodes in sizes:
            projected = previous[1] * (nodes / previous[0]) ** 2 if previous else 0.0
            names = ["fxloom"] + (["torch.fx"] if projected <= torch_limit else [])
            best = {name: float("inf") for name in names}
            matches = {}
            for rep in range(repeats_for(nodes, quick)):
                for name in rotated(names, rep):
                    seconds, matches[name], _ = rewrite_once(name, shape, nodes)
                    best[name] = min(best[name], seconds)
            if "torch.fx" in best:
                assert matches["torch.fx"] == matches["fxloom"], (shape, nodes, matches)
                previous = (nodes, best["torch.fx"])
            match_seconds, codegen_seconds = fxloom_parts(shape, nodes)
            row = {
                "shape": shape,
                "nodes": nodes,
                "matches": matches["fxloom"],
                "fxloom": best["fxloom"],
                "torch.fx": best.get("torch.fx"),
                "match": match_seconds,
                "codegen": codegen_seconds,
            }
            rows.append(row)
            print(_line(row), flush=True)
    return rows


# ---------------------------------------------------------------- report
def _line(row: dict) -> str:
    theirs = row["torch.fx"]
    theirs_text = f"{theirs:9.4f}s" if theirs is not None else "  skipped"
    return (
        f"{row['shape']:6} {row['nodes']:>8} nodes {row['matches']:>6} matches  "
        f"fxloom {row['fxloom']:9.4f}s  torch.fx {theirs_text}"
    )


def markdown(rows: list[dict], quick: bool) -> str:
    lines = [
        f"## Subgraph rewriting — {date.today().isoformat()}",
        "",
        f"{machine_line()}. `python benchmarks/bench_rewrite.py"
        f"{' --quick' if quick else ''}`. Seconds for one `replace_pattern` call (trace "
        "pattern and replacement, match, rewrite, lint, recompile), best of 5 (1e3), 3 (1e4) "
        "or 2 (1e5) runs, alternating which library goes first; ratio = fxloom / torch.fx. "
        "match and codegen: fxloom's matcher and recompile alone; us/node: fxloom's total per "
        "node. '-': torch.fx skipped (projected time over the limit).",
        "",
        "### Subgraph rewriting (replace_pattern)",
        "",
        "| graph | nodes | matches | fxloom (s) | torch.fx (s) | ratio | match (s) | codegen (s) "
        "| us/node |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        theirs = row["torch.fx"]
        theirs_text = f"{theirs:.4f}" if theirs is not None else "-"
        ratio = f"{row['fxloom'] / theirs:.3f}" if theirs else "-"
        per_node = row["fxloom"] / row["nodes"] * 1e6
        lines.append(
            f"| {row['shape']} | {row['nodes']:.0e} | {row['matches']} | {row['fxloom']:.4f} "
            f"| {theirs_text} | {ratio} | {row['match']:.4f} | {row['codegen']:.4f} "
            f"| {per_node:.1f} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=None)
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--quick", action="store_true", help="small sizes, one run each")
    parser.add_argument(
        "--torch-limit",
        type=float,
        default=120.0,
        help="skip torch.fx at a size whose projected time exceeds this (seconds)",
    )
    parser.add_argument("--record", action="store_true", help="append the table to RESULTS.md")
    args = parser.parse_args()
    sizes = args.sizes or ([200, 1_000] if args.quick else [1_000, 10_000, 100_000])
    freeze_startup_heap()
    rows = run(sizes, args.shapes, args.quick, args.torch_limit)
    table = markdown(rows, args.quick)
    publish(table, args.record)


if __name__ == "__main__":
    main()
