"""GraphModules deploy through TorchScript (paper section 5.4) and replicate like any module.

fxloom never imports torch.jit itself; these tests script its output, as a user deploying a
transformed model would, and compare the scripted module with eager PyTorch and torch.fx.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import warnings
from typing import Optional

import pytest
import torch
import torch.fx
from torch.testing import assert_close

import fxloom as fx
from fxloom.zoo import (
    mlp_tiny,
    mlp_tiny_inputs,
    resnet_tiny,
    resnet_tiny_inputs,
    transformer_tiny,
    transformer_tiny_inputs,
)


@pytest.fixture(autouse=True)
def _quiet_torchscript_deprecation():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def scripted(gm: torch.nn.Module) -> torch.jit.ScriptModule:
    return torch.jit.script(gm)


ZOO = {
    "mlp_tiny": (mlp_tiny, mlp_tiny_inputs),
    "resnet_tiny": (resnet_tiny, resnet_tiny_inputs),
    "transformer_tiny": (transformer_tiny, transformer_tiny_inputs),
}


OPTIONAL_MASK_ADDED = pytest.mark.xfail(
    strict=True,
    reason="its guards script, but the trace took `if mask is not None` as true (a traced value "
    "is never None, as in torch.fx), so the code adds `mask`, annotated Optional[Tensor], "
    "unchecked, which TorchScript refuses; torch.fx's output of it does not script either",
)


@pytest.mark.parametrize(
    "name", ["mlp_tiny", "resnet_tiny", pytest.param("transformer_tiny", marks=OPTIONAL_MASK_ADDED)]
)
def test_a_traced_zoo_model_scripts_and_matches_eager_and_torch_fx(name):
    build, inputs = ZOO[name]
    model = build().eval()
    args = inputs()
    ours = scripted(fx.symbolic_trace(model))
    with torch.no_grad():
        assert_close(ours(*args), model(*args))
        # torch.fx's own output of these models does not script (see below): its traced
        # module runs in Python.
        assert_close(ours(*args), torch.fx.symbolic_trace(model)(*args))


def torch_fx_scripted(model: torch.nn.Module, **trace_kwargs) -> torch.jit.ScriptModule | None:
    try:
        return scripted(torch.fx.symbolic_trace(model, **trace_kwargs))
    except RuntimeError:
        return None


def test_annotated_signatures_script_where_torch_fx_output_does_not():
    # torch.fx prints ``x: torch.Tensor`` as ``x : _torch_Tensor_``, a name TorchScript's
    # resolver does not find; fxloom binds the annotation's object itself.
    model = mlp_tiny().eval()
    assert torch_fx_scripted(model) is None
    (x,) = mlp_tiny_inputs()
    assert_close(scripted(fx.symbolic_trace(model))(x), model(x))


@fx.wrap
def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class UsesEverything(torch.nn.Module):
    """Parameters, buffers, a captured tensor constant, a wrapped function, math and len()."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("offset", torch.ones(4))
        self.scale = torch.nn.Parameter(torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = doubled(self.lin(x)) * self.scale + self.offset
        return y + math.sqrt(2.0) + SHIFT


SHIFT = torch.tensor([0.0, 1.0, 2.0, 3.0])


def test_parameters_buffers_constants_and_wrapped_functions_script():
    model = UsesEverything()
    gm = fx.symbolic_trace(model)
    x = torch.randn(3, 4)
    assert_close(scripted(gm)(x), model(x))


def test_the_traced_signature_annotations_reach_torchscript():
    class Annotated(torch.nn.Module):
        def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
            return x * k

    s = scripted(fx.symbolic_trace(Annotated()))
    assert_close(s(torch.ones(2), 3), torch.full((2,), 3.0))
    assert "int" in str(s.forward.schema)


class OptionalBias(torch.nn.Module):
    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return x + 1 if bias is None else x + bias


def test_optional_annotations_script():
    # Printed typing.Optional[torch.Tensor]: TorchScript reads no typing.Union with a None.
    gm = fx.symbolic_trace(OptionalBias(), concrete_args={"bias": None})
    assert "bias: typing.Optional[torch.Tensor] = None" in gm.code
    x = torch.randn(3)
    assert_close(scripted(gm)(x), OptionalBias()(x))


# As the torch.fx documentation suggests: ``len`` of a traced value is recorded as a call.
fx.wrap("len")


def count(x):
    return x + len(x)


def test_len_of_a_traced_value_wrapped_as_torch_fx_documents_scripts():
    gm = fx.symbolic_trace(count)
    assert_close(scripted(gm)(torch.zeros(5)), torch.full((5,), 5.0))


def test_a_transformed_graph_module_still_scripts():
    model = mlp_tiny().eval()
    gm = fx.symbolic_trace(model)
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), torch.nn.ReLU):
            node.op, node.target = "call_function", torch.sigmoid
    gm.recompile()
    assert sum(node.target is torch.sigmoid for node in gm.graph.nodes) == 2
    (x,) = mlp_tiny_inputs()
    assert_close(scripted(gm)(x), gm(x))


