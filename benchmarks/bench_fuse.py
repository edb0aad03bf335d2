"""Conv/batch-norm fusion benchmark (torch.fx paper, 6.2.2): fxloom against torch.fx, in one run.

The model is ResNet-50 (``fxloom.zoo.build("resnet50")``, seeded random weights, eval mode)
on the CPU. Two parts:

    latency  one forward under torch.no_grad() of: the unfused eager model; fxloom's
             ``fxloom.passes.fuse.fuse(model)``; torch.fx's
             ``torch.fx.experimental.optimization.fuse(model)``. Each at 224x224, batch 1
             and 8, with torch's default thread count ("threaded") and with
             torch.set_num_threads(1). Reported: milliseconds, the latency reduction
             against eager (the paper: 40% threaded, 18% single-threaded, on its hardware),
             and fxloom fused / torch.fx fused (target <= 1.0).
    pass     the fusion pass itself, end to end as each library's API does it from the
             model: trace, copy (neither modifies the model), fold. Plus what each produced:
             graph nodes and batch norms left.

Every measurement is the best of several runs, the variants taking turns to go first; the
garbage collector is off inside timed regions. Ratios are also given "paired": the median
over repeats of the ratio of runs timed next to each other, which a busy, shared machine
disturbs less. Both fused models are checked against eager before timing.

torch.set_num_threads(1) limits torch's intra-op pool; for a fully single-threaded process
(BLAS and OpenMP pools too), also set OMP_NUM_THREADS=1 and run only that mode:

    python benchmarks/bench_fuse.py                       # batch 1 and 8, both thread modes
    python benchmarks/bench_fuse.py --quick               # smoke run: 64x64, batch 1, 1-2 repeats
    python benchmarks/bench_fuse.py --batch-sizes 1       # only batch 1
    OMP_NUM_THREADS=1 python benchmarks/bench_fuse.py --threads one
    python benchmarks/bench_fuse.py --record              # append the tables to RESULTS.md

torch.fx is imported here only as the comparison.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch
from torch import nn
from torch.fx.experimental.optimization import fuse as torch_fx_fuse

from fxloom import zoo
from fxloom.passes.fuse import fuse as fxloom_fuse

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    SPREAD_IS,
    Samples,
    compute_nodes,
    freeze_startup_heap,
    load_average,
    machine_line,
    noise_line,
    publish,
    rotated,
    timed,
)

TARGET = 1.0  # fxloom fused latency / torch.fx fused latency
FUSERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "fxloom": fxloom_fuse,
    "torch.fx": torch_fx_fuse,
}
VARIANTS = ("eager", *FUSERS)


@dataclass(frozen=True)
class Settings:
    side: int  # image side
    batch_sizes: tuple[int, ...]
    thread_modes: tuple[str, ...]  # "threaded", "one"
    latency_repeats: dict[int, int]  # batch size -> repeats
    pass_repeats: int


def settings(args: argparse.Namespace) -> Settings:
    if args.quick:
        return Settings(64, (1,), tuple(args.threads), {1: 2}, 1)
    batch_sizes = tuple(args.batch_sizes)
    repeats = {batch: 15 if batch == 1 else 5 for batch in batch_sizes}
    return Settings(224, batch_sizes, tuple(args.threads), repeats, 10)


# ----------------------------------------------------------------------------- part 1
@dataclass
class LatencyRow:
    batch: int
    threads: str  # "threaded (N)" or "1"
    best: dict[str, float]  # variant -> seconds
    paired: float  # median of fxloom / torch.fx per repeat
    spread: float  # the largest median-over-best of the three


def fused_models(model: nn.Module, x: torch.Tensor) -> dict[str, nn.Module]:
    """The model as each variant runs it, each checked against eager."""
    models = {"eager": model}
    models.update({lib: fuser(model) for lib, fuser in FUSERS.items()})
    with torch.no_grad():
        expected = model(x)
        for lib in FUSERS:
            torch.testing.assert_close(models[lib](x), expected, rtol=1e-3, atol=1e-3)
    return models


def run_latency(config: Settings, samples: Samples, default_threads: int) -> list[LatencyRow]:
    model, _ = zoo.build("resnet50")
    rows = []
    for batch in config.batch_sizes:
        x = torch.randn(
            batch, 3, config.side, config.side, generator=torch.Generator().manual_seed(0)
        )
        models = fused_models(model, x)
        for mode in config.thread_modes:
            threads = default_threads if mode == "threaded" else 1
            torch.set_num_threads(threads)
            label = f"threaded ({threads})" if mode == "threaded" else "1"
            rows.append(time_variants(models, x, batch, label, config, samples))
        torch.set_num_threads(default_threads)
    return rows


def time_variants(
    models: dict[str, nn.Module],
    x: torch.Tensor,
    batch: int,
    threads: str,
    config: Settings,
    samples: Samples,
) -> LatencyRow:
    prefix = f"latency b{batch} t{threads}"
    with torch.no_grad():
        for model in models.values():  # warm-up: allocator, kernels' first-call work
            model(x)
        for rep in range(config.latency_repeats[batch]):
            for variant in rotated(list(VARIANTS), rep):
                model = models[variant]
                samples.add(f"{prefix} {variant}", timed(lambda model=model: model(x)))
    best = {variant: samples.best(f"{prefix} {variant}") for variant in VARIANTS}
    paired = samples.paired_ratio(f"{prefix} fxloom", f"{prefix} torch.fx")
    spread = max(samples.spread(f"{prefix} {variant}") for variant in VARIANTS)
    row = LatencyRow(batch, threads, best, paired, spread)
    print(
        f"latency batch {batch} threads {threads:13} eager {best['eager'] * 1e3:8.1f} ms  "
        f"fxloom {best['fxloom'] * 1e3:8.1f} ms ({reduction(row, 'fxloom'):5.1f}%)  "
        f"torch.fx {best['torch.fx'] * 1e3:8.1f} ms ({reduction(row, 'torch.fx'):5.1f}%)  "
        f"fxloom/torch.fx {best['fxloom'] / best['torch.fx']:.3f} (paired {paired:.3f})",
        flush=True,
    )
    return row


def reduction(row: LatencyRow, lib: str) -> float:
    """Latency reduction against eager, in percent."""
    return (1.0 - row.best[lib] / row.best["eager"]) * 100


# ----------------------------------------------------------------------------- part 2
@dataclass
class PassRow:
    best: dict[str, float]  # library -> seconds
    paired: float
    nodes: dict[str, int]  # library -> graph nodes other than placeholders and output
    batch_norms_left: dict[str, int]


def batch_norms(module: nn.Module) -> int:
    return sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def run_pass(config: Settings, samples: Samples) -> PassRow:
    model, _ = zoo.build("resnet50")
    snapshot = copy.deepcopy(model.state_dict())
    results = {lib: fuser(model) for lib, fuser in FUSERS.items()}
    for rep in range(config.pass_repeats):
        for lib in rotated(list(FUSERS), rep):
            fuser = FUSERS[lib]
            # Ready to run: fxloom generates a GraphModule's code on first use, torch.fx at once.
            samples.add(f"pass {lib}", timed(lambda fuser=fuser: fuser(model).code))
    for name, tensor in model.state_dict().items():  # neither library may modify the model
        assert torch.equal(tensor, snapshot[name]), f"the model's {name} changed"
    row = PassRow(
        {lib: samples.best(f"pass {lib}") for lib in FUSERS},
        samples.paired_ratio("pass fxloom", "pass torch.fx"),
        {lib: compute_nodes(gm) for lib, gm in results.items()},
        {lib: batch_norms(gm) for lib, gm in results.items()},
    )
    print(
        f"pass   fxloom {row.best['fxloom'] * 1e3:7.1f} ms  torch.fx "
        f"{row.best['torch.fx'] * 1e3:7.1f} ms  ratio {row.best['fxloom'] / row.best['torch.fx']:.2f}"
        f"  nodes {row.nodes['fxloom']} / {row.nodes['torch.fx']}",
        flush=True,
    )
    return row


# ----------------------------------------------------------------------------- tables
def latency_table(rows: list[LatencyRow], side: int) -> list[str]:
    lines = [
        "### Conv/batch-norm fusion: latency",
        "",
        f"ResNet-50, {side}x{side}, CPU, milliseconds per forward (best run) under "
        "`torch.no_grad()`. Reduction = 1 - fused / eager (the paper: 40% threaded, 18% "
        "single-threaded). fxloom / torch.fx compares the two fused models "
        f"(target <= {TARGET}, judged on *paired*: the median of per-repeat ratios).",
        "",
        "| batch | threads | eager | fxloom fused | torch.fx fused | fxloom reduction "
        "| torch.fx reduction | fxloom / torch.fx: best | paired | target | spread |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        t = {variant: seconds * 1e3 for variant, seconds in row.best.items()}
        verdict = "meets" if row.paired <= TARGET else "**misses**"
        lines.append(
            f"| {row.batch} | {row.threads} | {t['eager']:.1f} | {t['fxloom']:.1f} "
            f"| {t['torch.fx']:.1f} | {reduction(row, 'fxloom'):.1f}% "
            f"| {reduction(row, 'torch.fx'):.1f}% | {t['fxloom'] / t['torch.fx']:.3f} "
            f"| {row.paired:.3f} | {verdict} | {row.spread * 100:.0f}% |"
        )
    return lines


def pass_table(row: PassRow) -> list[str]:
    t = {lib: seconds * 1e3 for lib, seconds in row.best.items()}
    return [
        "### Conv/batch-norm fusion: the pass itself",
        "",
        "Milliseconds (best run) for `fuse(model).code` on ResNet-50: the pass as each API "
        "does it from the model, until the result is ready to run (fxloom: trace, fold, copy "
        "what the trace shares with the model, generate code on first use; torch.fx: "
        "deep-copy the model, trace, copy the graph, fold, generate code). Nodes = graph "
        "nodes other than placeholders and the output.",
        "",
        "| fxloom | torch.fx | ratio: best | paired | nodes fxloom / torch.fx "
        "| batch norms left fxloom / torch.fx |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {t['fxloom']:.1f} | {t['torch.fx']:.1f} | {t['fxloom'] / t['torch.fx']:.2f} "
        f"| {row.paired:.2f} | {row.nodes['fxloom']} / {row.nodes['torch.fx']} "
        f"| {row.batch_norms_left['fxloom']} / {row.batch_norms_left['torch.fx']} |",
    ]


def markdown(
    latency: list[LatencyRow], pass_row: PassRow, config: Settings, command: str, loads: tuple
) -> str:
    repeats = ", ".join(f"batch {b}: {n}" for b, n in config.latency_repeats.items())
    omp = os.environ.get("OMP_NUM_THREADS", "unset")
    lines = [
        f"## Conv/batch-norm fusion — {date.today().isoformat()}",
        "",
        f"{machine_line()}. `{command}`; OMP_NUM_THREADS "
        f"{omp}. Best of N runs (latency: {repeats}; pass: {config.pass_repeats}), rotating "
        "which variant goes first; garbage collector off inside timed regions.",
        "",
        *latency_table(latency, config.side),
        "",
        *pass_table(pass_row),
        "",
        noise_line(loads, SPREAD_IS),
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64x64, batch 1, 1-2 repeats (smoke)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8])
    parser.add_argument(
        "--threads", nargs="+", choices=("threaded", "one"), default=["threaded", "one"]
    )
    parser.add_argument("--record", action="store_true", help="append the tables to RESULTS.md")
    args = parser.parse_args()
    config = settings(args)
    default_threads = torch.get_num_threads()
    freeze_startup_heap()
    samples = Samples()
    load_before = load_average()
    latency = run_latency(config, samples, default_threads)
    pass_row = run_pass(config, samples)
    command = "python benchmarks/bench_fuse.py" + (" --quick" if args.quick else "")
    if not args.quick and tuple(args.batch_sizes) != (1, 8):
        command += " --batch-sizes " + " ".join(map(str, args.batch_sizes))
    if tuple(args.threads) != ("threaded", "one"):
        command += " --threads " + " ".join(args.threads)
    table = markdown(latency, pass_row, config, command, (load_before, load_average()))
    publish(table, args.record)


if __name__ == "__main__":
    main()
