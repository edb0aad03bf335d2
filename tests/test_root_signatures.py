"""What the root of a trace may be, and how its signature becomes placeholders — beside torch.fx.

Covers ``Tracer.traced_func_name``, builtin (C) functions as roots, ``*args``/``**kwargs``
and ``PH`` in ``concrete_args``.
"""

from __future__ import annotations

import inspect
import math
import operator

import pytest
import torch
import torch.fx

import fxloom


class TwoMethods(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1

    def other(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def call_targets(graph: object) -> list[object]:
    return [n.target for n in graph.nodes if n.op == "call_function"]


# ------------------------------------------------------------ traced_func_name
def test_traced_func_name_defaults_to_forward_as_in_torch_fx() -> None:
    assert fxloom.Tracer.traced_func_name == torch.fx.Tracer.traced_func_name == "forward"


def test_traced_func_name_traces_another_method() -> None:
    class TraceOther(fxloom.Tracer):
        traced_func_name = "other"

    class ReferenceTraceOther(torch.fx.Tracer):
        traced_func_name = "other"

    ours = TraceOther().trace(TwoMethods())
    reference = ReferenceTraceOther().trace(TwoMethods())
    assert call_targets(ours) == call_targets(reference) == [operator.mul]


def test_traced_func_name_may_be_set_on_an_instance() -> None:
    tracer = fxloom.Tracer()
    tracer.traced_func_name = "other"
    gm = fxloom.GraphModule(TwoMethods(), tracer.trace(TwoMethods()))
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), x * 2)


def test_a_missing_traced_func_name_is_an_error_of_torch_fx_type() -> None:
    class TraceMissing(fxloom.Tracer):
        traced_func_name = "missing"

    class ReferenceTraceMissing(torch.fx.Tracer):
        traced_func_name = "missing"

    with pytest.raises(AssertionError):
        ReferenceTraceMissing().trace(TwoMethods())
    with pytest.raises(
        AssertionError, match="traced_func_name='missing' is no method of TwoMethods"
    ):
        TraceMissing().trace(TwoMethods())


# ------------------------------------------------------------ builtin roots
def _has_signature(fn: object) -> bool:
    try:
        inspect.signature(fn)
    except (ValueError, TypeError):
        return False
    return True


@pytest.mark.parametrize("builtin", [torch.relu, torch.add, torch.Tensor.relu])
def test_a_builtin_root_without_a_signature_raises_what_torch_fx_raises(builtin: object) -> None:
    with pytest.raises(AssertionError):
        torch.fx.symbolic_trace(builtin)
    if _has_signature(builtin):  # Python 3.13 reads Tensor.relu's "($self, /)"
        pytest.skip("this Python gives it a signature: fxloom records it as one call")
    with pytest.raises(AssertionError, match="builtin .C. function without a signature"):
        fxloom.symbolic_trace(builtin)


def test_the_builtin_root_error_is_also_a_trace_error() -> None:
    with pytest.raises(fxloom.TraceError, match=r"lambda x: torch.relu\(x\)"):
        fxloom.symbolic_trace(torch.relu)


def test_a_builtin_root_with_a_signature_is_recorded_as_one_call() -> None:
    # Beyond torch.fx, which refuses every builtin root.
    gm = fxloom.symbolic_trace(math.sqrt)
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_function", "output"]
    assert call_targets(gm.graph) == [math.sqrt]
    assert gm(4.0) == 2.0


# ------------------------------------------------------------ *args / **kwargs
class VariadicForward(torch.nn.Module):
    def forward(self, *args, **kwargs):
        return args[0] * 2 + kwargs["bias"]


def placeholders(graph: object) -> list[str]:
    return [n.target for n in graph.nodes if n.op == "placeholder"]


def test_forward_with_star_args_and_kwargs_traces_into_their_placeholders_as_torch_fx() -> None:
    reference = torch.fx.symbolic_trace(VariadicForward())
    ours = fxloom.symbolic_trace(VariadicForward())
    assert placeholders(ours.graph) == placeholders(reference.graph) == ["*args", "**kwargs"]
    assert call_targets(ours.graph) == call_targets(reference.graph)
    x, bias = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(ours(x, bias=bias), reference(x, bias=bias))


def test_the_generated_signature_keeps_star_args_and_kwargs() -> None:
    gm = fxloom.symbolic_trace(VariadicForward())
    kinds = [p.kind for p in inspect.signature(gm.forward).parameters.values()]
    assert kinds == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]


def test_keyword_only_parameters_and_closures_reach_a_function_with_star_args() -> None:
    offset = torch.ones(3)

    def fn(x, *args, scale, **kwargs):
        return (x + args[1]) * scale + offset

    ours = fxloom.symbolic_trace(fn)
    x, a, b = torch.randn(3), torch.randn(3), torch.randn(3)
    torch.testing.assert_close(ours(x, a, b, scale=3.0), fn(x, a, b, scale=3.0))


