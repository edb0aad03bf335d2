"""The fusion rules: which layer followed by which batch norm folds, and how.

``FUSION_RULES`` maps ``(producer, consumer)`` to a fold function. A producer or consumer is
named by what the node calls: a module's exact class for ``call_module`` nodes (subclasses
may override ``forward``, so they must be added explicitly), the function itself for
``call_function`` nodes::

    producer                                     consumer                          fold
    Conv{1,2,3}d, F.conv{1,2,3}d                 BatchNorm{same}d, F.batch_norm,   fold_conv
                                                 torch.batch_norm
    ConvTranspose{1,2,3}d, F.conv_transpose{..}d (the same)                        fold_conv_transpose
    Linear, F.linear                             BatchNorm1d, F.batch_norm,        fold_linear
                                                 torch.batch_norm

A fold function takes the producer as a ``Layer`` and the batch norm as ``BatchNormStats``
and returns the folded ``(weight, bias)``, or raises ``CannotFold`` saying why this pair
must stay as it is (the pass then leaves it unfused). To fold a class of your own whose
forward is the standard one, add rows::

    >>> import torch
    >>> from fxloom.passes.fuse.rules import FUSION_RULES, fold_conv
    >>> class MyConv(torch.nn.Conv2d):  # same forward, extra bookkeeping
    ...     pass
    >>> FUSION_RULES[(MyConv, torch.nn.BatchNorm2d)] = fold_conv
    >>> del FUSION_RULES[(MyConv, torch.nn.BatchNorm2d)]  # (leave the table as it was)

A new *function* producer or consumer of your own also needs its parameter names in
``fxloom.passes.fuse.sites.FUNCTION_PARAMETERS`` (torch's are read from their signatures).

Depends on: torch, ``weights``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxloom.passes.fuse.weights import fuse_conv_bn_weights, fuse_linear_bn_weights

__all__ = [
    "BATCH_NORM_FUNCTIONS",
    "FUSION_RULES",
    "BatchNormStats",
    "CannotFold",
    "FoldFn",
    "Layer",
    "fold_conv",
    "fold_conv_transpose",
    "fold_linear",
]


class CannotFold(Exception):
    """This pair cannot be folded; the message says why (the pass leaves it unfused)."""


@dataclass(frozen=True)
class Layer:
    """A producer as a fold sees it: its parameters and, if known, its output's rank.

    ``output_rank`` comes from shape metadata on the node (``meta["tensor_meta"]`` or
    ``meta["val"]``); ``None`` when there is none, and the usual layout is assumed.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    groups: int = 1
    output_rank: int | None = None


@dataclass(frozen=True)
class BatchNormStats:
    """An inference-mode batch norm: running statistics, epsilon, optional affine parameters."""

    running_mean: torch.Tensor
    running_var: torch.Tensor
    eps: float
    weight: torch.Tensor | None
    bias: torch.Tensor | None

    def arguments(self) -> tuple[Any, ...]:
        """The batch-norm arguments of ``fuse_conv_bn_weights`` / ``fuse_linear_bn_weights``."""
        return (self.running_mean, self.running_var, self.eps, self.weight, self.bias)


FoldFn = Callable[[Layer, BatchNormStats], tuple[torch.Tensor, torch.Tensor]]


def _check_channels(out_channels: int, bn: BatchNormStats) -> None:
    if bn.running_mean.numel() != out_channels:
        raise CannotFold(
            f"the batch norm has {bn.running_mean.numel()} channels, the layer "
            f"{out_channels} output channels"
        )


def _check_batched(layer: Layer) -> None:
    # Batch norm normalizes dim 1; an unbatched convolution's channels are dim 0.
    if layer.output_rank is not None and layer.output_rank != layer.weight.dim():
        raise CannotFold(
            f"the convolution's output is {layer.output_rank}-D (unbatched), so the batch "
            "norm's dim 1 is not its channels"
        )


def fold_conv(layer: Layer, bn: BatchNormStats) -> tuple[torch.Tensor, torch.Tensor]:
    """Conv then batch norm: scale each output channel (``weight[o]``) and fold the shift."""
    _check_batched(layer)
    _check_channels(layer.weight.shape[0], bn)
    return fuse_conv_bn_weights(layer.weight, layer.bias, *bn.arguments())


def fold_conv_transpose(layer: Layer, bn: BatchNormStats) -> tuple[torch.Tensor, torch.Tensor]:
    """Transposed conv then batch norm: output channels are ``weight[:, o]`` within each group."""
    _check_batched(layer)
    _check_channels(layer.weight.shape[1] * layer.groups, bn)
    return fuse_conv_bn_weights(
        layer.weight, layer.bias, *bn.arguments(), transpose=True, groups=layer.groups
    )


def fold_linear(layer: Layer, bn: BatchNormStats) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear then batch norm over its features: the output must be ``(N, features)``.

    Without shape metadata the output is assumed 2-D, as it almost always is before a
    ``BatchNorm1d`` of ``out_features`` channels; with it, any other rank is refused (a 3-D
    output ``(N, C, L)`` is normalized over ``C``, not over the linear layer's features).
    """
    if layer.output_rank is not None and layer.output_rank != 2:
        raise CannotFold(
            f"the linear layer's output is {layer.output_rank}-D; the batch norm normalizes "
            "dim 1, which is its features only in a 2-D (N, features) output"
        )
    _check_channels(layer.weight.shape[0], bn)
    return fuse_linear_bn_weights(layer.weight, layer.bias, *bn.arguments())


BATCH_NORM_FUNCTIONS = (F.batch_norm, torch.batch_norm)
_BATCH_NORMS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
_CONVS = {
    1: (nn.Conv1d, F.conv1d),
    2: (nn.Conv2d, F.conv2d),
    3: (nn.Conv3d, F.conv3d),
}
_CONV_TRANSPOSES = {
    1: (nn.ConvTranspose1d, F.conv_transpose1d),
    2: (nn.ConvTranspose2d, F.conv_transpose2d),
    3: (nn.ConvTranspose3d, F.conv_transpose3d),
}
_LINEARS = (nn.Linear, F.linear)


def _rows(producers: tuple, consumers: tuple, fold: FoldFn) -> dict[tuple[Any, Any], FoldFn]:
    return {(producer, consumer): fold for producer in producers for consumer in consumers}


FUSION_RULES: dict[tuple[Any, Any], FoldFn] = {}
for _dims in (1, 2, 3):
    _consumers = (_BATCH_NORMS[_dims], *BATCH_NORM_FUNCTIONS)
    FUSION_RULES.update(_rows(_CONVS[_dims], _consumers, fold_conv))
    FUSION_RULES.update(_rows(_CONV_TRANSPOSES[_dims], _consumers, fold_conv_transpose))
FUSION_RULES.update(_rows(_LINEARS, (nn.BatchNorm1d, *BATCH_NORM_FUNCTIONS), fold_linear))
