"""prepare and calibrate: tracing, fusion, the plan, observers; the observed model is exact."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import fxloom
from fxloom import zoo
from fxloom.quantize import (
    HistogramObserver,
    MinMaxObserver,
    QuantConfig,
    QuantizeError,
    QuantSpec,
    SaturationWarning,
    calibrate,
    prepare,
    report,
)
from fxloom.quantize.config import saturates_8_bit_activations
from fxloom.zoo.deeprec import ratings


def observers(prepared: fxloom.GraphModule) -> dict[str, nn.Module]:
    return {
        node.args[0].name: prepared.get_submodule(node.target)
        for node in prepared.graph.find_nodes(op="call_module")
        if node.target.endswith("_observer")
    }


def kinds(prepared: fxloom.GraphModule) -> dict[str, str]:
    return {row.node: row.kind for row in report(prepared).rows}


def test_the_prepared_model_computes_exactly_what_the_model_does() -> None:
    for name in ("deeprec_tiny", "mlp_tiny", "transformer_tiny"):
        model, inputs = zoo.build(name)
        prepared = prepare(model, inputs)
        with torch.no_grad():
            assert torch.equal(prepared(*inputs), model(*inputs)), name


def test_with_batch_norms_folded_it_differs_only_by_float_rounding() -> None:
    for name in ("cnn_small", "resnet_tiny"):
        model, inputs = zoo.build(name)
        with torch.no_grad():
            torch.testing.assert_close(prepare(model, inputs)(*inputs), model(*inputs))


def test_observers_watch_the_input_and_every_int8_output() -> None:
    model, inputs = zoo.build("deeprec_tiny")
    prepared = prepare(model, inputs)
    watched = set(observers(prepared))
    # The float values a Linear reads: the input, the SELU outputs, and the dropout's output
    # (dropout is planned as the identity it is in eval mode). No Linear output: each Linear
    # is read by a SELU or is the output, so it returns float from one kernel (FLOAT_IO).
    selus = {"encoder_1", "encoder_3", "decoder_1", "decoder_3"}
    assert watched == {"x", "drop"} | selus


def test_an_int8_output_read_by_an_int8_layer_is_watched() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    prepared = prepare(model, (torch.randn(4, 8),))
    assert set(observers(prepared)) == {"input_1", "_1", "_2"}  # _1: LinearReLU's output
    assert not prepared.meta["quantize"].float_io  # _2 reads int8


def test_8_bit_activations_where_the_engine_sums_in_32_bits(monkeypatch) -> None:
    monkeypatch.delenv("FBGEMM_ENABLE_INSTRUCTIONS", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: True)
    assert not saturates_8_bit_activations("x86") and not saturates_8_bit_activations("qnnpack")
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: False)
    assert saturates_8_bit_activations("x86") and saturates_8_bit_activations("fbgemm")
    assert not saturates_8_bit_activations("qnnpack")


def test_fbgemm_s_own_instruction_setting_wins_over_the_cpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: True)
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "avx2")
    assert saturates_8_bit_activations("x86")
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX512_E1")
    assert not saturates_8_bit_activations("x86")


def test_plain_kernels_keep_8_bit_activations_where_fbgemm_would_saturate(monkeypatch) -> None:
    # the kernel table splits codes where oneDNN would saturate: the numbers are the
    # reference's on every CPU, so the scales need not change with the CPU
    model, inputs = zoo.build("mlp_tiny")
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")  # sums pairs in 16 bits
    with warnings.catch_warnings():
        warnings.simplefilter("error", SaturationWarning)
        prepared = prepare(model, inputs)
    assert not any(obs.reduce_range for obs in observers(prepared).values())
    seven = prepare(model, inputs, QuantConfig(kernels="torch.ao"))
    assert all(obs.reduce_range for obs in observers(seven).values())


def test_8_bit_activations_asked_for_where_they_saturate_are_kept_with_a_warning(
    monkeypatch,
) -> None:
    model, inputs = zoo.build("mlp_tiny")
    eight_bits = QuantConfig(kernels="torch.ao", global_spec=QuantSpec(reduce_range=False))
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")  # sums pairs in 16 bits
    with pytest.warns(SaturationWarning, match="reduce_range=None"):
        prepared = prepare(model, inputs, eight_bits)
    assert not any(obs.reduce_range for obs in observers(prepared).values())
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX512_E1")  # VNNI: 32-bit sums
    with warnings.catch_warnings():
        warnings.simplefilter("error", SaturationWarning)
        prepare(model, inputs, eight_bits)


def test_conv_batch_norm_is_folded_and_relu_fused_into_its_conv() -> None:
    model, inputs = zoo.build("cnn_small")
    prepared = prepare(model, inputs)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in prepared.modules())
    plan = kinds(prepared)
    assert plan["stem_0"] == "int8" and plan["stem_2"] == "fused"
    assert plan["add"] == "int8" and plan["relu"] == "fused"  # add + relu: one kernel
    assert "stem_0" not in observers(prepared)  # observed after its ReLU, not between


def test_linear_relu_is_fused() -> None:
    model, inputs = zoo.build("mlp_tiny")
    plan = kinds(prepare(model, inputs))
    assert plan["layers_0"] == "int8" and plan["layers_1"] == "fused"


def test_operators_without_an_int8_kernel_are_planned_in_float_with_the_reason() -> None:
    model, inputs = zoo.build("deeprec_tiny")
    rows = {row.node: row for row in report(prepare(model, inputs)).rows}
    assert rows["encoder_1"].kind == "float"
    assert "no int8 kernel" in rows["encoder_1"].reason and "SELU" in rows["encoder_1"].calls
    assert rows["drop"].kind == "identity"


def test_calibrate_runs_every_batch_through_the_observers() -> None:
    model, inputs = zoo.build("deeprec_tiny")
    prepared = prepare(model, inputs)
    calibrate(prepared, [ratings(4, 256, seed) for seed in range(5)], progress=False)
    assert {int(obs.seen) for obs in observers(prepared).values()} == {5}


def test_calibrate_shows_a_progress_bar_and_takes_any_iterable() -> None:
    model, inputs = zoo.build("deeprec_tiny")
    prepared = prepare(model, inputs)
    calibrate(prepared, (ratings(4, 256, seed) for seed in range(3)), progress=True)
    assert int(observers(prepared)["x"].seen) == 3


def test_the_config_chooses_the_activation_observer() -> None:
    model, inputs = zoo.build("deeprec_tiny")
    default = observers(prepare(model, inputs))
    assert isinstance(default["x"], HistogramObserver)
    assert not default["x"].reduce_range  # the plain kernels: 8 bits on every CPU
    ao = observers(prepare(model, inputs, QuantConfig(kernels="torch.ao")))
    assert ao["x"].reduce_range == saturates_8_bit_activations("x86")  # FBGEMM: 7 without VNNI
    minmax = QuantConfig(global_spec=QuantSpec(activation="minmax"))
    assert isinstance(observers(prepare(model, inputs, minmax))["x"], MinMaxObserver)
    qnnpack = observers(prepare(model, inputs, QuantConfig(engine="qnnpack")))
    assert not qnnpack["x"].reduce_range  # QNNPACK uses all 8 bits


def test_a_module_path_left_in_float_covers_everything_inside_it() -> None:
    model, inputs = zoo.build("deeprec_tiny")
    config = QuantConfig().set_module_path("decoder", None)
    rows = {row.node: row for row in report(prepare(model, inputs, config)).rows}
    assert rows["decoder_0"].kind == "float" and "module path 'decoder'" in rows["decoder_0"].reason
    assert rows["encoder_0"].kind == "int8"


def test_a_module_type_left_in_float() -> None:
    model, inputs = zoo.build("cnn_small")
    config = QuantConfig().set_module_type(nn.Linear, None)
    plan = kinds(prepare(model, inputs, config))
    assert plan["fc"] == "float" and plan["stem_0"] == "int8"


def test_an_operator_left_in_float() -> None:
    model, inputs = zoo.build("cnn_small")
    import operator

    plan = kinds(prepare(model, inputs, QuantConfig().set_operator(operator.add, None)))
    assert plan["add"] == "float" and plan["relu"] == "float"  # a float input: float ReLU


def test_the_most_specific_setting_wins() -> None:
    model, inputs = zoo.build("deeprec_tiny")
    config = QuantConfig(global_spec=None).set_module_path("encoder.0", QuantSpec())
    plan = kinds(prepare(model, inputs, config))
    assert plan["encoder_0"] == "int8" and plan["encoder_2"] == "float"


def test_the_model_is_left_unchanged() -> None:
    model, inputs = zoo.build("cnn_small")
    before = copy.deepcopy(model.state_dict())
    modules = [type(m) for m in model.modules()]
    prepare(model, inputs)
    assert [type(m) for m in model.modules()] == modules
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_graph_module_is_prepared_as_given_and_left_unchanged() -> None:
    model, inputs = zoo.build("mlp_tiny")
    traced = fxloom.symbolic_trace(model)
    code = traced.code
    prepared = prepare(traced, inputs)
    assert traced.code == code and prepared is not traced


def test_a_model_in_training_mode_is_refused() -> None:
    model, inputs = zoo.build("mlp_tiny")
    with pytest.raises(QuantizeError, match=r"training mode; call \.eval\(\)"):
        prepare(model.train(), inputs)


class GoesThroughNumpy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.from_numpy(x.numpy() * 2))  # no trace sees through numpy


def test_a_model_that_does_not_trace_is_a_clear_error() -> None:
    with pytest.raises(QuantizeError) as info:
        prepare(GoesThroughNumpy().eval(), (torch.randn(2, 4),))
    message = str(info.value)
    assert "could not trace GoesThroughNumpy" in message
    assert "autoleaf=True" in message and "pass the GraphModule" in message
    assert info.value.__cause__ is not None  # the tracer's error, with its source line


def test_example_inputs_the_model_cannot_take_are_a_clear_error() -> None:
    model, _ = zoo.build("mlp_tiny")
    with pytest.raises(QuantizeError, match="example inputs"):
        prepare(model, (torch.randn(4, 3),))


def test_calibrating_a_model_prepare_did_not_make_is_refused() -> None:
    model, inputs = zoo.build("mlp_tiny")
    with pytest.raises(QuantizeError, match="prepare"):
        calibrate(fxloom.symbolic_trace(model), [inputs], progress=False)


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left, self.right = nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.left(x) + self.right(y)


def test_every_input_of_a_model_with_several_is_observed_where_it_is() -> None:
    from fxloom.quantize import convert

    model = TwoInputs().eval()
    example = (torch.randn(2, 8), torch.randn(2, 8))
    prepared = prepare(model, example)
    assert {"x", "y"} <= set(observers(prepared))
    int8 = convert(calibrate(prepared, [example] * 3, progress=False))
    with torch.no_grad():
        assert torch.allclose(int8(*example), model(*example), atol=0.1)


class WithAnUntraceablePart(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.part = GoesThroughNumpy()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.part(x))


def test_the_fix_the_error_suggests_works_the_untraceable_part_runs_in_float() -> None:
    model, example = WithAnUntraceablePart().eval(), (torch.randn(2, 4),)
    with pytest.raises(QuantizeError):
        prepare(model, example)
    prepared = prepare(fxloom.symbolic_trace(model, autoleaf=True), example)
    rows = {row.node: row for row in report(prepared).rows}
    assert rows["part"].kind == "float" and rows["head"].kind == "int8"
