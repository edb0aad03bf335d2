"""Shape propagation: ``fxloom.passes.shape_prop.ShapeProp``, on real tensors and on meta.

Every node of the zoo models and of Hugging Face models gets a ``tensor_meta`` equal to what
eager PyTorch computes at that point; meta mode records exactly what real mode records, without
data or memory; nested outputs keep their nesting; quantized tensors carry their parameters;
and mistakes (wrong inputs, an operator with no meta kernel) name the input or the node.
"""

from __future__ import annotations

import resource
from collections import namedtuple
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxloom
from fxloom import zoo
from fxloom.passes.shape_prop import (
    META_FUNCTIONS,
    ShapeProp,
    ShapePropError,
    TensorMetadata,
    extract_tensor_metadata,
)

ZOO_MODELS = ["mlp_tiny", "resnet_tiny", "transformer_tiny"]
HF_MODELS = ["bert", "vit_classifier", "gpt2"]
# torch deprecates its quantized tensors; the tests of their metadata still create some.
pytestmark = pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")


# ------------------------------------------------------------------------------- helpers
class Recorder(fxloom.Interpreter):
    """Runs the graph keeping every node's value (what eager computes at that point)."""

    def __init__(self, gm: fxloom.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.values: dict[fxloom.Node, Any] = {}

    def run_node(self, n: fxloom.Node) -> Any:
        self.values[n] = value = super().run_node(n)
        return value


def assert_describes(meta: Any, value: Any, where: str) -> None:
    """``meta`` is the TensorMetadata nesting of ``value``: same shapes, dtypes, strides."""
    if isinstance(value, torch.Tensor):
        assert isinstance(meta, TensorMetadata), where
        assert (meta.shape, meta.dtype, meta.stride) == (value.shape, value.dtype, value.stride())
        assert meta.requires_grad == value.requires_grad, where
    elif isinstance(value, dict):
        assert list(meta) == list(value), where
        for key in value:
            assert_describes(meta[key], value[key], f"{where}[{key!r}]")
    elif isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
        assert len(meta) == len(value), where
        for index, item in enumerate(value):
            assert_describes(meta[index], item, f"{where}[{index}]")


def holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(map(holds_tensor, value.values()))
    return isinstance(value, (tuple, list)) and any(map(holds_tensor, value))


def eager_module_outputs(model: nn.Module, run) -> dict[str, Any]:
    """The output of every submodule call in an eager run, by module path (last call wins)."""
    outputs, handles = {}, []
    for path, module in model.named_modules():
        if path:
            hook = lambda m, args, out, path=path: outputs.__setitem__(path, out)
            handles.append(module.register_forward_hook(hook))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return outputs


def snapshot(gm: fxloom.GraphModule) -> dict[str, tuple[Any, Any]]:
    return {n.name: (n.meta.get("tensor_meta"), n.meta.get("type")) for n in gm.graph.nodes}


@pytest.fixture(scope="module", params=ZOO_MODELS)
def zoo_model(request):
    model, inputs = zoo.build(request.param)
    return model, fxloom.symbolic_trace(model), inputs


@pytest.fixture(scope="module", params=HF_MODELS)
def hugging_face(request, traced_hf):
    model, inputs, fixed, gm = traced_hf(request.param)
    return model, gm, inputs, fixed


# ------------------------------------------------------------- real mode on real models
def test_every_zoo_node_gets_the_metadata_of_its_eager_value(zoo_model):
    model, gm, inputs = zoo_model
    output = ShapeProp(gm).propagate(*inputs)
    recorder = Recorder(gm)
    recorder.run(*inputs)
    for node in gm.graph.nodes:
        value = recorder.values[node]
        assert node.meta["type"] is type(value)
        if holds_tensor(value):
            assert_describes(node.meta["tensor_meta"], value, node.name)
        else:
            assert "tensor_meta" not in node.meta, node.name
    torch.testing.assert_close(output, model(*inputs))


def test_zoo_module_calls_have_the_shapes_of_the_eager_submodules(zoo_model):
    model, gm, inputs = zoo_model
    ShapeProp(gm).propagate(*inputs)
    eager = eager_module_outputs(model, lambda: model(*inputs))
    calls = gm.graph.find_nodes(op="call_module")
    assert calls
    for node in calls:
        assert node.meta["tensor_meta"].shape == eager[node.target].shape, node.name


def test_every_hugging_face_node_gets_the_metadata_of_its_value(hugging_face):
    model, gm, inputs, fixed = hugging_face
    output = ShapeProp(gm).propagate(**inputs)
    recorder = Recorder(gm)
    placeholders = gm.graph.find_nodes(op="placeholder")
    recorder.run(*[inputs.get(p.target, p.args[0] if p.args else None) for p in placeholders])
    for node in gm.graph.nodes:
        value = recorder.values[node]
        if holds_tensor(value):
            assert_describes(node.meta["tensor_meta"], value, node.name)
    eager = model(**inputs, **fixed)
    assert output[0].shape == eager[0].shape
    # A model output is keyed by name; a model whose forward takes return_dict (transformers
    # 5.0's GPT-2, fixed to False here) returns a tuple, keyed by position.
    first = next(iter(eager)) if isinstance(eager, dict) else 0
    assert node.meta["tensor_meta"][first].shape == eager[0].shape


def test_hugging_face_module_calls_have_the_shapes_of_the_eager_submodules(hugging_face):
    model, gm, inputs, fixed = hugging_face
    ShapeProp(gm).propagate(**inputs)
    eager = eager_module_outputs(model, lambda: model(**inputs, **fixed))
    for node in gm.graph.find_nodes(op="call_module"):
        assert node.meta["tensor_meta"].shape == eager[node.target].shape, node.name


def test_propagate_returns_what_the_graph_returns():
    gm = fxloom.symbolic_trace(nn.Linear(3, 2))
    x = torch.randn(4, 3)
    torch.testing.assert_close(ShapeProp(gm).propagate(x), gm(x))


# --------------------------------------------------------------------------- meta mode
def test_meta_mode_records_what_real_mode_records_on_the_zoo(zoo_model):
    _, gm, inputs = zoo_model
    ShapeProp(gm).propagate(*inputs)
    real = snapshot(gm)
    ShapeProp(gm).propagate_meta(*inputs)
    assert snapshot(gm) == real


def test_meta_mode_records_what_real_mode_records_on_resnet50():
    model, inputs = zoo.build("resnet50")
    gm = fxloom.symbolic_trace(model)
    x = torch.randn(1, 3, 64, 64)
    ShapeProp(gm).propagate(x)
    real = snapshot(gm)
    out = ShapeProp(gm).propagate_meta(x)
    assert out.is_meta and out.shape == (1, 1000)
    assert snapshot(gm) == real


def test_meta_mode_records_what_real_mode_records_on_hugging_face(hugging_face):
    # Includes F.scaled_dot_product_attention, whose CPU kernel lays its output out like the
    # query while the meta kernel returns it contiguous: META_FUNCTIONS makes them agree.
    _, gm, inputs, _ = hugging_face
    ShapeProp(gm).propagate(**inputs)
    real = snapshot(gm)
    ShapeProp(gm).propagate_meta(**inputs)
    assert snapshot(gm) == real


def test_meta_mode_at_batch_4096_on_resnet50_takes_no_real_memory():
    model, _ = zoo.build("resnet50")
    gm = fxloom.symbolic_trace(model)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    out = ShapeProp(gm).propagate_meta(torch.Size([4096, 3, 224, 224]))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before
    assert out.shape == (4096, 1000) and out.is_meta
    # A real run would hold a 2.3 GiB input and ~100 GiB of activations.
    assert grown < 256 * 1024, f"peak memory grew by {grown / 1024:.0f} MiB"
    assert gm.graph.find_nodes(op="call_module")[0].meta["tensor_meta"].shape == (
        4096, 64, 112, 112,
    )  # fmt: skip


def test_meta_mode_neither_copies_nor_touches_the_real_weights():
    model, inputs = zoo.build("resnet_tiny")
    gm = fxloom.symbolic_trace(model)
    before = {name: (t.data_ptr(), t.clone()) for name, t in gm.state_dict().items()}
    ShapeProp(gm).propagate_meta(*inputs)
    for name, tensor in gm.state_dict().items():
        assert tensor.device.type == "cpu" and tensor.data_ptr() == before[name][0], name
        torch.testing.assert_close(tensor, before[name][1])


def test_meta_mode_accepts_shape_dtype_pairs_and_sizes():
    gm = fxloom.symbolic_trace(lambda tokens, x: x.sum() + tokens.float().mean())
    ShapeProp(gm).propagate_meta(((2, 16), torch.int64), torch.Size([3, 4]))
    tokens, x = gm.graph.find_nodes(op="placeholder")
    assert tokens.meta["tensor_meta"].dtype == torch.int64
    assert x.meta["tensor_meta"].shape == (3, 4) and x.meta["tensor_meta"].dtype == torch.float32


def test_meta_mode_keeps_an_input_tensors_strides_and_requires_grad():
    gm = fxloom.symbolic_trace(lambda x: x * 2)
    x = torch.randn(3, 4).t().requires_grad_()
    ShapeProp(gm).propagate_meta(x)
    meta = gm.graph.find_nodes(op="placeholder")[0].meta["tensor_meta"]
    assert meta.stride == (1, 4) and meta.requires_grad


def test_devices_named_in_the_graph_stay_on_meta():
    def moves(x):
        ones = torch.ones(x.shape[0], device=torch.device("cpu"))
        return x.to("cpu") + x.cpu() + x.to(device=torch.device("cpu")) + ones + torch.zeros(3)

    gm = fxloom.symbolic_trace(moves)
    assert ShapeProp(gm).propagate_meta(torch.Size([3])).is_meta


def test_an_op_without_a_meta_kernel_names_the_node_and_suggests_real_mode():
    gm = fxloom.symbolic_trace(lambda x: torch.nonzero(x.relu()))
    with pytest.raises(ShapePropError) as caught:
        ShapeProp(gm).propagate_meta(torch.Size([4]))
    message = str(caught.value)
    assert (
        "%nonzero" in message
        and "torch.nonzero" in message
        and "Tensor[4] float32 (stand-in)" in message
    )
    assert "real mode" in message and "META_FUNCTIONS" in message
    assert isinstance(caught.value.__cause__, NotImplementedError)


def test_data_dependent_python_is_reported_on_its_node():
    gm = fxloom.symbolic_trace(lambda x: x.sum().item())
    with pytest.raises(ShapePropError, match=r"%item .*meta device"):
        ShapeProp(gm).propagate_meta(torch.Size([4]))


def keep_positive(x: torch.Tensor) -> torch.Tensor:
    """Made for real tensors: its output size depends on the data."""
    return x[x > 0]


def test_a_meta_functions_entry_runs_an_op_that_has_no_meta_kernel():
    graph = fxloom.Graph()
    graph.output(graph.call_function(keep_positive, (graph.placeholder("x"),)))
    gm = fxloom.GraphModule(nn.Module(), graph)
    with pytest.raises(ShapePropError, match="%keep_positive"):
        ShapeProp(gm).propagate_meta(torch.Size([5]))
    META_FUNCTIONS[keep_positive] = lambda x: x.new_empty(x.numel())  # an upper bound
    try:
        assert ShapeProp(gm).propagate_meta(torch.Size([5])).shape == (5,)
    finally:
        del META_FUNCTIONS[keep_positive]


def test_a_quantized_input_cannot_go_to_meta_and_says_so():
    gm = fxloom.symbolic_trace(lambda x: x.dequantize())
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 3, torch.quint8)
    with pytest.raises(ShapePropError, match="quantized.*real mode"):
        ShapeProp(gm).propagate_meta(q)


