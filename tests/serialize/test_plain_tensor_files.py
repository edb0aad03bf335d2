"""Files hold plain tensors only; version 2's quantized-tensor records still load.

Format version 3 writes every tensor as a plain one: fxloom's default quantization
(``kernels="plain"``) makes nothing else, and a torch quantized tensor (torch.ao's layers,
``kernels="torch.ao"``, or a quantized buffer) is written as its integer values with scale
and zero-point tensors, from which loading rebuilds it for what holds it. No file holds a
quantized dtype among its tensors or a packed weight. Version 2 files, whose records held
quantized tensors, are written here by version 2's record writer (kept below as it was) and
load through the converter (``fxloom.serialize.quantized_records``), computing what the
saved model computed.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hostile import PROGRAM, WEIGHTS, edited, member, rewrite, saved, weights, with_weights
from torch import nn

import fxloom
from fxloom.quantize import QuantConfig, calibrate, convert, prepare
from fxloom.serialize import SerializationError, archive, graph_module_files
from fxloom.serialize.archive import read_archive
from fxloom.serialize.tensors import PER_CHANNEL, PER_TENSOR, TensorWriter
from fxloom.serialize.values import encode_value

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch.ao's deprecation

QUANTIZED_DTYPE_NAMES = frozenset({"qint8", "quint8", "qint32", "quint4x2", "quint2x4"})
# safetensors' names of the dtypes a quantized model's file may hold: integers and floats.
PLAIN_STORED = frozenset({"I8", "U8", "I32", "I64", "F32", "F64", "BF16", "F16", "BOOL"})


# ------------------------------------------------- version 2's record writer, as it was
class Version2TensorWriter(TensorWriter):
    """fxloom's tensor records of format version 2: a quantized tensor as a record with its
    quantized dtype and a ``quantized`` entry (its integer values in the weights)."""

    def add(self, tensor: torch.Tensor, where: str) -> dict[str, Any]:
        known = self._records.get(id(tensor))
        if known is not None:
            return known
        key = f"t{len(self._records)}"
        record: dict[str, Any] = {
            "key": key,
            "shape": list(tensor.shape),
            "dtype": encode_value(tensor.dtype),
            "device": str(tensor.device),
        }
        data = tensor.detach()
        if tensor.is_quantized:
            record["quantized"] = self._quantization(tensor, key)
            data = tensor.int_repr()
        if tensor.requires_grad:
            record["requires_grad"] = True
        if isinstance(tensor, torch.nn.Parameter):
            record["parameter"] = True
        if not data.is_contiguous():
            record["stride"] = list(data.stride())
        self.tensors[key] = data.cpu().contiguous()
        self._records[id(tensor)] = record
        self._keep_alive.append(tensor)
        return record

    def _quantization(self, tensor: torch.Tensor, key: str) -> dict[str, Any]:
        scheme = tensor.qscheme()
        if scheme in PER_TENSOR:
            return {
                "qscheme": encode_value(scheme),
                "scale": tensor.q_scale(),
                "zero_point": tensor.q_zero_point(),
            }
        assert scheme in PER_CHANNEL
        self.tensors[f"{key}.scales"] = tensor.q_per_channel_scales().contiguous()
        self.tensors[f"{key}.zero_points"] = tensor.q_per_channel_zero_points().contiguous()
        return {"qscheme": encode_value(scheme), "axis": tensor.q_per_channel_axis()}


def version2_file(gm: fxloom.GraphModule, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """``gm`` saved as fxloom wrote files of format version 2."""
    with monkeypatch.context() as patch:
        patch.setattr(graph_module_files, "TensorWriter", Version2TensorWriter)
        patch.setattr(archive, "FORMAT_VERSION", 2)
        f = io.BytesIO()
        fxloom.save(gm, f)
    data = f.getvalue()
    assert json.loads(member(data, "fxloom/format.json"))["version"] == 2
    assert '"quantized"' in member(data, PROGRAM).decode()  # it holds old records
    return data


# ------------------------------------------------------------------ models
class QuantizedBuffers(nn.Module):
    """Quantized buffers, per tensor and per channel, channels-last, read by the graph."""

    def __init__(self) -> None:
        super().__init__()
        w = torch.randn(8, 3, 2, 2).contiguous(memory_format=torch.channels_last)
        scales = torch.rand(8, dtype=torch.float64) + 0.1
        zeros = torch.arange(8, dtype=torch.long) - 4
        self.register_buffer(
            "per_channel", torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)
        )
        self.register_buffer("per_tensor", torch.quantize_per_tensor(w, 0.1, 3, torch.quint8))

    def forward(self, x):
        return x + self.per_channel.dequantize().sum() + self.per_tensor.dequantize().sum()


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 4))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Flatten(), nn.Linear(8 * 36, 5)
    )  # fmt: skip


def quantized(model: nn.Module, x: torch.Tensor, **config: Any) -> fxloom.GraphModule:
    torch.manual_seed(1)
    prepared = prepare(model.eval(), (x,), QuantConfig(**config))
    if prepared.meta["quantize"].config.scheme.calibrates:
        calibrate(prepared, [(x,), (torch.randn_like(x),)], progress=False)
    return convert(prepared)


def torch_ao_models() -> dict[str, tuple[fxloom.GraphModule, torch.Tensor]]:
    """What ``kernels="torch.ao"`` makes: static LinearReLU/Linear/LinearFloatIO and
    convolutions (per-channel qint8 weights), dynamic Linear and LSTM."""
    torch.manual_seed(0)
    x, image, sequence = torch.randn(8, 16), torch.randn(2, 3, 8, 8), torch.randn(2, 5, 6)
    return {
        "static_mlp": (quantized(mlp(), x, kernels="torch.ao"), x),
        "static_cnn": (quantized(cnn(), image, kernels="torch.ao"), image),
        "dynamic": (quantized(Recurrent(), sequence, mode="dynamic", kernels="torch.ao"), sequence),
    }


@pytest.fixture(scope="module")
def ao_models():
    return torch_ao_models()


# ------------------------------------------------------------------ scanning a file
def json_values(value: Any) -> Iterator[Any]:
    stack = [value]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def tensor_records(program: Any) -> list[dict]:
    return [
        v for v in json_values(program) if isinstance(v, dict) and isinstance(v.get("key"), str)
    ]


def stored_dtypes(data: bytes) -> set[str]:
    blob = member(data, WEIGHTS)
    length = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + length])
    return {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}


def quantized_things(data: bytes) -> list[str]:
    """Everything in the file that is a quantized tensor or a packed weight, described."""
    program = json.loads(member(data, PROGRAM))
    found = [f"stored {d}" for d in stored_dtypes(data) - PLAIN_STORED]
    for record in tensor_records(program):
        if "quantized" in record or "affine" in record:
            found.append(f"record {record['key']} is a quantized tensor")
        if record.get("dtype", {}).get("dtype") in QUANTIZED_DTYPE_NAMES:
            found.append(f"record {record['key']} is {record['dtype']}")
    for value in json_values(program):
        if isinstance(value, dict) and len(value) == 1:
            ((kind, body),) = value.items()
            if kind == "dtype" and body in QUANTIZED_DTYPE_NAMES:
                found.append(f"the value {value}")
            if kind in ("qscheme", "bytes"):
                found.append(f"the value {kind}")
        if isinstance(value, str) and ("torch.ao." in value or "PackedParams" in value):
            found.append(f"the name {value}")
    return found


# ------------------------------------------------------- files fxloom writes by default
DEFAULT_CASES = {
    "static_mlp": lambda: quantized(mlp(), torch.randn(8, 16)),
    "static_cnn": lambda: quantized(cnn(), torch.randn(2, 3, 8, 8)),
    "dynamic": lambda: quantized(mlp(), torch.randn(8, 16), mode="dynamic"),
    "w8": lambda: quantized(mlp(), torch.randn(8, 16), scheme="w8"),
    "w4_g32": lambda: quantized(mlp(), torch.randn(8, 16), scheme="w4_g32"),
}


@pytest.mark.parametrize("name", sorted(DEFAULT_CASES))
def test_a_default_quantized_file_holds_no_quantized_dtype_and_no_packed_weight(name):
    gm = DEFAULT_CASES[name]()
    data = saved(gm)
    assert quantized_things(data) == []
    assert stored_dtypes(data) & {"I8", "U8"}  # its integer weights are there, as integers


@pytest.mark.parametrize("scheme", ["static", "w8"])
def test_a_default_int8_file_is_within_1_05x_its_integer_bytes_plus_scales(scheme):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU())
    gm = quantized(model, torch.randn(16, 512), scheme=scheme)
    integers = sum(
        t.numel() * t.element_size()
        for t in gm.state_dict().values()
        if t.dtype in (torch.int8, torch.uint8)
    )
    scales = sum(
        t.numel() * t.element_size()
        for name, t in gm.state_dict().items()
        if name.startswith("scale")
    )
    assert integers == 2 * 512 * 1024 and scales > 0
    size = len(saved(gm))
    assert size <= 1.05 * (integers + scales), (size, integers, scales)


# ------------------------------------------------------------------ torch.ao files
@pytest.mark.parametrize("name", ["static_mlp", "static_cnn", "dynamic"])
def test_a_torch_ao_model_is_saved_as_plain_tensors_and_rebuilt_on_loading(ao_models, name):
    gm, x = ao_models[name]
    data = saved(gm)
    program = json.loads(member(data, PROGRAM))
    assert stored_dtypes(data) <= PLAIN_STORED
    records = tensor_records(program)
    assert not any("quantized" in r for r in records)
    assert not any(r["dtype"].get("dtype") in QUANTIZED_DTYPE_NAMES for r in records)
    assert any(r.get("affine") is not None for r in records)  # its int8 weights, plain
    loaded = fxloom.load(data)
    assert torch.equal(loaded(x), gm(x))


def test_a_quantized_weight_is_stored_as_int8_values_scales_and_zero_points(ao_models):
    gm, _ = ao_models["static_cnn"]
    data = saved(gm)
    tensors = weights(data)
    weight, _ = gm.get_submodule("0")._weight_bias()  # the first convolution's, per channel
    (record,) = [
        r
        for r in tensor_records(json.loads(member(data, PROGRAM)))
        if r.get("affine") == {"axis": 0} and r["shape"] == [8, 3, 3, 3]
    ]
    key = record["key"]
    assert record["dtype"] == {"dtype": "int8"}
    assert torch.equal(tensors[key], weight.int_repr())
    assert torch.equal(tensors[key + ".scale"], weight.q_per_channel_scales())
    assert torch.equal(tensors[key + ".zero_point"], weight.q_per_channel_zero_points())


def test_quantized_buffers_round_trip_through_the_plain_form():
    torch.manual_seed(0)
    model = QuantizedBuffers()
    loaded = fxloom.load(saved(model))
    for name in ("per_channel", "per_tensor"):
        original, back = getattr(model, name), getattr(loaded, name)
        assert back.dtype == original.dtype and back.qscheme() == original.qscheme()
        assert back.stride() == original.stride()
        assert torch.equal(back.int_repr(), original.int_repr())
        assert torch.equal(back.dequantize(), original.dequantize())


# ------------------------------------------------------------------ version 2 files
@pytest.mark.parametrize("name", ["static_mlp", "static_cnn", "dynamic"])
def test_a_version_2_torch_ao_file_loads_and_computes_what_it_saved(ao_models, name, monkeypatch):
    gm, x = ao_models[name]
    loaded = fxloom.load(version2_file(gm, monkeypatch))
    assert torch.equal(loaded(x), gm(x))
    packed = [path for path, module in gm.named_modules() if hasattr(module, "_weight_bias")]
    assert packed
    for path in packed:
        for weight, back in zip(
            packed_weights(gm.get_submodule(path)),
            packed_weights(loaded.get_submodule(path)),
            strict=True,
        ):
            assert back.is_quantized and torch.equal(back.int_repr(), weight.int_repr())


def packed_weights(layer: nn.Module) -> list[torch.Tensor]:
    """The weights a torch.ao layer packed (an LSTM's by name, a Linear's or conv's one)."""
    held = layer._weight_bias()
    return list(held["weight"].values()) if isinstance(held, dict) else [held[0]]


def test_version_2_quantized_buffers_load_as_the_quantized_tensors_they_were(monkeypatch):
    torch.manual_seed(0)
    model = fxloom.symbolic_trace(QuantizedBuffers())
    loaded = fxloom.load(version2_file(model, monkeypatch))
    for name in ("per_channel", "per_tensor"):
        original, back = getattr(model, name), getattr(loaded, name)
        assert back.dtype == original.dtype and back.stride() == original.stride()
        assert torch.equal(back.dequantize(), original.dequantize())
    x = torch.randn(2, 2)
    assert torch.equal(loaded(x), model(x))


def test_the_converter_leaves_only_plain_records_and_tensors(ao_models, monkeypatch):
    gm, _ = ao_models["static_cnn"]
    upgraded = read_archive(version2_file(gm, monkeypatch))
    records = tensor_records(upgraded.program)
    assert not any("quantized" in r for r in records)
    assert all(r["dtype"]["dtype"] not in QUANTIZED_DTYPE_NAMES for r in records)
    assert not any(k.endswith((".scales", ".zero_points")) for k in upgraded.weights)
    for record in (r for r in records if "affine" in r):
        key = record["key"]
        assert upgraded.weights[key].dtype in (torch.int8, torch.uint8, torch.int32)
        assert upgraded.weights[key + ".scale"].dtype is torch.float64
        assert upgraded.weights[key + ".zero_point"].dtype is torch.int64


def test_a_version_2_file_saved_again_is_a_plain_file(ao_models, monkeypatch):
    gm, x = ao_models["static_mlp"]
    again = saved(fxloom.load(version2_file(gm, monkeypatch)))
    assert json.loads(member(again, "fxloom/format.json"))["version"] == archive.FORMAT_VERSION
    assert not any("quantized" in r for r in tensor_records(json.loads(member(again, PROGRAM))))
    assert torch.equal(fxloom.load(again)(x), gm(x))


def old_buffers_file(monkeypatch) -> bytes:
    torch.manual_seed(0)
    return version2_file(fxloom.symbolic_trace(QuantizedBuffers()), monkeypatch)


def old_record(program: dict, name: str) -> dict:
    return program["module"]["buffers"][name]


@pytest.mark.parametrize(
    "edit, culprits",
    [
        (
            lambda p: old_record(p, "per_tensor")["quantized"].update(scale="0.1"),
            ["invalid scale or zero point"],
        ),
        (
            lambda p: old_record(p, "per_tensor")["quantized"].update(scale=-1.0),
            ["per_tensor", "finite and positive"],
        ),
        (
            lambda p: old_record(p, "per_channel")["quantized"].update(
                qscheme={"qscheme": "per_channel_affine_float_qparams"}
            ),
            ["unknown quantization scheme"],
        ),
        (
            lambda p: old_record(p, "per_channel")["quantized"].update(axis=4),
            ["per_channel", "axis 4"],
        ),
        (
            lambda p: old_record(p, "per_channel")["quantized"].pop("axis"),
            ["per-channel parameters are missing"],
        ),
        (
            lambda p: old_record(p, "per_channel").update(dtype={"dtype": "float32"}),
            ["is not a quantized dtype"],
        ),
    ],
    ids=["scale-a-string", "negative-scale", "float-qparams", "axis-4", "no-axis", "float"],
)
def test_a_broken_version_2_record_is_refused_naming_it(edit, culprits, monkeypatch):
    data = edited(old_buffers_file(monkeypatch), edit)
    with pytest.raises(SerializationError) as info:
        fxloom.load(data)
    for culprit in culprits:
        assert culprit in str(info.value), str(info.value)


def test_version_2_per_channel_scales_missing_are_refused(monkeypatch):
    data = old_buffers_file(monkeypatch)
    tensors = {k: v for k, v in weights(data).items() if not k.endswith(".scales")}
    with pytest.raises(SerializationError, match="per-channel parameters are missing"):
        fxloom.load(with_weights(data, tensors))


def test_a_current_file_holding_a_quantized_tensor_record_is_refused(monkeypatch):
    old = old_buffers_file(monkeypatch)
    text = member(old, "fxloom/format.json").replace(
        b'"version": 2', f'"version": {archive.FORMAT_VERSION}'.encode()
    )
    with pytest.raises(SerializationError, match="quantized-tensor record"):
        fxloom.load(rewrite(old, "fxloom/format.json", text))


def test_a_record_of_a_quantized_dtype_is_refused():
    data = saved(QuantizedBuffers())

    def edit(program):
        old_record(program, "per_tensor").update(dtype={"dtype": "quint8"})

    with pytest.raises(SerializationError, match="plain tensors only"):
        fxloom.load(edited(data, edit))


def test_plain_form_parameters_missing_from_the_weights_are_refused():
    data = saved(QuantizedBuffers())
    tensors = {k: v for k, v in weights(data).items() if not k.endswith(".zero_point")}
    with pytest.raises(SerializationError, match="scales and zero points of"):
        fxloom.load(with_weights(data, tensors))


def test_a_tied_quantized_tensor_is_stored_once_and_shared_again(monkeypatch):
    torch.manual_seed(0)
    gm = fxloom.symbolic_trace(QuantizedBuffers())
    gm.register_buffer("tied", gm.per_tensor)  # the same tensor under a second name
    for data in (saved(gm), version2_file(gm, monkeypatch)):
        loaded = fxloom.load(data)
        assert loaded._buffers["tied"] is loaded._buffers["per_tensor"]
        assert torch.equal(loaded.tied.dequantize(), gm.per_tensor.dequantize())
