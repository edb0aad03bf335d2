"""The arithmetic of folding an inference-mode batch norm into the layer before it.

In inference a batch norm is a per-channel affine map with constant coefficients::

    bn(y) = (y - mean) / sqrt(var + eps) * gamma + beta  =  y * scale + shift
    scale = gamma / sqrt(var + eps)        shift = beta - mean * scale

A convolution or linear layer computes ``y = x @ W + b`` per output channel, so
``bn(y) = x @ (W * scale) + (b * scale + shift)``: the same layer with a new weight and
bias. The per-channel coefficients and the bias are computed in float64 and rounded once to
the layer's dtype; the weight is scaled in its own precision (float32 at least), one
multiply per element, so a float32 model loses about one rounding per weight.

Depends on: torch.
"""

from __future__ import annotations

import torch

__all__ = ["fuse_conv_bn_weights", "fuse_linear_bn_weights"]


def fuse_conv_bn_weights(
    conv_w: torch.Tensor,
    conv_b: torch.Tensor | None,
    bn_rm: torch.Tensor,
    bn_rv: torch.Tensor,
    bn_eps: float,
    bn_w: torch.Tensor | None,
    bn_b: torch.Tensor | None,
    *,
    transpose: bool = False,
    groups: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias of ``conv`` followed by an inference-mode batch norm, as one conv.

    Args:
        conv_w: the convolution's weight, ``(out, in / groups, *kernel)``; for a transposed
            convolution (``transpose=True``) ``(in, out / groups, *kernel)``.
        conv_b: its bias, or ``None``.
        bn_rm, bn_rv, bn_eps: the batch norm's running mean, running variance and epsilon.
        bn_w, bn_b: its affine weight and bias, or ``None`` (``affine=False``).
        transpose: ``conv_w`` belongs to a transposed convolution.
        groups: the transposed convolution's ``groups`` (a plain convolution's weight is
            laid out by output channel whatever its groups, so it is not needed there).

    Returns:
        ``(weight, bias)``: new tensors (never views of the inputs, ``requires_grad`` off)
        with the dtypes and device of ``conv_w`` and ``conv_b`` (``conv_w``'s for a bias that
        was ``None``).

    >>> import torch
    >>> conv = torch.nn.Conv2d(3, 4, 3).double().eval()
    >>> bn = torch.nn.BatchNorm2d(4).double().eval()
    >>> _ = bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2)
    >>> w, b = fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var,
    ...                             bn.eps, bn.weight, bn.bias)
    >>> x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    >>> torch.allclose(torch.conv2d(x, w, b), bn(conv(x)))
    True
    """
    if transpose:
        out_channels = conv_w.shape[1] * groups
    else:
        out_channels = conv_w.shape[0]
    scale, shift = _scale_and_shift(bn_rm, bn_rv, bn_eps, bn_w, bn_b, conv_w, out_channels)
    with torch.no_grad():
        per_channel = scale.to(_multiply_dtype(conv_w))
        if transpose:
            # (in, out / groups, *k) -> (groups, in / groups, out / groups, *k): output channel
            # g * (out / groups) + j of group g lives at [g, :, j].
            grouped = conv_w.reshape(groups, -1, *conv_w.shape[1:])
            per_channel = per_channel.reshape(groups, 1, -1, *[1] * (conv_w.dim() - 2))
            weight = (grouped * per_channel).reshape(conv_w.shape)
        else:
            weight = conv_w * per_channel.reshape(-1, *[1] * (conv_w.dim() - 1))
    return _folded(weight, conv_w, conv_b, scale, shift)


def fuse_linear_bn_weights(
    linear_w: torch.Tensor,
    linear_b: torch.Tensor | None,
    bn_rm: torch.Tensor,
    bn_rv: torch.Tensor,
    bn_eps: float,
    bn_w: torch.Tensor | None,
    bn_b: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias of a linear layer followed by an inference-mode ``BatchNorm1d``.

    The batch norm must normalize the linear layer's output features, i.e. see its output as
    ``(N, out_features)``. Arguments and result as for ``fuse_conv_bn_weights``, with
    ``linear_w`` of shape ``(out_features, in_features)``.

    >>> import torch
    >>> linear = torch.nn.Linear(5, 3).double()
    >>> bn = torch.nn.BatchNorm1d(3, affine=False).double().eval()
    >>> _ = bn.running_var.fill_(4.0)
    >>> w, b = fuse_linear_bn_weights(linear.weight, linear.bias, bn.running_mean,
    ...                               bn.running_var, bn.eps, bn.weight, bn.bias)
    >>> x = torch.randn(2, 5, dtype=torch.float64)
    >>> torch.allclose(torch.nn.functional.linear(x, w, b), bn(linear(x)))
    True
    """
    out_features = linear_w.shape[0]
    scale, shift = _scale_and_shift(bn_rm, bn_rv, bn_eps, bn_w, bn_b, linear_w, out_features)
    with torch.no_grad():
        weight = linear_w * scale.to(_multiply_dtype(linear_w)).unsqueeze(1)
    return _folded(weight, linear_w, linear_b, scale, shift)


def _scale_and_shift(
    bn_rm: torch.Tensor,
    bn_rv: torch.Tensor,
    bn_eps: float,
    bn_w: torch.Tensor | None,
    bn_b: torch.Tensor | None,
    layer_w: torch.Tensor,
    out_channels: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, shift)`` of the batch norm's affine map, in the precision folding uses."""
    if bn_rm.numel() != out_channels:
        raise ValueError(
            f"cannot fold a batch norm of {bn_rm.numel()} channels into a layer with "
            f"{out_channels} output channels (weight of shape {tuple(layer_w.shape)})"
        )
    dtype = _fold_dtype(layer_w)
    device = layer_w.device
    with torch.no_grad():
        scale = torch.rsqrt(bn_rv.to(device, dtype) + bn_eps)
        if bn_w is not None:
            scale = scale * bn_w.to(device, dtype)
        shift = -bn_rm.to(device, dtype) * scale
        if bn_b is not None:
            shift = shift + bn_b.to(device, dtype)
    return scale, shift


def _multiply_dtype(layer_w: torch.Tensor) -> torch.dtype:
    # Half-precision weights are scaled in float32 and rounded once, not twice.
    return torch.promote_types(layer_w.dtype, torch.float32)


def _fold_dtype(layer_w: torch.Tensor) -> torch.dtype:
    # float64 where the device has it; MPS has no float64, so there float32 is the best.
    if layer_w.device.type == "mps":
        return torch.float32
    return torch.promote_types(layer_w.dtype, torch.float64)


def _folded(
    weight: torch.Tensor,
    layer_w: torch.Tensor,
    layer_b: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round the folded weight and bias back to the layer's dtypes."""
    with torch.no_grad():
        bias = shift if layer_b is None else layer_b.to(scale.dtype) * scale + shift
        bias_dtype = layer_w.dtype if layer_b is None else layer_b.dtype
        return weight.to(layer_w.dtype), bias.to(bias_dtype)
