"""The demo's quantization step: a zoo model to int8, its speedup, error and report.

``quantize_model`` is one step of ``fxloom demo`` (see ``fxloom.cli.demo.STEPS``): it
prepares ``QUANTIZE_MODEL`` (the paper's DeepRecommender at 256 items) with
``fxloom.quantize``, calibrates it on a few batches of ratings, converts it to torch's int8
kernels, and prints what ``fxloom quantize`` prints: fp32 and int8 latency, the error
against fp32 and the report. An int8 output further from fp32 than ``MAX_RELATIVE_ERROR`` or
``MIN_COSINE`` sets ``state.quantize_match`` to False, which fails the demo.

Depends on: fxloom.cli.quantize, fxloom.quantize, fxloom.zoo, rich.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from rich.text import Text

from fxloom import zoo

if TYPE_CHECKING:
    from fxloom.cli.demo import DemoState

QUANTIZE_MODEL = "deeprec_tiny"
CALIBRATION_BATCHES = 8
MAX_RELATIVE_ERROR = 0.1
MIN_COSINE = 0.99


def quantize_model(state: DemoState) -> None:
    from fxloom.cli.quantize import quantize_and_measure
    from fxloom.quantize import QuantConfig, report
    from fxloom.zoo.deeprec import ratings

    model, inputs = zoo.build(QUANTIZE_MODEL)
    batches = [ratings(16, 256, seed) for seed in range(1, CALIBRATION_BATCHES + 1)]
    _say(
        state,
        f"prepare(model, x) folds, plans and inserts observers; {CALIBRATION_BATCHES} batches of "
        "ratings calibrate them; convert(prepared) swaps in torch's int8 kernels:",
    )
    with warnings.catch_warnings():  # torch's notice that its int8 dtypes move to torchao
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        result = quantize_and_measure(model, inputs, QuantConfig(), batches)
    state.console.print(Text(result.summary()))
    state.console.print(Text(str(report(result.int8))), soft_wrap=True)
    close = result.relative_error < MAX_RELATIVE_ERROR and result.cosine > MIN_COSINE
    state.quantize_match = close
    _say(
        state,
        f"int8 within relative error {MAX_RELATIVE_ERROR} and cosine {MIN_COSINE} of fp32: "
        f"{close} (a model this small is not faster in int8; `fxloom quantize deeprec` is)",
    )


def _say(state: DemoState, message: str) -> None:
    state.console.print(Text(message, style="dim"))
