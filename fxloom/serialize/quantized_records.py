"""Format version 2's quantized-tensor records, converted to version 3's plain form.

Version 2 wrote a torch quantized tensor as a record with a quantized ``dtype`` and a
``quantized`` entry: per tensor its scale and zero point as JSON numbers, per channel its
axis, with the scales and zero points stored under ``key + ".scales"`` and
``key + ".zero_points"``. Version 3 holds plain tensors only (``tensors``): the record's
dtype is its values' integer dtype, an ``affine`` entry gives the axis (null per tensor),
and the scales and zero points are float64 and int64 tensors under ``key + ".scale"`` and
``key + ".zero_point"``. ``upgrade`` (``archive.UPGRADES[2]``) rewrites every old record of
a version 2 file into that form before anything is read; loading then checks it as any
version 3 record and rebuilds torch's quantized tensor, which is what holds it takes: the
torch.ao layers of ``kernels="torch.ao"`` pack it again (their graph calls them on quantized
tensors), a graph that reads it calls ``dequantize`` or quantized kernels on it.

The tables say what each old record kind becomes:

    OLD_DTYPES    qint8 -> int8, quint8 -> uint8, qint32 -> int32 (the values' dtype)
    OLD_SCHEMES   per_tensor_affine/_symmetric: the JSON scale and zero point become 0-d
                  tensors; per_channel_affine/_symmetric: the stored scales and zero points
                  are moved to the new keys, the axis kept

A record the converter cannot read (an unknown scheme, a missing parameter) is refused with
the tensor's key, as version 2's reader refused it. Nothing here runs code from the file:
the walk is over JSON data, iterative (no recursion on the file's nesting).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fxloom._format import printable
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.tensors import SCALE, ZERO_POINT
from fxloom.serialize.values import short

__all__ = ["OLD_DTYPES", "OLD_SCHEMES", "converted", "is_old_record", "upgrade"]

Weights = dict[str, Any]

# An old record's quantized dtype (as ``values`` wrote it) -> its values' integer dtype.
OLD_DTYPES = {"qint8": "int8", "quint8": "uint8", "qint32": "int32"}


def _per_tensor(record: dict, old: dict, weights: Weights, where: str) -> dict:
    """The scale and zero point written as JSON numbers, stored as 0-d tensors."""
    scale, zero_point = old.get("scale"), old.get("zero_point")
    if not isinstance(scale, float) or type(zero_point) is not int:
        raise SerializationError(f"{where}: invalid scale or zero point")
    key = record["key"]
    try:
        stored = (
            torch.tensor(scale, dtype=torch.float64),
            torch.tensor(zero_point, dtype=torch.int64),
        )
    except (RuntimeError, OverflowError) as e:
        raise SerializationError(f"{where}: invalid scale or zero point: {e}") from None
    _store(weights, key, stored, where)
    return {"axis": None}


def _per_channel(record: dict, old: dict, weights: Weights, where: str) -> dict:
    """The stored scales and zero points moved to the plain form's keys; the axis kept."""
    key = record["key"]
    scales, zero_points = weights.get(f"{key}.scales"), weights.get(f"{key}.zero_points")
    if scales is None or zero_points is None or type(old.get("axis")) is not int:
        raise SerializationError(f"{where}: per-channel parameters are missing")
    del weights[f"{key}.scales"], weights[f"{key}.zero_points"]
    _store(weights, key, (scales, zero_points), where)
    return {"axis": old["axis"]}


def _store(weights: Weights, key: str, parameters: tuple, where: str) -> None:
    for name, tensor in zip((key + SCALE, key + ZERO_POINT), parameters, strict=True):
        if name in weights:  # would stand for two things
            raise SerializationError(f"{where}: the weights already hold {name!r}; refused")
        weights[name] = tensor


# An old record's ``quantized.qscheme`` -> how its parameters become plain tensors.
OLD_SCHEMES: dict[str, Callable[[dict, dict, Weights, str], dict]] = {
    "per_tensor_affine": _per_tensor,
    "per_tensor_symmetric": _per_tensor,
    "per_channel_affine": _per_channel,
    "per_channel_symmetric": _per_channel,
}


def is_old_record(value: Any) -> bool:
    """A version 2 quantized-tensor record: a tensor record (its ``key`` a string) with a
    ``quantized`` entry. A module's attributes named ``key`` and ``quantized`` never look
    like one: an attribute's value is written as a kind (``{"qscheme": ...}``), never as an
    object whose ``qscheme`` is itself an object."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("key"), str)
        and isinstance(value.get("quantized"), dict)
        and isinstance(value["quantized"].get("qscheme"), dict)
    )


def converted(record: dict, weights: Weights) -> dict:
    """The version 3 record of the old quantized-tensor ``record`` (its parameters moved
    into ``weights``)."""
    key = record["key"]
    where = f"the tensor {printable(repr(key))}"
    dtype = record.get("dtype")
    integer = OLD_DTYPES.get(_name(dtype, "dtype"))
    if integer is None:
        raise SerializationError(f"{where}: {short(dtype)} is not a quantized dtype")
    old = record["quantized"]
    scheme = OLD_SCHEMES.get(_name(old["qscheme"], "qscheme"))
    if scheme is None:
        raise SerializationError(f"{where}: unknown quantization scheme {short(old['qscheme'])}")
    new = {name: value for name, value in record.items() if name != "quantized"}
    new["dtype"] = {"dtype": integer}
    new["affine"] = scheme(record, old, weights, where)
    return new


def _name(value: Any, kind: str) -> str:
    """The name in ``{kind: name}`` (as ``values`` writes a dtype or scheme), else ""."""
    name = value.get(kind) if isinstance(value, dict) else None
    return name if isinstance(name, str) else ""


def upgrade(program: Any, weights: Weights) -> Any:
    """``program`` with every old quantized-tensor record replaced by its plain form, in
    place; ``weights`` gains their parameters. A tensor held in several places (tied) has
    the same record in each: converted once, shared again."""
    done: dict[str, tuple[dict, dict]] = {}  # key -> (old record, its plain form)
    stack = [program] if isinstance(program, (dict, list)) else []
    while stack:
        item = stack.pop()
        for name, child in list(_items(item)):
            if is_old_record(child):
                item[name] = _once(child, weights, done)
            elif isinstance(child, (dict, list)):
                stack.append(child)
    return program


def _items(item: Any) -> Any:
    return item.items() if isinstance(item, dict) else enumerate(item)


def _once(record: dict, weights: Weights, done: dict[str, tuple[dict, dict]]) -> dict:
    key = record["key"]
    if key not in done:
        done[key] = (record, converted(record, weights))
    old, new = done[key]
    if old != record:
        raise SerializationError(
            f"the tensor {printable(repr(key))} is described twice, differently; refused"
        )
    return dict(new)
