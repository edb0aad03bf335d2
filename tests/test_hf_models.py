"""Hugging Face models traced with ``fxloom.symbolic_trace``: a zoo of real architectures.

Each model is built from a tiny config with random weights (``torch.manual_seed(0)``, no
downloads) and traced with the non-tensor flags fixed by ``concrete_args`` and example inputs
given by name. The traced module must compute what eager PyTorch computes on the example, and
on a second input of another batch size and length; where tracing specialised on the example
(control flow on a size: a causal mask for one token, ViT's image-size check), another input
must raise the guard's error instead of returning wrong numbers.

A case that fxloom cannot handle yet stays in the zoo, marked ``xfail(strict=True)`` with
the reason (the transformers source line and the error), so fixing it shows as an XPASS.
(For comparison, not tested here: ``torch.fx.symbolic_trace`` fails on nearly all of these
models, and ``transformers.utils.fx`` supports only a listed subset.)
"""

from __future__ import annotations

import inspect
import pickle
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

import fxloom
from fxloom.zoo.hf_configs import (
    BART_LIKE,
    BERT_LIKE,
    DECODER,
    GPT2_LIKE,
    IMAGE,
    T5_LIKE,
    VIT_LIKE,
    VOCAB,
    hf,
)

transformers = pytest.importorskip("transformers")
# Funnel indexes with lists of slices, eagerly and so in the traced code too.
pytestmark = pytest.mark.filterwarnings("ignore:Using a non-tuple sequence:UserWarning")

# Non-tensor flags fixed for every model that has them; other parameters not given as
# inputs keep their default (None for optional tensors such as head_mask).
FLAGS = {
    "use_cache": False,
    "output_attentions": False,
    "output_hidden_states": False,
    "return_dict": False,
}
GUARDS_FILE = Path(fxloom.__file__).parent / "guards.py"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Run torch on one thread: these models are tiny, and two threads on a busy two-core
    machine spin against each other (the file takes minutes instead of seconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------ inputs
def token_ids(batch: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), generator=generator)


def text(batch: int, length: int) -> dict[str, torch.Tensor]:
    return {
        "input_ids": token_ids(batch, length, seed=batch * 100 + length),
        "attention_mask": torch.ones(batch, length, dtype=torch.long),
    }


def seq2seq(batch: int, length: int) -> dict[str, torch.Tensor]:
    inputs = text(batch, length)
    # Shorter than the encoder's input (a mix-up of the two lengths shows), and 1 for 1.
    decoder_length = (length + 1) // 2
    inputs["decoder_input_ids"] = token_ids(batch, decoder_length, seed=batch * 100 + length + 1)
    return inputs


def image(batch: int, size: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + size)
    return {"pixel_values": torch.randn(batch, 3, size, size, generator=generator)}


def audio(batch: int, length: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + length)
    return {"input_values": torch.randn(batch, 100 + 10 * length, generator=generator)}


