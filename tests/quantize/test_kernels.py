"""The kernel table (``fxloom.quantize.kernels``): the fast kernels compute the references.

- each row of ``KERNELS`` that runs on this CPU equals its operator's reference within float
  rounding (integer outputs: exactly, or one step where float rounding ties);
- the table picks by the call: static int8 linear -> oneDNN, per-token dynamic -> ``_int_mm``
  (on VNNI CPUs; without VNNI every int8 linear runs oneDNN's 1x1 convolution with the rows
  as pixels, each code whole against narrow weights (at most 64) or as two halves against
  8-bit ones, exact on the worst-case codes and weights, and convolutions run oneDNN against
  narrow weights, else sum in float32),
  w8 -> ``_weight_int8pack_mm`` and w4 -> the int4 CPU tiles on AVX2/AVX512, fp32 activations cast
  to bf16 around the call (fed fp32 both are 10-30x slower): within the documented bf16
  bound, not float rounding; past the rows where the cast pays, and without AVX2, the
  reference;
- a weight is packed once per version and packed again after an in-place change;
- ``explain`` says which kernel and why (the report's words).
"""

from __future__ import annotations

import pytest
import torch
from quantize_helpers import LINEAR_HERE, ROWS, SPLIT, WHOLE_CODES

from fxloom.quantize import kernels, ops
from fxloom.quantize.weights import int4_grouped

U8 = (0, 255, torch.uint8)


def _int8_weight(n: int = 32, k: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=g) * 0.1
    scale = weight.abs().amax(1) / 127
    return torch.round(weight / scale[:, None]).to(torch.int8), scale, torch.randn(n, generator=g)


def _same(got: torch.Tensor, expected: torch.Tensor) -> None:
    if got.is_floating_point():
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    else:
        assert (got.int() - expected.int()).abs().max() <= 1


LINEAR_CALLS = {
    "static, uint8 out, relu": lambda x, w, s, b: (
        ops.quantize(x, 0.03, 128, *U8),
        0.03,
        128,
        w,
        s,
        b,
        0.05,
        10,
        True,
        False,
    ),
    "static, float in and out": lambda x, w, s, b: (x, 0.03, 128, w, s, b, 0.0, 0, False, False),
    "dynamic per token": lambda x, w, s, b: (x, 0.0, 0, w, s, b, 0.0, 0, False, True),
}


@pytest.mark.parametrize("case", LINEAR_CALLS)
def test_int8_linear_kernels_compute_the_reference(case: str) -> None:
    w, scale, bias = _int8_weight()
    x = torch.randn(2, 5, 64)
    args = LINEAR_CALLS[case](x, w, scale, bias)
    assert kernels.kernel_for("linear_int8", args) is not None
    _same(
        kernels.run("linear_int8", ops.reference_linear_int8, args),
        ops.reference_linear_int8(*args),
    )


@WHOLE_CODES
def test_static_int8_linear_runs_on_onednn_and_dynamic_on_int_mm() -> None:
    w, scale, bias = _int8_weight()
    x = torch.randn(4, 64)
    static = LINEAR_CALLS["static, float in and out"](x, w, scale, bias)
    dynamic = LINEAR_CALLS["dynamic per token"](x, w, scale, bias)
    assert kernels.kernel_for("linear_int8", static).name == "onednn.qlinear_pointwise"
    assert kernels.kernel_for("linear_int8", dynamic).name == "aten._int_mm"


NO_VNNI = frozenset({"onednn", "avx2"})


