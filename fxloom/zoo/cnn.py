"""``cnn_small``: a small image classifier built from what int8 CNN kernels cover.

Conv + BatchNorm + ReLU twice, max pooling, a residual block (two convs, batch norms and an
add with ReLU), adaptive average pooling, ``torch.flatten`` and a linear classifier: the
patterns post-training quantization fuses (Conv+BN+ReLU), shares scales through (pooling,
flatten) and needs int8 kernels for (the residual add).

Input: a float tensor of shape (2, 3, 32, 32); output: logits of shape (2, 10).

Depends on: torch.
"""

from __future__ import annotations

import torch
from torch import nn

from fxloom.zoo._seed import generator, randomize_batch_norms, seeded

__all__ = ["CNNSmall", "cnn_small", "cnn_small_inputs"]


def _conv_bn(inputs: int, outputs: int) -> list[nn.Module]:
    return [nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs)]


class CNNSmall(nn.Module):
    """Stem, one residual block, pooled linear head."""

    def __init__(self, channels: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            *_conv_bn(3, channels),
            nn.ReLU(),
            *_conv_bn(channels, channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.block = nn.Sequential(
            *_conv_bn(channels, channels), nn.ReLU(), *_conv_bn(channels, channels)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(x + self.block(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def cnn_small(seed: int = 0) -> CNNSmall:
    """A ``CNNSmall`` with seeded weights and batch-norm statistics, in eval mode."""
    with seeded(seed):
        model = CNNSmall()
        randomize_batch_norms(model)
    return model.eval()


def cnn_small_inputs(seed: int = 0) -> tuple[torch.Tensor]:
    """Two 3x32x32 images."""
    return (torch.randn(2, 3, 32, 32, generator=generator(seed)),)
