"""What every transformation pass returns saves with ``fxloom.save`` and loads back the same.

Each case is a pass's output on a small model: traced zoo and Hugging Face models, conv-bn
fusion, static and dynamic int8 quantization (torch's packed quantized layers), ONNX Runtime
lowering (``OrtModule`` regions), split_module / split_by_support (nested GraphModules),
constant folding, CSE, dead-code elimination, argument normalization, subgraph rewriting,
scheduling and autoleaf. The loaded module must equal the original structurally (graph
text, code, module tree, state dict) and numerically (the same outputs, bit for bit, on the
example inputs and on another batch size). What cannot be saved is refused with an error
that says what to do: a prepared (observed) model, and user classes or functions until they
are registered with ``fxloom.register_serializable``.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fxloom
import fxloom.export
from fxloom import zoo
from fxloom.pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is not installed; import it from the checkout
    sys.path.insert(0, str(ROOT))

Inputs = tuple | dict


@dataclass
class Case:
    """A pass's output, its example inputs, and inputs of another batch size."""

    gm: fxloom.GraphModule
    inputs: Inputs
    other: Inputs


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small models on a busy two-core machine: one thread for torch and ONNX Runtime."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.random.fork_rng(devices=[]):
        yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------ helpers
def round_trip(gm: fxloom.GraphModule) -> fxloom.GraphModule:
    buffer = io.BytesIO()
    fxloom.save(gm, buffer)
    return fxloom.load(buffer.getvalue())


