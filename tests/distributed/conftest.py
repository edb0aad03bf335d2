"""The pipeline tests run with torch's own checks on (``pytestmark`` in their files).

``TORCH_DISTRIBUTED_DEBUG=DETAIL`` makes torch.distributed.pipelining check, at every
microbatch, that what each stage receives, sends and returns as gradients matches the
metadata the stage declared (torch 2.11 checks the sends always; 2.13 only under DETAIL), and
makes the process groups check that collectives agree across ranks. The processes the tests
spawn inherit it. The RPC tests run without it: on torch 2.11, DETAIL wraps the default
process group, and ``torch.distributed.rpc`` then refuses it ("not initialized in the world
group map").
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def torch_distributed_checks_on():
    before = os.environ.get("TORCH_DISTRIBUTED_DEBUG")
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    yield
    if before is None:
        os.environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
    else:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = before
