"""One backend interface: lowering, fxloom.compile, pipeline stages and saving ask it.

A backend (``fxloom.backends.Backend``) says what it supports, how it compiles a region,
whether its regions run backward and how the modules it makes are saved; ``BACKENDS``
knows them by name. These tests show the registry, a backend written by a user running
through ``lower`` and ``fxloom.compile``, the eager backend, and ONNX Runtime's regions
saved by its backend's rule (a file written before the interface loads and saves alike).
"""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import fxloom
from fxloom.backends import (
    BACKENDS,
    Backend,
    UntranslatableNodesError,
    get_backend,
    register_backend,
    saved_module_rules,
)
from fxloom.lower import OrtModule, lower
from fxloom.serialize.archive import FORMAT_VERSION

# Written with fxloom.save by main at 7886ac6, before the backend interface (``lowered_mlp``).
OLD_FILE = Path(__file__).parent / "data" / "lowered_mlp_7886ac6.fxl"
onnxruntime_only = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("onnx", "onnxruntime")),
    reason="needs fxloom[onnx]",
)


class Counted(nn.Module):
    """What the test backend compiles a region into: the region, counting its calls."""

    def __init__(self, region: nn.Module) -> None:
        super().__init__()
        self.region = region
        self.calls = 0

    def forward(self, *args):
        self.calls += 1
        return self.region(*args)


class ReluOnly(Backend):
    """A backend that runs torch.relu and nothing else."""

    name = "relu_only"
    trainable = True

    def unsupported_reason(self, node, gm):
        if node.op == "call_function" and node.target is torch.relu:
            return None
        return "relu_only runs torch.relu only"

    def compile(self, region, example_inputs):
        return Counted(region)


@pytest.fixture
def relu_only():
    backend = register_backend(ReluOnly())
    yield backend
    del BACKENDS[backend.name]


def relu_between_linears():
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    return Net().eval(), (torch.randn(3, 4),)


def lowered_mlp():
    """The model of ``OLD_FILE``: one region in ONNX Runtime."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    return model, (torch.randn(3, 4),)


def compiled_regions(lowered: nn.Module, kind: type) -> list[nn.Module]:
    return [module for module in lowered.children() if isinstance(module, kind)]


def saved_bytes(module: nn.Module) -> bytes:
    buffer = io.BytesIO()
    fxloom.save(module, buffer)
    return buffer.getvalue()


def members(data: bytes) -> dict[str, bytes]:
    """A file's members by name (its program and its tensors): the file less its zip dates,
    and less the torch release that wrote it (``format.json`` records it; the suite runs on
    several), so the same program saved by another torch compares equal."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        found = {name: archive.read(name) for name in archive.namelist()}
    header = json.loads(found["fxloom/format.json"])
    header["torch_version"] = "<any>"
    found["fxloom/format.json"] = json.dumps(header, sort_keys=True).encode()
    return found


# ---------------------------------------------------------------- the registry
def test_the_registry_knows_eager_and_onnxruntime():
    assert get_backend("eager") is BACKENDS["eager"]
    assert get_backend("onnxruntime") is BACKENDS["onnxruntime"]


def test_eager_regions_train_and_onnxruntime_regions_do_not():
    assert get_backend("eager").trainable and not get_backend("onnxruntime").trainable


def test_an_unknown_backend_names_the_known_ones():
    with pytest.raises(ValueError, match=r"no backend 'tvm'; known: eager, onnxruntime\. "):
        get_backend("tvm")


def test_a_backend_instance_is_its_own_backend():
    backend = ReluOnly()
    assert get_backend(backend) is backend


def test_a_taken_name_is_replaced_only_when_asked(relu_only):
    with pytest.raises(ValueError, match="'relu_only' is registered already"):
        register_backend(ReluOnly())
    replacement = register_backend(ReluOnly(), replace=True)
    assert get_backend("relu_only") is replacement


def test_a_backend_without_a_name_is_refused():
    class Nameless(Backend):
        pass

    with pytest.raises(ValueError, match="Nameless.name must be a name"):
        register_backend(Nameless())


