"""GraphModules replicate for ``nn.DataParallel``: before and after their first call.

``nn.DataParallel`` calls ``torch.nn.parallel.replicate`` on every forward, which makes each
replica with ``Module._replicate_for_data_parallel`` and then sets the copied submodules,
parameters and buffers on it. ``replicate`` needs GPUs to broadcast tensors, so the CPU
tests run torch's own ``replicate`` with the broadcast replaced by a copy (every other
step is torch's); ``tests/test_cuda.py`` runs ``DataParallel`` itself where a GPU is present.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from torch import nn

import fxloom

replicate_module = importlib.import_module("torch.nn.parallel.replicate")


def model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(3, 4),
        nn.BatchNorm1d(4),
        nn.Sequential(nn.Linear(4, 2), nn.ReLU()),
    ).eval()


@pytest.fixture
def cpu_replicate(monkeypatch):
    """torch's ``replicate`` on the CPU: devices are indices, the broadcast copies each tensor
    and doubles floating-point ones, so that a replica computing with the original's tensors
    instead of its own copies gives other numbers."""

    def copies(tensors, devices, detach=False):
        def copied(t: torch.Tensor) -> torch.Tensor:
            t = t.detach() if detach else t
            return t * 2 if t.is_floating_point() else t.clone()

        return [[copied(t) for t in tensors] for _ in devices]

    monkeypatch.setattr(replicate_module, "_get_device_index", lambda device, optional: 0)
    monkeypatch.setattr(replicate_module, "_broadcast_coalesced_reshape", copies)
    return replicate_module.replicate


def doubled(module: nn.Module) -> nn.Module:
    """``module`` with every floating-point parameter and buffer doubled: what a replica holds."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            if t.is_floating_point():
                t.mul_(2)
    return module


def test_a_replica_made_before_the_first_call_runs():
    gm = fxloom.symbolic_trace(model())
    replica = gm._replicate_for_data_parallel()
    x = torch.randn(5, 3)
    torch.testing.assert_close(replica(x), gm(x))


def test_a_replica_made_after_the_first_call_runs():
    gm = fxloom.symbolic_trace(model())
    x = torch.randn(5, 3)
    expected = gm(x)
    replica = gm._replicate_for_data_parallel()
    torch.testing.assert_close(replica(x), expected)


def test_a_replica_shares_the_compiled_forward_and_keeps_the_class_name():
    gm = fxloom.symbolic_trace(model())
    gm(torch.randn(2, 3))
    replica = gm._replicate_for_data_parallel()
    assert type(replica)._generated_forward is type(gm)._generated_forward
    assert type(replica).__name__ == type(gm).__name__ == "Sequential"


@pytest.mark.parametrize("called_first", [False, True], ids=["fresh", "after a call"])
def test_torch_replicate_gives_replicas_that_compute_with_their_own_copies(
    cpu_replicate, called_first
):
    eager = model()
    gm = fxloom.symbolic_trace(eager)
    x = torch.randn(5, 3)
    if called_first:
        gm(x)
    replicas = cpu_replicate(gm, [torch.device("cuda", 0), torch.device("cuda", 1)])
    expected = doubled(copy.deepcopy(eager))(x)
    for replica in replicas:
        torch.testing.assert_close(replica(x), expected)


def test_replicating_leaves_the_original_module_as_it_was(cpu_replicate):
    eager = model()
    gm = fxloom.symbolic_trace(eager)
    x = torch.randn(5, 3)
    before = gm(x)
    cpu_replicate(gm, [torch.device("cuda", 0)])
    torch.testing.assert_close(gm(x), before)
    assert gm.get_submodule("0") is gm.__dict__["0"]
