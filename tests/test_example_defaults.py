"""Example inputs name the inputs: parameters they leave out keep their defaults.

``symbolic_trace(model, example_inputs={"x": x})`` traces the call ``model(x=x)``: the
traced module takes exactly the inputs named (by name, or by position for a tuple), and
the model's code sees every other parameter at its default, as torch.export does with
its kwargs. ``concrete_args`` still decides for the parameters it names (``PH`` keeps one
an input). Without example inputs, every parameter is an input, as in torch.fx.
"""

from __future__ import annotations

import pytest
import torch
import torch.export
import torch.fx
from torch.testing import assert_close

import fxloom as fx


class Masked(torch.nn.Module):
    """A model whose optional inputs change what it computes, as Hugging Face models do."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, mask=None, scale=2.0, embeds=None):
        if (x is None) == (embeds is None):
            raise ValueError("give exactly one of x and embeds")
        hidden = self.linear(x if embeds is None else embeds)
        if mask is not None:
            hidden = hidden * mask
        return hidden * scale


def placeholders(gm: fx.GraphModule) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "placeholder"]


X = torch.randn(2, 4)
MASK = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])


def test_a_dict_of_inputs_leaves_the_other_parameters_at_their_defaults():
    model = Masked()
    gm = fx.symbolic_trace(model, example_inputs={"x": X})
    assert placeholders(gm) == ["x"]
    assert_close(gm(x=X), model(X))
    assert_close(gm(x=torch.ones(5, 4)), model(torch.ones(5, 4)))  # another batch size


def test_code_tests_a_left_out_parameter_against_its_default_value():
    # ``embeds is None`` must hold while tracing, as it does when the model is called with x.
    gm = fx.symbolic_trace(Masked(), example_inputs={"x": X, "mask": MASK})
    assert placeholders(gm) == ["x", "mask"]
    assert "embeds" not in gm.code and "scale" not in gm.code


def test_the_traced_module_takes_exactly_the_inputs_named():
    gm = fx.symbolic_trace(Masked(), example_inputs={"x": X})
    with pytest.raises(TypeError, match="scale"):
        gm(x=X, scale=3.0)  # not an input: the model was traced at its default


def test_a_tuple_covers_the_leading_positional_parameters():
    model = Masked()
    gm = fx.symbolic_trace(model, example_inputs=(X, MASK))
    assert placeholders(gm) == ["x", "mask"]
    assert_close(gm(X, MASK), model(X, MASK))
    other = torch.randn(3, 4)
    assert_close(gm(other, torch.ones(3, 4)), model(other, torch.ones(3, 4)))


def test_a_defaulted_parameter_given_in_the_examples_is_an_input():
    model = Masked()
    gm = fx.symbolic_trace(model, example_inputs={"x": X, "scale": 3.0})
    assert placeholders(gm) == ["x", "scale"]
    assert_close(gm(x=X, scale=5.0), model(X, scale=5.0))


def test_ph_in_concrete_args_keeps_a_defaulted_parameter_an_input_at_its_default():
    model = Masked()
    gm = fx.symbolic_trace(model, {"scale": fx.PH}, example_inputs={"x": X})
    assert placeholders(gm) == ["x", "scale"]
    assert_close(gm(X), model(X))  # the default stays the input's default
    assert_close(gm(X, scale=0.5), model(X, scale=0.5))


def test_concrete_args_still_fix_the_parameters_they_name():
    model = Masked()
    gm = fx.symbolic_trace(model, {"scale": 4.0}, example_inputs={"x": X})
    assert_close(gm(X), model(X, scale=4.0))
    with pytest.raises(ValueError, match="'scale' was fixed to 4.0"):
        gm(X, scale=1.0)  # fixed while tracing: another value is refused, as before


def test_a_parameter_without_a_default_that_the_examples_leave_out_stays_an_input():
    def add(x, y):
        return x + y

    gm = fx.symbolic_trace(add, example_inputs={"x": X})
    assert placeholders(gm) == ["x", "y"]
    assert_close(gm(X, X), X + X)


def test_without_example_inputs_every_parameter_is_an_input_as_in_torch_fx():
    def scaled(x, scale=2.0):
        return x * scale

    ours, theirs = fx.symbolic_trace(scaled), torch.fx.symbolic_trace(scaled)
    assert placeholders(ours) == ["x", "scale"]
    assert placeholders(ours) == [n.target for n in theirs.graph.nodes if n.op == "placeholder"]


def test_names_beyond_the_parameters_reach_kwargs_as_inputs():
    class Decorated(torch.nn.Module):
        def forward(self, x, **kwargs):
            bias = kwargs.get("bias")
            return x if bias is None else x + bias

    model, bias = Decorated(), torch.ones(4)
    gm = fx.symbolic_trace(model, example_inputs={"x": X, "bias": bias})
    assert_close(gm(x=X, bias=bias * 2), model(X, bias=bias * 2))
    plain = fx.symbolic_trace(model, example_inputs={"x": X})
    assert placeholders(plain) == ["x"]  # **kwargs left out: empty, as in the call model(x=X)
    assert_close(plain(x=X), X)


def test_a_name_that_is_no_parameter_is_refused_with_the_parameters():
    with pytest.raises(fx.TraceError, match=r"\['input_ids'\].*\['x', 'mask', 'scale', 'embeds'\]"):
        fx.symbolic_trace(Masked(), example_inputs={"x": X, "input_ids": X})


def test_positional_examples_beyond_the_parameters_reach_args():
    def total(x, *rest):
        return x + sum(rest)

    gm = fx.symbolic_trace(total, example_inputs=(X, X, X))
    assert_close(gm(X, X, X), 3 * X)
    assert_close(fx.symbolic_trace(total, example_inputs=(X,))(X), X)


def test_the_inputs_are_the_ones_torch_export_takes_from_the_same_dict():
    model, inputs = Masked(), {"x": X, "mask": MASK}
    ours = fx.symbolic_trace(model, example_inputs=inputs)
    theirs = torch.export.export(model, (), inputs, strict=False)
    assert placeholders(ours) == list(theirs.graph_signature.user_inputs)
    assert_close(ours(**inputs), theirs.module()(**inputs))
