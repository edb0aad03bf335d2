"""``MetadataMode``: run torch operators for their results' metadata only, on stand-ins.

Tracing with example inputs answers most questions a program asks of its
values (shapes, dtypes, devices, ranks, how many items a tuple holds) from
metadata alone. Inside this dispatch mode every operator runs on
``StandIn`` tensors (``fxloom.values.stand_in``), whose meta kernels compute
sizes, strides and dtypes without touching data. Real tensors an operator
meets (parameters, buffers, constants, tensors a module makes) are read as
stand-ins of themselves, made once per tensor; an in-place operator gets a
fresh stand-in instead, so the real tensor and the cached stand-in both stay
as they were. Nothing real is computed or changed::

    >>> import torch
    >>> from fxloom.values.stand_in import StandIn
    >>> weight = torch.ones(4, 3)
    >>> with MetadataMode():
    ...     y = StandIn.like(torch.ones(2, 3)) @ weight.T
    ...     _ = weight.add_(1)
    >>> y, weight[0, 0].item()
    (StandIn(size=(2, 4), dtype=torch.float32, device=cpu), 1.0)

An operator whose result depends on data (``nonzero``, ``.item()``) raises
``DataDependentError``; the caller computes that value for real instead.
Results are remembered by the metadata of the call (``_RESULTS``), so a
model's repeated layers, and a model traced again, cost one meta kernel call
per distinct operator call.

Depends on ``fxloom.values.stand_in``.
"""

from __future__ import annotations

from typing import Any

import torch

from fxloom._torch_compat import TorchDispatchMode
from fxloom.pytree import tree_any
from fxloom.values.stand_in import StandIn, run_on_meta

__all__ = ["MetadataMode", "holds_tensor"]


class MetadataMode(TorchDispatchMode):
    """Operators on stand-ins, real tensors read as stand-ins; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        # id(real tensor) -> (the tensor, kept alive so its id is not reused; its stand-in)
        self._stand_ins: dict[int, tuple[torch.Tensor, StandIn]] = {}

    def stand_in_of(self, tensor: torch.Tensor) -> StandIn:
        """The stand-in a real tensor is read as (made on first use)."""
        if type(tensor) is StandIn:
            return tensor
        entry = self._stand_ins.get(id(tensor))
        if entry is None:
            entry = (tensor, StandIn.like(tensor))
            self._stand_ins[id(tensor)] = entry
        return entry[1]

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        factory = _is_factory(func, args, kwargs)
        if func._schema.is_mutable:
            # Fresh stand-ins, so that an in-place change of metadata (unsqueeze_) reaches
            # no cached stand-in and no meta tensor shared through ``_RESULTS``.
            return self._on_meta(func, args, kwargs, StandIn.like, factory)
        key = None if factory else _metadata_key((torch.get_default_dtype(), args, kwargs))
        if key is None:  # a factory's device is the default one: not remembered
            return self._on_meta(func, args, kwargs, self.stand_in_of, factory)
        key = (id(func), key)  # operators live as long as torch: their ids are stable
        result = _RESULTS.get(key)
        if result is None:
            result = self._on_meta(func, args, kwargs, self.stand_in_of, factory)
            if not _holds_only_tensors(result):
                return result
            if len(_RESULTS) >= _RESULTS_LIMIT:
                _RESULTS.clear()
            _RESULTS[key] = result
        return _rewrapped(result)

    def _on_meta(self, func: Any, args: tuple, kwargs: dict, convert: Any, factory: bool) -> Any:
        args = tuple(_tensors_to_stand_ins(arg, convert) for arg in args)
        kwargs = {key: _tensors_to_stand_ins(value, convert) for key, value in kwargs.items()}
        if factory and kwargs.get("device") is None:
            # run_on_meta points ``device=`` at the meta device and reports this one.
            kwargs["device"] = torch.get_default_device()
        return run_on_meta(func, args, kwargs)


# Results remembered by the metadata of the call: an operator's result metadata follows from
# its inputs' metadata, its other arguments and the default dtype (a transformer's
# layers repeat the same operators on the same shapes, a model is traced again with the same
# examples, and torch's meta kernels are Python, ~0.5 ms each). Process-wide, like torch's own
# fake tensor cache: results are meta tensors, which hold no memory; cleared when full.
# (operator id, metadata key) -> a stand-in result, never handed out (``_rewrapped``).
_RESULTS: dict[Any, Any] = {}
_RESULTS_LIMIT = 20_000
# Argument types keyed by value, with their type: x + 1 and x + 1.0 differ in dtype, and
# 1 == 1.0 == True as dict keys. Plain ints (sizes, dims) are the common case: keyed bare.
_SCALARS = frozenset(
    {float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format}
)


def _metadata_key(value: Any) -> Any:
    """A hashable key of an operator call's metadata, or None if an argument has none."""
    kind = type(value)
    if kind is int:
        return value
    if kind in _SCALARS:
        return (kind, value)
    if kind is tuple or kind is list:
        keys = []
        for item in value:
            key = _metadata_key(item)
            if key is None:
                return None
            keys.append(key)
        return (kind, *keys)
    if isinstance(value, torch.Tensor):
        if value._has_symbolic_sizes_strides:  # symbolic sizes: what they mean changes
            return None
        return (value.shape, value.stride(), value.storage_offset(), value.dtype, value.device)
    if kind is dict:
        return _metadata_key(list(value.items()))
    return None


def _holds_only_tensors(result: Any) -> bool:
    if isinstance(result, torch.Tensor):
        return True
    if isinstance(result, (tuple, list)):
        return all(item is None or _holds_only_tensors(item) for item in result)
    return False


def _rewrapped(result: Any) -> Any:
    """New stand-ins over the meta tensors of a remembered result (new objects, like a real run)."""
    if isinstance(result, StandIn):
        return StandIn(result._meta, result.device)
    if isinstance(result, (tuple, list)):
        return type(result)(_rewrapped(item) for item in result)
    return result


def _tensors_to_stand_ins(value: Any, convert: Any) -> Any:
    """Operator arguments with tensors as stand-ins (lists of tensors are one deep)."""
    if isinstance(value, torch.Tensor):
        return convert(value)
    if type(value) in (list, tuple):
        return type(value)(_tensors_to_stand_ins(item, convert) for item in value)
    return value


# id(operator) -> whether its schema has a ``device=`` argument.
_takes_device: dict[int, bool] = {}


def _is_factory(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``func`` makes a tensor from nothing (``zeros``, ``arange``): no tensor inputs, a device."""
    takes_device = _takes_device.get(id(func))
    if takes_device is None:
        takes_device = any(arg.name == "device" for arg in func._schema.arguments)
        _takes_device[id(func)] = takes_device
    return takes_device and not holds_tensor((args, kwargs))


def holds_tensor(value: Any) -> bool:
    """Whether a value (a tensor, or a pytree of values) contains a tensor."""
    return tree_any(_is_tensor, value)


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)
