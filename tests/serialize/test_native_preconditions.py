"""What a native kernel packs or trusts is checked before it packs or runs: one rule, one file.

torch's quantized layers are rebuilt from a file by packing their weights for the current
engine (``set_weight_bias``); FBGEMM and QNNPACK divide by ``groups`` and ``stride`` while
packing (SIGFPE at 0), read one weight scale per output channel whatever the tensor holds,
and compute with a weight of the wrong width. Each test saves a small valid model, breaks
one rule in its file, and shows that loading refuses it with ``SerializationError`` naming
the module, the attribute, its value and the rule; those that pack run on every quantized
engine torch offers. Float layers follow the same rules (``module_shapes.SHAPE_RULES``),
saving refuses what loading would, torch's packed layers fxloom does not save are refused
both ways, and valid quantized files still round-trip on every engine.
The child-process version of these files is the red team's family 6.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.ao.nn.quantized as nnq
import torch.ao.nn.quantized.dynamic as nnqd
from hostile import edited, no_code_runs, record, saved, weights, with_weights
from torch import nn

import fxloom
from fxloom.quantize.convert import quantized_engine
from fxloom.serialize.tensors import TensorWriter
from fxloom.serialize.values import encode_value

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ENGINES = [e for e in torch.backends.quantized.supported_engines if e != "none"]
FP16_ENGINES = [e for e in ("x86", "fbgemm") if e in ENGINES]  # fp16 packing: FBGEMM only


@pytest.fixture(params=ENGINES)
def engine(request):
    """The quantized engine current while the test builds and loads its files."""
    with quantized_engine(request.param):
        yield request.param


# ------------------------------------------------------------------ models
class Int8(nn.Module):
    """Quantizes its float input, runs one int8 layer, returns float."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        q = torch.quantize_per_tensor(x, 0.05, 128, torch.quint8)
        return self.layer(q).dequantize()


class Float(nn.Module):
    """Runs one layer on its input (a float layer, or a dynamic-quantized one)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)


def per_channel(weight: torch.Tensor, axis: int = 0) -> torch.Tensor:
    n = weight.shape[axis]
    scales = torch.rand(n, dtype=torch.float64) / 50 + 0.001
    return torch.quantize_per_channel(
        weight, scales, torch.zeros(n, dtype=torch.long), axis, torch.qint8
    )


def per_tensor(weight: torch.Tensor) -> torch.Tensor:
    return torch.quantize_per_tensor(weight, 0.02, 0, torch.qint8)


def conv() -> nnq.Conv2d:
    """4 -> 6 channels in 2 groups: weight (6, 2, 3, 3), one scale per output channel."""
    layer = nnq.Conv2d(4, 6, 3, padding=1, groups=2)
    layer.set_weight_bias(per_channel(torch.randn(6, 2, 3, 3)), torch.randn(6))
    layer.scale, layer.zero_point = 0.1, 64
    return layer


def transposed() -> nnq.ConvTranspose2d:
    """4 -> 6 channels, stride 2: weight (4, 6, 3, 3), per-tensor (FBGEMM's only kind)."""
    layer = nnq.ConvTranspose2d(4, 6, 3, stride=2)
    layer.set_weight_bias(per_tensor(torch.randn(4, 6, 3, 3)), torch.randn(6))
    layer.scale = 0.2
    return layer


def linear() -> nnq.Linear:
    layer = nnq.Linear(5, 3)
    layer.set_weight_bias(per_channel(torch.randn(3, 5)), torch.randn(3))
    layer.scale = 0.05
    return layer


def dynamic_linear(dtype: torch.dtype = torch.qint8) -> nnqd.Linear:
    layer = nnqd.Linear(5, 3, dtype=dtype)
    weight = per_channel(torch.randn(3, 5)) if dtype == torch.qint8 else torch.randn(3, 5)
    layer.set_weight_bias(weight, torch.randn(3))
    return layer


def dynamic_lstm() -> nnqd.LSTM:
    return nnqd.LSTM(5, 4, num_layers=2, bidirectional=True)


# name -> (the model, an input); built and saved under each engine.
MODELS = {
    "conv": (lambda: Int8(conv()), (2, 4, 5, 5)),
    "transposed": (lambda: Int8(transposed()), (2, 4, 5, 5)),
    "linear": (lambda: Int8(linear()), (2, 5)),
    "dynamic_linear": (lambda: Float(dynamic_linear()), (2, 5)),
    "dynamic_lstm": (lambda: Float(dynamic_lstm()), (3, 2, 5)),
}


@functools.cache
def model_and_file(name: str, engine: str) -> tuple[fxloom.GraphModule, bytes]:
    with quantized_engine(engine):
        torch.manual_seed(0)
        gm = fxloom.symbolic_trace(MODELS[name][0]())
        return gm, saved(gm)


def file_of(name: str, engine: str) -> bytes:
    return model_and_file(name, engine)[1]


@functools.cache
def fp16_linear_file() -> bytes:
    """A dynamic Linear with float16 weights, packed where FBGEMM can (loaded anywhere)."""
    with quantized_engine(FP16_ENGINES[0]):
        torch.manual_seed(0)
        return saved(Float(dynamic_linear(torch.float16)))


@functools.cache
def float_io_file() -> bytes:
    """fxloom.quantize's float-in/float-out int8 Linear (``LinearFloatIO``), x86 engine."""
    from fxloom.quantize import QuantConfig, calibrate, convert, prepare

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 3)).eval(), torch.randn(8, 4)
    prepared = prepare(model, (x,), QuantConfig(engine="x86", kernels="torch.ao"))  # its modules
    calibrate(prepared, [(x,)], progress=False)
    gm = convert(prepared)
    assert type(gm._modules["0"]).__name__ == "LinearFloatIO"
    return saved(gm)


