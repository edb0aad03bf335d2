"""``replace_pattern``: rewriting every match, what it does to names, meta and attributes,
refusing bad input untouched, and real models whose numerics must not change."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import fxloom
from fxloom import subgraph_rewriter, zoo
from fxloom.subgraph_rewriter import (
    ANY,
    Match,
    PatternError,
    ReplacedPatterns,
    explain_match,
    replace_pattern,
    replace_pattern_with_filters,
)


def names(gm: fxloom.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes]


def targets(gm: fxloom.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def snapshot(gm: fxloom.GraphModule) -> tuple:
    """Everything a refused rewrite must leave as it was."""
    state = {k: v.clone() for k, v in gm.state_dict().items()}
    return str(gm.graph), gm.code, names(gm), state


def same_snapshot(a: tuple, b: tuple) -> bool:
    return (
        a[:3] == b[:3]
        and a[3].keys() == b[3].keys()
        and all(torch.equal(a[3][k], b[3][k]) for k in a[3])
    )


# ------------------------------------------------------- the documented API
def test_the_documented_example_replaces_cat_with_stack():
    class M(nn.Module):
        def forward(self, x, w1, w2):
            m1 = torch.cat([w1, w2]).sum()
            m2 = torch.cat([w1, w2]).sum()
            return x + torch.max(m1) + torch.max(m2)

    def pattern(w1, w2):
        return torch.cat([w1, w2])

    def replacement(w1, w2):
        return torch.stack([w1, w2])

    gm = fxloom.symbolic_trace(M())
    found = subgraph_rewriter.replace_pattern(gm, pattern, replacement)
    assert [type(m) for m in found] == [Match, Match]
    assert targets(gm).count(torch.stack) == 2 and torch.cat not in targets(gm)
    x, w1, w2 = torch.randn(3), torch.randn(2), torch.randn(2)
    assert_close(gm(x, w1, w2), M()(x, w1, w2))  # stacked or concatenated, the same sum


def test_the_replacement_takes_every_pattern_input_even_unused_ones():
    def pattern(x, y):
        return torch.neg(x) + torch.relu(y)

    def replacement(x, y):
        return torch.relu(x)

    gm = fxloom.symbolic_trace(lambda a, b: torch.neg(a) + torch.relu(b))
    replace_pattern(gm, pattern, replacement)
    a, b = torch.randn(4), torch.randn(4)
    assert_close(gm(a, b), torch.relu(a))


def test_match_maps_pattern_nodes_to_graph_nodes():
    gm = fxloom.symbolic_trace(lambda a: torch.relu(a + 1))
    (match,) = replace_pattern(gm, lambda x: torch.relu(x + 1), lambda x: torch.sigmoid(x))
    assert match.anchor.name == "relu"
    assert {p.name: g.name for p, g in match.nodes_map.items()} == {
        "x": "a",
        "add": "add",
        "relu": "relu",
    }


def test_with_filters_returns_the_inserted_nodes():
    gm = fxloom.symbolic_trace(lambda a: torch.relu(a) * 2)
    (done,) = replace_pattern_with_filters(
        gm, lambda x: torch.relu(x), lambda x: torch.clamp(torch.sigmoid(x), 0, 1)
    )
    assert isinstance(done, ReplacedPatterns)
    assert [n.name for n in done.replacements] == ["sigmoid", "clamp"]
    assert all(n.graph is gm.graph for n in done.replacements)


def test_every_non_overlapping_match_is_replaced_in_order():
    def chain(a):
        for _ in range(5):
            a = torch.relu(a)
        return a

    gm = fxloom.symbolic_trace(chain)
    found = replace_pattern(gm, lambda x: torch.relu(torch.relu(x)), lambda x: torch.sigmoid(x))
    assert [m.anchor.name for m in found] == ["relu_1", "relu_3"]
    assert targets(gm) == [torch.sigmoid, torch.sigmoid, torch.relu]


def test_no_match_leaves_the_module_unchanged():
    gm = fxloom.symbolic_trace(lambda a: torch.relu(a))
    before = snapshot(gm)
    assert replace_pattern(gm, lambda x: torch.sigmoid(x), lambda x: x) == []
    assert same_snapshot(snapshot(gm), before)


def test_a_match_whose_input_is_an_earlier_matchs_output_is_rewired():
    gm = fxloom.symbolic_trace(lambda a: torch.relu(torch.relu(torch.relu(a))))
    found = replace_pattern(gm, lambda x: torch.relu(x), lambda x: torch.sigmoid(x) * 2)
    assert len(found) == 3
    # The second match's input is now the first replacement's output.
    assert found[1].nodes_map[next(iter(found[1].nodes_map))].name == "mul"
    a = torch.randn(5)
    assert_close(gm(a), (torch.sigmoid(torch.sigmoid(torch.sigmoid(a) * 2) * 2) * 2))


def test_a_replacement_may_return_one_of_its_inputs():
    gm = fxloom.symbolic_trace(lambda a: (a * 1) + (a * 2))
    replace_pattern(gm, lambda x: x * 1, lambda x: x)
    assert [n.name for n in gm.graph.nodes] == ["a", "mul_1", "add", "output"]


def test_a_pattern_input_matching_a_constant_passes_it_to_the_replacement():
    gm = fxloom.symbolic_trace(lambda a: a * 3.0)
    replace_pattern(gm, lambda x, k: x * k, lambda x, k: torch.mul(x, k))
    assert targets(gm) == [torch.mul]
    assert gm(torch.ones(2)).tolist() == [3.0, 3.0]


def test_a_pattern_with_several_outputs_rewires_each():
    def model(a, b):
        return torch.relu(a) + b, torch.sigmoid(a) * 2

    gm = fxloom.symbolic_trace(model)
    replace_pattern(
        gm,
        lambda x: (torch.relu(x), torch.sigmoid(x)),
        lambda x: (torch.clamp(x, min=0), torch.special.expit(x)),
    )
    assert torch.relu not in targets(gm) and torch.sigmoid not in targets(gm)
    a, b = torch.randn(4), torch.randn(4)
    assert_close(gm(a, b), model(a, b))


def test_an_outside_user_of_an_internal_node_blocks_the_rewrite():
    def model(a):
        s = torch.sigmoid(a)
        return a * s + s

    gm = fxloom.symbolic_trace(model)
    before = snapshot(gm)
    assert replace_pattern(gm, lambda x: x * torch.sigmoid(x), lambda x: F.silu(x)) == []
    assert same_snapshot(snapshot(gm), before)


def test_any_and_ignore_literals_in_rewrites():
    gm = fxloom.symbolic_trace(lambda a: torch.clamp(a, 0.0, 6.0) + torch.clamp(a, -1.0, 6.0))
    assert len(replace_pattern(gm, lambda x: torch.clamp(x, ANY, 6.0), lambda x: x)) == 2
    gm = fxloom.symbolic_trace(lambda a: torch.clamp(a, 0.0, 1.0) + torch.clamp(a, -1.0, 6.0))
    done = replace_pattern_with_filters(
        gm, lambda x: torch.clamp(x, 0.0, 6.0), lambda x: x, ignore_literals=True
    )
    assert len(done) == 2


# ----------------------------------------------------- names, meta, module
def test_surviving_nodes_keep_their_names_and_new_ones_get_fresh_names():
    gm = fxloom.symbolic_trace(lambda a: torch.sigmoid(torch.relu(a) + 1))
    replace_pattern(gm, lambda x: torch.relu(x), lambda x: torch.sigmoid(x))
    assert names(gm) == ["a", "sigmoid_1", "add", "sigmoid", "output"]


class Activation(nn.Module):
    def forward(self, x):
        return torch.relu(x + 1)


class WithActivation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = Activation()

    def forward(self, x):
        return self.act(x) * 2


def test_new_nodes_inherit_stack_trace_and_module_stack_from_the_anchor_only():
    graph = fxloom.Tracer(record_stack_traces=True).trace(WithActivation())
    gm = fxloom.GraphModule(WithActivation(), graph)
    relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
    relu.meta["tensor_meta"] = "stale"
    assert "act" in str(relu.meta["nn_module_stack"])
    (done,) = replace_pattern_with_filters(
        gm, lambda x: torch.relu(x), lambda x: torch.sigmoid(x) * 2
    )
    for new in done.replacements:
        assert new.meta.keys() == {"stack_trace", "source_location", "nn_module_stack"}
        assert new.meta["nn_module_stack"] == relu.meta["nn_module_stack"]
        assert new.meta["nn_module_stack"] is not relu.meta["nn_module_stack"]  # a copy
        assert "torch.relu(x + 1)" in new.meta["stack_trace"]


def test_surviving_nodes_keep_their_meta():
    graph = fxloom.Tracer(record_stack_traces=True).trace(WithActivation())
    gm = fxloom.GraphModule(WithActivation(), graph)
    before = {n.name: dict(n.meta) for n in gm.graph.nodes}
    replace_pattern(gm, lambda x: torch.relu(x), lambda x: torch.sigmoid(x))
    kept = {n.name: n.meta for n in gm.graph.nodes if n.name in before}
    assert kept.keys() == before.keys() - {"relu"}
    assert all(kept[name] == before[name] for name in kept)


def test_the_result_lints_and_its_code_is_regenerated():
    gm = fxloom.symbolic_trace(lambda a: torch.relu(a))
    replace_pattern(gm, lambda x: torch.relu(x), lambda x: torch.sigmoid(x))
    gm.graph.lint()
    assert "torch.sigmoid(a)" in gm.code and "relu" not in gm.code


class AddScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x):
        return x * self.scale


def test_attributes_of_a_replacement_module_are_copied_in():
    gm = fxloom.symbolic_trace(lambda a: torch.relu(a))
    replacement = AddScale()
    replace_pattern(gm, lambda x: torch.relu(x), replacement)
    assert gm.scale is not replacement.scale  # a copy, not shared with the replacement
    assert_close(gm.scale, replacement.scale)
    assert gm(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]


def test_a_copied_attribute_takes_a_free_name_when_the_name_is_taken():
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.full((3,), 5.0))

        def forward(self, x):
            return torch.relu(x) * self.scale

    gm = fxloom.symbolic_trace(Model())
    replace_pattern(gm, lambda x: torch.relu(x), AddScale())
    assert gm.scale.tolist() == [5.0, 5.0, 5.0] and gm.scale_1.tolist() == [2.0, 2.0, 2.0]
    assert gm(torch.ones(3)).tolist() == [10.0, 10.0, 10.0]


def test_a_replacement_can_reuse_the_matched_module():
    class ConvReLU(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 1, 1)

        def forward(self, x):
            return torch.relu(self.conv(x))

    class ConvGELU(ConvReLU):
        def forward(self, x):
            return F.gelu(self.conv(x))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(1, 1, 1), nn.Conv2d(1, 1, 1))

        def forward(self, x):
            return torch.relu(self.features[1](torch.relu(self.features[0](x))))

    model = Model().eval()
    gm = fxloom.symbolic_trace(model)
    assert len(replace_pattern(gm, ConvReLU(), ConvGELU())) == 2
    calls = [(n.op, n.target) for n in gm.graph.nodes if n.op.startswith("call")]
    assert calls == [
        ("call_module", "features.0"),
        ("call_function", F.gelu),
        ("call_module", "features.1"),
        ("call_function", F.gelu),
    ]
    x = torch.randn(1, 1, 4, 4)
    expected = F.gelu(model.features[1](F.gelu(model.features[0](x))))
    assert_close(gm(x), expected)
    assert not hasattr(gm, "conv")  # nothing copied in: the graph's own convs are used


# ------------------------------------------------------- same as torch.fx
def _relu_chain(a):
    for _ in range(7):
        a = torch.relu(a)
    return a


def _two_cats(x, w1, w2):
    m1 = torch.cat([w1, w2]).sum()
    m2 = torch.cat([w1, w2]).sum()
    return x + torch.max(m1) + torch.max(m2)


DIFFERENTIAL_CASES = {
    "overlapping chain": (
        _relu_chain,
        lambda x: torch.relu(torch.relu(x)),
        lambda x: torch.sigmoid(x),
    ),
    "documented cat/stack": (
        _two_cats,
        lambda a, b: torch.cat([a, b]),
        lambda a, b: torch.stack([a, b]),
    ),
    "two outputs": (
        lambda x, y: (torch.relu(x), torch.sigmoid(x), torch.relu(y), torch.sigmoid(y)),
        lambda x: (torch.relu(x), torch.sigmoid(x)),
        lambda x: (torch.neg(x), torch.exp(x)),
    ),
}


@pytest.mark.parametrize("case", sorted(DIFFERENTIAL_CASES))
def test_the_rewritten_code_is_what_torch_fx_generates(case):
    import torch.fx
    import torch.fx.subgraph_rewriter

    model, pattern, replacement = DIFFERENTIAL_CASES[case]
    ours, theirs = fxloom.symbolic_trace(model), torch.fx.symbolic_trace(model)
    replace_pattern(ours, pattern, replacement)
    torch.fx.subgraph_rewriter.replace_pattern(theirs, pattern, replacement)
    assert ours.code.strip() == theirs.code.strip()


# ------------------------------------------------------------------ bad input
def refused(gm, pattern, replacement, error, message, **options):
    before = snapshot(gm)
    with pytest.raises(error, match=message):
        replace_pattern_with_filters(gm, pattern, replacement, **options)
    assert same_snapshot(snapshot(gm), before)


@pytest.fixture
def relu_module():
    return fxloom.symbolic_trace(lambda a, b: torch.relu(a) * b)


def test_a_pattern_that_is_not_a_graph_or_callable_is_refused(relu_module):
    refused(relu_module, 3, lambda x: x, TypeError, "pattern must be a function.*got int: 3")


def test_a_pattern_with_no_operations_is_refused(relu_module):
    refused(relu_module, lambda x: x, lambda x: x, PatternError, "has no operations")


def test_a_replacement_with_other_inputs_is_refused(relu_module):
    refused(
        relu_module,
        lambda x: torch.relu(x),
        lambda x, y: x,
        PatternError,
        r"replacement takes 2 inputs \(x, y\) but the pattern takes 1 \(x\)",
    )


def test_a_replacement_with_other_outputs_is_refused(relu_module):
    refused(
        relu_module,
        lambda x: torch.relu(x),
        lambda x: (x, x),
        PatternError,
        "replacement returns 2 values but the pattern returns 1",
    )


def test_a_replacement_using_any_is_refused(relu_module):
    refused(
        relu_module,
        lambda x: torch.relu(x),
        lambda x: x * ANY,
        PatternError,
        "ANY belongs in patterns",
    )


def test_a_replacement_returning_an_input_bound_to_a_constant_is_refused():
    gm = fxloom.symbolic_trace(lambda a: torch.add(a, 2))
    refused(gm, lambda x, k: torch.add(x, k), lambda x, k: k, PatternError, "is the constant 2")


def test_a_module_that_is_not_a_graph_module_is_refused():
    with pytest.raises(TypeError, match="rewrites a GraphModule"):
        replace_pattern(nn.ReLU(), lambda x: torch.relu(x), lambda x: x)


def test_an_untraceable_pattern_is_refused(relu_module):
    def pattern(x):
        if x.sum() > 0:
            return torch.relu(x)
        return x

    refused(relu_module, pattern, lambda x: x, PatternError, "could not trace the pattern pattern")


def test_a_failing_match_filter_leaves_the_module_unchanged(relu_module):
    def broken(match, graph, pattern_graph):
        raise RuntimeError("filter broke")

    refused(
        relu_module,
        lambda x: torch.relu(x),
        lambda x: x,
        RuntimeError,
        "filter broke",
        match_filters=[broken],
    )


def test_explain_match_accepts_a_node_name_and_suggests_close_ones(relu_module):
    why = explain_match(relu_module, lambda x: torch.sigmoid(x), "relu")
    assert "differs from the pattern's target torch.sigmoid" in str(why)
    with pytest.raises(ValueError, match="no node named 'rellu'; did you mean relu"):
        explain_match(relu_module, lambda x: torch.relu(x), "rellu")


# ------------------------------------------------------ fxloom.zoo models
def test_mlp_flatten_becomes_a_reshape():
    model, inputs = zoo.build("mlp_tiny")
    gm = fxloom.symbolic_trace(model)
    found = replace_pattern(gm, lambda x: torch.flatten(x, 1), lambda x: x.reshape(x.shape[0], -1))
    assert len(found) == 1 and torch.flatten not in targets(gm)
    assert_close(gm(*inputs), model(*inputs))


def test_resnet_residual_add_and_relu_module_become_functional():
    class AddReLU(nn.Module):  # the pattern: a ReLU module after an addition
        def __init__(self) -> None:
            super().__init__()
            self.relu = nn.ReLU()

        def forward(self, x, identity):
            return self.relu(x + identity)

    model, inputs = zoo.build("resnet_tiny")
    gm = fxloom.symbolic_trace(model)
    relus_before = sum(n.op == "call_module" and "relu" in n.target for n in gm.graph.nodes)
    found = replace_pattern(gm, AddReLU(), lambda x, identity: torch.relu(torch.add(x, identity)))
    assert len(found) == 3  # one per residual block; the other ReLU calls follow a batch norm
    relus_after = sum(n.op == "call_module" and "relu" in n.target for n in gm.graph.nodes)
    assert relus_after == relus_before - 3
    with torch.no_grad():
        assert_close(gm(*inputs), model(*inputs))


def test_transformer_attention_becomes_scaled_dot_product_attention():
    def attention(q, k, v, mask, scale):
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        return torch.matmul((scores + mask).softmax(dim=-1), v)

    def fused(q, k, v, mask, scale):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    model, inputs = zoo.build("transformer_tiny")
    gm = fxloom.symbolic_trace(model)
    found = replace_pattern(gm, attention, fused)
    assert len(found) == 2
    assert all(
        m.nodes_map[next(p for p in m.nodes_map if p.name == "scale")] == 0.25 for m in found
    )
    with torch.no_grad():
        assert_close(gm(*inputs), model(*inputs), atol=1e-5, rtol=1e-5)


# --------------------------------------------------- Hugging Face models
def same_outputs(model, gm, inputs, **tolerance):
    with torch.no_grad():
        assert_close(gm(**inputs)[0], model(**inputs)[0], **tolerance)


def test_gpt2_tanh_gelu_formula_becomes_one_gelu(traced_hf):
    model, inputs, _, gm = traced_hf("gpt2")

    def gelu_new(x):  # transformers' NewGELUActivation; sqrt(2 / pi) spelled as ANY
        return 0.5 * x * (1.0 + torch.tanh(ANY * (x + 0.044715 * torch.pow(x, 3.0))))

    found = replace_pattern(gm, gelu_new, lambda x: F.gelu(x, approximate="tanh"))
    assert len(found) == model.config.n_layer
    assert torch.tanh not in targets(gm)
    same_outputs(model, gm, inputs, atol=1e-5, rtol=1e-5)


def test_llama_silu_becomes_x_times_sigmoid(traced_hf):
    model, inputs, _, gm = traced_hf("llama")
    found = replace_pattern(gm, lambda x: F.silu(x, inplace=False), lambda x: x * torch.sigmoid(x))
    assert len(found) == model.config.num_hidden_layers
    same_outputs(model, gm, inputs, atol=1e-5, rtol=1e-5)


def test_llama_rms_norm_becomes_torch_rms_norm_with_the_matched_epsilon(traced_hf):
    model, inputs, _, gm = traced_hf("llama")

    def rms_norm(h, weight, eps):  # after the cast to float32, which the residual also uses
        return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(torch.float32)

    def fused(h, weight, eps):
        return torch.rms_norm(h, [h.shape[-1]], weight, eps)

    found = replace_pattern(gm, rms_norm, fused)
    layers = model.config.num_hidden_layers
    assert len(found) == 2 * layers + 1  # two per layer and the final norm
    assert {m.nodes_map[next(p for p in m.nodes_map if p.name == "eps")] for m in found} == {
        model.config.rms_norm_eps
    }
    same_outputs(model, gm, inputs, atol=1e-5, rtol=1e-5)


def test_llama_explains_why_a_norm_with_another_epsilon_does_not_match(traced_hf):
    gm = traced_hf("llama").gm

    def rms_norm_1e5(h, weight):
        return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.float32)

    assert replace_pattern(copy.deepcopy(gm), rms_norm_1e5, lambda h, weight: h) == []
    first_rsqrt = next(n for n in gm.graph.nodes if n.target is torch.rsqrt)
    why = explain_match(gm, rms_norm_1e5, first_rsqrt)
    epsilon_add = first_rsqrt.args[0]
    assert why.reasons == [
        f"as %rsqrt: %{epsilon_add.name}: argument 1 is 1e-06, the pattern's %add has 1e-05"
    ]


def test_bert_gelu_becomes_its_erf_formula(traced_hf):
    model, inputs, _, gm = traced_hf("bert")
    found = replace_pattern(
        gm,
        lambda x: F.gelu(x),
        lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))),
    )
    assert len(found) == model.config.num_hidden_layers
    same_outputs(model, gm, inputs, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ benchmark
def test_bench_rewrite_quick_runs_and_prints_its_table(quick_benchmark):
    assert "### Subgraph rewriting" in quick_benchmark("bench_rewrite.py", timeout=120)
