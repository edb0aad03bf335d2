"""`fxloom lower MODEL`, the demo's lowering step, and a quick run of benchmarks/bench_lower.py.

The command runs once in a fresh interpreter, as a user types it; options and the demo step
run in-process, reading what they printed.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from fxloom import cli

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    command = [sys.executable, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_lower_prints_the_report_and_the_latency_of_eager_and_lowered():
    result = run("-m", "fxloom", "lower", "resnet_tiny", "--check", "--threads", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert "ResNetTiny: 1 of 1 region in onnxruntime" in out
    assert "check: max abs error" in out and "(ok)" in out
    assert "latency on the example (median of " in out and "1 thread): eager " in out
    assert "ms, lowered " in out


def test_lower_names_what_stays_in_pytorch(capsys):
    assert cli.main(["lower", "tests.lower.test_lower:gated_mlp", "--threads", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 of 2 regions in onnxruntime" in out
    assert "%spectral_gate" in out and "no ONNX translation" in out


def test_lower_with_a_dynamic_batch(capsys):
    assert cli.main(["lower", "mlp_tiny", "--dynamic-batch", "--threads", "1"]) == 0
    assert "1 of 1 region in onnxruntime" in " ".join(capsys.readouterr().out.split())


def test_lower_refuses_a_model_without_example_inputs(capsys):
    assert cli.main(["lower", "fxloom.zoo.mlp:mlp_tiny"]) == cli.EXIT_FAILURE
    assert "comes with no example inputs" in capsys.readouterr().err


def test_lower_without_onnxruntime_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert cli.main(["lower", "mlp_tiny"]) == cli.EXIT_FAILURE
    assert "pip install fxloom[onnx]" in capsys.readouterr().err


# ---------------------------------------------------------------- the demo step
def demo_state():
    from fxloom.cli import demo

    console = Console(file=io.StringIO(), width=120, no_color=True)
    return demo.DemoState(console=console, results_match=True, traced_match=True), demo


def test_the_demo_lowers_a_model_and_shows_its_speedup_and_check():
    from fxloom.cli import demo_lower

    state, demo = demo_state()
    demo_lower.lower_model(state)
    shown = " ".join(state.console.file.getvalue().split())
    assert "ResNetTiny: 1 of 1 region in onnxruntime" in shown
    assert "1 thread): eager " in shown and "lowered " in shown and "x)" in shown
    assert "lowered matches eager on a fresh input (rtol 0.001, atol 0.0001): True" in shown
    assert state.lower_match and demo._summarise(state) == 0


def test_a_lowered_model_that_differs_from_eager_fails_the_demo(monkeypatch):
    from fxloom.cli import demo_lower

    monkeypatch.setattr(demo_lower, "RTOL", 0.0)  # ONNX Runtime rounds differently
    monkeypatch.setattr(demo_lower, "ATOL", 0.0)
    state, demo = demo_state()
    demo_lower.lower_model(state)
    assert not state.lower_match
    assert demo._summarise(state) == 1
    assert "resnet_tiny lowered to ONNX Runtime" in state.console.file.getvalue()


# ---------------------------------------------------------------- the benchmark
def test_bench_lower_quick_runs_and_prints_its_tables():
    results_before = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    result = run("benchmarks/bench_lower.py", "--quick", "--threads", "1", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "### Latency (median ms) and speedup" in result.stdout
    assert "| resnet_tiny | 1 |" in result.stdout and "| bert | 1 |" in result.stdout
    assert "### Default settings: lower(model, inputs)" in result.stdout
    assert "| resnet_tiny | 1 |" in result.stdout.split("### Default settings")[1]
    assert "### Translation time" in result.stdout
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text() == results_before  # no --record
