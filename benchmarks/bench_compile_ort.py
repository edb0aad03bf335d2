"""fxloom.compile(backend="onnxruntime") against fxloom.lower of the same model, and eager PyTorch.

    python benchmarks/bench_compile_ort.py [--quick] [--rounds N] [--record]

Models: ResNet-50 (``fxloom.zoo.build("resnet50")``, one 3x224x224 image, as bench_lower.py
has it) and a 4-layer BERT (Hugging Face's BertModel from the zoo's tiny BERT config,
``fxloom.zoo.hf_configs.BERT_LIKE``, with 4 layers, and the same 8 times wider, hidden size
256; one sequence of 64 tokens), in eval mode
under ``torch.no_grad()``, called with keyword inputs as users call them. Three sides:

    eager     the model itself
    lower     ``fxloom.lower.lower(model, inputs)``: a GraphModule calling ONNX Runtime
    compile   ``fxloom.compile(model, backend="onnxruntime")``: guards, the captured graph
              lowered by the same backend, the output rebuilt (a ModelOutput for BERT)

One thread everywhere: torch's, and ONNX Runtime's sessions on both lowered sides (one intra-op
thread, no spinning: ``lower(..., threads=1, spinning=False)``, and for fxloom.compile the same
backend configured alike, ``OnnxRuntimeBackend(threads=1, spinning=False)``, since compile
passes no arguments to lower; the per-call path is the named backend's). Steady state: per
round, each side runs a block of calls (its first call not counted), the sides taking turns
to go first; the table shows the median over rounds of the time per call, and compile / lower
as the median of the per-round ratios (the two measured next to each other). Times are the
calling thread's CPU time (at one thread ONNX Runtime and torch run on it), which a busy
shared machine disturbs far less than wall clock; the wall-clock ratio is shown beside it.
Garbage collector off inside timed blocks.

Compile counts, with ``backend="onnxruntime"`` itself: entries after 10 identical calls (target
1), and after calls alternating with another batch size (target at most 2); whether it ever
fell back to running the model as Python.

Target (issue 33): compile / lower <= 1.1 on both models, one compile per input signature.

Depends on: torch, transformers (for BERT), onnx and onnxruntime, fxloom.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: this checkout's fxloom and `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import fxloom  # noqa: E402
from benchmarks._common import freeze_startup_heap, load_average, machine_line, noise_line, publish  # noqa: E402
from fxloom import zoo  # noqa: E402
from fxloom.lower.lowering import lower  # noqa: E402
from fxloom.lower.onnxruntime_backend import OnnxRuntimeBackend  # noqa: E402
from fxloom.zoo.hf_configs import BERT_LIKE, hf  # noqa: E402

SIDES = ("eager", "lower", "compile")
BERT_TOKENS = 64
# The zoo's tiny BERT with 4 layers (the case of issue 33), and one 8x wider, where the same
# fixed cost per call (guards, dispatch, output rebuild) weighs less.
BERTS = {
    "bert_4_layers": dict(BERT_LIKE, num_hidden_layers=4),
    "bert_4_layers_h256": dict(
        BERT_LIKE, num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
        intermediate_size=1024,
    ),
}  # fmt: skip
TARGET = 1.1


@dataclass(frozen=True)
class Row:
    model: str
    median: dict[str, float]  # CPU seconds per call, by side
    ratio: float  # compile / lower, median of per-round ratios of CPU time
    wall_ratio: float  # the same of wall-clock time
    entries_identical: int  # after 10 identical calls
    entries_two_sizes: int  # after calls alternating with another batch size
    fell_back: bool  # ran as Python at some point
    max_error: float  # compile against eager, largest absolute difference


def build(name: str, batch: int) -> tuple[torch.nn.Module, Callable[[int], dict[str, Any]]]:
    """The model and a function giving its keyword inputs at a batch size."""
    torch.manual_seed(0)
    if name in BERTS:
        model = hf("BertModel", "BertConfig", **BERTS[name])()

        def inputs(batch: int) -> dict[str, Any]:
            generator = torch.Generator().manual_seed(batch)
            ids = torch.randint(
                0, BERT_LIKE["vocab_size"], (batch, BERT_TOKENS), generator=generator
            )
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

        return model.eval(), inputs
    model, (example,) = zoo.build(name)

    def images(batch: int) -> dict[str, Any]:
        return {
            "x": torch.randn(
                batch, *example.shape[1:], generator=torch.Generator().manual_seed(batch)
            )
        }

    return model.eval(), images


def leaves(output: Any) -> list[torch.Tensor]:
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    return [
        leaf for leaf in torch.utils._pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor)
    ]


def compile_counts(name: str, batch: int) -> tuple[int, int, bool]:
    """Entries of ``backend="onnxruntime"`` after 10 identical calls, then after calls at
    another batch size; whether it ran as Python at some point."""
    model, inputs_at = build(name, batch)
    compiled = fxloom.compile(model, backend="onnxruntime")
    same = inputs_at(batch)
    for _ in range(10):
        compiled(**same)
    identical = len(compiled.cache)
    for size in (batch + 1, batch, batch + 1, batch):
        compiled(**inputs_at(size))
    fell_back = compiled.compiled_forward.eager_reason is not None
    return identical, len(compiled.cache), fell_back


def per_call(fn: Callable[[], Any], calls: int) -> tuple[float, float]:
    """(wall-clock, this thread's CPU) seconds per call over a block of ``calls`` calls, one
    untimed call first."""
    fn()
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - wall) / calls, (time.thread_time() - cpu) / calls
    finally:
        gc.enable()


def measure(name: str, batch: int, rounds: int, calls: int) -> Row:
    model, inputs_at = build(name, batch)
    inputs = inputs_at(batch)
    one_thread = OnnxRuntimeBackend(threads=1, spinning=False)
    sides: dict[str, Callable[[], Any]] = {}
    with torch.no_grad():
        lowered = lower(model, inputs, threads=1, spinning=False)
        compiled = fxloom.compile(model, backend=one_thread)
        expected, got = leaves(model(**inputs)), leaves(compiled(**inputs))
        sides = {
            "eager": lambda: model(**inputs),
            "lower": lambda: lowered(**inputs),
            "compile": lambda: compiled(**inputs),
        }
        walls: dict[str, list[float]] = {side: [] for side in SIDES}
        cpus: dict[str, list[float]] = {side: [] for side in SIDES}
        for round_index in range(rounds):
            order = SIDES[round_index % 3 :] + SIDES[: round_index % 3]
            for side in order:
                wall, cpu = per_call(sides[side], calls)
                walls[side].append(wall)
                cpus[side].append(cpu)
        identical, two_sizes, fell_back = compile_counts(name, batch)
    error = max(float((a - b).abs().max()) for a, b in zip(got, expected))
    return Row(
        name,
        {side: statistics.median(runs) for side, runs in cpus.items()},
        paired_ratio(cpus),
        paired_ratio(walls),
        identical,
        two_sizes,
        fell_back or len(compiled.cache) != 1,
        error,
    )


def paired_ratio(times: dict[str, list[float]]) -> float:
    return statistics.median(c / lo for c, lo in zip(times["compile"], times["lower"]))


def table(rows: list[Row]) -> str:
    lines = [
        "| model | eager ms | fxloom.lower ms | fxloom.compile ms | compile / lower | "
        "(wall clock) | entries: 10 same calls | entries: + another batch | ran as Python | "
        "max abs error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        ms = {side: f"{row.median[side] * 1e3:.3f}" for side in SIDES}
        lines.append(
            f"| {row.model} | {ms['eager']} | {ms['lower']} | {ms['compile']} | "
            f"{row.ratio:.3f} | {row.wall_ratio:.3f} | {row.entries_identical} | "
            f"{row.entries_two_sizes} | "
            f"{'yes' if row.fell_back else 'no'} | {row.max_error:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="resnet_tiny and BERT, few rounds")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--record", action="store_true", help="append the table to RESULTS.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    models = ("resnet_tiny", "bert_4_layers") if args.quick else ("resnet50", *BERTS)
    rounds = 3 if args.quick else args.rounds
    calls = {"resnet50": 5}  # per block; the others are fast
    freeze_startup_heap()
    before = load_average()
    rows = [measure(name, 1, rounds, calls.get(name, 3 if args.quick else 50)) for name in models]
    after = load_average()
    import onnxruntime

    markdown = "\n\n".join(
        (
            f'## fxloom.compile(backend="onnxruntime") against fxloom.lower — {date.today()}',
            f"{machine_line()}; onnxruntime {onnxruntime.__version__}. "
            f"`python benchmarks/bench_compile_ort.py{' --quick' if args.quick else ''}`; "
            "batch 1, one torch and one ONNX Runtime thread (no spinning), so all the work "
            "runs on the calling thread: times are its CPU time per call (steadier than wall "
            "clock on a shared machine; the wall-clock ratio is given too), median over "
            f"{rounds} rounds of a block of calls per side, sides rotating; compile / lower is "
            'the median of per-round ratios. Entries are counted with backend="onnxruntime" '
            f"itself. Target: compile / lower <= {TARGET}, one entry per input signature.",
            table(rows),
            noise_line((before, after), "."),
        )
    )
    publish(markdown, args.record)


if __name__ == "__main__":
    main()
