"""Tiny Hugging Face configurations, shared by the model tests and the zoo benchmark.

Settings (2 layers, hidden size 32, vocabulary 100, 32x32 images) for building
``transformers`` models with random weights and no downloads. Only plain
dicts and a lazy builder live here: importing this module does not import
``transformers``.

    >>> from fxloom.zoo.hf_configs import BERT_LIKE, hf
    >>> make_bert = hf("BertModel", "BertConfig", **BERT_LIKE)   # transformers imported on call
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = [
    "VOCAB",
    "IMAGE",
    "BERT_LIKE",
    "DECODER",
    "BART_LIKE",
    "T5_LIKE",
    "GPT2_LIKE",
    "VIT_LIKE",
    "hf",
]

VOCAB = 100
IMAGE = 32

BERT_LIKE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=37,
    max_position_embeddings=64,
)
DECODER = dict(BERT_LIKE, num_key_value_heads=1)
BART_LIKE = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=37,
    decoder_ffn_dim=37,
    max_position_embeddings=64,
)
T5_LIKE = dict(
    vocab_size=VOCAB,
    d_model=32,
    d_kv=16,
    d_ff=37,
    num_layers=2,
    num_heads=2,
    relative_attention_num_buckets=8,
    decoder_start_token_id=0,
)
GPT2_LIKE = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64)
VIT_LIKE = dict(
    image_size=IMAGE,
    patch_size=8,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=37,
)


def hf(model_class: str, config_class: str, **settings: Any) -> Callable[[], nn.Module]:
    """A builder of ``transformers.<model_class>(transformers.<config_class>(**settings))``."""

    def make() -> nn.Module:
        import transformers

        config = getattr(transformers, config_class)(**settings)
        return getattr(transformers, model_class)(config)

    return make
