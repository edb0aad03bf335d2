"""Importing ``quantized_decomposed`` graphs (PT2E / torchao reference graphs) into fxloom's
operators: ``fxloom.quantize.importer.import_quantized``.

- hand-written reference graphs (what ``convert_pt2e`` and torchao write: dequantize ->
  linear -> quantize, per tensor and per channel, per-token dynamic, group-wise int4 weight
  only, a static convolution), traced with ``fxloom.symbolic_trace`` or ``fxloom.export``,
  become fxloom's operators and compute what the reference graph computes, at the example's
  batch and another: equal, or within one step of the output's quantization (an integer
  matmul rounds differently from a float one, and a value rounded after it may move by one);
- torch's PT2E flow itself (torchao's ``prepare_pt2e``/``convert_pt2e`` with
  ``X86InductorQuantizer``, static and dynamic, on ``torch.export`` programs with a dynamic
  batch), traced by fxloom: the same;
- an imported graph saves with ``fxloom.save`` and loads and runs in a fresh interpreter with
  ``torch.ao.quantization`` blocked from import;
- what it cannot import exactly is refused, naming the node, its line and what to do.

``torch.ao.quantization.fx._decomposed`` registers the ``quantized_decomposed`` operators: the
reference side of these tests (the peer) uses it; the importer never imports it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers quantized_decomposed
from torch import nn
from torch.nn import functional as F

import fxloom
from fxloom.quantize import QuantizeError, ops
from fxloom.quantize.importer import FORMS, REFUSED, RENAMES, import_quantized
from tests.quantize.without_torch_ao import run_without_torch_ao

ROOT = Path(__file__).resolve().parents[2]
qd = torch.ops.quantized_decomposed


# ------------------------------------------------------------------ reference-style models
def _int8_weight(module: nn.Module, name: str, out_features: int, in_features: int) -> None:
    """An int8 weight with a scale and a zero zero point per output channel, as
    ``convert_pt2e`` folds it."""
    generator = torch.Generator().manual_seed(len(name) + out_features)
    weight = torch.randint(-127, 128, (out_features, in_features), generator=generator)
    module.register_buffer(f"{name}_int8", weight.to(torch.int8))
    module.register_buffer(f"{name}_scale", torch.rand(out_features, generator=generator) / 500)
    module.register_buffer(f"{name}_zero_point", torch.zeros(out_features, dtype=torch.int64))
    module.register_buffer(f"{name}_bias", torch.randn(out_features, generator=generator) / 10)


def _weight(module: nn.Module, name: str) -> torch.Tensor:
    return qd.dequantize_per_channel.default(
        getattr(module, f"{name}_int8"), getattr(module, f"{name}_scale"),
        getattr(module, f"{name}_zero_point"), 0, -128, 127, torch.int8,
    )  # fmt: skip


def _q(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    return qd.quantize_per_tensor.default(x, scale, zero_point, 0, 255, torch.uint8)


def _dq(q: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    return qd.dequantize_per_tensor.default(q, scale, zero_point, 0, 255, torch.uint8)


OUT_SCALE = 0.05  # the static models' last quantization step


class StaticMLP(nn.Module):
    """dq -> linear -> relu -> q, twice, per-tensor activations, per-channel weights."""

    def __init__(self) -> None:
        super().__init__()
        _int8_weight(self, "fc1", 64, 32)
        _int8_weight(self, "fc2", 16, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _dq(_q(x, 0.02, 128), 0.02, 128)
        x = F.relu(F.linear(x, _weight(self, "fc1"), self.fc1_bias))
        x = _dq(_q(x, 0.01, 0), 0.01, 0)
        x = F.linear(x, _weight(self, "fc2"), self.fc2_bias)
        return _dq(_q(x, OUT_SCALE, 128), OUT_SCALE, 128)


class PerTensorWeight(nn.Module):
    """A weight dequantized with one scale (``dequantize_per_tensor`` of an int8 constant)."""

    def __init__(self) -> None:
        super().__init__()
        _int8_weight(self, "fc", 16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _dq(_q(x, 0.02, 128), 0.02, 128)
        w = qd.dequantize_per_tensor.default(self.fc_int8, 0.003, 0, -128, 127, torch.int8)
        return _dq(_q(F.linear(x, w, self.fc_bias), OUT_SCALE, 128), OUT_SCALE, 128)


class WeightOnly(nn.Module):
    """Float activations, int8 weights per channel (torchao's int8 weight-only)."""

    def __init__(self) -> None:
        super().__init__()
        _int8_weight(self, "fc", 16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, _weight(self, "fc"), self.fc_bias)


class PerTokenDynamic(nn.Module):
    """Activations quantized per token, symmetric, at run time (torchao's int8 dynamic)."""

    def __init__(self) -> None:
        super().__init__()
        _int8_weight(self, "fc", 16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale, zero_point = qd.choose_qparams_per_token.default(x, torch.int8)
        q = qd.quantize_per_token.default(x, scale, zero_point, -128, 127, torch.int8)
        x = qd.dequantize_per_token.default(
            q, scale, zero_point, -128, 127, torch.int8, torch.float32
        )
        return F.linear(x, _weight(self, "fc"), self.fc_bias)


class GroupWiseInt4(nn.Module):
    """int4 weights (-8..7) with a scale and zero point per group of 32 inputs."""

    def __init__(self, zero_points: bool = True) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(4)
        self.register_buffer(
            "w", torch.randint(-8, 8, (16, 64), generator=generator).to(torch.int8)
        )
        self.register_buffer("scale", torch.rand(16, 2, generator=generator) / 50)
        zero_point = torch.randint(-2, 3, (16, 2), generator=generator) if zero_points else None
        self.register_buffer("zero_point", zero_point)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = qd.dequantize_per_channel_group.default(
            self.w, self.scale, self.zero_point, -8, 7, torch.int8, 32, torch.float32
        )
        return F.linear(x, w)


class StaticConv(nn.Module):
    """dq -> conv2d -> q with per-channel int8 weights."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(2)
        weight = torch.randint(-127, 128, (8, 3, 3, 3), generator=generator).to(torch.int8)
        self.register_buffer("w", weight)
        self.register_buffer("w_scale", torch.rand(8, generator=generator) / 100)
        self.register_buffer("w_zero_point", torch.zeros(8, dtype=torch.int64))
        self.register_buffer("bias", torch.randn(8, generator=generator) / 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _dq(_q(x, 0.03, 128), 0.03, 128)
        w = qd.dequantize_per_channel.default(
            self.w, self.w_scale, self.w_zero_point, 0, -128, 127, torch.int8
        )
        x = F.conv2d(x, w, self.bias, 1, 1)
        return _dq(_q(x, OUT_SCALE, 128), OUT_SCALE, 128)


def _rows(batch: int, features: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, features, generator=torch.Generator().manual_seed(seed))


def _calls(gm: fxloom.GraphModule) -> list[str]:
    return [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes
            if n.op == "call_function"]  # fmt: skip


def _imported(model: nn.Module) -> tuple[fxloom.GraphModule, fxloom.GraphModule]:
    reference = fxloom.symbolic_trace(model)
    return reference, import_quantized(reference)


def _assert_within_one_step(out: torch.Tensor, reference: torch.Tensor, step: float) -> None:
    difference = (out - reference).abs().max().item()
    assert difference <= step * 1.001, (difference, step)


# ------------------------------------------------------------------ hand-written reference graphs
IMPORTS = {
    # model -> (the fxloom operators it becomes, the step its output may move by; 0: float
    # rounding only)
    StaticMLP: (["quantize", "linear_int8", "linear_int8", "dequantize"], OUT_SCALE),
    PerTensorWeight: (["quantize", "linear_int8", "dequantize"], OUT_SCALE),
    WeightOnly: (["linear_w8"], 0.0),
    PerTokenDynamic: (["linear_int8"], 0.0),
    GroupWiseInt4: (["linear_w4"], 0.0),
}  # fmt: skip


@pytest.mark.usefixtures("weight_only_references")  # the import's meaning, not the kernels'
@pytest.mark.parametrize("model_class", list(IMPORTS), ids=lambda c: c.__name__)
@pytest.mark.parametrize("batch", [8, 3])
def test_a_reference_graph_becomes_fxloom_operators_computing_the_same(
    model_class: type, batch: int
) -> None:
    calls, step = IMPORTS[model_class]
    reference, imported = _imported(model_class().eval())
    assert _calls(imported) == calls
    x = _rows(batch, 64 if model_class is GroupWiseInt4 else 32, seed=batch)
    with torch.no_grad():
        if step:
            _assert_within_one_step(imported(x), reference(x), step)
        else:
            torch.testing.assert_close(imported(x), reference(x), rtol=1e-4, atol=1e-5)


def test_a_static_linear_reads_the_integers_and_parameters_of_its_input() -> None:
    _, imported = _imported(StaticMLP().eval())
    first = next(n for n in imported.graph.nodes if n.target is ops.linear_int8)
    q, x_scale, x_zero_point = first.args[:3]
    assert q.target is ops.quantize and (x_scale, x_zero_point) == (0.02, 128)
    assert first.args[-1] is False  # static


def test_a_static_layer_requantizes_its_own_output_with_the_relu_before_it() -> None:
    _, imported = _imported(StaticMLP().eval())
    first, second = (n for n in imported.graph.nodes if n.target is ops.linear_int8)
    assert first.args[6:9] == (0.01, 0, True)  # out_scale, out_zero_point, relu
    assert second.args[6:9] == (OUT_SCALE, 128, False) and second.args[0] is first


def test_a_per_token_dynamic_linear_quantizes_its_float_input_at_run_time() -> None:
    _, imported = _imported(PerTokenDynamic().eval())
    (linear,) = (n for n in imported.graph.nodes if n.target is ops.linear_int8)
    assert linear.args[0].op == "placeholder" and linear.args[-1] is True  # dynamic


@pytest.mark.usefixtures("weight_only_references")
def test_int4_weights_without_zero_points_import() -> None:
    reference, imported = _imported(GroupWiseInt4(zero_points=False).eval())
    x = _rows(5, 64)
    torch.testing.assert_close(imported(x), reference(x), rtol=1e-4, atol=1e-5)


def test_int4_weights_are_packed_two_a_byte_and_the_int8_originals_dropped() -> None:
    _, imported = _imported(GroupWiseInt4().eval())
    held = dict(imported.named_buffers())
    assert "w" not in held
    (packed,) = (t for t in held.values() if t.dtype == torch.uint8)
    assert packed.shape == (16, 32)


@pytest.mark.parametrize("batch", [2, 5])
def test_a_static_convolution_becomes_conv2d_int8(batch: int) -> None:
    reference, imported = _imported(StaticConv().eval())
    assert "conv2d_int8" in _calls(imported)
    x = torch.randn(batch, 3, 8, 8, generator=torch.Generator().manual_seed(batch))
    with torch.no_grad():
        _assert_within_one_step(imported(x), reference(x), OUT_SCALE)


def test_an_exported_reference_graph_imports_the_same() -> None:
    from fxloom.export import Dim, export

    model = StaticMLP().eval()
    program = export(model, (_rows(8),), dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
    imported = import_quantized(program.module())
    assert "linear_int8" in _calls(imported)
    assert not any("quantized_decomposed" in str(n.target) for n in imported.graph.nodes)
    x = _rows(13, seed=13)
    with torch.no_grad():
        _assert_within_one_step(imported(x), model(x), OUT_SCALE)


def test_the_reference_graph_itself_is_left_unchanged() -> None:
    reference, _ = _imported(StaticMLP().eval())
    assert "dequantize_per_channel.default" in str(reference.code)


# ------------------------------------------------------------------ refusals
class AsymmetricPerToken(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale, zero_point = qd.choose_qparams_per_token_asymmetric.default(x, torch.int8)
        q = qd.quantize_per_token.default(x, scale, zero_point, -128, 127, torch.int8)
        return qd.dequantize_per_token.default(
            q, scale, zero_point, -128, 127, torch.int8, torch.float32
        )


class WeightReadByAnAdd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        _int8_weight(self, "fc", 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + _weight(self, "fc")


class FakeQuantize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scales, zero_points = torch.ones(4), torch.zeros(4, dtype=torch.int32)
        return qd.fake_quant_per_channel.default(x, scales, zero_points, 1, -128, 127)


class KeywordArguments(nn.Module):
    """Arguments given by keyword, as a graph may hold them."""

    def __init__(self) -> None:
        super().__init__()
        _int8_weight(self, "fc", 16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = qd.quantize_per_tensor.default(
            x, scale=0.02, zero_point=128, quant_min=0, quant_max=255, dtype=torch.uint8
        )
        x = qd.dequantize_per_tensor.default(
            q, 0.02, 128, 0, 255, torch.uint8, out_dtype=torch.float32
        )
        w = qd.dequantize_per_channel.default(
            self.fc_int8, self.fc_scale, zero_points=None, axis=0, quant_min=-128,
            quant_max=127, dtype=torch.int8,
        )  # fmt: skip
        return F.linear(x, w, self.fc_bias)


def test_arguments_given_by_keyword_import_as_given_by_position() -> None:
    reference, imported = _imported(KeywordArguments().eval())
    assert _calls(imported) == ["quantize", "linear_int8"]
    x = _rows(6)
    torch.testing.assert_close(imported(x), reference(x), rtol=1e-4, atol=1e-5)


class BFloat16Dequantize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = _q(x, 0.02, 128)
        return qd.dequantize_per_tensor.default(
            q, 0.02, 128, 0, 255, torch.uint8, out_dtype=torch.bfloat16
        )


REFUSALS = {
    AsymmetricPerToken: ("choose_qparams_per_token_asymmetric", "per-token symmetric"),
    BFloat16Dequantize: ("dequantize_per_tensor", "fxloom's dequantize returns float32"),
    WeightReadByAnAdd: ("dequantize_per_channel", "read only as the int8 weight"),
    FakeQuantize: ("fake_quant_per_channel", "fxloom has no operator for it"),
}


@pytest.mark.parametrize("model_class", list(REFUSALS), ids=lambda c: c.__name__)
def test_what_fxloom_cannot_compute_the_same_is_refused_naming_the_node_and_line(
    model_class: type,
) -> None:
    operator_name, why = REFUSALS[model_class]
    reference = fxloom.symbolic_trace(model_class())
    with pytest.raises(QuantizeError) as raised:
        import_quantized(reference)
    message = str(raised.value)
    assert f"quantized_decomposed.{operator_name}" in message and why in message
    assert "line" in message or "test_importer.py:" in message


def test_every_row_of_the_tables_names_an_operator_of_this_torch() -> None:
    for key in (*RENAMES, *FORMS, *REFUSED):
        name, _, overload = key.partition(".")
        assert hasattr(getattr(qd, name), overload), key


# ------------------------------------------------------------------ saved and loaded
LOAD = r"""
import fxloom

x, expected = torch.load(sys.argv[2])
loaded = fxloom.load(sys.argv[1])
assert torch.equal(loaded(x), expected)
"""


def _loads_and_runs_without_torch_ao(imported: nn.Module, x: torch.Tensor, folder: Path) -> None:
    """Saved, then loaded and run in a fresh interpreter where torch.ao.quantization is blocked:
    the same result."""
    fxloom.save(imported, folder / "imported.fxl")
    with torch.no_grad():
        torch.save((x, imported(x)), folder / "io.pt")
    run_without_torch_ao(LOAD, str(folder / "imported.fxl"), str(folder / "io.pt"))


@pytest.mark.parametrize("model_class", [StaticMLP, PerTokenDynamic, GroupWiseInt4],
                         ids=lambda c: c.__name__)  # fmt: skip
def test_an_imported_graph_loads_and_runs_in_a_fresh_interpreter_without_torch_ao(
    model_class: type, tmp_path: Path
) -> None:
    _, imported = _imported(model_class().eval())
    x = _rows(3, 64 if model_class is GroupWiseInt4 else 32)
    _loads_and_runs_without_torch_ao(imported, x, tmp_path)


# ------------------------------------------------------------------ torch's PT2E flow, the peer
def _pt2e(model: nn.Module, example: torch.Tensor, data: list, **config) -> nn.Module:
    """torchao's PT2E flow with X86InductorQuantizer on a program with a dynamic batch."""
    pytest.importorskip("torchao")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config(**config))
    batch = torch.export.Dim("batch", min=1, max=256)
    program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
    prepared = prepare_pt2e(program.module(), quantizer)
    with torch.no_grad():
        for x in data:
            prepared(x)
    converted = convert_pt2e(prepared)
    if not any(
        str(getattr(node.target, "namespace", "")) == "quantized_decomposed"
        for node in converted.graph.nodes
    ):  # torchao 0.18 on torch 2.11 annotates nothing: the peer, not fxloom
        pytest.skip(f"torchao's PT2E quantized nothing on torch {torch.__version__}")
    return converted


def _recommender() -> tuple[nn.Module, torch.Tensor, callable]:
    from fxloom import zoo
    from fxloom.zoo.deeprec import ratings

    model, (example,) = zoo.build("deeprec_tiny")
    return model, example, lambda batch, seed: ratings(batch, example.shape[1], seed)


def _images() -> tuple[nn.Module, torch.Tensor, callable]:
    from fxloom import zoo

    model, (example,) = zoo.build("cnn_small")
    shape = example.shape[1:]
    return (
        model,
        example,
        lambda batch, seed: torch.randn(
            batch, *shape, generator=torch.Generator().manual_seed(seed)
        ),
    )


PT2E_CASES = {
    # name -> (workload, X86InductorQuantizer config, the fxloom operators it must contain)
    "deeprec_tiny-static": (_recommender, {}, {"linear_int8"}),
    "deeprec_tiny-dynamic": (_recommender, {"is_dynamic": True}, {"choose_qparams", "linear_w8"}),
    "cnn_small-static": (_images, {}, {"conv2d_int8", "linear_int8"}),
}


@pytest.mark.usefixtures("weight_only_references")
@pytest.mark.parametrize("case", list(PT2E_CASES))
def test_a_pt2e_converted_program_traced_by_fxloom_imports_computing_the_same(case: str) -> None:
    workload, config, expected = PT2E_CASES[case]
    model, example, data = workload()
    converted = _pt2e(
        model.eval(), example, [data(example.shape[0], s) for s in range(4)], **config
    )
    imported = import_quantized(fxloom.symbolic_trace(converted))
    assert expected <= set(_calls(imported))
    assert not any("quantized_decomposed" in str(n.target) for n in imported.graph.nodes)
    with torch.no_grad():
        for batch in (example.shape[0], 3):
            x = data(batch, 100 + batch)
            torch.testing.assert_close(imported(x), converted(x), rtol=1e-4, atol=1e-5)


def test_a_refusal_names_the_user_s_line_when_tracing_recorded_it() -> None:
    tracer = fxloom.Tracer(record_stack_traces=True)
    model = AsymmetricPerToken()
    reference = fxloom.GraphModule(model, tracer.trace(model))
    with pytest.raises(QuantizeError, match=r"test_importer\.py:\d+"):
        import_quantized(reference)


def test_an_imported_pt2e_program_loads_and_runs_in_a_fresh_interpreter_without_torch_ao(
    tmp_path: Path,
) -> None:
    model, example, data = _recommender()
    converted = _pt2e(model.eval(), example, [data(example.shape[0], s) for s in range(4)])
    imported = import_quantized(fxloom.symbolic_trace(converted))
    _loads_and_runs_without_torch_ao(imported, data(5, 300), tmp_path)
