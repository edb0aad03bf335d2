"""Dynamic int8 with per-tensor activations (``linear_int8(dynamic=True, activations="per_tensor")``).

- the reference quantizes the whole input as uint8 with ``choose_qparams`` of its own range
  (affine, the range widened to hold 0), then multiplies integers, as ONNX's
  ``DynamicQuantizeLinear`` + ``MatMulInteger`` do;
- the kernel table runs it on ``onednn.qlinear_pointwise`` (without VNNI: the split row),
  within one quantum of the
  reference (float output: float rounding; uint8 output: one step), at two shapes;
- the meta kernel gives the reference's shape and dtype;
- the default ``dynamic`` scheme writes it, ``dynamic_per_token`` keeps per-token activations,
  and ``report()`` names each layer's kernel;
- the kernel decision and the packed weight are looked up once per layer, and looked up again
  when the weight changes in place;
- both dynamic forms lower to ONNX Runtime (per tensor: ``DynamicQuantizeLinear``) and
  compute what the quantized module does.
"""

from __future__ import annotations

import pytest
import torch
from quantize_helpers import LINEAR_HERE, SPLIT
from torch import nn

from fxloom.quantize import QuantConfig, calibrate, convert, kernels, ops, prepare, report

# what runs each dynamic form of 8-bit weights on this CPU (without VNNI: each code split
# in halves)
PER_TENSOR = "onednn.qlinear_pointwise (dynamic per tensor)" if kernels.vnni() else SPLIT
PER_TOKEN = "aten._int_mm" if kernels.vnni() else SPLIT


def _int8_weight(n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=g) * 0.1
    scale = weight.abs().amax(1) / 127
    return torch.round(weight / scale[:, None]).to(torch.int8), scale, torch.randn(n, generator=g)


def _call(x, n: int, out=(0.0, 0), relu=False, seed: int = 0) -> tuple:
    w, scale, bias = _int8_weight(n, x.shape[-1], seed)
    return (x, 0.0, 0, w, scale, bias, *out, relu, True, "per_tensor")


def test_the_reference_is_the_float_linear_of_the_input_rounded_per_tensor() -> None:
    x = torch.randn(4, 64)
    args = _call(x, 32)
    scale, zero_point = ops.reference_choose_qparams(x, 0, 255, 1e-8, torch.uint8)
    x_rounded = ops.reference_dequantize(
        ops.reference_quantize(x, scale, zero_point, 0, 255, torch.uint8),
        scale, zero_point, 0, 255, torch.uint8,
    )  # fmt: skip
    w, w_scale, bias = args[3:6]
    expected = x_rounded @ (w.float() * w_scale[:, None]).t() + bias
    torch.testing.assert_close(ops.reference_linear_int8(*args), expected, rtol=1e-5, atol=1e-5)


def test_an_unknown_dynamic_activation_form_is_refused_by_name() -> None:
    args = (*_call(torch.randn(2, 16), 8)[:10], "per_channel")
    with pytest.raises(ValueError, match="activations='per_channel'"):
        ops.reference_linear_int8(*args)


SHAPES = {"bert-like rows": (2, 64, 256, 128), "one row, wide": (1, 1, 1024, 48)}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_onednn_kernel_is_within_float_rounding_of_the_reference(shape: str) -> None:
    b, m, k, n = SHAPES[shape]
    args = _call(torch.randn(b, m, k) * 3 + 0.5, n)
    assert kernels.kernel_for("linear_int8", args).name == PER_TENSOR
    got = kernels.run("linear_int8", ops.reference_linear_int8, args)
    expected = ops.reference_linear_int8(*args)
    # one quantum of the input moves the output by about |w| * x_scale; float rounding is far less
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_onednn_kernel_with_uint8_output_and_relu_is_within_one_step(shape: str) -> None:
    b, m, k, n = SHAPES[shape]
    args = _call(torch.randn(b, m, k), n, out=(0.05, 7), relu=True)
    got = kernels.run("linear_int8", ops.reference_linear_int8, args)
    expected = ops.reference_linear_int8(*args)
    assert got.dtype == expected.dtype == torch.uint8
    assert (got.int() - expected.int()).abs().max() <= 1


