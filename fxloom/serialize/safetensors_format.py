"""The safetensors format, read and written by fxloom without extra copies.

The format is small: an 8-byte little-endian header length, a JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` padded with spaces,
then the data. Files written here load with the ``safetensors`` library too.

* ``write_tensors`` streams each tensor's bytes straight from its memory into the
  file (the library would first build the whole blob in memory); tensors are laid
  out widest element first, so each one's offset is a multiple of its element size.
* ``read_tensors`` allocates each tensor once and reads its bytes from the file
  into it (``readinto``), as unpickling does: one copy, and allocations of tensor
  size, which the allocator recycles across loads. Every header entry is checked
  (a printable name, known dtype, non-negative shape, offsets inside the data, byte
  length equal to the shape's, no two tensors sharing bytes) before anything is read, the header
  is parsed strictly (``strict_json``: a key given twice is refused), and the
  header's size and number of tensors are bounded (``limits``), so the memory
  allocated is at most the member's size; anything else is a ``SerializationError``.
"""

from __future__ import annotations

import ctypes
import json
import math
from typing import IO, Any

import torch

from fxloom.serialize import limits
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.strict_json import parse_json

__all__ = ["read_tensors", "write_tensors"]

# safetensors' dtype names.
DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def read_tensors(f: IO[bytes], start: int, size: int) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors blob at ``[start, start + size)`` of the file ``f``."""
    header, data_start, data_length = _read_header(f, start, size)
    entries = [
        (name, *_entry(name, entry, data_length))
        for name, entry in header.items()
        if name != "__metadata__"
    ]
    entries.sort(key=lambda e: e[3])
    _check_disjoint(entries)
    tensors = {}
    for name, dtype, shape, begin, end in entries:
        tensor = _empty(name, shape, dtype)
        if end > begin:
            f.seek(data_start + begin)
            target = (ctypes.c_ubyte * (end - begin)).from_address(tensor.data_ptr())
            if f.readinto(target) != end - begin:
                raise SerializationError(f"the weights are truncated (in tensor {name!r})")
        tensors[name] = tensor
    return tensors


def _read_header(f: IO[bytes], start: int, size: int) -> tuple[dict, int, int]:
    """The JSON header of the blob, where its data starts and how long the data is."""
    f.seek(start)
    head = f.read(8)
    if size < 8 or len(head) != 8:
        raise SerializationError("the weights are truncated (no safetensors header)")
    header_length = int.from_bytes(head, "little")
    if header_length > limits.MAX_SAFETENSORS_HEADER_BYTES:
        raise limits.exceeded(
            "the weights' header", limits.MAX_SAFETENSORS_HEADER_BYTES, f"{header_length:,} bytes"
        )
    if header_length > size - 8:
        raise SerializationError(
            f"the weights are truncated or damaged: their header claims {header_length} bytes"
        )
    raw_header = f.read(header_length)
    # One object per tensor (and one for __metadata__), counted before any is built.
    if raw_header.count(b"{") > limits.MAX_TENSORS + 2:
        raise limits.exceeded(
            "the weights' tensors", limits.MAX_TENSORS, f"about {raw_header.count(b'{'):,}"
        )
    header = parse_json(raw_header, "the weights' header")
    if not isinstance(header, dict):
        raise SerializationError("the weights' header must be a JSON object")
    if len(header) > limits.MAX_TENSORS + 1:
        raise limits.exceeded("the weights' tensors", limits.MAX_TENSORS, len(header))
    return header, start + 8 + header_length, size - 8 - header_length


def _check_disjoint(entries: list) -> None:
    """No two tensors share bytes (``entries`` sorted by where they begin): so the tensors
    allocated add up to at most the data's size, however many there are."""
    end_so_far, previous = 0, None
    for name, _, _, begin, end in entries:
        if begin < end_so_far:
            raise SerializationError(
                f"the weights' tensors {previous!r} and {name!r} overlap; refused"
            )
        if end > begin:
            end_so_far, previous = end, name


def _empty(name: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    try:
        return torch.empty(shape, dtype=dtype)
    except RuntimeError as e:  # sizes whose strides overflow (a zero among huge dimensions)
        raise SerializationError(f"the weights' tensor {name!r}: {e}") from None


def _entry(name: str, entry: Any, data_length: int) -> tuple[torch.dtype, list[int], int, int]:
    where = f"the weights' tensor {name!r}"
    if not name.isprintable():
        # A name is a key the records refer to, and error messages quote it: one that holds
        # an escape sequence or a bidi override is no name fxloom writes.
        raise SerializationError(f"{where}: its name holds a control or format character")
    if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES:
        raise SerializationError(f"{where} has no known dtype")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise SerializationError(f"{where} has an invalid shape {shape!r}")
    if len(shape) > limits.MAX_TENSOR_DIMENSIONS:
        most = limits.MAX_TENSOR_DIMENSIONS
        raise limits.exceeded(f"the dimensions of {where}", most, len(shape))
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_length
    ):
        raise SerializationError(f"{where} lies outside the weights (truncated file?)")
    dtype = DTYPES[entry["dtype"]]
    if math.prod(shape) * dtype.itemsize != offsets[1] - offsets[0]:
        raise SerializationError(f"{where}: its shape {shape} does not match its byte length")
    return dtype, shape, offsets[0], offsets[1]


_NAME_OF_DTYPE = {dtype: name for name, dtype in DTYPES.items()}


def write_tensors(out: IO[bytes], tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` (contiguous, on the CPU) to ``out`` in the safetensors format."""
    order = sorted(tensors, key=lambda name: -tensors[name].element_size())
    header: dict[str, Any] = {}
    offset = 0
    for name in order:
        tensor = tensors[name]
        if tensor.dtype not in _NAME_OF_DTYPE:
            raise SerializationError(f"cannot save the tensor {name}: dtype {tensor.dtype}")
        length = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _NAME_OF_DTYPE[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + length],
        }
        offset += length
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)  # the data starts 8-byte aligned
    out.write(len(text).to_bytes(8, "little"))
    out.write(text)
    for name in order:
        tensor = tensors[name]
        length = tensor.numel() * tensor.element_size()
        if length:
            out.write(memoryview((ctypes.c_ubyte * length).from_address(tensor.data_ptr())))