# ------------------------------------------------------------------ editing
def state(program: dict, path: str = "layer") -> dict:
    """The packed layer's saved state: attributes, weight and bias (or weights, for RNNs)."""
    return record(program, path)["state"]


def with_attribute(data: bytes, name: str, value, path: str = "layer") -> bytes:
    def edit(program):
        found = record(program, path)
        attributes = found["state"]["attributes"] if "state" in found else found["attributes"]
        attributes[name] = encode_value(value)

    return edited(data, edit)


def with_tensor(data: bytes, locate, tensor: torch.Tensor | None) -> bytes:
    """``data`` whose tensor record ``locate(program) -> (holder, key)`` now describes
    ``tensor`` (its bytes stored under a new key), or is None."""
    writer = TensorWriter()
    new = None if tensor is None else writer.add(tensor, "the hostile tensor")

    def edit(program):
        holder, key = locate(program)
        if new is not None:
            new["key"] = "hostile"
        holder[key] = new

    stored = {k.replace("t0", "hostile", 1): v for k, v in writer.tensors.items()}
    return with_weights(edited(data, edit), {**weights(data), **stored})


def packed(name: str, path: str = "layer"):
    """Locates the packed layer's tensor ``name`` (``weight``, ``bias``, ``weight_ih_l0``)."""

    def locate(program):
        found = state(program, path)
        return (found["weights"] if "weights" in found else found), name

    return locate


def refused(data: bytes, *culprits: str) -> str:
    """Loading ``data`` raises SerializationError naming every culprit, running no module code."""
    with no_code_runs() as called, pytest.raises(fxloom.SerializationError) as info:
        fxloom.load(data)
    assert called == []
    message = str(info.value)
    for culprit in culprits:
        assert culprit in message, message
    return message


