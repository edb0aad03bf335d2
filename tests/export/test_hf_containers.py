"""Exported Hugging Face models take and return their own classes: ``ModelOutput`` and caches.

transformers registers its ``ModelOutput`` classes with ``torch.utils._pytree``, and fxloom
reads that registry, so ``ep.module()`` returns the model's output class (``out.logits``).
Its key/value caches (``DynamicCache``) are registered nowhere; fxloom takes them apart and
rebuilds them (``fxloom.library_containers``), so language models (GPT-2, Llama, and T5 with
its ``EncoderDecoderCache``) export with their default ``use_cache=True``, return the cache,
and take it back as ``past_key_values`` for the next step. torch.export 2.13 refuses the same call. An input left None (BERT's
``token_type_ids`` and six others) is fixed rather than lifted, so the program has the two
inputs it was given, and quantizes and writes ONNX.

Models come from tiny configs with random weights (``fxloom.zoo.hf_configs``); each result
is compared with eager at the example's size and at another batch and sequence length.
"""

from __future__ import annotations

import copy
import inspect
import io
from typing import Any

import pytest
import torch
from torch.testing import assert_close

import fxloom
from benchmarks.zoo.methods import fixed_args
from fxloom import pytree
from fxloom.export import Dim, export, load, save, unflatten
from fxloom.zoo.hf_configs import BERT_LIKE, DECODER, GPT2_LIKE, T5_LIKE, VOCAB, hf

transformers = pytest.importorskip("transformers")

DECODERS = {
    "gpt2": hf("GPT2LMHeadModel", "GPT2Config", **GPT2_LIKE),
    "llama": hf("LlamaForCausalLM", "LlamaConfig", **DECODER),
}
EXAMPLE, OTHER = (2, 8), (3, 5)  # (batch, sequence length)
BATCH, SEQ, PAST = Dim("batch", max=16), Dim("seq", max=32), Dim("past", max=32)


# Tiny models on a busy two-core machine: one thread (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return DECODERS[name]().eval()


def tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def layers_of(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def assert_same_cache(got: Any, expected: Any) -> None:
    assert type(got) is type(expected)
    if isinstance(expected, transformers.EncoderDecoderCache):
        assert got.is_updated == expected.is_updated
        assert_same_cache(got.self_attention_cache, expected.self_attention_cache)
        assert_same_cache(got.cross_attention_cache, expected.cross_attention_cache)
        return
    for (keys, values), (ref_keys, ref_values) in zip(
        layers_of(got), layers_of(expected), strict=True
    ):
        assert_close(keys, ref_keys)
        assert_close(values, ref_values)


def assert_same_lm_output(got: Any, expected: Any) -> None:
    assert type(got) is type(expected)
    assert_close(got.logits, expected.logits)
    assert_same_cache(got.past_key_values, expected.past_key_values)


def cache_input(model: torch.nn.Module) -> str:
    """The parameter that takes the cache back: `cache` from transformers 5.24 (which still
    accepts `past_key_values` with a deprecation warning), `past_key_values` before."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def export_prefill(model: torch.nn.Module) -> Any:
    ids = tokens(*EXAMPLE)
    return export(model, (ids,), dynamic_shapes={"input_ids": {0: BATCH, 1: SEQ}})


# ------------------------------------------------------------------ decoders, use_cache on


@pytest.mark.parametrize("name", sorted(DECODERS))
@pytest.mark.parametrize("size", [EXAMPLE, OTHER], ids=["example", "other_size"])
def test_exported_lm_returns_its_output_class_with_the_cache(name: str, size: tuple) -> None:
    model = build(name)
    module = export_prefill(model).module()
    ids = tokens(*size, seed=1)
    with torch.no_grad():
        assert_same_lm_output(module(ids), model(ids))


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_exported_lm_output_reads_by_attribute(name: str) -> None:
    out = export_prefill(build(name)).module()(tokens(*EXAMPLE))
    assert out.logits.shape == (*EXAMPLE, VOCAB)
    assert isinstance(out.past_key_values, transformers.DynamicCache)
    assert out.past_key_values.get_seq_length() == EXAMPLE[1]


def export_next_step(model: torch.nn.Module) -> Any:
    """A one-token step after a prefill of the example, the cache's batch and length dynamic."""
    with torch.no_grad():
        past = model(tokens(*EXAMPLE)).past_key_values
    layer_dims = ({0: BATCH, 2: PAST}, {0: BATCH, 2: PAST})
    dynamic = {
        "input_ids": {0: BATCH},
        cache_input(model): [layer_dims] * len(past.layers),
    }
    nxt = tokens(EXAMPLE[0], 1, seed=2)
    return export(model, (nxt,), {cache_input(model): past}, dynamic_shapes=dynamic)


@pytest.mark.parametrize("name", sorted(DECODERS))
@pytest.mark.parametrize("size", [EXAMPLE, OTHER], ids=["example", "other_size"])
def test_second_decoding_step_takes_the_cache_the_first_returned(name: str, size: tuple) -> None:
    model = build(name)
    prefill, step = export_prefill(model).module(), export_next_step(model).module()
    prompt, nxt = tokens(*size, seed=3), tokens(size[0], 1, seed=4)
    with torch.no_grad():
        first = prefill(prompt)
        got = step(nxt, **{cache_input(model): first.past_key_values})
        eager_past = model(prompt).past_key_values
        expected = model(nxt, **{cache_input(model): copy.deepcopy(eager_past)})
    assert_same_lm_output(got, expected)
    assert got.past_key_values.get_seq_length() == size[1] + 1


def test_the_exported_step_leaves_the_cache_passed_in_unchanged() -> None:
    # Functional, as exported programs are: the result holds a new cache (eager appends to it).
    model = build("gpt2")
    step = export_next_step(model).module()
    with torch.no_grad():
        past = model(tokens(*EXAMPLE)).past_key_values
        before = [(k.clone(), v.clone()) for k, v in layers_of(past)]
        out = step(tokens(EXAMPLE[0], 1), **{cache_input(model): past})
    assert out.past_key_values is not past
    for (keys, values), (old_keys, old_values) in zip(layers_of(past), before):
        assert torch.equal(keys, old_keys) and torch.equal(values, old_values)


def test_torch_export_refuses_the_default_cache_that_fxloom_exports() -> None:
    model, ids = build("gpt2"), tokens(*EXAMPLE)
    with pytest.raises(RuntimeError, match="DynamicCache.* not a known type"):
        torch.export.export(model, (ids,))  # out of the box: the cache is no pytree there
    out = export(model, (ids,)).module()(ids)
    assert isinstance(out.past_key_values, transformers.DynamicCache)


def test_exported_lm_with_its_cache_survives_save_and_load() -> None:
    model = build("gpt2")
    ep = export_prefill(model)
    buffer = io.BytesIO()
    save(ep, buffer)
    loaded = load(buffer.getvalue())
    ids = tokens(*OTHER, seed=5)
    with torch.no_grad():
        assert_same_lm_output(loaded.module()(ids), model(ids))


def test_unflattened_lm_returns_its_output_class_with_the_cache() -> None:
    model = build("llama")
    tree = unflatten(export_prefill(model))
    ids = tokens(*OTHER, seed=6)
    with torch.no_grad():
        assert_same_lm_output(tree(ids), model(ids))


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_symbolically_traced_lm_returns_its_output_class_with_the_cache(name: str) -> None:
    model = build(name)
    example = {"input_ids": tokens(*EXAMPLE)}
    fixed = {**fixed_args(model, example), "use_cache": True, cache_input(model): None}
    if "return_dict" in fixed:  # a forward that takes it (transformers 5.0's GPT-2): as eager
        fixed["return_dict"] = True
    gm = fxloom.symbolic_trace(model, fixed, example_inputs=example)
    buffer = io.BytesIO()
    fxloom.save(gm, buffer)
    loaded = fxloom.load(buffer.getvalue())
    ids = tokens(*OTHER, seed=10)
    with torch.no_grad():
        expected = model(ids)
        assert_same_lm_output(gm(ids), expected)
        assert_same_lm_output(loaded(ids), expected)


def test_a_cache_of_sliding_window_layers_is_refused_by_name() -> None:
    cache = transformers.DynamicCache()
    cache.layers.append(transformers.cache_utils.DynamicSlidingWindowLayer(sliding_window=4))
    with pytest.raises(TypeError, match="DynamicSlidingWindowLayer.*use_cache=False"):
        pytree.tree_flatten(cache)


# ------------------------------------------------------------------ T5: an encoder-decoder cache


@pytest.fixture(scope="module")
def t5() -> torch.nn.Module:
    torch.manual_seed(0)
    return hf("T5ForConditionalGeneration", "T5Config", **T5_LIKE)().eval()


def seq2seq_inputs(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    return {
        "input_ids": tokens(batch, length, seed),
        "decoder_input_ids": tokens(batch, length // 2 + 1, seed + 1),
    }


@pytest.mark.parametrize("size", [EXAMPLE, OTHER], ids=["example", "other_size"])
def test_exported_t5_returns_its_output_class_with_an_encoder_decoder_cache(t5, size) -> None:
    target = Dim("target", max=32)
    dynamic = {"input_ids": {0: BATCH, 1: SEQ}, "decoder_input_ids": {0: BATCH, 1: target}}
    ep = export(t5, (), seq2seq_inputs(*EXAMPLE), dynamic_shapes=dynamic)
    inputs = seq2seq_inputs(*size, seed=11)
    with torch.no_grad():
        got, expected = ep.module()(**inputs), t5(**inputs)
    assert isinstance(got.past_key_values, transformers.EncoderDecoderCache)
    assert_same_lm_output(got, expected)


def test_exported_t5_step_takes_the_encoder_decoder_cache_back(t5) -> None:
    with torch.no_grad():
        first = t5(**seq2seq_inputs(*EXAMPLE))
    step_inputs = {
        "encoder_outputs": (first.encoder_last_hidden_state,),
        "decoder_input_ids": tokens(EXAMPLE[0], 1, seed=12),
        cache_input(t5): first.past_key_values,
    }
    module = export(t5, (), step_inputs).module()
    with torch.no_grad():
        got = module(**step_inputs)
        expected = t5(**{**step_inputs, cache_input(t5): copy.deepcopy(first.past_key_values)})
    assert_same_lm_output(got, expected)


# ------------------------------------------------------------------ BERT: inputs left None


@pytest.fixture(scope="module")
def bert() -> torch.nn.Module:
    torch.manual_seed(0)
    return hf("BertModel", "BertConfig", **BERT_LIKE)().eval()


def bert_inputs(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, -2:] = 0  # right padding in the first row
    return {"input_ids": tokens(batch, length, seed), "attention_mask": mask}


@pytest.fixture(scope="module")
def bert_program(bert: torch.nn.Module) -> Any:
    dims = {0: BATCH, 1: SEQ}
    return export(
        bert, (), bert_inputs(*EXAMPLE), dynamic_shapes={"input_ids": dims, "attention_mask": dims}
    )


def test_exported_bert_has_the_two_inputs_it_was_given(bert_program: Any) -> None:
    assert bert_program.graph_signature.user_inputs == ["input_ids", "attention_mask"]


@pytest.mark.parametrize("size", [EXAMPLE, OTHER], ids=["example", "other_size"])
def test_exported_bert_returns_its_output_class(bert, bert_program, size: tuple) -> None:
    inputs = bert_inputs(*size, seed=7)
    with torch.no_grad():
        got, expected = bert_program.module()(**inputs), bert(**inputs)
    assert type(got) is type(expected)
    assert_close(got.last_hidden_state, expected.last_hidden_state)
    assert_close(got.pooler_output, expected.pooler_output)


def test_an_input_exported_as_none_refuses_a_tensor_by_name(bert_program: Any) -> None:
    inputs = bert_inputs(*EXAMPLE)
    with pytest.raises(ValueError, match="input 'token_type_ids'.*None"):
        bert_program.module()(**inputs, token_type_ids=torch.zeros_like(inputs["input_ids"]))


def test_exported_bert_quantizes_close_to_eager(bert, bert_program) -> None:
    from fxloom.quantize import calibrate, convert, prepare

    prepared = prepare(bert_program, bert_inputs(*EXAMPLE))
    calibrate(prepared, [bert_inputs(*EXAMPLE, seed=s) for s in range(4)], progress=False)
    int8 = convert(prepared)
    inputs = bert_inputs(*OTHER, seed=8)
    with torch.no_grad():
        got, expected = int8(**inputs), bert(**inputs)
    assert type(got) is type(expected)
    error = (got.last_hidden_state - expected.last_hidden_state).norm()
    assert error / expected.last_hidden_state.norm() < 0.1


def test_exported_bert_writes_onnx_that_onnx_runtime_runs_as_eager(bert, bert_program, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    from fxloom.lower import to_onnx

    inputs = bert_inputs(*EXAMPLE)
    to_onnx(bert_program, inputs, tmp_path / "bert.onnx")
    session = onnxruntime.InferenceSession(
        str(tmp_path / "bert.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    hidden, pooled = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        expected = bert(**inputs)
    assert_close(torch.from_numpy(hidden), expected.last_hidden_state, rtol=1e-4, atol=1e-5)
    assert_close(torch.from_numpy(pooled), expected.pooler_output, rtol=1e-4, atol=1e-5)


def test_exported_bert_lowers_to_onnx_runtime_returning_its_output_class(bert, bert_program):
    pytest.importorskip("onnxruntime")
    from fxloom.lower import lower

    lowered = lower(bert_program, bert_inputs(*EXAMPLE), check=True)
    inputs = bert_inputs(*EXAMPLE, seed=9)
    with torch.no_grad():
        got, expected = lowered(**inputs), bert(**inputs)
    assert type(got) is type(expected)
    assert_close(got.last_hidden_state, expected.last_hidden_state, rtol=1e-4, atol=1e-5)
