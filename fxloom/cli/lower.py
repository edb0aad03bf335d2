"""``fxloom lower MODEL``: run a model's supported regions in ONNX Runtime; print the report.

MODEL is a zoo name or ``package.module:factory`` with example inputs (see
``fxloom.cli.model_spec``). The model is lowered with ``fxloom.lower.lower`` on its
example inputs (``--check`` compares it with eager PyTorch there and fails past the
tolerance; ``--dynamic-batch`` leaves dimension 0 free; ``--threads`` sets both torch's and
ONNX Runtime's threads, 1 unless given). Then the report (regions lowered, operators left in
PyTorch and why) and the latency of eager and lowered on the example inputs, with the thread
count stated (``fxloom.cli.timing``: interleaved calls, medians).

Depends on: ``fxloom.cli.model_spec``, ``fxloom.cli.timing``, ``fxloom.lower``, rich.
"""

from __future__ import annotations

import argparse
import warnings

from fxloom.cli.output import add_output_argument, write_output
from fxloom.cli.timing import TIMING_THREADS, compare_latency, pinned_threads

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fxloom lower``."""
    parser.add_argument("model", metavar="MODEL", help="a zoo model name or package.module:factory")
    parser.add_argument(
        "--check", action="store_true", help="compare with eager PyTorch; fail past the tolerance"
    )
    parser.add_argument(
        "--dynamic-batch",
        action="store_true",
        help="leave dimension 0 of every input free (lower's dynamic_batch=True)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=TIMING_THREADS,
        metavar="N",
        help=f"threads for torch and ONNX Runtime alike, while lowering and timing (default "
        f"{TIMING_THREADS}, so a busy machine does not skew the comparison)",
    )
    parser.add_argument(
        "--min-lowered",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="exit 1 when less than this share (0 to 1) of the operators runs in ONNX Runtime "
        "(default 0: exit 1 only when none does)",
    )
    add_output_argument(parser, "the lowered module")


def run(args: argparse.Namespace) -> int:
    """Lower and print; returns the exit code (errors are raised, for the CLI to report)."""
    from rich.console import Console
    from rich.text import Text

    from fxloom.cli.model_spec import call_model, example_inputs_of, load_model
    from fxloom.lower.lowering import LoweringWarning, lower, too_little_lowered

    if args.threads < 1:
        raise ValueError("--threads takes a positive number")
    loaded = load_model(args.model)
    example_inputs_of(loaded, "lower translates and runs the model on them")
    model, inputs = loaded.model.eval(), loaded.inputs
    with pinned_threads(args.threads), warnings.catch_warnings():
        warnings.simplefilter("ignore", LoweringWarning)  # said below, with the exit status
        lowered = lower(
            model,
            inputs,
            check=args.check,
            dynamic_batch=args.dynamic_batch,
            threads=args.threads,
        )
    report = lowered.lowering_report
    console = Console()
    if not console.is_terminal:
        console.width = 160
    console.print(report)
    too_little = too_little_lowered(report, args.min_lowered)
    if too_little is not None:
        # No speed-up is printed: what would be timed is fxloom's traced PyTorch, not the backend.
        console.print(Text(f"fxloom lower: {too_little}", style="bold red"))
        return 1
    latency = compare_latency(
        lambda: call_model(model, inputs), lambda: call_model(lowered, inputs), threads=args.threads
    )
    console.print(Text(latency.summary(), style="bold"))
    saved = write_output(lowered, args.output)
    if saved is not None:
        console.print(Text(saved))
    return 0
