"""Tensors in a saved file: bytes in one safetensors blob, described by JSON records.

A record says where a tensor's bytes are (``key``) and what it must be
(``shape``, ``dtype``, ``device``, ``requires_grad``; ``stride`` when it is not
contiguous). Every tensor a file holds is a plain one: integers, floats, booleans. A
torch quantized tensor (torch.ao's layers and graphs, ``kernels="torch.ao"``) is written
in plain form: its integer values (int8, uint8, int32) under ``key``, a record entry
``"affine": {"axis": null}`` (per tensor) or ``{"axis": 0}`` (per channel), and its
scales and zero points as float64 and int64 tensors under ``key + ".scale"`` and
``key + ".zero_point"`` (0-d per tensor, one per channel along ``axis``). Loading rebuilds
torch's quantized tensor from them, for what holds it takes nothing else (a torch.ao
layer packs it, a graph calls ``dequantize`` on it). Format version 2's quantized-tensor
records (a quantized ``dtype`` and a ``quantized`` entry) load through the converter of
``quantized_records``; a current file holding one is refused.

The bytes are stored from the CPU;
loading puts the tensor on its recorded device or where ``map_location`` says
(``devices``); a record without a device (format version 1) is a CPU tensor. Loading checks every record
against the bytes, so a file whose tensors disagree with its description is
refused rather than loaded wrong. A tensor reached from several places (tied
weights) is stored once and shared again on loading.
"""

from __future__ import annotations

from typing import Any

import torch

from fxloom.serialize.devices import CPU, Placement, parse_device
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.values import decode_value, encode_value

__all__ = [
    "TensorWriter",
    "TensorReader",
    "PER_CHANNEL",
    "PER_TENSOR",
    "QUANTIZED_OF_INTEGER",
    "SCALE",
    "ZERO_POINT",
    "check_scales",
]

PER_TENSOR = (torch.per_tensor_affine, torch.per_tensor_symmetric)
PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_symmetric)
# Where a plain-form quantized tensor's parameters are stored: after its values' key.
SCALE, ZERO_POINT = ".scale", ".zero_point"
# The quantized dtype torch rebuilds from each integer dtype of values (its ``int_repr``).
QUANTIZED_OF_INTEGER = {
    torch.int8: torch.qint8,
    torch.uint8: torch.quint8,
    torch.int32: torch.qint32,
}


class TensorWriter:
    """Collects tensors while a module is written; ``tensors`` is what the file's weights hold."""

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
            "device": str(tensor.device),
        }
        data = tensor.detach()
        if tensor.is_quantized:
            data = tensor.int_repr()  # the plain form: integers, scales and zero points
            record["dtype"] = encode_value(data.dtype)
            record["affine"] = self._parameters(tensor, key, where)
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

    def _parameters(self, tensor: torch.Tensor, key: str, where: str) -> dict[str, Any]:
        """A quantized tensor's scales and zero points, stored as plain tensors after its
        values; its record's ``affine`` entry (the axis of per-channel ones)."""
        scheme = tensor.qscheme()
        if scheme in PER_TENSOR:
            scale = torch.tensor(tensor.q_scale(), dtype=torch.float64)
            zero_point = torch.tensor(tensor.q_zero_point(), dtype=torch.int64)
            axis = None
        elif scheme in PER_CHANNEL:
            scale = tensor.q_per_channel_scales().to(torch.float64).contiguous()
            zero_point = tensor.q_per_channel_zero_points().to(torch.int64).contiguous()
            axis = tensor.q_per_channel_axis()
        else:
            raise SerializationError(
                f"cannot save the tensor {where}: it is quantized with {scheme}, which fxloom "
                "files do not hold (per tensor or per channel affine only)"
            )
        self.tensors[key + SCALE], self.tensors[key + ZERO_POINT] = scale.cpu(), zero_point.cpu()
        return {"axis": axis}


