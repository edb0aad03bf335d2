"""Devices in saved files: each tensor's device is recorded, and ``map_location`` moves them.

The CPU-only suite uses the ``meta`` device as the second device: a file saved on the CPU
loads onto ``meta`` with every form of ``map_location`` that ``torch.load`` takes. A file
that names a device this machine lacks is refused, naming the tensor and the option.
CUDA itself is covered by ``tests/test_cuda.py``.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import fxloom
from fxloom.export import Dim, export
from fxloom.export import load as load_program
from fxloom.export import save as save_program
from fxloom.serialize.archive import FORMAT_VERSION

FORMAT = "fxloom/format.json"
PROGRAM = "fxloom/program.json"
# A device index no machine has: "the saved device is missing" on every test machine.
MISSING_DEVICE = "cuda:99"


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids)) * self.scale


def saved_module(model: nn.Module | None = None) -> bytes:
    buffer = io.BytesIO()
    fxloom.save(fxloom.symbolic_trace(model or Tied()), buffer)
    return buffer.getvalue()


def rewritten(data: bytes, edits: dict[str, object]) -> bytes:
    """``data`` with JSON members replaced by ``edits[name](document)``'s result."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            content = src.read(info)
            if info.filename in edits:
                document = json.loads(content)
                edits[info.filename](document)
                content = json.dumps(document).encode()
            dst.writestr(info, content)
    return out.getvalue()


def tensor_records(document: object) -> Iterator[dict]:
    if isinstance(document, dict):
        if isinstance(document.get("key"), str) and "dtype" in document:
            yield document
        for value in document.values():
            yield from tensor_records(value)
    elif isinstance(document, list):
        for value in document:
            yield from tensor_records(value)


def on_device(data: bytes, device: str) -> bytes:
    """The file as if its tensors had been saved on ``device``."""

    def edit(program: dict) -> None:
        for record in tensor_records(program):
            record["device"] = device

    return rewritten(data, {PROGRAM: edit})


def devices(module: nn.Module) -> set[str]:
    return {str(t.device) for t in [*module.parameters(), *module.buffers()]}


# ------------------------------------------------------------------ recording
def test_each_tensor_record_names_its_device():
    program = json.loads(zipfile.ZipFile(io.BytesIO(saved_module())).read(PROGRAM))
    records = list(tensor_records(program))
    assert records and all(record["device"] == "cpu" for record in records)


def test_without_map_location_tensors_return_to_their_saved_device():
    loaded = fxloom.load(saved_module())
    assert devices(loaded) == {"cpu"}


# ------------------------------------------------------------------ map_location forms
@pytest.mark.parametrize(
    "form",
    [str, lambda d: d, lambda d: {"cpu": str(d)}, lambda d: {torch.device("cpu"): d}],
    ids=["string", "device", "dict-of-strings", "dict-of-devices"],
)
def test_map_location_moves_every_tensor(form, second_device):
    loaded = fxloom.load(saved_module(), map_location=form(second_device))
    assert {torch.device(d).type for d in devices(loaded)} == {second_device.type}
    out = loaded(torch.tensor([[1, 2]], device=second_device))
    assert out.device.type == second_device.type and out.shape == (1, 2, 10)


def test_a_moved_module_keeps_parameters_buffers_and_ties():
    loaded = fxloom.load(saved_module(), map_location="meta")
    assert isinstance(loaded.embed.weight, nn.Parameter) and loaded.embed.weight.requires_grad
    assert loaded.head.weight is loaded.embed.weight
    assert "scale" in dict(loaded.named_buffers())


def test_a_dict_key_may_name_a_device_type():
    loaded = fxloom.load(on_device(saved_module(), "cuda:3"), map_location={"cuda": "meta"})
    assert devices(loaded) == {"meta"}


def test_an_exact_dict_key_wins_over_its_type():
    data = on_device(saved_module(), "cpu")
    loaded = fxloom.load(data, map_location={"cpu": "meta", "cpu:0": "cpu"})
    assert devices(loaded) == {"meta"}  # saved as "cpu": the exact key "cpu" applies


def test_devices_missing_from_the_dict_are_restored():
    loaded = fxloom.load(saved_module(), map_location={"cuda:0": "meta"})
    assert devices(loaded) == {"cpu"}


def test_a_callable_sees_each_stored_tensor_once_on_the_cpu_with_its_saved_device():
    seen = []

    def where(tensor: torch.Tensor, saved: str) -> str:
        seen.append((tuple(tensor.shape), tensor.device.type, type(tensor), saved))
        return "meta"

    loaded = fxloom.load(saved_module(), map_location=where)
    assert devices(loaded) == {"meta"}
    # The tied weight is stored (and shown) once; the buffer is the other tensor.
    assert sorted(seen) == [((), "cpu", torch.Tensor, "cpu"), ((10, 4), "cpu", torch.Tensor, "cpu")]


def test_a_callable_may_return_the_tensor_to_use():
    loaded = fxloom.load(saved_module(), map_location=lambda tensor, saved: tensor.to("meta"))
    assert devices(loaded) == {"meta"}


def test_a_callable_returning_none_restores_the_saved_device():
    loaded = fxloom.load(saved_module(), map_location=lambda tensor, saved: None)
    assert devices(loaded) == {"cpu"}


def test_a_callable_returning_another_shape_is_refused():
    with pytest.raises(fxloom.SerializationError, match="return it moved, or a device"):
        fxloom.load(saved_module(), map_location=lambda tensor, saved: torch.zeros(1))


