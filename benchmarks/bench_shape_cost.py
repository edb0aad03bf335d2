"""Shape propagation and cost analysis benchmark: real tensors against the meta device.

Two parts, each on ResNet-50 (``fxloom.zoo``, 224x224) at several batch sizes and on a
12-layer transformer encoder (the zoo's ``TransformerTiny`` widened to d_model 256, 128 tokens):

    shape   ShapeProp(gm).propagate(*real_inputs) against ShapeProp(gm).propagate_meta(specs),
            with the eager forward of the same model and batch for context. All three run under
            torch.no_grad() (what an analysis needs; with autograd a real run would also keep
            every activation). Real mode is run up to --real-max-batch (default 32): ResNet-50
            at batch 256 holds gigabytes of activations and takes many seconds on a small
            machine; the table says "skipped" and gives the meta-estimated peak memory.
    cost    analyze_cost(gm, spec) (meta shapes + counting) and the counting alone on shapes
            already recorded (mode="recorded"), with the figures it finds.

There is no peer ratio to meet; the tables report times. Every time is the best of several
runs, the modes alternating which goes first; the garbage collector is off inside timed
regions. The first meta run in a process also pays for torch loading its Python meta kernels
(a few seconds, once); it is timed separately in a fresh interpreter and excluded elsewhere.

    python benchmarks/bench_shape_cost.py                  # full sizes
    python benchmarks/bench_shape_cost.py --quick          # smoke run: tiny models, one repeat
    python benchmarks/bench_shape_cost.py --real-max-batch 256   # also real mode at 256
    python benchmarks/bench_shape_cost.py --record         # append the tables to RESULTS.md
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fxloom
from fxloom import zoo
from fxloom.passes.cost import analyze_cost, format_bytes, format_count
from fxloom.passes.shape_prop import ShapeProp
from fxloom.zoo.transformer import TransformerTiny

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, machine_line, publish, rotated, timed

PARTS = ("shape", "cost")
SEQ_LEN = 128
# batch size -> (input shape, dtype)
InputSpec = Callable[[int], tuple[tuple[int, ...], torch.dtype]]


# ------------------------------------------------------------------------------ models
@dataclass(frozen=True)
class Case:
    """A model and how to make its input at a batch size."""

    name: str
    note: str
    build: Callable[[], nn.Module]
    input_spec: InputSpec

    def real_input(self, batch: int) -> torch.Tensor:
        shape, dtype = self.input_spec(batch)
        generator = torch.Generator().manual_seed(0)
        if dtype.is_floating_point:
            return torch.randn(shape, generator=generator)
        return torch.randint(0, 100, shape, generator=generator)


def _transformer_12l() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = TransformerTiny(d_model=256, num_heads=4, num_layers=12, max_len=SEQ_LEN)
    return model.eval()


def _zoo_model(name: str) -> Callable[[], nn.Module]:
    return lambda: zoo.build(name)[0]


def _images(side: int) -> InputSpec:
    return lambda batch: ((batch, 3, side, side), torch.float32)


def _tokens(length: int) -> InputSpec:
    return lambda batch: ((batch, length), torch.int64)


CASES = {
    case.name: case
    for case in (
        Case("resnet50", "zoo, 224x224 images", _zoo_model("resnet50"), _images(224)),
        Case(
            "transformer_12l",
            f"TransformerTiny(d_model=256, 4 heads, 12 layers), {SEQ_LEN} tokens, no mask",
            _transformer_12l,
            _tokens(SEQ_LEN),
        ),
        Case("resnet_tiny", "zoo, 32x32 images", _zoo_model("resnet_tiny"), _images(32)),
        Case(
            "transformer_tiny",
            "zoo, 2 layers, d_model 32, 16 tokens, no mask",
            _zoo_model("transformer_tiny"),
            _tokens(16),
        ),
    )
}


def traced(case: Case) -> tuple[nn.Module, fxloom.GraphModule]:
    model = case.build()
    concrete = {"mask": None} if "transformer" in case.name else None
    return model, fxloom.symbolic_trace(model, concrete)


# ------------------------------------------------------------------------------ timing
def best_of(callables: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best seconds of each callable over ``repeats`` rounds, rotating which goes first."""
    labels = list(callables)
    runs: dict[str, list[float]] = {label: [] for label in labels}
    for label in labels:
        callables[label]()  # warm-up: caches, first-call work
    for rep in range(repeats):
        for label in rotated(labels, rep):
            runs[label].append(timed(callables[label]))
    return {label: min(times) for label, times in runs.items()}


