"""Quantized layers take their inputs as users pass them, as the float layers they replace do.

Callers hand a converted model what they hold: a transposed or sliced tensor, one row
broadcast to a batch, an empty batch, an unbatched image. Each of these raised inside a
kernel before (the weight-only ATen kernels refuse rows that are not contiguous; a dynamic
layer's range of an empty batch; the convolutions wanted a batch dimension):

- every row of the kernel table that runs on this CPU, and those forced as another CPU
  would pick them, computes its operator's reference on such layouts;
- every scheme's converted model gives eager's shape on an empty batch;
- a converted convolutional network takes an unbatched image ``[C, H, W]``, as
  ``nn.Conv2d`` does, and gives the batched call's result for it; the operators themselves
  and their meta kernels (what export runs) take it too;
- the same operators serve ``nn.Conv1d`` and ``nn.Conv3d``, whose batched inputs have the
  rank of an unbatched 2-d or a batched 2-d image: which one an input is follows from the
  weight's rank (a batched ``Conv1d`` input was once taken for an unbatched image and
  crashed in oneDNN).
"""

from __future__ import annotations

import pytest
import torch
from quantize_helpers import ROWS, SPLIT
from torch import nn

import fxloom
from fxloom.quantize import QuantConfig, convert, kernels, ops, prepare
from fxloom.quantize.weights import int4_grouped

K, N = 64, 32

# [rows, K] (or [2, rows, K]) float tensors laid out as callers make them
LAYOUTS = {
    "transposed": lambda rows: torch.randn(K, rows).t(),
    "every other column": lambda rows: torch.randn(rows, 2 * K)[:, ::2],
    "one row broadcast": lambda rows: torch.randn(1, K).expand(rows, K),
    "3-d, sliced": lambda rows: torch.randn(2, rows, K + 3)[..., 3:],
}

NO_VNNI = frozenset({"onednn", "avx2"})
ONEDNN = pytest.mark.skipif("onednn" not in kernels.cpu_features(), reason="torch without oneDNN")
VECTOR = pytest.mark.skipif(
    "avx2" not in kernels.cpu_features(), reason="weight-only kernels run on AVX2/AVX512 CPUs"
)


def _int8_weight(reach: int = 127):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(N, K, generator=g)
    scale = weight.abs().amax(1) / reach
    return torch.round(weight / scale[:, None]).to(torch.int8), scale, torch.randn(N, generator=g)


def _run_on_cpu(monkeypatch, features: frozenset[str] | None, name: str, args: tuple):
    """``name`` on ``args`` as the kernel table picks for a CPU with ``features`` (None: this
    one): the row's name, its result, the reference's."""
    if features is not None:
        monkeypatch.setattr(kernels, "cpu_features", lambda: features)
    monkeypatch.setattr(kernels, "PLANS", {})
    kernel = kernels.kernel_for(name, args)
    assert kernel is not None, f"no row of {name} runs these arguments"
    reference = ops.REFERENCES[name]
    return kernel.name, kernels.run(name, reference, args), reference(*args)


def _within_bf16_rounding(got, expected, x, weight_magnitude) -> None:
    """The weight-only rows' widest documented bound (``BF16_BOUND * sum_k |x_k| |w_k|``)."""
    bound = kernels.BF16_BOUND * (x.float().abs() @ weight_magnitude.t())
    assert ((got.float() - expected.float()).abs() <= bound).all()


# ---------------------------------------------------------------- the kernel table's rows
INT8_CALLS = {
    "static": lambda x, w, s, b: (x, 0.03, 128, w, s, b, 0.0, 0, False, False),
    "dynamic per tensor": lambda x, w, s, b: (x, 0.0, 0, w, s, b, 0.0, 0, False, True, "per_tensor"),
    "dynamic per token": lambda x, w, s, b: (x, 0.0, 0, w, s, b, 0.0, 0, False, True, "per_token"),
}  # fmt: skip

# what the int8 rows are forced to (None: this CPU's own choice)
INT8_CPUS = {
    "this cpu": (None, 127, None),
    "no vnni, 8-bit weights": (NO_VNNI, 127, SPLIT),
    "no vnni, narrow weights": (NO_VNNI, kernels.NARROW_WEIGHT, ROWS),
}