def padded(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``inputs`` with the last two positions of the first row masked out (right padding)."""
    mask = inputs["attention_mask"].clone()
    mask[0, -2:] = 0
    return {**inputs, "attention_mask": mask}


# ------------------------------------------------------------------ the zoo
@dataclass(frozen=True)
class Case:
    """One model: how to build it, its inputs by (batch, size), and what tracing may fix.

    ``size`` is a sequence length for text and audio, an image side for images.
    ``violating`` is an input size that takes another branch than the example did (the
    traced module must raise the guard's error), or ``None`` if the model specialises on
    nothing. ``trace_fails`` says why fxloom cannot trace the model yet (every test expects
    a ``TraceError``); ``xfail`` maps a test name to why that one test fails.
    """

    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int, int], dict[str, torch.Tensor]]
    example: tuple[int, int] = (2, 7)
    other: tuple[int, int] = (3, 5)
    violating: tuple[int, int] | None = None
    trace_fails: str | None = None
    xfail: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return self.name


# The test's encoder-decoders are one layer deep: enough to cover cross-attention, faster.
BART_LIKE = dict(BART_LIKE, encoder_layers=1, decoder_layers=1)
# A causal mask for a single token skips torch.triu ("if sequence_length != 1"), and SDPA's
# is_causal reads q_len > 1: tracing with 7 tokens fixes both, so one token must be refused.
ONE_TOKEN = (2, 1)
FUNNEL_LEN = (
    "LIMITATION: `num_remove = shift * len(pooled_pos)` at modeling_funnel.py:300 calls len() "
    "on a traced tensor; len must return an int, so the trace is fixed to the example's "
    "sequence length by a guard, although eager runs any length"
)


ZOO = [
    # encoders
    Case("bert", hf("BertModel", "BertConfig", **BERT_LIKE), text),
    Case(
        "bert_classifier",
        hf("BertForSequenceClassification", "BertConfig", **BERT_LIKE, num_labels=3),
        text,
    ),
    Case("roberta", hf("RobertaModel", "RobertaConfig", **BERT_LIKE), text),
    Case(
        "distilbert",
        hf(
            "DistilBertModel",
            "DistilBertConfig",
            vocab_size=VOCAB,
            dim=32,
            n_layers=2,
            n_heads=2,
            hidden_dim=37,
            max_position_embeddings=64,
        ),
        text,
    ),
    Case("albert", hf("AlbertModel", "AlbertConfig", **BERT_LIKE, embedding_size=16), text),
    Case("electra", hf("ElectraModel", "ElectraConfig", **BERT_LIKE, embedding_size=16), text),
    Case(
        "mobilebert",
        hf(
            "MobileBertModel",
            "MobileBertConfig",
            **BERT_LIKE,
            embedding_size=16,
            intra_bottleneck_size=16,
            true_hidden_size=16,
        ),
        text,
    ),
    Case(
        "xlnet",
        hf("XLNetModel", "XLNetConfig", vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2),
        text,
    ),
    Case(
        "funnel",
        hf(
            "FunnelBaseModel",
            "FunnelConfig",
            vocab_size=VOCAB,
            block_sizes=[1, 1],
            d_model=32,
            n_head=2,
            d_head=16,
            d_inner=37,
        ),
        text,
        violating=(2, 9),
        xfail=dict.fromkeys(("generalises", "padded"), FUNNEL_LEN),
    ),
    Case(
        "deberta_v2",
        hf("DebertaV2Model", "DebertaV2Config", **BERT_LIKE),
        text,
    ),
    # decoders
    Case("gpt2", hf("GPT2Model", "GPT2Config", **GPT2_LIKE), text, violating=ONE_TOKEN),
    Case("gpt2_lm", hf("GPT2LMHeadModel", "GPT2Config", **GPT2_LIKE), text, violating=ONE_TOKEN),
    Case(
        "gpt_neo",
        hf(
            "GPTNeoModel",
            "GPTNeoConfig",
            vocab_size=VOCAB,
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            attention_types=[[["global", "local"], 1]],
            window_size=4,  # shorter than the inputs: the local layer masks
            max_position_embeddings=64,
        ),
        text,
    ),
    Case(
        "opt",
        hf(
            "OPTModel",
            "OPTConfig",
            **{k: v for k, v in BERT_LIKE.items() if k != "intermediate_size"},
            ffn_dim=37,
            word_embed_proj_dim=32,
        ),
        text,
        violating=ONE_TOKEN,
    ),
    Case("llama", hf("LlamaModel", "LlamaConfig", **DECODER), text, violating=ONE_TOKEN),
    Case("llama_lm", hf("LlamaForCausalLM", "LlamaConfig", **DECODER), text, violating=ONE_TOKEN),
    Case(
        "mistral_sliding_window",
        hf("MistralModel", "MistralConfig", **DECODER, sliding_window=4),
        text,
        violating=ONE_TOKEN,
    ),
    Case("qwen2", hf("Qwen2Model", "Qwen2Config", **DECODER), text, violating=ONE_TOKEN),
    Case("phi", hf("PhiModel", "PhiConfig", **DECODER), text, violating=ONE_TOKEN),
    Case(
        "gemma", hf("GemmaModel", "GemmaConfig", **DECODER, head_dim=16), text, violating=ONE_TOKEN
    ),
    Case(
        "ctrl",
        hf("CTRLModel", "CTRLConfig", **GPT2_LIKE, dff=37),
        text,
    ),
    Case(
        "falcon",
        hf(
            "FalconModel",
            "FalconConfig",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
        ),
        text,
    ),
    Case(
        "bloom",
        hf("BloomModel", "BloomConfig", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=2),
        text,
    ),
    Case(
        "mixtral",
        hf(
            "MixtralModel",
            "MixtralConfig",
            **dict(DECODER, intermediate_size=40),  # grouped_mm wants 16-byte strides
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        text,
        # SDPA packs grouped-query heads when q_length == 1 (sdpa_attention.py): the trace
        # takes the other branch, so one token is refused. The experts run as one grouped
        # matmul, so any number of tokens reaches them.
        violating=ONE_TOKEN,
    ),
    Case(
        "codegen",
        hf(
            "CodeGenModel",
            "CodeGenConfig",
            **GPT2_LIKE | {"n_head": 4},
            rotary_dim=4,
        ),
        text,
    ),
    # encoder-decoders
    Case("t5", hf("T5Model", "T5Config", **T5_LIKE), seq2seq, violating=ONE_TOKEN),
    Case("bart", hf("BartModel", "BartConfig", **BART_LIKE), seq2seq, violating=ONE_TOKEN),
    Case(
        "marian",
        hf(
            "MarianModel",
            "MarianConfig",
            **BART_LIKE,
            pad_token_id=0,
            decoder_start_token_id=0,
        ),
        seq2seq,
        violating=ONE_TOKEN,
    ),
    # vision
    Case(
        "vit",
        hf("ViTModel", "ViTConfig", **VIT_LIKE),
        image,
        example=(2, IMAGE),
        other=(3, IMAGE),
        violating=(2, 48),  # ViT checks the image size against config.image_size
    ),
    Case(
        "vit_classifier",
        hf("ViTForImageClassification", "ViTConfig", **VIT_LIKE, num_labels=5),
        image,
        example=(2, IMAGE),
        other=(3, IMAGE),
        violating=(2, 48),
    ),
    Case(
        "deit",
        hf("DeiTModel", "DeiTConfig", **VIT_LIKE),
        image,
        example=(2, IMAGE),
        other=(3, IMAGE),
    ),
    Case(
        "dinov2",
        hf("Dinov2Model", "Dinov2Config", **VIT_LIKE, mlp_ratio=2),
        image,
        example=(2, IMAGE),
        other=(3, IMAGE),
        # Position embeddings are used as they are at the configured size, else interpolated
        # (modeling_dinov2.py:70): the example's branch does not apply to 48x48.
        violating=(2, 48),
    ),
    Case(
        "swin",
        hf(
            "SwinModel",
            "SwinConfig",
            image_size=IMAGE,
            patch_size=4,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 2],
            window_size=4,
        ),
        image,
        example=(2, IMAGE),
        other=(3, IMAGE),
        # The window shrinks to the feature map when it is smaller (modeling_swin.py:632).
        violating=(2, 48),
    ),
    Case(
        "convnext",
        hf("ConvNextModel", "ConvNextConfig", hidden_sizes=[8, 16], depths=[1, 1], num_stages=2),
        image,
        example=(2, IMAGE),
        other=(3, 48),
    ),
    Case(
        "resnet",
        hf(
            "ResNetModel",
            "ResNetConfig",
            embedding_size=8,
            hidden_sizes=[8, 16],
            depths=[1, 1],
            layer_type="basic",
        ),
        image,
        example=(2, IMAGE),
        other=(3, 48),
    ),
    Case(
        "resnet_classifier",
        hf(
            "ResNetForImageClassification",
            "ResNetConfig",
            embedding_size=8,
            hidden_sizes=[8, 16],
            depths=[1, 1],
            layer_type="bottleneck",
            num_labels=5,
        ),
        image,
        example=(2, IMAGE),
        other=(3, 48),
    ),
    Case(
        "segformer",
        hf(
            "SegformerModel",
            "SegformerConfig",
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[8, 16],
            patch_sizes=[7, 3],
            strides=[4, 2],
            num_attention_heads=[1, 2],
            mlp_ratios=[2, 2],
        ),
        image,
        example=(2, IMAGE),
        other=(3, 48),
    ),
    Case(
        "levit",
        hf(
            "LevitModel",
            "LevitConfig",
            image_size=IMAGE,
            hidden_sizes=[16, 24, 32],
            num_attention_heads=[1, 2, 2],
            depths=[1, 1, 1],
            key_dim=[8, 8, 8],
        ),
        image,
        example=(2, IMAGE),
        other=(3, IMAGE),
    ),
    # audio
    Case(
        "wav2vec2",
        hf(
            "Wav2Vec2Model",
            "Wav2Vec2Config",
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            conv_dim=(16, 16),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=2,
            do_stable_layer_norm=True,
        ),
        audio,
    ),
]
CASES = {case.name: case for case in ZOO}


def cases(
    test: str, where: Callable[[Case], bool] = lambda case: True, among: list[Case] = ZOO
) -> list[Any]:
    """The cases as pytest params for ``test``, with those known to fail there marked."""
    params = []
    for case in among:
        if not where(case):
            continue
        marks = []
        if case.trace_fails:
            marks.append(
                pytest.mark.xfail(raises=fxloom.TraceError, strict=True, reason=case.trace_fails)
            )
        elif test in case.xfail:
            marks.append(pytest.mark.xfail(strict=True, reason=case.xfail[test]))
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


# ------------------------------------------------------------------ helpers
def build(case: Case) -> torch.nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return case.build().eval()


def concrete_args_for(model: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """Fix every parameter of ``model.forward`` that is not an input: flags to ``FLAGS``,
    the rest (optional tensors, ``interpolate_pos_encoding``...) to their defaults."""
    fixed = {}
    for name, parameter in inspect.signature(model.forward).parameters.items():
        if name in inputs or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.default is parameter.empty:
            raise TypeError(f"{type(model).__name__}.forward needs {name!r}; give it an input")
        fixed[name] = FLAGS.get(name, parameter.default)
    return fixed


def trace(
    case: Case, model: torch.nn.Module | None = None, example: dict[str, Any] | None = None
) -> fxloom.GraphModule:
    """``case``'s model (a fresh one unless given) traced on its example inputs."""
    model = build(case) if model is None else model
    example = case.inputs(*case.example) if example is None else example
    return fxloom.symbolic_trace(model, concrete_args_for(model, example), example_inputs=example)


def eager(case: Case, inputs: dict[str, Any], model: torch.nn.Module | None = None) -> list:
    """The tensors ``case``'s model (a fresh one unless given: never the traced one) returns."""
    model = build(case) if model is None else model
    with torch.no_grad():
        return tensors(model(**inputs, **concrete_args_for(model, inputs)))


def run(module: torch.nn.Module, inputs: dict[str, Any]) -> list[torch.Tensor]:
    with torch.no_grad():
        return tensors(module(**inputs))


def tensors(output: Any) -> list[torch.Tensor]:
    """Every tensor in a model output (tuples, lists, ``ModelOutput``), in order."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, transformers.utils.ModelOutput):
        output = output.to_tuple()
    if isinstance(output, (tuple, list)):
        return [tensor for item in output for tensor in tensors(item)]
    assert output is None, f"unexpected output {type(output).__name__}"
    return []


def assert_same_outputs(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert expected, "the model returned no tensor"
    assert len(actual) == len(expected), "the traced module returns another number of tensors"
    for traced_tensor, eager_tensor in zip(actual, expected):
        assert_close(traced_tensor, eager_tensor)


def assert_raises_guard_error(call: Callable[[], Any]) -> None:
    """``call`` must fail in one of fxloom's run-time guards, not somewhere in the model."""
    with pytest.raises((RuntimeError, TypeError, ValueError)) as info:
        call()
    assert Path(info.traceback[-1].path) == GUARDS_FILE, info.getrepr(style="short")
    assert "traced" in str(info.value)


# ------------------------------------------------------------------ every model
@pytest.mark.parametrize("case", cases("matches_eager"))
def test_traced_model_matches_eager_on_the_example(case: Case) -> None:
    example = case.inputs(*case.example)
    assert_same_outputs(run(trace(case), example), eager(case, example))


@pytest.mark.parametrize("case", cases("generalises"))
def test_traced_model_matches_eager_on_another_batch_size_and_length(case: Case) -> None:
    other = case.inputs(*case.other)
    assert_same_outputs(run(trace(case), other), eager(case, other))


@pytest.mark.parametrize("case", cases("padded", lambda case: case.inputs in (text, seq2seq)))
def test_traced_model_matches_eager_with_a_padded_attention_mask(case: Case) -> None:
    other = padded(case.inputs(*case.other))
    assert_same_outputs(run(trace(case), other), eager(case, other))


@pytest.mark.parametrize("case", cases("padded", lambda case: case.inputs in (text, seq2seq)))
def test_traced_model_matches_eager_without_padding_when_traced_on_a_padded_mask(
    case: Case,
) -> None:
    traced = trace(case, example=padded(case.inputs(*case.example)))
    other = case.inputs(*case.other)
    assert_same_outputs(run(traced, other), eager(case, other))


@pytest.mark.parametrize("case", cases("guards", lambda case: case.violating is not None))
def test_traced_model_refuses_an_input_that_takes_another_branch(case: Case) -> None:
    traced = trace(case)
    assert_raises_guard_error(lambda: run(traced, case.inputs(*case.violating)))


@pytest.mark.parametrize("case", cases("one_token", lambda case: case.inputs in (text, seq2seq)))
def test_traced_model_is_right_or_refuses_on_a_single_token(case: Case) -> None:
    # One token is where text models branch most (causal masks, SDPA's is_causal, packing
    # of grouped-query heads): the traced module either computes what eager computes or
    # fails in a guard, never returns other numbers.
    traced, one = trace(case), case.inputs(*ONE_TOKEN)
    try:
        actual = run(traced, one)
    except (RuntimeError, TypeError, ValueError):
        assert_raises_guard_error(lambda: run(traced, one))
    else:
        assert_same_outputs(actual, eager(case, one))


@pytest.mark.parametrize("case", cases("lints"))
def test_traced_graph_lints(case: Case) -> None:
    traced = trace(case)
    traced.graph.lint(traced)


@pytest.mark.parametrize("case", cases("leaves_the_eager_model_unchanged"))
def test_tracing_leaves_the_eager_model_unchanged(case: Case) -> None:
    model = build(case)
    traced = trace(case, model)
    example = case.inputs(*case.example)
    assert_same_outputs(eager(case, example, model), eager(case, example))
    assert_same_outputs(run(traced, example), eager(case, example))  # still the same graph


PICKLED = {"bert", "gpt2_lm", "llama", "t5", "vit_classifier", "swin"}


@pytest.mark.parametrize("case", cases("pickles", lambda case: case.name in PICKLED))
def test_traced_model_survives_a_pickle_round_trip(case: Case) -> None:
    traced = trace(case)
    loaded = pickle.loads(pickle.dumps(traced))
    assert loaded.code == traced.code
    other = case.inputs(*case.other)
    assert_same_outputs(run(loaded, other), eager(case, other))


# ------------------------------------------------------------------ heads with a loss
def labelled(inputs: Callable[[int, int], dict], classes: int | None = None) -> Callable:
    """``inputs`` plus ``labels``: one class per row, or else a target token per position."""

    def make(batch: int, length: int) -> dict[str, torch.Tensor]:
        made = inputs(batch, length)
        generator = torch.Generator().manual_seed(batch * 100 + length + 7)
        if classes is not None:
            shape, high = (batch,), classes
        else:
            shape, high = made.get("decoder_input_ids", made["input_ids"]).shape, VOCAB
        return {**made, "labels": torch.randint(0, high, shape, generator=generator)}

    return make


LOSS_HEADS = [
    Case("gpt2_lm", CASES["gpt2_lm"].build, labelled(text)),
    Case("llama_lm", CASES["llama_lm"].build, labelled(text)),
    Case(
        "t5_generator",
        hf("T5ForConditionalGeneration", "T5Config", **T5_LIKE),
        labelled(seq2seq),
    ),
    Case(
        "bart_generator",
        hf("BartForConditionalGeneration", "BartConfig", **BART_LIKE),
        labelled(seq2seq),
    ),
    Case(
        "bert_classifier",
        CASES["bert_classifier"].build,
        labelled(text, classes=3),
    ),
]


@pytest.mark.parametrize("case", cases("loss", among=LOSS_HEADS))
def test_head_model_traces_its_loss_from_labels(case: Case) -> None:
    other = case.inputs(*case.other)
    outputs = run(trace(case), other)
    assert outputs[0].dim() == 0  # the loss comes first
    assert_same_outputs(outputs, eager(case, other))
