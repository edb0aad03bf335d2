"""convert (static): int8 models against fp32 on held-out data, against torch.ao's FX
quantization on the same model and data, float fallback, pair removal, errors, the report.

Bounds on held-out data (batches never seen in calibration), stated per model:

    model          relative error   cosine similarity
    deeprec_tiny   < 0.08           > 0.997
    cnn_small      < 0.08           > 0.997
    resnet_tiny    < 0.10           > 0.995

torch.ao (``prepare_fx``/``convert_fx`` with its default x86 config) is imported only as the
comparison; fxloom's error must be at most 1.1x torch's.
"""

from __future__ import annotations

import copy
import operator

import pytest
import torch
from quantize_helpers import batches, cosine, relative_error
from torch import nn
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import fxloom
from fxloom import zoo
from fxloom.quantize import (
    QuantConfig,
    QuantizeError,
    QuantSpec,
    calibrate,
    convert,
    prepare,
    report,
)
from fxloom.quantize.convert import quantized_engine
from fxloom.quantize.table import WIDE_INPUT, LinearFloatIO, LinearReLUFloatIO
from fxloom.zoo.deeprec import ratings


def images(seed: int, batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def recommender_batch(seed: int) -> torch.Tensor:
    return ratings(16, 256, seed)


DATA = {"deeprec_tiny": recommender_batch, "cnn_small": images, "resnet_tiny": images}
BOUNDS = {"deeprec_tiny": (0.08, 0.997), "cnn_small": (0.08, 0.997), "resnet_tiny": (0.10, 0.995)}


# torch's quantized modules and kernels (the tests of that path, kept for one release)
AO = QuantConfig(kernels="torch.ao")


def quantized(name: str, config: QuantConfig | None = None):
    model, inputs = zoo.build(name)
    prepared = prepare(model, inputs, config)
    calibrate(prepared, batches(DATA[name], 8), progress=False)
    return model, inputs, prepared, convert(prepared)


def held_out(name: str) -> torch.Tensor:
    return torch.cat(batches(DATA[name], 4, first=100))


@pytest.mark.parametrize("name", sorted(DATA))
def test_int8_output_is_close_to_fp32_on_held_out_data(name: str) -> None:
    model, _, _, int8 = quantized(name)
    x = held_out(name)
    with torch.no_grad():
        ref, out = model(x), int8(x)
    max_error, min_cosine = BOUNDS[name]
    assert relative_error(out, ref) < max_error
    assert cosine(out, ref) > min_cosine


@pytest.mark.parametrize("name", sorted(DATA))
def test_error_is_no_worse_than_torch_ao_fx_quantization(name: str) -> None:
    model, inputs, _, int8 = quantized(name)
    with quantized_engine("x86"):
        theirs = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), inputs)
        with torch.no_grad():
            for batch in batches(DATA[name], 8):
                theirs(batch)
        theirs = convert_fx(theirs)
        x = held_out(name)
        with torch.no_grad():
            ref, ours_out, theirs_out = model(x), int8(x), theirs(x)
    assert relative_error(ours_out, ref) <= 1.1 * relative_error(theirs_out, ref)


def test_weights_become_int8_modules_and_the_kernels_torch_s() -> None:
    _, _, _, int8 = quantized("cnn_small", AO)
    kinds = {type(m).__name__ for m in int8.modules()}
    assert {"ConvReLU2d", "Conv2d", "LinearFloatIO"} <= kinds
    assert not any(type(m) is nn.Conv2d or type(m) is nn.Linear for m in int8.modules())
    targets = {n.target for n in int8.graph.nodes if n.op == "call_function"}
    assert torch.ops.quantized.add_relu in targets
    assert torch.quantize_per_tensor in targets


def test_int8_regions_are_entered_once_and_left_once() -> None:
    _, _, _, int8 = quantized("cnn_small", AO)
    nodes = list(int8.graph.nodes)
    quantizes = [n for n in nodes if n.target is torch.quantize_per_tensor]
    dequantizes = [n for n in nodes if n.target == "dequantize"]
    # int8 from the input to the global average pool (float: KEPT_FLOAT), whose value the
    # classifier's float-in/out kernel quantizes itself
    assert len(quantizes) == 1 and len(dequantizes) == 1


