"""fxloom's passes take exported programs: shape propagation, cost analysis and drawing.

An exported graph calls ATen operators and takes the program's parameters, buffers and
constants as placeholders; ``ShapeProp``, ``analyze_cost`` and ``FxGraphDrawer`` accept the
``ExportedProgram`` itself (binding the lifted state to the program's tensors) or its
``graph_module``. Costs are compared with the same model traced symbolically, and MACs with
torch's own FLOP counter run on the eager model.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import fxloom
from fxloom import zoo
from fxloom.export import export
from fxloom.passes.cost import analyze_cost
from fxloom.passes.graph_drawer import FxGraphDrawer
from fxloom.passes.shape_prop import ShapeProp, TensorMetadata

ZOO_MODELS = ("mlp_tiny", "resnet_tiny", "transformer_tiny")


@pytest.fixture(scope="module", params=ZOO_MODELS)
def zoo_model(request):
    """``(name, model, inputs, exported program)`` for each small zoo model."""
    model, inputs = zoo.build(request.param)
    return request.param, model, inputs, export(model, inputs)


def _exported_resnet():
    model, inputs = zoo.build("resnet_tiny")
    return model, inputs, export(model, inputs)


# ------------------------------------------------------------------ shape propagation
def test_shape_prop_runs_an_exported_program_on_the_user_inputs_alone(zoo_model) -> None:
    _, model, inputs, ep = zoo_model
    with torch.no_grad():
        (result,) = ShapeProp(ep).propagate(*inputs)
        expected = model(*inputs)
    torch.testing.assert_close(result, expected)


def test_shape_prop_on_exported_records_the_shapes_export_recorded(zoo_model) -> None:
    _, _, inputs, ep = zoo_model
    ShapeProp(ep).propagate_meta(*inputs)
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            assert node.meta["tensor_meta"].shape == val.shape, node.name
            assert node.meta["tensor_meta"].dtype == val.dtype, node.name


def test_shape_prop_meta_on_the_graph_module_falls_back_to_the_recorded_vals() -> None:
    _, inputs, ep = _exported_resnet()
    (output,) = ShapeProp(ep.graph_module).propagate_meta()  # no inputs at all
    assert output.is_meta and output.shape == (1, 10)
    batch_norm = next(node for node in ep.graph.nodes if isinstance(node.meta.get("val"), tuple))
    first, *_ = batch_norm.meta["tensor_meta"]  # a multi-output operator: one per result
    assert isinstance(first, TensorMetadata) and first.shape == (1, 8, 32, 32)


def test_a_lifted_input_given_by_name_replaces_the_programs_own() -> None:
    ep = export(nn.Linear(3, 2), (torch.randn(4, 3),))
    weight = torch.zeros(2, 3)
    (result,) = ShapeProp(ep).propagate(torch.ones(4, 3), p_weight=weight)
    torch.testing.assert_close(result, ep.state_dict["bias"].expand(4, 2))


def test_shape_prop_leaves_the_exported_metadata_in_place() -> None:
    _, inputs, ep = _exported_resnet()
    before = {node.name: dict(node.meta) for node in ep.graph.nodes}
    ShapeProp(ep).propagate_meta(*inputs)
    for node in ep.graph.nodes:
        for key, value in before[node.name].items():
            assert node.meta[key] is value, (node.name, key)


# ---------------------------------------------------------------------- cost analysis
def test_an_exported_model_costs_what_the_traced_model_costs(zoo_model) -> None:
    name, model, inputs, ep = zoo_model
    exported = analyze_cost(ep)
    traced = analyze_cost(fxloom.symbolic_trace(model), *inputs)
    assert (exported.flops, exported.macs) == (traced.flops, traced.macs)
    assert (exported.params, exported.param_bytes) == (traced.params, traced.param_bytes)
    assert exported.input_bytes == traced.input_bytes
    assert exported.not_counted == {}


def test_costs_per_module_match_the_traced_model() -> None:
    model, inputs, ep = _exported_resnet()
    exported = analyze_cost(ep).by_module(depth=2)
    traced = analyze_cost(fxloom.symbolic_trace(model), *inputs).by_module(depth=2)
    assert [(r.path, r.module_type, r.flops, r.params) for r in exported] == [
        (r.path, r.module_type, r.flops, r.params) for r in traced
    ]


def test_exported_macs_match_torchs_flop_counter_on_eager(zoo_model) -> None:
    _, model, inputs, ep = zoo_model
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(*inputs)
    # torch counts the contractions only (matmul, convolution, attention), 2 FLOPs per MAC.
    assert 2 * analyze_cost(ep).macs == counter.get_total_flops()


def test_lifted_weights_count_as_weights_of_their_module_not_as_inputs() -> None:
    _, inputs, ep = _exported_resnet()
    report = analyze_cost(ep)
    assert report.inputs == ["x: Tensor[1, 3, 32, 32] float32"]
    assert report.input_bytes == inputs[0].numel() * 4
    weight = next(node for node in report.nodes if node.name == "p_conv1_weight")
    assert (weight.module_path, weight.params, weight.weights) == ("conv1", 216, ("conv1.weight",))


def test_aten_views_move_and_allocate_nothing() -> None:
    ep = export(nn.Linear(3, 2), (torch.randn(4, 3),))
    report = analyze_cost(ep)
    (transpose,) = [node for node in report.nodes if node.target.endswith("aten.t.default")]
    assert (transpose.bytes_read, transpose.bytes_written, transpose.allocated) == (0, 0, 0)


def test_cost_reads_the_recorded_shapes_when_given_no_inputs() -> None:
    _, inputs, ep = _exported_resnet()
    assert analyze_cost(ep).flops == analyze_cost(ep, *inputs).flops
    assert analyze_cost(ep.graph_module).flops == analyze_cost(ep).flops


class _Attention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


# Each module costs the same exported (ATen formulas) as traced (module and function formulas).
ATEN_CASES = {
    "conv2d with bias": (lambda: nn.Conv2d(3, 8, 3, padding=1), (2, 3, 10, 10)),
    "transposed conv": (lambda: nn.ConvTranspose2d(4, 2, 3, stride=2), (1, 4, 5, 5)),
    "grouped conv": (lambda: nn.Conv2d(4, 8, 3, groups=2), (1, 4, 6, 6)),
    "batch norm, eval": (lambda: nn.BatchNorm2d(4).eval(), (2, 4, 3, 3)),
    "layer norm": (lambda: nn.LayerNorm(8), (2, 5, 8)),
    "group norm": (lambda: nn.GroupNorm(2, 4), (2, 4, 3, 3)),
    "max pool": (lambda: nn.MaxPool2d(3, stride=2), (1, 2, 9, 9)),
    "average pool": (lambda: nn.AvgPool2d(2), (1, 2, 8, 8)),
    "adaptive average pool": (lambda: nn.AdaptiveAvgPool2d(1), (1, 2, 8, 8)),
    "linear on 3-d input": (lambda: nn.Linear(8, 4), (2, 5, 8)),
    "gelu": (lambda: nn.GELU(), (3, 7)),
    "softmax": (lambda: nn.Softmax(dim=-1), (3, 7)),
}


@pytest.mark.parametrize("case", list(ATEN_CASES))
def test_aten_formulas_count_what_the_traced_formulas_count(case: str) -> None:
    build, shape = ATEN_CASES[case]
    torch.manual_seed(0)
    x = torch.randn(shape)
    exported = analyze_cost(export(nn.Sequential(build()), (x,)))
    traced = analyze_cost(fxloom.symbolic_trace(nn.Sequential(build())), x)
    assert exported.not_counted == {}
    assert (exported.flops, exported.macs) == (traced.flops, traced.macs)


def test_batch_norm_in_training_counts_its_statistics() -> None:
    x = torch.randn(2, 4, 3, 3)
    exported = analyze_cost(export(nn.Sequential(nn.BatchNorm2d(4).train()), (x,)))
    traced = analyze_cost(fxloom.symbolic_trace(nn.Sequential(nn.BatchNorm2d(4).train())), x)
    # Export also sees the module count its batches (num_batches_tracked + 1): one FLOP.
    assert exported.flops == traced.flops + 1 == 6 * x.numel() + 1


def test_attention_costs_the_same_exported_and_traced() -> None:
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    exported = analyze_cost(export(_Attention(), (q, k, v)))
    traced = analyze_cost(fxloom.symbolic_trace(_Attention()), q, k, v)
    assert (exported.flops, exported.macs) == (traced.flops, traced.macs)


def test_an_aten_operator_without_a_formula_is_listed_not_dropped() -> None:
    class Sort(nn.Module):
        def forward(self, x):
            return torch.sort(x).values

    report = analyze_cost(export(Sort(), (torch.randn(5),)))
    assert list(report.not_counted) == ["aten.sort.default"]


# --------------------------------------------------------------------------- drawing
def test_drawing_labels_aten_nodes_by_their_short_name() -> None:
    _, _, ep = _exported_resnet()
    source = FxGraphDrawer(ep, "resnet").get_dot_graph().source
    assert "call_function[target=aten.convolution.default]" in source
    assert "torch.ops.aten" not in source


def test_drawing_boxes_lifted_weights_inside_the_module_owning_them() -> None:
    _, _, ep = _exported_resnet()
    source = FxGraphDrawer(ep, "resnet").get_dot_graph().source
    conv1_box = source[source.index("label=<conv1 (Conv2d)>") :]
    conv1_box = conv1_box[: conv1_box.index("}")]
    assert "parameter conv1.weight" in conv1_box
    assert '"convolution"' in conv1_box
    assert "buffer bn1.running_mean" in source


def test_drawing_puts_the_recorded_shapes_on_edges() -> None:
    _, _, ep = _exported_resnet()
    source = FxGraphDrawer(ep, "resnet").get_dot_graph().source
    assert re.search(r'"convolution" -> "\w+" \[label=<f32\[1, 8, 32, 32\]>\]', source)


def test_ignore_parameters_and_buffers_leaves_the_lifted_state_out() -> None:
    _, _, ep = _exported_resnet()
    source = FxGraphDrawer(ep, "resnet", ignore_parameters_and_buffers=True).get_dot_graph()
    assert "p_conv1_weight" not in source.source
    assert '"x" -> "convolution"' in source.source


def test_the_graph_module_alone_draws_too() -> None:
    _, _, ep = _exported_resnet()
    source = FxGraphDrawer(ep.graph_module, "resnet").get_dot_graph().source
    assert "placeholder[target=p_conv1_weight]" in source


def test_shape_propagation_runs_on_the_module_of_a_program_with_nested_inputs():
    class Pairwise(torch.nn.Module):
        def forward(self, pair):
            return {"sum": pair[0] + pair[1], "first": pair[0]}

    pair = (torch.randn(2, 3), torch.randn(2, 3))
    module = export(Pairwise(), (pair,)).module()
    out = ShapeProp(module).propagate(pair)
    assert set(out) == {"sum", "first"}
    assert ShapeProp(module).propagate_meta(pair)["sum"].shape == (2, 3)
    add = next(n for n in module.graph.nodes if n.target is torch.ops.aten.add.Tensor)
    assert add.meta["tensor_meta"].shape == (2, 3)
