"""``mlp_tiny``: the smallest zoo model, a multi-layer perceptron.

A baseline for tests and demos that need a model but not a feature: ``torch.flatten`` of
an image-shaped input, then ``Linear -> ReLU -> Linear -> ReLU -> Linear`` in an
``nn.Sequential`` (traced through, so each layer is its own ``call_module`` node).

Input: a float tensor of shape (4, 1, 8, 8); output: logits of shape (4, 10).

Depends on: torch.
"""

from __future__ import annotations

import torch
from torch import nn

from fxloom.zoo._seed import generator, seeded

__all__ = ["MLPTiny", "mlp_tiny", "mlp_tiny_inputs"]


class MLPTiny(nn.Module):
    """Flatten, then two hidden layers with ReLU and a linear output."""

    def __init__(self, in_features: int = 64, hidden: int = 32, num_classes: int = 10) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(torch.flatten(x, 1))


def mlp_tiny(seed: int = 0) -> MLPTiny:
    """An ``MLPTiny`` with seeded weights, in eval mode."""
    with seeded(seed):
        model = MLPTiny()
    return model.eval()


def mlp_tiny_inputs(seed: int = 0) -> tuple[torch.Tensor]:
    """A batch of four 1x8x8 images."""
    return (torch.randn(4, 1, 8, 8, generator=generator(seed)),)
