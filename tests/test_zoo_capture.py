"""A fast dozen of the benchmark zoo's models: fxloom captures each, and it matches eager.

The full comparison (every model, every capture method, each in a fresh subprocess) is
``python -m benchmarks.zoo.run``; this runs its worker in-process on one model per kind
(encoder, decoder, encoder-decoder, CNN, vision transformer, speech, multimodal, fxloom.zoo)
so a change that breaks capturing real models fails here first.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is not installed; import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.zoo import registry, worker  # noqa: E402

FAST = [
    "bert",
    "distilbert",
    "gpt2",
    "llama",
    "t5",
    "bart",
    "resnet",
    "convnext",
    "vit",
    "wav2vec2",
    "whisper",
    "clip",
    "mlp_tiny",
    "transformer_tiny",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("model", FAST)
def test_fxloom_captures_the_model_and_matches_eager(model: str) -> None:
    result = worker.measure(model, "fxloom")
    assert result["status"] == "ok", result
    assert result["nodes"] > 0


def test_every_zoo_model_belongs_to_a_family_of_the_report() -> None:
    # The report groups models by FAMILIES: one of another family would be left out.
    assert {spec.family for spec in registry.SPECS.values()} <= set(registry.FAMILIES)
