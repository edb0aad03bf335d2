"""The models of the zoo: Hugging Face architectures from tiny configs, and ``fxloom.zoo``.

Every model is built locally with random weights (``torch.manual_seed(0)``, no downloads):
2 layers, hidden sizes around 32, inputs of a few tokens or a 32x32 image. ``build()``
returns ``(model in eval mode, inputs by forward-parameter name)``; the inputs depend only
on fixed seeds. To add a model, add a ``ModelSpec`` row to ``SPECS``.

Depends on: torch, transformers (pinned in constraints.txt), fxloom.zoo.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ModelSpec:
    """One model: its name, family, and how to build it and its example inputs."""

    name: str
    family: str
    make_model: Callable[[], nn.Module]
    make_inputs: Callable[[], Inputs]
    source: str = "transformers"  # or "fxloom.zoo"

    def build(self) -> tuple[nn.Module, Inputs]:
        """``(model.eval(), inputs)``, the same on every call."""
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = self.make_model().eval()
        return model, self.make_inputs()


# ------------------------------------------------------------------ inputs
def token_ids(length: int, seed: int, high: int = VOCAB) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, high, (BATCH, length), generator=generator)


def text() -> Inputs:
    return {
        "input_ids": token_ids(LENGTH, seed=1),
        "attention_mask": torch.ones(BATCH, LENGTH, dtype=torch.long),
    }


def seq2seq() -> Inputs:
    # The decoder's input is shorter than the encoder's, so a mix-up of the two lengths shows.
    return {**text(), "decoder_input_ids": token_ids(4, seed=2)}


def image() -> Inputs:
    generator = torch.Generator().manual_seed(3)
    return {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator)}


def audio() -> Inputs:
    generator = torch.Generator().manual_seed(4)
    return {"input_values": torch.randn(BATCH, 400, generator=generator)}


def mel_features() -> Inputs:
    """Whisper: 16 mel bins x 32 frames (2 x max_source_positions), and decoder tokens."""
    generator = torch.Generator().manual_seed(5)
    return {
        "input_features": torch.randn(BATCH, 16, 32, generator=generator),
        "decoder_input_ids": token_ids(4, seed=6),
    }


def text_and_image() -> Inputs:
    return {**text(), **image()}


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
RESNET_LIKE = dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])


def spec(
    name: str, family: str, inputs: Callable[[], Inputs], *classes: str, **settings: Any
) -> ModelSpec:
    """A Hugging Face model: ``classes`` are the model class and its config class."""
    return ModelSpec(name, family, hf(*classes, **settings), inputs)


# ------------------------------------------------------------------ the zoo
ENC, DEC, SEQ = "text-encoder", "text-decoder", "text-encoder-decoder"
CNN, VIT, SPEECH, MULTI = "vision-cnn", "vision-transformer", "speech", "multimodal"

HF_SPECS = [
    # text encoders
    spec("bert", ENC, text, "BertModel", "BertConfig", **BERT_LIKE),
    spec(
        "bert_classifier",
        ENC,
        text,
        "BertForSequenceClassification",
        "BertConfig",
        **BERT_LIKE,
        num_labels=3,
    ),
    spec("roberta", ENC, text, "RobertaModel", "RobertaConfig", **BERT_LIKE),
    spec("xlm_roberta", ENC, text, "XLMRobertaModel", "XLMRobertaConfig", **BERT_LIKE),
    spec(
        "distilbert",
        ENC,
        text,
        "DistilBertModel",
        "DistilBertConfig",
        vocab_size=VOCAB,
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=37,
        max_position_embeddings=64,
    ),
    spec("albert", ENC, text, "AlbertModel", "AlbertConfig", **BERT_LIKE, embedding_size=16),
    spec("electra", ENC, text, "ElectraModel", "ElectraConfig", **BERT_LIKE, embedding_size=16),
    spec(
        "mobilebert",
        ENC,
        text,
        "MobileBertModel",
        "MobileBertConfig",
        **BERT_LIKE,
        embedding_size=16,
        intra_bottleneck_size=16,
        true_hidden_size=16,
    ),
    spec("mpnet", ENC, text, "MPNetModel", "MPNetConfig", **BERT_LIKE),
    spec(
        "xlnet",
        ENC,
        text,
        "XLNetModel",
        "XLNetConfig",
        vocab_size=VOCAB,
        d_model=32,
        n_layer=2,
        n_head=2,
    ),
    spec(
        "funnel",
        ENC,
        text,
        "FunnelBaseModel",
        "FunnelConfig",
        vocab_size=VOCAB,
        block_sizes=[1, 1],
        d_model=32,
        n_head=2,
        d_head=16,
        d_inner=37,
    ),
    spec("deberta_v2", ENC, text, "DebertaV2Model", "DebertaV2Config", **BERT_LIKE),
    # text decoders
    spec("gpt2", DEC, text, "GPT2Model", "GPT2Config", **GPT2_LIKE),
    spec("gpt2_lm", DEC, text, "GPT2LMHeadModel", "GPT2Config", **GPT2_LIKE),
    spec(
        "gpt_neo",
        DEC,
        text,
        "GPTNeoModel",
        "GPTNeoConfig",
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        attention_types=[[["global", "local"], 1]],
        window_size=4,
        max_position_embeddings=64,
    ),
    spec(
        "opt",
        DEC,
        text,
        "OPTModel",
        "OPTConfig",
        **{k: v for k, v in BERT_LIKE.items() if k != "intermediate_size"},
        ffn_dim=37,
        word_embed_proj_dim=32,
    ),
    spec("llama", DEC, text, "LlamaModel", "LlamaConfig", **DECODER),
    spec("llama_lm", DEC, text, "LlamaForCausalLM", "LlamaConfig", **DECODER),
    spec("mistral", DEC, text, "MistralModel", "MistralConfig", **DECODER, sliding_window=4),
    spec("qwen2", DEC, text, "Qwen2Model", "Qwen2Config", **DECODER),
    spec("phi", DEC, text, "PhiModel", "PhiConfig", **DECODER),
    spec("gemma", DEC, text, "GemmaModel", "GemmaConfig", **DECODER, head_dim=16),
    spec("ctrl", DEC, text, "CTRLModel", "CTRLConfig", **GPT2_LIKE, dff=37),
    spec(
        "falcon",
        DEC,
        text,
        "FalconModel",
        "FalconConfig",
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
    ),
    spec(
        "bloom",
        DEC,
        text,
        "BloomModel",
        "BloomConfig",
        vocab_size=VOCAB,
        hidden_size=32,
        n_layer=2,
        n_head=2,
    ),
    spec(
        "mixtral",
        DEC,
        text,
        "MixtralModel",
        "MixtralConfig",
        **dict(DECODER, intermediate_size=40),  # grouped_mm wants 16-byte strides
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    spec(
        "codegen",
        DEC,
        text,
        "CodeGenModel",
        "CodeGenConfig",
        **GPT2_LIKE | {"n_head": 4},
        rotary_dim=4,
    ),
    # text encoder-decoders
    spec("t5", SEQ, seq2seq, "T5Model", "T5Config", **T5_LIKE),
    spec("t5_generator", SEQ, seq2seq, "T5ForConditionalGeneration", "T5Config", **T5_LIKE),
    spec("bart", SEQ, seq2seq, "BartModel", "BartConfig", **BART_LIKE),
    spec(
        "marian",
        SEQ,
        seq2seq,
        "MarianModel",
        "MarianConfig",
        **BART_LIKE,
        pad_token_id=0,
        decoder_start_token_id=0,
    ),
    spec("mbart", SEQ, seq2seq, "MBartModel", "MBartConfig", **BART_LIKE),
    spec("pegasus", SEQ, seq2seq, "PegasusModel", "PegasusConfig", **BART_LIKE),
    # vision CNNs
    spec(
        "convnext",
        CNN,
        image,
        "ConvNextModel",
        "ConvNextConfig",
        hidden_sizes=[8, 16],
        depths=[1, 1],
        num_stages=2,
    ),
    spec("resnet", CNN, image, "ResNetModel", "ResNetConfig", **RESNET_LIKE, layer_type="basic"),
    spec(
        "resnet_classifier",
        CNN,
        image,
        "ResNetForImageClassification",
        "ResNetConfig",
        **RESNET_LIKE,
        layer_type="bottleneck",
        num_labels=5,
    ),
    spec(
        "regnet",
        CNN,
        image,
        "RegNetModel",
        "RegNetConfig",
        **RESNET_LIKE,
        groups_width=8,
    ),
    spec(
        "mobilenet_v2",
        CNN,
        image,
        "MobileNetV2Model",
        "MobileNetV2Config",
        image_size=IMAGE,
        depth_multiplier=0.25,
    ),
    # vision transformers
    spec("vit", VIT, image, "ViTModel", "ViTConfig", **VIT_LIKE),
    spec(
        "vit_classifier",
        VIT,
        image,
        "ViTForImageClassification",
        "ViTConfig",
        **VIT_LIKE,
        num_labels=5,
    ),
    spec("deit", VIT, image, "DeiTModel", "DeiTConfig", **VIT_LIKE),
    spec(
        "beit", VIT, image, "BeitModel", "BeitConfig", **VIT_LIKE, use_relative_position_bias=True
    ),
    spec("dinov2", VIT, image, "Dinov2Model", "Dinov2Config", **VIT_LIKE, mlp_ratio=2),
    spec(
        "swin",
        VIT,
        image,
        "SwinModel",
        "SwinConfig",
        image_size=IMAGE,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
    ),
    spec(
        "segformer",
        VIT,
        image,
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
    spec(
        "levit",
        VIT,
        image,
        "LevitModel",
        "LevitConfig",
        image_size=IMAGE,
        hidden_sizes=[16, 24, 32],
        num_attention_heads=[1, 2, 2],
        depths=[1, 1, 1],
        key_dim=[8, 8, 8],
    ),
    # speech
    spec(
        "wav2vec2",
        SPEECH,
        audio,
        "Wav2Vec2Model",
        "Wav2Vec2Config",
        **WAV2VEC2_LIKE,
        do_stable_layer_norm=True,
    ),
    spec("hubert", SPEECH, audio, "HubertModel", "HubertConfig", **WAV2VEC2_LIKE),
    spec(
        "whisper",
        SPEECH,
        mel_features,
        "WhisperModel",
        "WhisperConfig",
        vocab_size=VOCAB,
        num_mel_bins=16,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        max_source_positions=16,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    ),
    # multimodal
    spec(
        "clip",
        MULTI,
        text_and_image,
        "CLIPModel",
        "CLIPConfig",
        text_config=CLIP_TEXT,
        vision_config=CLIP_VISION,
        projection_dim=16,
    ),
    spec(
        "siglip",
        MULTI,
        text_and_image,
        "SiglipModel",
        "SiglipConfig",
        text_config=BERT_LIKE,
        vision_config=CLIP_VISION,
    ),
]


def fxloom_zoo_specs() -> list[ModelSpec]:
    """``fxloom.zoo``'s reference models, their positional inputs given by parameter name."""
    from fxloom import zoo

    specs = []
    for entry in zoo.MODELS.values():

        def make_inputs(entry: Any = entry) -> Inputs:
            model = entry.builder()
            names = list(inspect.signature(model.forward).parameters)
            return dict(zip(names, entry.example_inputs()))

        specs.append(ModelSpec(entry.name, "fxloom-zoo", entry.builder, make_inputs, "fxloom.zoo"))
    return specs


SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in [*HF_SPECS, *fxloom_zoo_specs()]}


def get(name: str) -> ModelSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"no zoo model named {name!r}; see benchmarks/zoo/registry.py") from None
