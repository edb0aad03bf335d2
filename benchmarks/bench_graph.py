"""Graph-operation benchmark: fxloom against torch.fx, side by side in one run.

For chains and wide DAGs of 1e3 .. 1e6 nodes, times on both libraries:

    construction   building the graph with Graph.placeholder/call_function/output
    lint           Graph.lint()
    dce            Graph.eliminate_dead_code() (the wide DAG has dead nodes to remove)
    python_code    Graph.python_code("self")
    recompile      GraphModule.recompile() (generate + compile + install forward)
    erase_half     every other compute node: replace_all_uses_with(its input) + erase_node
    find_nodes     Graph.find_nodes(op="call_function", target=operator.add)

and prints each time with the ratio fxloom / torch.fx (< 1.0: fxloom is faster).
The same graph shape is built the same way on both sides. torch.fx is imported
here only as the comparison.

    python benchmarks/bench_graph.py                  # 1e3 .. 1e6
    python benchmarks/bench_graph.py --sizes 1000 10000
    python benchmarks/bench_graph.py --record         # append a table to RESULTS.md
"""

from __future__ import annotations

import argparse
import gc
import operator
import random
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch
import torch.fx

import fxloom

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import freeze_startup_heap, machine_line, publish, rotated, timed

OPERATIONS = ("construction", "lint", "dce", "python_code", "recompile", "erase_half", "find_nodes")


def build_chain(lib, n: int):
    g = lib.Graph()
    value = g.placeholder("x")
    for _ in range(n):
        value = g.call_function(operator.add, (value, 1))
    g.output(value)
    return g


def build_wide(lib, n: int):
    """Each node adds two earlier ones: one recent, one anywhere; a tenth is never used."""
    rng = random.Random(0)
    g = lib.Graph()
    values = [g.placeholder("x"), g.placeholder("y")]
    for i in range(n):
        recent = values[-1 - rng.randrange(min(len(values), 16))]
        anywhere = values[rng.randrange(len(values))]
        node = g.call_function(operator.add, (recent, anywhere))
        if i % 10 != 9:
            values.append(node)
    g.output(values[-1])
    return g


SHAPES: dict[str, Callable] = {"chain": build_chain, "wide": build_wide}


def erase_half(g) -> None:
    for i, node in enumerate(list(g.nodes)):
        if i % 2 and node.op == "call_function":
            node.replace_all_uses_with(node.args[0])
            g.erase_node(node)


def measure(lib, graph_module_cls, shape: str, n: int) -> dict[str, float]:
    build = SHAPES[shape]
    times: dict[str, float] = {}
    holder: dict[str, object] = {}
    times["construction"] = timed(lambda: holder.__setitem__("g", build(lib, n)))
    g = holder["g"]
    times["lint"] = timed(g.lint)
    times["find_nodes"] = timed(lambda: g.find_nodes(op="call_function", target=operator.add))
    times["python_code"] = timed(lambda: g.python_code("self"))
    times["dce"] = timed(g.eliminate_dead_code)
    gm = graph_module_cls(torch.nn.Module(), g)
    times["recompile"] = timed(gm.recompile)
    del gm
    times["erase_half"] = timed(lambda: erase_half(g))
    return times


def repeats_for(n: int) -> int:
    """Best of several runs where that is cheap; big graphs run twice."""
    return 5 if n <= 10_000 else 3 if n <= 100_000 else 2


def best_of(lib, graph_module_cls, shape: str, n: int, into: dict) -> None:
    times = measure(lib, graph_module_cls, shape, n)
    gc.collect()
    for op, seconds in times.items():
        into[op] = min(into.get(op, float("inf")), seconds)


def run(sizes: list[int], shapes: list[str]) -> list[tuple[str, int, str, float, float]]:
    rows = []
    for shape in shapes:
        for n in sizes:
            ours: dict[str, float] = {}
            theirs: dict[str, float] = {}
            repeats = repeats_for(n)
            for rep in range(repeats):  # alternate who goes first: memory state matters
                sides = [
                    (fxloom, fxloom.GraphModule, ours),
                    (torch.fx, torch.fx.GraphModule, theirs),
                ]
                for lib, gm_cls, into in rotated(sides, rep):
                    best_of(lib, gm_cls, shape, n, into)
            for op in OPERATIONS:
                rows.append((shape, n, op, ours[op], theirs[op]))
                ratio = ours[op] / theirs[op] if theirs[op] else float("nan")
                print(
                    f"{shape:6} {n:>8} {op:13} fxloom {ours[op]:9.4f}s  torch.fx {theirs[op]:9.4f}s"
                    f"  ratio {ratio:5.2f}",
                    flush=True,
                )
    return rows


def markdown(rows) -> str:
    lines = [
        f"## Graph operations — {date.today().isoformat()}",
        "",
        f"{machine_line()}. `python benchmarks/bench_graph.py`. Seconds, best of 5 "
        "runs (1e3, 1e4), 3 (1e5) or 2 (1e6), alternating which library goes first; "
        "ratio = fxloom / torch.fx (below 1.0: fxloom faster).",
        "",
        "| shape | nodes | operation | fxloom (s) | torch.fx (s) | ratio |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for shape, n, op, ours, theirs in rows:
        ratio = ours / theirs if theirs else float("nan")
        lines.append(f"| {shape} | {n:.0e} | {op} | {ours:.4f} | {theirs:.4f} | {ratio:.2f} |")
    worst = max(rows, key=lambda r: r[3] / r[4] if r[4] else 0)
    lines += [
        "",
        f"Worst ratio: {worst[3] / worst[4]:.2f} ({worst[0]}, {worst[1]:.0e} nodes, {worst[2]}).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--record", action="store_true", help="append the table to RESULTS.md")
    args = parser.parse_args()
    freeze_startup_heap()
    rows = run(args.sizes, args.shapes)
    table = markdown(rows)
    publish(table, args.record)


if __name__ == "__main__":
    main()