def _worst_case_linear_calls(reach: int = 127) -> dict[str, tuple]:
    """Codes at 255 (or far beyond every range) against weights at +-127 and -128: the
    products whose pair sums leave int16 (255 * 127 * 2 > 32767); ``reach``: the weights'
    largest magnitude (at +-reach instead)."""
    n, k = 24, 96
    w = torch.full((n, k), reach, dtype=torch.int8)
    w[::2] = -reach - (reach == 127)
    w[1::3, ::5] = -7
    scale, bias = torch.rand(n) * 1e-3 + 1e-4, torch.randn(n)
    x = torch.full((3, k), 50.0)
    x[1] = -50.0
    return {
        "static, uint8 codes at 255": (
            torch.full((3, k), 255, dtype=torch.uint8), 0.03, 0, w, scale, bias, 0.0, 0, False,
            False,
        ),
        "static, float in, uint8 out": (x, 0.03, 3, w, scale, bias, 0.2, 9, True, False),
        "dynamic per tensor": (x, 0.0, 0, w, scale, bias, 0.0, 0, False, True, "per_tensor"),
        # the zero point's share of each output is the kernel's bias: here the only bias
        "dynamic per tensor, no bias": (
            x, 0.0, 0, w, scale, None, 0.0, 0, False, True, "per_tensor",
        ),
        "dynamic per token": (x, 0.0, 0, w, scale, bias, 0.0, 0, False, True, "per_token"),
    }  # fmt: skip


@pytest.mark.skipif("onednn" not in kernels.cpu_features(), reason="torch without oneDNN")
@pytest.mark.parametrize("case", list(_worst_case_linear_calls()))
def test_without_vnni_int8_linears_split_each_code_and_stay_exact(monkeypatch, case) -> None:
    monkeypatch.setattr(kernels, "cpu_features", lambda: NO_VNNI)
    args = _worst_case_linear_calls()[case]
    assert kernels.kernel_for("linear_int8", args).name == SPLIT
    _same(
        kernels.run("linear_int8", ops.reference_linear_int8, args),
        ops.reference_linear_int8(*args),
    )


@pytest.mark.skipif("onednn" not in kernels.cpu_features(), reason="torch without oneDNN")
@pytest.mark.parametrize("case", list(_worst_case_linear_calls()))
def test_without_vnni_narrow_weights_take_whole_codes_and_stay_exact(monkeypatch, case) -> None:
    # 255 * 64 * 2 = 32640: no pair sum leaves int16, so each code goes in whole, once
    monkeypatch.setattr(kernels, "cpu_features", lambda: NO_VNNI)
    args = _worst_case_linear_calls(reach=kernels.NARROW_WEIGHT)[case]
    assert kernels.kernel_for("linear_int8", args).name == ROWS
    _same(
        kernels.run("linear_int8", ops.reference_linear_int8, args),
        ops.reference_linear_int8(*args),
    )


def test_without_vnni_one_code_past_the_narrow_bound_splits_again(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "cpu_features", lambda: NO_VNNI)
    args = _worst_case_linear_calls(reach=kernels.NARROW_WEIGHT)["dynamic per tensor"]
    args[3][5, 7] = kernels.NARROW_WEIGHT + 1
    assert kernels.kernel_for("linear_int8", args).name == SPLIT
    assert kernels.explain("linear_int8", dynamic=True, reach=65).startswith(SPLIT)
    assert kernels.explain("linear_int8", dynamic=True, reach=64).startswith(ROWS)


@pytest.mark.skipif("onednn" not in kernels.cpu_features(), reason="torch without oneDNN")
def test_without_vnni_a_weight_widened_in_place_after_a_call_is_planned_again(monkeypatch):
    # the plan read the weight narrow; a second call after it grows past +-64 must not reuse
    # the whole-code row (it would saturate): the plan keys on the weight's version
    monkeypatch.setattr(kernels, "cpu_features", lambda: NO_VNNI)
    args = _worst_case_linear_calls(reach=kernels.NARROW_WEIGHT)["static, uint8 codes at 255"]
    kernels.run("linear_int8", ops.reference_linear_int8, args)
    args[3][::2] = -128
    args[3][1::2] = 127
    _same(
        kernels.run("linear_int8", ops.reference_linear_int8, args),
        ops.reference_linear_int8(*args),
    )
    assert kernels.kernel_for("linear_int8", args).name == SPLIT


