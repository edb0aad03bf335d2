"""Quantized models (``fxloom.quantize``, plain kernels) lowered to ONNX Runtime as QDQ.

Each scheme's model is lowered whole (``fxloom.lower.onnx_ops_quant``): its results equal
the quantized module's within the scheme's tolerance, no quantized operator stays in
PyTorch, and the graph ONNX Runtime optimizes holds its integer kernels (read back through
``optimized_model_filepath``), not float ``MatMul``/``Gemm``/``Conv``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import onnx  # noqa: E402

from fxloom.lower import LoweringError, lower, translate  # noqa: E402
from fxloom.lower.onnx_ops_quant import QUANTIZED_OPERATORS, _unclipped_sum_operand  # noqa: E402
from fxloom.lower.runtime import OrtModule  # noqa: E402
from fxloom.quantize import QuantConfig, QuantSpec, convert, kernels, ops, prepare  # noqa: E402

# onnxruntime 1.23 (the matrix's Python 3.10 cell) fuses a 3-D MatMul and its bias Add into
# Reshape + Gemm before its DequantizeLinear + MatMul -> MatMulNBits fusion can see the MatMul,
# so weight-only layers run as float Gemm there (same results, fp32 speed). 1.30 and 1.32 fuse.
ORT_VERSION = tuple(int(part) for part in ort.__version__.split(".")[:2])
FUSES_WEIGHT_ONLY = ORT_VERSION >= (1, 30)
NEEDS_WEIGHT_ONLY_FUSION = pytest.mark.skipif(
    not FUSES_WEIGHT_ONLY,
    reason=f"onnxruntime {ort.__version__} runs DequantizeLinear + MatMul + Add as Gemm, not "
    "MatMulNBits (1.30+ fuses it)",
)
WEIGHT_ONLY = {"w8", "w4_g32"}

QUANTIZED_TARGETS = {
    spelling for spellings in QUANTIZED_OPERATORS.values() for spelling in spellings
}


class Residual(nn.Module):
    """A ResNet's stem and skip connection: conv2d_int8, a max pool of its codes
    (max_pool2d_int8), and a convolution fused with the add and its ReLU (conv2d_add_int8)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.pool(torch.relu(self.conv1(x)))
        return torch.relu(self.conv2(y) + y)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).eval()


def tokens() -> torch.Tensor:
    """A batch of token rows of very different magnitudes, as transformer activations are:
    per-token scales differ from row to row."""
    x = torch.randn(2, 5, 64)
    return x * torch.logspace(-1, 2, 5).reshape(1, 5, 1)


def quantized(model: nn.Module, example: torch.Tensor, scheme: str, calibration=()) -> nn.Module:
    prepared = prepare(model, (example,), QuantConfig(scheme=scheme))
    for batch in calibration:
        prepared(batch)
    return convert(prepared)


def case(name: str):
    """(quantized model, input, largest error allowed relative to the output's largest value)."""
    torch.manual_seed(0)
    if name == "residual":
        images = [torch.randn(1, 3, 12, 12) for _ in range(4)]
        return quantized(Residual().eval(), images[0], "static", images), images[0], 0.02
    if name == "static":
        batches = [torch.randn(4, 64) for _ in range(4)]
        return quantized(mlp(), batches[0], "static", batches), batches[0], 0.02
    x = tokens()
    # dynamic: exact integer arithmetic, float rounding only; weight-only: ONNX Runtime's
    # MatMulNBits at accuracy level 4 computes on int8 activations (about 0.5%)
    tolerance = 1e-5 if name == "dynamic" else 0.02
    return quantized(mlp(), x, name, ()), x, tolerance


SCHEMES = ["dynamic", "w8", "w4_g32", "static", "residual"]