# ------------------------------------------------------------------- what gets recorded
def test_nested_outputs_keep_their_nesting():
    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(4, 6, batch_first=True)

        def forward(self, x):
            out, (h, c) = self.lstm(x)
            return {"out": out, "state": [h, c]}

    gm = fxloom.symbolic_trace(Recurrent())
    ShapeProp(gm).propagate(torch.randn(2, 5, 4))
    lstm = gm.graph.find_nodes(op="call_module")[0].meta["tensor_meta"]
    assert lstm[0].shape == (2, 5, 6) and lstm[1][0].shape == lstm[1][1].shape == (1, 2, 6)
    output = gm.graph.find_nodes(op="output")[0]
    assert output.meta["type"] is dict
    assert output.meta["tensor_meta"]["state"][1].shape == (1, 2, 6)
    assert isinstance(output.meta["tensor_meta"]["state"], list)


def test_named_tuples_keep_their_type_and_non_tensor_items_stay_as_they_are():
    Pair = namedtuple("Pair", ["value", "count"])
    gm = fxloom.symbolic_trace(lambda x: Pair(x + 1, 3))
    ShapeProp(gm).propagate(torch.randn(2))
    meta = gm.graph.find_nodes(op="output")[0].meta["tensor_meta"]
    assert type(meta) is Pair and meta.value.shape == (2,) and meta.count == 3


