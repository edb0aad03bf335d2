"""Fixtures shared by the pass tests.

- ``one_thread`` (automatic): every test module here runs torch on one thread; the machine is
  shared, and the small models of these tests gain nothing from more.
- ``traced_hf``: a Hugging Face model from ``benchmarks.zoo``, traced the way the benchmarks
  trace it, with its inputs and its eager result at hand.
- ``quick_benchmark``: runs a benchmark script in ``--quick`` mode and checks that it leaves
  ``benchmarks/RESULTS.md`` alone.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

import fxloom

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class TracedModel(NamedTuple):
    """A Hugging Face model, its example inputs, the arguments fixed while tracing, its trace."""

    model: nn.Module
    inputs: dict[str, torch.Tensor]
    fixed: dict[str, Any]  # the concrete_args: pass them to the eager model too
    gm: fxloom.GraphModule

    def eager(self) -> Any:
        """What the model computes on ``inputs`` (and the fixed arguments), without autograd."""
        with torch.no_grad():
            return self.model(**self.inputs, **self.fixed)


Prepare = Callable[[nn.Module, dict], tuple[nn.Module, dict]]


@pytest.fixture(scope="session")
def traced_hf() -> Callable[..., TracedModel]:
    """``traced_hf(name, prepare=None)``: ``registry.get(name).build()``, traced.

    ``prepare(model, inputs)``, when given, returns the model and inputs to trace instead (to
    change the dtype, say). Every call builds and traces anew, in about 10 ms for these tiny
    configurations: the passes under test change the module in place, so a cached one would
    carry one test's rewrite into the next. Skips the test when transformers is missing.
    """
    pytest.importorskip("transformers")
    if str(ROOT) not in sys.path:  # `benchmarks` is not installed; import it from the checkout
        sys.path.insert(0, str(ROOT))
    from benchmarks.zoo import registry
    from benchmarks.zoo.methods import fixed_args

    def trace(name: str, prepare: Prepare | None = None) -> TracedModel:
        model, inputs = registry.get(name).build()
        if prepare is not None:
            model, inputs = prepare(model, inputs)
        fixed = fixed_args(model, inputs)
        gm = fxloom.symbolic_trace(model, fixed, example_inputs=inputs)
        return TracedModel(model, inputs, fixed, gm)

    return trace


@pytest.fixture(scope="session")
def quick_benchmark() -> Callable[..., str]:
    """``quick_benchmark(script, timeout=300)``: the output of ``benchmarks/<script> --quick``.

    Fails, with the script's error output, when it exits non-zero or changes RESULTS.md
    (without ``--record`` it must not).
    """

    def run(script: str, timeout: float = 300) -> str:
        results = ROOT / "benchmarks" / "RESULTS.md"
        before = results.read_text()
        command = [sys.executable, str(ROOT / "benchmarks" / script), "--quick"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, result.stderr
        assert results.read_text() == before, f"{script} --quick changed {results}"
        return result.stdout

    return run
