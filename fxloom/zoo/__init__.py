"""Embedded reference models for the demo and the tests: small, seeded, no downloads.

Each entry of ``MODELS`` names a model family's builder, a factory of example inputs and a
one-line description; ``build(name)`` returns a fresh model in eval mode with its inputs::

    >>> import fxloom, torch
    >>> from fxloom import zoo
    >>> model, inputs = zoo.build("resnet_tiny")
    >>> traced = fxloom.symbolic_trace(model)
    >>> torch.testing.assert_close(traced(*inputs), model(*inputs))

Weights and inputs depend only on ``seed`` (default 0), never on the global RNG, which is left
untouched. The models live one family per file: ``mlp.py``, ``resnet.py``, ``resnet50.py``,
``transformer.py``, ``deeprec.py``, ``cnn.py``.
To add one, write its builder and inputs factory there and add a ``ZooModel`` row below.

Depends on: torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from fxloom.zoo.cnn import cnn_small, cnn_small_inputs
from fxloom.zoo.deeprec import deeprec, deeprec_inputs, deeprec_tiny, deeprec_tiny_inputs
from fxloom.zoo.mlp import mlp_tiny, mlp_tiny_inputs
from fxloom.zoo.resnet import resnet_tiny, resnet_tiny_inputs
from fxloom.zoo.resnet50 import resnet50, resnet50_inputs
from fxloom.zoo.transformer import transformer_tiny, transformer_tiny_inputs

__all__ = ["MODELS", "ZooModel", "build"]


@dataclass(frozen=True)
class ZooModel:
    """One row of the registry."""

    name: str
    description: str  # one line
    builder: Callable[..., nn.Module]  # builder(seed=0) -> model in eval mode
    example_inputs: Callable[..., tuple[Any, ...]]  # example_inputs(seed=0) -> forward's args


MODELS: dict[str, ZooModel] = {
    model.name: model
    for model in (
        ZooModel(
            "mlp_tiny",
            "MLP: flatten, then a Linear/ReLU stack in nn.Sequential",
            mlp_tiny,
            mlp_tiny_inputs,
        ),
        ZooModel(
            "resnet_tiny",
            "ResNet-style CNN: residual blocks, 1x1 downsample",
            resnet_tiny,
            resnet_tiny_inputs,
        ),
        ZooModel(
            "resnet50",
            "ResNet-50 (bottlenecks [3, 4, 6, 3], 25.6 M parameters), one 224x224 image",
            resnet50,
            resnet50_inputs,
        ),
        ZooModel(
            "transformer_tiny",
            "pre-norm encoder: hand-written 2-head attention, optional mask",
            transformer_tiny,
            transformer_tiny_inputs,
        ),
        ZooModel(
            "deeprec",
            "DeepRecommender autoencoder (the paper's quantization model): 17768-item Linear+SELU stack",
            deeprec,
            deeprec_inputs,
        ),
        ZooModel(
            "deeprec_tiny",
            "DeepRecommender autoencoder at 256 items: Linear+SELU, dropout on the code",
            deeprec_tiny,
            deeprec_tiny_inputs,
        ),
        ZooModel(
            "cnn_small",
            "small CNN: Conv+BN+ReLU, max pool, a residual block, pooled linear head",
            cnn_small,
            cnn_small_inputs,
        ),
    )
}


def build(name: str, *, seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    """``(model in eval mode, example inputs)`` for the zoo model ``name``, both seeded by ``seed``."""
    entry = MODELS.get(name)
    if entry is None:
        raise KeyError(f"no zoo model named {name!r}; the zoo has: {', '.join(sorted(MODELS))}")
    return entry.builder(seed=seed), entry.example_inputs(seed=seed)
