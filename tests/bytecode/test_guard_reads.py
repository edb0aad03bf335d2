"""The generated guard reads each source once per call, modules' attributes from their dicts.

A guard checks many things of one value (a parameter's type, dtype, device, sizes, that it is
no other input), and every check used to read it again from the argument: for a module the
call brings, ``layer.linear.weight`` was about twelve walks through ``nn.Module.__getattr__``
(microseconds each). Now a source read more than once is read into a local just before the
first check that reads it, so behind every check before it; later checks, and the sources
under it, start from that local; and a parameter, buffer or submodule is read from the dict
``nn.Module.__getattr__`` would find it in (``fxloom.bytecode.guards.module_registry``).
What the guard accepts and which guard a miss names are unchanged.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxloom
from fxloom.bytecode.guards import GuardSet, module_registry
from fxloom.bytecode.sources import Attr, Item, Local

pytestmark = pytest.mark.bytecode


class Indexed(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.layer_idx = index
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.layer_idx


def run_layer(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return layer(x)


def test_a_submodule_and_its_parameters_are_read_once_per_call():
    compiled = fxloom.compile(run_layer)
    layer, x = Indexed(0), torch.randn(2, 4)
    compiled(layer, x)
    torch.testing.assert_close(compiled(layer, x), run_layer(layer, x))
    assert compiled.explain().recompiles == []  # the guard accepts the call it was made on
    guard = compiled.cache[0].guard_source
    assert guard.count("_modules['linear']") == 1
    assert guard.count("_parameters['weight']") == 1
    assert "L_layer.linear" not in guard


def test_run_reads_parameters_from_their_dicts():
    compiled = fxloom.compile(run_layer)
    compiled(Indexed(0), torch.randn(2, 4))
    assert "L_layer._modules['linear']._parameters['weight']" in compiled.cache[0].run_source


def test_a_miss_names_the_guard_that_failed_as_before():
    compiled = fxloom.compile(run_layer)
    layer = Indexed(0)
    compiled(layer, torch.randn(2, 4))
    layer.linear.weight.requires_grad_(False)
    compiled(layer, torch.randn(2, 4))
    (miss,) = compiled.explain().recompiles
    assert "layer.linear.weight" in miss and "requires_grad=True" in miss


def test_an_attribute_gone_from_the_module_is_a_miss_then_eagers_error():
    compiled = fxloom.compile(run_layer)
    layer = Indexed(0)
    compiled(layer, torch.randn(2, 4))
    del layer.linear
    with pytest.raises(AttributeError, match="linear"):
        compiled(layer, torch.randn(2, 4))


def test_a_submodule_moved_to_another_dict_is_read_from_there():
    compiled = fxloom.compile(run_layer)
    layer = Indexed(0)
    x = torch.randn(2, 4)
    compiled(layer, x)
    layer.linear.bias = None  # from _parameters to a plain None (a Linear without bias)
    torch.testing.assert_close(compiled(layer, x), run_layer(layer, x))


class WithProperty(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(1))
        self.inner = nn.Identity()
        self.weight = nn.Parameter(torch.ones(1))
        self.plain = 3

    @property
    def shadowed(self) -> int:
        return 1


class OwnGetattr(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))

    def __getattr__(self, name: str):
        return super().__getattr__(name)


def test_module_attributes_are_read_from_the_dict_getattr_finds_them_in():
    module = WithProperty()
    assert module_registry(module, "weight") == "_parameters"
    assert module_registry(module, "scale") == "_buffers"
    assert module_registry(module, "inner") == "_modules"


def test_attributes_python_finds_before_getattr_are_read_as_they_are():
    module = WithProperty()
    assert module_registry(module, "plain") is None  # the instance's own
    assert module_registry(module, "shadowed") is None  # the class's
    assert module_registry(module, "forward") is None
    assert module_registry(OwnGetattr(), "weight") is None  # a __getattr__ of its own


class Box:
    pass


def test_a_key_that_spells_a_source_is_not_read_as_one():
    guards = GuardSet()
    attribute, item = Attr(Local("x"), "a"), Item(Local("d"), "L_x.a")
    guards.equals(attribute, 3)  # its type and its value: read twice, so into a local
    guards.equals(item, 5)
    source = guards.source_code(["x", "d"])
    assert "L_d['L_x.a']" in source
    guard = guards.compile(["x", "d"], {}, None)
    box = Box()
    box.a = 3
    assert guard(box, {"L_x.a": 5}) is True
    assert guard(box, {"L_x.a": 6}) is False
    assert guard(Box(), {"L_x.a": 5}) is False  # a missing attribute: a miss, not an error


def test_a_class_attribute_added_after_compiling_is_read_as_python_reads_it():
    class Shadowed(Indexed):
        pass

    compiled = fxloom.compile(run_layer)
    layer, x = Shadowed(0), torch.randn(2, 4)
    compiled(layer, x)
    Shadowed.linear = property(lambda self: nn.Identity())  # found before __getattr__
    torch.testing.assert_close(compiled(layer, x), run_layer(layer, x))


def test_a_name_that_extends_another_is_its_own_read():
    guards = GuardSet()
    guards.equals(Attr(Local("x"), "a"), 1)
    guards.equals(Attr(Local("x"), "ab"), 2)
    guard = guards.compile(["x"], {}, None)
    box = Box()
    box.a, box.ab = 1, 2
    assert guard(box) is True
    box.ab = 1
    assert guard(box) is False
