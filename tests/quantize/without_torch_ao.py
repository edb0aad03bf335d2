"""Running a snippet in a fresh interpreter where ``torch.ao.quantization`` cannot be imported:
what fxloom's plain-tensor quantization makes, saves and loads must not need it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_BLOCK = r"""
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch.ao.quantization" or name.startswith("torch.ao.quantization."):
            raise ImportError(f"{name} is blocked by this test")

import torch  # (torch itself imports torch.quantization, which imports torch.ao.quantization)

for name in [m for m in sys.modules if m.startswith(("torch.ao.quantization", "torch.quantization"))]:
    del sys.modules[name]
sys.meta_path.insert(0, Block())
"""

_REPORT = r"""
print("torch.ao.quantization imported:", any(m.startswith("torch.ao.quantization") for m in sys.modules))
"""


def run_without_torch_ao(body: str, *argv: str) -> str:
    """Runs ``body`` (``sys.argv[1:]`` are ``argv``) with torch.ao.quantization blocked; asserts
    it succeeded and never imported it, and returns what it printed."""
    result = subprocess.run(
        [sys.executable, "-c", _BLOCK + body + _REPORT, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "torch.ao.quantization imported: False" in result.stdout
    return result.stdout
