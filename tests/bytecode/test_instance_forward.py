"""A module whose instance has a ``forward`` of its own runs that one, as ``nn.Module.__call__``
does (``model.forward = fxloom.compile(model.forward)``, a wrapper a library installs): the
capture calls it, guarded as an attribute, and an entry captured on the class's forward
guards that the instance has none and that its class's forward is the one inlined (either
assigned after the capture misses the entry).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxloom

pytestmark = pytest.mark.bytecode


class AddsOne(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class Holds(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = AddsOne()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 2


def call_it(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x)


def test_an_instance_forward_runs_instead_of_the_class_one():
    module = AddsOne()
    module.forward = lambda x: x * 0
    x = torch.ones(2)
    torch.testing.assert_close(fxloom.compile(call_it)(module, x), call_it(module, x))


def test_an_instance_forward_assigned_after_the_capture_misses_the_entry():
    module = AddsOne()
    compiled = fxloom.compile(call_it)
    x = torch.ones(2)
    compiled(module, x)
    module.forward = lambda x: x * 3
    torch.testing.assert_close(compiled(module, x), call_it(module, x))
    assert compiled.explain().graph_count == 2


def test_a_submodules_instance_forward_assigned_after_the_capture_is_seen():
    model = Holds()
    compiled = fxloom.compile(model)
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), model(x))
    model.inner.forward = lambda x: x - 5
    torch.testing.assert_close(compiled(x), model(x))


def test_a_class_forward_replaced_after_the_capture_misses_the_entry():
    class Patched(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    model = Holds()
    model.inner = Patched()
    compiled = fxloom.compile(model)
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), model(x))
    Patched.forward = lambda self, x: x - 5
    torch.testing.assert_close(compiled(x), model(x))
