"""``deeprec``: a DeepRecommender-style autoencoder, the torch.fx paper's quantization model.

Kuchaiev & Ginsburg's collaborative-filtering autoencoder (the model of the paper's section
6.2.1 and Appendix B): a user's ratings of every item go through a stack of Linear + SELU
layers down to a code, dropout on the code, and a mirrored stack back to one predicted
rating per item. The paper's sizes: 17768 items -> 512 -> 512 -> 1024 (the code) -> 512 ->
512 -> 17768, dropout 0.8. Nearly all its time is in the two big matrices of the first and
last layer, which is why int8 weights pay off.

``deeprec()`` has the paper's sizes (19.8 M parameters); ``deeprec_tiny()`` the same shape
at 256 items and 32/32/64 units, for tests. Inputs: a batch of sparse rating vectors (about 2%
of items rated, ratings 1..5, zeros elsewhere), ``batch`` rows (default 1).

Depends on: torch.
"""

from __future__ import annotations

import torch
from torch import nn

from fxloom.zoo._seed import generator, seeded

__all__ = [
    "PAPER_SIZES",
    "TINY_SIZES",
    "DeepRecommender",
    "deeprec",
    "deeprec_inputs",
    "deeprec_tiny",
    "deeprec_tiny_inputs",
    "ratings",
]

PAPER_SIZES = (17768, 512, 512, 1024)
TINY_SIZES = (256, 32, 32, 64)


class DeepRecommender(nn.Module):
    """Encoder ``sizes[0] -> ... -> sizes[-1]`` and its mirror, Linear + SELU, dropout on the code.

    The last layer is linear (ratings are not squashed).
    """

    def __init__(self, sizes: tuple[int, ...] = PAPER_SIZES, dropout: float = 0.8) -> None:
        super().__init__()
        self.encoder = _stack(sizes, last_activation=True)
        self.drop = nn.Dropout(dropout)
        self.decoder = _stack(sizes[::-1], last_activation=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.drop(self.encoder(x)))


def _stack(sizes: tuple[int, ...], last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for index, (inputs, outputs) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(inputs, outputs))
        if last_activation or index < len(sizes) - 2:
            layers.append(nn.SELU())
    return nn.Sequential(*layers)


def deeprec(seed: int = 0) -> DeepRecommender:
    """The paper's DeepRecommender (17768 items), seeded, in eval mode."""
    with seeded(seed):
        model = DeepRecommender(PAPER_SIZES)
    return model.eval()


def deeprec_tiny(seed: int = 0) -> DeepRecommender:
    """The same architecture at 256 items (``TINY_SIZES``), seeded, in eval mode."""
    with seeded(seed):
        model = DeepRecommender(TINY_SIZES)
    return model.eval()


def ratings(batch: int, items: int, seed: int = 0, density: float = 0.02) -> torch.Tensor:
    """``batch`` sparse rating vectors: about ``density`` of the items rated 1..5, zeros elsewhere."""
    rng = generator(seed)
    rated = torch.rand(batch, items, generator=rng) < density
    stars = torch.randint(1, 6, (batch, items), generator=rng).float()
    return torch.where(rated, stars, torch.zeros(()))


def deeprec_inputs(seed: int = 0, batch: int = 1) -> tuple[torch.Tensor]:
    return (ratings(batch, PAPER_SIZES[0], seed),)


def deeprec_tiny_inputs(seed: int = 0, batch: int = 8) -> tuple[torch.Tensor]:
    return (ratings(batch, TINY_SIZES[0], seed),)
