"""Tensors in a saved file: bytes in one safetensors blob, described by JSON records.

A record says where a tensor's bytes are (``key``) and what it must be
(``shape``, ``dtype``, ``requires_grad``; ``stride`` when it is not
contiguous; ``quantized`` with its quantization parameters for int8
tensors, whose integer values are stored). Loading checks every record
against the bytes, so a file whose tensors disagree with its description is
refused rather than loaded wrong. A tensor reached from several places (tied
weights) is stored once and shared again on loading.
"""

from __future__ import annotations

import ctypes
import json
from typing import IO, Any

import torch

from fxloom.serialize.errors import SerializationError
from fxloom.serialize.values import decode_value, encode_value

__all__ = ["TensorWriter", "TensorReader", "read_safetensors"]

_PER_TENSOR = (torch.per_tensor_affine, torch.per_tensor_symmetric)
_PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_symmetric)


class TensorWriter:
    """Collects tensors while a module is written; ``blob()`` gives the safetensors bytes."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._records: dict[int, dict[str, Any]] = {}
        self._keep_alive: list[torch.Tensor] = []  # ids stay unique while we hold them

    def add(self, tensor: torch.Tensor, where: str) -> dict[str, Any]:
        """The record standing for ``tensor`` (``where`` names it in errors)."""
        known = self._records.get(id(tensor))
        if known is not None:
            return known
        if tensor.device.type == "meta" or tensor.layout is not torch.strided:
            raise SerializationError(
                f"cannot save the tensor {where}: only dense tensors with data can be saved "
                f"(this one is {tensor.layout} on {tensor.device})"
            )
        key = f"t{len(self._records)}"
        record: dict[str, Any] = {
            "key": key,
            "shape": list(tensor.shape),
            "dtype": encode_value(tensor.dtype),
        }
        data = tensor.detach()
        if tensor.is_quantized:
            record["quantized"] = self._quantization(tensor, key)
            data = tensor.int_repr()
        if tensor.requires_grad:
            record["requires_grad"] = True
        if isinstance(tensor, torch.nn.Parameter):
            record["parameter"] = True
        if not data.is_contiguous():
            record["stride"] = list(data.stride())
        self.tensors[key] = data.cpu().contiguous()
        self._records[id(tensor)] = record
        self._keep_alive.append(tensor)
        return record

    def _quantization(self, tensor: torch.Tensor, key: str) -> dict[str, Any]:
        scheme = tensor.qscheme()
        if scheme in _PER_TENSOR:
            return {
                "qscheme": encode_value(scheme),
                "scale": tensor.q_scale(),
                "zero_point": tensor.q_zero_point(),
            }
        if scheme in _PER_CHANNEL:
            self.tensors[f"{key}.scales"] = tensor.q_per_channel_scales().contiguous()
            self.tensors[f"{key}.zero_points"] = tensor.q_per_channel_zero_points().contiguous()
            return {"qscheme": encode_value(scheme), "axis": tensor.q_per_channel_axis()}
        raise SerializationError(f"cannot save a tensor quantized with {scheme}")

    def blob(self) -> bytes:
        from safetensors.torch import save

        return save(self.tensors) if self.tensors else b""


class TensorReader:
    """Tensors by record, from the safetensors bytes of a file (or the tensors
    ``read_safetensors`` already read from it); each is checked against its record."""

    def __init__(self, blob: bytes | dict[str, torch.Tensor]) -> None:
        self._raw: dict[str, torch.Tensor] = {}
        if isinstance(blob, dict):
            self._raw = blob
        elif blob:
            from safetensors import SafetensorError
            from safetensors.torch import load

            try:
                self._raw = load(blob)
            except (SafetensorError, ValueError, RuntimeError, OverflowError) as e:
                raise SerializationError(f"the weights are damaged (safetensors: {e})") from None
        self._built: dict[str, torch.Tensor] = {}

    def get(self, record: Any, where: str) -> torch.Tensor:
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            raise SerializationError(f"{where}: a tensor record must name its key")
        key = record["key"]
        if key not in self._built:
            self._built[key] = self._build(record, where)
        return self._built[key]

    def _build(self, record: dict[str, Any], where: str) -> torch.Tensor:
        key = record["key"]
        data = self._raw.get(key)
        if data is None:
            raise SerializationError(f"{where}: the tensor {key!r} is missing from the weights")
        shape = decode_value({"size": record.get("shape")}, where=where)
        dtype = decode_value(record.get("dtype"), where=where)
        if not isinstance(dtype, torch.dtype):
            raise SerializationError(f"{where}: {record.get('dtype')!r} is not a dtype")
        quantized = record.get("quantized")
        stored_dtype = _integer_dtype(dtype, where) if quantized is not None else dtype
        if data.shape != shape or data.dtype != stored_dtype:
            raise SerializationError(
                f"{where}: the weights hold a {data.dtype} tensor of shape {list(data.shape)} "
                f"where the description says {stored_dtype} of shape {list(shape)}"
            )
        if quantized is not None:
            data = self._quantize(data, quantized, key, dtype, where)
        stride = record.get("stride")
        if stride is not None:
            data = _restrided(data, stride, where)
        if record.get("parameter"):
            return torch.nn.Parameter(data, requires_grad=bool(record.get("requires_grad")))
        return data.requires_grad_() if record.get("requires_grad") else data

    def _quantize(
        self, values: torch.Tensor, q: Any, key: str, dtype: torch.dtype, where: str
    ) -> torch.Tensor:
        if not isinstance(q, dict):
            raise SerializationError(f"{where}: invalid quantization record")
        scheme = decode_value(q.get("qscheme"), where=where)
        try:
            if scheme in _PER_TENSOR:
                scale, zero_point = q.get("scale"), q.get("zero_point")
                if not isinstance(scale, float) or type(zero_point) is not int:
                    raise SerializationError(f"{where}: invalid scale or zero point")
                return torch._make_per_tensor_quantized_tensor(values, scale, zero_point)
            if scheme in _PER_CHANNEL:
                scales = self._raw.get(f"{key}.scales")
                zero_points = self._raw.get(f"{key}.zero_points")
                axis = q.get("axis")
                if scales is None or zero_points is None or type(axis) is not int:
                    raise SerializationError(f"{where}: per-channel parameters are missing")
                return torch._make_per_channel_quantized_tensor(values, scales, zero_points, axis)
        except (RuntimeError, IndexError) as e:
            raise SerializationError(f"{where}: invalid quantization parameters: {e}") from None
        raise SerializationError(f"{where}: unknown quantization scheme {q.get('qscheme')!r}")


_INTEGER_OF_QUANTIZED = {
    torch.qint8: torch.int8,
    torch.quint8: torch.uint8,
    torch.qint32: torch.int32,
}


def _integer_dtype(dtype: torch.dtype, where: str) -> torch.dtype:
    if dtype not in _INTEGER_OF_QUANTIZED:
        raise SerializationError(f"{where}: {dtype} is not a quantized dtype")
    return _INTEGER_OF_QUANTIZED[dtype]


def _restrided(data: torch.Tensor, stride: Any, where: str) -> torch.Tensor:
    """``data`` laid out with ``stride``, which must be a dense layout of its shape
    (channels-last, a transpose): a permutation of the contiguous strides."""
    shape = data.shape
    if (
        not isinstance(stride, list)
        or len(stride) != data.dim()
        or not all(type(s) is int and s >= 0 for s in stride)
    ):
        raise SerializationError(f"{where}: invalid stride {stride!r}")
    expected = 1
    for dim in sorted(range(len(stride)), key=lambda d: stride[d]):
        if shape[dim] > 1 and stride[dim] != expected:
            raise SerializationError(
                f"{where}: stride {stride} is not a dense layout of {list(shape)}"
            )
        expected *= shape[dim]
    return torch.empty_strided(shape, stride, dtype=data.dtype).copy_(data)


# ------------------------------------------------------------------ reading in place
# safetensors' dtype names (its format specification) and the torch dtypes they hold.
_SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
}
_MAX_HEADER_BYTES = 100 * 2**20


def read_safetensors(f: IO[bytes], start: int, size: int) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors blob at ``start`` of the open file ``f`` (``size`` bytes).

    Each tensor's bytes are read straight into its own memory, as ``torch.load`` reads a
    storage: no copy of the whole blob is made (for a 100 MB model that copy, and the page
    faults of one 100 MB buffer, cost more than the rest of loading). The header is checked as
    safetensors checks it: known dtypes, offsets inside the data, sizes matching the shapes.
    """
    if size == 0:
        return {}
    header = _safetensors_header(f, start, size)
    data_start = start + 8 + header.pop("__header_bytes__")
    data_size = size - (data_start - start)
    tensors = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        dtype, shape, begin, end = _checked_entry(key, entry, data_size)
        buffer = torch.empty(end - begin, dtype=torch.uint8)
        if end > begin:
            f.seek(data_start + begin)
            view = (ctypes.c_ubyte * (end - begin)).from_address(buffer.data_ptr())
            if f.readinto(view) != end - begin:
                raise SerializationError(
                    f"the weights are damaged: the tensor {key!r} is cut short"
                )
        tensors[key] = buffer.view(dtype).reshape(shape)
    return tensors