def test_a_graph_module_replicates_for_data_parallel():
    model = mlp_tiny().eval()
    gm = fx.symbolic_trace(model)
    replica = gm._replicate_for_data_parallel()
    (x,) = mlp_tiny_inputs()
    assert_close(replica(x), model(x))


def test_data_parallel_wraps_a_graph_module():
    model = mlp_tiny().eval()
    parallel = torch.nn.DataParallel(fx.symbolic_trace(model))
    (x,) = mlp_tiny_inputs()
    assert_close(parallel(x), model(x))


# ---------------------------------------------------------------- guards in scripted code
# The checks a trace records for its assumptions (fxloom.guards) script with the module: the
# scripted module raises the same error, with the same message, where the assumption breaks.


class Gate(torch.nn.Module):
    """A data-dependent branch, an unpacked shape, and an input of one dtype and rank."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n = x.shape
        if x.sum() > 0:
            x = x.relu()
        return x.reshape(b * n)


def traced_gate() -> fx.GraphModule:
    return fx.symbolic_trace(Gate(), example_inputs=(torch.ones(2, 3),))


def error_of(module: torch.nn.Module, *args) -> str:
    with pytest.raises(Exception) as caught:
        module(*args)
    return str(caught.value)


def test_a_module_traced_with_example_inputs_scripts_with_its_guards():
    gm = traced_gate()
    assert "check_bool(gt, True," in gm.code  # the branch guard, as the code reads
    assert "check_length(getattr_1, 2," in gm.code and "check_tensor_input(x," in gm.code
    x = torch.randn(2, 3).abs()
    assert_close(scripted(gm)(x), Gate()(x))


@pytest.mark.parametrize(
    "broken, message",
    [
        (-torch.ones(2, 3), "for which bool(...) at test_torchscript.py"),  # the other branch
        (torch.ones(2, 3, 4), "traced with a 2-d"),  # another rank
        (torch.ones(2, 3, dtype=torch.float64), "traced with a 2-d"),  # another dtype
    ],
)
def test_the_scripted_module_raises_where_the_traced_one_does(broken, message):
    gm = traced_gate()
    assert message in error_of(gm, broken)
    assert message in error_of(scripted(gm), broken)


class Conversions(torch.nn.Module):
    """Values the trace turns into Python numbers, and a loop over a tensor's rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for row in x:
            x = x + row
        return x * int(x.max()) + float(x.min())


def test_int_float_and_loop_length_guards_script_and_raise_like_the_traced_ones():
    gm = fx.symbolic_trace(Conversions(), example_inputs=(torch.ones(2, 3),))
    assert "check_int(" in gm.code and "check_float(" in gm.code and "check_len(" in gm.code
    assert_close(scripted(gm)(torch.ones(2, 3)), Conversions()(torch.ones(2, 3)))
    for message, broken in [("int(...)", 2 * torch.ones(2, 3)), ("len(...)", torch.ones(3, 3))]:
        assert message in error_of(gm, broken)
        assert message in error_of(scripted(gm), broken)


def test_an_unpack_guard_raises_in_the_scripted_module_with_its_message():
    # The rank guard comes first for a tensor input; a list of sizes reaches the unpack guard.
    def split(sizes: list[int]) -> int:
        b, n = sizes
        return b * n

    gm = fx.symbolic_trace(split, concrete_args={})
    expected = "unpacks or iterates over exactly 2 elements"
    assert expected in error_of(gm, [1, 2, 3])
    assert expected in error_of(scripted(gm), [1, 2, 3])
    assert scripted(gm)([2, 5]) == 10


def top_and_halves(x: torch.Tensor) -> torch.Tensor:
    values, indices = x.max(0)  # a tuple: TorchScript knows its length from its type
    first, second = x.chunk(2)  # a list: its length is checked at run time
    return values + indices + first + second


