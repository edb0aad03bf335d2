"""fxloom's quantized operators (``fxloom.quantize.ops``, ``torch.ops.fxloom_q``).

- each reference computes what the float computation on the dequantized values computes,
  within one output step (the result rounded once);
- each has a meta kernel: on meta tensors the shapes and dtypes come out without data;
- each is one row of ``fxloom.ops.runtime_functions``: a file calling it loads;
- int4 packing is two codes a byte, low nibble first, and unpacks to what it packed.
"""

from __future__ import annotations

import pytest
import torch
from quantize_helpers import SeenOperators

from fxloom.ops.runtime_functions import RUNTIME_FUNCTIONS, runtime_function
from fxloom.quantize import kernels, ops
from fxloom.quantize.weights import int4_grouped

U8 = (0, 255, torch.uint8)


def _linear_case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 32, generator=g)
    weight = torch.randn(16, 32, generator=g) * 0.2
    scale = weight.abs().amax(1) / 127
    w = torch.round(weight / scale[:, None]).to(torch.int8)
    return x, w, scale, torch.randn(16, generator=g)


def test_quantize_then_dequantize_is_within_half_a_step() -> None:
    x = torch.randn(100)
    q = ops.quantize(x, 0.05, 128, *U8)
    assert q.dtype == torch.uint8
    assert (ops.dequantize(q, 0.05, 128, *U8) - x).abs().max() <= 0.025 + 1e-6


def test_choose_qparams_maps_the_range_onto_the_integers() -> None:
    scale, zero_point = ops.choose_qparams(torch.tensor([-1.0, 3.0]), 0, 255, 1e-6, torch.uint8)
    assert torch.allclose(scale, torch.tensor([4.0 / 255])) and zero_point.item() == 64


def test_static_int8_linear_equals_the_float_linear_of_the_dequantized_values() -> None:
    x, w, scale, bias = _linear_case()
    q = ops.quantize(x, 0.03, 128, *U8)
    expected = ops.dequantize(q, 0.03, 128, *U8) @ (w.float() * scale[:, None]).t() + bias
    got = ops.linear_int8(q, 0.03, 128, w, scale, bias)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_float_input_is_quantized_inside_with_the_calibrated_parameters() -> None:
    x, w, scale, bias = _linear_case()
    quantized_first = ops.linear_int8(ops.quantize(x, 0.03, 128, *U8), 0.03, 128, w, scale, bias)
    assert torch.equal(ops.linear_int8(x, 0.03, 128, w, scale, bias), quantized_first)


def test_an_int8_output_is_the_float_output_rounded_once() -> None:
    x, w, scale, bias = _linear_case()
    as_float = ops.linear_int8(x, 0.03, 128, w, scale, bias, relu=True)
    as_int8 = ops.linear_int8(x, 0.03, 128, w, scale, bias, 0.02, 10, True)
    assert as_int8.dtype == torch.uint8
    assert torch.equal(as_int8, ops.quantize(as_float, 0.02, 10, *U8))


def test_dynamic_int8_linear_is_within_a_percent_of_the_float_linear() -> None:
    x, w, scale, bias = _linear_case()
    reference = x @ (w.float() * scale[:, None]).t() + bias
    got = ops.linear_int8(x, 0.0, 0, w, scale, bias, dynamic=True)
    assert (got - reference).norm() / reference.norm() < 0.01


def test_weight_only_int8_is_the_float_linear_of_the_dequantized_weight() -> None:
    x, w, scale, bias = _linear_case()
    weight = w.float() * scale[:, None]
    expected = x @ weight.t() + bias
    # within bf16 rounding: on AVX2/AVX512 the kernel rounds fp32 activations to bf16
    bound = kernels.BF16_BOUND * (x.abs() @ weight.abs().t())
    assert ((ops.linear_w8(x, w, scale, bias) - expected).abs() <= bound + 1e-6).all()


