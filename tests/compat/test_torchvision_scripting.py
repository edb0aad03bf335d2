"""An extractor that torchvision's feature extraction builds on fxloom scripts with TorchScript.

torchvision's own ``test_backbone_utils.py`` (``test_jit_forward_backward``) scripts a train-mode
extractor and runs its forward and backward; TorchScript reads the source of the extractor's
class (torchvision's ``DualGraphModule``), which the fxloom rewrite of its module must provide.
"""

from __future__ import annotations

import pytest
import torch

from tests.compat.clients import fxloom_feature_extraction, import_torchvision

pytestmark = pytest.mark.slow


def test_scripted_extractor_runs_forward_and_backward_like_the_python_one():
    import_torchvision()
    from torchvision import models

    torch.manual_seed(0)
    model = models.resnet18(num_classes=1).eval()  # eval: batch norm reads no batch statistics
    extractor = fxloom_feature_extraction().create_feature_extractor(
        model,
        train_return_nodes=["layer1", "layer2.0.relu"],
        eval_return_nodes=["layer1", "layer3"],
        suppress_diff_warning=True,
    )
    scripted = torch.jit.script(extractor)
    x = torch.randn(1, 3, 64, 64)
    expected, got = extractor(x), scripted(x)
    assert list(got) == list(expected) == ["layer1", "layer3"]
    for name in expected:
        torch.testing.assert_close(got[name], expected[name])
    sum(value.mean() for value in got.values()).backward()
    assert model.conv1.weight.grad is not None