def _safetensors_header(f: IO[bytes], start: int, size: int) -> dict[str, Any]:
    f.seek(start)
    length = int.from_bytes(f.read(8), "little") if size >= 8 else -1
    if not 0 <= length <= min(size - 8, _MAX_HEADER_BYTES):
        raise SerializationError("the weights are damaged: invalid safetensors header length")
    try:
        header = json.loads(f.read(length))
    except (ValueError, RecursionError):
        raise SerializationError("the weights are damaged: invalid safetensors header") from None
    if not isinstance(header, dict):
        raise SerializationError("the weights are damaged: invalid safetensors header")
    header["__header_bytes__"] = length
    return header


def _checked_entry(key: str, entry: Any, data_size: int) -> tuple[torch.dtype, list[int], int, int]:
    damaged = f"the weights are damaged: invalid safetensors entry for {key!r}"
    if not isinstance(entry, dict):
        raise SerializationError(damaged)
    dtype = _SAFETENSORS_DTYPES.get(entry.get("dtype"))
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if (
        dtype is None
        or not isinstance(shape, list)
        or not all(type(n) is int and n >= 0 for n in shape)
        or not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(n) is int for n in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise SerializationError(damaged)
    if offsets[1] > data_size:
        raise SerializationError(
            f"the weights are damaged: the tensor {key!r} lies past the end of the data "
            f"({offsets[1]} > {data_size} bytes; the file is cut short?)"
        )
    numel = 1
    for n in shape:
        numel *= n
    if offsets[1] - offsets[0] != numel * dtype.itemsize:
        raise SerializationError(f"{damaged}: its size disagrees with its shape")
    return dtype, shape, offsets[0], offsets[1]