def test_non_tensor_values_get_a_type_but_no_tensor_meta():
    gm = fxloom.symbolic_trace(lambda x: x.view(x.size(0), -1))
    size = next(n for n in gm.graph.nodes if n.target == "size")
    size.meta["tensor_meta"] = "stale, from an earlier run"
    ShapeProp(gm).propagate(torch.randn(2, 3, 4))
    assert size.meta["type"] is int and "tensor_meta" not in size.meta
    assert gm.graph.find_nodes(op="output")[0].meta["tensor_meta"].shape == (2, 12)


def test_memory_format_is_the_first_standard_layout_the_tensor_is_contiguous_in():
    image = torch.randn(2, 3, 4, 5)
    assert extract_tensor_metadata(image).memory_format == torch.contiguous_format
    channels_last = image.to(memory_format=torch.channels_last)
    assert extract_tensor_metadata(channels_last).memory_format == torch.channels_last
    assert extract_tensor_metadata(image.transpose(1, 2)).memory_format is None


def test_quantize_per_tensor_records_scale_and_zero_point():
    gm = fxloom.symbolic_trace(lambda x: torch.quantize_per_tensor(x, 0.5, 8, torch.quint8))
    ShapeProp(gm).propagate(torch.randn(3, 4))
    meta = gm.graph.find_nodes(op="output")[0].meta["tensor_meta"]
    assert meta.is_quantized and meta.dtype == torch.quint8
    assert meta.qparams == {"qscheme": torch.per_tensor_affine, "scale": 0.5, "zero_point": 8}