class TensorReader:
    """Tensors by record, from a file's weights; each is checked against its record."""

    def __init__(
        self, weights: dict[str, torch.Tensor], placement: Placement | None = None
    ) -> None:
        self._raw = weights  # as the archive read them: by key
        self._placement = placement or Placement()
        self._read: dict[str, torch.Tensor] = {}  # on the CPU, as the file holds them
        self._built: dict[str, torch.Tensor] = {}  # on their devices
        self._records: dict[str, dict[str, Any]] = {}

    def get(self, record: Any, where: str, *, data_on_cpu: bool = False) -> torch.Tensor:
        """The tensor of ``record``, on its device; ``data_on_cpu`` for bytes that are data, not
        a model's tensor (an ONNX model), which stay on the CPU whatever ``map_location`` says."""
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            raise SerializationError(f"{where}: a tensor record must name its key")
        key = record["key"]
        if key not in self._records:
            self._read[key] = self._build(record, where)
            self._records[key] = record
        elif record != self._records[key]:
            # A tied tensor is written as the same record; a second description of the same
            # bytes would otherwise skip the checks against them.
            raise SerializationError(
                f"{where}: the tensor {key!r} is described twice, differently; refused"
            )
        if data_on_cpu:
            return self._read[key]
        if key not in self._built:
            self._built[key] = self._placed(self._read[key], record, where)
        return self._built[key]

    def _placed(self, data: torch.Tensor, record: dict[str, Any], where: str) -> torch.Tensor:
        """``data`` on the device it goes to, then a ``Parameter`` or requiring grad as saved."""
        saved = parse_device(record.get("device", CPU), f"{where}: device")
        data = self._placement.place(data, saved, where)
        if record.get("parameter"):
            return torch.nn.Parameter(data, requires_grad=bool(record.get("requires_grad")))
        return data.requires_grad_() if record.get("requires_grad") else data

    def _build(self, record: dict[str, Any], where: str) -> torch.Tensor:
        key = record["key"]
        data = self._raw.get(key)
        if data is None:
            raise SerializationError(f"{where}: the tensor {key!r} is missing from the weights")
        if "quantized" in record:
            raise SerializationError(
                f"{where}: the tensor {key!r} has a quantized-tensor record (format version 2); "
                "files of this version hold plain tensors only (integer values, scales and zero "
                "points: an 'affine' entry); refused"
            )
        shape = decode_value({"size": record.get("shape")}, where=where)
        dtype = decode_value(record.get("dtype"), where=where)
        if not isinstance(dtype, torch.dtype):
            raise SerializationError(f"{where}: {record.get('dtype')!r} is not a dtype")
        if dtype in _QUANTIZED_DTYPES:
            raise SerializationError(
                f"{where}: the tensor {key!r} is described as {dtype}; files hold plain "
                "tensors only (a quantized tensor as its integer values, scales and zero points)"
            )
        if data.shape != shape or data.dtype != dtype:
            raise SerializationError(
                f"{where}: the weights hold a {data.dtype} tensor of shape {list(data.shape)} "
                f"where the description says {dtype} of shape {list(shape)}"
            )
        stride = record.get("stride")
        if stride is not None:  # the integer values of a quantized tensor are laid out first
            data = _restrided(data, stride, where)
        affine = record.get("affine")
        if affine is not None:
            data = self._quantized(data, affine, key, where)
        return data

    def _quantized(self, values: torch.Tensor, affine: Any, key: str, where: str) -> torch.Tensor:
        """torch's quantized tensor of the plain form: ``values`` with the scales and zero
        points stored after them, per tensor (``axis`` null) or per channel along ``axis``."""
        if not isinstance(affine, dict) or set(affine) != {"axis"}:
            raise SerializationError(f"{where}: an 'affine' entry holds the axis only (or null)")
        dtype = QUANTIZED_OF_INTEGER.get(values.dtype)
        if dtype is None:
            raise SerializationError(
                f"{where}: a quantized tensor's values are int8, uint8 or int32, not {values.dtype}"
            )
        scales, zero_points = self._raw.get(key + SCALE), self._raw.get(key + ZERO_POINT)
        if scales is None or zero_points is None:
            raise SerializationError(
                f"{where}: the scales and zero points of {key!r} ({key + SCALE!r}, "
                f"{key + ZERO_POINT!r}) are missing from the weights"
            )
        axis = affine["axis"]
        if axis is None:
            _check_parameters(
                scales, zero_points, (), where, "a tensor; per tensor there is one, 0-d"
            )
            check_scales(scales, zero_points, dtype, where)
            try:  # keeps the layout of ``values`` (channels-last, a transpose)
                return torch._make_per_tensor_quantized_tensor(
                    values, float(scales), int(zero_points)
                )
            except RuntimeError as e:
                raise SerializationError(f"{where}: invalid quantization parameters: {e}") from None
        if type(axis) is not int or not 0 <= axis < values.dim():
            raise SerializationError(
                f"{where}: the quantization axis {axis!r} is not a dimension of a "
                f"{values.dim()}-d tensor"
            )
        channels = values.shape[axis]
        wanted = f"{channels} channels along axis {axis}; there must be one per channel"
        _check_parameters(scales, zero_points, (channels,), where, wanted)
        check_scales(scales, zero_points, dtype, where)
        return _per_channel_tensor(values, scales, zero_points, axis, where)


