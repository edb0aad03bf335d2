"""Hugging Face models of the zoo registry (tiny configs) quantize in both modes and stay
close to fp32: a robustness check over real architectures (encoder, vision, encoder-decoder),
calibrated on the registry's example inputs and two batches of other sizes, and compared on
the example and on a batch of yet another batch size and length.

Bounds: relative error < 0.1 (static), < 0.05 (dynamic), cosine similarity > 0.99.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from quantize_helpers import cosine, relative_error

import fxloom
from fxloom.quantize import QuantConfig, calibrate, convert, prepare, report

pytest.importorskip("transformers")
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `benchmarks` is not installed; import it from the checkout
    sys.path.insert(0, ROOT)

from benchmarks.zoo import registry  # noqa: E402
from benchmarks.zoo.methods import fixed_args  # noqa: E402

BOUNDS = {"static": 0.1, "dynamic": 0.05}


def first_tensor(output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output[0]


def another_batch(model, inputs: dict, seed: int) -> dict:
    """Inputs like ``inputs`` at another batch size and length (``seed`` picks both)."""
    g = torch.Generator().manual_seed(seed)
    grow = 1 + seed % 3
    out = dict(inputs)
    for key, value in inputs.items():
        if not isinstance(value, torch.Tensor):
            continue
        batch = value.shape[0] + grow
        if value.dtype == torch.int64:  # token ids and masks: [batch, length]
            shape = (batch, value.shape[1] + 2 * grow)
            out[key] = (
                torch.ones(shape, dtype=torch.int64)
                if "mask" in key
                else torch.randint(0, model.config.vocab_size, shape, generator=g)
            )
        else:  # images: another batch size
            out[key] = torch.randn(batch, *value.shape[1:], generator=g)
    return out


@pytest.mark.parametrize("mode", ["static", "dynamic"])
@pytest.mark.parametrize("name", ["bert", "vit", "t5"])
def test_hugging_face_model_quantizes_close_to_fp32(name: str, mode: str) -> None:
    model, inputs = registry.get(name).build()
    fixed = fixed_args(model, inputs)
    traced = fxloom.symbolic_trace(model, fixed, example_inputs=inputs)
    prepared = prepare(traced, inputs, QuantConfig(mode=mode))
    batches = [inputs, another_batch(model, inputs, 1), another_batch(model, inputs, 2)]
    int8 = convert(calibrate(prepared, batches, progress=False))
    for checked in (inputs, another_batch(model, inputs, 3)):
        with torch.no_grad():
            out = first_tensor(int8(**checked))
            ref = first_tensor(model(**checked, **fixed))
        assert out.shape == ref.shape
        assert relative_error(out, ref) < BOUNDS[mode]
        assert cosine(out, ref) > 0.99
    assert report(int8).quantized  # something became int8
