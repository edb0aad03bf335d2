"""The embedded reference models (``fxloom.zoo``): the registry, and symbolic tracing of each model.

Every model must run eagerly, trace with ``fxloom.symbolic_trace``, lint, and compute what
eager PyTorch computes; ``torch.fx.symbolic_trace`` on the same model is the sanity check
(imported here only to compare with). Model-specific tests check that the graph records
what the model is there to exercise: residual adds, the downsample path, sizes read from
the input, ``torch.arange`` with a traced length, the optional attention mask.
"""

from __future__ import annotations

import operator
from collections import Counter

import pytest
import torch
import torch.fx
from torch.testing import assert_close

import fxloom
from fxloom import zoo
from fxloom.zoo.transformer import causal_mask


def traceable(names):
    """``names`` as pytest params (a place to mark a model that fxloom cannot trace yet)."""
    return [pytest.param(name) for name in names]


ALL_MODELS = sorted(zoo.MODELS)


def op_counts(graph: fxloom.Graph) -> Counter:
    return Counter(node.op for node in graph.nodes)


def call_functions(graph: fxloom.Graph, target) -> list[fxloom.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target is target]


def call_module_targets(graph) -> list[str]:
    return [n.target for n in graph.nodes if n.op == "call_module"]


# ------------------------------------------------------------------ registry
def test_build_returns_a_model_in_eval_mode_and_a_tuple_of_inputs() -> None:
    for name in ALL_MODELS:
        model, inputs = zoo.build(name)
        assert isinstance(model, torch.nn.Module)
        assert not model.training, name
        assert isinstance(inputs, tuple) and inputs, name


def test_every_entry_is_named_for_its_key_and_described_in_one_line() -> None:
    assert {"mlp_tiny", "resnet_tiny", "transformer_tiny"} <= set(zoo.MODELS)
    for name, entry in zoo.MODELS.items():
        assert entry.name == name
        assert entry.description and "\n" not in entry.description


def test_an_unknown_name_raises_key_error_listing_the_models() -> None:
    with pytest.raises(KeyError, match="no zoo model named 'resnet18'") as info:
        zoo.build("resnet18")
    for name in ALL_MODELS:
        assert name in str(info.value)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_models_and_inputs_are_deterministic(name: str) -> None:
    first_model, first_inputs = zoo.build(name)
    second_model, second_inputs = zoo.build(name)
    assert_close(first_model.state_dict(), second_model.state_dict(), rtol=0, atol=0)
    assert_close(first_inputs, second_inputs, rtol=0, atol=0)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_the_seed_changes_the_weights(name: str) -> None:
    default, _ = zoo.build(name)
    other, _ = zoo.build(name, seed=1)
    default_state, other_state = default.state_dict(), other.state_dict()
    assert any(not torch.equal(default_state[k], other_state[k]) for k in default_state)


def test_building_leaves_the_global_rng_alone() -> None:
    state = torch.get_rng_state()
    for name in ALL_MODELS:
        zoo.build(name)
    assert torch.equal(torch.get_rng_state(), state)


# ----------------------------------------------------------- every model
@pytest.mark.parametrize("name", ALL_MODELS)
def test_runs_eagerly_with_its_example_inputs(name: str) -> None:
    model, inputs = zoo.build(name)
    with torch.no_grad():
        output = model(*inputs)
    assert torch.isfinite(output).all()


@pytest.mark.parametrize("name", traceable(ALL_MODELS))
def test_traces_into_a_graph_module_that_lints(name: str) -> None:
    model, _ = zoo.build(name)
    traced = fxloom.symbolic_trace(model)
    assert isinstance(traced, fxloom.GraphModule)
    assert type(traced).__name__ == type(model).__name__
    traced.graph.lint(traced)
    assert "def forward" in traced.code


@pytest.mark.parametrize("name", traceable(ALL_MODELS))
def test_traced_module_matches_eager(name: str) -> None:
    model, inputs = zoo.build(name)
    traced = fxloom.symbolic_trace(model)
    with torch.no_grad():
        assert_close(traced(*inputs), model(*inputs))


@pytest.mark.parametrize("name", traceable(ALL_MODELS))
def test_matches_torch_fx_outputs_and_module_calls(name: str) -> None:
    model, inputs = zoo.build(name)
    ours = fxloom.symbolic_trace(model)
    theirs = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        assert_close(ours(*inputs), theirs(*inputs))
    assert call_module_targets(ours.graph) == call_module_targets(theirs.graph)


# ------------------------------------------------------------------ resnet_tiny
@pytest.fixture(scope="module")
def traced_resnet() -> fxloom.GraphModule:
    model, _ = zoo.build("resnet_tiny")
    return fxloom.symbolic_trace(model)


def test_resnet_layers_are_call_modules_in_order(traced_resnet) -> None:
    targets = call_module_targets(traced_resnet.graph)
    assert targets[:4] == ["conv1", "bn1", "relu", "maxpool"]
    assert targets[-2:] == ["avgpool", "fc"]
    for stage in range(3):
        assert f"layers.{stage}.conv1" in targets
        assert f"layers.{stage}.bn2" in targets


