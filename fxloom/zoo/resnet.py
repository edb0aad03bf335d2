"""``resnet_tiny``: a ResNet-style CNN small enough to trace and run in milliseconds.

It is the zoo's convolutional reference model: a stem (3x3 conv, batch norm, ReLU, max pool),
three stages of basic residual blocks — the second and third halve the resolution and widen
the channels, so their shortcut is a 1x1 conv + batch norm "downsample" path — then adaptive
average pooling, ``torch.flatten`` and a linear classifier. Traced, it exercises
``call_module`` for the built-in layers, ``call_function`` for the residual ``+`` and
``torch.flatten``, and the tracing *through* user-defined blocks and ``nn.Sequential``.

Input: a float tensor of shape (1, 3, 32, 32); output: logits of shape (1, 10).

Depends on: torch.
"""

from __future__ import annotations

import torch
from torch import nn

from fxloom.zoo._seed import generator, randomize_batch_norms, seeded

__all__ = ["BasicBlock", "ResNetTiny", "resnet_tiny", "resnet_tiny_inputs"]


class BasicBlock(nn.Module):
    """Two 3x3 conv + batch-norm layers and a residual add; a 1x1 conv shortcut when the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + shortcut)


class ResNetTiny(nn.Module):
    """Stem, one block per stage (channels ``widths``), global average pool, linear head."""

    def __init__(self, num_classes: int = 10, widths: tuple[int, ...] = (8, 16, 32)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages = []
        in_channels = widths[0]
        for index, width in enumerate(widths):
            stages.append(BasicBlock(in_channels, width, stride=1 if index == 0 else 2))
            in_channels = width
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet_tiny(seed: int = 0) -> ResNetTiny:
    """A ``ResNetTiny`` with seeded weights and non-trivial batch-norm statistics, in eval mode."""
    with seeded(seed):
        model = ResNetTiny()
        randomize_batch_norms(model)
    return model.eval()


def resnet_tiny_inputs(seed: int = 0) -> tuple[torch.Tensor]:
    """One 3x32x32 image."""
    return (torch.randn(1, 3, 32, 32, generator=generator(seed)),)
