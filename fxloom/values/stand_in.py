"""``StandIn``: a tensor without data that says what a value would be — shape, dtype, device, strides.

Export runs the user's program on stand-ins instead of real tensors. Each
stand-in wraps a tensor on the meta device, which torch's meta kernels know
how to compute (an operator on meta tensors produces the right sizes, strides
and dtype without touching data), and reports the device the real value would
live on. Stand-ins are fxloom's own; they are also what ``node.meta["val"]``
holds after export, so passes can ask a node's value about its shape::

    >>> import torch
    >>> from fxloom.values.stand_in import StandIn
    >>> x = StandIn.like(torch.ones(2, 3))
    >>> x
    StandIn(size=(2, 3), dtype=torch.float32, device=cpu)
    >>> (x @ x.T).shape        # computed by torch's meta kernels, no data involved
    torch.Size([2, 2])

While an export is capturing, every operator that reaches a stand-in goes to
that capture (``fxloom.export.capture``), which records it; outside a capture
a stand-in just computes its result's metadata, like above. Anything that
needs data (``.item()``, printing the values, ``nonzero``) is refused.

Depends on ``fxloom.values.eager_checks``, ``fxloom.values.known_meta`` and ``fxloom.values.symbolic.meta`` (operators on
symbolic sizes), loaded on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from fxloom.values.eager_checks import refuse_as_eager
from fxloom.values.known_meta import known_result
from fxloom.values.symbolic_scalars import SYMBOLIC_TYPES

__all__ = ["StandIn", "DataDependentError"]

_META = torch.device("meta")


class DataDependentError(NotImplementedError):
    """An operator needed the data of a value that only its metadata is known of (a
    ``NotImplementedError``, as torch's missing meta kernels raise, and so a ``RuntimeError``)."""


class StandIn(torch.Tensor):
    """A tensor with metadata and no data, backed by a meta-device tensor; see the module docstring."""

    _meta: torch.Tensor
    # The capture receiving the operators (``Capture.dispatch``), or None outside export.
    active: ClassVar[Callable[..., Any] | None] = None

    @staticmethod
    def __new__(cls, meta: torch.Tensor, device: torch.device) -> StandIn:
        stand_in = torch.Tensor._make_wrapper_subclass(
            cls,
            meta.size(),
            strides=meta.stride(),
            storage_offset=meta.storage_offset(),
            dtype=meta.dtype,
            layout=meta.layout,
            device=device,
            requires_grad=meta.requires_grad,
        )
        stand_in._meta = meta
        return stand_in

    def __init__(self, meta: torch.Tensor, device: torch.device) -> None:
        super().__init__()

    @classmethod
    def like(cls, tensor: torch.Tensor, device: torch.device | None = None) -> StandIn:
        """A stand-in with ``tensor``'s size, strides, dtype, device (or ``device``) and
        ``requires_grad``."""
        meta = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=_META)
        if tensor.storage_offset():
            meta = torch.empty(
                tensor.storage_offset() + _extent(tensor), dtype=tensor.dtype, device=_META
            ).as_strided(tensor.size(), tensor.stride(), tensor.storage_offset())
        meta.requires_grad_(tensor.requires_grad and tensor.is_floating_point())
        return cls(meta, tensor.device if device is None else device)

    @classmethod
    def with_sizes(cls, tensor: torch.Tensor, sizes: Sequence[Any]) -> StandIn:
        """A stand-in for ``tensor`` whose sizes are ``sizes`` (ints or ``torch.SymInt``), laid out
        densely in the order of ``tensor``'s strides (contiguous, channels-last, transposed...)."""
        if not _is_dense(tensor):
            raise ValueError(
                f"an input of shape {list(tensor.shape)} and strides {list(tensor.stride())} "
                "does not cover its memory densely; dynamic sizes need a dense example "
                "(pass x.contiguous())"
            )
        strides: list[Any] = [1] * tensor.dim()
        running: Any = 1
        # Innermost first: the dimension with the smallest stride (ties: the later one).
        for dim in sorted(range(tensor.dim()), key=lambda d: (tensor.stride(d), -d)):
            strides[dim] = running
            running = running * sizes[dim]
        meta = torch.empty_strided(sizes, strides, dtype=tensor.dtype, device=_META)
        meta.requires_grad_(tensor.requires_grad and tensor.is_floating_point())
        return cls(meta, tensor.device)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"StandIn(size={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"

    @classmethod
    def __torch_dispatch__(
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if StandIn.active is not None:
            return StandIn.active(func, args, kwargs)
        return run_on_meta(func, args, kwargs)

    def tolist(self) -> Any:
        """Nested lists of ``.item()`` of each element (torch's ``tolist`` reads the data a
        stand-in does not have; under export each element becomes a data-dependent value)."""
        if self.dim() == 0:
            return self.item()
        return [element.tolist() for element in self.unbind(0)]

    def __deepcopy__(self, memo: dict) -> StandIn:
        # Without autograd history (which torch refuses to deep-copy): a description copies.
        meta = self._meta.detach()
        copied = StandIn(meta.requires_grad_(self.requires_grad), self.device)
        memo[id(self)] = copied
        return copied

    # Tensor's __reduce_ex__ would read the storage: a stand-in pickles as its description.
    def __reduce_ex__(self, protocol: int) -> Any:
        return (_rebuild, (tuple(self.shape), self.stride(), self.dtype, str(self.device)))


def _rebuild(size: tuple, stride: tuple, dtype: torch.dtype, device: str) -> StandIn:
    meta = torch.empty_strided(size, stride, dtype=dtype, device=_META)
    return StandIn(meta, torch.device(device))


def _is_dense(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s elements fill a block of memory without gaps (in some dim order)."""
    expected = 1
    for dim in sorted(range(tensor.dim()), key=lambda d: (tensor.stride(d), -d)):
        if tensor.size(dim) != 1 and tensor.stride(dim) != expected:
            return False
        expected *= tensor.size(dim)
    return True


def _extent(tensor: torch.Tensor) -> int:
    """How many storage elements past the offset the tensor reaches."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(tensor.size(), tensor.stride()))


def _metas(value: Any) -> Any:
    """The meta tensors behind stand-ins (operator arguments: lists of tensors are one deep)."""
    if isinstance(value, StandIn):
        return value._meta
    if type(value) in (list, tuple):
        return type(value)(_metas(item) for item in value)
    return value


def device_of_result(func: Any, args: tuple, kwargs: dict) -> torch.device:
    """The device an operator's result lives on: its ``device=`` argument, else its first input's."""
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device)
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device
        if isinstance(arg, (list, tuple)):
            for item in arg:
                if isinstance(item, torch.Tensor):
                    return item.device
    return torch.get_default_device()


def compute_meta(func: Any, args: tuple, kwargs: dict, *, symbolic: bool = False) -> Any:
    """Run ``func`` on the meta tensors behind ``args``: the result's metadata, no data.

    A ``device=`` argument is pointed at the meta device (the real device is
    reported by the wrapping stand-in). With ``symbolic``, sizes may be
    ``torch.SymInt`` and operators whose C++ meta kernel refuses them run their
    Python definition (``fxloom.values.symbolic.meta``). Operators whose result
    depends on data raise ``DataDependentError``; one eager would refuse on its
    inputs' dtypes raises as eager does (``fxloom.values.eager_checks``).
    """
    meta_args = [_metas(arg) for arg in args]
    meta_kwargs = {key: _metas(value) for key, value in kwargs.items()}
    refuse_as_eager(func, meta_args, meta_kwargs)  # what the meta kernel would let through
    if "device" in meta_kwargs:
        meta_kwargs["device"] = _META
    try:
        if symbolic:
            # Loaded on first use: sympy and torch's decomposition tables are not cheap.
            from fxloom.values.symbolic.meta import compute_symbolic_meta

            return compute_symbolic_meta(func, tuple(meta_args), meta_kwargs)
        # Common pointwise operators in the plain case: stated by fxloom, without torch's
        # Python meta kernels, whose first call imports torch._dynamo (1 to 2 s).
        meta = known_result(func, meta_args, meta_kwargs)
        return func(*meta_args, **meta_kwargs) if meta is None else meta
    except NotImplementedError as err:
        if type(err).__name__ == "SymbolicMetaError":  # no Python definition: says so itself
            raise
        raise DataDependentError(
            f"{func} needs the data of its input to know its result (its output size or value "
            "depends on data), which export does not have; data-dependent operators are not "
            f"supported yet ({err})"
        ) from None


def wrap(meta_result: Any, device: torch.device) -> Any:
    """Stand-ins for the meta tensors in an operator's result."""
    if isinstance(meta_result, torch.Tensor):
        return StandIn(meta_result, device)
    if isinstance(meta_result, list):
        return [wrap(item, device) for item in meta_result]
    if isinstance(meta_result, tuple):  # a named tuple of a Python definition, too: plain
        return tuple(wrap(item, device) for item in meta_result)
    return meta_result


def run_on_meta(func: Any, args: tuple, kwargs: dict) -> Any:
    """An operator on stand-ins outside a capture: the stand-ins of its result."""
    if func is torch.ops.aten._local_scalar_dense.default:
        raise DataDependentError(
            "a StandIn has no data: .item(), bool() and printing its values are not possible"
        )
    meta = compute_meta(func, args, kwargs, symbolic=has_symbolic_sizes(args))
    return wrap(meta, device_of_result(func, args, kwargs))


def has_symbolic_sizes(args: tuple) -> bool:
    """Whether ``args`` (lists one level deep) hold a symbolic size or a stand-in with some."""
    for arg in args:
        if isinstance(arg, StandIn):
            if arg._meta._has_symbolic_sizes_strides:
                return True
        elif isinstance(arg, SYMBOLIC_TYPES):
            return True
        elif isinstance(arg, (list, tuple)) and has_symbolic_sizes(arg):
            return True
    return False
