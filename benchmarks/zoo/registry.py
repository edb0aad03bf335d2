"""The models of the zoo: Hugging Face architectures from tiny configs, and ``fxloom.zoo``.

One ``ModelSpec`` row per model holds everything both of its users need: the zoo benchmark
(``worker.py`` measures ``build()``: the model in eval mode and its inputs at the example
size) and ``tests/test_hf_models.py`` (every Hugging Face row is a test case: it traces on the
example, compares with eager on ``other``, expects a guard to refuse ``violating``, and
marks the tests named in ``xfail`` as known failures).

Every model is built locally with random weights (``torch.manual_seed(0)``, no downloads):
2 layers, hidden sizes around 32, inputs of a few tokens or a 32x32 image. Inputs are a
function of ``(batch, size)`` and depend only on fixed seeds. To add a model, add a row to
``HF_SPECS``.

Depends on: torch, transformers (pinned in constraints.txt; imported when a model is built),
fxloom.zoo.
"""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

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

FAMILIES = (
    "text-encoder",
    "text-decoder",
    "text-encoder-decoder",
    "vision-cnn",
    "vision-transformer",
    "speech",
    "multimodal",
    "fxloom-zoo",
)
BATCH = 2
LENGTH = 7

Inputs = dict[str, torch.Tensor]
Size = tuple[int, int]  # (batch, size)


@dataclass(frozen=True)
class ModelSpec:
    """One model: its name and family, how to build it and its inputs, and what tracing fixes.

    ``make_inputs(batch, size)`` gives the forward's tensor inputs by parameter name; ``size``
    is a sequence length for text, a number of samples for audio, an image side for images.
    ``example`` is the size the benchmark measures and the tests trace with; ``other`` one
    where the traced module must still compute what eager computes. ``violating`` is a size
    that takes another branch than the example did (control flow on a shape), so the traced
    module must refuse it in a guard; ``None`` if the model specialises on nothing that
    varies. ``trace_fails`` says why fxloom cannot trace the model yet (every test expects a
    ``TraceError``); ``xfail`` maps a test of ``tests/test_hf_models.py`` (its key, such as
    ``"generalises"``) to why that one test fails.

        >>> model, inputs = get("bert").build()
        >>> sorted(inputs), tuple(inputs["input_ids"].shape)
        (['attention_mask', 'input_ids'], (2, 7))
    """

    name: str
    family: str
    make_model: Callable[[], nn.Module]
    make_inputs: Callable[[int, int], Inputs]
    example: Size = (BATCH, LENGTH)
    other: Size = (3, 5)
    violating: Size | None = None
    trace_fails: str | None = None
    xfail: dict[str, str] = field(default_factory=dict)
    source: str = "transformers"  # or "fxloom.zoo"

    def build_model(self) -> nn.Module:
        """The model in eval mode, with the same weights on every call."""
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.make_model().eval()

    def build(self) -> tuple[nn.Module, Inputs]:
        """``(model.eval(), inputs at the example size)``, the same on every call."""
        return self.build_model(), self.make_inputs(*self.example)

    def __repr__(self) -> str:  # how pytest shows a test's case
        return self.name


# ------------------------------------------------------------------ inputs
# Each input's seed depends on its (batch, size), so inputs of two sizes differ in values too.
def token_ids(batch: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), generator=generator)


