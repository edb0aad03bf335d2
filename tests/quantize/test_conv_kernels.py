"""The int8 convolution and residual add on oneDNN, and the channels-last activations between them.

- conv2d_int8's weight is packed for each input shape it meets (at most ``SHAPES_PER_LAYER``
  kept per layer), and every shape computes the reference;
- its output stays channels-last (the same values); ``layouts.keep_channels_last`` gives the
  users that read the layout (``view``, the graph's output) a contiguous copy, and max pooling
  becomes ``max_pool2d_int8`` of the codes (its node's name and report line kept), so a
  converted model computes what it did;
- add_int8 runs on oneDNN (a depthwise identity convolution with the "sum" post-op) where its
  operands are 4-d uint8 of one shape, equal to the reference within one step, and leaves its
  operands as they were.
"""

from __future__ import annotations

import pytest
import torch
from quantize_helpers import WHOLE_CODES
from torch import nn

from fxloom.quantize import calibrate, convert, kernels, layouts, ops, prepare, report

pytestmark = pytest.mark.skipif(
    "onednn" not in kernels.cpu_features(), reason="torch is built without oneDNN"
)


def _within_one_step(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype
    assert (got.int() - expected.int()).abs().max() <= 1


def _conv_args(x: torch.Tensor, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (16, x.shape[1], 1, 1), generator=g, dtype=torch.int8)
    scale, bias = torch.rand(16, generator=g) * 1e-3, torch.randn(16, generator=g)
    return (x, 0.02, 5, w, scale, bias, [1, 1], [0, 0], [1, 1], 1, 0.05, 3, True)


def _images(*shape: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)


def _packs_of(w: torch.Tensor) -> list:
    return [key for key in kernels.PACKED if key[1] == id(w) and len(key) == 4]


@WHOLE_CODES
def test_a_convolution_is_packed_for_each_input_shape_and_computes_the_reference() -> None:
    args = _conv_args(_images(1, 8, 6, 6))
    w = args[3]
    for shape in [(1, 8, 6, 6), (2, 8, 6, 6), (1, 8, 9, 7)]:
        call = (_images(*shape), *args[1:])
        got = kernels.run("conv2d_int8", ops.reference_conv2d_int8, call)
        _within_one_step(got, ops.reference_conv2d_int8(*call))
    assert sorted(key[3] for key in _packs_of(w)) == [(1, 8, 6, 6), (1, 8, 9, 7), (2, 8, 6, 6)]


@WHOLE_CODES
def test_a_layer_keeps_at_most_shapes_per_layer_packs() -> None:
    args = _conv_args(_images(1, 8, 4, 4), seed=2)
    w = args[3]
    for size in range(4, 4 + kernels.SHAPES_PER_LAYER + 3):
        call = (_images(1, 8, size, size), *args[1:])
        got = kernels.run("conv2d_int8", ops.reference_conv2d_int8, call)
        _within_one_step(got, ops.reference_conv2d_int8(*call))
    assert len(_packs_of(w)) == kernels.SHAPES_PER_LAYER
    plans = [key for key in kernels.PLANS if key[1] == id(w)]
    assert len(plans) == kernels.SHAPES_PER_LAYER


@WHOLE_CODES
def test_the_convolution_s_output_stays_channels_last_with_the_reference_s_values() -> None:
    args = _conv_args(_images(1, 8, 6, 6), seed=3)
    got = kernels.run("conv2d_int8", ops.reference_conv2d_int8, args)
    assert got.is_contiguous(memory_format=torch.channels_last)
    _within_one_step(got, ops.reference_conv2d_int8(*args))


ADD_CASES = {
    "relu": (0.006, 156, 0.021, 139, 0.0105, 0, True),
    "no relu, output zero point": (0.004, 120, 0.01, 128, 0.012, 130, False),
}


@pytest.mark.parametrize("case", ADD_CASES)
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels-last", "contiguous"])
def test_int8_add_runs_on_onednn_and_computes_the_reference(case: str, channels_last) -> None:
    a, b = _images(1, 32, 9, 9, seed=4), _images(1, 32, 9, 9, seed=5)
    if channels_last:
        a, b = (t.contiguous(memory_format=torch.channels_last) for t in (a, b))
    sa, za, sb, zb, so, zo, relu = ADD_CASES[case]
    args = (a, sa, za, b, sb, zb, so, zo, relu)
    before = (a.clone(), b.clone())
    assert kernels.kernel_for("add_int8", args).name.startswith("onednn.qconv2d_pointwise")
    _within_one_step(
        kernels.run("add_int8", ops.reference_add_int8, args), ops.reference_add_int8(*args)
    )
    assert torch.equal(a, before[0]) and torch.equal(b, before[1])  # operands untouched


def test_a_broadcasting_int8_add_runs_the_reference() -> None:
    a, b = _images(1, 8, 4, 4), _images(1, 8, 1, 1)
    args = (a, 0.01, 3, b, 0.02, 4, 0.02, 0, False)
    assert kernels.kernel_for("add_int8", args) is None
    assert torch.equal(
        kernels.run("add_int8", ops.reference_add_int8, args), ops.reference_add_int8(*args)
    )


# ------------------------------------------------------------------ converted models
class Bottleneck(nn.Module):
    """A ResNet's shapes: convolution, max pooling, a residual add, average pool, flatten."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.conv = nn.Conv2d(16, 16, 1)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        y = self.pool(torch.relu(self.stem(x)))
        y = torch.relu(self.conv(y) + y)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class ViewAfterConv(nn.Module):
    """A ``view`` of an int8 convolution's output: it needs a contiguous tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 * 6 * 6, 4)

    def forward(self, x):
        return self.head(self.conv(x).view(x.shape[0], -1))


def _converted(model: nn.Module, shape: tuple) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    data = [torch.randn(*shape) for _ in range(4)]
    prepared = prepare(model.eval(), (data[0],))
    return convert(calibrate(prepared, data, progress=False)), data[0]


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).abs().max() / expected.abs().max())


