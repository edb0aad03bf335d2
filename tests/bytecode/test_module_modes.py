"""Compiling leaves every module's training mode as it was; each call runs each module in the
mode it is in at that call, as eager does.

Users mix modes on purpose: a model fine-tuned with its batch norms frozen
(``model.train(); model.bn.eval()``), dropout left on at inference for Monte Carlo sampling
(``model.eval(); model.dropout.train()``), a function that calls a module it finds in a global
or a closure. Compiling set the captured graph's mode recursively, so it switched the
program's own modules with it: the frozen batch norm trained, the sampling dropout stopped,
and a function's modules ran in eval mode (its batch norm normalised by running statistics it
never updated). Each test runs a twin of the model in eager with the same mode changes and
compares outputs, running statistics and modes after every call.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fxloom

pytestmark = pytest.mark.bytecode


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)
        self.norm = nn.BatchNorm1d(6)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.norm(self.linear(x)))


class Branching(nn.Module):
    """A module of the program's own whose forward reads its mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if self.training else x - 1


def modes(model: nn.Module) -> dict[str, bool]:
    return {name: module.training for name, module in model.named_modules()}


def assert_twins(compiled_model: nn.Module, eager_model: nn.Module, got, expected) -> None:
    torch.testing.assert_close(got, expected)
    assert modes(compiled_model) == modes(eager_model)
    for (name, mine), (_, theirs) in zip(
        compiled_model.named_buffers(), eager_model.named_buffers(), strict=True
    ):
        assert torch.equal(mine, theirs), name


def call_both(compiled, eager, model, twin, x: torch.Tensor, seed: int) -> None:
    torch.manual_seed(seed)
    got = compiled(x)
    torch.manual_seed(seed)
    expected = eager(x)
    assert_twins(model, twin, got, expected)


# each case: how the user sets the modes before compiling
SETUPS = {
    "training": lambda m: m.train(),
    "eval": lambda m: m.eval(),
    "training, batch norm frozen (fine-tuning)": lambda m: (m.train(), m.norm.eval()),
    "eval, dropout on (Monte Carlo sampling)": lambda m: (m.eval(), m.dropout.train()),
}


def set_up(setup: str) -> tuple[Net, Net]:
    """A ``Net`` in the modes ``SETUPS[setup]`` gives it, and its eager twin."""
    torch.manual_seed(0)
    model = Net()
    SETUPS[setup](model)
    return model, copy.deepcopy(model)


@pytest.mark.parametrize("setup", SETUPS)
def test_compiling_a_module_leaves_each_submodule_s_mode_as_the_user_set_it(setup):
    model, twin = set_up(setup)
    compiled = fxloom.compile(model)
    for seed in range(3):
        call_both(compiled, twin, model, twin, torch.randn(8, 6), seed)


@pytest.mark.parametrize("setup", SETUPS)
def test_a_function_runs_the_modules_it_finds_in_their_own_modes(setup):
    model, twin = set_up(setup)

    def step(x):  # the module comes from the closure, as from a global
        return model(x).relu()

    compiled = fxloom.compile(step)
    for seed in range(3):
        call_both(compiled, lambda x: twin(x).relu(), model, twin, torch.randn(8, 6), seed)


def test_modes_changed_between_calls_are_the_modes_each_call_runs_in():
    torch.manual_seed(0)
    model = nn.Sequential(Net(), Branching())
    twin = copy.deepcopy(model)
    compiled = fxloom.compile(model)
    changes = [
        lambda m: m.train(),
        lambda m: m.eval(),
        lambda m: m[0].norm.train(),
        lambda m: m[1].train(),
        lambda m: m.train(),
    ]
    for seed, change in enumerate(changes):
        change(model)
        change(twin)
        call_both(compiled, twin, model, twin, torch.randn(8, 6), seed)