def noise(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def text(batch: int, length: int) -> Inputs:
    return {
        "input_ids": token_ids(batch, length, seed=batch * 100 + length),
        "attention_mask": torch.ones(batch, length, dtype=torch.long),
    }


def decoder_tokens(batch: int, length: int) -> torch.Tensor:
    """Half as many decoder tokens as encoder ones (a mix-up of the two lengths shows), and 1
    for 1."""
    return token_ids(batch, (length + 1) // 2, seed=batch * 100 + length + 1)


def seq2seq(batch: int, length: int) -> Inputs:
    return {**text(batch, length), "decoder_input_ids": decoder_tokens(batch, length)}


def image(batch: int, side: int) -> Inputs:
    return {"pixel_values": noise(batch, 3, side, side, seed=batch * 100 + side + 2)}


def audio(batch: int, samples: int) -> Inputs:
    return {"input_values": noise(batch, samples, seed=batch * 100 + samples + 3)}


WHISPER_MEL_BINS = 16
WHISPER_FRAMES = 32  # Whisper's encoder refuses any other number: 2 x max_source_positions


def mel_features(batch: int, length: int) -> Inputs:
    """Whisper: a fixed-length mel spectrogram, and decoder tokens as for ``seq2seq``."""
    return {
        "input_features": noise(batch, WHISPER_MEL_BINS, WHISPER_FRAMES, seed=batch * 100 + 4),
        "decoder_input_ids": decoder_tokens(batch, length),
    }


def text_and_image(batch: int, length: int) -> Inputs:
    """CLIP and SigLIP: ``length`` tokens, and an image of the configured size (the only one
    their vision towers take)."""
    return {**text(batch, length), **image(batch, IMAGE)}


# Sizes for inputs other than text (whose default is (BATCH, LENGTH), then (3, 5)).
# Vision transformers are built for config.image_size: most check it, or size tables by it.
FIXED_IMAGE_SIZE = dict(example=(BATCH, IMAGE), other=(3, IMAGE))
ANY_IMAGE_SIZE = dict(example=(BATCH, IMAGE), other=(3, 48))
# The feature extractor's convolutions (kernels 10 and 3, strides 5 and 2) turn 400 samples
# into 39 frames, 300 into 29.
AUDIO_SAMPLES = dict(example=(BATCH, 400), other=(3, 300))
# A causal mask for a single token skips torch.triu ("if sequence_length != 1"), and SDPA's
# is_causal reads q_len > 1: tracing with 7 tokens fixes both, so one token must be refused.
ONE_TOKEN = (BATCH, 1)


# ------------------------------------------------------------------ configs
WAV2VEC2_LIKE = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=37,
    conv_dim=(16, 16),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embeddings=8,
    num_conv_pos_embedding_groups=2,
)
CLIP_TEXT = dict(BERT_LIKE, eos_token_id=2)
CLIP_VISION = dict(VIT_LIKE, num_channels=3)
SEGFORMER_LIKE = dict(
    num_encoder_blocks=2,
    depths=[1, 1],
    sr_ratios=[2, 1],
    hidden_sizes=[8, 16],
    patch_sizes=[7, 3],
    strides=[4, 2],
    num_attention_heads=[1, 2],
    mlp_ratios=[2, 2],
)
RESNET_LIKE = dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])


def funnel_fixes_the_length() -> bool:
    """Whether this transformers' Funnel calls ``len()`` on a traced position tensor.

    Releases differ: 5.0 and 5.23 on write ``len(pooled_pos)`` (the trace is fixed to the
    example's length by a guard); 5.17 keeps positions as tensors, so the trace runs any length
    and a guard fires only on the batch size. The source is read, not imported, to keep
    collecting the tests cheap.
    """
    found = importlib.util.find_spec("transformers")
    if found is None or not found.submodule_search_locations:
        return True
    source = Path(found.submodule_search_locations[0]) / "models/funnel/modeling_funnel.py"
    return not source.exists() or "len(pooled_pos)" in source.read_text()


