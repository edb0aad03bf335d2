"""Language models lowered with their key/value cache (``fxloom.lower.decoder``).

A causal LM (GPT-2, Llama) or an encoder-decoder (T5), tiny and randomly initialised, is
lowered with its default cache on: ``lower`` returns a ``LoweredDecoder`` whose ``forward``
replaces the model's, and greedy ``generate`` then gives eager's tokens; ``to_onnx`` writes a
prefill and a decode file whose cache inputs and outputs are named and dynamic.
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from fxloom.lower import lower, to_onnx  # noqa: E402
from fxloom.lower.decoder import LoweredDecoder, is_causal_lm  # noqa: E402
from fxloom.lower.lowering import LoweringWarning  # noqa: E402
from fxloom.zoo.hf_configs import DECODER, GPT2_LIKE, T5_LIKE, hf  # noqa: E402

BUILDERS = {
    "gpt2": hf("GPT2LMHeadModel", "GPT2Config", **GPT2_LIKE),
    "llama": hf("LlamaForCausalLM", "LlamaConfig", **DECODER),
    "t5": hf("T5ForConditionalGeneration", "T5Config", **T5_LIKE),
}
NEW_TOKENS = 16


def build(name: str) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on the tiny configs' token ids
        torch.manual_seed(0)
        return BUILDERS[name]().eval()


@pytest.fixture(scope="module")
def lowered_models() -> dict[str, tuple[torch.nn.Module, LoweredDecoder]]:
    """Each model with its lowered decoder, made once for the module (lowering takes seconds)."""
    made = {}
    for name in BUILDERS:
        model = build(name)
        made[name] = model, lower(model, {"input_ids": torch.ones(1, 4, dtype=torch.long)})
    return made


def prompt(batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, 100, (batch, length), generator=torch.Generator().manual_seed(1))


def greedy(model: torch.nn.Module, ids: torch.Tensor) -> object:
    with torch.no_grad():
        return model.generate(
            ids,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )


def generate_both(model: torch.nn.Module, lowered: LoweredDecoder, ids: torch.Tensor) -> tuple:
    """Greedy generation eagerly, then with the lowered forward in place of the model's."""
    eager = greedy(model, ids)
    model.forward = lowered.forward
    try:
        return eager, greedy(model, ids)
    finally:
        del model.forward


# ---------------------------------------------------------------- generate
@pytest.mark.parametrize("name", list(BUILDERS))
def test_greedy_generate_with_the_lowered_forward_gives_eagers_tokens(lowered_models, name):
    model, lowered = lowered_models[name]
    calls_before = lowered.eager_calls
    eager, got = generate_both(model, lowered, prompt(2, 7))
    assert torch.equal(got.sequences, eager.sequences)
    for mine, theirs in zip(got.logits, eager.logits):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    assert lowered.eager_calls == calls_before  # every step ran in the lowered graphs


@pytest.mark.parametrize("name", list(BUILDERS))
def test_another_batch_size_and_prompt_length_give_eagers_tokens(lowered_models, name):
    model, lowered = lowered_models[name]
    eager, got = generate_both(model, lowered, prompt(3, 4))
    assert torch.equal(got.sequences, eager.sequences)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_onnx_runtime_runs_at_least_95_percent_of_the_operators(lowered_models, name):
    report = lowered_models[name][1].lowering_report
    total = report.nodes_lowered + report.nodes_in_pytorch
    assert report.nodes_lowered / total >= 0.95, str(report)


def test_the_report_names_the_prefill_and_decode_graphs(lowered_models):
    report = lowered_models["gpt2"][1].lowering_report
    assert {region.name.split(".")[0] for region in report.regions} == {"prefill", "decode"}


