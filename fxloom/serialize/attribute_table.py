"""Which attributes a graph from a file may read with ``getattr``/``hasattr``, per kind of value.

An attribute read is the one way a graph could walk from a value to something
else (``x.numpy`` then numpy's ``ctypes`` then ``os``). So names are enumerated
per kind of value that graphs read attributes of, and every table leads only to
values of the kinds in ``VALUE_KINDS`` — tensors, sizes, dtypes, devices, numbers,
strings and the fields of registered containers — never out of them
(``tests/serialize/test_call_table.py`` reads every entry to check it). A name
must be in one of the tables: the graph is checked before it runs, when the
kind of each value is not known, so their union is what is allowed.

``READABLE_ATTRIBUTES`` holds the fixed tables; the fields of torch's result
types (``values``/``indices`` of ``max``) and of containers registered with
fxloom's or torch's pytree (Hugging Face's ``ModelOutput`` classes: ``logits``,
``last_hidden_state``) are read from those classes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["READABLE_ATTRIBUTES", "VALUE_KINDS", "readable_attribute"]

READABLE_ATTRIBUTES: dict[str, frozenset[str]] = {
    # Tensor properties that are data; not grad_fn (an autograd node, with hooks).
    "tensor": frozenset(
        "shape dtype device layout ndim T mT H mH real imag data grad requires_grad is_leaf "
        "retains_grad itemsize nbytes output_nr is_cuda is_cpu is_meta is_mps is_xpu is_xla "
        "is_quantized is_sparse is_sparse_csr is_nested is_mkldnn is_ipu is_maia is_mtia "
        "is_vulkan".split()
    ),
    "dtype": frozenset("is_floating_point is_complex is_signed itemsize".split()),
    "device": frozenset({"type", "index"}),
    "finfo": frozenset("bits eps max min tiny smallest_normal resolution dtype".split()),
}
# What reading an allowed attribute may give (for the check that the tables are closed).
VALUE_KINDS: tuple[type, ...] = (
    torch.Tensor,
    torch.Size,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    int,
    float,
    bool,
    str,
    type(None),
)
_FIXED = frozenset().union(*READABLE_ATTRIBUTES.values())


def readable_attribute(name: Any) -> bool:
    """Whether a graph from a file may read the attribute ``name`` of a value."""
    return isinstance(name, str) and (name in _FIXED or name in _field_names())


def _field_names() -> frozenset[str]:
    """The fields of torch's result types and of registered containers (cached per registry size)."""
    import torch.utils._pytree as torch_pytree

    from fxloom.pytree import _REGISTRY

    key = (len(_REGISTRY), len(torch_pytree.SUPPORTED_NODES))
    if _FIELDS_CACHE.get("key") != key:
        classes = [*_REGISTRY, *torch_pytree.SUPPORTED_NODES, *_result_types()]
        _FIELDS_CACHE["names"] = frozenset(
            name for cls in classes for name in _fields_of(cls) if not name.startswith("_")
        )
        _FIELDS_CACHE["key"] = key
    return _FIELDS_CACHE["names"]


_FIELDS_CACHE: dict[str, Any] = {}


def _result_types() -> list[type]:
    return [
        cls
        for name, cls in vars(torch.return_types).items()
        if not name.startswith("_") and isinstance(cls, type) and issubclass(cls, tuple)
    ]


def _fields_of(cls: Any) -> tuple[str, ...]:
    """A container class's field names: a dataclass's fields, a named tuple's or result type's."""
    if not isinstance(cls, type):
        return ()
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    fields = vars(cls).get("_fields") or vars(cls).get("__match_args__")
    return tuple(f for f in fields if isinstance(f, str)) if isinstance(fields, tuple) else ()