@pytest.mark.parametrize("case", list(_worst_case_linear_calls()))
def test_the_table_s_int8_linear_is_exact_on_the_worst_case_codes_on_this_cpu(case) -> None:
    args = _worst_case_linear_calls()[case]
    _same(
        kernels.run("linear_int8", ops.reference_linear_int8, args),
        ops.reference_linear_int8(*args),
    )


def test_without_vnni_int8_convolutions_of_8_bit_weights_sum_in_float32(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "cpu_features", lambda: NO_VNNI)
    assert kernels.explain("conv2d_int8").startswith(kernels.FLOAT_CONV)
    assert kernels.explain("conv2d_add_int8").startswith(kernels.FLOAT_CONV)
    assert kernels.explain("linear_int8", dynamic=True).startswith(SPLIT)
    narrow = kernels.NARROW_WEIGHT
    assert kernels.explain("conv2d_int8", reach=narrow).startswith("onednn.qconv_pointwise (")
    assert kernels.explain("conv2d_add_int8", reach=narrow).startswith("onednn.qconv2d_pointwise")


VECTOR = pytest.mark.skipif(
    "avx2" not in kernels.cpu_features(), reason="weight-only kernels run on AVX2/AVX512 CPUs"
)


def _within_bf16_rounding(got, expected, x, weight_magnitude) -> None:
    """The cast rows' documented bound: ``BF16_BOUND * sum_k |x_k| |w_k|`` per output."""
    bound = kernels.BF16_BOUND * (x.float().abs() @ weight_magnitude.t())
    assert ((got.float() - expected.float()).abs() <= bound).all()


def _w8_case(rows: int, dtype: torch.dtype):
    w, scale, bias = _int8_weight()
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows)).to(dtype)
    return (x, w, scale, bias), (w.float() * scale[:, None]).abs()


LEVELS = "onednn.qconv_pointwise (activations in two int8 levels)"


def _within_levels_bound(got, expected, x, weight_magnitude) -> None:
    """The levels row's documented bound: ``LEVELS_BOUND * max|x| * sum_k |w_k|`` per
    output, plus float rounding of both sides' sums."""
    row_max = x.float().abs().amax(dim=-1, keepdim=True)
    bound = kernels.LEVELS_BOUND * row_max * weight_magnitude.sum(1)
    bound = bound + 2**-20 * (x.float().abs() @ weight_magnitude.t())
    assert ((got.float() - expected.float()).abs() <= bound).all()


@VECTOR
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_only_int8_runs_int8pack_mm_within_bf16_rounding(monkeypatch, dtype) -> None:
    with_vnni = kernels.cpu_features() | {"vnni"}  # where the cast rows were measured
    monkeypatch.setattr(kernels, "cpu_features", lambda: with_vnni)
    args, magnitude = _w8_case(4, dtype)
    expected_name = {torch.float32: "aten._weight_int8pack_mm (fp32 cast to bf16)"}
    assert kernels.kernel_for("linear_w8", args).name == expected_name.get(
        dtype, "aten._weight_int8pack_mm"
    )
    got = kernels.run("linear_w8", ops.reference_linear_w8, args)
    assert got.dtype == dtype
    _within_bf16_rounding(got, ops.reference_linear_w8(*args), args[0], magnitude)


W8_ACTIVATIONS = {
    "normal": lambda x: x,
    "one outlier feature": lambda x: x.index_fill(1, torch.tensor([3]), 80.0),
    "zeros": torch.zeros_like,
    "tiny": lambda x: x * 1e-30,
    "huge": lambda x: x * 1e30,
}


