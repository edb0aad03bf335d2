"""Conv/linear + batch-norm fusion (``fxloom.passes.fuse``): what folds, what stays, what it keeps.

Numerics are checked against the unfused eager model in float64 (rtol 1e-5, atol 1e-8; the
fold itself is exact up to rounding) and loosely in float32.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxloom
from fxloom import zoo
from fxloom._notes import notes_of
from fxloom.passes.fuse import (
    FUSION_RULES,
    FusionError,
    fold_conv,
    fuse,
    fuse_conv_bn_weights,
    fuse_linear_bn_weights,
)

TIGHT = {"rtol": 1e-5, "atol": 1e-8}
BATCH_NORMS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
CONV_TRANSPOSES = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
FUNCTIONAL_CONVS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
FUNCTIONAL_CONV_TRANSPOSES = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


# ----------------------------------------------------------------------------- models
def with_statistics(model: nn.Module, seed: int = 0) -> nn.Module:
    """``model`` in eval mode with random batch-norm statistics (fresh ones are identities)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                n = module.num_features
                if module.running_mean is not None:
                    module.running_mean.copy_(torch.randn(n, generator=generator))
                    module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                if module.affine:
                    module.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                    module.bias.copy_(torch.randn(n, generator=generator))
    return model.eval()


def batch_norm(norm: nn.Module, form: str, y: torch.Tensor) -> torch.Tensor:
    """``norm(y)`` called as the module, ``F.batch_norm`` or ``torch.batch_norm``."""
    if form == "module":
        return norm(y)
    if form == "F.batch_norm":
        return F.batch_norm(
            y, norm.running_mean, norm.running_var, norm.weight, norm.bias, False, 0.1, norm.eps
        )
    return torch.batch_norm(
        y, norm.weight, norm.bias, norm.running_mean, norm.running_var, False, 0.1, norm.eps, True
    )