# ---------------------------------------------------- quantized convolutions
@pytest.mark.parametrize(
    "name, value, culprits",
    [
        ("groups", 0, ["groups=0", "must be at least 1 and divide in_channels=4"]),
        ("groups", 4, ["groups=4", "out_channels=6"]),
        ("groups", -2, ["groups=-2"]),
        ("stride", (0, 1), ["stride=(0, 1)", "at least 1"]),
        ("stride", (2**32, 1), ["stride=(4294967296, 1)", "at most 32,768"]),
        ("dilation", (0, 0), ["dilation=(0, 0)", "at least 1"]),
        ("padding", (-1, 1), ["padding=(-1, 1)", "at least 0"]),
        ("padding", (2**62, 1), ["padding=", "at most 32,768"]),
        ("padding", "same", ["padding='same'", "not a string"]),
        ("kernel_size", (0, 0), ["kernel_size=(0, 0)", "at least 1"]),
        ("kernel_size", (3, 3, 3), ["kernel_size=(3, 3, 3)", "2 ints"]),
        ("kernel_size", (5, 5), ["its weight has shape [6, 2, 3, 3]", "[6, 2, 5, 5]"]),
        ("in_channels", 8, ["its weight has shape [6, 2, 3, 3]", "in_channels=8", "[6, 4, 3, 3]"]),
        ("out_channels", 4, ["its weight has shape [6, 2, 3, 3]", "[4, 2, 3, 3]"]),
        ("out_channels", 0, ["out_channels=0", "at least 1"]),
        ("transposed", True, ["transposed=True", "must be False"]),
        ("output_padding", (1, 1), ["output_padding=(1, 1)", "only a transposed"]),
        ("padding_mode", "circular", ["padding_mode='circular'", "'zeros', 'reflect'"]),
        ("scale", 0.0, ["scale=0.0", "finite and positive"]),
        ("scale", -1.0, ["scale=-1.0", "finite and positive"]),
        ("scale", math.inf, ["scale=inf", "finite and positive"]),
        ("zero_point", 256, ["zero_point=256", "[0, 255]"]),
        ("zero_point", -1, ["zero_point=-1", "[0, 255]"]),
        ("zero_point", 1.5, ["zero_point=1.5", "an int"]),
    ],
)
def test_a_quantized_convolution_breaking_a_rule_is_refused_before_packing(
    engine, name, value, culprits
):
    message = refused(with_attribute(file_of("conv", engine), name, value), *culprits)
    assert message.startswith("module.layer (torch.ao.nn.quantized.Conv2d): ")
    assert message.endswith("; refused")


def test_a_nan_scale_is_refused(engine):
    refused(with_attribute(file_of("conv", engine), "scale", math.nan), "scale", "layer")


@pytest.mark.parametrize(
    "name, value, culprits",
    [
        ("output_padding", (2, 0), ["output_padding=(2, 0)", "smaller than stride=(2, 2)"]),
        ("output_padding", (-1, 0), ["output_padding=(-1, 0)", "at least 0"]),
        ("stride", (0, 2), ["stride=(0, 2)"]),
        ("groups", 0, ["groups=0"]),
        ("transposed", False, ["transposed=False", "must be True"]),
        ("padding_mode", "reflect", ["padding_mode='reflect'", "['zeros']"]),
        ("in_channels", 6, ["its weight has shape [4, 6, 3, 3]", "[6, 6, 3, 3]"]),
    ],
)
def test_a_quantized_transposed_convolution_breaking_a_rule_is_refused(
    engine, name, value, culprits
):
    data = with_attribute(file_of("transposed", engine), name, value)
    assert refused(data, *culprits).startswith(
        "module.layer (torch.ao.nn.quantized.ConvTranspose2d)"
    )


@pytest.mark.parametrize(
    "tensor, culprits",
    [
        (
            lambda: torch.quantize_per_tensor(torch.randn(6, 2, 3, 3), 0.1, 0, torch.quint8),
            ["its weight is torch.quint8", "packs torch.qint8 weights"],
        ),
        (lambda: torch.randn(6, 2, 3, 3), ["its weight is torch.float32", "torch.qint8"]),
        (
            lambda: per_channel(torch.randn(6, 2, 3, 3), axis=1),
            ["per_channel_affine along dim 1", "one per output channel (along dim 0)"],
        ),
        (lambda: per_tensor(torch.randn(6, 2, 3)), ["its weight has shape [6, 2, 3]"]),
        (lambda: per_tensor(torch.randn(12, 2, 3, 3)), ["its weight has shape [12, 2, 3, 3]"]),
        (lambda: None, ["module.layer.weight", "a tensor record"]),
    ],
    ids=["quint8", "float", "scales-along-input-channels", "3-d", "12-outputs", "missing"],
)
def test_a_quantized_convolution_weight_its_kernel_cannot_pack_is_refused(engine, tensor, culprits):
    refused(with_tensor(file_of("conv", engine), packed("weight"), tensor()), *culprits)


