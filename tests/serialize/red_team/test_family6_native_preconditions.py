"""Family 6 of issue 32: a native kernel packs or trusts what the file says.

torch's quantized layers are rebuilt by packing their weights for the current engine, and
the packing functions trust their arguments: a convolution with ``groups=0`` or a stride of
0 (or of 2**32, which wraps to 0) dies of SIGFPE inside ``fxloom.load`` on FBGEMM and
QNNPACK; a dilation of 0 or a negative padding loads and runs; channels that contradict
the packed weight load, and QNNPACK computes with a weight of the wrong width or reads one
scale per output channel past a shorter list. Float convolutions get the same rules. Each
file is loaded (and called) once per quantized engine torch offers, in the child process:
all refused with ``SerializationError``, nothing recorded, no crash.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.ao.nn.quantized as nnq
from red_team_files import edited, module_at, saved, saved_gm, with_tensors
from red_team_harness import Case, assert_refused, family
from torch import nn

from fxloom.serialize.tensors import TensorWriter
from fxloom.serialize.values import encode_value

ENGINES = [e for e in torch.backends.quantized.supported_engines if e != "none"]
CNN_INPUT = [{"randn": [2, 4, 6, 6]}]
RNN_INPUT = [{"randn": [3, 2, 5]}]


# ------------------------------------------------------------------ valid files
class SmallCNN(nn.Module):
    """A grouped convolution, ReLU, average, Linear: fxloom.quantize makes the convolution a
    ``ConvReLU2d`` (weight (4, 2, 3, 3), per-channel) and the Linear a ``LinearFloatIO``
    over a ``LinearPackedParams``."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, groups=2)
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(torch.relu(self.conv(x)).mean((2, 3)))


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(5, 4)

    def forward(self, x):
        return self.lstm(x)[0]


class Int8(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(torch.quantize_per_tensor(x, 0.05, 128, torch.quint8)).dequantize()


def _quantized(model: nn.Module, x: torch.Tensor, mode: str = "static") -> bytes:
    from fxloom.quantize import QuantConfig, calibrate, convert, prepare

    # torch.ao's quantized modules: the records these cases edit (kernels="plain" has none)
    prepared = prepare(model.eval(), (x,), QuantConfig(mode=mode, kernels="torch.ao"))
    if mode == "static":
        calibrate(prepared, [(x,)], progress=False)
    return saved_gm(convert(prepared))


@functools.cache
def int8_cnn() -> bytes:
    torch.manual_seed(0)
    return _quantized(SmallCNN(), torch.randn(2, 4, 6, 6))


@functools.cache
def dynamic_lstm() -> bytes:
    torch.manual_seed(0)
    return _quantized(Recurrent(), torch.randn(3, 2, 5), mode="dynamic")


@functools.cache
def int8_transposed() -> bytes:
    """An int8 ConvTranspose2d(4, 4, 3, stride=2) (fxloom.quantize keeps these in float)."""
    torch.manual_seed(0)
    layer = nnq.ConvTranspose2d(4, 4, 3, stride=2)
    weight = torch.quantize_per_tensor(torch.randn(4, 4, 3, 3), 0.02, 0, torch.qint8)
    layer.set_weight_bias(weight, torch.randn(4))
    return saved(Int8(layer))


@functools.cache
def float_conv() -> bytes:
    torch.manual_seed(0)
    return saved(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1)))


# ------------------------------------------------------------------ edits
def _attribute(path: str, name: str, value):
    """Sets ``path``'s attribute (of its packed state, if it has one) to ``value``."""

    def edit(program):
        found = module_at(program, path)
        attributes = found["state"]["attributes"] if "state" in found else found["attributes"]
        attributes[name] = encode_value(value)

    return edit


