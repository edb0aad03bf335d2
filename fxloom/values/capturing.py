"""``capturing(frontend)``: the one context every frontend captures a program inside.

While a frontend runs the user's program to record it, libraries ask what is going on and
pick their capture-friendly code accordingly: ``torch.compiler.is_compiling()`` (transformers'
mask helpers skip shortcuts that read data), ``torch.compiler.is_exporting()``, and torch.fx's
``is_fx_tracing()`` (libraries written for torch.fx). What each frontend tells them is one row
of ``FRONTENDS``; the context sets those answers, makes the capture's module stack the
current one, and puts everything back on every path::

    >>> import torch
    >>> with capturing("export") as capture:
    ...     torch.compiler.is_compiling(), torch.compiler.is_exporting(), capture.frontend
    (True, True, 'export')
    >>> torch.compiler.is_compiling()
    False

Captures nest (a branch of ``fxloom.cond`` traced inside a trace): ``current_capture()`` is
the innermost, or None outside any (the module stack the capture records into, and
which frontend records).

Depends on ``fxloom._torch_compat`` (torch's compiler flags), ``fx_interop`` and ``module_stack``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from fxloom._torch_compat import compiler_reports
from fxloom.values.fx_interop import fx_reports_tracing
from fxloom.values.module_stack import ModuleStack

__all__ = ["FRONTENDS", "Capture", "FrontendAnswers", "capturing", "current_capture"]


@dataclass(frozen=True)
class FrontendAnswers:
    """What libraries are told while one frontend captures: each True answer is given; a
    False one leaves the question's answer as it was (a trace inside an export still exports)."""

    compiling: bool  # torch.compiler.is_compiling()
    exporting: bool  # torch.compiler.is_exporting()
    fx_tracing: bool  # torch.fx._symbolic_trace.is_fx_tracing()


# frontend -> its answers. Symbolic tracing stands in for torch.fx (libraries written for it ask
# is_fx_tracing) but is no export; export is both compiling and exporting, as torch.export is;
# the bytecode frontend (fxloom.compile) is compiling, as torch.compile is.
FRONTENDS: dict[str, FrontendAnswers] = {
    "symbolic tracing": FrontendAnswers(compiling=True, exporting=False, fx_tracing=True),
    "export": FrontendAnswers(compiling=True, exporting=True, fx_tracing=False),
    "bytecode": FrontendAnswers(compiling=True, exporting=False, fx_tracing=False),
}


@dataclass(frozen=True)
class Capture:
    """One running capture: which frontend, and the modules its program is inside."""

    frontend: str
    module_stack: ModuleStack


_ACTIVE: list[Capture] = []


@contextlib.contextmanager
def capturing(frontend: str, module_stack: ModuleStack | None = None) -> Iterator[Capture]:
    """Run the block as ``frontend`` capturing: libraries get its ``FRONTENDS`` answers, and
    ``module_stack`` (a fresh one if not given) is the current capture's module stack."""
    answers = FRONTENDS.get(frontend)
    if answers is None:
        raise ValueError(
            f"no frontend named {frontend!r}; add its answers to FRONTENDS in "
            f"fxloom/values/capturing.py (known: {', '.join(FRONTENDS)})"
        )
    capture = Capture(frontend, module_stack if module_stack is not None else ModuleStack())
    fx_flag = fx_reports_tracing() if answers.fx_tracing else contextlib.nullcontext()
    with compiler_reports(compiling=answers.compiling, exporting=answers.exporting), fx_flag:
        _ACTIVE.append(capture)
        try:
            yield capture
        finally:
            _ACTIVE.remove(capture)


def current_capture() -> Capture | None:
    """The innermost running capture, or None outside every capture."""
    return _ACTIVE[-1] if _ACTIVE else None