class ConvThenNorm(nn.Module):
    """A convolution (module or ``F.conv*d`` on its weights), then a batch norm in ``norm_form``."""

    def __init__(self, dims: int, layer_form: str, norm_form: str, **options) -> None:
        super().__init__()
        self.dims, self.layer_form, self.norm_form = dims, layer_form, norm_form
        self.conv = CONVS[dims](3, 8, 3, padding=1, bias=options.get("bias", True))
        self.norm = BATCH_NORMS[dims](8, affine=options.get("affine", True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer_form == "module":
            y = self.conv(x)
        else:
            y = FUNCTIONAL_CONVS[self.dims](x, self.conv.weight, self.conv.bias, 1, 1)
        return torch.relu(batch_norm(self.norm, self.norm_form, y))


class ConvTransposeThenNorm(nn.Module):
    """A strided, grouped transposed convolution (module or functional), then a batch norm."""

    def __init__(self, dims: int, layer_form: str) -> None:
        super().__init__()
        self.dims, self.layer_form = dims, layer_form
        self.conv = CONV_TRANSPOSES[dims](4, 6, 3, stride=2, padding=1, groups=2)
        self.norm = BATCH_NORMS[dims](6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer_form == "module":
            return self.norm(self.conv(x))
        fn = FUNCTIONAL_CONV_TRANSPOSES[self.dims]
        return self.norm(fn(x, self.conv.weight, self.conv.bias, 2, 1, 0, 2))


class LinearThenNorm(nn.Module):
    def __init__(self, layer_form: str, norm_form: str) -> None:
        super().__init__()
        self.layer_form, self.norm_form = layer_form, norm_form
        self.fc = nn.Linear(5, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x) if self.layer_form == "module" else F.linear(x, self.fc.weight, self.fc.bias)
        return batch_norm(self.norm, self.norm_form, y)


class Branching(nn.Module):
    """conv -> bn, but the conv's output is also added to the result."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.bn(y) + y


class SharedConv(nn.Module):
    """One conv module called twice, each call followed by its own batch norm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn_a = nn.BatchNorm2d(3)
        self.bn_b = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn_a(self.conv(x)) + self.bn_b(self.conv(x * 2))


class ConvWeightReadElsewhere(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) * self.conv.weight.sum()


class SharedBatchNorm(nn.Module):
    """One batch-norm module after two different convs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_a = nn.Conv2d(3, 4, 3, padding=1)
        self.conv_b = nn.Conv2d(3, 4, 1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv_a(x)) - self.bn(self.conv_b(x))


class TwoNormsInARow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn1 = nn.BatchNorm2d(4)
        self.bn2 = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.bn1(self.conv(x)))


def conv_bn() -> nn.Module:
    return with_statistics(ConvThenNorm(2, "module", "module"))


def image(channels: int = 3, dims: int = 2, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(2, channels, *[6] * dims, generator=generator, dtype=dtype)


def assert_fused_matches(model: nn.Module, *inputs: torch.Tensor, pairs: int) -> fxloom.GraphModule:
    """Fuse ``model``; check the number of folded pairs and the output against eager."""
    fused = fuse(model)
    assert len(fused.meta["fuse"]["fused"]) == pairs, fused.meta["fuse"]
    with torch.no_grad():
        torch.testing.assert_close(fused(*inputs), model(*inputs), **TIGHT)
    return fused


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in module.state_dict().items()}


def assert_same_state(module: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = module.state_dict()
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name


# ----------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("norm_form", ["module", "F.batch_norm", "torch.batch_norm"])
@pytest.mark.parametrize("layer_form", ["module", "function"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_conv_and_batch_norm_fold_in_every_form(dims, layer_form, norm_form):
    model = with_statistics(ConvThenNorm(dims, layer_form, norm_form)).double()
    assert_fused_matches(model, image(dims=dims), pairs=1)


@pytest.mark.parametrize("layer_form", ["module", "function"])
def test_conv_without_bias_and_batch_norm_without_affine_fold(layer_form):
    model = ConvThenNorm(2, layer_form, "module", bias=False, affine=False)
    assert_fused_matches(with_statistics(model).double(), image(), pairs=1)


@pytest.mark.parametrize("layer_form", ["module", "function"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_grouped_strided_transposed_conv_and_batch_norm_fold(dims, layer_form):
    model = with_statistics(ConvTransposeThenNorm(dims, layer_form)).double()
    assert_fused_matches(model, image(channels=4, dims=dims), pairs=1)


@pytest.mark.parametrize("norm_form", ["module", "F.batch_norm", "torch.batch_norm"])
@pytest.mark.parametrize("layer_form", ["module", "function"])
def test_linear_and_batch_norm_1d_fold(layer_form, norm_form):
    model = with_statistics(LinearThenNorm(layer_form, norm_form)).double()
    x = torch.randn(3, 5, dtype=torch.float64)
    assert_fused_matches(model, x, pairs=1)


def test_float32_fold_is_close_to_eager():
    model = with_statistics(ConvThenNorm(2, "module", "module"))
    fused = fuse(model)
    x = image(dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-4, atol=1e-5)


def test_resnet_tiny_fused_matches_eager():
    model, (x,) = zoo.build("resnet_tiny")
    fused = assert_fused_matches(model.double(), x.double(), pairs=9)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fused.modules())


def test_resnet50_fused_matches_eager_at_64x64():
    model, _ = zoo.build("resnet50")
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    fused = fuse(model)  # float32 first (the model as built), then the same in float64
    assert len(fused.meta["fuse"]["fused"]) == 53 and not fused.meta["fuse"]["unfused"]
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-3, atol=1e-4)
        model64, x64 = model.double(), x.double()
        torch.testing.assert_close(fuse(model64)(x64), model64(x64), **TIGHT)


@pytest.mark.parametrize("name", ["resnet", "regnet", "mobilenet_v2"])
def test_hugging_face_cnn_fused_matches_eager(name, traced_hf):
    def float64_with_statistics(model, inputs):
        return with_statistics(model.double()), {k: v.double() for k, v in inputs.items()}

    cnn = traced_hf(name, prepare=float64_with_statistics)
    fused = fuse(cnn.gm)
    assert fused.meta["fuse"]["fused"] and not fused.meta["fuse"]["unfused"]
    with torch.no_grad():
        torch.testing.assert_close(fused(**cnn.inputs), cnn.gm(**cnn.inputs), **TIGHT)
        torch.testing.assert_close(fused(**cnn.inputs)[0], cnn.eager()[0], **TIGHT)


def test_weights_helper_folds_a_grouped_transposed_conv():
    conv = nn.ConvTranspose2d(4, 6, 3, groups=2).double()
    bn = with_statistics(nn.BatchNorm2d(6)).double()
    weight, bias = fuse_conv_bn_weights(
        conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias,
        transpose=True, groups=2,
    )  # fmt: skip
    x = image(channels=4)
    expected = bn(conv(x))
    torch.testing.assert_close(F.conv_transpose2d(x, weight, bias, groups=2), expected, **TIGHT)


def test_weights_helpers_return_new_tensors_in_the_layers_dtype():
    linear = nn.Linear(3, 2).half()
    bn = with_statistics(nn.BatchNorm1d(2))
    weight, bias = fuse_linear_bn_weights(
        linear.weight, None, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias
    )
    assert weight.dtype == bias.dtype == torch.float16
    assert not weight.requires_grad and weight.data_ptr() != linear.weight.data_ptr()


# ----------------------------------------------------------------------------- left unfused
def test_conv_whose_output_has_another_user_is_left_unfused():
    model = with_statistics(Branching()).double()
    fused = assert_fused_matches(model, image(), pairs=0)
    assert fused.meta["fuse"]["unfused"] == {"bn": "the output of %conv is also used by %add"}


def test_batch_norm_without_running_statistics_is_left_unfused():
    model = ConvThenNorm(2, "module", "module")
    model.norm = nn.BatchNorm2d(8, track_running_stats=False)
    fused = assert_fused_matches(model.eval().double(), image(), pairs=0)
    assert "track_running_stats=False" in fused.meta["fuse"]["unfused"]["norm"]


def test_linear_with_3d_output_per_shape_metadata_is_left_unfused():
    from fxloom.passes.shape_prop import ShapeProp

    # Linear(5, 4) on (N, 4, 5) gives (N, 4, 4): BatchNorm1d(4) normalizes dim 1, not the
    # linear layer's 4 features, so folding would be wrong although every size matches.
    model = with_statistics(LinearThenNorm("module", "module")).double()
    x = torch.randn(2, 4, 5, dtype=torch.float64)
    gm = fxloom.symbolic_trace(model)
    ShapeProp(gm).propagate(x)
    fused = fuse(gm)
    assert "3-D" in fused.meta["fuse"]["unfused"]["norm"]
    torch.testing.assert_close(fused(x), model(x), **TIGHT)


def test_batch_norm_over_other_channels_than_the_linear_features_is_left_unfused():
    model = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(4))  # (N, 4, 5) -> (N, 4, 6)
    model = with_statistics(model).double()
    fused = assert_fused_matches(model, torch.randn(2, 4, 5, dtype=torch.float64), pairs=0)
    assert "4 channels" in fused.meta["fuse"]["unfused"]["_1"]


def test_batch_norm_after_something_else_is_reported_and_left():
    model = with_statistics(nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.BatchNorm2d(4)))
    fused = assert_fused_matches(model.double(), image(), pairs=0)
    assert "is not a convolution or linear layer" in fused.meta["fuse"]["unfused"]["_2"]


def test_functional_batch_norm_with_statistics_computed_at_run_time_is_left_unfused():
    class Net(ConvThenNorm):
        def forward(self, x):
            n = self.norm
            return F.batch_norm(self.conv(x), n.running_mean * 1, n.running_var, training=False)

    fused = assert_fused_matches(
        with_statistics(Net(2, "module", "module")).double(), image(), pairs=0
    )
    assert "not a tensor stored on the module" in fused.meta["fuse"]["unfused"]["batch_norm"]


def test_a_subclass_kept_as_a_leaf_folds_only_once_added_to_the_rules(monkeypatch):
    class MyConv(nn.Conv2d):  # might override forward; the pass cannot know it does not
        pass

    class LeafTracer(fxloom.Tracer):
        def is_leaf_module(self, module, qualified_name):
            return isinstance(module, MyConv) or super().is_leaf_module(module, qualified_name)

    model = ConvThenNorm(2, "module", "module")
    model.conv = MyConv(3, 8, 3, padding=1)
    model = with_statistics(model).double()
    gm = fxloom.GraphModule(model, LeafTracer().trace(model))
    assert_fused_matches(gm, image(), pairs=0)
    monkeypatch.setitem(FUSION_RULES, (MyConv, nn.BatchNorm2d), fold_conv)
    assert_fused_matches(gm, image(), pairs=1)


def test_a_subclass_traced_through_folds_as_the_functions_it_calls():
    class MyConv(nn.Conv2d):
        pass

    model = ConvThenNorm(2, "module", "module")
    model.conv = MyConv(3, 8, 3, padding=1)
    fused = assert_fused_matches(with_statistics(model).double(), image(), pairs=1)
    assert fused.meta["fuse"]["fused"] == [("conv2d", "norm")]


def test_a_conv_with_spectral_norm_is_left_unfused():
    model = ConvThenNorm(2, "module", "module")
    model.conv = nn.utils.spectral_norm(model.conv)  # a pre-hook recomputes the weight
    model = with_statistics(model).double()
    fused = assert_fused_matches(model, image(), pairs=0)
    assert "forward hooks" in fused.meta["fuse"]["unfused"]["norm"]


def test_a_batch_norm_with_a_forward_hook_is_left_unfused():
    model = conv_bn().double()
    model.norm.register_forward_hook(lambda module, args, out: out * 2)
    fused = assert_fused_matches(model, image(), pairs=0)
    assert "forward hooks" in fused.meta["fuse"]["unfused"]["norm"]


def test_a_weight_shared_by_two_functional_convs_folds_into_each():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 3, 3, 3))
            self.bn_a, self.bn_b = nn.BatchNorm2d(4), nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn_a(F.conv2d(x, self.weight)) + self.bn_b(F.conv2d(x, self.weight))

    fused = assert_fused_matches(with_statistics(Net()).double(), image(), pairs=2)
    assert set(fused.state_dict()) == {
        "weight_fused", "weight_bias_fused", "weight_fused_1", "weight_bias_fused_1"
    }  # fmt: skip


def test_a_function_rule_without_parameter_names_says_where_to_add_them(monkeypatch):
    def my_conv(x, weight):
        return F.conv2d(x, weight)

    graph = fxloom.Graph()
    conv = graph.call_function(my_conv, (graph.placeholder("x"), graph.get_attr("conv.weight")))
    graph.output(graph.call_module("norm", (conv,)))
    gm = fxloom.GraphModule(conv_bn(), graph)
    monkeypatch.setitem(FUSION_RULES, (my_conv, nn.BatchNorm2d), fold_conv)
    code, before = gm.code, state(gm)
    with pytest.raises(KeyError, match="names my_conv, but .*add its parameter names there"):
        fuse(gm.eval(), inplace=True)
    assert gm.code == code
    assert_same_state(gm, before)


# ----------------------------------------------------------------------------- training mode
def test_model_in_training_mode_is_refused_and_left_untouched():
    model = conv_bn().train()
    before = state(model)
    with pytest.raises(FusionError, match=r"ConvThenNorm\) is in training mode; call \.eval\(\)"):
        fuse(model)
    assert_same_state(model, before)
    assert model.training and isinstance(model.norm, nn.BatchNorm2d)


def test_batch_norm_in_training_mode_is_refused_naming_its_path():
    model = with_statistics(zoo.build("resnet_tiny")[0])
    model.layers[1].bn2.train()
    with pytest.raises(
        FusionError, match=r"%layers_1_bn2 \(layers\.1\.bn2, a BatchNorm2d\).*\.eval\(\)"
    ):
        fuse(model)


def test_functional_batch_norm_called_with_training_true_is_refused_naming_the_node():
    class Net(ConvThenNorm):
        def forward(self, x):
            n = self.norm
            return F.batch_norm(self.conv(x), n.running_mean, n.running_var, training=True)

    with pytest.raises(FusionError, match=r"%batch_norm calls .*batch_norm with training=True"):
        fuse(Net(2, "module", "module").eval())


def test_refusal_in_place_leaves_the_graph_module_exactly_as_it_was():
    gm = fxloom.symbolic_trace(conv_bn())
    gm.norm.train()
    code, before = gm.code, state(gm)
    modules = dict(gm.named_modules())
    with pytest.raises(FusionError):
        fuse(gm, inplace=True)
    assert gm.code == code and dict(gm.named_modules()) == modules
    assert_same_state(gm, before)
    gm.graph.lint()


# ----------------------------------------------------------------------------- copies
def test_the_input_module_is_not_modified():
    model = with_statistics(zoo.build("resnet_tiny")[0])
    before, modules = state(model), dict(model.named_modules())
    fuse(model)
    assert_same_state(model, before)
    assert dict(model.named_modules()) == modules


def test_the_input_graph_module_is_not_modified():
    gm = fxloom.symbolic_trace(with_statistics(zoo.build("resnet_tiny")[0]))
    code, before, nodes = gm.code, state(gm), len(gm.graph.nodes)
    fused = fuse(gm)
    assert fused is not gm and gm.code == code and len(gm.graph.nodes) == nodes
    assert_same_state(gm, before)


@pytest.mark.parametrize("as_graph_module", [False, True])
def test_the_result_shares_no_tensor_with_the_input(as_graph_module):
    model = with_statistics(zoo.build("resnet_tiny")[0])
    source = fxloom.symbolic_trace(model) if as_graph_module else model
    fused = fuse(source)
    theirs = {t.data_ptr() for t in source.state_dict().values()}
    assert not theirs & {t.data_ptr() for t in fused.state_dict().values()}
    source.train()
    assert not any(m.training for m in fused.modules())


def test_inplace_fuses_the_graph_module_itself():
    gm = fxloom.symbolic_trace(conv_bn())
    assert fuse(gm, inplace=True) is gm
    assert [n.op for n in gm.graph.nodes] == [
        "placeholder",
        "call_module",
        "call_function",
        "output",
    ]
    assert not hasattr(gm, "norm")


def test_inplace_on_a_plain_module_still_leaves_it_unchanged():
    model = conv_bn()
    before = state(model)
    fused = fuse(model, inplace=True)
    assert_same_state(model, before)
    assert isinstance(model.norm, nn.BatchNorm2d) and fused.conv is not model.conv


def test_anything_but_a_module_is_rejected():
    with pytest.raises(TypeError, match="takes an nn.Module or GraphModule, got <class 'int'>"):
        fuse(42)


def test_a_model_that_cannot_be_traced_gets_a_hint_to_trace_it_first():
    class DataDependent(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    with pytest.raises(fxloom.TraceError) as raised:
        fuse(DataDependent().eval())
    assert "trace it yourself" in "\n".join(notes_of(raised.value))


# ----------------------------------------------------------------------------- graph, meta, names
def test_the_layer_node_keeps_its_name_and_meta():
    gm = fxloom.symbolic_trace(conv_bn())
    conv = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "conv")
    meta = dict(conv.meta)
    fuse(gm, inplace=True)
    assert conv in gm.graph.nodes and conv.name == "conv" and conv.meta == meta
    assert "nn_module_stack" in meta and "source_fn_stack" in meta


def test_the_batch_norm_node_is_erased_and_its_users_use_the_layer():
    fused = fuse(conv_bn())
    names = [n.name for n in fused.graph.nodes]
    assert names == ["x", "conv", "relu", "output"]
    relu = next(n for n in fused.graph.nodes if n.name == "relu")
    assert relu.args[0].name == "conv"
    fused.graph.lint()


def test_value_meta_follows_the_batch_norm_value():
    gm = fxloom.symbolic_trace(conv_bn())
    conv, norm = (n for n in gm.graph.nodes if n.op == "call_module")
    conv.meta["val"], norm.meta["val"] = "conv's value", "norm's value"
    norm.meta["tensor_meta"] = "norm's shape"
    fuse(gm, inplace=True)
    assert conv.meta["val"] == "norm's value" and conv.meta["tensor_meta"] == "norm's shape"


def test_no_node_is_renamed():
    model = with_statistics(zoo.build("resnet_tiny")[0])
    gm = fxloom.symbolic_trace(model)
    before = {n.name for n in gm.graph.nodes}
    fused = fuse(gm)
    erased = {bn for _, bn in fused.meta["fuse"]["fused"]}
    assert {n.name for n in fused.graph.nodes} == before - erased


def test_folded_batch_norm_modules_leave_the_module_and_its_state_dict():
    fused = fuse(with_statistics(zoo.build("resnet_tiny")[0]))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fused.modules())
    assert not any("bn" in key or "running" in key for key in fused.state_dict())


def test_a_functional_layer_reads_new_attributes_and_the_old_ones_go():
    model = with_statistics(ConvThenNorm(2, "function", "F.batch_norm"))
    fused = fuse(model)
    assert set(fused.state_dict()) == {"conv.weight_fused", "conv.bias_fused"}
    getattrs = [n.target for n in fused.graph.nodes if n.op == "get_attr"]
    assert getattrs == ["conv.weight_fused", "conv.bias_fused"]
    assert isinstance(fused.conv.weight_fused, nn.Parameter)


def test_a_functional_conv_without_bias_gets_one():
    model = with_statistics(ConvThenNorm(2, "function", "module", bias=False))
    fused = fuse(model)
    assert set(fused.state_dict()) == {"conv.weight_fused", "conv.weight_bias_fused"}


def test_the_report_lists_fused_pairs_and_why_others_were_left():
    model = with_statistics(nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.BatchNorm2d(4)))
    model[2] = nn.BatchNorm2d(4, track_running_stats=False).eval()
    report = fuse(model).meta["fuse"]
    assert report["fused"] == [("_0", "_1")]
    assert list(report["unfused"]) == ["_2"]


# ----------------------------------------------------------------------------- sharing
def test_a_conv_module_called_twice_folds_each_call_into_its_own_copy():
    model = with_statistics(SharedConv()).double()
    fused = assert_fused_matches(model, image(), pairs=2)
    targets = sorted(n.target for n in fused.graph.nodes if n.op == "call_module")
    assert targets == ["conv", "conv_fused"]


def test_a_conv_whose_weight_is_read_elsewhere_keeps_the_original_for_that_read():
    model = with_statistics(ConvWeightReadElsewhere()).double()
    fused = assert_fused_matches(model, image(), pairs=1)
    torch.testing.assert_close(fused.conv.weight, model.conv.weight)  # still the original
    assert isinstance(fused.conv_fused, nn.Conv2d)


def test_a_batch_norm_module_shared_by_two_convs_folds_into_both():
    model = with_statistics(SharedBatchNorm()).double()
    fused = assert_fused_matches(model, image(), pairs=2)
    assert not hasattr(fused, "bn")


def test_two_batch_norms_in_a_row_both_fold():
    model = with_statistics(TwoNormsInARow()).double()
    fused = assert_fused_matches(model, image(), pairs=2)
    assert [n.op for n in fused.graph.nodes] == ["placeholder", "call_module", "output"]


def test_fusing_twice_changes_nothing_more():
    once = fuse(conv_bn())
    twice = fuse(copy.deepcopy(once))
    assert twice.code == once.code and twice.meta["fuse"] == {"fused": [], "unfused": {}}


# ----------------------------------------------------------------------------- benchmark
def test_the_benchmark_runs_in_quick_mode(quick_benchmark):
    out = quick_benchmark("bench_fuse.py")
    assert "### Conv/batch-norm fusion: latency" in out
    assert "### Conv/batch-norm fusion: the pass itself" in out
