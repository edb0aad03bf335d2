"""Importing fxloom and a Hugging Face model in the dev environment writes nothing to stderr.

transformers imports torchao whenever it is installed (its torchao quantizer loads with every
model class), and torchao 0.17/0.18 on torch 2.13's CPU wheel print four lines to stderr (CUDA
.so files that fail to load, Enums registered with pytree's deprecated ``register_constant``).
So torchao, needed only as the PT2E comparison peer, is the opt-in ``pt2e`` extra, not part of
``test``: pyproject.toml says why.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

IMPORTS = "import fxloom, transformers; transformers.GPT2Model; transformers.LlamaForCausalLM"


def test_the_test_extra_does_not_install_torchao():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert not any(req.startswith("torchao") for req in extras["test"])
    assert extras["pt2e"] == ["torchao"]


@pytest.mark.skipif(
    importlib.util.find_spec("torchao") is not None,
    reason="torchao (the opt-in pt2e extra) is installed here: transformers imports it and it "
    "prints its own warnings; an environment set up from `.[test]` has none",
)
def test_importing_fxloom_and_a_transformers_model_prints_nothing():
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
