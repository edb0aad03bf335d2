"""benchmarks/bench_quantize.py still runs: in a fresh interpreter at its smallest size, not
recording (RESULTS.md is left as it was)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_runs_in_quick_mode_and_prints_its_tables() -> None:
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_quantize.py"), "--quick"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    headings = ("latency", "error and phase durations", "exported programs, fxloom against PT2E")
    for heading in (f"### Post-training quantization: {h}" for h in headings):
        assert heading in done.stdout
    assert "| fxloom |" in done.stdout and "| torch |" in done.stdout
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text() == results
