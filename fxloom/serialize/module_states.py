"""The module classes whose state is more than attributes and tensors: how each is saved.

``modules.MODULE_STATES`` gets one row per such class (``modules`` imports this file, so the
rows are there whenever a module tree is written or read):

* torch's quantized layers (``torch.ao.nn.quantized``, its ``dynamic`` and ``intrinsic``
  variants: what ``fxloom.quantize.convert`` swaps in) hold their weights packed for the
  quantized engine, in ``torch.ScriptObject``s that cannot be written as data. Their int8
  weight (with its scales) and float bias are written as tensors instead, and packed again on
  loading with the layer's own ``set_weight_bias``, for the engine current then. Linear
  layers keep theirs in a ``LinearPackedParams`` child (so ``fxloom.quantize``'s
  ``LinearFloatIO`` is covered too); convolutions and dynamic LSTM/GRU hold them directly.
* ``fxloom.lower``'s ``OrtModule`` (a region running in ONNX Runtime): its ONNX model, which
  is data (a protobuf), is written as a uint8 tensor with the region's calling convention;
  loading checks the model (``onnx_regions``: no external data, no custom operators; that
  needs the onnx package) and makes the module again without starting a session, which it
  starts on its first call, with fxloom's session options, never the file's.
* What ``fxloom.quantize.prepare`` inserts (observers, fake quantization, QAT layers) is
  refused: a prepared model's quantization plan lives in its ``meta`` and is not saved, so a
  loaded copy could not be converted. Convert first, then save the int8 model.

Classes of fxloom's higher layers (``fxloom.lower``, ``fxloom.quantize``) are keyed by their
qualified names, so that this package never imports them. Loading rebuilds a module from
the file's values only: no pickle, and nothing but torch's packing functions runs on them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq
import torch.ao.nn.quantized.dynamic as nnqd
from torch import nn
from torch.ao.nn.quantized.modules.conv import _ConvNd
from torch.ao.nn.quantized.modules.linear import LinearPackedParams

from fxloom.serialize import allowlist, onnx_regions
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.modules import (
    _MODULE_INTERNALS,
    MODULE_STATES,
    REBUILT_HOOKS,
    ModuleState,
    _check_attribute,
    _refuse_hooks,
)
from fxloom.serialize.tensors import TensorReader, TensorWriter
from fxloom.serialize.values import decode_spec, decode_value, encode_spec, encode_value, short

__all__: list[str] = []

# The engines whose packed weights fxloom.quantize's float-in/float-out layers run on.
_FLOAT_IO_ENGINES = ("x86", "fbgemm")


# ------------------------------------------------------------ plain attributes
def _save_attributes(module: nn.Module, packed: frozenset[str], where: str) -> dict[str, Any]:
    """The module's plain attributes as data; its packed weights (``packed``) are written apart."""
    if module._parameters or module._buffers:
        raise SerializationError(f"cannot save {where}: it has parameters or buffers of its own")
    left = set(module._modules) - packed
    if left:
        raise SerializationError(f"cannot save {where}: unexpected submodules {sorted(left)}")
    return {
        name: encode_value(value, f"{where}.{name}")
        for name, value in module.__dict__.items()
        if name not in _MODULE_INTERNALS and name not in packed
    }


def _empty_with_attributes(cls: type, data: Any, where: str) -> nn.Module:
    """An instance of ``cls`` made without ``__init__``, holding the attributes in ``data``."""
    attributes = _field(data, "attributes", dict, where)
    module = cls.__new__(cls)
    nn.Module.__init__(module)
    for name, value in attributes.items():
        _check_attribute(cls, name, where)
        module.__dict__[name] = decode_value(value, None, f"{where}.{name}")
    return module


