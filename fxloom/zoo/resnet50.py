"""``resnet50``: the ResNet-50 of He et al. (2015), layer for layer, with seeded random weights.

The zoo's full-size convolutional model, for the passes that are judged on a real network:
cost analysis (about 4.1 GMACs and 25.6 M parameters at 224x224), shape propagation on the
meta device, conv/batch-norm fusion and its latency. Layout: a 7x7/2 stem with batch norm,
ReLU and a 3x3/2 max pool; four stages of bottleneck blocks ([3, 4, 6, 3] blocks; 1x1 reduce,
3x3, 1x1 expand by 4, stride on the 3x3 as in the common "v1.5" variant; a 1x1 conv + batch
norm shortcut where the shape changes); global average pooling and a 1000-way linear head.

Input: a float tensor of shape (N, 3, H, W), H and W >= 32; example: (1, 3, 224, 224).

Depends on: torch.
"""

from __future__ import annotations

import torch
from torch import nn

from fxloom.zoo._seed import generator, seeded

__all__ = ["Bottleneck", "ResNet50", "resnet50", "resnet50_inputs"]

STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (width, blocks, first stride)
EXPANSION = 4


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand, each with batch norm; residual add."""

    def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = width * EXPANSION
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + shortcut)


class ResNet50(nn.Module):
    """Stem, four bottleneck stages (``layer1`` .. ``layer4``), average pool, ``fc`` head."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_channels = 64
        for index, (width, blocks, stride) in enumerate(STAGES, start=1):
            layers = []
            for block in range(blocks):
                layers.append(Bottleneck(in_channels, width, stride if block == 0 else 1))
                in_channels = width * EXPANSION
            self.add_module(f"layer{index}", nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet50(seed: int = 0) -> ResNet50:
    """A ``ResNet50`` with seeded weights and non-trivial batch-norm statistics, in eval mode."""
    with seeded(seed):
        model = ResNet50()
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                # Fresh batch norms are identities in eval mode; random statistics make them
                # count (fusion must fold real numbers).
                channels = module.num_features
                with torch.no_grad():
                    module.running_mean.copy_(torch.randn(channels) * 0.1)
                    module.running_var.copy_(torch.rand(channels) + 0.5)
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.normal_(std=0.1)
    return model.eval()


def resnet50_inputs(seed: int = 0) -> tuple[torch.Tensor]:
    """One 3x224x224 image."""
    return (torch.randn(1, 3, 224, 224, generator=generator(seed)),)
