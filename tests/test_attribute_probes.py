"""Attributes read on traced values: probes follow the example, no name is fxloom's.

Libraries ask what a value is by probing its attributes (transformers checks
``hasattr(x, "jax")`` to detect torchax). With example inputs a proxy answers as its
example would: a missing attribute raises ``AttributeError``, so ``hasattr`` is False and
``getattr(x, name, default)`` gives the default, and no call of it is recorded that would
fail at run time. Every attribute name other than torch.fx's ``node`` and ``tracer`` is the
traced value's: ``x.value`` of a traced enum or result object is recorded, not answered by
fxloom.
"""

from __future__ import annotations

import enum

import pytest
import torch
import torch.fx
from torch.testing import assert_close

import fxloom as fx

X = torch.randn(2, 4)


class TorchaxProbe(torch.nn.Module):
    """Probes its input as transformers' ``is_jax_jitting`` does (utils/import_utils.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        if hasattr(x, "jax"):
            x = x.jax()
        return self.linear(x)


def test_hasattr_of_an_attribute_the_example_lacks_is_false_as_eagerly():
    model = TorchaxProbe()
    gm = fx.symbolic_trace(model, example_inputs=(X,))
    assert "jax" not in gm.code
    assert_close(gm(torch.ones(5, 4)), model(torch.ones(5, 4)))


def test_getattr_with_a_default_gives_the_default_for_a_missing_attribute():
    def fn(x):
        convert = getattr(x, "numpy_like", None)
        return x * 2 if convert is None else convert()

    gm = fx.symbolic_trace(fn, example_inputs=(X,))
    assert_close(gm(X), X * 2)


def test_reading_a_missing_attribute_fails_as_eagerly_naming_the_value():
    def fn(x):
        return x.jax()

    with pytest.raises(AttributeError, match="'Tensor' object has no attribute 'jax'.*%x"):
        fx.symbolic_trace(fn, example_inputs=(X,))


def test_a_probe_of_an_attribute_of_an_attribute_records_nothing():
    class Holder:
        inner = None

    def fn(x, holder):
        assert not hasattr(holder.inner, "jax")
        return x + 1

    gm = fx.symbolic_trace(fn, example_inputs=(X, Holder()))
    assert [n.op for n in gm.graph.nodes].count("call_function") == 2  # the guard and the add


def test_attributes_the_example_has_are_still_recorded():
    def fn(x):
        assert hasattr(x, "shape") and hasattr(x, "T")
        return x.T.relu() + x.shape[0]

    gm = fx.symbolic_trace(fn, example_inputs=(X,))
    y = torch.randn(3, 4)
    assert_close(gm(y), y.T.relu() + 3)


def test_without_example_inputs_any_attribute_is_recorded_as_in_torch_fx():
    def fn(x):
        return x.jax() if hasattr(x, "jax") else x

    ours, theirs = fx.symbolic_trace(fn), torch.fx.symbolic_trace(fn)
    targets = [n.target for n in ours.graph.nodes if n.op == "call_method"]
    assert targets == [n.target for n in theirs.graph.nodes if n.op == "call_method"] == ["jax"]


class Mode(enum.Enum):
    HALF = 0.5
    DOUBLE = 2.0


class Scaled(torch.nn.Module):
    def forward(self, x, mode):
        return x * mode.value


TRACERS = {"torch.fx": torch.fx.symbolic_trace, "fxloom": fx.symbolic_trace}


@pytest.mark.parametrize("tracer", TRACERS)
def test_value_of_a_traced_enum_reads_the_enum_member(tracer):
    gm = TRACERS[tracer](Scaled())
    assert_close(gm(X, Mode.DOUBLE), X * 2.0)
    assert_close(gm(X, Mode.HALF), X * 0.5)


def test_value_of_a_traced_enum_with_an_example_is_recorded_not_fixed():
    gm = fx.symbolic_trace(Scaled(), example_inputs=(X, Mode.DOUBLE))
    assert_close(gm(X, Mode.HALF), X * 0.5)


class Result:
    """An object with a ``value`` attribute, as ``torch._scaled_mm``-style results have."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


def make_result(x: torch.Tensor) -> Result:
    return Result(x + 1)


torch.fx.wrap("make_result")  # fxloom records the functions torch.fx.wrap registers too


def result_value(x):
    return make_result(x).value * 3


@pytest.mark.parametrize("tracer", TRACERS)
def test_value_of_a_traced_result_is_recorded_as_the_user_attribute(tracer):
    gm = TRACERS[tracer](result_value)
    assert [n.args[1] for n in gm.graph.nodes if n.target is getattr] == ["value"]
    assert_close(gm(X), (X + 1) * 3)


def test_value_of_a_traced_result_with_an_example_is_the_user_attribute_too():
    gm = fx.symbolic_trace(result_value, example_inputs=(X,))
    assert [n.args[1] for n in gm.graph.nodes if n.target is getattr] == ["value"]
    assert_close(gm(X), (X + 1) * 3)