@pytest.mark.skipif("onednn" not in kernels.cpu_features(), reason="torch without oneDNN")
@pytest.mark.parametrize("case", W8_ACTIVATIONS)
def test_without_vnni_fp32_weight_only_int8_runs_in_two_levels_within_its_bound(
    monkeypatch, case
) -> None:
    monkeypatch.setattr(kernels, "cpu_features", lambda: NO_VNNI)
    (x, w, scale, bias), magnitude = _w8_case(5, torch.float32)
    args = (W8_ACTIVATIONS[case](x), w, scale, bias)
    assert kernels.kernel_for("linear_w8", args).name == LEVELS
    got = kernels.run("linear_w8", ops.reference_linear_w8, args)
    _within_levels_bound(got, ops.reference_linear_w8(*args), args[0], magnitude)


def test_without_vnni_bf16_weight_only_int8_runs_in_two_levels_within_bf16_rounding(
    monkeypatch,
) -> None:
    monkeypatch.setattr(kernels, "cpu_features", lambda: NO_VNNI)
    args, magnitude = _w8_case(4, torch.bfloat16)
    assert kernels.kernel_for("linear_w8", args).name == LEVELS
    got = kernels.run("linear_w8", ops.reference_linear_w8, args)
    assert got.dtype == torch.bfloat16
    _within_bf16_rounding(got, ops.reference_linear_w8(*args), args[0], magnitude)


