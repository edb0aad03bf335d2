"""The table of ONNX translations, and the small helpers its handlers share.

``ONNX_TRANSLATIONS`` maps what a node calls to a handler that emits the ONNX nodes computing it:

================= ===============================================================
node              key
================= ===============================================================
call_module       the module's class (looked up along its MRO)
call_function,    the operator's key (``fxloom.ops.identity``): ``"relu"`` serves
call_method       ``torch.relu``, ``F.relu``, the method ``"relu"`` and ``aten.relu.default``;
                  a spelling whose arguments differ has a row of its own
                  (``pin=True``: ``aten.embedding``), found first; in-place twins
                  (``operator.iadd``) have rows of their own too; other callables by identity
================= ===============================================================

A handler is ``handler(ctx, node, args, kwargs) -> str | tuple[str, ...]``: ``args``/``kwargs``
are the node's, with every value the translator could fold already a Python value (sizes,
dtypes, constant tensors); the nodes left in them are tensors of the ONNX graph, named by
``ctx.name(node)``. The handler returns the ONNX value name of the node's result (a tuple for a
node whose value is a tuple). It may raise ``UnsupportedArgument`` to refuse a call it cannot
translate; ``handler.refuses`` (set by ``register(..., refuses=...)``), a
``refuses(node, module) -> str | None`` that only reads the node, lets ``unsupported_reason``
say so before translation starts. Users add or replace entries::

    >>> import torch
    >>> from fxloom.lower import ONNX_TRANSLATIONS
    >>> def translate_erfc(ctx, node, args, kwargs):
    ...     one = ctx.constant(1.0, dtype=ctx.dtype_of(node))
    ...     return ctx.node("Sub", [one, ctx.node("Erf", [ctx.name(args[0])])])
    >>> ONNX_TRANSLATIONS[torch.special.erfc] = translate_erfc

The families live in ``onnx_ops_elementwise`` (unary, activations, arithmetic, comparisons),
``onnx_ops_shapes`` (views, joins, splits, indexing, casts, pads, factories), ``onnx_ops_nn``
(products, convolution, pooling, norms, softmax, reductions, embedding, attention),
``onnx_ops_modules`` (nn.Module classes) and ``onnx_ops_aten`` (the ATen spellings of exported
programs whose arguments differ from torch's); one handler, registered under the operator's
key, serves its torch function, ``F`` function, Tensor method and ATen overloads. Importing
``fxloom.lower`` registers them all. A call building a container that ``fxloom.pytree`` knows
(a named tuple, a Hugging Face ``ModelOutput``) goes to the ``CONTAINER`` entry. This module
imports neither onnx nor onnxruntime: handlers only talk to the context.

Depends on: torch, ``fxloom.ops.identity``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from fxloom.ops.identity import OpTable

__all__ = [
    "CONTAINER",
    "ONNX_TRANSLATIONS",
    "UnsupportedArgument",
    "handler_for",
    "onnx_dtype",
    "register",
]

Handler = Callable[..., Any]

ONNX_TRANSLATIONS: OpTable = OpTable()

# The key of the handler for calls that build a container fxloom.pytree knows (a named tuple,
# a Hugging Face ModelOutput): their classes are too many to list one by one.
CONTAINER = "<container constructor>"


class UnsupportedArgument(Exception):
    """A handler refuses a call it cannot translate; the message says why."""


# torch dtype -> ONNX TensorProto element type (the values of onnx.TensorProto's enum, written
# out so that the handler tables need no onnx import).
_ONNX_ELEMENT_TYPES = {
    torch.float32: 1,
    torch.uint8: 2,
    torch.int8: 3,
    torch.int16: 5,
    torch.int32: 6,
    torch.int64: 7,
    torch.bool: 9,
    torch.float16: 10,
    torch.float64: 11,
    torch.bfloat16: 16,
}


def onnx_dtype(dtype: torch.dtype) -> int:
    """The ONNX element type of a torch dtype; ``UnsupportedArgument`` if ONNX has none."""
    try:
        return _ONNX_ELEMENT_TYPES[dtype]
    except KeyError:
        raise UnsupportedArgument(f"ONNX has no element type for {dtype}") from None


def has_onnx_dtype(dtype: torch.dtype) -> bool:
    return dtype in _ONNX_ELEMENT_TYPES


def register(
    keys: Any | Iterable[Any],
    *,
    refuses: Callable[..., str | None] | None = None,
    pin: bool = False,
) -> Callable[[Handler], Handler]:
    """Decorator: register the handler under one operator or several (any spelling of each:
    its key's row). ``pin``: for these very spellings only (an ATen packet whose arguments
    are laid out unlike torch's)."""
    key_list = list(keys) if isinstance(keys, (list, tuple)) else [keys]

    def decorate(handler: Handler) -> Handler:
        if refuses is not None:
            handler.refuses = refuses  # type: ignore[attr-defined]
        for key in key_list:
            if pin:
                ONNX_TRANSLATIONS.pin(key, handler)
            else:
                ONNX_TRANSLATIONS[key] = handler
        return handler

    return decorate


def handler_for(op: str, target: Any, module: Any = None) -> Handler | None:
    """The handler for a call node's target (``module``: the called module, for call_module)."""
    if op == "call_module":
        for cls in type(module).__mro__:
            if cls in ONNX_TRANSLATIONS:
                return ONNX_TRANSLATIONS[cls]
        return None
    found = ONNX_TRANSLATIONS.get(target)
    if found is None and op == "call_function" and isinstance(target, type):
        from fxloom.pytree import container_type

        if container_type(target) is not None:
            found = ONNX_TRANSLATIONS.get(CONTAINER)
    return found


# ---- helpers shared by the families -------------------------------------------------------


def normalized_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def dims_list(dims: Any) -> list[int]:
    """``dim`` arguments as a list: an int, a tuple/list of ints."""
    if isinstance(dims, int):
        return [dims]
    return list(dims)


def argument(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    """The argument at position ``index`` or keyword ``name``, else ``default``."""
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def cast_to(ctx: Any, value: Any, dtype: torch.dtype) -> str:
    """``value`` (a tensor node or a Python number) as an ONNX value of ``dtype``."""
    from fxloom.node import Node

    if not isinstance(value, Node):
        return ctx.constant(value, dtype=dtype)
    name = ctx.name(value)
    if ctx.dtype_of(value) == dtype:
        return name
    return ctx.node("Cast", [name], to=onnx_dtype(dtype))


def result_dtype(ctx: Any, *operands: Any) -> torch.dtype:
    """The dtype torch promotes ``operands`` (tensor nodes and Python numbers) to."""
    from fxloom.node import Node

    def stand_in(value: Any) -> Any:
        if isinstance(value, Node):
            return torch.empty([1] * len(ctx.shape_of(value)), dtype=ctx.dtype_of(value))
        return value

    tensors = [stand_in(v) for v in operands]
    dtype = torch.result_type(tensors[0], tensors[1]) if len(tensors) > 1 else tensors[0].dtype
    for extra in tensors[2:]:
        dtype = torch.promote_types(dtype, torch.result_type(extra, extra))
    return dtype


def int_list(ctx: Any, values: Any) -> str:
    """A 1-D int64 ONNX value from a list of ints and (dynamic) int nodes: a shape or starts."""
    from fxloom.node import Node

    if isinstance(values, Node):  # a whole shape computed in the graph
        return cast_to(ctx, values, torch.int64)
    values = list(values)
    if not any(isinstance(v, Node) for v in values):
        return ctx.constant(torch.tensor(values, dtype=torch.int64))
    parts = []
    for value in values:
        scalar = cast_to(ctx, value, torch.int64)
        parts.append(ctx.node("Reshape", [scalar, ctx.constant([1])]))
    return ctx.node("Concat", parts, axis=0)


def reduce_axes(ctx: Any, node: Any, dims: Any) -> list[int]:
    """The axes of a reduction over ``dims`` (``None``: all of them) of ``node``'s input."""
    rank = len(ctx.shape_of(node))
    if dims is None:
        return list(range(rank))
    return [normalized_dim(d, rank) for d in dims_list(dims)]