def test_quantize_per_channel_records_scales_zero_points_and_axis():
    class PerChannel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scales", torch.tensor([0.1, 0.2, 0.4]))
            self.register_buffer("zero_points", torch.tensor([0, 1, 2]))

        def forward(self, w):
            return torch.quantize_per_channel(w, self.scales, self.zero_points, 0, torch.qint8)

    gm = fxloom.symbolic_trace(PerChannel())
    ShapeProp(gm).propagate(torch.randn(3, 5))
    meta = gm.graph.find_nodes(op="output")[0].meta["tensor_meta"]
    assert meta.is_quantized and meta.qparams["qscheme"] == torch.per_channel_affine
    assert meta.qparams["scale"] == pytest.approx([0.1, 0.2, 0.4])
    assert meta.qparams["zero_point"] == [0, 1, 2] and meta.qparams["axis"] == 0


def test_unquantized_tensors_have_empty_qparams():
    meta = extract_tensor_metadata(torch.randn(2))
    assert not meta.is_quantized and meta.qparams == {}


def test_parameters_read_by_get_attr_record_their_type_and_requires_grad():
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.weight

    gm = fxloom.symbolic_trace(Scale())
    for propagate in (ShapeProp(gm).propagate, ShapeProp(gm).propagate_meta):
        propagate(torch.randn(3))
        weight = gm.graph.find_nodes(op="get_attr")[0]
        assert weight.meta["type"] is nn.Parameter and weight.meta["tensor_meta"].requires_grad
        assert gm.graph.find_nodes(op="output")[0].meta["tensor_meta"].requires_grad


