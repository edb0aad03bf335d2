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


def features_model(name: str, train: bool) -> torch.nn.Module:
    timm = import_timm()
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, features_only=True, feature_cls="fx")
    return model.train(train)


def run_seeded(model: torch.nn.Module) -> list[torch.Tensor]:
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)
    with torch.no_grad():
        return model(x)


@MODES
@pytest.mark.parametrize("name", MODELS)
def test_fx_features_equal_torch_fx(name: str, train: bool, monkeypatch) -> None:
    expected_model = features_model(name, train)
    expected = run_seeded(expected_model)
    timm_on_fxloom(monkeypatch)
    model = features_model(name, train)
    assert "fxloom" in type(model.graph_module.graph).__module__
    got = run_seeded(model)
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
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
