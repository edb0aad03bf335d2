"""Running graph nodes in meta mode: shapes, dtypes and strides without data or compute.

Meta mode runs on stand-ins (``fxloom.values.stand_in``): tensors with a shape, dtype and
strides but no storage, whose operators torch's meta kernels answer, under
``fxloom.values.metadata_mode.MetadataMode``, which reads every real tensor an operator meets
(parameters, buffers) as a stand-in of itself and makes tensor factories return stand-ins, so
the real weights are never copied and never touched. What is left to this module:

* inputs (``meta_input``): tensors become stand-ins of the same shape, dtype, strides and
  ``requires_grad``; ``(shape, dtype)`` pairs and ``torch.Size`` values become stand-ins too;
* device arguments (``x.to(device=torch.device("cuda"))``, ``device="cuda"``, ``x.cuda()``):
  sent to the stand-ins' device, so a CPU-only machine can propagate shapes of a program
  written for another device;
* ``META_FUNCTIONS``: call_function targets that run differently in meta mode, because their
  meta kernel is missing or lays its output out unlike the CPU kernel does. Add an entry
  (same signature as the target) for an operator of your own that has no meta kernel.

Depends on: torch (meta tensors); ``fxloom.pytree``; ``fxloom.values.stand_in``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from fxloom.pytree import tree_any, tree_map
from fxloom.values.stand_in import StandIn

__all__ = ["META_FUNCTIONS", "MetaRunner", "meta_input", "is_shape_spec"]

META = torch.device("meta")
# Where meta mode's stand-ins say they live: every device in the graph is sent here (shapes do not
# depend on the device, and a CPU-only machine can propagate a program written for CUDA).
STAND_IN_DEVICE = torch.device("cpu")
# Methods that only move a tensor between devices: on the meta device they leave it where it is.
_DEVICE_MOVES = frozenset({"cpu", "cuda", "pin_memory"})


def _attention_as_on_cpu(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` on meta tensors, with the layout the CPU gives it.

    On the meta device PyTorch always picks the unfused (math) kernel, whose output is
    contiguous; the CPU picks its fused kernel when the inputs allow, and that output follows
    the query's layout. Asking the CPU's own choice function (it reads only shapes, strides,
    dtypes and flags, never data) and running the fused kernel's meta function when it says so
    gives the strides a real CPU run has.
    """
    choice = _SDP_CHOICE.redispatch(
        _CPU_KEYS, query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
        enable_gqa=enable_gqa,
    )  # fmt: skip
    if choice == int(SDPBackend.FLASH_ATTENTION):
        output, _ = _CPU_FLASH_ATTENTION(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
        )
        return output
    return _scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )


_SDP_CHOICE = torch.ops.aten._fused_sdp_choice.default
_CPU_FLASH_ATTENTION = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_scaled_dot_product_attention = torch.nn.functional.scaled_dot_product_attention

# call_function target -> what to call instead on the meta device (same signature).
META_FUNCTIONS: dict[Any, Callable[..., Any]] = {
    _scaled_dot_product_attention: _attention_as_on_cpu,
}


def is_shape_spec(value: Any) -> bool:
    """Whether ``value`` describes a tensor: a ``torch.Size`` or a ``(shape, dtype)`` pair."""
    if isinstance(value, torch.Size):
        return True
    if type(value) is not tuple or len(value) != 2 or not isinstance(value[1], torch.dtype):
        return False
    shape = value[0]
    return isinstance(shape, (tuple, list)) and all(type(size) is int for size in shape)


def meta_input(value: Any, name: str) -> Any:
    """``value`` with every tensor and shape spec in it replaced by a stand-in.

    Stand-ins (``fxloom.values.stand_in``) have a tensor's shape, strides, dtype and
    ``requires_grad`` and no data; a spec's stand-in is on the CPU. Containers
    (``fxloom.pytree``'s) are rebuilt in its ``"plain"`` form; ``name`` (the graph input) is
    used in errors only.
    """

    def to_meta(leaf: Any) -> Any:
        if is_shape_spec(leaf):
            if isinstance(leaf, torch.Size):
                return StandIn.like(torch.empty(leaf, device=META), STAND_IN_DEVICE)
            shape, dtype = leaf
            return StandIn.like(
                torch.empty(tuple(shape), dtype=dtype, device=META), STAND_IN_DEVICE
            )
        if isinstance(leaf, StandIn):
            return leaf
        if isinstance(leaf, torch.Tensor):
            _refuse_quantized(leaf, name)
            return StandIn.like(leaf, STAND_IN_DEVICE)
        return leaf

    return tree_map(to_meta, value, mode="plain", is_leaf=is_shape_spec)


def _refuse_quantized(tensor: torch.Tensor, what: str) -> None:
    """Raise for a quantized tensor, which has no meta form (and so no stand-in)."""
    if tensor.is_quantized:
        raise NotImplementedError(
            f"{what} is a quantized tensor ({tensor.qscheme()}), which the meta device cannot "
            "hold; propagate shapes in real mode: ShapeProp(gm).propagate(*real_inputs)"
        )


class MetaRunner:
    """How meta mode treats devices: moves between devices are no-ops, and every device named in
    the graph becomes the stand-ins' device (``STAND_IN_DEVICE``)."""

    @staticmethod
    def method_on_meta(name: str, args: tuple[Any, ...]) -> bool:
        """Whether method ``name`` only moves ``args[0]`` between devices (a no-op on meta)."""
        return name in _DEVICE_MOVES and isinstance(args[0], torch.Tensor)

    @staticmethod
    def to_meta_device(
        args: tuple[Any, ...], kwargs: dict[str, Any], method: str | None = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``args``/``kwargs`` with every device sent to the meta device.

        ``torch.device`` values anywhere and ``device=`` keywords; for ``Tensor.to`` also a
        device given as a string (``x.to("cpu")``).
        """
        args = tuple(_device_to_meta(arg) for arg in args)
        if method == "to" and len(args) > 1 and isinstance(args[1], str):
            args = (args[0], STAND_IN_DEVICE, *args[2:])
        if kwargs:
            kwargs = {
                key: STAND_IN_DEVICE
                if key == "device" and value is not None
                else _device_to_meta(value)
                for key, value in kwargs.items()
            }
        return args, kwargs


def _device_to_meta(value: Any) -> Any:
    if not tree_any(_is_device, value):
        return value  # the usual case: nothing to rebuild
    return tree_map(lambda leaf: STAND_IN_DEVICE if _is_device(leaf) else leaf, value)


def _is_device(value: Any) -> bool:
    return isinstance(value, torch.device)
