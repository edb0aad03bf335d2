"""``fxloom quantize MODEL``: quantize a model to int8; print speedup, error and the report.

MODEL is a zoo name or ``package.module:factory`` with example inputs (see
``fxloom.cli.model_spec``). Static mode (the default) prepares the model
(``fxloom.quantize.prepare``), calibrates it on ``--batches`` batches and converts it;
dynamic mode converts Linear/LSTM/GRU layers with no calibration. Calibration batches are
random, shaped like the example inputs with ``--batch-size`` rows (float tensors: standard
normal; integer tensors: drawn from the example's range of values, so token ids stay valid;
anything else: the example's own), or read from ``--data file.pt`` (a list of batches, or
one tensor cut into batches of ``--batch-size`` rows).

Then, on the example inputs: fp32 and int8 latency (``fxloom.cli.timing``: one thread, as
torch's quantized kernels run here, interleaved calls, medians), the int8 output's error
against fp32 (relative error and cosine similarity over all output tensors), and the report
of what became int8 and what stayed float, and why.

Depends on: ``fxloom.cli.model_spec``, ``fxloom.quantize``, ``fxloom.pytree``, rich.
"""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from fxloom.cli.output import add_output_argument, write_output
from fxloom.cli.timing import Latency, compare_latency

__all__ = ["QuantizeResult", "add_arguments", "quantize_and_measure", "random_batches", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fxloom quantize``."""
    from fxloom.quantize.config import ENGINES, MODES

    parser.add_argument("model", metavar="MODEL", help="a zoo model name or package.module:factory")
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="static",
        help="static (calibrated) or dynamic (default: static)",
    )
    parser.add_argument(
        "--engine", choices=ENGINES, default="x86", help="the int8 kernels (default: x86)"
    )
    parser.add_argument(
        "--batches", type=int, default=8, metavar="N", help="calibration batches (default: 8)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="B",
        help="rows per calibration batch (default: the example inputs' batch size)",
    )
    parser.add_argument(
        "--data",
        default=None,
        metavar="FILE.pt",
        help="calibrate on the batches saved in this file (torch.save of a list of batches, "
        "or of one tensor, cut into batches of --batch-size rows) instead of random data",
    )
    add_output_argument(parser, "the int8 module")


@dataclass(frozen=True)
class QuantizeResult:
    """What ``quantize_and_measure`` made and measured."""

    int8: torch.nn.Module
    latency: Latency  # fp32 then int8
    relative_error: float
    cosine: float

    @property
    def speedup(self) -> float:
        return self.latency.speedup

    def summary(self) -> str:
        (fp32, int8), latency = self.latency.seconds, self.latency
        threads = f"{latency.threads} thread{'s' if latency.threads != 1 else ''}"
        return (
            f"latency on the example: fp32 {fp32 * 1e3:.3f} ms, int8 {int8 * 1e3:.3f} ms "
            f"({self.speedup:.2f}x; median of {latency.runs}, {threads}); error against fp32: "
            f"relative {self.relative_error:.4f}, cosine {self.cosine:.5f}"
        )


def run(args: argparse.Namespace) -> int:
    """Quantize and print; returns the exit code (errors are raised, for the CLI to report)."""
    from rich.text import Text

    from fxloom.cli.console import cli_console
    from fxloom.cli.model_spec import example_inputs_of, load_model
    from fxloom.quantize import QuantConfig, report

    if args.batches < 1 or (args.batch_size is not None and args.batch_size < 1):
        raise ValueError("--batches and --batch-size take a positive number")
    loaded = load_model(args.model)
    example_inputs_of(loaded, "quantize prepares and measures the model on them")
    config = QuantConfig(engine=args.engine, mode=args.mode)
    data = None
    if args.mode == "static":
        data = _batches(args, loaded.inputs)
    with warnings.catch_warnings():  # torch's notice that its int8 dtypes move to torchao
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        result = quantize_and_measure(loaded.model.eval(), loaded.inputs, config, data)
    console = cli_console()
    source = f"{len(data)} batches from {args.data}" if args.data else None
    how = "no calibration" if data is None else source or f"{len(data)} random batches"
    heading = f"{loaded.name}: {config.mode} int8, engine {config.engine}, {how}"
    console.print(Text(heading), soft_wrap=True)  # a path is not broken across lines
    console.print(Text(result.summary(), style="bold"))
    console.print(report(result.int8))
    saved = write_output(result.int8, args.output)
    if saved is not None:
        console.print(Text(saved))
    return 0


def quantize_and_measure(
    model: torch.nn.Module,
    inputs: tuple[Any, ...] | dict[str, Any],
    config: Any,
    calibration: list[Any] | None,
) -> QuantizeResult:
    """Prepare, calibrate (static mode), convert; time and compare both on ``inputs``.

    >>> import torch
    >>> from fxloom.quantize import QuantConfig
    >>> _ = torch.manual_seed(0)  # inputs within the calibration's range
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8)).eval()
    >>> inputs = (torch.randn(4, 8),)
    >>> result = quantize_and_measure(model, inputs, QuantConfig(), random_batches(inputs, 2, 4))
    >>> result.relative_error < 0.05, result.cosine > 0.99
    (True, True)
    """
    from fxloom.cli.model_spec import call_model
    from fxloom.quantize import calibrate, convert, prepare

    prepared = prepare(model, inputs, config)
    if calibration is not None:
        calibrate(prepared, calibration, progress=False)
    int8 = convert(prepared)
    with torch.no_grad():
        expected, got = call_model(model, inputs), call_model(int8, inputs)
    latency = compare_latency(
        lambda: call_model(model, inputs), lambda: call_model(int8, inputs), labels=("fp32", "int8")
    )
    relative, cosine = _error(got, expected)
    return QuantizeResult(int8, latency, relative, cosine)


def random_batches(
    inputs: tuple[Any, ...] | dict[str, Any], count: int, batch_size: int | None, seed: int = 1
) -> list[Any]:
    """``count`` random batches shaped like ``inputs`` (see the module docstring).

    >>> import torch
    >>> (images, ids), = random_batches((torch.randn(2, 3), torch.tensor([[4, 9]])), 1, 5)
    >>> tuple(images.shape), tuple(ids.shape), 4 <= int(ids.min()) <= int(ids.max()) <= 9
    ((5, 3), (5, 2), True)
    """
    generator = torch.Generator().manual_seed(seed)

    def like(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return value
        shape = (batch_size or value.shape[0], *value.shape[1:])
        if value.is_floating_point():
            return torch.randn(shape, generator=generator, dtype=value.dtype)
        if value.dtype in (torch.int32, torch.int64):
            low, high = int(value.min()), int(value.max())
            return torch.randint(low, high + 1, shape, generator=generator, dtype=value.dtype)
        return value

    if isinstance(inputs, dict):
        return [{name: like(v) for name, v in inputs.items()} for _ in range(count)]
    return [tuple(like(v) for v in inputs) for _ in range(count)]


def _batches(args: argparse.Namespace, inputs: tuple[Any, ...] | dict[str, Any]) -> list[Any]:
    if args.data is None:
        return random_batches(inputs, args.batches, args.batch_size)
    data = torch.load(args.data, weights_only=True)
    if isinstance(data, torch.Tensor):
        return list(torch.split(data, args.batch_size or data.shape[0]))
    if isinstance(data, (list, tuple)) and data:
        return list(data)
    raise ValueError(
        f"--data {args.data} holds a {type(data).__name__}; save a list of batches (tensors, "
        "tuples or dicts of inputs) or one tensor with torch.save"
    )


def _error(got: Any, expected: Any) -> tuple[float, float]:
    """Relative error and cosine similarity over all float tensors of the outputs."""
    from fxloom.pytree import tree_leaves

    def flat(outputs: Any) -> torch.Tensor:
        leaves = [t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]
        return torch.cat([t.detach().float().flatten() for t in leaves if t.is_floating_point()])

    out, ref = flat(got), flat(expected)
    relative = float((out - ref).norm() / ref.norm().clamp(min=1e-12))
    cosine = float(torch.nn.functional.cosine_similarity(out, ref, dim=0))
    return relative, cosine
