"""Cost analysis: ``fxloom.passes.cost.analyze_cost`` and ``fxloom cost``.

FLOPs and MACs (a multiply-add is 1 MAC = 2 FLOPs) are checked against known figures
(ResNet-50: 4.09 GMACs, 25.56 M parameters) and hand counts (a linear layer, a convolution,
an einsum, one attention layer of BERT, GPT-2 and nn.MultiheadAttention); peak memory against a
hand-made graph with known lifetimes; operators with no formula are listed, never dropped.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxloom
from fxloom import cli, zoo
from fxloom.passes.cost import (
    FLOP_FORMULAS,
    CostReport,
    FlopCount,
    analyze_cost,
    register_flop_formula,
)
from fxloom.passes.shape_prop import ShapeProp, ShapePropError

FLOAT = 4  # bytes per float32


@pytest.fixture(scope="module")
def resnet50_report() -> CostReport:
    model, inputs = zoo.build("resnet50")
    return analyze_cost(fxloom.symbolic_trace(model), *inputs)


def graph_module(build) -> fxloom.GraphModule:
    """A GraphModule over a hand-built graph: ``build(graph, x)`` returns the output value."""
    graph = fxloom.Graph()
    graph.output(build(graph, graph.placeholder("x")))
    return fxloom.GraphModule(nn.Module(), graph)


def node_cost(report: CostReport, name: str):
    return next(node for node in report.nodes if node.name == name)


# ---------------------------------------------------------------- known figures
def test_resnet50_at_224_is_4_09_gmacs_and_25_56_million_parameters(resnet50_report):
    assert resnet50_report.macs == pytest.approx(4.09e9, rel=0.02)
    assert resnet50_report.macs == 4_089_184_256  # convolutions and the classifier
    assert resnet50_report.params == 25_557_032
    assert resnet50_report.flops > 2 * resnet50_report.macs  # plus batch norms, ReLUs, adds
    assert resnet50_report.mode == "meta" and not resnet50_report.not_counted


def test_resnet50_stages_add_up_to_the_total(resnet50_report):
    rows = {row.path: row for row in resnet50_report.by_module(depth=1)}
    assert rows["layer3"].module_type == "Sequential" and rows["fc"].module_type == "Linear"
    assert sum(row.macs for row in rows.values()) == resnet50_report.macs
    assert sum(row.params for row in rows.values()) == resnet50_report.params
    assert rows["fc"].macs == 2048 * 1000 and rows["fc"].params == 2048 * 1000 + 1000
    deeper = resnet50_report.by_module(depth=2)
    assert (
        sum(row.flops for row in deeper if row.path.startswith("layer1.")) == rows["layer1"].flops
    )


@pytest.mark.parametrize("rows, inputs, outputs", [(1, 3, 5), (32, 64, 128)])
def test_a_linear_layer_on_n_rows_is_n_in_out_macs(rows, inputs, outputs):
    report = analyze_cost(
        fxloom.symbolic_trace(nn.Linear(inputs, outputs)), torch.Size([rows, inputs])
    )
    assert report.macs == rows * inputs * outputs
    assert report.flops == 2 * rows * inputs * outputs + rows * outputs  # and the bias add
    assert report.params == inputs * outputs + outputs


@pytest.mark.parametrize(
    "function",
    [
        lambda x, w: F.linear(x, w),
        lambda x, w: torch.matmul(x, w.t()),
        lambda x, w: x @ w.t(),
        lambda x, w: torch.einsum("bi,oi->bo", x, w),
    ],
    ids=["F.linear", "torch.matmul", "operator.matmul", "einsum"],
)
def test_the_same_product_costs_the_same_however_it_is_written(function):
    gm = fxloom.symbolic_trace(function)
    report = analyze_cost(gm, torch.Size([8, 16]), torch.Size([4, 16]))
    assert (report.macs, report.flops) == (8 * 16 * 4, 2 * 8 * 16 * 4)


def test_batched_matmul_counts_every_batch():
    gm = fxloom.symbolic_trace(lambda a, b: torch.bmm(a, b))
    report = analyze_cost(gm, torch.Size([3, 5, 7]), torch.Size([3, 7, 2]))
    assert report.macs == 3 * 5 * 7 * 2


def test_einsum_with_an_ellipsis_counts_the_broadcast_dimensions():
    gm = fxloom.symbolic_trace(lambda q, k: torch.einsum("...qd,...kd->...qk", q, k))
    report = analyze_cost(gm, torch.Size([2, 4, 5, 8]), torch.Size([2, 4, 6, 8]))
    assert report.macs == 2 * 4 * 5 * 6 * 8


@pytest.mark.parametrize("groups", [1, 2])
def test_a_convolution_is_output_elements_times_its_window_macs(groups):
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=groups)
    report = analyze_cost(fxloom.symbolic_trace(conv), torch.Size([2, 4, 16, 16]))
    outputs = 2 * 6 * 8 * 8
    assert report.macs == outputs * (4 // groups) * 3 * 3
    assert report.flops == 2 * report.macs + outputs


def test_a_transposed_convolution_scatters_each_input_element():
    conv = nn.Sequential(nn.ConvTranspose2d(4, 6, 2, stride=2, bias=False))
    report = analyze_cost(fxloom.symbolic_trace(conv), torch.Size([1, 4, 5, 5]))
    assert report.macs == (4 * 5 * 5) * 6 * 2 * 2


def test_elementwise_ops_cost_one_flop_per_output_element():
    gm = fxloom.symbolic_trace(lambda x, y: torch.relu(x + y) * 2)
    report = analyze_cost(gm, torch.Size([3, 4]), torch.Size([4]))
    assert [(node.name, node.flops) for node in report.nodes if node.flops] == [
        ("add", 12), ("relu", 12), ("mul", 12),
    ]  # fmt: skip
    assert report.macs == 0


def test_views_and_sizes_cost_nothing_and_are_counted():
    gm = fxloom.symbolic_trace(lambda x: x.view(x.size(0), -1).transpose(0, 1).contiguous())
    report = analyze_cost(gm, torch.Size([2, 3, 4]))
    assert report.flops == 0 and not report.not_counted
    assert all(node.counted for node in report.nodes)


# ------------------------------------------------------------------- attention, by hand
def attention_layer_macs(batch: int, length: int, hidden: int) -> int:
    """q, k, v and output projections, plus q k^T and weights @ v (over all heads)."""
    projections = 4 * batch * length * hidden * hidden
    scores_and_mix = 2 * batch * length * length * hidden
    return projections + scores_and_mix


@pytest.mark.parametrize(
    "name, layer",
    [("bert", "encoder.layer.0.attention"), ("gpt2", "h.0.attn")],
)
def test_one_attention_layer_of_a_tiny_transformer_matches_a_hand_count(name, layer, traced_hf):
    hf = traced_hf(name)
    report = analyze_cost(hf.gm, **hf.inputs)  # batch 2, 7 tokens, hidden 32, 2 heads
    rows = {row.path: row for row in report.by_module(depth=layer.count(".") + 1)}
    assert rows[layer].macs == attention_layer_macs(batch=2, length=7, hidden=32)
    assert not report.not_counted


def test_multihead_attention_module_matches_a_hand_count():
    attention = nn.MultiheadAttention(32, 4, batch_first=True)  # a leaf: one call_module
    gm = fxloom.symbolic_trace(_SelfAttention(attention))
    report = analyze_cost(gm, torch.Size([2, 7, 32]))
    assert report.macs == attention_layer_macs(batch=2, length=7, hidden=32)


class _SelfAttention(nn.Module):
    def __init__(self, attention: nn.MultiheadAttention) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


def test_normalisation_and_pooling_follow_the_documented_conventions():
    model = nn.Sequential(nn.BatchNorm2d(3), nn.MaxPool2d(2), nn.LayerNorm(4)).eval()
    report = analyze_cost(fxloom.symbolic_trace(model), torch.Size([1, 3, 8, 8]))
    flops = {n.module_path: n.flops for n in report.nodes if n.op == "call_module"}
    assert flops == {"0": 4 * 192, "1": 4 * 48, "2": 7 * 48}  # eval BN: normalise + affine


# ---------------------------------------------------------------------- not counted
def test_an_op_without_a_formula_counts_zero_and_is_listed():
    gm = fxloom.symbolic_trace(lambda x, y: torch.cdist(x, y).relu())
    report = analyze_cost(gm, torch.Size([5, 3]), torch.Size([4, 3]))
    assert report.not_counted == {"torch.cdist": ["cdist"]}
    assert not node_cost(report, "cdist").counted and node_cost(report, "cdist").flops == 0
    assert node_cost(report, "relu").flops == 20
    assert "not counted" in str(report) and "torch.cdist (%cdist)" in str(report)


def test_register_flop_formula_teaches_the_table_a_new_target():
    @register_flop_formula(torch.cdist)
    def cdist(op):
        first = op.args[0]
        return FlopCount.of_macs(op.out_numel * first.shape[-1])

    try:
        gm = fxloom.symbolic_trace(lambda x, y: torch.cdist(x, y))
        report = analyze_cost(gm, torch.Size([5, 3]), torch.Size([4, 3]))
        assert report.macs == 5 * 4 * 3 and not report.not_counted
    finally:
        del FLOP_FORMULAS[torch.cdist]


def test_a_formula_that_fails_on_a_call_is_listed_with_the_reason():
    @register_flop_formula(torch.cdist)
    def broken(op):
        raise IndexError("no such argument")

    try:
        gm = fxloom.symbolic_trace(lambda x, y: torch.cdist(x, y))
        report = analyze_cost(gm, torch.Size([5, 3]), torch.Size([4, 3]))
        (reason,) = report.not_counted
        assert "torch.cdist" in reason and "IndexError: no such argument" in reason
    finally:
        del FLOP_FORMULAS[torch.cdist]


# -------------------------------------------------------------------------- memory
def test_peak_memory_follows_the_lifetimes_of_values_and_views():
    # relu: 4 KiB, live until cat.   neg: 4 KiB, live until repeat (through its view).
    # cat: 8 KiB and repeat: 8 KiB, both returned.  At repeat: neg + cat + repeat = 20 KiB.
    def build(g, x):
        relu = g.call_function(torch.relu, (x,))
        neg = g.call_function(torch.neg, (relu,))
        view = g.call_method("view", (neg, 32, 32))
        cat = g.call_function(torch.cat, ((relu, relu),))
        repeat = g.call_method("repeat", (view, 2, 1))
        return (cat, repeat)

    report = analyze_cost(graph_module(build), torch.Size([1024]))
    assert [node.allocated for node in report.nodes] == [0, 4096, 4096, 0, 8192, 8192, 0]
    assert report.peak_activation_bytes == 20 * 1024 and report.peak_node == "repeat"
    assert report.activation_bytes == 24 * 1024 and report.input_bytes == 4096
    assert report.peak_memory_bytes == 20 * 1024 + 4096


def test_in_place_ops_write_but_allocate_nothing():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True))
    report = analyze_cost(fxloom.symbolic_trace(model), torch.Size([4, 8]))
    relu = node_cost(report, "_1")
    assert relu.allocated == 0 and relu.bytes_written == 4 * 8 * FLOAT and relu.flops == 32
    assert report.peak_activation_bytes == 4 * 8 * FLOAT


def test_a_value_nobody_uses_is_freed_at_once():
    def build(g, x):
        g.call_function(torch.exp, (x,))  # dead: 400 bytes, freed right away
        return g.call_function(torch.neg, (x,))

    report = analyze_cost(graph_module(build), torch.Size([100]))
    assert report.peak_activation_bytes == 100 * FLOAT and report.activation_bytes == 800


def test_bytes_read_include_the_weights_of_a_module_call():
    model = nn.Sequential(nn.Linear(3, 5))
    report = analyze_cost(fxloom.symbolic_trace(model), torch.Size([2, 3]))
    linear = node_cost(report, "_0")
    assert linear.param_bytes == (15 + 5) * FLOAT and linear.params == 20
    assert linear.bytes_read == (6 + 20) * FLOAT and linear.bytes_written == 10 * FLOAT


def test_tied_weights_are_counted_once():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens):
            return self.head(self.embed(tokens))

    report = analyze_cost(fxloom.symbolic_trace(Tied()), ((2, 3), torch.int64))
    assert report.params == 40


# -------------------------------------------------------------- modes and the module
def test_without_inputs_the_recorded_shapes_are_used():
    gm = fxloom.symbolic_trace(nn.Linear(3, 5))
    ShapeProp(gm).propagate(torch.randn(7, 3))
    report = analyze_cost(gm)
    assert report.mode == "recorded" and report.macs == 7 * 3 * 5


def test_recorded_mode_without_shapes_says_what_to_do():
    gm = fxloom.symbolic_trace(nn.Linear(3, 5))
    with pytest.raises(ValueError, match=r"%input_1 has no recorded shapes.*ShapeProp"):
        analyze_cost(gm, mode="recorded")


def test_auto_mode_falls_back_to_real_tensors_when_meta_fails():
    gm = fxloom.symbolic_trace(lambda x: torch.nonzero(x).float().sum())
    report = analyze_cost(gm, torch.tensor([0.0, 1.0, 2.0]))
    assert report.mode == "real"
    assert any("%nonzero" in note for note in report.notes)


def test_meta_mode_does_not_fall_back_and_names_the_node():
    gm = fxloom.symbolic_trace(lambda x: torch.nonzero(x).float().sum())
    with pytest.raises(ShapePropError, match="%nonzero"):
        analyze_cost(gm, torch.tensor([0.0, 1.0, 2.0]), mode="meta")
    with pytest.raises(ShapePropError, match="%nonzero"):  # shapes only: nothing to run for real
        analyze_cost(gm, torch.Size([3]))


def test_analysis_writes_only_tensor_meta_and_type():
    model, inputs = zoo.build("transformer_tiny")
    gm = fxloom.symbolic_trace(model)
    before = {n.name: dict(n.meta) for n in gm.graph.nodes}
    analyze_cost(gm, *inputs)
    assert [n.name for n in gm.graph.nodes] == list(before)
    for node in gm.graph.nodes:
        assert {k: v for k, v in node.meta.items() if k not in ("tensor_meta", "type")} == before[
            node.name
        ]


def test_bad_arguments_are_explained():
    gm = fxloom.symbolic_trace(nn.Linear(3, 5))
    with pytest.raises(ValueError, match="mode must be one of"):
        analyze_cost(gm, torch.Size([1, 3]), mode="fast")
    with pytest.raises(TypeError, match="trace it first"):
        analyze_cost(nn.Linear(3, 5), torch.Size([1, 3]))
    with pytest.raises(TypeError, match=r"takes 1 positional input"):
        analyze_cost(gm, torch.Size([1, 3]), torch.Size([1, 3]))


# ---------------------------------------------------------------------------- tables
def test_tables_by_module_and_by_node_render(resnet50_report):
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(resnet50_report.table(by="module", depth=1))
    console.print(resnet50_report.table(by="node", top=3))
    text = console.export_text()
    assert "layer3" in text and "Sequential" in text and "4.09 G" in text
    assert text.count("│ %") == 3 and "│ %conv1 " in text and "total" in text  # top 3 by FLOPs
    with pytest.raises(ValueError, match="by must be"):
        resnet50_report.table(by="layer")
    with pytest.raises(ValueError, match="depth must be at least 1"):
        resnet50_report.by_module(depth=0)


# ------------------------------------------------------------------------------- CLI
def test_cli_cost_prints_the_summary_and_a_module_table(capsys):
    assert cli.main(["cost", "resnet_tiny"]) == 0
    out = capsys.readouterr().out
    assert "resnet_tiny: cost from meta shapes" in out and "MACs" in out
    assert "cost by module" in out and "layers" in out


def test_cli_cost_takes_input_shapes_depth_and_rows_by_node(capsys):
    args = ["cost", "resnet_tiny", "--input-shape", "4,3,64,64", "--by", "node", "--top", "2"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "Tensor[4, 3, 64, 64] float32" in out and "cost by node" in out
    assert cli.main(["cost", "resnet_tiny", "--depth", "2", "--real"]) == 0
    out = capsys.readouterr().out
    assert "cost from real shapes" in out and "layers.0" in out


def test_cli_cost_accepts_a_factory_with_input_shapes(capsys):
    args = ["cost", "fxloom.zoo.mlp:mlp_tiny", "--input-shape", "2,1,8,8"]
    assert cli.main(args) == 0
    assert "mlp_tiny: cost from meta shapes" in capsys.readouterr().out


def test_cli_cost_errors_name_what_is_wrong(capsys):
    assert cli.main(["cost", "no_such_model"]) == cli.EXIT_USAGE  # a usage error
    assert "no zoo model named 'no_such_model'" in capsys.readouterr().err
    assert cli.main(["cost", "fxloom.zoo.mlp:mlp_tiny"]) == 1
    assert "--input-shape" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli.main(["cost", "mlp_tiny", "--input-shape", "2,x"])
    assert exited.value.code == 2 and "is not a shape" in capsys.readouterr().err


# ------------------------------------------------------------------------ benchmark
def test_bench_shape_cost_quick_runs_and_prints_its_tables(quick_benchmark):
    out = quick_benchmark("bench_shape_cost.py")
    assert "### Shape propagation" in out and "### Cost analysis" in out