def test_operators_without_an_int8_kernel_run_in_float_between_int8_layers() -> None:
    _, _, _, int8 = quantized("deeprec_tiny", AO)
    selus = [
        n
        for n in int8.graph.nodes
        if n.op == "call_module" and "SELU" in str(type(int8.get_submodule(n.target)))
    ]
    assert len(selus) == 5
    for selu in selus:
        # the int8 Linear before it returns float: from one kernel, or through dequantize
        (producer,) = selu.all_input_nodes
        if producer.target == "dequantize":
            (producer,) = producer.all_input_nodes
            assert type(int8.get_submodule(producer.target)).__name__ == "Linear"
        else:
            assert isinstance(int8.get_submodule(producer.target), LinearFloatIO)
    rows = {row.node: row for row in report(int8).rows}
    assert rows["encoder_1"].kind == "float" and "no int8 kernel" in rows["encoder_1"].reason


def test_a_linear_between_float_neighbours_returns_float_from_one_kernel() -> None:
    _, _, _, int8 = quantized("deeprec_tiny", AO)
    assert isinstance(int8.get_submodule("encoder.2"), LinearFloatIO)  # 32 -> 32
    assert isinstance(int8.get_submodule("decoder.4"), LinearFloatIO)  # 32 -> 256
    assert "float in/out" in {row.node: row for row in report(int8).rows}["encoder_2"].reason


def test_and_from_one_kernel_with_a_fused_relu() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.SELU()).eval()
    rows = batches(
        lambda seed: torch.randn(32, 8, generator=torch.Generator().manual_seed(seed)), 9
    )
    prepared = prepare(model, (rows[0],), AO)
    int8 = convert(calibrate(prepared, rows[:8], progress=False))
    assert isinstance(int8.get_submodule("0"), LinearReLUFloatIO)
    with torch.no_grad():
        assert relative_error(int8(rows[8]), model(rows[8])) < 0.02


def test_but_not_where_its_input_rows_are_very_wide() -> None:
    # quantize_per_tensor + int8 Linear + dequantize is faster there (see table.WIDE_INPUT)
    model = nn.Sequential(nn.Linear(WIDE_INPUT, 16), nn.SELU()).eval()
    prepared = prepare(model, (torch.randn(2, WIDE_INPUT),), AO)
    int8 = convert(calibrate(prepared, [torch.randn(2, WIDE_INPUT)], progress=False))
    assert type(int8.get_submodule("0")).__name__ == "Linear"
    assert [n.target for n in int8.graph.nodes].count("dequantize") == 1


def test_nor_where_it_reads_an_int8_value() -> None:
    # dequantizing its input for the float-in/out kernel is slower at large batches than
    # dequantizing its output (FBGEMM, batch 256: 1.06x to 1.67x)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    prepared = prepare(model, (torch.randn(4, 8),), AO)
    int8 = convert(calibrate(prepared, [torch.randn(4, 8) for _ in range(4)], progress=False))
    assert type(int8.get_submodule("2")).__name__ == "Linear"


def test_qnnpack_keeps_quantize_layer_dequantize() -> None:
    model, inputs, _, int8 = quantized(
        "deeprec_tiny", QuantConfig(engine="qnnpack", kernels="torch.ao")
    )
    assert not any(isinstance(m, LinearFloatIO) for m in int8.modules())
    x = held_out("deeprec_tiny")
    with quantized_engine("qnnpack"), torch.no_grad():
        assert relative_error(int8(x), model(x)) < 0.1


def test_a_module_path_left_in_float_keeps_its_float_layers() -> None:
    config = AO.set_module_path("decoder", None)
    model, _, _, int8 = quantized("deeprec_tiny", config)
    assert type(int8.get_submodule("decoder.0")) is nn.Linear
    assert type(int8.get_submodule("encoder.0")) is not nn.Linear
    x = held_out("deeprec_tiny")
    with torch.no_grad():
        assert relative_error(int8(x), model(x)) < 0.08


def no_dequantize_feeds_a_quantize(gm: fxloom.GraphModule) -> bool:
    quantizes = gm.graph.find_nodes(op="call_function", target=torch.quantize_per_tensor)
    return not any(q.args[0].target == "dequantize" for q in quantizes)


