"""Shared set-up of the lowering tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def keep_global_random_state():
    """Each test leaves torch's global random state as it found it (models seed it to build).

    Tests elsewhere draw unseeded random tensors; whether lowering tests run before them must
    not change what they draw.
    """
    with torch.random.fork_rng(devices=[]):
        yield
