"""Hugging Face models traced, quantized and lowered from the inputs users pass, nothing more.

A user calls ``model(input_ids=ids, attention_mask=mask)`` and hands fxloom the same dict:
``symbolic_trace(model, example_inputs={"input_ids": ids, "attention_mask": mask})``. Every
other parameter keeps its default (``inputs_embeds`` stays None, ``use_cache`` follows the
config), as when the model is called, and as torch.export takes the same dict as kwargs.
The models are the zoo registry's tiny configs (random weights, no downloads); encoder-
decoder models get decoder inputs as a user gives them. The traced module must equal eager
at the example size and at another batch size and length, and ``prepare``, ``lower``,
``to_onnx`` and ``fxloom quantize`` take the same dict.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

import fxloom
from fxloom import pytree
from fxloom.lower import to_onnx
from fxloom.lower.lowering import lower
from fxloom.pytree import container_type
from fxloom.quantize import calibrate, convert, prepare

transformers = pytest.importorskip("transformers")

TESTS = Path(__file__).resolve().parent
ROOT = str(TESTS.parent)
if ROOT not in sys.path:  # `benchmarks` is not installed; import it from the checkout
    sys.path.insert(0, ROOT)

from transformers.modeling_outputs import BaseModelOutput  # noqa: E402

from benchmarks.zoo import registry  # noqa: E402


def _taken_apart_as_itself(cls: type) -> bool:
    container = container_type(cls)
    return container is not None and container.type is cls


# fxloom's pytree takes the classes transformers registers with torch's (model outputs,
# caches) with issue 22's item 2; until it does, a model returning its cache (use_cache at
# its default) does not trace, and a lowered model returns an OrderedDict.
TRANSFORMERS_CONTAINERS = pytest.mark.xfail(
    not all(map(_taken_apart_as_itself, (transformers.DynamicCache, BaseModelOutput))),
    reason="transformers' caches and outputs are not fxloom.pytree containers yet",
    strict=True,
)
MODELS = [
    "bert",
    pytest.param("gpt2", marks=TRANSFORMERS_CONTAINERS),
    pytest.param("llama", marks=TRANSFORMERS_CONTAINERS),
    pytest.param("t5", marks=TRANSFORMERS_CONTAINERS),
    "vit",
    pytest.param("whisper", marks=TRANSFORMERS_CONTAINERS),
]


# Tiny models on a busy two-core machine: one thread (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")


tensors = pytree.tensor_leaves  # model outputs, tuples, transformers' caches


def assert_same_outputs(got: Any, expected: Any) -> None:
    assert type(got) is type(expected)
    got, expected = tensors(got), tensors(expected)
    assert len(got) == len(expected) > 0
    for ours, theirs in zip(got, expected):
        assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def placeholders(gm: fxloom.GraphModule) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "placeholder"]


@pytest.mark.parametrize("name", MODELS)
def test_a_dict_of_the_real_inputs_traces_to_eager_at_two_sizes(name: str) -> None:
    spec = registry.get(name)
    model, inputs = spec.build()
    gm = fxloom.symbolic_trace(model, example_inputs=inputs)
    assert placeholders(gm) == list(inputs)  # the inputs named, nothing else
    for size in (spec.example, spec.other):
        given = spec.make_inputs(*size)
        with torch.no_grad():
            assert_same_outputs(gm(**given), model(**given))


def test_torch_export_takes_the_same_dict_and_the_same_inputs() -> None:
    model, inputs = registry.get("bert").build()
    ours = fxloom.symbolic_trace(model, example_inputs=inputs)
    theirs = torch.export.export(model, (), inputs, strict=False)
    assert placeholders(ours) == list(theirs.graph_signature.user_inputs)
    other = registry.get("bert").make_inputs(2, 7)
    with torch.no_grad():
        assert_same_outputs(ours(**other), theirs.module()(**other))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).norm() / ref.norm())


def test_bert_quantizes_from_a_dict_of_its_inputs() -> None:
    spec = registry.get("bert")
    model, inputs = spec.build()
    prepared = prepare(model, inputs)
    assert placeholders(prepared) == list(inputs)
    int8 = convert(calibrate(prepared, [inputs, spec.make_inputs(3, 5)], progress=False))
    for size in (spec.example, spec.other):
        given = spec.make_inputs(*size)
        with torch.no_grad():
            out, ref = int8(**given).last_hidden_state, model(**given).last_hidden_state
        assert relative_error(out, ref) < 0.1


@TRANSFORMERS_CONTAINERS
def test_bert_lowers_from_a_dict_of_its_inputs() -> None:
    spec = registry.get("bert")
    model, inputs = spec.build()
    lowered = lower(model, inputs, check=True, dynamic_batch=True)
    assert lowered.lowering_report.lowered, str(lowered.lowering_report)
    other = spec.make_inputs(5, spec.example[1])  # another batch size
    with torch.no_grad():
        got, expected = lowered(**other), model(**other)
    assert_close(got.last_hidden_state, expected.last_hidden_state, rtol=1e-4, atol=1e-4)


def test_bert_writes_onnx_from_a_dict_of_its_inputs(tmp_path) -> None:
    import onnxruntime

    spec = registry.get("bert")
    model, inputs = spec.build()
    path = tmp_path / "bert.onnx"
    to_onnx(model, inputs, path, dynamic_batch=True)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(inputs)
    other = spec.make_inputs(3, spec.example[1])
    (hidden, *_) = session.run(None, {k: v.numpy() for k, v in other.items()})
    with torch.no_grad():
        expected = model(**other).last_hidden_state
    assert_close(torch.from_numpy(hidden), expected, rtol=1e-4, atol=1e-4)


def bert_factory() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A MODEL factory as a user writes one: the model and a dict of its real inputs."""
    return registry.get("bert").build()


def test_fxloom_quantize_takes_a_hugging_face_factory(monkeypatch) -> None:
    from test_cli import run_fxloom

    paths = [str(TESTS), ROOT, os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    result = run_fxloom("quantize", "test_hf_user_inputs:bert_factory", "--batches", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "bert_factory: static int8, engine x86, 2 random batches"
    summary = " ".join(" ".join(lines[1:]).split())  # in a pipe the summary wraps at 80 columns
    assert ", cosine 0.9" in summary


def test_fxloom_lower_takes_the_same_factory(capsys) -> None:
    from fxloom import cli

    assert cli.main(["lower", "test_hf_user_inputs:bert_factory"]) == 0
    assert "BertModel:" in capsys.readouterr().out
