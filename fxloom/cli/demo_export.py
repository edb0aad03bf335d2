"""The demo's export step: a zoo model exported to ATen operators, checked against eager.

``export_model`` is one step of ``fxloom demo`` (see ``fxloom.cli.demo.STEPS``): it exports
``EXPORT_MODEL`` with ``fxloom.export.export``, prints the signature summary (what the program's
inputs and outputs are, by kind), the first lines of its code, runs the cost pass on the
exported program, and checks ``ep.module()`` against the model run eagerly; then exports it
once more with a dynamic batch dimension and runs that program at two other batch sizes. A
difference sets ``state.export_match`` to False, which fails the demo.

Depends on: fxloom.export, fxloom.passes.cost, fxloom.zoo, rich.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from rich.syntax import Syntax
from rich.text import Text

from fxloom import zoo
from fxloom.cli.export import matches_eager, signature_summary
from fxloom.passes.cost import format_count

if TYPE_CHECKING:
    from fxloom.cli.demo import DemoState

EXPORT_MODEL = "resnet_tiny"
CODE_LINES = 6


def export_model(state: DemoState) -> None:
    from fxloom.export import export
    from fxloom.passes.cost import analyze_cost

    model, inputs = zoo.build(EXPORT_MODEL)
    start = time.perf_counter()
    ep = export(model, inputs)
    seconds = time.perf_counter() - start
    _say(
        state,
        f"export(model, x) records every ATen operator {EXPORT_MODEL} runs, on stand-in tensors "
        f"(shapes, no data), in {seconds:.2f} s:",
    )
    state.console.print(Text(signature_summary(ep)))
    lines = ep.graph_module.code.strip("\n").splitlines()
    code = "\n".join(lines[1 : CODE_LINES + 1])  # the operator calls, below the long def line
    state.console.print(Syntax(code, "python", background_color="default"), soft_wrap=True)
    _say(state, f"... {len(lines) - CODE_LINES - 1} more lines")
    report = analyze_cost(ep)
    traced = state.traced.get(EXPORT_MODEL)  # traced by an earlier step
    same = ""
    if traced is not None:
        flops = analyze_cost(traced.traced, *traced.inputs).flops
        same = f" ({'the same as' if flops == report.flops else 'unlike'} the traced graph's)"
    _say(
        state,
        f"the passes take exported programs: analyze_cost(ep) counts {format_count(report.flops)} "
        f"FLOPs{same} and {format_count(report.params)} parameters",
    )
    matches = matches_eager(ep, model, inputs, {})
    _say(state, f"ep.module() matches eager: {matches}")
    state.export_match = matches and _dynamic_batch(state, model, inputs[0])


def _dynamic_batch(state: DemoState, model: torch.nn.Module, x: torch.Tensor) -> bool:
    """Export once with a dynamic batch; run at other batch sizes against eager."""
    from fxloom.export import Dim, export

    examples = x.repeat(2, *([1] * (x.dim() - 1)))  # a batch of 2: 1 is a special case
    start = time.perf_counter()
    ep = export(model, (examples,), dynamic_shapes={"x": {0: Dim("batch", max=64)}})
    seconds = time.perf_counter() - start
    module = ep.module()
    batches = (3, 8)
    matches = True
    with torch.no_grad():
        for batch in batches:
            inputs = torch.randn(
                batch, *x.shape[1:], generator=torch.Generator().manual_seed(batch)
            )
            matches &= torch.allclose(module(inputs), model(inputs), atol=1e-5)
    _say(
        state,
        f"with dynamic_shapes={{'x': {{0: Dim('batch', max=64)}}}}, one export ({seconds:.2f} s) "
        f"serves every batch: range_constraints {ep.range_constraints}; batches "
        f"{', '.join(map(str, batches))} match eager: {matches}",
    )
    return matches


def _say(state: DemoState, message: str) -> None:
    state.console.print(Text(message, style="dim"))
