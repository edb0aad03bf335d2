"""Qualified names (``"block.conv.weight"``): reading, installing, naming and deleting what they
reach, with one error for a path that leads nowhere."""

from __future__ import annotations

import pytest
import torch

from fxloom import attr_path
from fxloom.attr_path import MISSING, MissingAttributeError, PathBlockedError


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 1, 1, bias=False)  # conv.bias is None
        self.register_buffer("running", torch.zeros(1))
        self.register_buffer("scratch", torch.zeros(1), persistent=False)
        self.note = "plain"

    @property
    def channels(self) -> int:
        return self.conv.out_channels


def net() -> torch.nn.Module:
    root = torch.nn.Module()
    root.block = Block()
    root.scale = torch.nn.Parameter(torch.ones(1))
    root.config = {"depth": 2}
    return root


# ------------------------------------------------------------------ reading
def test_get_follows_submodules_parameters_buffers_and_plain_attributes():
    root = net()
    assert attr_path.get(root, "block") is root.block
    assert attr_path.get(root, "block.conv.weight") is root.block.conv.weight
    assert attr_path.get(root, "scale") is root.scale
    assert attr_path.get(root, "block.running") is root.block.running
    assert attr_path.get(root, "block.note") == "plain"
    assert attr_path.get(root, "block.channels") == 1  # properties too
    assert attr_path.get(root, "block.conv.weight.shape") == torch.Size([1, 1, 1, 1])


def test_get_reads_the_module_tables_without_calling_getattr():
    class Loud(torch.nn.Module):
        def __getattr__(self, name):
            raise AssertionError(f"__getattr__({name!r}) was called")

    root = Loud()
    root.lin = torch.nn.Linear(1, 1)
    assert attr_path.get(root, "lin.weight") is root._modules["lin"].weight


def test_a_parameter_set_to_none_is_present_and_none():
    root = net()
    assert attr_path.get(root, "block.conv.bias") is None
    assert attr_path.find(root, "block.conv.bias") is None


def test_find_returns_missing_where_get_raises():
    root = net()
    assert attr_path.find(root, "block.conv.gain") is MISSING
    assert attr_path.find(root, "nowhere.deep") is MISSING
    assert attr_path.find(root, "") is MISSING  # the empty string is no path
    assert attr_path.find(None, "lin") is MISSING  # no root, nothing found


def test_the_error_names_the_root_the_path_what_exists_and_what_is_missing():
    with pytest.raises(MissingAttributeError) as info:
        attr_path.get(net(), "block.conv.wieght")
    err = info.value
    assert str(err) == (
        "Module has no attribute 'block.conv.wieght': 'block.conv' (a Conv2d) has no 'wieght' "
        "(did you mean 'weight'?)"
    )
    assert (err.path, err.found, err.missing, err.name) == (
        "block.conv.wieght",
        "block.conv",
        "wieght",
        "wieght",
    )


def test_a_missing_first_part_is_named_against_the_root():
    with pytest.raises(MissingAttributeError, match=r"^Module has no attribute 'blok' \(did you"):
        attr_path.get(net(), "blok.conv")


def test_going_through_none_says_so():
    with pytest.raises(
        MissingAttributeError, match="'block.conv.bias' is None, which has no 'data'"
    ):
        attr_path.get(net(), "block.conv.bias.data")


def test_the_error_is_an_attribute_error():
    with pytest.raises(AttributeError):
        attr_path.get(net(), "missing")


def test_callers_add_what_they_know_before_and_after():
    err = MissingAttributeError(net(), "lin", context="%lin (call_module)", fix="add it")
    assert str(err) == "%lin (call_module): Module has no attribute 'lin'; add it"


def test_prefixes_lists_every_path_on_the_way():
    assert attr_path.prefixes("a.b.c") == ["a", "a.b", "a.b.c"]
    assert attr_path.prefixes("a") == ["a"]


# ------------------------------------------------------------------ installing
def test_install_creates_missing_parents_as_empty_modules():
    root = torch.nn.Module()
    linear = torch.nn.Linear(1, 1)
    attr_path.install(root, "encoder.layers.0", linear)
    assert type(root.encoder) is torch.nn.Module
    assert type(root.encoder.layers) is torch.nn.Module
    assert root.encoder.layers._modules["0"] is linear


def test_install_holds_each_value_the_right_way():
    root = torch.nn.Module()
    weight = torch.nn.Parameter(torch.ones(1))
    attr_path.install(root, "a.weight", weight)
    attr_path.install(root, "a.stat", torch.zeros(1), as_buffer=True)
    attr_path.install(root, "a.tmp", torch.zeros(1), as_buffer=True, persistent=False)
    attr_path.install(root, "a.raw", torch.zeros(1))
    attr_path.install(root, "a.depth", 3)
    assert root.a._parameters["weight"] is weight
    assert set(root.a._buffers) == {"stat", "tmp"}
    assert root.a._non_persistent_buffers_set == {"tmp"}
    assert "raw" in vars(root.a) and vars(root.a)["depth"] == 3
    assert set(root.state_dict()) == {"a.weight", "a.stat"}