def cold_meta_seconds() -> float:
    """Seconds of the first propagate_meta in a fresh interpreter (ResNet-50, batch 1)."""
    script = (
        "import time, torch, fxloom\n"
        "from fxloom import zoo\n"
        "from fxloom.passes.shape_prop import ShapeProp\n"
        "gm = fxloom.symbolic_trace(zoo.build('resnet50')[0])\n"
        "start = time.perf_counter()\n"
        "ShapeProp(gm).propagate_meta(torch.Size([1, 3, 224, 224]))\n"
        "print(time.perf_counter() - start)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True
    )
    return float(result.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------ parts
@dataclass
class ShapeRow:
    case: Case
    batch: int
    nodes: int
    seconds: dict[str, float]  # "eager", "real", "meta"
    skipped: str = ""


def run_shape(plan: list[tuple[str, int]], repeats: int, real_max_batch: int) -> list[ShapeRow]:
    rows = []
    for name, batch in plan:
        case = CASES[name]
        model, gm = traced(case)
        spec = case.input_spec(batch)
        callables: dict[str, Callable[[], object]] = {
            "meta": lambda gm=gm, spec=spec: ShapeProp(gm).propagate_meta(spec)
        }
        skipped = ""
        if batch <= real_max_batch:
            x = case.real_input(batch)
            callables["eager"] = lambda model=model, x=x: model(x)
            callables["real"] = lambda gm=gm, x=x: ShapeProp(gm).propagate(x)
        else:
            peak = analyze_cost(gm, spec).peak_memory_bytes
            skipped = f"real mode and eager skipped above batch {real_max_batch} (est. peak {format_bytes(peak)})"
        with torch.no_grad():
            seconds = best_of(callables, repeats)
        row = ShapeRow(case, batch, len(gm.graph.nodes), seconds, skipped)
        rows.append(row)
        print(
            f"shape {name:16} batch {batch:4}  eager {_ms(seconds.get('eager'))}  "
            f"real {_ms(seconds.get('real'))}  meta {_ms(seconds['meta'])}  {skipped}",
            flush=True,
        )
    return rows


@dataclass
class CostRow:
    case: Case
    batch: int
    seconds: dict[str, float]  # "analyze (meta)", "counting only"
    figures: Any  # the CostReport


def run_cost(plan: list[tuple[str, int]], repeats: int) -> list[CostRow]:
    rows = []
    for name, batch in plan:
        case = CASES[name]
        _, gm = traced(case)
        spec = case.input_spec(batch)
        report = analyze_cost(gm, spec)
        seconds = best_of(
            {
                "analyze (meta)": lambda gm=gm, spec=spec: analyze_cost(gm, spec, mode="meta"),
                "counting only": lambda gm=gm: analyze_cost(gm, mode="recorded"),
            },
            repeats,
        )
        rows.append(CostRow(case, batch, seconds, report))
        print(
            f"cost  {name:16} batch {batch:4}  analyze {_ms(seconds['analyze (meta)'])}  "
            f"counting {_ms(seconds['counting only'])}  MACs {format_count(report.macs)}",
            flush=True,
        )
    return rows


# ------------------------------------------------------------------------------ tables
def _ms(seconds: float | None) -> str:
    return "skipped" if seconds is None else f"{seconds * 1e3:.1f}"


def shape_table(rows: list[ShapeRow], cold: float | None) -> list[str]:
    lines = [
        "### Shape propagation: real tensors against the meta device",
        "",
        "Milliseconds (best run), under `torch.no_grad()`. *real* = "
        "`ShapeProp(gm).propagate(x)`, *meta* = `ShapeProp(gm).propagate_meta((shape, dtype))`, "
        "*eager* = `model(x)` for context. Nodes = all graph nodes.",
        "",
        "| model | batch | nodes | eager forward | real ShapeProp | meta ShapeProp "
        "| real / meta | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        real, meta = row.seconds.get("real"), row.seconds["meta"]
        ratio = f"{real / meta:.1f}" if real else "-"
        notes = "; ".join(filter(None, [row.case.note, row.skipped]))
        lines.append(
            f"| {row.case.name} | {row.batch} | {row.nodes} | {_ms(row.seconds.get('eager'))} "
            f"| {_ms(real)} | {_ms(meta)} | {ratio} | {notes} |"
        )
    if cold is not None:
        lines += [
            "",
            f"First meta run in a fresh interpreter (ResNet-50, batch 1): {cold:.2f} s, "
            "almost all of it torch importing the Python meta kernels it needs (once per "
            "process); the table's meta times exclude it.",
        ]
    return lines


def cost_table(rows: list[CostRow]) -> list[str]:
    lines = [
        "### Cost analysis",
        "",
        "Milliseconds (best run). *analyze* = `analyze_cost(gm, (shape, dtype))`: meta shape "
        "propagation and counting; *counting only* = `analyze_cost(gm, mode='recorded')` on "
        "shapes already in the nodes. Figures: MACs (a multiply-add = 1 MAC = 2 FLOPs), "
        "parameters, estimated peak activation memory.",
        "",
        "| model | batch | analyze | counting only | FLOPs | MACs | params "
        "| peak activations | not counted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        report = row.figures
        lines.append(
            f"| {row.case.name} | {row.batch} | {_ms(row.seconds['analyze (meta)'])} "
            f"| {_ms(row.seconds['counting only'])} | {format_count(report.flops)} "
            f"| {format_count(report.macs)} | {format_count(report.params)} "
            f"| {format_bytes(report.peak_activation_bytes)} "
            f"| {', '.join(report.not_counted) or '-'} |"
        )
    return lines


def markdown(results: dict[str, list], cold: float | None, repeats: int, quick: bool) -> str:
    command = "python benchmarks/bench_shape_cost.py" + (" --quick" if quick else "")
    lines = [
        f"## Shape propagation and cost analysis — {date.today().isoformat()}",
        "",
        f"{machine_line()}. `{command}`. Best of {repeats} runs, modes alternating which "
        "goes first; one thread.",
        "",
    ]
    if "shape" in results:
        lines += shape_table(results["shape"], cold) + [""]
    if "cost" in results:
        lines += cost_table(results["cost"]) + [""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------- main
def plan(quick: bool) -> list[tuple[str, int]]:
    if quick:
        return [("resnet_tiny", 1), ("transformer_tiny", 2)]
    return [
        ("resnet50", 1),
        ("resnet50", 32),
        ("resnet50", 256),
        ("transformer_12l", 1),
        ("transformer_12l", 32),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (smoke)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument(
        "--real-max-batch",
        type=int,
        default=32,
        metavar="N",
        help="run real mode and eager only up to batch N (default 32)",
    )
    parser.add_argument("--record", action="store_true", help="append the tables to RESULTS.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = 1 if args.quick else 3
    cases = plan(args.quick)
    cold = None if args.quick or "shape" not in args.parts else cold_meta_seconds()
    results: dict[str, list] = {}
    if "shape" in args.parts:
        results["shape"] = run_shape(cases, repeats, args.real_max_batch)
    if "cost" in args.parts:
        results["cost"] = run_cost(cases, repeats)
    table = markdown(results, cold, repeats, args.quick)
    publish(table, args.record)


if __name__ == "__main__":
    main()
