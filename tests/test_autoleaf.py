"""symbolic_trace(..., autoleaf=True): untraceable submodules become calls, the rest is traced."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import fxloom
from fxloom._notes import notes_of
from fxloom.autoleaf import LeafDecision


class Gate(nn.Module):
    """Data-dependent control flow: cannot be traced symbolically."""

    def forward(self, x):
        if x.sum() > 0:
            return x.relu()
        return -x


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.gate = Gate()

    def forward(self, x):
        return self.gate(self.lin(x)) + 1


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.block(x) * 2)


def call_modules(gm: fxloom.GraphModule) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "call_module"]


def test_without_autoleaf_the_documented_error_is_raised():
    with pytest.raises(fxloom.TraceError, match="cannot be used as inputs to control flow"):
        fxloom.symbolic_trace(Net())


def test_the_innermost_untraceable_module_becomes_a_call():
    gm = fxloom.symbolic_trace(Net(), autoleaf=True)
    assert call_modules(gm) == ["block.lin", "block.gate", "head"]


def test_everything_around_the_leaf_is_still_traced():
    gm = fxloom.symbolic_trace(Net(), autoleaf=True)
    ops = [(n.op, getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes]
    assert ("call_function", "add") in ops
    assert ("call_function", "mul") in ops


def test_the_traced_module_matches_eager_on_both_branches():
    model = Net()
    gm = fxloom.symbolic_trace(model, autoleaf=True)
    x = torch.randn(3, 4)
    assert_close(gm(x), model(x))
    assert_close(gm(-x), model(-x))


def test_the_report_names_the_module_its_class_the_reason_and_the_line():
    gm = fxloom.symbolic_trace(Net(), autoleaf=True)
    (decision,) = gm.meta["autoleaf"]
    assert isinstance(decision, LeafDecision)
    assert decision.path == "block.gate"
    assert decision.module_class == "Gate"
    assert "control flow" in decision.reason
    gate_line = Gate.forward.__code__.co_firstlineno + 1  # the `if x.sum() > 0:`
    assert decision.location.endswith(f"{__file__}:{gate_line}")
    assert "block.gate (Gate)" in str(decision)


def test_a_traceable_model_gets_an_empty_report():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    gm = fxloom.symbolic_trace(model, autoleaf=True)
    assert gm.meta["autoleaf"] == []


class Wrapper(nn.Module):
    """A user module whose failing part sits inside a torch.nn container."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), Gate())

    def forward(self, x):
        return self.body(x)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.wrapper = Wrapper()

    def forward(self, x):
        return self.wrapper(x) * 3


def test_a_user_module_inside_a_torch_container_is_chosen_not_the_container():
    gm = fxloom.symbolic_trace(Outer(), autoleaf=True)
    assert call_modules(gm) == ["wrapper.body.0", "wrapper.body.1"]
    assert [d.path for d in gm.meta["autoleaf"]] == ["wrapper.body.1"]


class TwoGates(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Gate()
        self.second = Gate()

    def forward(self, x):
        return self.second(self.first(x) - 1)


def test_several_failures_are_fixed_one_after_the_other():
    model = TwoGates()
    gm = fxloom.symbolic_trace(model, autoleaf=True)
    assert [d.path for d in gm.meta["autoleaf"]] == ["first", "second"]
    x = torch.randn(5)
    assert_close(gm(x), model(x))


class FailsInRoot(nn.Module):
    def forward(self, x):
        if x.mean() > 0:
            return x
        return -x


def test_a_failure_in_the_root_forward_is_raised_with_an_explanation():
    with pytest.raises(fxloom.TraceError) as info:
        fxloom.symbolic_trace(FailsInRoot(), autoleaf=True)
    assert any("root module's own forward" in note for note in notes_of(info.value))


def test_the_users_module_is_unchanged_after_autoleaf():
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fxloom.symbolic_trace(model, autoleaf=True)
    assert not hasattr(model, "_tensor_constant0")
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])


# ------------------------------------------------- inputs that are custom objects
class Boxes:
    """A custom object, not registered with fxloom.pytree: no call can take it as an argument."""

    def __init__(self, tensor):
        self.tensor = tensor


@dataclasses.dataclass
class BoxPair:
    first: torch.Tensor
    second: torch.Tensor


fxloom.pytree.register_dataclass(BoxPair)


class BoxHead(nn.Module):
    """Untraceable, and takes its boxes as an object."""

    def forward(self, boxes):
        t = boxes.tensor if isinstance(boxes, Boxes) else boxes.first - boxes.second
        if t.sum() > 0:
            return t * 2
        return t


class MakesBoxes(nn.Module):
    def __init__(self, make):
        super().__init__()
        self.make = make
        self.head = BoxHead()

    def forward(self, x):
        return self.head(self.make(x))


class Detector(nn.Module):
    def __init__(self, make):
        super().__init__()
        self.stage = MakesBoxes(make)

    def forward(self, x):
        return self.stage(x) + 1


def test_a_leaf_taking_a_registered_container_is_kept_and_passed_its_fields():
    model = MakesBoxes(lambda x: BoxPair(x, x + 1))
    gm = fxloom.symbolic_trace(model, autoleaf=True)
    assert call_modules(gm) == ["head"]
    x = torch.randn(3)
    assert_close(gm(x), model(x))


def test_a_leaf_taking_a_custom_object_gives_way_to_the_module_that_made_the_object():
    model = Detector(lambda x: Boxes(x))
    gm = fxloom.symbolic_trace(model, autoleaf=True)
    assert call_modules(gm) == ["stage"]
    assert [d.path for d in gm.meta["autoleaf"]] == ["stage"]
    assert "its submodule 'stage.head' takes inputs a call cannot pass" in str(
        gm.meta["autoleaf"][0]
    )
    x = torch.randn(3)
    assert_close(gm(x), model(x))


def test_a_custom_object_made_in_the_root_is_refused_naming_it_and_the_fix():
    with pytest.raises(fxloom.TraceError) as info:
        fxloom.symbolic_trace(MakesBoxes(lambda x: Boxes(x)), autoleaf=True)
    message = str(info.value)
    assert "autoleaf cannot keep 'head' (BoxHead)" in message
    assert "of type Boxes" in message
    assert "fxloom.pytree.register_pytree_node" in message