# ------------------------------------------------------ what the pass does to the module
def test_only_tensor_meta_and_type_change_and_names_are_kept():
    model, inputs = zoo.build("resnet_tiny")
    gm = fxloom.symbolic_trace(model)
    before = {n.name: dict(n.meta) for n in gm.graph.nodes}
    code = gm.code
    ShapeProp(gm).propagate_meta(*inputs)
    assert [n.name for n in gm.graph.nodes] == list(before)
    for node in gm.graph.nodes:
        kept = {k: v for k, v in node.meta.items() if k not in ("tensor_meta", "type")}
        assert kept == before[node.name]
        assert {"tensor_meta", "type"} <= set(node.meta)
    assert gm.code == code


def test_a_failing_run_leaves_every_nodes_meta_as_it_was():
    gm = fxloom.symbolic_trace(lambda x: torch.nonzero(x + 1))
    before = {n.name: dict(n.meta) for n in gm.graph.nodes}
    with pytest.raises(ShapePropError):
        ShapeProp(gm).propagate_meta(torch.Size([4]))
    assert {n.name: dict(n.meta) for n in gm.graph.nodes} == before


def test_a_shape_mismatch_names_the_node_and_the_shapes_it_got():
    gm = fxloom.symbolic_trace(nn.Sequential(nn.Linear(4, 8), nn.Linear(5, 2)))
    with pytest.raises(ShapePropError) as caught:
        ShapeProp(gm).propagate(torch.randn(3, 4))
    message = str(caught.value)
    assert "%_1 (call_module 1, a Linear)" in message and "Tensor[3, 8] float32" in message


# ----------------------------------------------------------------------------- inputs
def test_inputs_may_be_given_by_name_and_defaults_fill_the_rest():
    def scaled(x, scale=2.0):
        return x * scale

    gm = fxloom.symbolic_trace(scaled)
    assert ShapeProp(gm).propagate(x=torch.ones(2)).tolist() == [2.0, 2.0]
    assert ShapeProp(gm).propagate(torch.ones(2), scale=3.0).tolist() == [3.0, 3.0]


def test_too_many_inputs_is_an_error_naming_the_inputs():
    gm = fxloom.symbolic_trace(lambda x: x + 1)
    with pytest.raises(TypeError, match=r"takes 1 positional input\(s\) \(x\) but 2 were given"):
        ShapeProp(gm).propagate(torch.ones(1), torch.ones(1))


def test_a_missing_input_is_an_error_naming_it():
    gm = fxloom.symbolic_trace(lambda x, y: x + y)
    with pytest.raises(TypeError, match=r"no value for input\(s\) 'y'"):
        ShapeProp(gm).propagate_meta(torch.Size([2]))


def test_an_unknown_keyword_input_is_an_error():
    gm = fxloom.symbolic_trace(lambda x: x + 1)
    with pytest.raises(TypeError, match=r"unexpected input\(s\) 'z'; the graph takes: x"):
        ShapeProp(gm).propagate(x=torch.ones(1), z=torch.ones(1))


def test_run_with_positional_inputs_works_as_in_torch_fx():
    gm = fxloom.symbolic_trace(lambda x: F.relu(x))
    ShapeProp(gm).run(torch.randn(2, 3))
    assert gm.graph.find_nodes(op="output")[0].meta["tensor_meta"].shape == (2, 3)