@pytest.mark.parametrize(
    "bias, culprits",
    [
        (torch.zeros(6, dtype=torch.float64), ["its bias is torch.float64", "float32 biases"]),
        (torch.zeros(4), ["its bias has shape [4]", "[6]"]),
        (torch.zeros(6, 1), ["its bias has shape [6, 1]"]),
    ],
    ids=["float64", "short", "2-d"],
)
def test_a_quantized_convolution_bias_its_kernel_cannot_add_is_refused(engine, bias, culprits):
    refused(with_tensor(file_of("conv", engine), packed("bias"), bias), *culprits)


def test_per_channel_scales_on_a_grouped_transposed_weight_are_refused(engine):
    data = with_attribute(file_of("transposed", engine), "groups", 2)
    weight = per_channel(torch.randn(4, 3, 3, 3), axis=1)
    refused(with_tensor(data, packed("weight"), weight), "along dim 1", "per-tensor scales")


# ------------------------------------------------------- quantized linear layers
def test_a_linear_weight_contradicting_its_features_is_refused(engine):
    data = with_attribute(file_of("linear", engine), "in_features", 7)
    refused(data, "module layer (torch.ao.nn.quantized.Linear)", "in_features=7", "[3, 5]")


def test_a_linear_layer_with_a_zero_scale_is_refused(engine):
    refused(with_attribute(file_of("linear", engine), "scale", 0.0), "scale=0.0", "positive")


@pytest.mark.parametrize(
    "tensor, culprits",
    [
        (lambda: torch.randn(3, 5), ["its weight is torch.float32", "torch.qint8 weights"]),
        (
            lambda: torch.quantize_per_tensor(torch.randn(3, 5), 0.1, 0, torch.quint8),
            ["its weight is torch.quint8"],
        ),
        (lambda: per_tensor(torch.randn(3, 5, 2)), ["its weight must be 2-d", "[3, 5, 2]"]),
        (lambda: per_channel(torch.randn(3, 5), axis=1), ["along dim 1"]),
    ],
    ids=["float", "quint8", "3-d", "scales-along-inputs"],
)
def test_linear_packed_params_refuse_a_weight_of_the_wrong_kind(engine, tensor, culprits):
    locate = packed("weight", "layer._packed_params")
    message = refused(with_tensor(file_of("linear", engine), locate, tensor()), *culprits)
    assert "LinearPackedParams" in message


def test_linear_packed_params_refuse_a_bias_for_other_rows(engine):
    locate = packed("bias", "layer._packed_params")
    refused(with_tensor(file_of("linear", engine), locate, torch.zeros(4)), "[4]", "[3]")


def test_linear_packed_params_refuse_a_dtype_no_kernel_packs(engine):
    def edit(program):
        state(program, "layer._packed_params")["dtype"] = encode_value(torch.float32)

    refused(edited(file_of("linear", engine), edit), "dtype=torch.float32", "torch.qint8")


@pytest.mark.parametrize("fp16_engine", FP16_ENGINES)
def test_a_static_linear_layer_over_float16_weights_is_refused(fp16_engine):
    """A static layer's kernel reads int8 packed weights; float16 ones are another object
    (the engines that cannot pack float16 weights refuse them before that)."""

    def edit(program):
        record(program, "layer")["class"] = "torch.ao.nn.quantized.modules.linear.Linear"

    with quantized_engine(fp16_engine):
        refused(edited(fp16_linear_file(), edit), "holds torch.float16 weights", "qint8")


