"""A user's class registered with ``torch.utils._pytree`` is a container for fxloom too.

Registered there once (as torch.export asks), it is taken apart and rebuilt as its own type
everywhere fxloom meets structures: a symbolically traced module's output, an exported
program's inputs and outputs, ``ep.module()``, ``unflatten``, and files written by
``fxloom.save``/``fxloom.export.save`` (loading finds the class among the modules already
imported, as it finds ``ModelOutput`` classes, and never imports one).
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest
import torch
import torch.utils._pytree as torch_pytree
from torch.testing import assert_close

import fxloom
from fxloom import pytree
from fxloom.export import Dim, export, load, save, unflatten


@dataclasses.dataclass
class Measured:
    """A dataclass registered the way torch.export's documentation shows."""

    mean: torch.Tensor
    spread: torch.Tensor


torch_pytree.register_dataclass(Measured)


class Interval:
    """A plain class registered by hand: its bounds are the children, its unit the context."""

    def __init__(self, low: Any, high: Any, unit: str = "m") -> None:
        self.low, self.high, self.unit = low, high, unit


def _interval_children(interval: Interval) -> tuple[list[Any], str]:
    return [interval.low, interval.high], interval.unit


def _interval_from(children: list[Any], unit: str) -> Interval:
    return Interval(*children, unit)


torch_pytree.register_pytree_node(Interval, _interval_children, _interval_from)


class Calibrate(torch.nn.Module):
    """Takes a Measured, returns an Interval (in cm)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Linear(3, 3)

    def forward(self, m: Measured) -> Interval:
        centre = self.scale(m.mean)
        return Interval(centre - m.spread.abs(), centre + m.spread.abs(), "cm")


def measured(batch: int, seed: int = 0) -> Measured:
    generator = torch.Generator().manual_seed(seed)
    return Measured(
        torch.randn(batch, 3, generator=generator), torch.randn(batch, 3, generator=generator)
    )


@pytest.fixture(scope="module")
def model() -> Calibrate:
    torch.manual_seed(0)
    return Calibrate().eval()


@pytest.fixture(scope="module")
def program(model: Calibrate) -> Any:
    batch = Dim("batch", max=64)
    return export(model, (measured(4),), dynamic_shapes={"m": Measured({0: batch}, {0: batch})})


def assert_same_interval(got: Any, expected: Interval) -> None:
    assert type(got) is Interval and got.unit == expected.unit
    assert_close(got.low, expected.low)
    assert_close(got.high, expected.high)


def test_fxloom_walks_a_class_registered_only_with_torch() -> None:
    leaves, spec = pytree.tree_flatten(Interval(1, [2, 3], "s"))
    assert leaves == [1, 2, 3]
    rebuilt = pytree.tree_unflatten([10, 20, 30], spec)
    assert (type(rebuilt), rebuilt.low, rebuilt.high, rebuilt.unit) == (Interval, 10, [20, 30], "s")


def test_a_class_registered_with_torch_after_fxloom_met_it_becomes_a_container() -> None:
    class Late:
        def __init__(self, item: Any) -> None:
            self.item = item

    assert pytree.tree_leaves(Late(1))[0].__class__ is Late  # a leaf, for now
    torch_pytree.register_pytree_node(Late, lambda v: ([v.item], None), lambda c, _: Late(*c))
    try:
        assert pytree.tree_leaves(Late(1)) == [1]
    finally:
        torch_pytree._deregister_pytree_node(Late)


@pytest.mark.parametrize("batch", [4, 7])
def test_symbolic_trace_returns_the_registered_class(model: Calibrate, batch: int) -> None:
    gm = fxloom.symbolic_trace(model, example_inputs=(measured(4),))
    m = measured(batch, seed=1)
    assert_same_interval(gm(m), model(m))


def test_a_traced_module_returning_the_class_survives_save_and_load(model: Calibrate) -> None:
    gm = fxloom.symbolic_trace(model, example_inputs=(measured(4),))
    buffer = io.BytesIO()
    fxloom.save(gm, buffer)
    loaded = fxloom.load(buffer.getvalue())
    m = measured(5, seed=2)
    assert_same_interval(loaded(m), model(m))


def test_export_lifts_the_leaves_of_a_registered_input(program: Any) -> None:
    assert program.graph_signature.user_inputs == ["m_0", "m_1"]
    assert program.in_spec.children[0].type is Measured
    assert program.out_spec.type is Interval and program.out_spec.context == "cm"


@pytest.mark.parametrize("batch", [4, 9])
def test_exported_module_takes_and_returns_the_registered_classes(model, program, batch) -> None:
    m = measured(batch, seed=3)
    assert_same_interval(program.module()(m), model(m))


def test_unflattened_program_takes_and_returns_the_registered_classes(model, program) -> None:
    m = measured(6, seed=4)
    assert_same_interval(unflatten(program)(m), model(m))


def test_exported_program_with_registered_classes_survives_save_and_load(model, program):
    buffer = io.BytesIO()
    save(program, buffer)
    loaded = load(buffer.getvalue())
    assert loaded.in_spec == program.in_spec and loaded.out_spec == program.out_spec
    m = measured(3, seed=5)
    assert_same_interval(loaded.module()(m), model(m))


def test_exported_module_refuses_another_class_in_place_of_the_registered_one(program) -> None:
    with pytest.raises(ValueError, match="input 'm'.*Measured"):
        program.module()((torch.randn(4, 3), torch.randn(4, 3)))