def test_a_keyword_only_parameter_stays_after_star_args_unlike_torch_fx() -> None:
    def fn(x, *args, scale):
        return x * scale

    ours = inspect.signature(fxloom.symbolic_trace(fn).forward)
    reference = inspect.signature(torch.fx.symbolic_trace(fn).forward)
    assert str(ours) == "(x, *args, scale)"
    assert str(reference) == "(x, scale, *args)"  # torch.fx moves it before *args


def sums(x, *args):
    return x + sum(args)


def test_expanding_star_args_is_a_clear_error_naming_concrete_args() -> None:
    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(sums)
    with pytest.raises(fxloom.TraceError, match=r"\*args cannot be expanded") as info:
        fxloom.symbolic_trace(sums)
    assert "concrete_args={'args': (PH, PH)}" in str(info.value)


def test_expanding_kwargs_is_a_clear_error_naming_concrete_args() -> None:
    def passes_on(x, **kwargs):
        return torch.nn.functional.dropout(x, **kwargs)

    with pytest.raises(fxloom.TraceError, match=r"\*\*kwargs cannot be expanded"):
        fxloom.symbolic_trace(passes_on)


class Base(torch.nn.Module):
    def forward(self, x, scale=2.0):
        return x * scale


class HandsKwargsOn(torch.nn.Module):
    """A Hugging Face head model's shape: ``**kwargs`` only handed on to the base model."""

    def __init__(self) -> None:
        super().__init__()
        self.base = Base()

    def forward(self, x, **kwargs):
        return self.base(x, **kwargs) + 1


def test_kwargs_handed_on_trace_with_example_inputs_that_pass_none() -> None:
    gm = fxloom.symbolic_trace(HandsKwargsOn(), example_inputs={"x": torch.randn(2, 3)})
    for x in (torch.randn(2, 3), torch.randn(5, 4)):
        torch.testing.assert_close(gm(x), HandsKwargsOn()(x))


def test_kwargs_fixed_empty_by_the_examples_refuse_a_keyword_at_run_time() -> None:
    gm = fxloom.symbolic_trace(HandsKwargsOn(), example_inputs={"x": torch.randn(2, 3)})
    with pytest.raises(Exception, match="scale"):
        gm(torch.randn(2, 3), scale=3.0)


def test_concrete_args_give_star_args_a_fixed_number_of_inputs() -> None:
    gm = fxloom.symbolic_trace(sums, concrete_args={"args": (fxloom.PH, fxloom.PH)})
    x, a, b = torch.randn(3), torch.randn(3), torch.randn(3)
    torch.testing.assert_close(gm(x, a, b), sums(x, a, b))


# ------------------------------------------------------------ PH inside structures
def configured(x, cfg):
    return x * cfg["scale"] + cfg["bias"][0]


NESTED = {"scale": 2.0, "bias": (fxloom.PH,)}
REFERENCE_NESTED = {"scale": 2.0, "bias": (torch.fx.PH,)}


def test_ph_inside_a_nested_concrete_arg_is_an_input_as_in_torch_fx() -> None:
    ours = fxloom.symbolic_trace(configured, concrete_args={"cfg": NESTED})
    reference = torch.fx.symbolic_trace(configured, concrete_args={"cfg": REFERENCE_NESTED})
    x, bias = torch.randn(3), torch.randn(3)
    cfg = {"scale": 2.0, "bias": (bias,)}
    torch.testing.assert_close(ours(x, cfg), reference(x, cfg))
    torch.testing.assert_close(ours(x, cfg), configured(x, cfg))


def test_the_signature_keeps_the_structured_argument() -> None:
    ours = fxloom.symbolic_trace(configured, concrete_args={"cfg": NESTED})
    reference = torch.fx.symbolic_trace(configured, concrete_args={"cfg": REFERENCE_NESTED})
    assert str(inspect.signature(ours.forward)) == str(inspect.signature(reference.forward))


def test_a_fixed_leaf_of_a_structured_argument_is_checked_at_run_time() -> None:
    gm = fxloom.symbolic_trace(configured, concrete_args={"cfg": NESTED})
    with pytest.raises(ValueError, match="fixed to 2.0"):
        gm(torch.randn(3), {"scale": 3.0, "bias": (torch.randn(3),)})


def test_a_structured_argument_of_another_structure_is_refused() -> None:
    gm = fxloom.symbolic_trace(configured, concrete_args={"cfg": NESTED})
    with pytest.raises(TypeError, match="argument 'cfg' was traced as"):
        gm(torch.randn(3), {"scale": 2.0, "bias": (torch.randn(3), torch.randn(3))})
