"""Submodules mirrored as instance attributes: generated paths read fast and never stale."""

from __future__ import annotations

import copy
import pickle

import torch
from torch.testing import assert_close

import fxloom as fx
from fxloom._mirrored_modules import MirroredModules


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seq = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
        self.head = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.seq(x))


def traced() -> fx.GraphModule:
    return fx.symbolic_trace(Net())


def test_generated_paths_find_submodules_in_the_instance_dict():
    gm = traced()
    assert gm.__dict__["head"] is gm._modules["head"]
    assert gm.seq.__dict__["0"] is gm.seq._modules["0"]
    assert type(gm.seq) is torch.nn.Module  # the parents stay plain modules, as in torch.fx


def test_assigning_a_submodule_is_seen_by_the_generated_code():
    gm = traced()
    gm.head = torch.nn.Identity()
    assert gm(torch.ones(1, 3)).shape == (1, 3)


def test_add_module_on_a_parent_is_seen_by_the_generated_code():
    gm = traced()
    gm.seq.add_module("0", torch.nn.Identity())
    x = torch.randn(2, 3)
    assert_close(gm(x), gm.head(torch.relu(x)))


def test_deleting_a_submodule_removes_its_mirror():
    gm = traced()
    del gm.head
    assert "head" not in gm.__dict__
    assert not hasattr(gm, "head")


def test_a_submodule_named_like_a_method_does_not_hide_the_method():
    gm = traced()
    gm._modules["train"] = torch.nn.Identity()
    assert "train" not in gm.__dict__
    assert callable(gm.train) and gm.train() is gm


def test_copies_mirror_their_own_submodules():
    gm = traced()
    for copied in (copy.deepcopy(gm), pickle.loads(pickle.dumps(gm))):
        assert copied.seq is not gm.seq
        assert copied.seq.__dict__["0"] is copied.seq._modules["0"]
        assert type(copied.seq._modules) is MirroredModules
        copied.seq.add_module("0", torch.nn.Identity())
        assert isinstance(getattr(gm.seq, "0"), torch.nn.Linear)
        x = torch.randn(2, 3)
        assert_close(copied(x), copied.head(torch.relu(x)))


# That mirrors add no reference cycle (each MirroredModules holds its owner weakly) is
# checked with the other ways a GraphModule is freed, in tests/test_graph_module.py.
