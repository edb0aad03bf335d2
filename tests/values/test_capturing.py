"""``fxloom.values.capturing``: the one context symbolic tracing and export capture inside.

Libraries pick capture-friendly code when torch says a graph is being captured; each frontend
tells them what its ``FRONTENDS`` row says, only while it captures, and the module stack the
capture records into is the current one.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx._symbolic_trace as fx_tracer
from torch import nn

import fxloom
from fxloom.export import export
from fxloom.values.capturing import FRONTENDS, capturing, current_capture
from fxloom.values.module_stack import ModuleStack


class Asks(nn.Module):
    """Remembers what torch answered while its forward ran."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        capture = current_capture()
        self.answers = (
            torch.compiler.is_compiling(),
            torch.compiler.is_exporting(),
            fx_tracer.is_fx_tracing(),
            capture.frontend if capture is not None else None,
        )
        return x + 1


def test_symbolic_tracing_says_compiling_and_fx_tracing_but_not_exporting() -> None:
    module = Asks()
    fxloom.symbolic_trace(module)
    assert module.answers == (True, False, True, "symbolic tracing")


def test_export_says_compiling_and_exporting_but_not_fx_tracing() -> None:
    module = Asks()
    export(module, (torch.ones(2),))
    assert module.answers == (True, True, False, "export")


def test_every_answer_is_put_back_after_a_capture() -> None:
    fxloom.symbolic_trace(Asks())
    export(Asks(), (torch.ones(2),))
    assert not torch.compiler.is_compiling() and not torch.compiler.is_exporting()
    assert not fx_tracer.is_fx_tracing() and current_capture() is None


def test_every_answer_is_put_back_when_the_program_fails() -> None:
    with pytest.raises(RuntimeError, match="inside"), capturing("export"):
        raise RuntimeError("inside")
    assert not torch.compiler.is_compiling() and current_capture() is None


def test_a_nested_capture_keeps_the_outer_ones_answers() -> None:
    with capturing("export"), capturing("symbolic tracing") as inner:
        assert current_capture() is inner
        assert torch.compiler.is_exporting() and fx_tracer.is_fx_tracing()
    with capturing("export") as outer:
        with capturing("symbolic tracing"):
            pass
        assert current_capture() is outer and not fx_tracer.is_fx_tracing()


def test_the_capture_records_into_the_module_stack_it_is_given() -> None:
    stack = ModuleStack()
    with capturing("symbolic tracing", stack) as capture:
        assert capture.module_stack is stack


def test_an_unknown_frontend_is_refused_naming_the_table() -> None:
    with pytest.raises(ValueError, match="FRONTENDS in fxloom/values/capturing.py"):
        with capturing("a frontend nobody wrote"):
            pass


def test_every_frontend_says_it_is_compiling() -> None:
    assert all(answers.compiling for answers in FRONTENDS.values())


def test_a_reference_to_is_compiling_taken_before_the_trace_answers_too() -> None:
    # The answer is torch's own flag, not a patched attribute: libraries that imported
    # ``is_compiling`` by name at their import time hear it as well.
    from torch.compiler import is_compiling

    class AsksByName(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.answer = is_compiling()
            return x

    module = AsksByName()
    fxloom.symbolic_trace(module)
    assert module.answer is True
