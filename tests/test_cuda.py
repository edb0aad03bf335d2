"""fxloom on a GPU: trace, export (static and dynamic), save/load, DataParallel, on CUDA.

Every test here needs CUDA and is skipped without it (``tests/conftest.py``); the CPU suite
covers the same features with the ``meta`` device where a second device is needed.
``tools/gpu_check.sh`` runs this file and the whole suite on a GPU machine. Numerics are
compared with eager on the same device, at the example batch and at another one.
"""

from __future__ import annotations

import io
import json
import zipfile

import pytest
import torch
from torch import nn

import fxloom
from fxloom import zoo
from fxloom.export import Dim, export
from fxloom.export import load as load_program
from fxloom.export import save as save_program

pytestmark = pytest.mark.cuda

CUDA = torch.device("cuda", 0)
BATCHES = (2, 5)


def model_on_gpu(name: str = "resnet_tiny") -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model, (x,) = zoo.build(name)
    return model.to(CUDA).eval(), x.to(CUDA)


def batch_of(x: torch.Tensor, batch: int) -> torch.Tensor:
    return torch.randn(batch, *x.shape[1:], device=x.device)


def saved_bytes(save, value) -> bytes:
    buffer = io.BytesIO()
    save(value, buffer)
    return buffer.getvalue()


# ------------------------------------------------------------------ capture
def test_a_traced_gpu_model_matches_eager_at_two_batch_sizes():
    model, x = model_on_gpu()
    gm = fxloom.symbolic_trace(model)
    for batch in BATCHES:
        inputs = batch_of(x, batch)
        torch.testing.assert_close(gm(inputs), model(inputs))


def test_an_exported_gpu_model_keeps_its_device_in_meta():
    model, x = model_on_gpu()
    ep = export(model, (batch_of(x, 2),))
    vals = [n.meta["val"] for n in ep.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert vals and all(v.device.type == "cuda" for v in vals)
    inputs = batch_of(x, 2)
    torch.testing.assert_close(ep.module()(inputs), model(inputs))


def test_a_dynamic_batch_export_on_the_gpu_runs_at_other_batches():
    model, x = model_on_gpu()
    ep = export(model, (batch_of(x, 2),), dynamic_shapes=({0: Dim("batch")},))
    for batch in BATCHES:
        inputs = batch_of(x, batch)
        torch.testing.assert_close(ep.module()(inputs), model(inputs))


def test_a_convolution_index_bound_narrows_the_batch_and_is_reported():
    # CUDA convolutions index with 32 bits: a bound they put on the batch (ResNet-50 at
    # 224x224: about 880,801) is a narrowing reported with its width, never a refusal.
    model, x = model_on_gpu()
    big = torch.randn(2, 3, 224, 224, device=CUDA)
    ep = export(model, (big,), dynamic_shapes=({0: Dim("batch")},))
    print("batch range on CUDA:", ep.range_constraints, ep.shape_constraints)
    assert all("index width" in line for line in ep.shape_constraints if "2147483" in line)
    torch.testing.assert_close(ep.module()(big), model(big))


# ------------------------------------------------------------------ save and load
def test_a_saved_gpu_module_records_cuda_and_loads_back_on_the_gpu():
    model, x = model_on_gpu()
    data = saved_bytes(fxloom.save, fxloom.symbolic_trace(model))
    program = json.loads(zipfile.ZipFile(io.BytesIO(data)).read("fxloom/program.json"))
    assert '"device": "cuda:0"' in json.dumps(program)
    loaded = fxloom.load(data)
    assert {p.device for p in loaded.parameters()} == {CUDA}
    inputs = batch_of(x, 3)
    torch.testing.assert_close(loaded(inputs), model(inputs))


def test_a_saved_gpu_module_loads_on_the_cpu_with_map_location():
    model, x = model_on_gpu()
    data = saved_bytes(fxloom.save, fxloom.symbolic_trace(model))
    loaded = fxloom.load(data, map_location="cpu")
    assert {p.device.type for p in loaded.parameters()} == {"cpu"}
    inputs = batch_of(x, 3)
    torch.testing.assert_close(loaded(inputs.cpu()), model(inputs).cpu(), rtol=1e-4, atol=1e-4)


def test_a_cpu_module_loads_on_the_gpu_with_map_location():
    model, x = model_on_gpu()
    cpu_model = model.cpu()
    data = saved_bytes(fxloom.save, fxloom.symbolic_trace(cpu_model))
    loaded = fxloom.load(data, map_location={"cpu": "cuda:0"})
    assert {p.device for p in loaded.parameters()} == {CUDA}
    inputs = batch_of(x.cpu(), 3)
    torch.testing.assert_close(
        loaded(inputs.to(CUDA)).cpu(), cpu_model(inputs), rtol=1e-4, atol=1e-4
    )


def test_a_saved_gpu_program_loads_on_the_gpu_and_on_the_cpu():
    model, x = model_on_gpu()
    ep = export(model, (batch_of(x, 2),), dynamic_shapes=({0: Dim("batch")},))
    data = saved_bytes(save_program, ep)
    inputs = batch_of(x, 5)
    on_gpu = load_program(data)
    torch.testing.assert_close(on_gpu.module()(inputs), model(inputs))
    on_cpu = load_program(data, map_location="cpu")
    assert {t.device.type for t in on_cpu.state_dict.values()} == {"cpu"}
    torch.testing.assert_close(
        on_cpu.module()(inputs.cpu()), model(inputs).cpu(), rtol=1e-4, atol=1e-4
    )


# ------------------------------------------------------------------ DataParallel
@pytest.mark.parametrize("called_first", [False, True], ids=["fresh", "after a call"])
def test_data_parallel_runs_a_graph_module(called_first):
    model, x = model_on_gpu()
    gm = fxloom.symbolic_trace(model)
    inputs = batch_of(x, 4)
    if called_first:
        gm(inputs)
    parallel = nn.DataParallel(gm)  # every visible GPU; one GPU calls the module itself
    torch.testing.assert_close(parallel(inputs), model(inputs))


@pytest.mark.parametrize("called_first", [False, True], ids=["fresh", "after a call"])
def test_replicate_gives_working_replicas_on_the_gpu(called_first):
    model, x = model_on_gpu()
    gm = fxloom.symbolic_trace(model)
    inputs = batch_of(x, 4)
    if called_first:
        gm(inputs)
    devices = list(range(torch.cuda.device_count()))
    for replica, device in zip(nn.parallel.replicate(gm, devices), devices, strict=True):
        torch.testing.assert_close(replica(inputs.to(device)).to(CUDA), model(inputs))