def test_a_map_location_of_another_kind_is_a_type_error():
    with pytest.raises(TypeError, match="map_location must be"):
        fxloom.load(saved_module(), map_location=3)


# ------------------------------------------------------------------ missing devices
def test_a_saved_device_this_machine_lacks_is_refused_naming_tensor_device_and_option():
    with pytest.raises(fxloom.SerializationError) as info:
        fxloom.load(on_device(saved_module(), MISSING_DEVICE))
    message = str(info.value)
    assert MISSING_DEVICE in message
    assert "module.embed.weight" in message or "module.scale" in message
    assert "map_location='cpu'" in message


@pytest.mark.parametrize("map_location", ["cpu", {MISSING_DEVICE: "cpu"}, {"cuda": "cpu"}])
def test_map_location_loads_a_file_saved_on_a_missing_device(map_location):
    loaded = fxloom.load(on_device(saved_module(), MISSING_DEVICE), map_location=map_location)
    assert devices(loaded) == {"cpu"}
    reference = Tied()
    reference.load_state_dict(loaded.state_dict())
    ids = torch.tensor([[1, 2]])
    torch.testing.assert_close(loaded(ids), reference(ids))


def test_map_location_to_a_missing_device_is_refused_naming_it():
    with pytest.raises(fxloom.SerializationError, match=f"on {MISSING_DEVICE}, which this machine"):
        fxloom.load(saved_module(), map_location=MISSING_DEVICE)


# ------------------------------------------------------------------ old files
def test_a_version_1_file_without_device_records_loads_on_the_cpu():
    def as_version_1(program: dict) -> None:
        for record in tensor_records(program):
            del record["device"]

    def header_1(header: dict) -> None:
        header["version"] = 1

    model = Tied()
    old = rewritten(saved_module(model), {PROGRAM: as_version_1, FORMAT: header_1})
    assert FORMAT_VERSION > 1  # upgraded through every later version
    loaded = fxloom.load(old)
    assert devices(loaded) == {"cpu"}
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(loaded(ids), model(ids))


# ------------------------------------------------------------------ exported programs
class MakesOnes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.ones(2, device=x.device)


def saved_program() -> bytes:
    ep = export(MakesOnes(), (torch.randn(4, 3),), dynamic_shapes={"x": {0: Dim("batch")}})
    buffer = io.BytesIO()
    save_program(ep, buffer)
    return buffer.getvalue()


def test_an_exported_program_loads_its_state_on_the_mapped_device():
    ep = load_program(saved_program(), map_location="meta")
    assert {t.device.type for t in ep.state_dict.values()} == {"meta"}
    assert {t.device.type for t in pytree_leaves(ep.example_inputs)} == {"meta"}


def test_an_exported_program_moves_the_devices_its_graph_names():
    ep = load_program(saved_program(), map_location={"cpu": "meta"})
    named = [
        value
        for node in ep.graph.nodes
        for value in [*node.args, *node.kwargs.values()]
        if isinstance(value, torch.device)
    ]
    assert named and all(d.type == "meta" for d in named)
    vals = [n.meta["val"] for n in ep.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert vals and all(v.device.type == "meta" for v in vals)
    out = ep.module()(torch.randn(7, 3, device="meta"))
    assert out.device.type == "meta" and out.shape == (7, 2)


def test_an_exported_program_saved_on_a_missing_device_names_the_option():
    data = on_device(saved_program(), MISSING_DEVICE)
    with pytest.raises(fxloom.SerializationError, match="map_location='cpu'"):
        load_program(data)
    ep = load_program(data, map_location="cpu")
    x = torch.randn(5, 3)
    reference = MakesOnes()
    reference.load_state_dict(ep.state_dict)
    torch.testing.assert_close(ep.module()(x), reference(x))


def pytree_leaves(value: object) -> list[torch.Tensor]:
    from fxloom import pytree

    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


# ------------------------------------------------------------------ a Hugging Face model
@pytest.fixture(scope="module")
def saved_bert():
    """A tiny BERT (random weights) traced on its example inputs and saved, with the model."""
    pytest.importorskip("transformers")
    from fxloom.cli.model_spec import LoadedModel, trace_model
    from fxloom.zoo.hf_configs import BERT_LIKE, hf

    torch.manual_seed(0)
    model = hf("BertModel", "BertConfig", **BERT_LIKE)().eval()
    ids = torch.randint(0, 100, (2, 8))
    traced = trace_model(
        LoadedModel("bert", model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    )
    buffer = io.BytesIO()
    fxloom.save(traced, buffer)
    return model, buffer.getvalue()


def bert_inputs(batch: int, seq: int, device: torch.device | str = "cpu") -> tuple:
    ids = torch.randint(0, 100, (batch, seq))
    return ids.to(device), torch.ones_like(ids).to(device)


def test_a_hugging_face_model_loads_on_the_second_device(saved_bert, second_device):
    _, data = saved_bert
    loaded = fxloom.load(data, map_location=second_device)
    assert {p.device.type for p in loaded.parameters()} == {second_device.type}
    out = loaded(*bert_inputs(2, 8, second_device))
    assert out.last_hidden_state.device.type == second_device.type
    assert out.last_hidden_state.shape == (2, 8, 32)


def test_a_hugging_face_model_saved_on_a_gpu_loads_on_the_cpu_and_matches_eager(saved_bert):
    model, data = saved_bert
    loaded = fxloom.load(on_device(data, MISSING_DEVICE), map_location="cpu")
    for batch, seq in ((2, 8), (3, 5)):
        ids, mask = bert_inputs(batch, seq)
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(loaded(ids, mask).last_hidden_state, expected)
