"""The demo's quantization step: a zoo model to int8, its speedup, error and report.

``quantize_model`` is one step of ``fxloom demo`` (see ``fxloom.cli.demo.STEPS``): it
prepares ``QUANTIZE_MODEL`` (the paper's DeepRecommender at 1024 items, ``QUANTIZE_SIZES``)
with ``fxloom.quantize``, calibrates it on a few batches of ratings, converts it to torch's
int8 kernels, and prints what ``fxloom quantize`` prints: fp32 and int8 latency (one
thread, ``fxloom.cli.timing``), the error against fp32 and the report. An int8 output
further from fp32 than ``MAX_RELATIVE_ERROR`` or ``MIN_COSINE`` sets
``state.quantize_match`` to False, which fails the demo.

Why this model: int8 pays where reading the weights dominates, and its 2.6 M weights (10 MB
in fp32, 2.6 MB in int8) are that case. Measured on an AVX2 CPU without VNNI (one thread,
batch 32): int8 2.7-2.9x faster than fp32. At 256 items (``deeprec_tiny``) int8 was 0.5-0.7x
of fp32's speed at batches 8 to 256: quantizing and dequantizing the activations costs more
than the small matrix products save. The step says which it measured.

Depends on: fxloom.cli.quantize, fxloom.quantize, fxloom.zoo, rich.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from rich.text import Text

from fxloom.zoo._seed import seeded

if TYPE_CHECKING:
    from fxloom.cli.demo import DemoState

QUANTIZE_SIZES = (1024, 512, 512, 1024)
QUANTIZE_BATCH = 32
QUANTIZE_MODEL = f"DeepRecommender at {QUANTIZE_SIZES[0]} items, batch {QUANTIZE_BATCH}"
CALIBRATION_BATCHES = 8
MAX_RELATIVE_ERROR = 0.1
MIN_COSINE = 0.99


def quantize_model(state: DemoState) -> None:
    from fxloom.cli.quantize import quantize_and_measure
    from fxloom.quantize import QuantConfig, report
    from fxloom.zoo.deeprec import DeepRecommender, ratings

    with seeded(0):
        model = DeepRecommender(QUANTIZE_SIZES).eval()
    items = QUANTIZE_SIZES[0]
    inputs = (ratings(QUANTIZE_BATCH, items, 0),)
    batches = [
        (ratings(QUANTIZE_BATCH, items, seed),) for seed in range(1, CALIBRATION_BATCHES + 1)
    ]
    _say(
        state,
        f"prepare(model, x) folds, plans and inserts observers; {CALIBRATION_BATCHES} batches of "
        "ratings calibrate them; convert(prepared) swaps in fxloom's int8 operators (plain int8 "
        "tensors; the kernel table picks each layer's kernel for this CPU):",
    )
    with warnings.catch_warnings():  # torch's notice that its int8 dtypes move to torchao
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        result = quantize_and_measure(model, inputs, QuantConfig(), batches)
    state.console.print(Text(result.summary()))
    state.console.print(report(result.int8))  # a table, folded when it does not fit
    close = result.relative_error < MAX_RELATIVE_ERROR and result.cosine > MIN_COSINE
    state.quantize_match = close
    _say(
        state,
        f"int8 within relative error {MAX_RELATIVE_ERROR} and cosine {MIN_COSINE} of fp32: {close}",
    )
    _say(state, _what_the_speedup_shows(result.speedup))


def _what_the_speedup_shows(speedup: float) -> str:
    if speedup > 1:
        return (
            f"int8 pays here ({speedup:.2f}x): this model's time goes into reading its weights, "
            "which int8 makes 4x smaller. On small layers (fxloom quantize deeprec_tiny) int8 is "
            "slower: quantizing the activations costs more than the arithmetic saves."
        )
    return (
        f"int8 was not faster in this run ({speedup:.2f}x; 2.7-2.9x when measured on a quiet "
        "AVX2 machine): another process may have shared the core; run it again"
    )


def _say(state: DemoState, message: str) -> None:
    state.console.print(Text(message, style="dim"))
