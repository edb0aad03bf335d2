"""``resnet50``: the ResNet-50 of He et al. (2015), layer for layer, with seeded random weights.

The zoo's full-size convolutional model, for the passes that are judged on a real network:
cost analysis (about 4.1 GMACs and 25.6 M parameters at 224x224), shape propagation on the
meta device, conv/batch-norm fusion and its latency. Layout: a 7x7/2 stem with batch norm,
ReLU and a 3x3/2 max pool; four stages of bottleneck blocks ([3, 4, 6, 3] blocks; 1x1 reduce,
3x3, 1x1 expand by 4, stride on the 3x3 as in the common "v1.5" variant; a 1x1 conv + batch
norm shortcut where the shape changes); global average pooling and a 1000-way linear head.
``ResNet50(base_width=8)`` and the like build the same layout with fewer channels, a
cheap stand-in (the tracing benchmark's ``resnet50_like``).

Input: a float tensor of shape (N, 3, H, W), H and W >= 32; example: (1, 3, 224, 224).

Depends on: torch.
"""

from __future__ import annotations

import torch
from torch import nn

from fxloom.zoo._seed import generator, randomize_batch_norms, seeded

__all__ = ["Bottleneck", "ResNet50", "resnet50", "resnet50_inputs"]

# (blocks, stride of the first block) per stage; stage i is base_width * 2**i wide.
STAGES = ((3, 1), (4, 2), (6, 2), (3, 2))
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
    """Stem, four bottleneck stages (``layer1`` .. ``layer4``), average pool, ``fc`` head.

    ``base_width`` is the stem's channels and the first stage's bottleneck width; each later
    stage doubles it. The default, 64, is the standard ResNet-50; a smaller one keeps the
    layout (same layers and graph, fewer channels) for a cheap stand-in.

    >>> model = ResNet50(num_classes=10, base_width=8).eval()
    >>> model(torch.randn(1, 3, 32, 32)).shape
    torch.Size([1, 10])
    >>> model.fc.in_features  # 8 * 2**3 * 4: the last stage's width, expanded
    256
    """

    def __init__(self, num_classes: int = 1000, base_width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, base_width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_channels = base_width
        for index, (blocks, stride) in enumerate(STAGES):
            width = base_width * 2**index
            layers = []
            for block in range(blocks):
                layers.append(Bottleneck(in_channels, width, stride if block == 0 else 1))
                in_channels = width * EXPANSION
            self.add_module(f"layer{index + 1}", nn.Sequential(*layers))
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
        randomize_batch_norms(model)
    return model.eval()


def resnet50_inputs(seed: int = 0) -> tuple[torch.Tensor]:
    """One 3x224x224 image."""
    return (torch.randn(1, 3, 224, 224, generator=generator(seed)),)
