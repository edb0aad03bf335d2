"""GraphModules deploy through TorchScript (paper section 5.4) and replicate like any module.

fxloom never imports torch.jit itself; these tests script its output, as a user deploying a
transformed model would, and compare the scripted module with eager PyTorch and torch.fx.
"""

from __future__ import annotations

import math
import warnings

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


GUARDED = pytest.mark.xfail(
    strict=True,
    reason="run-time guards (check_length for `b, n = x.shape`, which torch.fx cannot trace at "
    "all) are Python functions TorchScript cannot compile yet",
)


@pytest.mark.parametrize(
    "name", ["mlp_tiny", "resnet_tiny", pytest.param("transformer_tiny", marks=GUARDED)]
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


def torch_fx_scripted(model: torch.nn.Module) -> torch.jit.ScriptModule | None:
    try:
        return scripted(torch.fx.symbolic_trace(model))
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