@onnxruntime_only
def test_a_module_class_has_one_saving_backend():
    class Impostor(Backend):
        name = "impostor"
        saved_modules = {OrtModule: get_backend("onnxruntime").saved_modules[OrtModule]}

    with pytest.raises(ValueError, match="OrtModule is saved by the backend 'onnxruntime'"):
        register_backend(Impostor())


@pytest.mark.bytecode
def test_compiling_eagerly_and_saving_leave_lowering_unimported():
    """The registry is cheap: fxloom.lower (and ONNX Runtime's backend) loads when asked for."""
    script = (
        "import io, sys, torch, fxloom\n"
        "compiled = fxloom.compile(lambda x: torch.relu(x) + 1)\n"
        "compiled(torch.randn(3))\n"
        "fxloom.save(fxloom.symbolic_trace(torch.nn.Linear(2, 2)), io.BytesIO())\n"
        "print('fxloom.lower' in sys.modules)\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["False"]


# ---------------------------------------------------------------- a user's backend in lower
def test_a_registered_backend_compiles_the_regions_it_supports(relu_only):
    model, inputs = relu_between_linears()
    lowered = lower(model, inputs, backend="relu_only")
    (region,) = compiled_regions(lowered, Counted)
    assert_close(lowered(*inputs), model(*inputs))
    assert region.calls >= 1  # lowering tried it; the call above ran it again


def test_the_report_names_the_backend_and_why_the_rest_stays(relu_only):
    model, inputs = relu_between_linears()
    report = lower(model, inputs, backend="relu_only").lowering_report
    assert report.backend == "relu_only" and len(report.lowered) == 1
    assert {node.reason for node in report.left} == {"relu_only runs torch.relu only"}


def test_a_backend_instance_lowers_without_being_registered():
    model, inputs = relu_between_linears()
    lowered = lower(model, inputs, backend=ReluOnly())
    assert len(compiled_regions(lowered, Counted)) == 1
    assert "relu_only" not in BACKENDS


def test_a_region_the_backend_fails_to_compile_stays_in_pytorch(relu_only, monkeypatch):
    def broken(region, example_inputs):
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(relu_only, "compile", broken)
    model, inputs = relu_between_linears()
    lowered = lower(model, inputs, backend="relu_only")
    (region,) = lowered.lowering_report.regions
    assert not region.lowered and "no kernel for this shape" in region.reason
    assert_close(lowered(*inputs), model(*inputs))


def test_lower_with_an_unknown_backend_names_the_known_ones():
    model, inputs = relu_between_linears()
    with pytest.raises(ValueError, match="no backend 'tensorrt'; known: eager, onnxruntime"):
        lower(model, inputs, backend="tensorrt")


# ---------------------------------------------------------------- eager
def test_eager_compiles_a_region_to_itself():
    model, inputs = relu_between_linears()
    gm = fxloom.symbolic_trace(model)
    assert get_backend("eager").compile(gm, inputs) is gm


def test_gradients_flow_through_eager_regions():
    model, (x,) = relu_between_linears()
    lowered = lower(model, (x,), backend="eager")
    x.requires_grad_()
    (through_lowered,) = torch.autograd.grad(lowered(x).sum(), x)
    (through_model,) = torch.autograd.grad(model(x).sum(), x)
    assert_close(through_lowered, through_model)


# ---------------------------------------------------------------- fxloom.compile
@pytest.mark.bytecode
def test_fxloom_compile_runs_a_registered_backend_by_name(relu_only):
    def f(x):
        return torch.relu(x) * 2

    x = torch.randn(5)
    compiled = fxloom.compile(f, backend="relu_only")
    assert torch.equal(compiled(x), f(x))


def test_fxloom_compile_names_the_known_backends():
    with pytest.raises(ValueError, match="fxloom.compile: no backend 'tvm'; known: eager"):
        fxloom.compile(lambda x: x, backend="tvm")


# ---------------------------------------------------------------- ONNX Runtime
@onnxruntime_only
def test_onnxruntime_compiles_a_whole_graph_as_pipeline_stages_ask():
    model, inputs = lowered_mlp()
    stage = fxloom.symbolic_trace(model)
    region = get_backend("onnxruntime").compile(stage, inputs)
    assert isinstance(region, OrtModule)
    assert_close(region(*inputs), model(*inputs), rtol=1e-5, atol=1e-6)


@onnxruntime_only
def test_onnxruntime_saves_its_regions_by_its_backends_rule():
    assert saved_module_rules()[OrtModule] is get_backend("onnxruntime").saved_modules[OrtModule]


@onnxruntime_only
def test_a_lowered_module_saves_and_loads_equal():
    model, inputs = lowered_mlp()
    lowered = lower(model, inputs)
    loaded = fxloom.load(io.BytesIO(saved_bytes(lowered)))
    assert len(compiled_regions(loaded, OrtModule)) == 1
    assert_close(loaded(*inputs), lowered(*inputs))


@onnxruntime_only
def test_a_lowered_file_written_before_the_interface_loads_and_runs():
    model, inputs = lowered_mlp()
    loaded = fxloom.load(OLD_FILE)
    assert_close(loaded(*inputs), model(*inputs), rtol=1e-5, atol=1e-6)


@onnxruntime_only
def test_a_loaded_region_is_saved_again_in_the_same_bytes():
    """The same members, byte for byte, but for the format version: the file was written at
    version 2, and saving writes the current one (version 3 changed only quantized tensors'
    records, which this file has none of)."""
    again = members(saved_bytes(fxloom.load(OLD_FILE)))
    old = members(OLD_FILE.read_bytes())
    assert json.loads(again["fxloom/format.json"])["version"] == FORMAT_VERSION
    for found in (again, old):
        header = json.loads(found["fxloom/format.json"])
        header["version"] = "<current>"
        found["fxloom/format.json"] = json.dumps(header, sort_keys=True).encode()
    assert again == old


@onnxruntime_only
def test_lower_with_onnxruntime_named_or_given_lowers_alike():
    model, inputs = lowered_mlp()
    by_name = lower(model, inputs, backend="onnxruntime").lowering_report
    by_default = lower(model, inputs).lowering_report
    assert by_name.summary() == by_default.summary()
    assert by_name.notes == by_default.notes


class AcceptsSinButCannotCompileIt(Backend):
    """Says it supports everything, then finds at compile time that it cannot compile sin:
    as a translator meets a node its support check let through."""

    name = "no_sin_after_all"
    trainable = True

    def unsupported_reason(self, node, gm):
        return None

    def compile(self, region, example_inputs):
        refused = [
            (node, "sin has no kernel here")
            for node in region.graph.nodes
            if node.op == "call_function" and node.target is torch.sin
        ]
        if refused:
            raise UntranslatableNodesError("cannot compile sin", refused)
        return Counted(region)


def test_a_node_the_backend_cannot_compile_splits_its_region_instead_of_dropping_it():
    backend = register_backend(AcceptsSinButCannotCompileIt())
    try:

        def middle_sin(x):
            y = torch.relu(x) * 2 + 1
            y = torch.sin(y)
            return torch.tanh(y) - 3

        x = torch.randn(3, 4)
        lowered = lower(middle_sin, (x,), backend=backend.name)
    finally:
        del BACKENDS[backend.name]
    report = lowered.lowering_report
    assert [region.lowered for region in report.regions] == [True, True]
    assert [left.op for left in report.left] == ["torch.sin"]
    assert "sin has no kernel here" in report.left[0].reason
    torch.testing.assert_close(lowered(x), middle_sin(x))


def test_lowering_nothing_warns_and_names_why(relu_only):
    def no_relu(x):
        return torch.sin(x) + 1

    with pytest.warns(fxloom.lower.LoweringWarning, match="no operator lowered to relu_only"):
        lowered = lower(no_relu, (torch.randn(3),), backend=relu_only.name)
    assert "relu_only runs torch.relu only" in str(lowered.lowering_report)


def test_lowering_less_than_the_share_asked_warns(relu_only):
    model, inputs = relu_between_linears()
    with pytest.warns(fxloom.lower.LoweringWarning, match=r"1 of 3 operators lowered.*below"):
        lower(model, inputs, backend=relu_only.name, min_lowered=0.5)
