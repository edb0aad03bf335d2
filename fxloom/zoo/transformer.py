"""``transformer_tiny``: a pre-norm transformer encoder with hand-written attention.

It is the zoo's sequence reference model, written to exercise what symbolic tracing of
transformers needs:

* sizes read from the input (``batch, seq_len = tokens.shape``, ``x.shape``) and used in
  ``view``/``reshape`` and in a tensor factory (``torch.arange(seq_len)`` for the learned
  positional embedding) — recorded as graph values, never frozen to constants;
* multi-head self-attention by hand: ``view``, ``transpose``, ``matmul``, a scaled
  ``softmax``;
* an additive attention ``mask`` that may be ``None``: ``if mask is not None`` is static
  control flow — trace with ``concrete_args={"mask": None}`` for the unmasked program, or
  with ``mask`` as an input for the masked one;
* an MLP with ``F.gelu``, residual adds, a final ``LayerNorm`` and a linear head.

Input: token ids, a LongTensor of shape (2, 16) with values below 100, and a float (16, 16)
causal mask (0 on and below the diagonal, -inf above); output: logits of shape (2, 16, 100).

Depends on: torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fxloom.zoo._seed import generator, seeded

__all__ = [
    "SelfAttention",
    "EncoderBlock",
    "TransformerTiny",
    "causal_mask",
    "transformer_tiny",
    "transformer_tiny_inputs",
]


class SelfAttention(nn.Module):
    """Multi-head self-attention: one fused q/k/v projection, softmax(q k^T / sqrt(d) + mask) v."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq_len, d_model = x.shape
        qkv = self.qkv(x).view(batch, seq_len, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (batch, heads, seq, head_dim)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        if mask is not None:
            scores = scores + mask
        weights = scores.softmax(dim=-1)
        attended = torch.matmul(weights, v).transpose(1, 2)
        return self.out(attended.reshape(batch, seq_len, d_model))


class EncoderBlock(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, d_model: int, num_heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attention = SelfAttention(d_model, num_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_ratio * d_model)
        self.fc2 = nn.Linear(mlp_ratio * d_model, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), mask)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TransformerTiny(nn.Module):
    """Token + learned positional embeddings, ``num_layers`` encoder blocks, norm, vocab head."""

    def __init__(
        self,
        vocab_size: int = 100,
        d_model: int = 32,
        num_heads: int = 2,
        num_layers: int = 2,
        max_len: int = 64,
    ) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(EncoderBlock(d_model, num_heads) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq_len = tokens.shape
        positions = torch.arange(seq_len, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def causal_mask(seq_len: int) -> torch.Tensor:
    """An additive (seq_len, seq_len) mask: 0 where a position may attend, -inf in its future."""
    return torch.full((seq_len, seq_len), float("-inf")).triu(1)


def transformer_tiny(seed: int = 0) -> TransformerTiny:
    """A ``TransformerTiny`` (vocab 100, d_model 32, 2 heads, 2 layers) with seeded weights, in eval mode."""
    with seeded(seed):
        model = TransformerTiny()
    return model.eval()


def transformer_tiny_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of shape (2, 16) and the matching causal mask."""
    tokens = torch.randint(0, 100, (2, 16), generator=generator(seed))
    return tokens, causal_mask(16)