@pytest.mark.parametrize("name", sorted(DATA))
def test_no_dequantize_quantize_pair_is_left(name: str) -> None:
    assert no_dequantize_feeds_a_quantize(quantized(name, AO)[3])


def test_int8_flows_through_dropout_left_in_float_between_int8_layers() -> None:
    # Dropout is nothing in eval mode: convert erases it, and the two int8 layers meet with
    # no dequantize -> quantize between them.
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(), nn.Linear(8, 4)).eval()
    data = [torch.randn(4, 8) for _ in range(4)]

    def int8_model(config: QuantConfig) -> fxloom.GraphModule:
        prepared = prepare(model, (torch.randn(4, 8),), config)
        return convert(calibrate(prepared, data, progress=False))

    int8 = int8_model(AO.set_module_type(nn.Dropout, None))
    assert [n.target for n in int8.graph.nodes].count("dequantize") == 1  # at the output
    assert no_dequantize_feeds_a_quantize(int8)
    x = torch.randn(16, 8)
    with torch.no_grad():
        assert torch.equal(int8(x), int8_model(AO)(x))


def test_an_operator_reading_inf_is_kept_in_float_and_reported() -> None:
    model, inputs = zoo.build("transformer_tiny")
    prepared = prepare(model, inputs)
    calibrate(prepared, [inputs] * 2, progress=False)
    int8 = convert(prepared)
    float_rows = [row for row in report(int8).in_float if "inf or nan" in row.reason]
    assert float_rows  # the attention mask (-inf) is added in float
    with torch.no_grad():
        out, ref = int8(*inputs), model(*inputs)
    assert torch.isfinite(out).all() and cosine(out, ref) > 0.99