FUNNEL_LEN = (
    "LIMITATION: `num_remove = shift * len(pooled_pos)` at modeling_funnel.py:300 calls len() "
    "on a traced tensor; len must return an int, so the trace is fixed to the example's "
    "sequence length by a guard, although eager runs any length. What to do: trace at the "
    "length you will run, or keep FunnelEncoder a leaf (Tracer.is_leaf_module) so it runs eagerly"
)
MOBILENET_INT = (
    "LIMITATION: `in_height = int(features.shape[-2])` at modeling_mobilenet_v2.py:56 "
    "(TensorFlow's SAME padding) calls int() on a traced size; int must return an int, so the "
    "trace is fixed to the example's image size by a guard, although eager runs any size. What "
    "to do: trace at the image size you will run, or keep MobileNetV2ConvLayer a leaf"
)
BEIT_INT = (
    "LIMITATION: `torch_int(new_height)` at modeling_beit.py:239 (the relative position bias "
    "resized to the image's patch grid) calls int() on a traced size; int must return an int, "
    "so the trace is fixed to the example's image size by a guard, although eager runs any size. "
    "What to do: trace at the image size you will run, or keep BeitSelfAttention a leaf"
)

# ------------------------------------------------------------------ the zoo
ENC, DEC, SEQ = "text-encoder", "text-decoder", "text-encoder-decoder"
CNN, VIT, SPEECH, MULTI = "vision-cnn", "vision-transformer", "speech", "multimodal"