def test_a_padded_batch_gives_eagers_logits(lowered_models):
    """The mask is read in the graph, not assumed all ones (traced with plain attention)."""
    model, lowered = lowered_models["llama"]
    ids, mask = prompt(2, 6), torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # left padding
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        got = lowered(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[0, 2:], expected[0, 2:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-4, atol=1e-4)


def test_the_callers_cache_is_filled_in_place_as_eager_does(lowered_models):
    from transformers.cache_utils import DynamicCache

    model, lowered = lowered_models["gpt2"]
    cache = DynamicCache()
    with torch.no_grad():
        output = lowered(input_ids=prompt(1, 5), past_key_values=cache)
    assert output.past_key_values is cache and cache.get_seq_length() == 5


def test_a_call_the_graphs_were_not_made_for_runs_eagerly_and_says_why(lowered_models):
    model, lowered = lowered_models["gpt2"]
    before = lowered.eager_calls
    with pytest.warns(LoweringWarning, match="output_attentions=True"), torch.no_grad():
        output = lowered(input_ids=prompt(1, 3), output_attentions=True)
    assert lowered.eager_calls == before + 1 and output.attentions is not None


# ---------------------------------------------------------------- which models
def test_a_model_told_not_to_cache_is_lowered_as_before():
    model = build("gpt2")
    assert not is_causal_lm(model, {"use_cache": False})
    lowered = lower(model, {"input_ids": prompt(1, 4)}, concrete_args={"use_cache": False})
    assert not isinstance(lowered, LoweredDecoder)


def test_a_model_that_does_not_generate_is_not_a_decoder():
    from transformers import GPT2Config, GPT2Model

    assert not is_causal_lm(GPT2Model(GPT2Config(**GPT2_LIKE)))


# ---------------------------------------------------------------- ONNX files
@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2_onnx")
    to_onnx(build("gpt2"), {"input_ids": prompt(1, 4)}, directory)
    return directory


def session(path):
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_the_decode_file_names_the_cache_inputs_and_outputs_with_dynamic_sizes(gpt2_files):
    decode = session(gpt2_files / "decode.onnx")
    inputs = {value.name: value.shape for value in decode.get_inputs()}
    outputs = {value.name: value.shape for value in decode.get_outputs()}
    assert inputs["input_ids"] == ["batch", "sequence"]
    assert inputs["attention_mask"] == ["batch", "total_sequence"]
    assert inputs["past_key_values.1.value"] == ["batch", 2, "past_sequence", 16]
    assert outputs["logits"] == ["batch", "sequence", 100]
    assert outputs["present.1.value"] == ["batch", 2, "total_sequence", 16]
    assert len(outputs) == 1 + 2 * 2  # logits, a key and a value per layer


def test_the_prefill_file_takes_no_cache_and_returns_one(gpt2_files):
    prefill = session(gpt2_files / "prefill.onnx")
    assert [value.name for value in prefill.get_inputs()] == [
        "input_ids",
        "attention_mask",
        "position_ids",
    ]
    assert "present.0.key" in [value.name for value in prefill.get_outputs()]


def test_the_decode_file_steps_from_the_prefill_files_cache_as_eager_does(gpt2_files):
    model = build("gpt2")
    ids, new = prompt(3, 6), prompt(3, 1)
    with torch.no_grad():
        first = model(input_ids=ids)
        expected = model(input_ids=new, past_key_values=first.past_key_values).logits
    ones = torch.ones(3, 6, dtype=torch.long)
    positions = torch.arange(6).expand(3, -1)
    feed = {"input_ids": ids, "attention_mask": ones, "position_ids": positions}
    prefill = session(gpt2_files / "prefill.onnx")
    names = [value.name for value in prefill.get_outputs()]
    present = dict(zip(names, prefill.run(None, {k: v.numpy() for k, v in feed.items()})))
    feed = {
        "input_ids": new.numpy(),
        "attention_mask": torch.ones(3, 7, dtype=torch.long).numpy(),
        "position_ids": torch.full((3, 1), 6).numpy(),
    }
    feed |= {
        k.replace("present", "past_key_values"): v for k, v in present.items() if k != "logits"
    }
    logits = session(gpt2_files / "decode.onnx").run(["logits"], feed)[0]
    torch.testing.assert_close(torch.from_numpy(logits), expected, rtol=1e-4, atol=1e-4)


def test_an_encoder_decoders_files_carry_both_caches(tmp_path):
    to_onnx(build("t5"), {"input_ids": prompt(1, 4)}, tmp_path)
    decode = session(tmp_path / "decode.onnx")
    inputs = {value.name: value.shape for value in decode.get_inputs()}
    assert inputs["encoder_hidden_states"] == ["batch", "encoder_sequence", 32]
    assert inputs["past_key_values.0.decoder.key"] == ["batch", 2, "past_sequence", 16]
    assert inputs["past_key_values.0.encoder.key"] == ["batch", 2, "encoder_sequence", 16]
    outputs = {value.name: value.shape for value in decode.get_outputs()}
    assert outputs["present.1.decoder.value"] == ["batch", 2, "total_sequence", 16]


def tiny_gpt2() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A MODEL factory for ``fxloom lower``: the tiny GPT-2 and a prompt."""
    return build("gpt2"), {"input_ids": prompt(1, 4)}


# ---------------------------------------------------------------- the command
def test_fxloom_lower_decoder_writes_the_prefill_and_decode_files(tmp_path, capsys):
    from fxloom import cli

    model = "tests.lower.test_decoder:tiny_gpt2"
    assert cli.main(["lower", model, "--decoder", "--past", "8", "-o", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "latency of a decode step (past 8" in out
    assert (tmp_path / "prefill.onnx").exists() and (tmp_path / "decode.onnx").exists()


def test_fxloom_lower_decoder_refuses_a_model_that_is_not_one(capsys):
    from fxloom import cli

    assert cli.main(["lower", "mlp_tiny", "--decoder"]) != 0
    assert "is not one: leave --decoder out" in " ".join(capsys.readouterr().err.split())