def test_resnet_downsample_path_is_a_1x1_conv_and_batch_norm(traced_resnet) -> None:
    targets = call_module_targets(traced_resnet.graph)
    assert "layers.0.downsample.0" not in targets  # same shape: identity shortcut
    for stage in (1, 2):
        assert f"layers.{stage}.downsample.0" in targets
        assert f"layers.{stage}.downsample.1" in targets
        conv = traced_resnet.get_submodule(f"layers.{stage}.downsample.0")
        assert conv.kernel_size == (1, 1) and conv.stride == (2, 2)


def test_resnet_residual_adds_are_call_functions_joining_two_paths(traced_resnet) -> None:
    adds = call_functions(traced_resnet.graph, operator.add)
    assert len(adds) == 3  # one per block
    downsampled = adds[1].args[1]
    assert downsampled.op == "call_module" and downsampled.target == "layers.1.downsample.1"
    assert adds[0].args[1].target == "maxpool"  # identity shortcut


def test_resnet_flatten_is_recorded_and_not_frozen_to_the_example_batch(traced_resnet) -> None:
    assert len(call_functions(traced_resnet.graph, torch.flatten)) == 1
    model, _ = zoo.build("resnet_tiny")
    batch = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert_close(traced_resnet(batch), model(batch))


def test_resnet_batch_norm_statistics_are_not_trivial() -> None:
    model, inputs = zoo.build("resnet_tiny")
    bn = model.bn1
    assert not torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))
    assert not torch.equal(bn.running_var, torch.ones_like(bn.running_var))


def test_resnet_stack_traces_name_the_model_source_line() -> None:
    model, _ = zoo.build("resnet_tiny")
    graph = fxloom.Tracer(record_stack_traces=True).trace(model)
    first_add = call_functions(graph, operator.add)[0]
    assert "resnet.py" in first_add.meta["stack_trace"]
    assert "out + shortcut" in first_add.meta["stack_trace"]


# ------------------------------------------------------------- transformer_tiny


def test_transformer_arange_takes_the_traced_sequence_length() -> None:
    model, _ = zoo.build("transformer_tiny")
    graph = fxloom.symbolic_trace(model).graph
    (arange,) = call_functions(graph, torch.arange)
    (length,) = arange.args
    assert isinstance(length, fxloom.Node)  # read from tokens.shape, not the constant 16
    assert length.target is operator.getitem
    assert arange.users and next(iter(arange.users)).target == "position_embedding"


def test_transformer_records_hand_written_attention() -> None:
    model, _ = zoo.build("transformer_tiny")
    graph = fxloom.symbolic_trace(model).graph
    methods = Counter(n.target for n in graph.nodes if n.op == "call_method")
    per_layer = {"view": 1, "permute": 1, "unbind": 1, "transpose": 2, "softmax": 1, "reshape": 1}
    for method, count in per_layer.items():
        assert methods[method] == 2 * count, method
    assert len(call_functions(graph, torch.matmul)) == 4
    views = [n for n in graph.nodes if n.op == "call_method" and n.target == "view"]
    assert all(isinstance(size, fxloom.Node) for size in views[0].args[1:3])  # batch, seq_len


def test_transformer_with_a_mask_input_adds_it_in_every_layer() -> None:
    model, inputs = zoo.build("transformer_tiny")
    traced = fxloom.symbolic_trace(model)
    placeholders = [n.target for n in traced.graph.nodes if n.op == "placeholder"]
    assert placeholders == ["tokens", "mask"]
    (mask,) = [n for n in traced.graph.nodes if n.target == "mask"]
    assert len(mask.users) == 2  # one `scores + mask` per layer
    # 1 embedding sum + per layer (mask add + 2 residuals)
    assert len(call_functions(traced.graph, operator.add)) == 7


def test_transformer_traced_without_mask_drops_the_branch() -> None:
    model, (tokens, _) = zoo.build("transformer_tiny")
    traced = fxloom.symbolic_trace(model, concrete_args={"mask": None})
    assert len(call_functions(traced.graph, operator.add)) == 5
    with torch.no_grad():
        assert_close(traced(tokens), model(tokens))


def test_transformer_traced_sizes_follow_a_new_input_shape() -> None:
    model, _ = zoo.build("transformer_tiny")
    traced = fxloom.symbolic_trace(model)
    tokens = torch.randint(0, 100, (3, 10))
    with torch.no_grad():
        assert_close(traced(tokens, causal_mask(10)), model(tokens, causal_mask(10)))


def test_transformer_without_mask_matches_torch_fx() -> None:
    model, (tokens, _) = zoo.build("transformer_tiny")
    ours = fxloom.symbolic_trace(model, concrete_args={"mask": None})
    theirs = torch.fx.symbolic_trace(model, concrete_args={"mask": None})
    with torch.no_grad():
        assert_close(ours(tokens), theirs(tokens))


def test_causal_mask_blocks_only_the_future() -> None:
    mask = causal_mask(4)
    assert torch.equal(mask.tril(), torch.zeros(4, 4))
    assert torch.isinf(mask.triu(1)[0, 1:]).all()


# ---------------------------------------------------------------- mlp_tiny
def test_mlp_sequential_is_traced_through_into_one_call_per_layer() -> None:
    model, _ = zoo.build("mlp_tiny")
    graph = fxloom.symbolic_trace(model).graph
    assert call_module_targets(graph) == [f"layers.{i}" for i in range(5)]
    assert op_counts(graph) == Counter(
        {"placeholder": 1, "call_function": 1, "call_module": 5, "output": 1}
    )