def _field(data: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(data, dict) or not isinstance(data.get(key), kind):
        raise SerializationError(f"{where}: the module's state needs {key!r} ({kind.__name__})")
    return data[key]


def _optional_tensor(reader: TensorReader, record: Any, where: str) -> torch.Tensor | None:
    return None if record is None else reader.get(record, where)


@contextlib.contextmanager
def _repacking(where: str) -> Iterator[None]:
    """Packing errors (a weight of the wrong dtype or shape for the layer) as SerializationError."""
    try:
        yield
    except (RuntimeError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise SerializationError(f"{where}: cannot pack the saved weights: {e}") from None


# --------------------------------------------------- quantized linear weights
def _save_linear_packed(module: nn.Module, writer: TensorWriter, where: str) -> dict[str, Any]:
    weight, bias = module._weight_bias()
    return {
        "dtype": encode_value(module.dtype),
        "weight": writer.add(weight, f"{where}.weight"),
        "bias": None if bias is None else writer.add(bias, f"{where}.bias"),
    }


def _load_linear_packed(data: Any, reader: TensorReader, where: str) -> nn.Module:
    dtype = decode_value(_field(data, "dtype", dict, where), where=where)
    if dtype not in (torch.qint8, torch.float16):
        raise SerializationError(
            f"{where}: packed linear weights are qint8 or float16, not {dtype}"
        )
    module = LinearPackedParams.__new__(LinearPackedParams)
    nn.Module.__init__(module)
    module.dtype = dtype
    weight = reader.get(data.get("weight"), f"{where}.weight")
    with _repacking(where):
        module.set_weight_bias(weight, _optional_tensor(reader, data.get("bias"), f"{where}.bias"))
    return module


def _repack_for_float_io(module: nn.Module) -> None:
    """``LinearFloatIO``'s kernel needs weights packed by x86/FBGEMM, whatever the engine now."""
    engine = torch.backends.quantized.engine
    if engine in _FLOAT_IO_ENGINES or "x86" not in torch.backends.quantized.supported_engines:
        return
    packed = module._modules["_packed_params"]  # its dictionary: no attribute lookup
    weight, bias = packed._weight_bias()
    torch.backends.quantized.engine = "x86"
    try:
        packed.set_weight_bias(weight, bias)
    finally:
        torch.backends.quantized.engine = engine


# ------------------------------ quantized convolutions and dynamic LSTM/GRU
def _weight_bias_state(cls: type, packed: str) -> ModuleState:
    """Layers with ``_weight_bias()`` and ``set_weight_bias(weight, bias)`` (convolutions)."""

    def save(module: nn.Module, writer: TensorWriter, where: str) -> dict[str, Any]:
        weight, bias = module._weight_bias()
        return {
            "attributes": _save_attributes(module, frozenset({packed}), where),
            "weight": writer.add(weight, f"{where}.weight"),
            "bias": None if bias is None else writer.add(bias, f"{where}.bias"),
        }

    def load(data: Any, reader: TensorReader, where: str) -> nn.Module:
        module = _empty_with_attributes(cls, data, where)
        weight = reader.get(data.get("weight"), f"{where}.weight")
        bias = _optional_tensor(reader, data.get("bias"), f"{where}.bias")
        with _repacking(where):
            module.set_weight_bias(weight, bias)
        return module

    return ModuleState(save, load)


def _rnn_state(cls: type) -> ModuleState:
    """Dynamic LSTM/GRU: one packed cell per layer and direction, from named weights and biases."""

    def save(module: nn.Module, writer: TensorWriter, where: str) -> dict[str, Any]:
        with _repacking(where):
            tensors = module._weight_bias()
        named = {**tensors["weight"], **tensors["bias"]}
        return {
            "attributes": _save_attributes(module, frozenset({"_all_weight_values"}), where),
            "weights": {
                name: None if t is None else writer.add(t, f"{where}.{name}")
                for name, t in named.items()
            },
        }

    def load(data: Any, reader: TensorReader, where: str) -> nn.Module:
        module = _empty_with_attributes(cls, data, where)
        weights = {
            name: _optional_tensor(reader, record, f"{where}.{name}")
            for name, record in _field(data, "weights", dict, where).items()
        }
        with _repacking(where):
            module.set_weight_bias(weights)
        return module

    return ModuleState(save, load)


def _subclasses(base: type, *namespaces: Any) -> list[type]:
    return [
        cls
        for namespace in namespaces
        for cls in vars(namespace).values()
        if isinstance(cls, type) and issubclass(cls, base)
    ]


# ---------------------------------------------------------- ONNX Runtime regions
ORT_MODULE = "fxloom.lower.runtime.OrtModule"
# What a file says of a region: OrtModule's keyword arguments that describe the model's
# calling convention, each with the type its value must have.
_ORT_SETTINGS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "scalar_outputs": (tuple,),
    "constant_outputs": (dict,),
    "output_layouts": (dict,),
    "fixed_inputs": (dict,),
}
# Session options are the machine's business, never the file's: a loaded region runs with
# OrtModule's defaults (intra-op threads: torch's thread count, at most the cores). Files
# written before this still hold them: checked for type, then not used.
_CORES = os.cpu_count() or 1
_ORT_SESSION_OPTIONS: dict[str, tuple[type, ...]] = {
    "intra_op_num_threads": (int, type(None)),
    "inter_op_num_threads": (int,),
    "graph_optimization_level": (str,),
    "allow_spinning": (bool,),
}


def _save_ort(module: nn.Module, writer: TensorWriter, where: str) -> dict[str, Any]:
    model = bytes(module.model_bytes)
    onnx_regions.check_onnx_model(model, where)  # what loading would refuse is not written
    data = (
        torch.frombuffer(bytearray(model), dtype=torch.uint8)
        if model
        else torch.empty(0, dtype=torch.uint8)
    )
    record = {
        "onnx_model": writer.add(data, f"{where}.model_bytes"),
        "output_spec": encode_spec(module.output_spec),
        "settings": {
            name: encode_value(vars(module)[name], f"{where}.{name}") for name in _ORT_SETTINGS
        },
    }
    _ort_settings(record["settings"], module.output_spec.num_leaves, where)
    return record


def _load_ort(data: Any, reader: TensorReader, where: str) -> nn.Module:
    model = reader.get(
        _field(data, "onnx_model", dict, where), f"{where}.model_bytes", data_on_cpu=True
    )
    if model.dtype != torch.uint8 or model.dim() != 1:
        raise SerializationError(f"{where}: the ONNX model must be a 1-d uint8 tensor")
    model_bytes = model.numpy().tobytes()
    onnx_regions.check_onnx_model(model_bytes, where)
    spec = decode_spec(data.get("output_spec"), f"{where}.output_spec")
    settings = _ort_settings(_field(data, "settings", dict, where), spec.num_leaves, where)
    cls = allowlist.resolve_module_class(ORT_MODULE)
    try:  # the session is made on the first call, not here
        return cls(model_bytes, output_spec=spec, **settings)
    except ValueError as e:
        raise SerializationError(f"{where}: {e}") from None


def _ort_settings(saved: dict, outputs: int, where: str) -> dict[str, Any]:
    """The region's settings from a file's, each checked; session options left out."""
    settings = {}
    for name, value in saved.items():
        kinds = _ORT_SETTINGS.get(name) or _ORT_SESSION_OPTIONS.get(name)
        if kinds is None:
            raise SerializationError(f"{where}: OrtModule has no setting {name!r}")
        decoded = decode_value(value, None, f"{where}.{name}")
        if not isinstance(decoded, kinds):
            raise SerializationError(f"{where}: {name} cannot be {short(value)}")
        if name.endswith("_threads") and decoded is not None and not 0 <= decoded <= _CORES:
            # Never used, but no file fxloom wrote asked for more threads than cores.
            raise SerializationError(
                f"{where}: {name}={decoded} is more threads than this machine's {_CORES} cores"
            )
        if name in _ORT_SETTINGS:
            settings[name] = decoded
    positions = [
        *settings.get("scalar_outputs", ()),
        *settings.get("constant_outputs", {}),
        *settings.get("output_layouts", {}),
    ]
    if not all(type(p) is int and 0 <= p < outputs for p in positions):
        raise SerializationError(
            f"{where}: scalar, constant and laid-out outputs must be positions among its "
            f"{outputs} outputs"
        )
    if not all(type(p) is int and p >= 0 for p in settings.get("fixed_inputs", {})):
        raise SerializationError(f"{where}: fixed inputs must be argument positions")
    return settings


# ------------------------------------------------ what prepare() inserts: refused
def _refused(what: str) -> ModuleState:
    why = (
        f"it is {what}, which fxloom.quantize.prepare and prepare_qat insert; a prepared "
        "model's quantization plan is not saved, so a loaded copy could not be converted. "
        "Call fxloom.quantize.convert(prepared) first and save the int8 model it returns"
    )

    def save(module: nn.Module, writer: TensorWriter, where: str) -> Any:
        raise SerializationError(f"cannot save {where} ({type(module).__qualname__}): {why}")

    def load(data: Any, reader: TensorReader, where: str) -> nn.Module:
        raise SerializationError(f"{where}: the file holds {what}, which fxloom does not load")

    return ModuleState(save, load)


# ------------------------------------------------------------------- the rows
_ROWS: dict[type | str, ModuleState] = {
    LinearPackedParams: ModuleState(_save_linear_packed, _load_linear_packed),
    **{
        cls: _weight_bias_state(cls, "_packed_params")
        for cls in _subclasses(_ConvNd, nnq, nniq, nnqd)
    },
    nnqd.LSTM: _rnn_state(nnqd.LSTM),
    nnqd.GRU: _rnn_state(nnqd.GRU),
    ORT_MODULE: ModuleState(_save_ort, _load_ort),
    "fxloom.quantize.observers.Observer": _refused("an observer"),
    "fxloom.quantize.fake_quantize.FakeQuantize": _refused("a fake-quantize module"),
    "fxloom.quantize.qat_modules.QATModule": _refused("a quantization-aware training layer"),
}


def _refusing_hooks(state: ModuleState) -> ModuleState:
    """``state`` that first refuses a module with hooks (Python code), as the generic path does."""

    def save(module: nn.Module, writer: TensorWriter, where: str) -> Any:
        _refuse_hooks(module, type(module), where)
        return state.save(module, writer, where)

    return ModuleState(save, state.load)


MODULE_STATES.update({key: _refusing_hooks(state) for key, state in _ROWS.items()})

_REBUILT: dict[type | str, Callable[[nn.Module], None]] = {
    "fxloom.quantize.table.LinearFloatIO": _repack_for_float_io,
}
REBUILT_HOOKS.update(_REBUILT)
