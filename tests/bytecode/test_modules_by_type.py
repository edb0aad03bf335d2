"""Modules a call brings are read by their type: one entry serves every instance alike.

A module passed as an argument (or reached from one) may be another object at the next call:
layers of one class that differ in their weights and an int index (Hugging Face's
``layer_idx``). Guarded by identity, each instance compiled its own entry. Read by its type
(``Recording._module_by_type``), the entry guards what the program read of it as it read it:
its exact type, no ``forward`` of the instance's own, its hooks, each attribute (an int index
is promoted to a symbol once it changed), and its parameters, which are graph inputs. The
torch.nn leaves it holds run their Python forward when they are listed in
``INLINED_LEAVES`` (``Linear``, norms, activations...); the others stay ``call_module``
nodes on the instance, guarded by identity, as does a module the function finds in a global.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxloom

pytestmark = pytest.mark.bytecode


class Indexed(nn.Module):
    def __init__(self, index: int, act: nn.Module | None = None) -> None:
        super().__init__()
        self.layer_idx = index
        self.linear = nn.Linear(4, 4)
        self.act = act if act is not None else nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x)) + self.layer_idx


def run_layer(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return layer(x)


def test_layers_that_differ_in_weights_and_index_share_one_entry():
    torch.manual_seed(0)
    layers = [Indexed(i) for i in range(8)]
    compiled = fxloom.compile(run_layer)
    x = torch.randn(2, 4)
    for layer in layers:
        torch.testing.assert_close(compiled(layer, x), run_layer(layer, x))
    report = compiled.explain()
    assert report.graph_count == 2  # index 0 static; then any index, symbolic
    assert report.dynamic_sizes == ["layer.layer_idx: 0 -> 1 (now symbolic)"]


def test_a_leafs_own_settings_are_guarded_as_read():
    layers = [Indexed(0, nn.LeakyReLU(slope)) for slope in (0.1, 0.5, 0.1)]
    compiled = fxloom.compile(run_layer)
    x = torch.randn(2, 4)
    for layer in layers:
        torch.testing.assert_close(compiled(layer, x), run_layer(layer, x))


def test_a_replaced_parameter_is_read_at_the_call():
    layer = Indexed(0)
    compiled = fxloom.compile(run_layer)
    x = torch.randn(2, 4)
    compiled(layer, x)
    layer.linear.weight = nn.Parameter(torch.randn(4, 4))
    torch.testing.assert_close(compiled(layer, x), run_layer(layer, x))
    layer.linear = nn.Linear(4, 4, bias=False)
    torch.testing.assert_close(compiled(layer, x), run_layer(layer, x))


def test_an_instance_with_a_forward_of_its_own_misses_the_entry():
    first, second = Indexed(0), Indexed(0)
    second.forward = lambda x: x * 0
    compiled = fxloom.compile(run_layer)
    x = torch.randn(2, 4)
    compiled(first, x)
    torch.testing.assert_close(compiled(second, x), torch.zeros(2, 4))


def test_a_leaf_not_listed_stays_held_by_identity():
    norms = [nn.BatchNorm1d(4).eval() for _ in range(2)]
    compiled = fxloom.compile(run_layer)
    x = torch.randn(2, 4)
    for norm in norms:
        torch.testing.assert_close(compiled(norm, x), run_layer(norm, x))
    assert compiled.explain().graph_count == 2
    assert any("is the same BatchNorm1d" in guard for guard in compiled.explain().guards[0])


GLOBAL_LAYER = Indexed(3)


def uses_the_global_layer(x: torch.Tensor) -> torch.Tensor:
    return GLOBAL_LAYER(x)


def test_a_module_found_in_a_global_stays_held_by_identity():
    compiled = fxloom.compile(uses_the_global_layer)
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), uses_the_global_layer(x))
    assert any("is the same Indexed" in guard for guard in compiled.explain().guards[0])


# -- what an attacker or a later patch changes after the capture: the entry must miss --------
class Swapped(nn.Module):
    """A stand-in that ``__getattr__`` hands out for ``linear`` once patched."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -x


def lookup_returning_swapped(original):
    swapped = Swapped()

    def patched(self, name):
        return swapped if name == "linear" else original(self, name)

    return patched


def patch_getattr(cls: type) -> None:
    cls.__getattr__ = lookup_returning_swapped(nn.Module.__getattr__)


def patch_getattribute(cls: type) -> None:
    swapped = Swapped()
    cls.__getattribute__ = lambda self, name: (
        swapped if name == "linear" else object.__getattribute__(self, name)
    )


@pytest.mark.parametrize("patch", [patch_getattr, patch_getattribute])
def test_a_lookup_patched_on_the_class_after_the_capture_is_honoured(patch):
    class Local(Indexed):
        pass

    compiled = fxloom.compile(run_layer)
    layer, x = Local(0), torch.randn(2, 4)
    compiled(layer, x)
    patch(Local)
    torch.testing.assert_close(compiled(layer, x), layer(x))
    assert torch.equal(layer(x), layer.act(-x) + 0)  # the patched lookup is what runs


def test_torchs_own_getattr_patched_after_the_capture_is_honoured(monkeypatch):
    compiled = fxloom.compile(run_layer)
    layer, x = Indexed(1), torch.randn(2, 4)
    compiled(layer, x)
    monkeypatch.setattr(nn.Module, "__getattr__", lookup_returning_swapped(nn.Module.__getattr__))
    torch.testing.assert_close(compiled(layer, x), layer(x))
    monkeypatch.undo()
    torch.testing.assert_close(compiled(layer, x), layer(x))  # and back to the first entry


def test_an_instance_moved_to_a_subclass_after_the_capture_misses_the_entry():
    class Doubling(Indexed):
        def forward(self, x):
            return 2 * super().forward(x)

    compiled = fxloom.compile(run_layer)
    layer, x = Indexed(3), torch.randn(2, 4)
    compiled(layer, x)
    layer.__class__ = Doubling
    torch.testing.assert_close(compiled(layer, x), layer(x))