# scheme -> the kernels ONNX Runtime's optimized graph must hold (one of each set)
FUSED_KERNELS = {
    "dynamic": [{"MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}],
    "w8": [{"MatMulNBits"}],
    "w4_g32": [{"MatMulNBits"}],
    "static": [{"MatMulInteger", "MatMulIntegerToFloat", "QLinearMatMul"}],
    "residual": [{"QLinearConv"}, {"QLinearAdd"}, {"MaxPool", "NhwcMaxPool"}],
}
FLOAT_PRODUCTS = {"MatMul", "Gemm", "FusedGemm", "Conv", "FusedConv"}


def optimized_ops(proto: onnx.ModelProto, tmp_path) -> list[onnx.NodeProto]:
    """The nodes of the graph ONNX Runtime optimizes, with the session options OrtModule uses."""
    options = OrtModule(proto.SerializeToString()).session_options()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3  # (its warning that an optimized graph is CPU-specific)
    ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return list(onnx.load(options.optimized_model_filepath).graph.node)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_lowered_quantized_model_computes_what_the_quantized_module_does(scheme):
    model, x, tolerance = case(scheme)
    lowered = lower(model, (x,))
    expected = model(x)
    error = (lowered(x) - expected).abs().max() / expected.abs().max()
    assert error <= tolerance, f"{scheme}: relative error {error:.3g}"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_quantized_operator_is_lowered(scheme):
    model, x, _ = case(scheme)
    report = lower(model, (x,)).lowering_report
    quantized_nodes = {n.name for n in model.graph.nodes if n.target in QUANTIZED_TARGETS}
    lowered_nodes = {name for region in report.lowered for name in region.nodes}
    assert quantized_nodes and quantized_nodes <= lowered_nodes, str(report)
    assert report.nodes_in_pytorch == 0, str(report)


@pytest.mark.parametrize(
    "scheme",
    [pytest.param(s, marks=NEEDS_WEIGHT_ONLY_FUSION) if s in WEIGHT_ONLY else s for s in SCHEMES],
)
def test_onnx_runtime_runs_the_quantized_layers_on_its_integer_kernels(scheme, tmp_path):
    model, x, _ = case(scheme)
    ops = {node.op_type for node in optimized_ops(translate(model, (x,)), tmp_path)}
    for fused in FUSED_KERNELS[scheme]:
        assert ops & fused, f"{scheme}: none of {sorted(fused)} in {sorted(ops)}"
    assert not ops & FLOAT_PRODUCTS, f"{scheme}: float products left: {sorted(ops)}"


@NEEDS_WEIGHT_ONLY_FUSION
@pytest.mark.parametrize("scheme", sorted(WEIGHT_ONLY))
def test_weight_only_layers_run_matmulnbits_at_accuracy_level_4(scheme, tmp_path):
    model, x, _ = case(scheme)
    nodes = optimized_ops(translate(model, (x,)), tmp_path)
    levels = [
        onnx.helper.get_attribute_value(attribute)
        for node in nodes
        if node.op_type == "MatMulNBits"
        for attribute in node.attribute
        if attribute.name == "accuracy_level"
    ]
    assert levels == [4, 4]


@NEEDS_WEIGHT_ONLY_FUSION
@pytest.mark.parametrize("scheme", sorted(WEIGHT_ONLY))
def test_lower_s_check_names_the_weight_only_approximation_and_the_tolerance_to_pass(scheme):
    model, x, _ = case(scheme)
    with pytest.raises(LoweringError, match=r"on purpose:\n  linear_w.*accuracy_level=4") as caught:
        lower(model, (x,), check=True)  # the default tolerance is float rounding's
    assert "atol of about 1% of it" in str(caught.value)
    assert "report the operator at fault" not in str(caught.value)
    report = lower(model, (x,), check=True, atol=0.01 * model(x).abs().max().item()).lowering_report
    assert report.check.passed
    operator = "linear_w8" if scheme == "w8" else "linear_w4"
    assert [d.split(":")[0] for r in report.lowered for d in r.differences] == [operator]


@pytest.mark.parametrize("scheme", ["dynamic", "static"])
def test_regions_onnx_runtime_computes_exactly_report_no_differences(scheme):
    model, x, _ = case(scheme)
    report = lower(model, (x,), check=True, atol=1e-4).lowering_report
    assert report.lowered and all(region.differences == () for region in report.lowered)


def test_a_fused_residual_add_s_extra_rounding_is_named_when_the_check_fails():
    model, x, _ = case("residual")
    with pytest.raises(LoweringError, match=r"on purpose:\n(  .*\n)*  conv2d_add_int8: .* rounded"):
        lower(model, (x,), check=True)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_a_static_convolution_s_int32_bias_is_named_and_its_codes_stay_within_one(rank):
    torch.manual_seed(0)
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[rank](8, 4, 3)
    images = [torch.randn(2, 8, *(6,) * rank) for _ in range(4)]
    model = quantized(nn.Sequential(conv, nn.ReLU()).eval(), images[0], "static", images)
    lowered = lower(model, (images[0],))
    differences = [d for r in lowered.lowering_report.lowered for d in r.differences]
    assert [d.split(":")[0] for d in differences] == ["conv2d_int8"]
    assert "int32" in differences[0]
    step = next(n.args[1] for n in model.graph.nodes if n.target is ops.dequantize)  # the output's
    for seed in range(8):
        x = torch.randn(images[0].shape, generator=torch.Generator().manual_seed(seed))
        assert (lowered(x) - model(x)).abs().max() <= step * 1.001


def test_int4_weights_are_uint4_blocks_of_the_group_size_in_opset_21():
    model, x, _ = case("w4_g32")
    proto = translate(model, (x,))
    assert [opset.version for opset in proto.opset_import if opset.domain == ""] == [21]
    uint4 = [t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.UINT4]
    assert [list(t.dims) for t in uint4] == [[64, 128], [2, 128], [128, 32], [4, 32]]
    blocks = [
        onnx.helper.get_attribute_value(a)
        for node in proto.graph.node
        if node.op_type == "DequantizeLinear"
        for a in node.attribute
        if a.name == "block_size"
    ]
    assert blocks == [32, 32]


def test_graphs_without_quantized_operators_keep_opset_18():
    proto = translate(mlp(), (torch.randn(4, 64),))
    assert [opset.version for opset in proto.opset_import if opset.domain == ""] == [18]


def test_quantize_to_a_narrowed_range_is_clipped_to_it():
    from fxloom import symbolic_trace
    from fxloom.quantize import ops

    def narrowed(x):
        return ops.dequantize(
            ops.quantize(x, 0.01, 64, 0, 127, torch.uint8), 0.01, 64, 0, 127, torch.uint8
        )

    x = torch.linspace(-2, 2, 50).reshape(5, 10)
    traced = symbolic_trace(narrowed, example_inputs=(x,))
    lowered = lower(traced, (x,))
    assert torch.equal(lowered(x), narrowed(x))
    assert lowered.lowering_report.nodes_in_pytorch == 0


@pytest.mark.parametrize("scheme", ["w4_g32", "residual"])
def test_a_lowered_quantized_model_saves_and_loads(scheme, tmp_path):
    """Its regions use standard ONNX operators only, which the safe loader admits."""
    import fxloom

    model, x, _ = case(scheme)
    lowered = lower(model, (x,))
    fxloom.save(lowered, tmp_path / "model.fxl")
    assert torch.equal(fxloom.load(tmp_path / "model.fxl")(x), lowered(x))


@pytest.mark.parametrize("relu, out_zero_point", [(True, 0), (False, 120)])
def test_the_fused_sum_s_extra_onnx_step_only_rounds(relu: bool, out_zero_point: int) -> None:
    """conv2d_add_int8's lowering quantizes the convolution's result in between (ONNX Runtime
    has no integer kernel otherwise): at parameters that clip nothing the sum keeps, so even
    far outside any calibrated range the result is the reference's within one code."""
    u8 = (0, 255, torch.uint8)
    g = torch.Generator().manual_seed(0)
    convolution = torch.randn(10_000, generator=g) * 20  # well beyond the output's range
    other = torch.randint(0, 256, (10_000,), generator=g, dtype=torch.uint8)
    args = {"out_scale": 0.04, "out_zero_point": out_zero_point, "other_scale": 0.03,
            "other_zero_point": 100}  # fmt: skip
    scale, zero_point = _unclipped_sum_operand(args)
    in_between = ops.dequantize(
        ops.quantize(convolution, scale, zero_point, *u8), scale, zero_point, *u8
    )

    def finished(value):
        value = value + ops.dequantize(other, 0.03, 100, *u8)
        return ops.quantize(torch.relu(value) if relu else value, 0.04, out_zero_point, *u8)

    assert (finished(in_between).int() - finished(convolution).int()).abs().max() <= 1


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("name", ["residual", "dynamic"])
def test_lowered_weights_take_the_form_onnx_runtime_computes_exactly_here(name, narrow):
    """ONNX Runtime's uint8 x int8 kernels sum pairs of products in int16 without VNNI and
    saturate on 8-bit weights: those go in as uint8 (the codes plus 128) there; narrow
    weights (``QuantSpec.narrow_weights``, at most 64) and any weight on a VNNI CPU go in as
    int8. Either way the lowered model computes the quantized module's numbers."""
    torch.manual_seed(0)
    spec = QuantSpec(narrow_weights=narrow)
    if name == "residual":
        images = [torch.randn(1, 3, 12, 12) * 3 for _ in range(4)]
        model, x = Residual().eval(), images[0]
        prepared = prepare(model, (x,), QuantConfig(global_spec=spec))
        for batch in images:
            prepared(batch)
        tolerance = 0.02
    else:
        model, x = mlp(), tokens()
        prepared = prepare(model, (x,), QuantConfig(scheme="dynamic", global_spec=spec))
        tolerance = 1e-5
    quantized_model = convert(prepared)
    proto = translate(quantized_model, (x,))
    weight_types = {
        init.data_type for init in proto.graph.initializer if len(init.dims) in (2, 4)
    } & {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}
    int8_exact = kernels.vnni() or narrow
    assert weight_types == {onnx.TensorProto.INT8 if int8_exact else onnx.TensorProto.UINT8}
    expected = quantized_model(x)
    error = (lower(quantized_model, (x,))(x) - expected).abs().max() / expected.abs().max()
    assert error <= tolerance, f"{name}: relative error {error:.3g}"