@pytest.mark.parametrize("group", [32, 64, 128])
def test_weight_only_int4_is_within_int4_rounding_of_the_float_linear(group: int) -> None:
    g = torch.Generator().manual_seed(1)
    x, weight = torch.randn(3, 256, generator=g), torch.randn(24, 256, generator=g)
    packed, scale, zero_point = int4_grouped(weight, group)
    assert packed.shape == (24, 128) and scale.shape == (24, 256 // group)
    got = ops.linear_w4(x, packed, scale, zero_point, group)
    reference = x @ weight.t()
    assert (got - reference).norm() / reference.norm() < 0.12


def test_int4_codes_pack_two_a_byte_low_nibble_first() -> None:
    codes = torch.tensor([[1, 2, 15, 0]])
    assert ops.pack_int4(codes).tolist() == [[0x21, 0x0F]]
    assert torch.equal(ops.unpack_int4(ops.pack_int4(codes)), codes.to(torch.uint8))


def test_int8_convolution_equals_the_float_convolution_of_the_dequantized_values() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 256, (1, 3, 9, 9), generator=g, dtype=torch.uint8)
    w = torch.randint(-127, 128, (4, 3, 3, 3), generator=g, dtype=torch.int8)
    scale = torch.rand(4, generator=g) * 0.01
    expected = torch.nn.functional.conv2d(
        ops.dequantize(x, 0.1, 7, *U8), w.float() * scale[:, None, None, None], stride=2, padding=1
    )
    got = ops.conv2d_int8(x, 0.1, 7, w, scale, None, [2, 2], [1, 1], [1, 1], 1)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_int8_add_is_the_float_add_rounded_once() -> None:
    a = torch.randint(0, 256, (8,), dtype=torch.uint8)
    b = torch.randint(0, 256, (8,), dtype=torch.uint8)
    total = ops.dequantize(a, 0.1, 3, *U8) + ops.dequantize(b, 0.2, 9, *U8)
    got = ops.add_int8(a, 0.1, 3, b, 0.2, 9, 0.25, 0)
    assert torch.equal(got, ops.quantize(total, 0.25, 0, *U8))


def test_int8_convolution_and_add_is_their_float_sum_rounded_once() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 256, (1, 3, 9, 9), generator=g, dtype=torch.uint8)
    w = torch.randint(-127, 128, (4, 3, 3, 3), generator=g, dtype=torch.int8)
    scale = torch.rand(4, generator=g) * 0.01
    other = torch.randint(0, 256, (1, 4, 5, 5), generator=g, dtype=torch.uint8)
    geometry = ([2, 2], [1, 1], [1, 1], 1)
    convolution = ops.conv2d_int8(x, 0.1, 7, w, scale, None, *geometry)  # float out
    total = torch.relu(convolution + ops.dequantize(other, 0.05, 100, *U8))
    got = ops.conv2d_add_int8(x, 0.1, 7, w, scale, None, *geometry, other, 0.05, 100, 0.04, 0, True)
    # oneDNN or the reference, the float sum is rounded once: one code at most apart
    assert (got.int() - ops.quantize(total, 0.04, 0, *U8).int()).abs().max() <= 1


def conv_arguments(m):
    """A uint8 input, its scale and zero point, int8 weights, their scales, no bias, and the
    geometry (stride 2, padding 1, dilation 1, one group): conv2d_int8's first ten."""
    x, w = m(1, 3, 8, 8, dtype=torch.uint8), m(4, 3, 3, 3, dtype=torch.int8)
    return (x, 0.1, 0, w, m(4), None, [2, 2], [1, 1], [1, 1], 1)