def test_install_copying_from_a_module_keeps_buffers_and_their_persistence():
    source = net()
    source.block.train(False)
    copy = torch.nn.Module()
    for path in ("block.running", "block.scratch", "block.conv"):
        attr_path.install(copy, path, attr_path.get(source, path), copied_from=source)
    assert set(copy.block._buffers) == {"running", "scratch"}
    assert copy.block._non_persistent_buffers_set == {"scratch"}
    assert copy.block.training is False  # the new parent follows the module it stands for
    assert copy.block.conv is source.block.conv


def test_install_replaces_something_of_the_same_kind():
    root = torch.nn.Module()
    attr_path.install(root, "a.lin", torch.nn.Linear(1, 1))
    other = torch.nn.Linear(2, 2)
    attr_path.install(root, "a.lin", other)
    assert root.a.lin is other


def test_install_refuses_a_non_module_in_the_way_and_changes_nothing():
    root = net()
    before = dict(root.named_modules())
    with pytest.raises(
        PathBlockedError, match=r"'scale' is a parameter \(Parameter\), not a module"
    ):
        attr_path.install(root, "scale.inner", torch.nn.ReLU())
    with pytest.raises(PathBlockedError, match=r"'config' is a plain attribute \(dict\)"):
        attr_path.install(root, "config.inner.deeper", torch.nn.ReLU())
    with pytest.raises(PathBlockedError, match=r"'block.conv.bias' is a parameter \(None\)"):
        attr_path.install(root, "block.conv.bias.inner", torch.nn.ReLU())
    assert dict(root.named_modules()) == before


def test_install_refuses_to_replace_something_held_another_way():
    root = net()
    with pytest.raises(PathBlockedError, match="it holds a parameter .* would be a submodule"):
        attr_path.install(root, "scale", torch.nn.ReLU())
    assert isinstance(root.scale, torch.nn.Parameter)


def test_install_refuses_an_empty_part():
    with pytest.raises(ValueError, match="not a qualified name"):
        attr_path.install(torch.nn.Module(), "a..b", 1)


# ------------------------------------------------------------------ free names
def test_free_name_is_the_wanted_name_when_nothing_is_there():
    assert attr_path.free_name(net(), "fused") == "fused"


def test_free_name_skips_taken_names():
    root = net()
    root.fused = torch.nn.ReLU()
    root.fused_1 = torch.nn.ReLU()
    assert attr_path.free_name(root, "fused") == "fused_2"
    assert attr_path.free_name(root, "fused", taken={"fused_2"}) == "fused_3"


def test_free_name_counts_class_attributes_and_none_parameters_as_taken():
    root = net()
    assert attr_path.free_name(root, "forward") == "forward_1"
    assert attr_path.free_name(root, "block.conv.bias") == "block.conv.bias_1"


def test_free_name_can_number_every_candidate():
    root = net()
    root.register_buffer("_tensor_constant0", torch.zeros(1))
    assert attr_path.free_name(root, "_tensor_constant", start=0) == "_tensor_constant1"
    assert attr_path.free_name(root, "_tensor_constant", start=5) == "_tensor_constant5"


def test_free_name_numbers_the_last_part_of_a_dotted_name():
    root = net()
    assert attr_path.free_name(root, "block.conv") == "block.conv_1"
    assert attr_path.free_name(root, "new.parent.conv") == "new.parent.conv"


def test_free_name_refuses_a_non_module_parent():
    with pytest.raises(PathBlockedError, match="'scale' is a parameter"):
        attr_path.free_name(net(), "scale.fused")


# ------------------------------------------------------------------ deleting
def test_delete_removes_whatever_a_module_holds_there():
    root = net()
    assert attr_path.delete(root, "block.conv") is True
    assert attr_path.delete(root, "block.running") is True
    assert attr_path.delete(root, "block.note") is True
    assert attr_path.delete(root, "scale") is True
    assert attr_path.find(root, "block.conv") is MISSING
    assert set(root.state_dict()) == set()


def test_delete_of_nothing_is_false():
    root = net()
    assert attr_path.delete(root, "block.nothing") is False
    assert attr_path.delete(root, "nowhere.deep") is False
    assert attr_path.delete(root, "forward") is False  # a method of the class, not held by root


def test_free_name_without_a_root_avoids_only_the_taken_names():
    # A module still being planned (split_module's submodules) has only a set of names.
    assert attr_path.free_name(None, "submod", taken={"submod", "submod_1"}) == "submod_2"
    assert attr_path.free_name(None, "submod") == "submod"
