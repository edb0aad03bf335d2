"""The benchmark scripts still run: each in a fresh interpreter at its smallest size, not recording.

They import fxloom and torch.fx side by side and exercise most of the public API, so a
change that breaks them should fail here, not at the next benchmark run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_benchmark(script: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(BENCHMARKS / script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_bench_trace_quick_runs_and_prints_its_tables() -> None:
    results_before = (BENCHMARKS / "RESULTS.md").read_text()
    result = run_benchmark("bench_trace.py", "--quick")
    assert result.returncode == 0, result.stderr
    for heading in ("### Trace time", "### Generated forward", "### Interpreter"):
        assert heading in result.stdout
    assert (BENCHMARKS / "RESULTS.md").read_text() == results_before  # no --record, no change


def test_bench_graph_small_size_runs() -> None:
    result = run_benchmark("bench_graph.py", "--sizes", "100")
    assert result.returncode == 0, result.stderr
    assert "## Graph operations" in result.stdout


def test_bench_examples_zoo_part_runs_on_a_tiny_model() -> None:
    result = run_benchmark("bench_examples.py", "--parts", "zoo", "--models", "mlp_tiny")
    assert result.returncode == 0, result.stderr
    assert "### zoo, fxloom capture: warm (first)" in result.stdout
    assert "| mlp_tiny | " in result.stdout


def test_bench_serialize_quick_runs_and_prints_its_tables() -> None:
    results_before = (BENCHMARKS / "RESULTS.md").read_text()
    result = run_benchmark("bench_serialize.py", "--quick")
    assert result.returncode == 0, result.stderr
    for heading in ("### Load time", "### Save time", "### File size"):
        assert heading in result.stdout
    assert "| mlp_tiny | " in result.stdout
    assert (BENCHMARKS / "RESULTS.md").read_text() == results_before  # no --record, no change


@pytest.mark.bytecode  # fxloom.compile: Python 3.11+
def test_bench_compile_ort_quick_runs_and_prints_its_table() -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("transformers")
    results_before = (BENCHMARKS / "RESULTS.md").read_text()
    result = run_benchmark("bench_compile_ort.py", "--quick")
    assert result.returncode == 0, result.stderr
    assert "| resnet_tiny | " in result.stdout and "| bert_4_layers | " in result.stdout
    assert (BENCHMARKS / "RESULTS.md").read_text() == results_before  # no --record, no change


def test_bench_quantize_llm_decode_quick_runs_every_variant() -> None:
    pytest.importorskip("transformers")
    result = run_benchmark_for("bench_quantize.py", "--llm-decode", "--quick")
    assert result.returncode == 0, result.stderr
    assert "### Quantization on plain tensors: LLM decode" in result.stdout
    for variant in ("fp32", "bf16", "fxloom w8 (bf16 act.)", "fxloom w4_g128 (bf16 act.)"):
        assert f"| {variant} | " in result.stdout
    assert "| torch.ao quantize_dynamic | " in result.stdout


def test_bench_quantize_resnet50_quick_runs_every_variant() -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")  # torch.onnx's exporter, for ORT's own quantize_static
    result = run_benchmark_for("bench_quantize.py", "--resnet50", "--quick")
    assert result.returncode == 0, result.stderr
    assert "### Quantization on plain tensors: ResNet-50 static int8" in result.stdout
    for variant in ("torch.ao FX", "fxloom", "fxloom QDQ on ORT", "ORT quantize_static"):
        assert f"| {variant} | " in result.stdout


def run_benchmark_for(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``run_benchmark`` with a longer limit: these build and quantize several models."""
    command = [sys.executable, str(BENCHMARKS / script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