@pytest.mark.skipif(not FP16_ENGINES, reason="no engine packs float16 weights")
def test_float16_packed_params_refuse_an_int8_weight(engine):
    locate = packed("weight", "layer._packed_params")
    data = with_tensor(fp16_linear_file(), locate, per_channel(torch.randn(3, 5)))
    refused(data, "its weight is torch.qint8", "packs torch.float32 weights")


@pytest.mark.skipif("x86" not in ENGINES, reason="fxloom.quantize makes LinearFloatIO for x86")
def test_a_float_io_linear_with_an_input_zero_point_out_of_range_is_refused(engine):
    data = with_attribute(float_io_file(), "input_zero_point", 300, path="0")
    refused(data, "fxloom.quantize.table.LinearFloatIO", "input_zero_point=300", "[0, 255]")


@pytest.mark.skipif("x86" not in ENGINES, reason="fxloom.quantize makes LinearFloatIO for x86")
def test_a_float_io_linear_contradicting_its_weight_is_refused(engine):
    data = with_attribute(float_io_file(), "out_features", 5, path="0")
    refused(data, "LinearFloatIO", "out_features=5", "[3, 4]")


# --------------------------------------- other quantized modules' parameters
def test_a_quantized_activation_with_a_zero_scale_is_refused(engine):
    """nnq.ELU keeps its output scale as an attribute (QUANTIZATION_PARAMETERS)."""
    data = with_attribute(saved(Int8(nnq.ELU(0.1, 0))), "scale", 0.0)
    refused(data, "module layer (torch.ao.nn.quantized.ELU)", "scale=0.0", "positive")


def test_a_quantize_zero_point_outside_its_dtype_is_refused(engine):
    """nnq.Quantize keeps its parameters as buffers, and its dtype as an attribute."""
    data = saved(Float(nnq.Quantize(0.1, 0, torch.qint8)))

    def locate(program):
        return record(program, "layer")["buffers"], "zero_point"

    data = with_tensor(data, locate, torch.tensor([200]))
    refused(data, "zero_point=200", "[-128, 127] for torch.qint8")


# ------------------------------------------------------- dynamic LSTM and GRU
@pytest.mark.parametrize(
    "name, shape, culprits",
    [
        ("weight_hh_l0", (16, 6), ["its weight_hh_l0 has shape [16, 6]", "[16, 4]"]),
        ("weight_ih_l1", (16, 5), ["its weight_ih_l1 has shape [16, 5]", "[16, 8]"]),
        ("bias_ih_l0_reverse", (3,), ["its bias_ih_l0_reverse has shape [3]", "[16]"]),
    ],
)
def test_a_dynamic_lstm_weight_of_the_wrong_shape_is_refused(engine, name, shape, culprits):
    tensor = per_tensor(torch.randn(shape)) if name.startswith("weight") else torch.randn(shape)
    data = with_tensor(file_of("dynamic_lstm", engine), packed(name), tensor)
    assert refused(data, *culprits).startswith("module.layer (torch.ao.nn.quantized.dynamic.LSTM)")


def test_a_dynamic_lstm_missing_a_weight_is_refused(engine):
    def edit(program):
        del state(program)["weights"]["weight_hh_l1_reverse"]

    refused(edited(file_of("dynamic_lstm", engine), edit), "it packs", "weight_hh_l1_reverse")


def test_a_dynamic_lstm_with_a_weight_of_no_name_it_packs_is_refused(engine):
    data = with_tensor(file_of("dynamic_lstm", engine), packed("weight_ih_l2"), torch.zeros(1))
    refused(data, "it packs", "weight_ih_l2")


def test_a_dynamic_lstm_with_float_weights_for_int8_is_refused(engine):
    data = with_tensor(file_of("dynamic_lstm", engine), packed("weight_ih_l0"), torch.randn(16, 5))
    refused(data, "its weight_ih_l0 is torch.float32", "packs torch.qint8 weights")


