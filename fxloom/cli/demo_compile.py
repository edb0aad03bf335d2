"""The demo's compile step: ``fxloom.compile`` on a model with a ``print`` and a branch on data.

``compile_model`` is one step of ``fxloom demo`` (see ``fxloom.cli.demo.STEPS``). The model
below prints its hidden state's shape (Python output runs after the graph, no break) and
takes a branch on the sign of a tensor's sum (a graph break: the function is split there and
the branch runs as Python). It is compiled, run on inputs that take both branches and
compared with eager; then ``explain()`` shows its graphs, the one break with its file:line,
why and what to do, and the guards. A result that differs from eager sets
``state.compile_match`` to False, which fails the demo.

Depends on: fxloom.bytecode (``fxloom.compile``), rich.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch
from rich.text import Text
from torch import nn

import fxloom

if TYPE_CHECKING:
    from fxloom.cli.demo import DemoState


class Gate(nn.Module):
    """A small model with Python output and a data-dependent branch."""

    def __init__(self) -> None:
        super().__init__()
        self.encode = nn.Linear(8, 16)
        self.decode = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.encode(x))
        print(f"    (printed by the model: hidden has shape {tuple(hidden.shape)})")
        if hidden.sum() > 10:  # a branch on data: a graph break
            hidden = hidden / 2
        return self.decode(hidden)


def compile_model(state: DemoState) -> None:
    if sys.version_info < (3, 11):  # fxloom.compile reads the bytecode of 3.11 and newer
        _say(state, "skipped: fxloom.compile needs Python 3.11 or newer (this is "
             f"{sys.version_info.major}.{sys.version_info.minor}); everything else above runs here")  # fmt: skip
        state.compile_skipped = True
        return
    model = Gate().eval()
    compiled = fxloom.compile(model)
    _say(state, "compiled = fxloom.compile(model); compiled(x) for three inputs:")
    inputs = [torch.randn(2, 8), torch.randn(2, 8) + 3, torch.randn(2, 8) - 3]
    same = True
    with torch.no_grad():
        for x in inputs:
            same &= bool(torch.allclose(compiled(x), model(x), atol=1e-6))
    state.console.print(compiled.explain())
    verdict = "equal to eager on all three" if same else "DIFFERENT from eager"
    state.console.print(Text(f"compiled model: {verdict}", style="bold"))
    state.compile_match = same


def _say(state: DemoState, message: str) -> None:
    state.console.print(Text(message, style="dim"))