class MaskedScores(nn.Module):
    """Attention scores plus a finite mask, as older transformers' T5 adds its causal mask
    (of float32's lowest value; -1e9 here, which does not overflow to -inf as that one can):
    an int8 sum's step would be about 4e6 and lose the scores."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x, mask):
        scores = self.q(x) @ x.transpose(-1, -2)
        return torch.softmax(scores + mask, dim=-1)


def test_a_sum_that_would_lose_an_operand_to_a_mask_is_kept_in_float() -> None:
    torch.manual_seed(0)
    model = MaskedScores().eval()
    mask = torch.triu(torch.full((6, 6), -1e9), diagonal=1)
    data = [(torch.randn(2, 6, 8), mask) for _ in range(3)]
    int8 = convert(calibrate(prepare(model, data[0]), data, progress=False))
    (row,) = [row for row in report(int8).in_float if row.node == "add"]
    assert "less than one int8 step" in row.reason and "%matmul" in row.reason
    x = torch.randn(3, 6, 8)  # another batch size than calibration's
    with torch.no_grad():
        assert relative_error(int8(x, mask), model(x, mask)) < 0.05


def test_adding_a_constant_offset_stays_int8() -> None:
    # Nothing varies in a constant operand, so the sum's range holds it without loss.
    model = nn.Sequential(nn.Linear(8, 8)).eval()
    traced = fxloom.symbolic_trace(model)
    graph = traced.graph
    (output,) = graph.find_nodes(op="output")
    with graph.inserting_before(output):
        offset = graph.call_function(torch.full_like, (output.args[0], 3.0))
        total = graph.call_function(operator.add, (output.args[0], offset))
    output.args = (total,)
    traced.recompile()
    data = [(torch.randn(4, 8),) for _ in range(3)]
    int8 = convert(calibrate(prepare(traced, data[0]), data, progress=False))
    assert "add" in [row.node for row in report(int8).quantized]


def test_convert_before_calibration_is_a_clear_error() -> None:
    model, inputs = zoo.build("deeprec_tiny")
    prepared = prepare(model, inputs)
    with pytest.raises(QuantizeError) as info:
        convert(prepared)
    message = str(info.value)
    assert "have seen no data" in message and "%x" in message and "calibrate" in message


def test_convert_of_a_model_prepare_did_not_make_is_refused() -> None:
    model, _ = zoo.build("mlp_tiny")
    with pytest.raises(QuantizeError, match=r"prepare\(\) returned"):
        convert(fxloom.symbolic_trace(model))


def test_convert_leaves_the_prepared_model_as_it_was() -> None:
    _, inputs, prepared, _ = quantized("cnn_small")
    code = prepared.code
    with torch.no_grad():
        assert prepared(*inputs).dtype == torch.float32
    assert prepared.code == code and "quantize" in prepared.meta
    assert any(type(m) is nn.Conv2d for m in prepared.modules())


def test_the_report_lists_int8_and_float_operators_with_reasons() -> None:
    _, _, _, int8 = quantized("deeprec_tiny")
    text = str(report(int8))
    assert text.startswith("static int8, engine x86: 6 int8, 5 float")
    assert "encoder.1, a SELU" in text and "no int8 kernel" in text
    assert "drop, a Dropout" in text and "removed" in text


def test_the_report_prints_with_rich() -> None:
    from rich.console import Console

    _, _, _, int8 = quantized("cnn_small", AO)
    console = Console(record=True, width=160)
    console.print(report(int8))
    assert "quantized::conv2d" in console.export_text()


def test_converted_models_pickle_and_deepcopy() -> None:
    import io
    import pickle

    model, _, _, int8 = quantized("deeprec_tiny")
    x = held_out("deeprec_tiny")
    with torch.no_grad():
        expected = int8(x)
        assert torch.equal(copy.deepcopy(int8)(x), expected)
        assert torch.equal(pickle.loads(pickle.dumps(int8))(x), expected)
        buffer = io.BytesIO()  # torch.save pickles at protocol 2 (the shape metadata's formats)
        torch.save(int8, buffer)
        buffer.seek(0)
        assert torch.equal(torch.load(buffer, weights_only=False)(x), expected)


def test_an_operator_table_row_added_by_a_user_is_used() -> None:
    from fxloom.quantize.table import SHARES_QPARAMS

    # (torch.ao computes on quantized tensors; the plain kernels: test_plain_flow.py)
    model = nn.Sequential(nn.Linear(8, 8), nn.Hardtanh(), nn.Linear(8, 4)).eval()
    prepared = prepare(model, (torch.randn(4, 8),), AO)
    assert {row.node: row.kind for row in report(prepared).rows}["_1"] == "float"
    SHARES_QPARAMS.add(nn.Hardtanh)
    try:
        prepared = prepare(model, (torch.randn(4, 8),), AO)
    finally:
        SHARES_QPARAMS.discard(nn.Hardtanh)
    assert {row.node: row.kind for row in report(prepared).rows}["_1"] == "shared"
    _ = operator  # (operator is used by the config tests in test_prepare)


@pytest.mark.parametrize(
    "spec",
    [
        QuantSpec(activation="minmax"),
        QuantSpec(activation="moving_average"),
        QuantSpec(activation="histogram_percentile"),
        QuantSpec(symmetric=True),
        QuantSpec(per_channel=False),
    ],
    ids=["minmax", "moving-average", "percentile", "symmetric", "per-tensor"],
)
def test_every_observer_and_scheme_converts_within_the_bounds(spec: QuantSpec) -> None:
    model, _, _, int8 = quantized("deeprec_tiny", QuantConfig(global_spec=spec))
    x = held_out("deeprec_tiny")
    with torch.no_grad():
        ref, out = model(x), int8(x)
    max_error, min_cosine = BOUNDS["deeprec_tiny"]
    assert relative_error(out, ref) < max_error and cosine(out, ref) > min_cosine


@pytest.mark.parametrize("reduce_range, middle", [(False, 128), (True, 64)])
def test_symmetric_activations_are_centred_on_the_middle_of_quint8(
    reduce_range: bool, middle: int
) -> None:
    spec = QuantSpec(symmetric=True, reduce_range=reduce_range)  # 0..255, or 0..127 (7 bits)
    _, _, _, int8 = quantized("deeprec_tiny", QuantConfig(global_spec=spec, kernels="torch.ao"))
    twins = [m for m in int8.modules() if isinstance(m, LinearFloatIO)]
    assert len(twins) == 6 and {twin.input_zero_point for twin in twins} == {middle}