META_CALLS = {
    "quantize": lambda m: ops.quantize(m(2, 5), 0.1, 0, *U8),
    "dequantize": lambda m: ops.dequantize(m(2, 5, dtype=torch.uint8), 0.1, 0, *U8),
    "choose_qparams": lambda m: ops.choose_qparams(m(2, 5), 0, 255, 1e-6, torch.uint8)[0],
    "linear_int8": lambda m: ops.linear_int8(
        m(2, 7, 5), 0.1, 0, m(3, 5, dtype=torch.int8), m(3), None, 0.1, 0
    ),
    "linear_w8": lambda m: ops.linear_w8(m(2, 5), m(3, 5, dtype=torch.int8), m(3)),
    "linear_w4": lambda m: ops.linear_w4(
        m(2, 64), m(3, 32, dtype=torch.uint8), m(3, 2), m(3, 2, dtype=torch.uint8), 32
    ),
    "conv2d_int8": lambda m: ops.conv2d_int8(*conv_arguments(m)),
    "conv2d_add_int8": lambda m: ops.conv2d_add_int8(
        *conv_arguments(m), m(1, 4, 4, 4, dtype=torch.uint8), 0.1, 0, 0.2, 0
    ),
    "add_int8": lambda m: ops.add_int8(
        m(2, 5, dtype=torch.uint8), 0.1, 0, m(1, 5, dtype=torch.uint8), 0.1, 0, 0.2, 0
    ),
    "mul_int8": lambda m: ops.mul_int8(
        m(2, 5, dtype=torch.uint8), 0.1, 0, m(2, 5, dtype=torch.uint8), 0.1, 0, 0.2, 0
    ),
    "max_pool2d_int8": lambda m: ops.max_pool2d_int8(
        m(1, 4, 9, 9, dtype=torch.uint8), [3, 3], [2, 2], [1, 1], [1, 1]
    ),
}
META_SHAPES = {
    "quantize": (2, 5), "dequantize": (2, 5), "choose_qparams": (1,), "linear_int8": (2, 7, 3),
    "linear_w8": (2, 3), "linear_w4": (2, 3), "conv2d_int8": (1, 4, 4, 4), "add_int8": (2, 5),
    "conv2d_add_int8": (1, 4, 4, 4),
    "mul_int8": (2, 5), "max_pool2d_int8": (1, 4, 5, 5),
}  # fmt: skip


@pytest.mark.parametrize("name", ops.OPERATORS)
def test_every_operator_has_a_meta_kernel(name: str) -> None:
    def meta(*shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device="meta")

    out = META_CALLS[name](meta)
    assert out.device.type == "meta" and tuple(out.shape) == META_SHAPES[name]


@pytest.mark.parametrize("name", ops.OPERATORS)
def test_every_operator_returns_new_storage_and_leaves_its_arguments_as_they_were(
    name: str,
) -> None:
    # what runtime_functions claims of them (``fresh``), on which generated code hands a dead
    # shortcut to the fused add: checked on what the CPU kernels return
    make, made = _cpu_values(), []

    def recorded(*shape, dtype=torch.float32):
        tensor = make(*shape, dtype=dtype)
        made.append((tensor, tensor.clone()))
        return tensor

    out = META_CALLS[name](recorded)
    storage = out.untyped_storage().data_ptr()
    for tensor, copy in made:
        assert tensor.untyped_storage().data_ptr() != storage
        assert torch.equal(tensor, copy)
    assert RUNTIME_FUNCTIONS[f"fxloom.quantize.ops.{name}"].fresh


@pytest.mark.parametrize("name", ops.OPERATORS)
def test_every_operator_is_a_runtime_function_files_may_call(name: str) -> None:
    row = RUNTIME_FUNCTIONS[f"fxloom.quantize.ops.{name}"]
    assert runtime_function(getattr(ops, name)) is row and row.effect == "pure"


def _cpu_values(seed: int = 0):
    """META_CALLS's maker on the CPU: random codes for integer dtypes, normal floats else."""
    g = torch.Generator().manual_seed(seed)

    def make(*shape, dtype=torch.float32):
        if dtype.is_floating_point:
            return torch.randn(shape, generator=g, dtype=dtype)
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max + 1, shape, generator=g, dtype=dtype)

    return make


@pytest.mark.parametrize("name", ops.OPERATORS)
def test_an_eager_call_skips_the_dispatcher_computing_what_the_operator_does(name: str) -> None:
    with SeenOperators() as mode:  # under a mode the call goes through the operator
        through = META_CALLS[name](_cpu_values())
    assert getattr(torch.ops.fxloom_q, name).default in mode.seen
    direct = META_CALLS[name](_cpu_values())  # plain CPU tensors: the CPU kernel itself
    assert torch.equal(direct, through)