def _tensor(data: bytes, path: str, name: str, tensor: torch.Tensor) -> bytes:
    """``data`` whose packed tensor ``name`` of ``path`` is ``tensor`` (a new record)."""
    writer = TensorWriter()
    new = writer.add(tensor, "the hostile tensor")
    new["key"] = "hostile"

    def edit(program):
        state = module_at(program, path)["state"]
        (state["weights"] if "weights" in state else state)[name] = new

    stored = {key.replace("t0", "hostile", 1): t for key, t in writer.tensors.items()}
    return with_tensors(edited(edit, data), stored)


def _per_channel(weight: torch.Tensor, axis: int) -> torch.Tensor:
    n = weight.shape[axis]
    scales = torch.full((n,), 0.01, dtype=torch.float64)
    return torch.quantize_per_channel(
        weight, scales, torch.zeros(n, dtype=torch.long), axis, torch.qint8
    )


def _embedding_class(program):
    """The quantized convolution's record named a quantized embedding (no packed table)."""
    module_at(program, "conv")["class"] = "torch.ao.nn.quantized.modules.embedding_ops.Embedding"


# id -> (what the file does, how it is built, its inputs); each runs once per engine.
QUANTIZED = {
    "conv-groups-0": (
        "a quantized convolution with groups=0 (SIGFPE while packing on FBGEMM and QNNPACK)",
        lambda: edited(_attribute("conv", "groups", 0), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-groups-not-dividing": (
        "a quantized convolution with groups=3 for 4 channels",
        lambda: edited(_attribute("conv", "groups", 3), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-stride-0": (
        "a quantized convolution with stride 0 (SIGFPE on FBGEMM and QNNPACK)",
        lambda: edited(_attribute("conv", "stride", (0, 0)), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-stride-2**32": (
        "a quantized convolution with stride 2**32, which the kernels' 32 bits wrap to 0",
        lambda: edited(_attribute("conv", "stride", (2**32, 1)), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-dilation-0": (
        "a quantized convolution with dilation 0 (loads and runs)",
        lambda: edited(_attribute("conv", "dilation", (0, 0)), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-negative-padding": (
        "a quantized convolution with padding -1 (FBGEMM runs it)",
        lambda: edited(_attribute("conv", "padding", (-1, -1)), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-padding-2**62": (
        "a quantized convolution with padding 2**62 (FBGEMM runs it as a small one)",
        lambda: edited(_attribute("conv", "padding", (2**62, 1)), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-channels-contradict-weight": (
        "a quantized convolution whose in_channels=8 contradict its (4, 2, 3, 3) weight",
        lambda: edited(_attribute("conv", "in_channels", 8), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-kernel-contradicts-weight": (
        "a quantized convolution whose kernel_size=(5, 5) contradicts its 3x3 weight",
        lambda: edited(_attribute("conv", "kernel_size", (5, 5)), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-scales-along-input-channels": (
        "a quantized convolution weight with per-channel scales along its input channels",
        lambda: _tensor(int8_cnn(), "conv", "weight", _per_channel(torch.randn(4, 2, 3, 3), 1)),
        CNN_INPUT,
    ),
    "conv-float64-bias": (
        "a quantized convolution with a float64 bias (oneDNN packs it, FBGEMM refuses it)",
        lambda: _tensor(int8_cnn(), "conv", "bias", torch.zeros(4, dtype=torch.float64)),
        CNN_INPUT,
    ),
    "conv-scale-0": (
        "a quantized convolution whose output scale is 0",
        lambda: edited(_attribute("conv", "scale", 0.0), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-scale-nan": (
        "a quantized convolution whose output scale is NaN",
        lambda: edited(_attribute("conv", "scale", math.nan), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-scale-negative": (
        "a quantized convolution whose output scale is -1",
        lambda: edited(_attribute("conv", "scale", -1.0), int8_cnn()),
        CNN_INPUT,
    ),
    "conv-zero-point-out-of-range": (
        "a quantized convolution whose output zero point is 1000 (quint8 holds 0..255)",
        lambda: edited(_attribute("conv", "zero_point", 1000), int8_cnn()),
        CNN_INPUT,
    ),
    "transposed-output-padding-past-stride": (
        "a quantized transposed convolution with output_padding 2 for stride 2",
        lambda: edited(_attribute("layer", "output_padding", (2, 2)), int8_transposed()),
        CNN_INPUT,
    ),
    "linear-packed-params-float-weight": (
        "LinearPackedParams (dtype qint8) holding a float32 weight",
        lambda: _tensor(int8_cnn(), "lin._packed_params", "weight", torch.randn(2, 4)),
        CNN_INPUT,
    ),
    "linear-packed-params-scales-along-inputs": (
        "LinearPackedParams whose weight scales run along its inputs (QNNPACK reads past them)",
        lambda: _tensor(
            int8_cnn(), "lin._packed_params", "weight", _per_channel(torch.randn(2, 4), 1)
        ),
        CNN_INPUT,
    ),
    "linear-packed-params-dtype-float32": (
        "LinearPackedParams whose dtype is float32, which no kernel packs",
        lambda: edited(
            lambda p: module_at(p, "lin._packed_params")["state"].update(
                dtype=encode_value(torch.float32)
            ),
            int8_cnn(),
        ),
        CNN_INPUT,
    ),
    "linear-features-contradict-weight": (
        "an int8 Linear (float in and out) whose in_features=16 contradict its (2, 4) weight",
        lambda: edited(_attribute("lin", "in_features", 16), int8_cnn()),
        CNN_INPUT,
    ),
    "dynamic-lstm-hidden-weight-too-wide": (
        "a dynamic LSTM whose weight_hh_l0 is (16, 6) for hidden_size 4 (QNNPACK runs it)",
        lambda: _tensor(
            dynamic_lstm(),
            "lstm",
            "weight_hh_l0",
            torch.quantize_per_tensor(torch.randn(16, 6), 0.02, 0, torch.qint8),
        ),
        RNN_INPUT,
    ),
    "dynamic-lstm-input-weight-too-wide": (
        "a dynamic LSTM whose weight_ih_l0 is (16, 7) for input_size 5",
        lambda: _tensor(
            dynamic_lstm(),
            "lstm",
            "weight_ih_l0",
            torch.quantize_per_tensor(torch.randn(16, 7), 0.02, 0, torch.qint8),
        ),
        RNN_INPUT,
    ),
    "dynamic-lstm-hidden-size-contradicts": (
        "a dynamic LSTM whose hidden_size=8 contradicts its weights",
        lambda: edited(_attribute("lstm", "hidden_size", 8), dynamic_lstm()),
        RNN_INPUT,
    ),
    "quantized-embedding-record": (
        "a record of torch's quantized Embedding, whose packed table fxloom never writes",
        lambda: edited(_embedding_class, int8_cnn()),
        CNN_INPUT,
    ),
}

FLOAT = {
    "float-conv-stride-0": (
        "a float Conv2d with stride 0",
        lambda: edited(_attribute("0", "stride", (0, 1)), float_conv()),
    ),
    "float-conv-dilation-0": (
        "a float Conv2d with dilation 0",
        lambda: edited(_attribute("0", "dilation", (1, 0)), float_conv()),
    ),
    "float-conv-padding-contradicts-reflection": (
        "a float Conv2d whose reflection padding for F.pad contradicts its padding",
        lambda: edited(
            _attribute("0", "_reversed_padding_repeated_twice", [9, 9, 9, 9]), float_conv()
        ),
    ),
}

CASES = [
    Case(f"{id}@{engine}", f"{doc} (engine {engine})", build, inputs=inputs, engine=engine)
    for id, (doc, build, inputs) in QUANTIZED.items()
    for engine in ENGINES
] + [Case(id, doc, build, inputs=CNN_INPUT) for id, (doc, build) in FLOAT.items()]
family("family6", CASES)


@pytest.mark.parametrize("attack", CASES, ids=[c.id for c in CASES])
def test_native_preconditions_are_checked_before_packing(attack, verdicts):
    """Refused (SerializationError) on every engine; no crash, nothing recorded."""
    assert_refused(verdicts, attack)
