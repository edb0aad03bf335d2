"""``fxloom lower MODEL``: run a model's supported regions in ONNX Runtime; print the report.

MODEL is a zoo name or ``package.module:factory`` with example inputs (see
``fxloom.cli.model_spec``). The model is lowered with ``fxloom.lower.lower`` on its
example inputs (``--check`` compares it with eager PyTorch there and fails past the
tolerance; ``--dynamic-batch`` leaves dimension 0 free; ``--threads`` sets both torch's and
ONNX Runtime's threads, 1 unless given). Then the report (regions lowered, operators left in
PyTorch and why) and the latency of eager and lowered on the example inputs, with the thread
count stated (``fxloom.cli.timing``: interleaved calls, medians).

A language model of transformers with its cache on (``fxloom.lower.decoder``) is lowered as
its prefill and decode graphs, the key/value cache as tensors; ``--decoder`` asks for that
(and refuses any other model). The latency is then one decode step's (batch 1, a past of
``--past`` tokens), and ``-o DIR`` writes ``DIR/prefill.onnx`` and ``DIR/decode.onnx``, the
files to deploy (``fxloom.lower.decoder_to_onnx``).

Depends on: ``fxloom.cli.model_spec``, ``fxloom.cli.timing``, ``fxloom.lower``, rich.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

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
    parser.add_argument(
        "--decoder",
        action="store_true",
        help="MODEL is a language model of transformers: lower it with its key/value cache "
        "(prefill and decode graphs); -o DIR then writes DIR/prefill.onnx and DIR/decode.onnx",
    )
    parser.add_argument(
        "--past",
        type=int,
        default=32,
        metavar="N",
        help="with a decoder: the cached tokens of the decode step timed (default 32)",
    )
    add_output_argument(parser, "the lowered module (with --decoder: a directory of ONNX files)")


def run(args: argparse.Namespace) -> int:
    """Lower and print; returns the exit code (errors are raised, for the CLI to report)."""
    from rich.console import Console
    from rich.text import Text

    from fxloom.cli.model_spec import call_model, example_inputs_of, load_model
    from fxloom.lower.decoder import LoweredDecoder, is_causal_lm
    from fxloom.lower.lowering import LoweringWarning, lower, too_little_lowered

    if args.threads < 1:
        raise ValueError("--threads takes a positive number")
    loaded = load_model(args.model)
    example_inputs_of(loaded, "lower translates and runs the model on them")
    model, inputs = loaded.model.eval(), loaded.inputs
    if args.decoder and not is_causal_lm(model):
        raise ValueError(
            f"--decoder lowers a language model of transformers with its cache on; "
            f"{loaded.name} ({type(model).__name__}) is not one: leave --decoder out"
        )
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
    if isinstance(lowered, LoweredDecoder):
        return _decoder_done(console, model, lowered, args)
    latency = compare_latency(
        lambda: call_model(model, inputs), lambda: call_model(lowered, inputs), threads=args.threads
    )
    console.print(Text(latency.summary(), style="bold"))
    saved = write_output(lowered, args.output)
    if saved is not None:
        console.print(Text(saved))
    return 0


def _decoder_done(console: Any, model: Any, lowered: Any, args: argparse.Namespace) -> int:
    """A decoder's decode-step latency, and its ONNX files written to ``-o DIR``."""
    from rich.text import Text

    from fxloom.lower.decoder import decode_step, decoder_to_onnx

    latency = compare_latency(
        decode_step(model, past=args.past),
        decode_step(model, lowered.forward, past=args.past),
        threads=args.threads,
    )
    summary = latency.summary().replace("on the example", f"of a decode step (past {args.past})")
    console.print(Text(summary, style="bold"))
    if args.output is not None:
        paths = decoder_to_onnx(model, args.output)
        written = ", ".join(str(path) for path in paths.values())
        console.print(Text(f"wrote {written} (the cache as past_key_values.* / present.*)"))
    return 0
