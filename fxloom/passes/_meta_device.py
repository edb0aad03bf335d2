"""Running graph nodes on the meta device: shapes, dtypes and strides without data or compute.

A meta tensor has a shape, dtype and strides but no storage, and PyTorch's meta kernels compute
an operator's output metadata without touching data. ``MetaRunner`` holds what a meta run of one
module needs and reuses it from run to run:

* inputs (``meta_input``): tensors become meta tensors of the same shape, dtype, strides and
  ``requires_grad``; ``(shape, dtype)`` pairs and ``torch.Size`` values become empty meta tensors;
* attributes read by ``get_attr``: a meta twin of each parameter or buffer, made once per target;
* modules called by ``call_module``: run with ``torch.func.functional_call`` on meta twins of
  their parameters and buffers (made once per module), so the real weights are never copied
  and never touched;
* device arguments (``x.to(device=torch.device("cpu"))``, ``device="cpu"``, ``x.cpu()``): sent
  to the meta device, so values stay on it;
* ``META_FUNCTIONS``: call_function targets that run differently on the meta device, because
  their meta kernel is missing or lays its output out unlike the CPU kernel does. Add an entry
  (same signature as the target) for an operator of your own that has no meta kernel.

Depends on: torch (meta tensors, ``torch.func.functional_call``); ``fxloom.pytree``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from fxloom.pytree import tree_any, tree_map

__all__ = ["META_FUNCTIONS", "MetaRunner", "meta_input", "is_shape_spec"]

META = torch.device("meta")
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
    """``value`` with every tensor and shape spec in it replaced by a meta tensor.

    Containers (``fxloom.pytree``'s) are rebuilt in its ``"plain"`` form;
    ``name`` (the graph input) is used in errors only.
    """

    def to_meta(leaf: Any) -> Any:
        if is_shape_spec(leaf):
            if isinstance(leaf, torch.Size):
                return torch.empty(leaf, device=META)
            shape, dtype = leaf
            return torch.empty(tuple(shape), dtype=dtype, device=META)
        if isinstance(leaf, torch.Tensor):
            return meta_twin(leaf, name)
        return leaf

    return tree_map(to_meta, value, mode="plain", is_leaf=is_shape_spec)


def meta_twin(tensor: torch.Tensor, what: str) -> torch.Tensor:
    """A meta tensor with ``tensor``'s shape, strides, dtype and ``requires_grad``.

    Parameters stay parameters (so ``node.meta['type']`` matches a real run).
    """
    if tensor.is_quantized:
        raise NotImplementedError(
            f"{what} is a quantized tensor ({tensor.qscheme()}), which the meta device cannot "
            "hold; propagate shapes in real mode: ShapeProp(gm).propagate(*real_inputs)"
        )
    if tensor.device.type == "meta":
        return tensor
    twin = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=META)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(twin, requires_grad=tensor.requires_grad)
    if tensor.requires_grad:
        twin.requires_grad_(True)
    return twin


def _meta_value(value: Any, what: str) -> Any:
    """A module attribute on the meta device: tensors twinned, anything else as it is."""
    if isinstance(value, torch.Tensor):
        return meta_twin(value, what)
    return value


class MetaRunner:
    """Meta-device counterparts of a module's attributes and submodules, cached per target.

    A cached twin is reused while the module still holds the same object at that target, and
    remade when it has been replaced.
    """

    def __init__(self) -> None:
        self._attributes: dict[str, tuple[Any, Any]] = {}  # target -> (real value, meta value)
        self._module_states: dict[str, tuple[torch.nn.Module, dict[str, torch.Tensor]]] = {}

    def attribute(self, target: str, value: Any) -> Any:
        """The meta twin of ``value``, the module attribute at ``target``."""
        cached = self._attributes.get(target)
        if cached is not None and cached[0] is value:
            return cached[1]
        twin = _meta_value(value, f"attribute {target!r}")
        self._attributes[target] = (value, twin)
        return twin

    def call_module(
        self, target: str, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``module(*args, **kwargs)`` with its parameters and buffers replaced by meta twins."""
        cached = self._module_states.get(target)
        if cached is None or cached[0] is not module:
            cached = (module, _meta_state(module, target))
            self._module_states[target] = cached
        state = cached[1]
        if not state:  # nothing to replace: a plain call is cheaper than functional_call
            return module(*args, **kwargs)
        return torch.func.functional_call(module, state, args, kwargs)

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
            args = (args[0], META, *args[2:])
        if kwargs:
            kwargs = {
                key: META if key == "device" and value is not None else _device_to_meta(value)
                for key, value in kwargs.items()
            }
        return args, kwargs


def _device_to_meta(value: Any) -> Any:
    if not tree_any(_is_device, value):
        return value  # the usual case: nothing to rebuild
    return tree_map(lambda leaf: META if _is_device(leaf) else leaf, value)


def _is_device(value: Any) -> bool:
    return isinstance(value, torch.device)


def _meta_state(module: torch.nn.Module, target: str) -> dict[str, torch.Tensor]:
    """Meta twins of ``module``'s parameters and buffers, by name (tied ones once)."""
    state: dict[str, torch.Tensor] = {}
    named: Sequence[tuple[str, torch.Tensor]] = [
        *module.named_parameters(),
        *module.named_buffers(),
    ]
    for name, tensor in named:
        if tensor.device.type != "meta":
            state[name] = meta_twin(tensor, f"{target}.{name}")
    return state