@ONEDNN
@pytest.mark.parametrize("cpu", INT8_CPUS)
@pytest.mark.parametrize("call", INT8_CALLS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_int8_linear_rows_compute_the_reference_on_any_layout(monkeypatch, layout, call, cpu):
    features, reach, row = INT8_CPUS[cpu]
    w, scale, bias = _int8_weight(reach)
    args = INT8_CALLS[call](LAYOUTS[layout](5), w, scale, bias)
    name, got, expected = _run_on_cpu(monkeypatch, features, "linear_int8", args)
    assert row is None or name == row
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


# the weight-only rows: as a VNNI CPU picks them (the bf16 rows), and as one without it (the
# levels row, fp32 and bf16 alike)
WEIGHT_ONLY_CPUS = {
    "vnni": lambda: kernels.cpu_features() | {"vnni"},
    "no vnni": lambda: NO_VNNI,
}


@VECTOR
@pytest.mark.parametrize("cpu", WEIGHT_ONLY_CPUS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_weight_only_int8_rows_compute_the_reference_on_any_layout(monkeypatch, layout, dtype, cpu):
    features = WEIGHT_ONLY_CPUS[cpu]()
    if "onednn" not in kernels.cpu_features() and cpu == "no vnni":
        pytest.skip("the levels row runs on oneDNN")
    w, scale, bias = _int8_weight()
    x = LAYOUTS[layout](4).to(dtype)
    _, got, expected = _run_on_cpu(monkeypatch, features, "linear_w8", (x, w, scale, bias))
    assert got.dtype == dtype and got.shape == expected.shape
    _within_bf16_rounding(got, expected, x, (w.float() * scale[:, None]).abs())


@VECTOR
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_weight_only_int4_rows_compute_the_reference_on_any_layout(monkeypatch, layout, dtype):
    group = 32
    packed, scale, zero_point = int4_grouped(torch.randn(N, K), group)
    x = LAYOUTS[layout](4).to(dtype)
    args = (x, packed, scale, zero_point, group, torch.randn(N))
    name, got, expected = _run_on_cpu(monkeypatch, None, "linear_w4", args)
    assert name.startswith("aten._weight_int4pack_mm_for_cpu")
    q = ops.unpack_int4(packed).float().reshape(N, K // group, group)
    magnitude = ((q - zero_point[..., None]).abs() * scale[..., None]).reshape(N, K)
    _within_bf16_rounding(got, expected, x, magnitude + scale.repeat_interleave(group, 1))


# ---------------------------------------------------------------- whole models
def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(K, 48), nn.ReLU(), nn.Linear(48, N)).eval()


def _converted(model: nn.Module, scheme: str, example: torch.Tensor) -> nn.Module:
    prepared = prepare(fxloom.symbolic_trace(model), (example,), QuantConfig(scheme=scheme))
    if scheme == "static":
        with torch.no_grad():
            for seed in range(3):
                prepared(torch.randn(example.shape, generator=torch.Generator().manual_seed(seed)))
    return convert(prepared)


SCHEMES = ["static", "dynamic", "dynamic_per_token", "w8", "w4_g32"]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("empty", [(0, K), (2, 0, K)], ids=["no rows", "no tokens"])
def test_every_scheme_gives_eager_s_shape_on_an_empty_batch(scheme: str, empty) -> None:
    model = _mlp()
    quantized = _converted(model, scheme, torch.randn(4, K))
    with torch.no_grad():
        got, expected = quantized(torch.randn(empty)), model(torch.randn(empty))
    assert got.shape == expected.shape and got.dtype == expected.dtype


def test_a_dynamic_layer_s_range_of_nothing_is_zero() -> None:
    scale, zero_point = ops.reference_choose_qparams(torch.empty(0, 4), 0, 255, 1e-8, torch.uint8)
    assert scale.item() == pytest.approx(1e-8) and zero_point.item() == 0


class _Block(nn.Module):
    """Convolutions, a residual add (fused into the second convolution), ReLU, max pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.body = nn.Conv2d(16, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Conv2d(16, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.stem(x))
        return self.head(self.pool(torch.relu(self.body(y) + y)))


def test_a_converted_network_takes_an_unbatched_image_as_nn_conv2d_does() -> None:
    torch.manual_seed(0)
    model = _Block().eval()
    quantized = _converted(model, "static", torch.randn(2, 3, 12, 12))
    assert any(node.target is ops.conv2d_add_int8 for node in quantized.graph.nodes)
    image = torch.randn(3, 12, 12)
    with torch.no_grad():
        got, eager = quantized(image), model(image)
        batched = quantized(image[None])
    assert got.shape == eager.shape == (8, 6, 6)
    assert torch.equal(got, batched[0])


def _conv_arguments(x: torch.Tensor) -> tuple:
    w, scale, bias = _int8_weight()
    return (x, 0.02, 3, w.reshape(N, 8, 2, 4), scale, bias, [1, 1], [0, 0], [1, 1], 1, 0.05,
            3, True)  # fmt: skip


def test_the_convolution_operators_take_an_unbatched_image() -> None:
    image = torch.randint(0, 256, (8, 9, 9), dtype=torch.uint8)
    conv = _conv_arguments(image)
    batched = torch.ops.fxloom_q.conv2d_int8(image[None], *conv[1:])
    assert torch.equal(torch.ops.fxloom_q.conv2d_int8(*conv), batched[0])
    assert torch.equal(ops.reference_conv2d_int8(*conv), batched[0])
    residual = torch.randint(0, 256, batched.shape[1:], dtype=torch.uint8)
    add = (*conv[:10], residual, 0.04, 7, 0.05, 3, True)
    with_add = torch.ops.fxloom_q.conv2d_add_int8(*add)
    assert with_add.shape == residual.shape
    assert torch.equal(
        with_add, ops.conv2d_add_int8_into_other(*add[:10], residual.clone(), *add[11:])
    )
    # a residual with a batch keeps it, as the add broadcasts in eager
    assert torch.ops.fxloom_q.conv2d_add_int8(*add[:10], residual[None], *add[11:]).dim() == 4


def test_the_convolutions_meta_kernels_give_the_unbatched_shape() -> None:
    image = torch.empty(8, 9, 9, dtype=torch.uint8, device="meta")
    conv = tuple(
        value.to("meta") if isinstance(value, torch.Tensor) else value
        for value in _conv_arguments(image)
    )
    assert torch.ops.fxloom_q.conv2d_int8(*conv).shape == (N, 8, 6)
    residual = torch.empty(N, 8, 6, dtype=torch.uint8, device="meta")
    add = (*conv[:10], residual, 0.04, 7, 0.05, 3, True)
    assert torch.ops.fxloom_q.conv2d_add_int8(*add).shape == (N, 8, 6)


class _Residual(nn.Module):
    """One convolution of any rank, its output added to itself (``conv2d_add_int8``)."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.relu(y + torch.relu(y))


CONVOLUTIONS = {
    "Conv1d": (lambda: nn.Conv1d(8, 4, 3, padding=1), (8, 16)),
    "Conv2d": (lambda: nn.Conv2d(8, 4, 3), (8, 10, 10)),
    "Conv3d": (lambda: nn.Conv3d(8, 4, 3), (8, 6, 6, 6)),
}


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize("kind", list(CONVOLUTIONS))
def test_every_convolution_rank_runs_batched_and_unbatched_as_eager(
    kind: str, batched: bool
) -> None:
    torch.manual_seed(0)
    make, image = CONVOLUTIONS[kind]
    shape = (2, *image) if batched else image
    for model in (nn.Sequential(make(), nn.ReLU()).eval(), _Residual(make()).eval()):
        quantized = _converted(model, "static", torch.randn(shape))
        x = torch.randn(shape)
        with torch.no_grad():
            got, eager = quantized(x), model(x)
        assert got.shape == eager.shape
        assert (got - eager).norm() / eager.norm() < 0.1, kind
        if batched:  # another batch size and length
            longer = torch.randn(3, *image[:-1], image[-1] + 2)
            with torch.no_grad():
                got, eager = quantized(longer), model(longer)
            assert (got - eager).norm() / eager.norm() < 0.1, kind


@pytest.mark.parametrize("rank", [1, 3])
def test_the_convolution_operators_tell_a_batch_from_an_image_by_the_weight(rank: int) -> None:
    w, scale, bias = _int8_weight()
    weight = w.reshape(N, 8, 8) if rank == 1 else w.reshape(N, 8, 2, 2, 2)
    size = (12,) if rank == 1 else (5, 5, 5)
    batch = torch.randint(0, 256, (2, 8, *size), dtype=torch.uint8)
    conv = (0.02, 3, weight, scale, bias, [1] * rank, [0] * rank, [1] * rank, 1, 0.05, 3, True)
    batched = torch.ops.fxloom_q.conv2d_int8(batch, *conv)
    assert batched.shape[:2] == (2, N)
    assert torch.equal(batched, ops.reference_conv2d_int8(batch, *conv))
    assert torch.equal(torch.ops.fxloom_q.conv2d_int8(batch[1], *conv), batched[1])
    meta = [value.to("meta") if isinstance(value, torch.Tensor) else value for value in conv]
    assert torch.ops.fxloom_q.conv2d_int8(batch.to("meta"), *meta).shape == batched.shape
    assert torch.ops.fxloom_q.conv2d_int8(batch[1].to("meta"), *meta).shape == batched.shape[1:]