def rebatched(inputs: tuple, batch: int) -> tuple:
    """``inputs`` with ``batch`` rows where dimension 0 is the first input's batch: new random
    values for floating tensors, the first rows repeated for integer ones (token ids)."""
    example_batch = inputs[0].shape[0]
    generator = torch.Generator().manual_seed(batch)

    def one(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != example_batch:
            return x
        if x.is_floating_point():
            return torch.randn((batch, *x.shape[1:]), generator=generator, dtype=x.dtype)
        return x.repeat(batch // example_batch + 1, *[1] * (x.dim() - 1))[:batch]

    return tuple(one(x) for x in inputs)


def call(module: nn.Module, inputs: Inputs) -> list[Any]:
    with torch.no_grad():
        output = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
    return tree_flatten(output)[0]


def class_of(module: nn.Module) -> type:
    return type(module)._user_class() if isinstance(module, fxloom.GraphModule) else type(module)


def assert_same_value(actual: Any, expected: Any, where: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), where
        if expected.is_quantized:
            assert actual.qscheme() == expected.qscheme(), where
            assert torch.equal(actual.int_repr(), expected.int_repr()), where
            actual, expected = actual.dequantize(), expected.dequantize()
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(expected, torch.ScriptObject):  # packed weights: compare what they hold
        assert_same_value(actual.__getstate__(), expected.__getstate__(), where)
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same_value(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, where


def assert_same_structure(loaded: fxloom.GraphModule, original: fxloom.GraphModule) -> None:
    """The same module tree (names and classes), graphs, code and state."""
    modules = dict(original.named_modules())
    assert [(n, class_of(m)) for n, m in loaded.named_modules()] == [
        (n, class_of(m)) for n, m in modules.items()
    ]
    for name, module in loaded.named_modules():
        if isinstance(module, fxloom.GraphModule):
            assert str(module.graph) == str(modules[name].graph), name
            assert module.code == modules[name].code, name
        if hasattr(module, "model_bytes"):  # an ONNX Runtime region
            assert module.model_bytes == modules[name].model_bytes, name
    expected, actual = original.state_dict(), loaded.state_dict()
    assert list(actual) == list(expected)
    for key, value in expected.items():
        assert_same_value(actual[key], value, key)


def assert_same_outputs(loaded: nn.Module, original: nn.Module, inputs: Inputs) -> None:
    """The same outputs, bit for bit; or, where the original refuses the inputs (a guard),
    the same refusal."""
    try:
        expected = call(original, inputs)
    except Exception as refusal:
        with pytest.raises(type(refusal)):
            call(loaded, inputs)
        return
    actual = call(loaded, inputs)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_same_value(a, e, f"output {i}")


# ------------------------------------------------------------------- models
def zoo_model(name: str) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model, inputs = zoo.build(name)
    return model.eval(), inputs


def traced(name: str) -> Case:
    model, inputs = zoo_model(name)
    gm = fxloom.symbolic_trace(model, example_inputs=inputs)
    return Case(gm, inputs, rebatched(inputs, inputs[0].shape[0] + 1))


def hugging_face(name: str) -> Case:
    pytest.importorskip("transformers")
    from benchmarks.zoo.methods import fixed_args
    from benchmarks.zoo.registry import get

    spec = get(name)
    model, inputs = spec.build()
    gm = fxloom.symbolic_trace(model, fixed_args(model, inputs), example_inputs=inputs)
    return Case(gm, inputs, spec.make_inputs(*spec.other))


def fused() -> Case:
    from fxloom.passes.fuse import fuse

    model, inputs = zoo_model("resnet_tiny")
    gm = fuse(model)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in gm.modules())
    return Case(gm, inputs, rebatched(inputs, 3))


def quantized(
    name: str, mode: str = "static", exported: bool = False, kernels: str = "torch.ao"
) -> Case:
    """torch.ao's packed quantized layers (what these cases save), or fxloom's plain ones."""
    from fxloom.quantize import QuantConfig, calibrate, convert, prepare

    model, inputs = zoo_model(name)
    source = fxloom.export.export(model, inputs) if exported else model
    prepared = prepare(source, inputs, QuantConfig(mode=mode, kernels=kernels))
    if mode == "static":
        calibrate(prepared, [inputs, rebatched(inputs, len(inputs[0]))], progress=False)
    gm = convert(prepared)
    torch_ao = any(type(m).__module__.startswith("torch.ao.nn") for m in gm.modules())
    assert torch_ao == (kernels == "torch.ao")
    return Case(gm, inputs, rebatched(inputs, inputs[0].shape[0] + 2))


def quantized_module(model: nn.Module, inputs: tuple, mode: str = "static") -> Case:
    """A small model of layers that stay int8 from one to the next (no float-in/out layer)."""
    from fxloom.quantize import QuantConfig, calibrate, convert, prepare

    prepared = prepare(model.eval(), inputs, QuantConfig(mode=mode, kernels="torch.ao"))
    if mode == "static":
        calibrate(prepared, [inputs, rebatched(inputs, len(inputs[0]))], progress=False)
    return Case(convert(prepared), inputs, rebatched(inputs, len(inputs[0]) + 3))


def int8_linear_stack() -> Case:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8), nn.Linear(8, 4))
    case = quantized_module(model, (torch.randn(8, 16),))
    classes = {type(m).__name__ for m in case.gm.modules()}
    assert {"LinearReLU", "Linear"} <= classes
    return case


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 8, num_layers=2, batch_first=True)
        self.gru = nn.GRU(8, 8, batch_first=True, bidirectional=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(x)
        hidden, _ = self.gru(hidden)
        return self.head(hidden)


def dynamic_recurrent() -> Case:
    torch.manual_seed(0)
    case = quantized_module(Recurrent(), (torch.randn(2, 5, 6),), mode="dynamic")
    classes = {type(m).__module__ + "." + type(m).__name__ for m in case.gm.modules()}
    assert "torch.ao.nn.quantized.dynamic.modules.rnn.LSTM" in classes
    return case


def lowered_resnet() -> Case:
    pytest.importorskip("onnxruntime")
    from fxloom.lower import lower

    model, inputs = zoo_model("resnet_tiny")
    return Case(lower(model, inputs, dynamic_batch=True), inputs, rebatched(inputs, 3))


class SpectralMLP(nn.Module):
    """Linear layers on both sides of an FFT, which ONNX has no translation for."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 16)
        self.outer = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.inner(x))
        return torch.sigmoid(self.outer(torch.fft.fft(hidden).real)) * 2


def lowered_in_two_regions() -> Case:
    pytest.importorskip("onnxruntime")
    from fxloom.lower import OrtModule, lower

    torch.manual_seed(0)
    inputs = (torch.randn(3, 8),)
    gm = lower(SpectralMLP().eval(), inputs, dynamic_batch=True)
    assert sum(isinstance(m, OrtModule) for m in gm.children()) == 2
    return Case(gm, inputs, rebatched(inputs, 5))


def split_in_halves() -> Case:
    from fxloom.passes.split_module import split_module

    model, inputs = zoo_model("cnn_small")
    gm = fxloom.symbolic_trace(model)
    names = [node.name for node in gm.graph.nodes]
    half = names.index(names[len(names) // 2])
    gm = split_module(gm, model, lambda node: int(names.index(node.name) >= half))
    return Case(gm, inputs, rebatched(inputs, 3))


def split_by_modules() -> Case:
    from fxloom.passes.split_by_support import split_by_support

    model, inputs = zoo_model("transformer_tiny")
    gm, _ = split_by_support(fxloom.symbolic_trace(model), lambda node: node.op == "call_module")
    return Case(gm, inputs, rebatched(inputs, 3))


class ArangeScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(0.5))
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * (torch.arange(4) * self.scale))


def const_folded() -> Case:
    from fxloom.passes.const_fold import const_fold

    torch.manual_seed(0)
    gm = const_fold(fxloom.symbolic_trace(ArangeScale()))
    assert gm.graph.find_nodes(op="get_attr")
    return Case(gm, (torch.randn(2, 4),), (torch.randn(5, 4),))


def repeated_work(x: torch.Tensor) -> torch.Tensor:
    unused = x.sigmoid()  # noqa: F841 -- dead code for eliminate_dead_code
    return torch.relu(x + 1) * torch.relu(x + 1)


def cse_then_dce() -> Case:
    from fxloom.passes.cse import cse
    from fxloom.passes.dce import eliminate_dead_code

    gm = fxloom.symbolic_trace(repeated_work)
    cse(gm)
    eliminate_dead_code(gm)
    assert len(gm.graph.nodes) == 5  # x, add, relu, mul, output
    return Case(gm, (torch.randn(2, 3),), (torch.randn(4, 3),))


def normalized() -> Case:
    from fxloom.passes.normalize import normalize_args

    model, inputs = zoo_model("cnn_small")
    gm = normalize_args(fxloom.symbolic_trace(model))
    return Case(gm, inputs, rebatched(inputs, 3))


def swish(x: torch.Tensor) -> torch.Tensor:
    y = x + 1
    return torch.sigmoid(x) * x + torch.sigmoid(y) * y


def rewritten() -> Case:
    from fxloom.subgraph_rewriter import replace_pattern

    gm = fxloom.symbolic_trace(swish)
    replaced = replace_pattern(gm, lambda x: torch.sigmoid(x) * x, lambda x: nn.functional.silu(x))
    assert len(replaced) == 2
    return Case(gm, (torch.randn(2, 3),), (torch.randn(4, 3),))


def fetch_scaled(x: torch.Tensor) -> torch.Tensor:
    """A blocking call (imagine a parameter server)."""
    return x * 10


def start_fetch_scaled(x: torch.Tensor) -> torch.Tensor:
    return x.clone()  # the handle


def wait_fetch_scaled(handle: torch.Tensor) -> torch.Tensor:
    return handle * 10


fxloom.wrap("fetch_scaled")


def fetch_and_compute(x: torch.Tensor) -> torch.Tensor:
    fetched = fetch_scaled(x)
    return torch.relu(x) + fetched


def scheduled() -> Case:
    from fxloom.passes.schedule import schedule_async

    for function in (start_fetch_scaled, wait_fetch_scaled):  # the graph calls them
        fxloom.register_serializable(function)
    gm = fxloom.symbolic_trace(fetch_and_compute)
    schedule_async(gm, {fetch_scaled: (start_fetch_scaled, wait_fetch_scaled)})
    assert "start_fetch_scaled" in gm.code
    return Case(gm, (torch.randn(2, 3),), (torch.randn(4, 3),))


HF_MODELS = ("bert", "gpt2", "t5", "vit", "whisper")
CASES: dict[str, Callable[[], Case]] = {
    **{f"traced-{name}": lambda name=name: traced(name) for name in zoo.MODELS},
    **{f"hf-{name}": lambda name=name: hugging_face(name) for name in HF_MODELS},
    "fused-resnet_tiny": fused,
    "int8-cnn_small": lambda: quantized("cnn_small"),
    "int8-deeprec_tiny": lambda: quantized("deeprec_tiny"),
    "int8-resnet_tiny": lambda: quantized("resnet_tiny"),
    "int8-exported-cnn_small": lambda: quantized("cnn_small", exported=True),
    "dynamic-int8-transformer_tiny": lambda: quantized("transformer_tiny", "dynamic"),
    "int8-linear-stack": int8_linear_stack,
    "int8-plain-cnn_small": lambda: quantized("cnn_small", kernels="plain"),
    "dynamic-int8-plain-transformer_tiny": lambda: quantized(
        "transformer_tiny", "dynamic", kernels="plain"
    ),
    "dynamic-int8-lstm-gru": dynamic_recurrent,
    "lowered-resnet_tiny": lowered_resnet,
    "lowered-two-regions": lowered_in_two_regions,
    "split_module": split_in_halves,
    "split_by_support": split_by_modules,
    "const_fold": const_folded,
    "cse-dce": cse_then_dce,
    "normalize_args": normalized,
    "replace_pattern": rewritten,
    "schedule_async": scheduled,
}


@pytest.fixture(scope="module", params=list(CASES))
def case_and_loaded(request: pytest.FixtureRequest) -> tuple[Case, fxloom.GraphModule]:
    case = CASES[request.param]()
    return case, round_trip(case.gm)


# -------------------------------------------------------------------- round trips
def test_the_loaded_module_has_the_same_graph_code_modules_and_state(case_and_loaded):
    case, loaded = case_and_loaded
    assert_same_structure(loaded, case.gm)


def test_the_loaded_module_computes_the_same_on_the_example_inputs(case_and_loaded):
    case, loaded = case_and_loaded
    assert_same_outputs(loaded, case.gm, case.inputs)


def test_the_loaded_module_computes_the_same_at_another_batch_size(case_and_loaded):
    case, loaded = case_and_loaded
    assert_same_outputs(loaded, case.gm, case.other)


# ---------------------------------------------------------------- what is stored
def test_packed_int8_weights_are_stored_as_int8_tensors_in_the_safetensors():
    import zipfile

    from safetensors.torch import load

    buffer = io.BytesIO()
    fxloom.save(quantized("resnet_tiny").gm, buffer)
    with zipfile.ZipFile(buffer) as archive:
        assert all(name.endswith((".json", ".safetensors")) for name in archive.namelist())
        weights = load(archive.read("fxloom/weights.safetensors"))
    assert any(tensor.dtype == torch.int8 for tensor in weights.values())


def test_a_loaded_onnx_region_starts_its_session_on_its_first_call():
    case = lowered_in_two_regions()
    loaded = round_trip(case.gm)
    regions = [m for m in loaded.children() if hasattr(m, "model_bytes")]
    assert [region._session for region in regions] == [None, None]
    assert_same_outputs(loaded, case.gm, case.inputs)
    assert all(region._session is not None for region in regions)


def test_loading_a_lowered_module_needs_no_onnxruntime_but_running_it_does(monkeypatch):
    from fxloom.lower import runtime

    case = lowered_in_two_regions()

    def missing(name: str) -> Any:
        raise ImportError(f"{name} is not installed; pip install fxloom[onnx]")

    monkeypatch.setattr(runtime, "require", missing)
    loaded = round_trip(case.gm)
    with pytest.raises(ImportError, match="fxloom\\[onnx\\]"):
        call(loaded, case.inputs)


# -------------------------------------------------------------- refused, with a hint
def test_a_prepared_model_is_refused_naming_its_observer_and_saying_to_convert_first():
    from fxloom.quantize import prepare

    model, inputs = zoo_model("cnn_small")
    buffer = io.BytesIO()
    with pytest.raises(fxloom.SerializationError, match=r"x_observer .*convert\(prepared\) first"):
        fxloom.save(prepare(model, inputs), buffer)
    assert buffer.getvalue() == b""  # nothing written


def test_a_model_prepared_for_qat_is_refused_naming_its_layer():
    from fxloom.quantize import prepare_qat

    model, inputs = zoo_model("cnn_small")
    with pytest.raises(fxloom.SerializationError, match=r"QATConv2d.*quantization-aware.*convert"):
        fxloom.save(prepare_qat(model.train(), inputs), io.BytesIO())


class DataDependentGate(nn.Module):
    """Control flow on a value: kept as a call by autoleaf, rebuilt from its state once allowed."""

    def __init__(self) -> None:
        super().__init__()
        self.threshold = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.relu() if x.sum() > self.threshold else -x


class GatedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.gate = DataDependentGate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.linear(x)) * 2


def test_an_autoleaf_user_module_is_refused_until_registered_then_round_trips():
    torch.manual_seed(0)
    gm = fxloom.symbolic_trace(GatedNet().eval(), autoleaf=True)
    assert [n.target for n in gm.graph.find_nodes(op="call_module")] == ["linear", "gate"]
    with pytest.raises(
        fxloom.SerializationError,
        match=r"DataDependentGate.*register_serializable\(DataDependentGate\)",
    ):
        fxloom.save(gm, io.BytesIO())
    fxloom.register_serializable(DataDependentGate)
    loaded = round_trip(gm)
    assert_same_structure(loaded, gm)
    assert loaded.gate.threshold == 0.0
    for x in (torch.randn(3, 4), -torch.ones(5, 4)):
        assert_same_outputs(loaded, gm, (x,))


def scaled_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 1.7


fxloom.wrap("scaled_tanh")


class UsesScaledTanh(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scaled_tanh(self.linear(x))


def test_a_user_function_in_the_graph_is_refused_until_registered_then_round_trips():
    torch.manual_seed(0)
    gm = fxloom.symbolic_trace(UsesScaledTanh())
    with pytest.raises(
        fxloom.SerializationError, match=r"scaled_tanh.*register_serializable\(scaled_tanh\)"
    ):
        fxloom.save(gm, io.BytesIO())
    fxloom.register_serializable(scaled_tanh)
    loaded = round_trip(gm)
    assert_same_structure(loaded, gm)
    assert_same_outputs(loaded, gm, (torch.randn(2, 3),))


def rewritten_file(gm: fxloom.GraphModule, old: str, new: str) -> bytes:
    """``gm`` saved, with ``old`` replaced by ``new`` in the program's JSON."""
    import zipfile

    saved, edited = io.BytesIO(), io.BytesIO()
    fxloom.save(gm, saved)
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(edited, "w") as target:
        for name in source.namelist():
            data = source.read(name)
            if name == "fxloom/program.json":
                assert old.encode() in data
                data = data.replace(old.encode(), new.encode())
            target.writestr(name, data)
    return edited.getvalue()


def test_a_file_naming_an_observer_is_refused_on_loading():
    gm = fxloom.symbolic_trace(nn.Sequential(nn.Identity()))
    observer = "fxloom.quantize.observers.MinMaxObserver"
    data = rewritten_file(gm, "torch.nn.modules.linear.Identity", observer)
    with pytest.raises(fxloom.SerializationError, match="an observer, which fxloom does not load"):
        fxloom.load(data)


def test_a_lowered_region_with_an_unknown_setting_is_refused_on_loading():
    data = rewritten_file(lowered_resnet().gm, '"fixed_inputs"', '"run_this"')
    with pytest.raises(fxloom.SerializationError, match="OrtModule has no setting 'run_this'"):
        fxloom.load(data)


def test_float_io_layers_loaded_under_another_quantized_engine_are_packed_for_x86():
    if not {"qnnpack", "x86"} <= set(torch.backends.quantized.supported_engines):
        pytest.skip("needs the qnnpack and x86 quantized engines")
    case = quantized("deeprec_tiny")  # every layer float-in/float-out: LinearFloatIO
    buffer = io.BytesIO()
    fxloom.save(case.gm, buffer)
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "qnnpack"
    try:
        loaded = fxloom.load(buffer.getvalue())
    finally:
        torch.backends.quantized.engine = engine
    assert_same_outputs(loaded, case.gm, case.inputs)


def test_a_quantized_layer_with_a_forward_hook_is_refused_as_python_code():
    gm = int8_linear_stack().gm
    layer = next(m for m in gm.modules() if type(m).__name__ == "LinearReLU")
    layer.register_forward_hook(lambda module, args, output: output)
    with pytest.raises(fxloom.SerializationError, match=r"LinearReLU.*forward_hooks"):
        fxloom.save(gm, io.BytesIO())
