"""The demo's lowering step: a zoo model run by ONNX Runtime, its speedup and its check.

``lower_model`` is one step of ``fxloom demo`` (see ``fxloom.cli.demo.STEPS``): it lowers
``LOWER_MODEL`` with ``fxloom.lower`` (``check=True``: compared with eager PyTorch on the
example inputs), prints the report and the latency of eager and lowered, then runs both on a
fresh input. A lowered model that differs from eager beyond ``RTOL``/``ATOL`` sets
``state.lower_match`` to False, which fails the demo. Without onnx and onnxruntime the step
says how to install them and is skipped (the demo does not fail for a missing extra).

Depends on: fxloom.cli.lower, fxloom.lower, fxloom.zoo, rich.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from rich.text import Text

from fxloom import zoo

if TYPE_CHECKING:
    from fxloom.cli.demo import DemoState

LOWER_MODEL = "resnet_tiny"
RTOL = 1e-3
ATOL = 1e-4


def lower_model(state: DemoState) -> None:
    from fxloom.cli.timing import TIMING_THREADS, compare_latency

    try:
        from fxloom.lower.lowering import LoweringError, lower
        from fxloom.lower.runtime import require

        require("onnx")
        require("onnxruntime")
    except ImportError as error:
        _say(state, f"skipped: {error}")
        return
    model, inputs = zoo.build(LOWER_MODEL)
    model.eval()
    _say(
        state,
        "lower(model, inputs, check=True) cuts the graph into regions ONNX supports, translates "
        "each to ONNX and runs it in ONNX Runtime; anything else would stay in PyTorch:",
    )
    try:
        lowered = lower(model, inputs, check=True, rtol=RTOL, atol=ATOL, threads=TIMING_THREADS)
    except LoweringError as error:
        state.console.print(Text(str(error)), soft_wrap=True)
        state.lower_match = False
        return
    state.console.print(lowered.lowering_report)
    latency = compare_latency(lambda: model(*inputs), lambda: lowered(*inputs))  # as many threads
    state.console.print(Text(latency.summary(), style="bold"))
    fresh = torch.randn_like(inputs[0])
    with torch.no_grad():
        close = torch.allclose(lowered(fresh), model(fresh), rtol=RTOL, atol=ATOL)
    state.lower_match = close
    _say(state, f"lowered matches eager on a fresh input (rtol {RTOL}, atol {ATOL}): {close}")


def _say(state: DemoState, message: str) -> None:
    state.console.print(Text(message, style="dim"))
