"""Devices in a saved file: how a device is written and read, and where loaded tensors go.

Every tensor record names the device its tensor was on (``"device": "cuda:0"``);
the bytes are always stored from the CPU. Loading puts each tensor back on its
saved device, or where ``map_location`` says, which takes what ``torch.load``
takes:

* ``None``: each tensor goes back to its saved device;
* a device or a string (``"cpu"``, ``torch.device("cuda", 1)``): every tensor goes there;
* a dict ``{saved: new}`` of devices or strings: a tensor saved on a key's device goes to
  its value; a key may also be a device type (``"cuda"`` matches ``cuda:0`` and ``cuda:1``),
  an exact device winning over its type; devices not in the dict are restored;
* a callable ``f(tensor, saved)``: ``tensor`` is the tensor as read from the file, on the
  CPU, with its saved dtype, shape and strides (quantized tensors already quantized), never
  a ``Parameter`` and not requiring grad (both are restored after ``f``); ``saved`` is the
  device string the file records (``"cuda:0"``, ``"cpu"``). ``f`` returns the tensor to
  use (same shape and dtype), a device or string to move it to, or None to restore the
  saved device. Tied tensors are read once, so ``f`` sees each stored tensor once.

With a device, string or dict, ``torch.device`` values among a graph's arguments
(``aten.arange(..., device=cuda:0)`` in an exported program) and the devices in
``meta["val"]`` are mapped the same way, so the loaded program computes on the
tensors' new device; a callable maps tensors only.

A device that this machine does not have (``cuda`` without a GPU) is refused
with the tensor's name and the option that fixes it. A device in a file is
parsed strictly: a type name of lowercase letters with an optional index
(``cuda:0``), then checked by ``torch.device``; anything else is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fxloom.serialize.errors import SerializationError

__all__ = ["MapLocation", "Placement", "parse_device", "CPU"]

MapLocation = (
    None
    | str
    | torch.device
    | Mapping[str | torch.device, str | torch.device]
    | Callable[[torch.Tensor, str], Any]
)
CPU = "cpu"

# A device as a file may write it: a type of this closed table, and an index of at most
# three digits (that torch's 8-bit index holds). The table holds the devices torch computes on (and "meta"); the name a
# PrivateUse1 backend registered is added when it is asked for.
DEVICE_TYPES = frozenset({"cpu", "cuda", "meta", "mps", "xpu", "hpu", "mtia"})
_DEVICE_TEXT = re.compile(r"(?P<type>[a-z][a-z0-9_]{0,31})(:(0|[1-9][0-9]{0,2}))?")
# Devices whose tensors exist on every machine; others are tried once each (``_usable``).
_ALWAYS_THERE = frozenset({"cpu", "meta"})
_usable_cache: dict[torch.device, str | None] = {}


def parse_device(text: Any, where: str) -> torch.device:
    """The device ``text`` names (a string from a file); ``SerializationError`` otherwise."""
    match = _DEVICE_TEXT.fullmatch(text) if isinstance(text, str) else None
    if match is None or match["type"] not in _device_types():
        shown = repr(text)[:60]
        raise SerializationError(
            f"{where}: {shown} is not a device (one of {', '.join(sorted(_device_types()))}, "
            "with an optional index, like 'cuda:0')"
        )
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as e:
        raise SerializationError(f"{where}: {text!r} is not a device torch knows: {e}") from None
    if str(device) != text:  # torch keeps an index in 8 bits: "cuda:9999" would be cuda:15
        raise SerializationError(f"{where}: {text!r} is not a device index torch can hold")
    return device


def _device_types() -> frozenset[str]:
    # A private function of torch's: without it, the backend keeps torch's default name.
    registered = getattr(torch._C, "_get_privateuse1_backend_name", lambda: "privateuseone")
    return DEVICE_TYPES | {registered()}


def unusable_reason(device: torch.device) -> str | None:
    """Why tensors cannot be made on ``device`` here (None when they can)."""
    if device.type in _ALWAYS_THERE:
        return None
    if device not in _usable_cache:
        try:
            torch.empty(0, device=device)
            _usable_cache[device] = None
        except Exception as e:  # "Torch not compiled with CUDA enabled", an index too high
            _usable_cache[device] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return _usable_cache[device]


class Placement:
    """Where loaded tensors go, from ``map_location`` (see the module docstring)."""

    def __init__(self, map_location: MapLocation = None) -> None:
        self.function: Callable[[torch.Tensor, str], Any] | None = None
        self.everything: torch.device | None = None
        self.table: dict[str, torch.device] = {}
        if map_location is None:
            return
        if isinstance(map_location, (str, torch.device)):
            self.everything = _user_device(map_location, "map_location")
        elif isinstance(map_location, Mapping):
            for saved, new in map_location.items():
                key = str(_user_device(saved, "a key of map_location"))
                self.table[key] = _user_device(new, f"map_location[{saved!r}]")
        elif callable(map_location):
            self.function = map_location
        else:
            raise TypeError(
                "map_location must be None, a device, a string, a dict {saved: new} or a "
                f"callable (tensor, saved_device) -> tensor or device; got "
                f"{type(map_location).__name__}"
            )

    @property
    def moves_devices(self) -> bool:
        """Whether devices (not only tensors) are mapped: graph arguments and ``meta["val"]``."""
        return self.everything is not None or bool(self.table)

    def device_for(self, saved: torch.device) -> torch.device:
        """Where a tensor (or a device argument) saved on ``saved`` goes, without a callable."""
        if self.everything is not None:
            return self.everything
        return self.table.get(str(saved)) or self.table.get(saved.type) or saved

    def place(self, tensor: torch.Tensor, saved: torch.device, where: str) -> torch.Tensor:
        """``tensor`` (read on the CPU) on the device it goes to; refused where that device is
        missing here."""
        target: Any = None
        if self.function is not None:
            target = self.function(tensor, str(saved))
            if isinstance(target, torch.Tensor):
                return _checked_result(target, tensor, where)
        if target is None:
            target = self.device_for(saved)
        else:
            target = _user_device(target, f"map_location's result for {where}")
        reason = unusable_reason(target)
        if reason is not None:
            raise SerializationError(_missing_device_message(where, saved, target, reason))
        return tensor if tensor.device == target else tensor.to(target)


def _user_device(value: Any, what: str) -> torch.device:
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str):
        try:
            device = torch.device(value)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"{what}: {value!r} is not a device: {e}") from None
        if device.index is not None and str(device) != value.strip():
            raise ValueError(f"{what}: {value!r} is not a device index torch can hold")
        return device
    raise TypeError(f"{what} must be a device or a string, not {type(value).__name__}")


def _checked_result(result: torch.Tensor, read: torch.Tensor, where: str) -> torch.Tensor:
    if result.shape != read.shape or result.dtype != read.dtype:
        raise ValueError(
            f"map_location returned a {result.dtype} tensor of shape {list(result.shape)} for "
            f"{where}, which is {read.dtype} {list(read.shape)}; return it moved, or a device"
        )
    return result


def _missing_device_message(
    where: str, saved: torch.device, target: torch.device, reason: str
) -> str:
    if target == saved:
        return (
            f"{where} was saved on {saved}, which this machine cannot use ({reason}); "
            f"load it with map_location='cpu' (or another device, or a dict "
            f"{{'{saved}': 'cpu'}}) to put it elsewhere"
        )
    return (
        f"map_location puts {where} (saved on {saved}) on {target}, which this machine cannot "
        f"use ({reason}); choose a device it has, e.g. map_location='cpu'"
    )


def move_graph_devices(module: torch.nn.Module, placement: Placement) -> None:
    """Map the ``torch.device`` arguments of every graph in ``module`` as ``placement`` maps
    tensors (a device, string or dict ``map_location``; a callable maps tensors only)."""
    if not placement.moves_devices:
        return
    from fxloom.graph_module import GraphModule
    from fxloom.node import map_aggregate

    def moved(value: Any) -> Any:
        return placement.device_for(value) if isinstance(value, torch.device) else value

    for submodule in module.modules():
        if isinstance(submodule, GraphModule):
            for node in submodule.graph.nodes:
                args, kwargs = map_aggregate(node.args, moved), map_aggregate(node.kwargs, moved)
                if args != node.args or kwargs != node.kwargs:  # rewritten only where moved
                    node.args, node.kwargs = args, kwargs
