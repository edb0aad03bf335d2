"""fxloom.compile on real models: the embedded zoo and Hugging Face models from tiny configs.

Each model is compiled as users compile it (``fxloom.compile(model)``) and called as users
call it (a dict of its real inputs for Hugging Face models); the results must equal eager at
the example and at another batch size (and sequence length), the model must be one graph
with no break, and ``explain()`` must say so. GPT-2's ``generate`` with a compiled forward
gives eager's tokens.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import fxloom
import fxloom.zoo as zoo
from fxloom import pytree

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `benchmarks` is not installed; import it from the checkout
    sys.path.insert(0, ROOT)

pytestmark = pytest.mark.usefixtures("one_thread")


tensors = pytree.tensor_leaves  # model outputs, tuples, transformers' caches


def assert_same(got: Any, expected: Any) -> None:
    assert type(got) is type(expected)
    got, expected = tensors(got), tensors(expected)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def assert_one_graph(compiled: Any) -> None:
    report = compiled.explain()
    assert (report.graph_count, report.break_count, report.runs_as_python) == (1, 0, None), str(
        report
    )


ZOO = ["mlp_tiny", "cnn_small", "resnet_tiny", "transformer_tiny", "deeprec_tiny"]


@pytest.mark.parametrize("name", ZOO)
def test_a_zoo_model_is_one_graph_equal_to_eager(name):
    model = getattr(zoo, name)().eval()
    inputs = getattr(zoo, f"{name}_inputs")()
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    compiled = fxloom.compile(model)
    with torch.no_grad():
        assert_same(compiled(*inputs), model(*inputs))
        assert_one_graph(compiled)
        if name != "transformer_tiny":  # its mask is built for the example's length
            bigger = tuple(torch.cat([t, t[:1]]) for t in inputs)
            assert_same(compiled(*bigger), model(*bigger))


HUGGING_FACE = ["bert", "gpt2", "llama", "t5", "vit", "whisper"]


@pytest.fixture(scope="module")
def registry():
    pytest.importorskip("transformers")
    from benchmarks.zoo import registry

    return registry


@pytest.mark.parametrize("name", HUGGING_FACE)
def test_a_hugging_face_model_called_with_its_inputs_is_one_graph_equal_to_eager(registry, name):
    spec = registry.get(name)
    model, inputs = spec.build()
    model.eval()
    compiled = fxloom.compile(model)
    with torch.no_grad():
        assert_same(compiled(**inputs), model(**inputs))
        assert_one_graph(compiled)
        other = spec.make_inputs(3, 32 if name == "vit" else 9)  # another batch and length
        assert_same(compiled(**other), model(**other))


def test_gpt2_generate_with_a_compiled_forward_gives_eagers_tokens(registry):
    from transformers import GPT2LMHeadModel

    model, inputs = registry.get("gpt2").build()
    language_model = GPT2LMHeadModel(model.config).eval()
    prompt = inputs["input_ids"][:1]
    with torch.no_grad():
        expected = language_model.generate(prompt, max_new_tokens=8, do_sample=False)
        language_model.forward = fxloom.compile(language_model.forward)
        tokens = language_model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(tokens, expected)
    report = language_model.forward.explain()
    assert report.break_count == 0 and report.graph_count <= 8  # prefill, then one per length


def test_a_compiled_graph_works_with_fxloom_passes_and_backends():
    from fxloom.passes.shape_prop import ShapeProp

    model = zoo.resnet_tiny().eval()
    x = zoo.resnet_tiny_inputs()
    x = x[0] if isinstance(x, tuple) else x
    seen = {}

    def backend(graph_module, example_inputs):
        ShapeProp(graph_module).propagate(*example_inputs)
        seen["shapes"] = [
            node.meta.get("tensor_meta") is not None for node in graph_module.graph.nodes
        ]
        return graph_module.forward

    with torch.no_grad():
        assert torch.allclose(fxloom.compile(model, backend=backend)(x), model(x))
        pytest.importorskip("onnxruntime")
        assert torch.allclose(fxloom.compile(model, backend="onnxruntime")(x), model(x), atol=1e-4)
    assert seen["shapes"] and all(seen["shapes"][:-1])


def test_a_captured_graph_saves_loads_and_quantizes(tmp_path):
    from fxloom.quantize import calibrate, convert, prepare

    model = zoo.resnet_tiny().eval()
    x = zoo.resnet_tiny_inputs()
    x = x[0] if isinstance(x, tuple) else x
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append((graph_module, example_inputs))
        return graph_module.forward

    with torch.no_grad():
        fxloom.compile(model, backend=backend)(x)
        graph_module, example_inputs = graphs[0]
        fxloom.save(graph_module, tmp_path / "captured.fxl")
        loaded = fxloom.load(tmp_path / "captured.fxl")
        assert torch.allclose(loaded(*example_inputs)[0], model(x))
        prepared = prepare(graph_module, tuple(example_inputs))
        calibrate(prepared, [tuple(example_inputs)])
        quantized = convert(prepared)(*example_inputs)[0]
    assert (quantized - model(x)).abs().max() < 0.1 * model(x).abs().max()
