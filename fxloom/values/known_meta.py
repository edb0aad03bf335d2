"""The result metadata of common operators, computed without torch's Python meta kernels.

A stand-in's metadata comes from torch's meta kernels (``fxloom.values.stand_in``). For the
pointwise operators (``add``, ``mul``, ``sin``, ``eq``...) those are Python definitions
(``torch._refs``) that torch wraps in ``torch._disable_dynamo``: the first call of one imports
``torch._dynamo`` (and sympy behind it), 1 to 2 s, which would be most of the time a fresh
process takes to its first ``fxloom.compile`` result; ``addmm`` (a ``Linear``) reaches them
through its Python definition. For the plain case these operators meet most, their result
is simple to state, and fxloom states it here::

    >>> import torch
    >>> a = torch.empty(2, 3, device="meta")
    >>> b = torch.empty(2, 3, dtype=torch.int64, device="meta")
    >>> known_result(torch.ops.aten.add.Tensor, (a, b), {})
    tensor(..., device='meta', size=(2, 3))
    >>> known_result(torch.ops.aten.add.Tensor, (a, b.t()), {}) is None  # not the plain case
    True

The plain case: every tensor argument is a meta tensor of the same size, laid out
contiguously with the strides ``torch.empty`` gives (and not also channels-last: torch
orders such ambiguous layouts by rules of its own), of a real dtype or ``bool`` (where the
operator takes ``bool``); the other arguments are Python numbers other than complex ones;
no keyword arguments. Then the result has that size, contiguous strides, and the dtype of
the operator's rule in ``POINTWISE`` (torch's own type promotion, ``torch.result_type``,
then the rule's adjustment). Anything else returns ``None`` and the caller runs torch's
meta kernel, which knows every case. ``tests/values/test_known_meta.py`` checks each
table entry against torch's meta kernel over sizes, layouts, dtypes and numbers.

``addmm(bias, mat1, mat2)`` (``OTHERS``), plain when its three tensors are meta tensors of
one floating dtype, ``mat1`` and ``mat2`` matrices of any strides that multiply, and ``bias``
of the result's size, its last dimension or ``(1, last)`` with ``torch.empty``'s strides:
the result is a contiguous matrix of that dtype (what ``Linear`` gives).

Depends on torch only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["OTHERS", "POINTWISE", "known_result"]


def _promoted(dtypes: list[torch.dtype], operands: list[Any]) -> torch.dtype:
    """torch's type promotion of the operands (tensors and numbers), as eager computes it."""
    if len(operands) == 1:
        return operands[0].dtype if isinstance(operands[0], torch.Tensor) else dtypes[0]
    return torch.result_type(operands[0], operands[1])


def _promoted_then_float(dtypes: list[torch.dtype], operands: list[Any]) -> torch.dtype:
    """Promotion, integers to the default float dtype (true division, sin, exp...)."""
    dtype = _promoted(dtypes, operands)
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


def _bool(dtypes: list[torch.dtype], operands: list[Any]) -> torch.dtype:
    """Comparisons: always ``bool``."""
    return torch.bool


# Where a listed operator takes its operands: T a tensor, N a Python number (a ``Scalar``
# argument), A either (``add.Tensor``, ``sub.Tensor``, ``mul.Tensor`` and ``div.Tensor`` take a
# number for ``other``, as ``x + 1`` reaches them; ``eq.Tensor`` and the others refuse one).
# (dtype rule, operands, operators): only operators of one or two operands (``result_type``
# takes two), with no keyword argument whose value changes the dtype, defined on every real
# dtype but bool.
_GROUPS = (
    (_promoted, "TA", ("add.Tensor", "sub.Tensor", "mul.Tensor")),
    (_promoted, "TN", ("add.Scalar", "sub.Scalar", "rsub.Scalar", "mul.Scalar")),
    (_promoted, "TT", ("rsub.Tensor", "maximum", "minimum")),
    (_promoted, "T", ("neg", "abs", "relu")),
    (_promoted_then_float, "TA", ("div.Tensor",)),
    (_promoted_then_float, "TN", ("div.Scalar",)),
    (
        _promoted_then_float,
        "T",
        ("sin", "cos", "exp", "log", "tanh", "sigmoid", "sqrt", "rsqrt", "reciprocal", "erf"),
    ),
    (_bool, "TT", ("eq.Tensor", "ne.Tensor", "lt.Tensor", "le.Tensor", "gt.Tensor", "ge.Tensor")),
    (_bool, "TN", ("eq.Scalar", "ne.Scalar", "lt.Scalar", "le.Scalar", "gt.Scalar", "ge.Scalar")),
)
# operator (schema name, with its overload's unless the default) -> (dtype rule, operands).
POINTWISE: dict[str, tuple[Callable[[list[torch.dtype], list[Any]], torch.dtype], str]] = {
    f"aten::{name}": (rule, operands) for rule, operands, names in _GROUPS for name in names
}

