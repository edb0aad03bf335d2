"""Bad input, end to end: each is a clear error or a reported float fallback, never a silently
wrong model.

- an operator with no int8 kernel (a function, a module, an int8 operator given a scalar)
  between int8 layers: run in float, with ``dequantize`` before it and
  ``quantize_per_tensor`` after it, the report giving the reason; the converted model stays
  within relative error 0.05 and cosine 0.999 of fp32 (a quantized tensor reaching a float
  kernel would raise, so running it is part of the check);
- a model that does not trace and convert before calibration: ``QuantizeError`` saying what to
  do (see also test_prepare.py and test_convert.py), also through ``fxloom quantize``.
"""

from __future__ import annotations

import pytest
import torch
from quantize_helpers import cosine, relative_error
from torch import nn

from fxloom import cli
from fxloom.quantize import QuantizeError, calibrate, convert, prepare, report
from fxloom.quantize.ops import dequantize, linear_int8
from fxloom.quantize.plan import NO_KERNEL


class NoKernelBetweenLayers(nn.Module):
    """Linear -> sin (a function) -> Linear -> GELU (a module) -> Linear -> + 1.0 (a scalar)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.third = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)
        self.gelu = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.sin(self.first(x))
        x = self.gelu(self.second(x))
        return self.third(x) + 1.0


def data(seed: int) -> torch.Tensor:
    return torch.randn(16, 16, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def converted():
    model = NoKernelBetweenLayers().eval()
    prepared = prepare(model, (data(0),))
    calibrate(prepared, [data(seed) for seed in range(1, 9)], progress=False)
    return model, convert(prepared)


def test_operators_with_no_int8_kernel_are_reported_in_float_with_the_reason(converted) -> None:
    _, int8 = converted
    rows = {row.node: row for row in report(int8).rows}
    assert rows["sin"].kind == "float" and rows["sin"].reason == NO_KERNEL
    assert rows["gelu"].kind == "float" and rows["gelu"].reason == NO_KERNEL
    assert [row.calls for row in report(int8).quantized] == [
        "first, a Linear",
        "second, a Linear",
        "third, a Linear",
    ]


def test_an_int8_operator_given_a_scalar_falls_back_to_float_and_says_why(converted) -> None:
    _, int8 = converted
    (add,) = [row for row in report(int8).rows if row.calls == "operator.add"]
    assert add.kind == "float" and "takes two tensors, no scalar" in add.reason


def test_each_float_operator_reads_float_values(converted) -> None:
    _, int8 = converted
    for node in int8.graph.nodes:
        if node.name in ("sin", "gelu", "add"):
            (value,) = node.all_input_nodes
            # a dequantize, or a layer returning float: a torch.ao module, or (plain kernels)
            # linear_int8 with no output scale
            float_layer = value.target is linear_int8 and value.args[6] == 0.0
            float_source = value.target in ("dequantize", dequantize) or value.op == "call_module"
            assert float_source or float_layer, f"%{node.name} reads %{value.name}"


def test_the_converted_model_with_float_fallbacks_stays_close_to_fp32(converted) -> None:
    model, int8 = converted
    x = torch.cat([data(seed) for seed in range(100, 104)])
    with torch.no_grad():
        out, ref = int8(x), model(x)
    assert relative_error(out, ref) < 0.05 and cosine(out, ref) > 0.999


class GoesThroughNumpy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.from_numpy(x.numpy() * 2))  # no trace sees through numpy


def untraceable() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """A MODEL factory for ``fxloom quantize test_bad_input:untraceable``."""
    return GoesThroughNumpy().eval(), (torch.randn(2, 4),)


def test_fxloom_quantize_names_a_model_that_does_not_trace(capsys) -> None:
    assert cli.main(["quantize", "test_bad_input:untraceable"]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert "QuantizeError: prepare() could not trace GoesThroughNumpy" in err
    assert err.count("\n") == 1


def test_convert_before_calibration_names_the_values_never_observed() -> None:
    model = NoKernelBetweenLayers().eval()
    with pytest.raises(QuantizeError, match=r"observers of %x, .* have seen no data"):
        convert(prepare(model, (data(0),)))
