"""What the kernel table packs follows every tensor it was packed from, and inference mode.

- A layer's packed form (oneDNN's prepacked weight, column sums times the scales, bf16
  scales, int4 tiles) is made from its weight *and* its scales and zero points: changing a
  scale in place, or putting another tensor in its place, packs again, and the result follows.
- Inference tensors (made inside ``torch.inference_mode()``) have no version counter:
  ``convert`` and ``fxloom.load`` make ordinary tensors inside the mode, so a model converted
  or loaded there runs its kernels; a layer whose tensors are inference tensors anyway runs
  the reference, with one warning that says what to do.
"""

from __future__ import annotations

import io
import warnings

import pytest
import torch

import fxloom
from fxloom.quantize import QuantConfig, convert, kernels, ops, prepare
from fxloom.quantize.weights import int4_grouped


def _w8_call():
    g = torch.Generator().manual_seed(0)
    w = torch.randint(-127, 128, (48, 64), generator=g, dtype=torch.int8)
    return (torch.randn(3, 64, generator=g), w, torch.rand(48, generator=g) * 0.01 + 1e-3, None)


def _w4_call():
    packed, scale, zero_point = int4_grouped(torch.randn(48, 256), 64)
    return (torch.randn(3, 256), packed, scale, zero_point, 64, None)


def _static_call():
    g = torch.Generator().manual_seed(1)
    w = torch.randint(-64, 65, (48, 64), generator=g, dtype=torch.int8)
    scale = torch.rand(48, generator=g) * 0.01 + 1e-3
    return (torch.randn(3, 64, generator=g), 0.03, 128, w, scale, None, 0.0, 0, False, False)


def _conv_call():
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 256, (1, 8, 6, 6), generator=g, dtype=torch.uint8)
    # 8-bit weights: without VNNI the float32 row, whose pack holds the weight times its scales
    w = torch.randint(-127, 128, (16, 8, 3, 3), generator=g, dtype=torch.int8)
    scale = torch.rand(16, generator=g) * 0.01 + 1e-3
    return (x, 0.02, 3, w, scale, None, [1, 1], [1, 1], [1, 1], 1, 0.0, 0, False)


CALLS = {
    "conv2d_int8": (_conv_call, ops.reference_conv2d_int8, 4),
    "linear_w8": (_w8_call, ops.reference_linear_w8, 2),
    "linear_w4": (_w4_call, ops.reference_linear_w4, 2),
    "linear_int8": (_static_call, ops.reference_linear_int8, 4),
}


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    # the weight-only rows round activations to bf16 on some CPUs (well within 2% of the
    # largest output); a stale scale, doubled or tripled, is off by the output itself
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()


@pytest.mark.parametrize("op", list(CALLS))
def test_a_scale_changed_in_place_after_a_call_packs_again(op: str) -> None:
    make, reference, scale_at = CALLS[op]
    args = make()
    kernels.run(op, reference, args)
    args[scale_at].mul_(2)
    _close(kernels.run(op, reference, args), reference(*args))


@pytest.mark.parametrize("op", list(CALLS))
def test_another_scale_tensor_in_its_place_packs_again(op: str) -> None:
    make, reference, scale_at = CALLS[op]
    args = make()
    kernels.run(op, reference, args)
    args = (*args[:scale_at], args[scale_at] * 3, *args[scale_at + 1 :])
    _close(kernels.run(op, reference, args), reference(*args))


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)
    ).eval()


def _no_inference_tensors(model: torch.nn.Module) -> bool:
    return not any(t.is_inference() for t in model.state_dict().values())


@pytest.mark.parametrize("scheme", ["w8", "dynamic", "w4", "static"])
def test_a_model_converted_inside_inference_mode_runs_its_kernels(scheme: str) -> None:
    mlp, x = _mlp(), torch.randn(4, 256)
    with torch.inference_mode():
        prepared = prepare(mlp, (x,), QuantConfig(scheme=scheme))
        prepared(x)  # calibration (static)
        int8 = convert(prepared)
        assert _no_inference_tensors(int8)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "runs the reference" warning
            inside = int8(x)
    torch.testing.assert_close(inside, int8(x))


def test_a_file_loaded_inside_inference_mode_runs_its_kernels() -> None:
    mlp, x = _mlp(), torch.randn(4, 256)
    int8 = convert(prepare(mlp, (x,), QuantConfig(scheme="dynamic")))
    saved = io.BytesIO()
    fxloom.save(int8, saved)
    with torch.inference_mode():
        loaded = fxloom.load(saved.getvalue())
        assert _no_inference_tensors(loaded)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.testing.assert_close(loaded(x), int8(x))


def test_inference_tensor_weights_run_the_reference_and_say_what_to_do(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "_WARNED_UNTRACKED", set())
    with torch.inference_mode():
        args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in _w8_call())
        with pytest.warns(UserWarning, match="outside torch.inference_mode"):
            got = kernels.run("linear_w8", ops.reference_linear_w8, args)
        assert torch.equal(got, ops.reference_linear_w8(*args))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per operator
            kernels.run("linear_w8", ops.reference_linear_w8, args)


def test_an_exported_int8_program_loaded_inside_inference_mode_runs_its_kernels() -> None:
    from fxloom.export import export

    mlp, x = _mlp(), torch.randn(4, 256)
    int8 = convert(prepare(mlp, (x,), QuantConfig(scheme="w8")))
    saved = io.BytesIO()
    fxloom.export.save(export(int8, (x,)), saved)
    with torch.inference_mode():
        program = fxloom.export.load(saved.getvalue())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.testing.assert_close(program.module()(x), int8(x))
