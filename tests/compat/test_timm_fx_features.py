"""timm's FX feature path (``features_only=True, feature_cls="fx"``, ``FeatureGraphNet``) runs
on fxloom: timm calls torchvision's feature extraction, pointed here at the copy whose torch.fx
import is replaced by fxloom (``tests/compat/clients.py``). Features, node names and parameter
counts equal those timm gets on torch.fx.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.compat.clients import import_timm, timm_on_fxloom

pytestmark = pytest.mark.slow

MODELS = [
    "resnet18",
    "mobilenetv3_small_050",
    "efficientnet_b0",
    "convnext_atto",
    "vit_tiny_patch16_224",
    "swin_tiny_patch4_window7_224",
]
MODES = pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])


def features_model(name: str, train: bool, feature_cls: str = "fx") -> torch.nn.Module:
    timm = import_timm()
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, features_only=True, feature_cls=feature_cls)
    return model.train(train)


def run_seeded(model: torch.nn.Module) -> list[torch.Tensor]:
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)
    with torch.no_grad():
        return model(x)


def drops_paths(model: torch.nn.Module) -> bool:
    """Whether ``model`` in training runs timm's DropPath, whose in-place ``div_`` torch.fx's
    dead-code elimination drops (docs/torch_fx_clients.md): there torch.fx's features are not
    the model's, and fxloom's are compared with eager's instead."""
    return model.training and any(
        type(m).__name__ == "DropPath" and m.drop_prob > 0 for m in model.modules()
    )


def assert_same(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected, strict=True):
        if ours.shape != theirs.shape:  # timm's hook features are NCHW where a Swin's are NHWC
            theirs = theirs.permute(0, 2, 3, 1)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@MODES
@pytest.mark.parametrize("name", MODELS)
def test_fx_features_equal_torch_fx(name: str, train: bool, monkeypatch) -> None:
    expected_model = features_model(name, train)
    expected = run_seeded(expected_model)
    timm_on_fxloom(monkeypatch)
    model = features_model(name, train)
    assert "fxloom" in type(model.graph_module.graph).__module__
    got = run_seeded(model)
    eager_model = features_model(name, train, feature_cls="getter")  # timm's hooks, no tracing
    if drops_paths(eager_model):
        eager = run_seeded(eager_model)
        assert_same(got, eager)
        with pytest.raises(AssertionError):
            assert_same(expected, eager)  # torch.fx dropped the div_
    else:
        assert_same(got, expected)
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in expected_model.parameters()
    )
    copy.deepcopy(model)  # after a run


@pytest.mark.parametrize("name", MODELS)
def test_graph_node_names_equal_torch_fx(name: str, monkeypatch) -> None:
    timm = import_timm()
    from timm.layers import get_graph_node_names

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False)
    expected = get_graph_node_names(model)
    timm_on_fxloom(monkeypatch)
    assert get_graph_node_names(model) == expected
