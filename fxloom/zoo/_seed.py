"""Seeded construction for the zoo: every model and every example input is the same on every run.

``seeded(seed)`` builds parameters under a private RNG state (the caller's global RNG is left
as it was); ``generator(seed)`` makes a ``torch.Generator`` for example inputs;
``randomize_batch_norms(model)`` gives batch norms statistics worth folding.

Depends on: torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with torch's global RNG seeded to ``seed``; restore the old state after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded to ``seed``, for drawing example inputs."""
    return torch.Generator().manual_seed(seed)


def randomize_batch_norms(model: torch.nn.Module) -> None:
    """Give every batch norm random running statistics and affine parameters (from the global RNG).

    Fresh batch norms are identities in eval mode; random ones make them count, so fusion
    and the comparisons with eager fold and check real numbers.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                channels = module.num_features
                module.running_mean.copy_(torch.randn(channels) * 0.1)
                module.running_var.copy_(torch.rand(channels) + 0.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(std=0.1)
