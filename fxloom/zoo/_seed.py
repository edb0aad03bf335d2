"""Seeded construction for the zoo: every model and every example input is the same on every run.

``seeded(seed)`` builds parameters under a private RNG state (the caller's global RNG is left
as it was); ``generator(seed)`` makes a ``torch.Generator`` for example inputs.

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