HF_SPECS = [
    # text encoders
    ModelSpec("bert", ENC, hf("BertModel", "BertConfig", **BERT_LIKE), text),
    ModelSpec(
        "bert_classifier",
        ENC,
        hf("BertForSequenceClassification", "BertConfig", **BERT_LIKE, num_labels=3),
        text,
    ),
    ModelSpec("roberta", ENC, hf("RobertaModel", "RobertaConfig", **BERT_LIKE), text),
    ModelSpec("xlm_roberta", ENC, hf("XLMRobertaModel", "XLMRobertaConfig", **BERT_LIKE), text),
    ModelSpec(
        "distilbert",
        ENC,
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
    ModelSpec(
        "albert", ENC, hf("AlbertModel", "AlbertConfig", **BERT_LIKE, embedding_size=16), text
    ),
    ModelSpec(
        "electra", ENC, hf("ElectraModel", "ElectraConfig", **BERT_LIKE, embedding_size=16), text
    ),
    ModelSpec(
        "mobilebert",
        ENC,
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
    ModelSpec("mpnet", ENC, hf("MPNetModel", "MPNetConfig", **BERT_LIKE), text),
    ModelSpec(
        "xlnet",
        ENC,
        hf("XLNetModel", "XLNetConfig", vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2),
        text,
    ),
    ModelSpec(
        "xlnet_lm",  # forward(**kwargs) handed on to XLNetModel
        ENC,
        hf("XLNetLMHeadModel", "XLNetConfig", vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2),
        text,
    ),
    ModelSpec(
        "funnel",
        ENC,
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
        violating=(BATCH, 9) if funnel_fixes_the_length() else None,
        xfail=dict.fromkeys(("generalises", "padded"), FUNNEL_LEN),
    ),
    ModelSpec("deberta_v2", ENC, hf("DebertaV2Model", "DebertaV2Config", **BERT_LIKE), text),
    # text decoders
    ModelSpec("gpt2", DEC, hf("GPT2Model", "GPT2Config", **GPT2_LIKE), text, violating=ONE_TOKEN),
    ModelSpec(
        "gpt2_lm",
        DEC,
        hf("GPT2LMHeadModel", "GPT2Config", **GPT2_LIKE),
        text,
        violating=ONE_TOKEN,
    ),
    ModelSpec(
        "gpt_neo",
        DEC,
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
    ModelSpec(
        "opt",
        DEC,
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
    ModelSpec("llama", DEC, hf("LlamaModel", "LlamaConfig", **DECODER), text, violating=ONE_TOKEN),
    ModelSpec(
        "llama_lm",
        DEC,
        hf("LlamaForCausalLM", "LlamaConfig", **DECODER),
        text,
        violating=ONE_TOKEN,
    ),
    # The default window (4096 tokens) is longer than the inputs: plain causal attention.
    ModelSpec(
        "mistral", DEC, hf("MistralModel", "MistralConfig", **DECODER), text, violating=ONE_TOKEN
    ),
    ModelSpec(
        "mistral_sliding_window",
        DEC,
        hf("MistralModel", "MistralConfig", **DECODER, sliding_window=4),  # shorter: it masks
        text,
        violating=ONE_TOKEN,
    ),
    ModelSpec("qwen2", DEC, hf("Qwen2Model", "Qwen2Config", **DECODER), text, violating=ONE_TOKEN),
    ModelSpec("phi", DEC, hf("PhiModel", "PhiConfig", **DECODER), text, violating=ONE_TOKEN),
    ModelSpec(
        "gemma",
        DEC,
        hf("GemmaModel", "GemmaConfig", **DECODER, head_dim=16),
        text,
        violating=ONE_TOKEN,
    ),
    ModelSpec("ctrl", DEC, hf("CTRLModel", "CTRLConfig", **GPT2_LIKE, dff=37), text),
    ModelSpec(
        "falcon",
        DEC,
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
    ModelSpec(
        "bloom",
        DEC,
        hf("BloomModel", "BloomConfig", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=2),
        text,
    ),
    ModelSpec(
        "mixtral",
        DEC,
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
    ModelSpec(
        "codegen",
        DEC,
        hf("CodeGenModel", "CodeGenConfig", **GPT2_LIKE | {"n_head": 4}, rotary_dim=4),
        text,
    ),
    # text encoder-decoders
    ModelSpec("t5", SEQ, hf("T5Model", "T5Config", **T5_LIKE), seq2seq, violating=ONE_TOKEN),
    ModelSpec(
        "t5_generator",
        SEQ,
        hf("T5ForConditionalGeneration", "T5Config", **T5_LIKE),
        seq2seq,
        violating=ONE_TOKEN,
    ),
    ModelSpec(
        "bart", SEQ, hf("BartModel", "BartConfig", **BART_LIKE), seq2seq, violating=ONE_TOKEN
    ),
    ModelSpec(
        "marian",
        SEQ,
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
    ModelSpec(
        "mbart", SEQ, hf("MBartModel", "MBartConfig", **BART_LIKE), seq2seq, violating=ONE_TOKEN
    ),
    ModelSpec(
        "pegasus",
        SEQ,
        hf("PegasusModel", "PegasusConfig", **BART_LIKE),
        seq2seq,
        violating=ONE_TOKEN,
    ),
    # vision CNNs
    ModelSpec(
        "convnext",
        CNN,
        hf("ConvNextModel", "ConvNextConfig", hidden_sizes=[8, 16], depths=[1, 1], num_stages=2),
        image,
        **ANY_IMAGE_SIZE,
    ),
    ModelSpec(
        "resnet",
        CNN,
        hf("ResNetModel", "ResNetConfig", **RESNET_LIKE, layer_type="basic"),
        image,
        **ANY_IMAGE_SIZE,
    ),
    ModelSpec(
        "resnet_classifier",
        CNN,
        hf(
            "ResNetForImageClassification",
            "ResNetConfig",
            **RESNET_LIKE,
            layer_type="bottleneck",
            num_labels=5,
        ),
        image,
        **ANY_IMAGE_SIZE,
    ),
    ModelSpec(
        "regnet",
        CNN,
        hf("RegNetModel", "RegNetConfig", **RESNET_LIKE, groups_width=8),
        image,
        **ANY_IMAGE_SIZE,
    ),
    ModelSpec(
        "mobilenet_v2",
        CNN,
        hf("MobileNetV2Model", "MobileNetV2Config", image_size=IMAGE, depth_multiplier=0.25),
        image,
        **ANY_IMAGE_SIZE,
        violating=(BATCH, 48),
        xfail={"generalises": MOBILENET_INT},
    ),
    # vision transformers
    ModelSpec(
        "vit",
        VIT,
        hf("ViTModel", "ViTConfig", **VIT_LIKE),
        image,
        **FIXED_IMAGE_SIZE,
        violating=(BATCH, 48),  # ViT checks the image size against config.image_size
    ),
    ModelSpec(
        "vit_classifier",
        VIT,
        hf("ViTForImageClassification", "ViTConfig", **VIT_LIKE, num_labels=5),
        image,
        **FIXED_IMAGE_SIZE,
        violating=(BATCH, 48),
    ),
    ModelSpec(
        "deit",
        VIT,
        hf("DeiTModel", "DeiTConfig", **VIT_LIKE),
        image,
        **FIXED_IMAGE_SIZE,
        violating=(BATCH, 48),  # as ViT
    ),
    ModelSpec(
        "beit",
        VIT,
        hf("BeitModel", "BeitConfig", **VIT_LIKE, use_relative_position_bias=True),
        image,
        **ANY_IMAGE_SIZE,
        violating=(BATCH, 48),
        xfail={"generalises": BEIT_INT},
    ),
    ModelSpec(
        "dinov2",
        VIT,
        hf("Dinov2Model", "Dinov2Config", **VIT_LIKE, mlp_ratio=2),
        image,
        **FIXED_IMAGE_SIZE,
        # Position embeddings are used as they are at the configured size, else interpolated
        # (modeling_dinov2.py:70): the example's branch does not apply to 48x48.
        violating=(BATCH, 48),
    ),
    ModelSpec(
        "swin",
        VIT,
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
        **FIXED_IMAGE_SIZE,
        # The window shrinks to the feature map when it is smaller (modeling_swin.py:632).
        violating=(BATCH, 48),
    ),
    ModelSpec(
        "segformer",
        VIT,
        hf("SegformerModel", "SegformerConfig", **SEGFORMER_LIKE),
        image,
        **ANY_IMAGE_SIZE,
    ),
    # Dense prediction heads: each resizes feature maps to a size computed from another one
    # (F.interpolate(x, size=y.shape[2:]), or by a scale factor), which dynamic export must
    # keep symbolic.
    ModelSpec(
        "segformer_segmentation",
        VIT,
        hf(
            "SegformerForSemanticSegmentation",
            "SegformerConfig",
            **SEGFORMER_LIKE,
            decoder_hidden_size=16,
            num_labels=3,
        ),
        image,
        **ANY_IMAGE_SIZE,
    ),
    ModelSpec(
        "glpn_depth",
        VIT,
        hf("GLPNForDepthEstimation", "GLPNConfig", **SEGFORMER_LIKE, decoder_hidden_size=16),
        image,
        **ANY_IMAGE_SIZE,
    ),
    ModelSpec(
        "dpt_depth",
        VIT,
        hf(
            "DPTForDepthEstimation",
            "DPTConfig",
            **VIT_LIKE,
            backbone_out_indices=[0, 1],
            neck_hidden_sizes=[8, 16],
            fusion_hidden_size=16,
            reassemble_factors=[2, 1],
            head_hidden_size=8,
        ),
        image,
        **FIXED_IMAGE_SIZE,
    ),
    ModelSpec(
        "mobilevit_segmentation",
        CNN,
        hf(
            "MobileViTForSemanticSegmentation",
            "MobileViTConfig",
            image_size=IMAGE,
            hidden_sizes=[16, 24, 32],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 48],
            aspp_out_channels=16,
            num_labels=3,
        ),
        image,
        # Patches are unfolded by int() of the feature map's size (modeling_mobilevit.py:397):
        # the trace holds for the example's image size, checked by a guard.
        **FIXED_IMAGE_SIZE,
        violating=(BATCH, 48),
    ),
    ModelSpec(
        "upernet_convnext",
        CNN,
        hf(
            "UperNetForSemanticSegmentation",
            "UperNetConfig",
            backbone_config=dict(
                model_type="convnext",
                hidden_sizes=[8, 16, 24, 32],
                depths=[1, 1, 1, 1],
                out_features=["stage1", "stage2", "stage3", "stage4"],
            ),
            hidden_size=16,
            auxiliary_in_channels=24,
            auxiliary_channels=8,
            num_labels=3,
        ),
        image,
        **ANY_IMAGE_SIZE,
    ),
    ModelSpec(
        "levit",
        VIT,
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
        **FIXED_IMAGE_SIZE,
    ),
    # speech
    ModelSpec(
        "wav2vec2",
        SPEECH,
        hf("Wav2Vec2Model", "Wav2Vec2Config", **WAV2VEC2_LIKE, do_stable_layer_norm=True),
        audio,
        **AUDIO_SAMPLES,
    ),
    ModelSpec(
        "hubert", SPEECH, hf("HubertModel", "HubertConfig", **WAV2VEC2_LIKE), audio, **AUDIO_SAMPLES
    ),
    ModelSpec(
        "whisper",
        SPEECH,
        hf(
            "WhisperModel",
            "WhisperConfig",
            # BART's sizes; Whisper bounds its two position tables separately.
            **{k: v for k, v in BART_LIKE.items() if k != "max_position_embeddings"},
            num_mel_bins=WHISPER_MEL_BINS,
            max_source_positions=WHISPER_FRAMES // 2,
            max_target_positions=32,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            suppress_tokens=None,
            begin_suppress_tokens=None,
        ),
        mel_features,
        violating=ONE_TOKEN,
    ),
    # multimodal
    ModelSpec(
        "clip",
        MULTI,
        hf(
            "CLIPModel",
            "CLIPConfig",
            text_config=CLIP_TEXT,
            vision_config=CLIP_VISION,
            projection_dim=16,
        ),
        text_and_image,
        violating=ONE_TOKEN,  # the text tower is causal
    ),
    ModelSpec(
        "siglip",
        MULTI,
        hf("SiglipModel", "SiglipConfig", text_config=BERT_LIKE, vision_config=CLIP_VISION),
        text_and_image,
    ),
]


def fxloom_zoo_specs() -> list[ModelSpec]:
    """``fxloom.zoo``'s reference models. Their inputs have the one shape ``fxloom.zoo``
    gives (positional inputs, named here by parameter), whatever (batch, size) asks for."""
    from fxloom import zoo

    specs = []
    for entry in zoo.MODELS.values():
        examples = entry.example_inputs()
        example_batch = examples[0].shape[0]

        def make_inputs(batch: int, size: int, entry: Any = entry) -> Inputs:
            names = list(inspect.signature(entry.builder().forward).parameters)
            inputs = entry.example_inputs()
            first = inputs[0].shape[0]
            return dict(zip(names, (_rebatched(x, first, batch) for x in inputs)))

        specs.append(
            ModelSpec(
                entry.name,
                "fxloom-zoo",
                entry.builder,
                make_inputs,
                example=(example_batch, 0),
                other=(example_batch, 0),
                source="fxloom.zoo",
            )
        )
    return specs


def _rebatched(example: Any, example_batch: int, batch: int) -> Any:
    """``example`` with ``batch`` rows if its dimension 0 is the batch: new random values for
    floating tensors, the example's rows repeated for the others (token ids, masks)."""
    if not isinstance(example, torch.Tensor) or example.dim() == 0 or batch == example_batch:
        return example
    if example.shape[0] != example_batch:
        return example  # not batched (a shared mask)
    shape = (batch, *example.shape[1:])
    if example.is_floating_point():
        return noise(*shape, seed=batch).to(example.dtype)
    repeats = (batch + example_batch - 1) // example_batch
    return example.repeat(repeats, *([1] * (example.dim() - 1)))[:batch]


SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in [*HF_SPECS, *fxloom_zoo_specs()]}


def get(name: str) -> ModelSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"no zoo model named {name!r}; see benchmarks/zoo/registry.py") from None
