"""Tensors in a saved file: bytes in one safetensors blob, described by JSON records.

A record says where a tensor's bytes are (``key``) and what it must be
(``shape``, ``dtype``, ``device``, ``requires_grad``; ``stride`` when it is not
contiguous; ``quantized`` with its quantization parameters for int8
tensors, whose integer values are stored). The bytes are stored from the CPU;
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

__all__ = ["TensorWriter", "TensorReader", "PER_CHANNEL", "PER_TENSOR", "check_scales"]

PER_TENSOR = (torch.per_tensor_affine, torch.per_tensor_symmetric)
PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_symmetric)


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
        if scheme in PER_TENSOR:
            return {
                "qscheme": encode_value(scheme),
                "scale": tensor.q_scale(),
                "zero_point": tensor.q_zero_point(),
            }
        if scheme in PER_CHANNEL:
            self.tensors[f"{key}.scales"] = tensor.q_per_channel_scales().contiguous()
            self.tensors[f"{key}.zero_points"] = tensor.q_per_channel_zero_points().contiguous()
            return {"qscheme": encode_value(scheme), "axis": tensor.q_per_channel_axis()}
        raise SerializationError(f"cannot save a tensor quantized with {scheme}")


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
        stride = record.get("stride")
        if stride is not None:  # the integer values of a quantized tensor are laid out first
            data = _restrided(data, stride, where)
        if quantized is not None:
            data = self._quantize(data, quantized, key, dtype, where)
        return data

    def _quantize(
        self, values: torch.Tensor, q: Any, key: str, dtype: torch.dtype, where: str
    ) -> torch.Tensor:
        if not isinstance(q, dict):
            raise SerializationError(f"{where}: invalid quantization record")
        scheme = decode_value(q.get("qscheme"), where=where)
        if scheme in PER_TENSOR:
            scale, zero_point = q.get("scale"), q.get("zero_point")
            if not isinstance(scale, float) or type(zero_point) is not int:
                raise SerializationError(f"{where}: invalid scale or zero point")
            check_scales(torch.tensor([scale]), torch.tensor([zero_point]), dtype, where)
            try:  # keeps the layout of ``values`` (channels-last, a transpose)
                return torch._make_per_tensor_quantized_tensor(values, scale, zero_point)
            except RuntimeError as e:
                raise SerializationError(f"{where}: invalid quantization parameters: {e}") from None
        if scheme in PER_CHANNEL:
            scales, zero_points, axis = self._per_channel(values, q, key, dtype, where)
            return _per_channel_tensor(values, scales, zero_points, axis, where)
        raise SerializationError(f"{where}: unknown quantization scheme {q.get('qscheme')!r}")

    def _per_channel(
        self, values: torch.Tensor, q: dict, key: str, dtype: torch.dtype, where: str
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The scales, zero points and axis of a per-channel tensor: one of each per channel
        (torch accepts fewer, and reads past them)."""
        scales = self._raw.get(f"{key}.scales")
        zero_points = self._raw.get(f"{key}.zero_points")
        axis = q.get("axis")
        if scales is None or zero_points is None or type(axis) is not int:
            raise SerializationError(f"{where}: per-channel parameters are missing")
        if not 0 <= axis < values.dim():
            raise SerializationError(
                f"{where}: the quantization axis {axis} is not a dimension of a "
                f"{values.dim()}-d tensor"
            )
        channels = values.shape[axis]
        for name, t, kinds in (
            ("scales", scales, (torch.float64, torch.float32)),
            ("zero points", zero_points, (torch.int64, torch.int32)),
        ):
            if t.dim() != 1 or t.numel() != channels or t.dtype not in kinds:
                raise SerializationError(
                    f"{where}: {t.numel()} {name} ({t.dtype}) for {channels} channels along "
                    f"axis {axis}; there must be one per channel"
                )
        check_scales(scales, zero_points, dtype, where)
        return scales, zero_points, axis


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
