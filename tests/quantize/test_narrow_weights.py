"""Narrow weights (``QuantSpec.narrow_weights``): 7-bit int8 weights where the CPU lacks VNNI.

Without VNNI, oneDNN's int8 kernels sum pairs of uint8 x int8 products in int16. Weights
within +-64 keep every pair in range for any uint8 code (255 * 64 * 2 = 32640), so the
layers of int8 activations get 7-bit weights (-64..63) by default there, and oneDNN runs
them on whole 8-bit activation codes, exact:

- ``None`` (the default): 7 bits where this CPU lacks VNNI, with the plain kernels, for layers
  of int8 activations; 8 bits with VNNI, for weight-only schemes and with torch.ao's kernels;
- ``True`` / ``False``: as asked, on every CPU (a file to deploy on both kinds of CPU);
- a converted model holds its weights within +-64, and its convolutions and linears run
  oneDNN whole-code rows where the CPU has no VNNI; a model with 8-bit weights still runs
  exact there (the float32 and split rows);
- QAT rounds weights in training as convert will.
"""

from __future__ import annotations

import pytest
import torch
from quantize_helpers import relative_error
from torch import nn

from fxloom.quantize import (
    QuantConfig,
    QuantSpec,
    calibrate,
    config,
    convert,
    kernels,
    prepare,
    prepare_qat,
    report,
)


def _range(observer) -> tuple[int, int]:
    return observer.quant_min, observer.quant_max


@pytest.mark.parametrize(("has_vnni", "expected"), [(True, (-128, 127)), (False, (-64, 63))])
def test_the_default_narrows_weights_only_where_the_cpu_lacks_vnni(
    monkeypatch, has_vnni, expected
) -> None:
    monkeypatch.setattr(config, "vnni", lambda: has_vnni)
    assert _range(QuantSpec().weight_observer("x86", 0)) == expected
    assert _range(QuantSpec(per_channel=False).weight_observer("x86")) == expected


@pytest.mark.parametrize("has_vnni", [True, False])
def test_an_explicit_setting_holds_on_every_cpu(monkeypatch, has_vnni) -> None:
    monkeypatch.setattr(config, "vnni", lambda: has_vnni)
    assert _range(QuantSpec(narrow_weights=True).weight_observer("x86")) == (-64, 63)
    assert _range(QuantSpec(narrow_weights=False).weight_observer("x86")) == (-128, 127)


def test_weight_only_layers_and_torch_ao_s_kernels_keep_8_bits(monkeypatch) -> None:
    monkeypatch.setattr(config, "vnni", lambda: False)
    spec = QuantSpec()
    assert _range(spec.weight_observer("x86", int8_activations=False)) == (-128, 127)
    assert _range(spec.weight_observer("x86", kernels="torch.ao")) == (-128, 127)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def _images(count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 12, 12, generator=g) for _ in range(count)]


def _converted(model: nn.Module, spec: QuantSpec) -> nn.Module:
    x = _images(1, 0)[0]
    prepared = prepare(model, (x,), QuantConfig(global_spec=spec))
    return convert(calibrate(prepared, _images(4, 1), progress=False))


def _int8_buffers(model: nn.Module) -> list[torch.Tensor]:
    return [b for b in model.buffers() if b.dtype == torch.int8]


def test_a_converted_model_holds_narrow_weights_and_runs_whole_codes_here() -> None:
    model = Block().eval()
    narrow = _converted(model, QuantSpec(narrow_weights=True))
    assert all(kernels.narrow(w) for w in _int8_buffers(narrow))
    reasons = " ".join(row.reason for row in report(narrow).rows)
    assert "kernel: onednn.qconv_pointwise" in reasons  # with VNNI or without
    with torch.no_grad():
        for x in _images(3, 100):
            assert relative_error(narrow(x), model(x)) < 0.05


def test_narrow_and_8_bit_weights_compute_the_same_model_within_rounding() -> None:
    # an 8-bit file runs exact here too (without VNNI: the float32 and split rows)
    model = Block().eval()
    eight = _converted(model, QuantSpec(narrow_weights=False))
    narrow = _converted(model, QuantSpec(narrow_weights=True))
    assert any(not kernels.narrow(w) for w in _int8_buffers(eight))
    with torch.no_grad():
        for x in _images(3, 100):
            ref = model(x)
            assert relative_error(eight(x), ref) < 0.05
            assert relative_error(narrow(x), ref) < 0.05


def test_qat_rounds_narrow_weights_as_convert_does() -> None:
    model = Block()
    x = _images(1, 0)[0]
    config_ = QuantConfig(scheme="qat", global_spec=QuantSpec(narrow_weights=True))
    prepared = prepare_qat(model, (x,), config_)
    with torch.no_grad():
        for batch in _images(4, 1):
            prepared(batch)
    prepared.eval()
    converted = convert(prepared)
    assert all(kernels.narrow(w) for w in _int8_buffers(converted))
    with torch.no_grad():
        for batch in _images(2, 100):
            trained = prepared(batch)
            assert relative_error(converted(batch), trained) < 0.02