def test_unpacked_tuples_and_lists_script_as_torch_fx_traces_them():
    gm = fx.symbolic_trace(top_and_halves)
    assert gm.code.count("check_length(") == 2
    x = torch.randn(2, 3)
    assert_close(scripted(gm)(x), top_and_halves(x))
    assert_close(scripted(gm)(x), torch.fx.symbolic_trace(top_and_halves)(x))


class Switchable(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: float = 2.0, relu: bool = True) -> torch.Tensor:
        if relu:
            x = x.relu()
        return x * scale


def test_arguments_fixed_to_literals_script_where_torch_fx_output_does_not():
    gm = fx.symbolic_trace(Switchable(), concrete_args={"relu": True})
    assert "check_fixed(relu, True, 'relu')" in gm.code
    x = torch.randn(3)
    assert_close(scripted(gm)(x), Switchable()(x))
    # torch.fx drops the annotation of a fixed argument (``relu_1 = True``): TorchScript
    # takes it for a tensor.
    assert torch_fx_scripted(Switchable(), concrete_args={"relu": True}) is None
    assert_close(
        scripted(gm)(x), torch.fx.symbolic_trace(Switchable(), concrete_args={"relu": True})(x)
    )


def test_a_fixed_argument_given_another_value_raises_in_the_scripted_module():
    gm = fx.symbolic_trace(Switchable(), concrete_args={"relu": True, "scale": 2.0})
    expected = "argument 'relu' was fixed to True when this module was traced"
    assert expected in error_of(gm, torch.ones(3), 2.0, False)
    assert expected in error_of(scripted(gm), torch.ones(3), 2.0, False)


def test_an_unannotated_argument_fixed_to_a_literal_is_annotated_with_its_type():
    def shift(x: torch.Tensor, offset=3):
        return x + offset

    gm = fx.symbolic_trace(shift, concrete_args={"offset": 3})
    assert "offset: int = 3" in gm.code
    assert_close(scripted(gm)(torch.zeros(2)), torch.full((2,), 3.0))


def masked(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    return x if mask is None else x * mask


def test_an_optional_argument_fixed_to_none_scripts_and_refuses_a_tensor():
    gm = fx.symbolic_trace(masked, concrete_args={"mask": None})
    assert "check_fixed(mask, None, 'mask')" in gm.code
    x = torch.randn(3)
    assert_close(scripted(gm)(x), torch.fx.symbolic_trace(masked, concrete_args={"mask": None})(x))
    expected = "argument 'mask' was fixed to None when this module was traced"
    assert expected in error_of(gm, x, torch.ones(3))
    assert expected in error_of(scripted(gm), x, torch.ones(3))


def test_an_argument_fixed_to_an_object_is_checked_but_does_not_script():
    # A FixedArgument holds the object; TorchScript compiles no callable object it calls.
    config = {"relu": True}

    def configured(x: torch.Tensor, config: dict) -> torch.Tensor:
        return x.relu() if config["relu"] else x

    gm = fx.symbolic_trace(configured, concrete_args={"config": config})
    assert "config_fixed(config)" in gm.code
    with pytest.raises(RuntimeError):
        scripted(gm)


def test_a_scripted_guarded_module_saves_and_loads_for_deployment():
    buffer = io.BytesIO()
    torch.jit.save(scripted(traced_gate()), buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x = torch.randn(2, 3).abs()
    assert_close(loaded(x), Gate()(x))
    assert "for which bool(...)" in error_of(loaded, -torch.ones(2, 3))


def test_a_guarded_graph_module_still_pickles_and_runs_its_guards():
    restored = pickle.loads(pickle.dumps(traced_gate()))
    assert "for which bool(...)" in error_of(restored, -torch.ones(2, 3))


class Heads(torch.nn.Module):
    """Returns an OrderedDict, as torchvision's segmentation models do ("out", "aux")."""

    def forward(self, x: torch.Tensor):
        result = collections.OrderedDict()
        result["out"] = x.relu()
        result["aux"] = x + 1
        return result


def test_an_ordered_dict_output_keeps_its_type_and_order_and_scripts():
    gm = fx.symbolic_trace(Heads())
    x = torch.randn(2, 3)
    out = gm(x)
    assert type(out) is collections.OrderedDict and list(out) == ["out", "aux"]
    scripted_out = scripted(gm)(x)
    assert list(scripted_out) == ["out", "aux"]
    for key in out:
        assert_close(scripted_out[key], out[key])