def _check_parameters(
    scales: torch.Tensor, zero_points: torch.Tensor, shape: tuple, where: str, wanted: str
) -> None:
    """Scales and zero points of ``shape`` (one per channel: torch accepts fewer, and reads
    past them; per tensor 0-d), of the dtypes torch keeps them in or float32/int32."""
    for name, t, kinds in (
        ("scales", scales, (torch.float64, torch.float32)),
        ("zero points", zero_points, (torch.int64, torch.int32)),
    ):
        if tuple(t.shape) != shape or t.dtype not in kinds:
            raise SerializationError(
                f"{where}: {t.numel()} {name} ({t.dtype}, shape {list(t.shape)}) for {wanted}"
            )


def check_scales(
    scales: torch.Tensor, zero_points: torch.Tensor, dtype: torch.dtype, where: str
) -> None:
    """Scales finite and positive, zero points representable in ``dtype``: what a quantized
    tensor's record and a quantized module's output parameters (``module_shapes``) must hold."""
    if not bool(torch.isfinite(scales).all()) or not bool((scales > 0).all()):
        raise SerializationError(f"{where}: quantization scales must be finite and positive")
    info = torch.iinfo(_INTEGER_OF_QUANTIZED[dtype])
    if not bool(((zero_points >= info.min) & (zero_points <= info.max)).all()):
        raise SerializationError(
            f"{where}: zero points must lie in [{info.min}, {info.max}] for {dtype}"
        )


def _per_channel_tensor(
    values: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor, axis: int, where: str
) -> torch.Tensor:
    """A per-channel tensor over ``values``, in their memory format: torch builds these
    contiguous only, and restrides them only by memory format (a channels-last conv weight)."""
    layout = _memory_format(values)
    if layout is None:
        raise SerializationError(
            f"{where}: a per-channel quantized tensor with strides {list(values.stride())} "
            "(only contiguous and channels-last layouts are possible)"
        )
    try:
        tensor = torch._make_per_channel_quantized_tensor(
            values.contiguous(), scales, zero_points, axis
        )
    except (RuntimeError, IndexError) as e:
        raise SerializationError(f"{where}: invalid quantization parameters: {e}") from None
    return tensor if layout is torch.contiguous_format else tensor.contiguous(memory_format=layout)


def _memory_format(t: torch.Tensor) -> torch.memory_format | None:
    """The memory format ``t`` is laid out in, or None where it is none of them."""
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    for layout in (torch.contiguous_format, formats.get(t.dim())):
        if layout is not None and t.is_contiguous(memory_format=layout):
            return layout
    return None


_INTEGER_OF_QUANTIZED = {
    torch.qint8: torch.int8,
    torch.quint8: torch.uint8,
    torch.qint32: torch.int32,
}


# torch's quantized dtypes: never a record's (their values are recorded as integers).
_QUANTIZED_DTYPES = frozenset(
    getattr(torch, name)
    for name in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
    if hasattr(torch, name)
)


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