# The dtypes of the plain case: real numbers and bool (complex numbers are refused by
# comparisons and relu; the rest are rare).
_DTYPES = frozenset(
    {
        torch.bool,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
    }
)
_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
# Operators eager refuses bool operands of (a bool tensor or a Python bool): "use ~ instead".
_NO_BOOL = frozenset(
    f"aten::{name}" for name in ("sub.Tensor", "sub.Scalar", "rsub.Tensor", "rsub.Scalar", "neg")
)
_META = torch.device("meta")
_NUMBERS = (int, float, bool)


def known_result(func: Any, args: tuple | list, kwargs: dict) -> torch.Tensor | None:
    """The meta tensor ``func(*args, **kwargs)`` gives on meta tensors, for an operator of
    ``POINTWISE`` or ``OTHERS`` in the plain case (see the module docstring); ``None``
    otherwise."""
    name = _schema_name(func)
    other = OTHERS.get(name)
    if other is not None:
        return None if kwargs else other(args)
    entry = POINTWISE.get(name)
    if entry is None or kwargs or len(args) != len(entry[1]):
        return None
    rule, operands = entry
    size = None
    dtypes: list[torch.dtype] = []
    for arg, where in zip(args, operands):
        if isinstance(arg, torch.Tensor):
            if where == "N" or not _plain_tensor(arg) or (size is not None and arg.shape != size):
                return None
            size = arg.shape
            dtypes.append(arg.dtype)
        elif where == "T" or type(arg) not in _NUMBERS:
            return None
    if (torch.bool in dtypes or bool in map(type, args)) and func._name in _NO_BOOL:
        return None
    if size is None or (len(size) == 4 and _all_channels_last(args)):
        return None
    return torch.empty(size, dtype=rule(dtypes, list(args)), device=_META)


def _addmm(args: tuple | list) -> torch.Tensor | None:
    """``addmm(bias, mat1, mat2)``: ``mm`` gives a contiguous matrix whatever its inputs'
    strides, and torch adds the bias onto it, keeping its layout."""
    if len(args) != 3 or not all(isinstance(arg, torch.Tensor) for arg in args):
        return None
    bias, mat1, mat2 = args
    if not all(_meta_of(arg, _FLOATS) and arg.dtype == mat1.dtype for arg in args):
        return None
    if mat1.dim() != 2 or mat2.dim() != 2 or mat1.shape[1] != mat2.shape[0]:
        return None
    rows, columns = mat1.shape[0], mat2.shape[1]
    if tuple(bias.shape) not in ((rows, columns), (columns,), (1, columns)):
        return None
    if bias.stride() != _contiguous_strides(bias.shape):
        return None
    return torch.empty((rows, columns), dtype=mat1.dtype, device=_META)


# operator -> its rule, for operators other than pointwise ones (no keyword arguments: alpha
# and beta change nothing of the result's metadata, but they are left to torch).
OTHERS: dict[str, Callable[[tuple | list], torch.Tensor | None]] = {"aten::addmm": _addmm}


def _schema_name(func: Any) -> str | None:
    """``aten::add.Tensor``; ``aten::neg`` for a default overload (torch's ``OpOverload._name``)."""
    return func._name if isinstance(func, torch._ops.OpOverload) else None


def _plain_tensor(tensor: torch.Tensor) -> bool:
    return _meta_of(tensor, _DTYPES) and tensor.stride() == _contiguous_strides(tensor.shape)


def _meta_of(tensor: torch.Tensor, dtypes: frozenset) -> bool:
    """Whether ``tensor`` is a strided meta tensor of concrete sizes and one of ``dtypes``."""
    return (
        tensor.device == _META
        and tensor.layout == torch.strided
        and tensor.dtype in dtypes
        and not tensor._has_symbolic_sizes_strides
    )


def _contiguous_strides(size: torch.Size) -> tuple[int, ...]:
    """The strides ``torch.empty(size)`` gives. Exactly these: a size-1 dimension's stride is
    free in a contiguous tensor, and some meta kernels keep an odd one (``relu`` does)."""
    strides = []
    running = 1
    for length in reversed(size):
        strides.append(running)
        running *= max(length, 1)
    return tuple(reversed(strides))


def _all_channels_last(args: tuple | list) -> bool:
    """Whether every tensor is also channels-last (as a 4-d contiguous tensor with sizes 1 can
    be): torch's meta kernels then order dimensions by rules of their own."""
    return all(
        arg.is_contiguous(memory_format=torch.channels_last)
        for arg in args
        if isinstance(arg, torch.Tensor)
    )