@pytest.mark.parametrize(
    "name, value, culprits",
    [
        ("hidden_size", 8, ["its weight_ih_l0 has shape [16, 5]", "[32, 5]"]),
        ("num_layers", 0, ["num_layers=0", "at least 1"]),
        ("bidirectional", False, ["it packs"]),
        ("dropout", 2.0, ["dropout=2.0", "[0, 1]"]),
        ("mode", "GRU", ["mode='GRU'", "['LSTM']"]),
        ("dtype", torch.float32, ["dtype=torch.float32"]),
        ("dtype", torch.float16, ["its weight_ih_l0 is torch.qint8", "torch.float32 weights"]),
    ],
)
def test_dynamic_lstm_attributes_contradicting_its_weights_are_refused(
    engine, name, value, culprits
):
    refused(with_attribute(file_of("dynamic_lstm", engine), name, value), *culprits)


# ----------------------------------------------------------- float layers
class Convolutions(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1, groups=2, padding_mode="reflect")
        self.up = nn.ConvTranspose2d(6, 4, 3, stride=2)

    def forward(self, x):
        return self.up(self.conv(x))


@functools.cache
def float_conv_file() -> bytes:
    torch.manual_seed(0)
    return saved(Convolutions())


def with_float_attribute(path: str, name: str, value) -> bytes:
    def edit(program):
        record(program, path)["attributes"][name] = encode_value(value)

    return edited(float_conv_file(), edit)


@pytest.mark.parametrize(
    "path, name, value, culprits",
    [
        ("conv", "stride", (0, 1), ["module conv (Conv2d)", "stride=(0, 1)", "at least 1"]),
        ("conv", "dilation", (1, 0), ["dilation=(1, 0)"]),
        ("conv", "padding", (-1, 1), ["padding=(-1, 1)", "or one of ['same', 'valid']"]),
        ("conv", "padding", "full", ["padding='full'"]),
        ("conv", "padding", "valid", ["_reversed_padding_repeated_twice=", "[0, 0, 0, 0]"]),
        ("conv", "groups", 0, ["groups=0"]),
        ("conv", "kernel_size", (3,), ["kernel_size=(3,)", "2 ints"]),
        ("conv", "padding_mode", "mirror", ["padding_mode='mirror'"]),
        ("conv", "transposed", True, ["transposed=True"]),
        ("conv", "_reversed_padding_repeated_twice", [5, 5, 0, 0], ["[1, 1, 1, 1]"]),
        ("up", "output_padding", (2, 2), ["module up (ConvTranspose2d)", "smaller than stride"]),
        ("up", "padding_mode", "reflect", ["padding_mode='reflect'", "['zeros']"]),
        ("up", "stride", (2**40, 2), ["at most 32,768"]),
    ],
)
def test_a_float_convolution_breaking_a_rule_is_refused(path, name, value, culprits):
    refused(with_float_attribute(path, name, value), *culprits)


def test_padding_same_on_a_strided_float_convolution_is_refused():
    def edit(program):
        attributes = record(program, "conv")["attributes"]
        attributes["padding"], attributes["stride"] = "same", encode_value((2, 2))

    refused(edited(float_conv_file(), edit), "padding='same' needs stride 1")


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


@pytest.mark.parametrize(
    "name, value, culprits",
    [
        ("dropout", 2.0, ["dropout=2.0", "[0, 1]"]),
        ("dropout", 0, ["dropout=0", "a float"]),
        ("num_layers", 0, ["num_layers=0"]),
        ("hidden_size", 0, ["hidden_size=0"]),
        ("batch_first", "yes", ["batch_first='yes'", "a bool"]),
    ],
)
def test_a_float_rnn_attribute_torch_would_refuse_is_refused(name, value, culprits):
    def edit(program):
        record(program, "lstm")["attributes"][name] = encode_value(value)

    torch.manual_seed(0)
    refused(edited(saved(Recurrent()), edit), "lstm", *culprits)


