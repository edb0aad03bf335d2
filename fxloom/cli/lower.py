"""``fxloom lower MODEL``: run a model's supported regions in ONNX Runtime; print the report.

MODEL is a zoo name or ``package.module:factory`` with example inputs (see
``fxloom.cli.model_spec``). The model is lowered with ``fxloom.lower.lower`` on its
example inputs (``--check`` compares it with eager PyTorch there and fails past the
tolerance; ``--dynamic-batch`` leaves dimension 0 free; ``--threads`` sets both torch's and
ONNX Runtime's threads). Then the report (regions lowered, operators left in PyTorch and
why) and the latency of eager and lowered on the example inputs: the median of interleaved
timed calls, each side taking turns to go first.

Depends on: ``fxloom.cli.model_spec``, ``fxloom.lower``, rich.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Latency", "add_arguments", "compare_latency", "run"]

TIMING_RUNS = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fxloom lower``."""
    parser.add_argument("model", metavar="MODEL", help="a zoo model name or package.module:factory")
    parser.add_argument(
        "--check", action="store_true", help="compare with eager PyTorch; fail past the tolerance"
    )
    parser.add_argument(
        "--dynamic-batch", action="store_true", help="leave dimension 0 of the inputs free"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="threads for torch and ONNX Runtime (default: torch's current setting)",
    )


@dataclass(frozen=True)
class Latency:
    """Median seconds of one call, eager and lowered, on the same inputs."""

    eager_seconds: float
    lowered_seconds: float

    @property
    def speedup(self) -> float:
        return self.eager_seconds / self.lowered_seconds

    def summary(self) -> str:
        return (
            f"latency on the example (median of {TIMING_RUNS}): eager "
            f"{self.eager_seconds * 1e3:.3f} ms, lowered {self.lowered_seconds * 1e3:.3f} ms "
            f"({self.speedup:.2f}x)"
        )


def run(args: argparse.Namespace) -> int:
    """Lower and print; returns the exit code (errors are raised, for the CLI to report)."""
    from rich.console import Console
    from rich.text import Text

    from fxloom.cli.model_spec import call_model, load_model
    from fxloom.lower.lowering import lower

    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads takes a positive number")
    loaded = load_model(args.model)
    if loaded.inputs is None:
        raise ValueError(
            f"{args.model} comes with no example inputs, and lower translates and runs the "
            "model on them: make the MODEL factory return (model, example_inputs)"
        )
    model, inputs = loaded.model.eval(), loaded.inputs
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        lowered = lower(
            model,
            inputs,
            check=args.check,
            dynamic_batch=args.dynamic_batch,
            threads=args.threads,
        )
        latency = compare_latency(
            lambda: call_model(model, inputs), lambda: call_model(lowered, inputs)
        )
    finally:
        torch.set_num_threads(threads)
    console = Console()
    if not console.is_terminal:
        console.width = 160
    console.print(lowered.lowering_report)
    console.print(Text(latency.summary(), style="bold"))
    return 0


def compare_latency(eager: Callable[[], Any], lowered: Callable[[], Any]) -> Latency:
    """Medians of interleaved timed calls, each side going first in turn.

    >>> fast = compare_latency(lambda: sum(range(1000)), lambda: None)
    >>> fast.speedup > 1
    True
    """
    samples: dict[str, list[float]] = {"eager": [], "lowered": []}
    sides = [("eager", eager), ("lowered", lowered)]
    with torch.no_grad():
        for _, call in sides:  # warm up: sessions, allocators, packed weights
            call()
        for repeat in range(TIMING_RUNS):
            for label, call in sides[repeat % 2 :] + sides[: repeat % 2]:
                start = time.perf_counter()
                call()
                samples[label].append(time.perf_counter() - start)
    return Latency(statistics.median(samples["eager"]), statistics.median(samples["lowered"]))