def test_a_resnet_s_graph_keeps_int8_channels_last_without_copies() -> None:
    model = Bottleneck().eval()
    int8, x = _converted(model, (1, 3, 16, 16))
    assert "contiguous" not in int8.code
    assert "pool = max_pool2d_int8(" in int8.code  # the codes as they are; the node's name kept
    assert "kernel: window maximum" in str(report(int8))  # the report names its kernel
    with torch.no_grad():
        assert _relative_error(int8(x), model(x)) < 0.1


class FunctionalPool(nn.Module):
    """Max pooling called as a function, its arguments spelled as users spell them."""

    def __init__(self, pool) -> None:
        super().__init__()
        self.conv, self.pool = nn.Conv2d(3, 8, 3, padding=1), pool

    def forward(self, x):
        return self.pool(torch.relu(self.conv(x)))


FUNCTIONAL_POOLS = {
    "F.max_pool2d, keywords": lambda y: nn.functional.max_pool2d(y, 3, stride=2, padding=1),
    "torch.max_pool2d, ceil_mode by position": lambda y: torch.max_pool2d(y, 2, 2, 0, 1, True),
    "F.max_pool2d, no stride": lambda y: nn.functional.max_pool2d(y, kernel_size=2),
}


@pytest.mark.parametrize("case", FUNCTIONAL_POOLS)
def test_a_functional_max_pool_of_int8_activations_pools_the_codes(case: str) -> None:
    model = FunctionalPool(FUNCTIONAL_POOLS[case]).eval()
    int8, x = _converted(model, (1, 3, 9, 9))
    assert "max_pool2d_int8(" in int8.code
    with torch.no_grad():
        assert int8(x).shape == model(x).shape
        assert _relative_error(int8(x), model(x)) < 0.1


def test_a_view_of_an_int8_convolution_reads_a_contiguous_copy() -> None:
    model = ViewAfterConv().eval()
    int8, x = _converted(model, (2, 3, 6, 6))
    assert "contiguous()" in int8.code
    with torch.no_grad():
        assert _relative_error(int8(x), model(x)) < 0.1


def test_the_graph_s_output_is_contiguous() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval()
    int8, x = _converted(model, (1, 3, 8, 8))
    with torch.no_grad():
        out = int8(x)
    assert out.is_contiguous()
    assert layouts.keep_channels_last(int8) == 0  # run again: nothing left to add


def test_a_converted_model_with_layout_copies_saves_and_loads(tmp_path) -> None:
    import fxloom

    model = nn.Sequential(ViewAfterConv(), nn.ReLU()).eval()
    int8, x = _converted(Bottleneck(), (1, 3, 16, 16))
    viewed, y = _converted(model, (2, 3, 6, 6))
    for name, converted, data in [("bottleneck", int8, x), ("view", viewed, y)]:
        fxloom.save(converted, tmp_path / f"{name}.fxl")
        with torch.no_grad():
            assert torch.equal(fxloom.load(tmp_path / f"{name}.fxl")(data), converted(data))


def test_a_converted_model_with_layout_copies_lowers_to_onnx_runtime() -> None:
    pytest.importorskip("onnxruntime")
    from fxloom.lower import lower

    model = Bottleneck().eval()
    int8, x = _converted(model, (1, 3, 16, 16))
    lowered = lower(int8, (x,))
    assert lowered.lowering_report.nodes_in_pytorch == 0, str(lowered.lowering_report)
    with torch.no_grad():
        assert _relative_error(lowered(x), int8(x)) < 0.02