class Lookups(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(10, 3, padding_idx=0)
        self.bag = nn.EmbeddingBag(10, 3, mode="sum")

    def forward(self, ids):
        return self.table(ids).sum(1) + self.bag(ids)


@pytest.mark.parametrize(
    "path, name, value, culprits",
    [
        ("table", "padding_idx", 10, ["padding_idx=10", "below num_embeddings=10"]),
        ("table", "padding_idx", -1, ["padding_idx=-1"]),
        ("bag", "mode", "median", ["mode='median'", "['sum', 'mean', 'max']"]),
    ],
)
def test_an_embedding_attribute_out_of_range_is_refused(path, name, value, culprits):
    def edit(program):
        record(program, path)["attributes"][name] = encode_value(value)

    refused(edited(saved(Lookups()), edit), *culprits)


# ------------------------------------------------- saving refuses the same
def refused_on_saving(model: nn.Module, *culprits: str, tmp_path) -> None:
    path = tmp_path / "model.fxl"
    gm = fxloom.symbolic_trace(model)
    with pytest.raises(fxloom.SerializationError) as info:
        fxloom.save(gm, path)
    assert not path.exists()
    assert str(info.value).startswith("cannot save ")
    for culprit in culprits:
        assert culprit in str(info.value), str(info.value)


def test_saving_a_quantized_convolution_with_zero_groups_is_refused(engine, tmp_path):
    layer = conv()
    layer.groups = 0
    refused_on_saving(Int8(layer), "layer", "groups=0", tmp_path=tmp_path)


def test_saving_a_quantized_linear_layer_with_a_nan_scale_is_refused(engine, tmp_path):
    layer = linear()
    layer.scale = math.nan
    refused_on_saving(Int8(layer), "layer", "scale=nan", tmp_path=tmp_path)


def test_saving_a_dynamic_lstm_with_dropout_above_one_is_refused(engine, tmp_path):
    layer = dynamic_lstm()
    layer.dropout = 1.5
    refused_on_saving(Float(layer), "dropout=1.5", tmp_path=tmp_path)


def test_saving_a_float_convolution_with_stride_zero_is_refused(tmp_path):
    layer = nn.Conv2d(4, 4, 3)
    layer.stride = (0, 1)
    refused_on_saving(Float(layer), "layer (Conv2d)", "stride=(0, 1)", tmp_path=tmp_path)


# ------------------------------ torch's packed layers fxloom does not save
NOT_SAVED = {
    "embedding": (lambda: nnq.Embedding(10, 3), "an embedding table"),
    "embedding_bag": (lambda: nnq.EmbeddingBag(10, 3), "an embedding table"),
    "lstm_cell": (lambda: nnqd.LSTMCell(3, 4), "a recurrent cell's weights"),
    "gru_cell": (lambda: nnqd.GRUCell(3, 4), "a recurrent cell's weights"),
}


@pytest.mark.parametrize("name", NOT_SAVED)
def test_saving_a_packed_layer_fxloom_does_not_write_is_refused(name, tmp_path):
    make, what = NOT_SAVED[name]
    refused_on_saving(Float(make()), what, "keep this one in float", tmp_path=tmp_path)


@pytest.mark.parametrize("name", NOT_SAVED)
def test_a_file_holding_a_packed_layer_fxloom_does_not_write_is_refused(engine, name):
    """A record of such a class (as the generic module record a file could hold) would load a
    layer without its packed weights: refused whatever it holds."""
    make, what = NOT_SAVED[name]
    cls = type(make())

    def edit(program):
        layer = record(program, "layer")
        layer["class"] = f"{cls.__module__}.{cls.__qualname__}"

    refused(edited(file_of("dynamic_linear", engine), edit), what, "does not load")


# ------------------------------------------------- valid files on every engine
@pytest.mark.parametrize("name", MODELS)
def test_valid_quantized_files_round_trip_on_every_engine(engine, name):
    gm, data = model_and_file(name, engine)
    loaded = fxloom.load(data)
    torch.manual_seed(1)
    x = torch.randn(MODELS[name][1])
    expected, actual = gm(x), loaded(x)
    if isinstance(expected, tuple):
        expected, actual = expected[0], actual[0]
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("fp16_engine", FP16_ENGINES)
def test_float16_dynamic_linear_files_round_trip(fp16_engine):
    with quantized_engine(fp16_engine):
        loaded = fxloom.load(fp16_linear_file())
        assert loaded(torch.randn(2, 5)).shape == (2, 3)