def test_an_all_positive_input_keeps_zero_in_range() -> None:
    args = _call(torch.rand(3, 64) + 1.0, 16)  # the range widened to hold 0: zero point 0
    got = kernels.run("linear_int8", ops.reference_linear_int8, args)
    torch.testing.assert_close(got, ops.reference_linear_int8(*args), rtol=1e-4, atol=1e-4)


def test_the_meta_kernel_gives_the_reference_shape_and_dtype() -> None:
    args = _call(torch.randn(2, 3, 64), 16)
    meta = ops.linear_int8(*(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args))
    assert meta.device.type == "meta"
    assert (meta.shape, meta.dtype) == ((2, 3, 16), ops.reference_linear_int8(*args).dtype)


def test_the_table_picks_by_the_activation_form() -> None:
    per_tensor = _call(torch.randn(4, 64), 32)
    per_token = (*per_tensor[:10], "per_token")
    assert kernels.kernel_for("linear_int8", per_tensor).name == PER_TENSOR
    assert kernels.kernel_for("linear_int8", per_token).name == PER_TOKEN
    assert kernels.explain("linear_int8", dynamic=True, activations="per_tensor").startswith(
        PER_TENSOR + " ("
    )


def test_a_layer_s_kernel_is_looked_up_once_and_again_after_an_in_place_change() -> None:
    args = _call(torch.randn(4, 64), 32, seed=9)
    w = args[3]
    kernels.run("linear_int8", ops.reference_linear_int8, args)
    planned = [key for key in kernels.PLANS if key[1] == id(w)]
    assert len(planned) == 1 and planned[0][2] == w._version
    kernels.run("linear_int8", ops.reference_linear_int8, (torch.randn(7, 64), *args[1:]))
    assert [key for key in kernels.PLANS if key[1] == id(w)] == planned  # other rows, same plan
    w.neg_()
    got = kernels.run("linear_int8", ops.reference_linear_int8, args)
    assert any(key[1] == id(w) and key[2] == w._version for key in kernels.PLANS)
    torch.testing.assert_close(got, ops.reference_linear_int8(*args), rtol=1e-4, atol=1e-4)


def _converted(scheme: str) -> nn.Module:
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    prepared = prepare(model, (torch.randn(4, 64),), QuantConfig(scheme=scheme))
    return convert(calibrate(prepared, [torch.randn(4, 64)], progress=False))


@pytest.mark.parametrize(
    ("scheme", "kernel"),
    [
        ("dynamic", LINEAR_HERE["per_tensor"] + " ("),
        ("dynamic_per_token", LINEAR_HERE["per_token"] + " ("),
    ],
)
def test_the_report_names_the_kernel_of_each_scheme_s_layers(scheme: str, kernel: str) -> None:
    rows = report(_converted(scheme)).rows
    quantized = [row for row in rows if "kernel:" in row.reason]
    assert len(quantized) == 2
    assert all(f"kernel: {kernel}" in row.reason for row in quantized)


def test_the_dynamic_scheme_writes_per_tensor_activations_into_the_graph() -> None:
    code = _converted("dynamic").code
    assert code.count("'per_tensor'") == 2 and "'per_token'" not in code


@pytest.mark.parametrize("scheme", ["dynamic", "dynamic_per_token"])
def test_both_dynamic_forms_lower_to_onnx_runtime_and_compute_the_same(scheme: str) -> None:
    pytest.importorskip("onnxruntime")
    from fxloom.lower import lower

    quantized = _converted(scheme)
    x = torch.randn(5, 64)
    lowered = lower(quantized, (x,), threads=1)
    assert lowered.lowering_report.nodes_in_pytorch == 0
    expected = quantized(x)
    # exact integer arithmetic on both sides: float rounding only
    assert (lowered(x) - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.parametrize("zero_point", [0, 1, 128, 255])
def test_the_kernel_s_uint8_codes_are_the_reference_s_bit_for_bit(zero_point: int) -> None:
    # ties (values an exact half from an integer after the division), the range's ends and
    # far beyond them, for even and odd zero points (the rounding add keeps ties to even)
    scale = 0.025
    x = torch.cat([torch.randn(4096) * 4, torch.arange(-600, 600) * scale / 2])
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1e30, -1e30, 255 * scale, -255 * scale])])
    expected = ops.reference_quantize(x, scale, zero_point, 0, 255, torch.uint8)
    assert torch.equal(kernels._uint8_codes(x, scale, zero_point), expected)