@pytest.mark.skipif("onednn" not in kernels.cpu_features(), reason="torch without oneDNN")
def test_without_vnni_the_levels_hold_on_their_worst_case_codes(monkeypatch) -> None:
    # rows whose coarse codes sit at 0 and 128 and whose fine codes reach 127, against
    # weights at 127 and -128 over 512 inputs: an int16 pair sum past 32767 would show here
    monkeypatch.setattr(kernels, "cpu_features", lambda: NO_VNNI)
    k, steps = 512, kernels.LEVEL_STEPS
    signs = torch.tensor([1.0, -1.0]).repeat(k // 2)
    fine_top = (128 * 10 + 63) / steps  # n = 128 * 10 + 63: the fine code is 63 + 64 = 127
    x = torch.stack([
        torch.ones(k), -torch.ones(k), signs, -signs,
        torch.full((k,), fine_top).index_fill(0, torch.tensor([0]), 1.0),
    ])  # fmt: skip
    w = torch.where(signs > 0, 127, -128).to(torch.int8).repeat(8, 1)
    w[4:] = torch.where(signs > 0, -128, 127).to(torch.int8)
    scale = torch.full((8,), 0.01)
    args = (x, w, scale, None)
    assert kernels.kernel_for("linear_w8", args).name == LEVELS
    _within_levels_bound(
        kernels.run("linear_w8", ops.reference_linear_w8, args),
        ops.reference_linear_w8(*args), x, (w.float() * scale[:, None]).abs(),
    )  # fmt: skip


def test_without_vnni_a_non_finite_activation_gives_the_reference_s_result(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "cpu_features", lambda: NO_VNNI)
    (x, w, scale, bias), _ = _w8_case(3, torch.float32)
    x[1, 2], x[2, 0] = float("nan"), float("inf")
    got = kernels.run("linear_w8", ops.reference_linear_w8, (x, w, scale, bias))
    torch.testing.assert_close(got, ops.reference_linear_w8(x, w, scale, bias), equal_nan=True)


@VECTOR
def test_fp32_activations_past_the_measured_rows_run_the_reference() -> None:
    probe, _ = _w8_case(1, torch.float32)
    levels = kernels.kernel_for("linear_w8", probe).name == LEVELS
    limit = kernels.ROWS_LEVELS_PAY if levels else kernels._rows_cast_pays("linear_w8")
    args, _ = _w8_case(limit + 1, torch.float32)
    got = kernels.run("linear_w8", ops.reference_linear_w8, args)
    assert torch.equal(got, ops.reference_linear_w8(*args))


def test_weight_only_int8_without_vector_code_runs_the_reference(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "cpu_features", lambda: frozenset({"vnni", "onednn"}))
    args, _ = _w8_case(4, torch.float32)
    assert kernels.kernel_for("linear_w8", args) is None


@pytest.mark.parametrize("k", [5, 8, 24])
def test_weight_only_int8_of_a_k_int8pack_cannot_take_never_reaches_it(k: int) -> None:
    # torch 2.13's _weight_int8pack_mm crashed the process on each of these; the levels row
    # (without VNNI) takes any K
    w, scale, bias = _int8_weight(k=k)
    args = (torch.randn(2, k), w, scale, bias)
    kernel = kernels.kernel_for("linear_w8", args)
    assert kernel is None or kernel.name == LEVELS
    expected = ops.reference_linear_w8(*args)
    if kernel is None:
        assert torch.equal(ops.linear_w8(*args), expected)
    else:
        _within_levels_bound(
            ops.linear_w8(*args), expected, args[0], (w.float() * scale[:, None]).abs()
        )


def _int4_magnitude(packed, scale, zero_point, group) -> torch.Tensor:
    """|w| as the int4 kernel forms it: |q - 8| * scale + |8 - zp| * scale, per weight."""
    q = ops.unpack_int4(packed).float()
    n, k = q.shape
    offset = (8 - zero_point.float()).abs()[..., None]
    grouped = ((q.reshape(n, k // group, group) - 8).abs() + offset) * scale[..., None]
    return grouped.reshape(n, k)


@VECTOR
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_kernel_is_within_bf16_rounding_of_the_reference(
    group: int, dtype: torch.dtype
) -> None:
    weight = torch.randn(48, 256, generator=torch.Generator().manual_seed(3))
    packed, scale, zero_point = int4_grouped(weight, group)
    x = torch.randn(3, 256).to(dtype)
    args = (x, packed, scale, zero_point, group, torch.randn(48))
    assert kernels.kernel_for("linear_w4", args).name.startswith("aten._weight_int4pack_mm_for_cpu")
    got = kernels.run("linear_w4", ops.reference_linear_w4, args)
    assert got.dtype == dtype
    magnitude = _int4_magnitude(packed, scale, zero_point, group)
    _within_bf16_rounding(got, ops.reference_linear_w4(*args), x, magnitude)


# the CPUs (and weights) the convolution rows are tested as: the weights' largest magnitude
CPUS = {"vnni": 127, "no vnni": 127, "no vnni, narrow weights": kernels.NARROW_WEIGHT}


def _as_if(monkeypatch, cpu: str) -> str:
    """Runs the rest of the test with the table's rows for ``cpu`` ("vnni": this CPU's own,
    skipped where it lacks VNNI; "no vnni": as on AVX2 without it); their kernel names."""
    if cpu == "vnni":
        if not kernels.vnni() or "onednn" not in kernels.cpu_features():
            pytest.skip("oneDNN's whole-code int8 rows run on VNNI CPUs only")
        return "onednn."
    if "onednn" not in kernels.cpu_features():
        pytest.skip("torch without oneDNN")
    monkeypatch.setattr(kernels, "cpu_features", lambda: NO_VNNI)
    return "onednn." if CPUS[cpu] <= kernels.NARROW_WEIGHT else kernels.FLOAT_CONV


def _weight(shape: tuple, reach: int, g: torch.Generator) -> torch.Tensor:
    """Random int8 codes within +-``reach``, a quarter of them at the extremes (the pair
    sums that could saturate)."""
    w = torch.randint(-reach, reach + 1, shape, generator=g, dtype=torch.int8)
    extremes = torch.randint(0, 4, shape, generator=g) == 0
    return torch.where(extremes, torch.where(w < 0, -reach, reach).to(torch.int8), w)


# kernel size, stride, padding, bias: the shapes the float32 row computes each its own way
CONV_SHAPES = {
    "3x3 padded": (3, [1, 1], [1, 1], True),
    "1x1 (a matrix product)": (1, [1, 1], [0, 0], True),
    "1x1 stride 2, no bias": (1, [2, 2], [0, 0], False),
}


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("shape", CONV_SHAPES)
@pytest.mark.parametrize("float_out", [False, True])
def test_int8_convolution_kernel_computes_the_reference(monkeypatch, float_out, shape, cpu):
    expected_kernel = _as_if(monkeypatch, cpu)
    k, stride, padding, with_bias = CONV_SHAPES[shape]
    g = torch.Generator().manual_seed(4)
    x = torch.randint(0, 256, (2, 8, 10, 10), generator=g, dtype=torch.uint8)
    x[0] = 255  # a whole image of the largest code
    w = _weight((16, 8, k, k), CPUS[cpu], g)
    scale, bias = torch.rand(16, generator=g) * 1e-3, torch.randn(16, generator=g)
    out = (0.0, 0) if float_out else (0.05, 3)
    bias = bias if with_bias else None
    args = (x, 0.02, 5, w, scale, bias, stride, padding, [1, 1], 1, *out, True)
    assert kernels.kernel_for("conv2d_int8", args).name.startswith(expected_kernel)
    _same(
        kernels.run("conv2d_int8", ops.reference_conv2d_int8, args),
        ops.reference_conv2d_int8(*args),
    )


CONV_ADD_CASES = {
    "3x3, relu": (1, 16, 3, [1, 1], [1, 1], 1, (0.03, 120, 0.05, 100), True),
    "1x1 stride 2, output zero point": (2, 16, 1, [2, 2], [0, 0], 1, (0.01, 128, 0.02, 130), False),
    "grouped": (1, 16, 3, [1, 1], [1, 1], 4, (0.02, 0, 0.03, 0), True),
}  # fmt: skip


def _conv_add_args(case: str, reach: int = 127) -> tuple:
    batch, channels, k, stride, padding, groups, params, relu = CONV_ADD_CASES[case]
    g = torch.Generator().manual_seed(6)
    x = torch.randint(0, 256, (batch, 8, 10, 10), generator=g, dtype=torch.uint8)
    x[:, :, :4] = 255
    w = _weight((channels, 8 // groups, k, k), reach, g)
    scale, bias = torch.rand(channels, generator=g) * 1e-3, torch.randn(channels, generator=g)
    head = (x, 0.02, 5, w, scale, bias, stride, padding, [1, 1], groups)
    size = ops.reference_conv2d_int8(*head, 0.0, 0, False).shape
    other = torch.randint(0, 256, size, generator=g, dtype=torch.uint8)
    other_scale, other_zp, out_scale, out_zp = params
    return (*head, other, other_scale, other_zp, out_scale, out_zp, relu)


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("case", CONV_ADD_CASES)
def test_int8_convolution_and_add_kernel_computes_the_reference(monkeypatch, case, cpu) -> None:
    expected_kernel = _as_if(monkeypatch, cpu)
    args = _conv_add_args(case, CPUS[cpu])
    other = args[10].clone()
    assert kernels.kernel_for("conv2d_add_int8", args).name.startswith(expected_kernel)
    got = kernels.run("conv2d_add_int8", ops.reference_conv2d_add_int8, args)
    _same(got, ops.reference_conv2d_add_int8(*args))
    assert torch.equal(args[10], other)  # the post-op's accumulator is a copy


def test_int8_convolution_and_add_runs_the_reference_where_other_broadcasts() -> None:
    args = _conv_add_args("3x3, relu")
    broadcast = args[10][:, :, :1]
    call = (*args[:10], broadcast, *args[11:])
    kernel = kernels.kernel_for("conv2d_add_int8", call)
    assert kernel is None or kernel.name == kernels.FLOAT_CONV  # not oneDNN's sum post-op
    got = kernels.run("conv2d_add_int8", ops.reference_conv2d_add_int8, call)
    _same(got, ops.reference_conv2d_add_int8(*call))


def test_a_weight_is_packed_once_per_version() -> None:
    w, scale, bias = _int8_weight(seed=5)
    args = (torch.randn(4, 64), 0.03, 128, w, scale, bias, 0.0, 0, False, False)
    kernels.run("linear_int8", ops.reference_linear_int8, args)
    kernel = kernels.kernel_for("linear_int8", args)
    key = (kernel.name, id(w), w._version)
    first = kernels.PACKED[key][1]
    kernels.run("linear_int8", ops.reference_linear_int8, args)
    assert kernels.PACKED[key][1] is first
    w.neg_()  # changed in place: a new version, packed again, and the result follows it
    got = kernels.run("linear_int8", ops.reference_linear_int8, args)
    assert (kernel.name, id(w), w._version) in kernels.PACKED
    _same(got, ops.reference_linear_int8(*args))


def test_explain_names_the_kernel_and_why() -> None:
    static = "onednn.qlinear_pointwise (" if kernels.vnni() else SPLIT + " ("
    assert kernels.explain("linear_int8", dynamic=False).startswith(static)
    assert kernels.explain("linear_w8", dtype=torch.int32).startswith(
        f"reference ({LEVELS}: torch.int32 activations; aten._weight_int8pack_mm: torch.int32"
    )
    assert kernels.explain("add_int8").startswith(
        "onednn.qconv2d_pointwise.binary (identity, sum) ("
    )
    conv_add = "onednn.qconv2d_pointwise.binary (sum) (" if kernels.vnni() else kernels.FLOAT_CONV
    assert kernels.explain("conv2d_add_int8").startswith(conv_add)


def test_the_report_names_each_layer_s_kernel_and_why() -> None:
    from fxloom.quantize import QuantConfig, calibrate, convert, prepare, report

    model = torch.nn.Sequential(torch.nn.Linear(64, 32)).eval()
    prepared = prepare(model, (torch.randn(4, 64),), QuantConfig(scheme="dynamic_per_token"))
    (row,) = report(convert(calibrate(prepared, [torch.randn(4, 64)], progress=False))).rows
    assert f"kernel: {LINEAR_HERE['per_token']} (" in row.reason


def test_the_rows_where_the_cast_pays_follow_aten_s_vector_level(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "cpu_features", lambda: frozenset({"avx2"}))
    assert kernels._rows_cast_pays("linear_w8") == 64  # measured: 22 against 62 ms at 32 rows
    monkeypatch.setattr(kernels, "cpu_features", lambda: frozenset({"avx2", "avx512"}))
    assert kernels._rows_cast_pays("linear_w8") == 128


def test_one_weight_called_two_ways_gets_two_plans() -> None:
    # the linear operators' own plan keys keep what the rows' conditions read: the input's
    # dtype, the dynamic activations' form
    w, scale, bias = _int8_weight(seed=7)
    x = torch.randn(3, 64)
    calls = {
        "per_tensor": (x, 0.0, 0, w, scale, bias, 0.0, 0, False, True, "per_tensor"),
        "per_token": (x, 0.0, 0, w, scale, bias, 0.0, 0, False, True, "per_token"),
    }
    for args in calls.values():
        kernels.run("linear_int8", ops.reference_linear_int8, args)
    keys = [kernels._plan_key("linear_int8", a) for a in calls.values()]
    assert keys[0] != keys[1]
    planned = {kernels.PLANS[key][1].name for key in keys}
    both = {"onednn.qlinear_pointwise (dynamic per tensor)", "aten._int_mm"}
    assert planned == (both if kernels.vnni() else {SPLIT})
    for dtype in (torch.float32, torch.bfloat16):
        args = (x.to(dtype), w, scale, bias)
        kernels.run("linear_w8", ops.reference_linear_w8, args)
        plan = kernels.PLANS[kernels._plan_key("linear_w8", args)]
        assert plan[1] is kernels.kernel_for("linear_w8", args)


QUANTIZE_CASES = {
    "even zero point": (0.03, 128, 0, 255),
    "odd zero point": (0.03, 7, 0, 255),
    "negative zero point": (0.03, -3, 0, 255),
    "narrowed range": (0.05, 130, 3, 200),
}  # fmt: skip


@pytest.mark.parametrize("case", QUANTIZE_CASES)
def test_the_uint8_quantize_kernel_is_the_reference_bit_for_bit(case: str) -> None:
    scale, zero_point, low, high = QUANTIZE_CASES[case]
    ties = torch.arange(-600, 600) * (scale / 2)  # every half step: where rounding decides
    x = torch.cat([torch.randn(5000) * 4, ties, torch.tensor([float("inf"), -float("inf")])])
    args = (x, scale, zero_point, low, high, torch.uint8)
    assert kernels.kernel_for("quantize", args).name == "uint8 codes in four passes"
    assert torch.equal(ops.quantize(*args), ops.reference_quantize(*args))


POOL_CASES = {
    "resnet's stem: 3x3, stride 2, padding 1": ((1, 8, 15, 16), [3, 3], [2, 2], [1, 1], [1, 1]),
    "2x2, stride 2": ((2, 4, 7, 7), [2, 2], [2, 2], [0, 0], [1, 1]),
    "3x2, stride (2, 1), padding (1, 0)": ((2, 5, 9, 11), [3, 2], [2, 1], [1, 0], [1, 1]),
    "dilated": ((1, 3, 10, 10), [3, 3], [1, 1], [1, 1], [2, 2]),
    "1x1": ((1, 4, 5, 5), [1, 1], [1, 1], [0, 0], [1, 1]),
}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", POOL_CASES)
def test_int8_max_pooling_kernel_is_the_reference(
    case: str, channels_last: bool, dtype: torch.dtype
) -> None:
    shape, *geometry = POOL_CASES[case]
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max + 1, shape, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    args = (x, *geometry, False)
    assert kernels.kernel_for("max_pool2d_int8", args).name == "window maximum, rows then columns"
    got = ops.max_pool2d_int8(*args)
    assert torch.equal(got, ops.reference_max_pool2d_int8(*args))
    assert got.data_ptr() != x.data_ptr()  # a new tensor, even for a 1x1 window
    if channels_last:  # the layout passes through, as layouts.PASSES_LAYOUT says
        assert got.is_contiguous(memory_format=torch.channels_last)


def test_int8_max_pooling_of_a_window_larger_than_its_input_raises_as_torch_does() -> None:
    x = torch.randint(0, 256, (1, 4, 2, 2), dtype=torch.uint8)
    args = (x, [3, 3], [1, 1], [0, 0], [1, 1], False)
    assert kernels.kernel_for("max_pool2d_int8", args) is None
    with pytest.raises(RuntimeError, match="too small"):
        ops.max_pool2d_int8(*args)


def test_int8_max_pooling_with_ceil_mode_runs_the_reference() -> None:
    x = torch.randint(0, 256, (1, 4, 7, 7), dtype=torch.uint8)
    args = (x, [2, 2], [2, 2], [0, 0], [1, 1], True)
    assert kernels.kernel_for("max_pool2d_int8", args) is None
    assert ops.max_pool2d_int8(*args).shape == (1, 4, 4, 4)


def test_an_empty_input_runs_the_reference_whatever_the_layer_s_plan() -> None:
    w, scale, bias = _int8_weight(seed=8)
    full = (torch.randn(3, 64), 0.03, 3, w, scale, bias, 0.0, 0, False, False)
    kernels.run("linear_int8", ops.reference_linear_int8, full)  # the layer's plan is made
    empty = (torch.randn(0, 64), *full[1:])
    got = kernels.run("linear_int8", ops.reference_linear_int8, empty)
    assert got.shape == (0, 32)
    images = torch.randint(0, 256, (0, 8, 5, 5), dtype=torch.uint8)
    conv = (images, 0.02, 5, w.reshape(32, 8, 2, 4)[:, :, :1, :1].contiguous(), scale, None,
            [1, 1], [0, 0], [1, 1], 1, 0.05, 3, True)  # fmt: skip
    assert kernels.run("conv2d_int8", ops.reference_conv2d_int8, conv).shape == (0, 32, 5, 5)
