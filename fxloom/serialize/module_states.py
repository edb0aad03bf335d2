"""The module classes whose state is more than attributes and tensors: how each is saved.

``modules.MODULE_STATES`` gets one row per such class (``modules`` imports this file, so the
rows are there whenever a module tree is written or read):

* torch's quantized layers (``torch.ao.nn.quantized``, its ``dynamic`` and ``intrinsic``
  variants: what ``fxloom.quantize.convert`` swaps in) hold their weights packed for the
  quantized engine, in ``torch.ScriptObject``s that cannot be written as data. Their int8
  weight and float bias are written as plain tensors instead (the weight's integer values,
  scales and zero points: ``tensors``), and packed again on loading, from the quantized
  weight rebuilt of them, with the layer's own ``set_weight_bias``, for the engine current
  then. Linear
  layers keep theirs in a ``LinearPackedParams`` child (so ``fxloom.quantize``'s
  ``LinearFloatIO`` is covered too); convolutions and dynamic LSTM/GRU hold them directly.
* the modules backends make (``fxloom.lower``'s ``OrtModule``, a region running in ONNX
  Runtime) are written and read by their backend's rules (``Backend.saved_modules``, which
  ``backend_state`` finds in the registry and adapts: the backend gets its values written
  and read through ``StateWriter``/``StateReader`` and never imports this package; the
  ONNX Runtime rules are ``fxloom.lower.runtime_saving``'s);
* what ``fxloom.quantize.prepare`` inserts (observers, fake quantization, QAT layers) is
  refused: a prepared model's quantization plan lives in its ``meta`` and is not saved, so a
  loaded copy could not be converted. Convert first, then save the int8 model.
* torch's other packed layers (quantized embeddings and embedding bags, dynamic RNN cells,
  sparse quantized linear layers) are refused, saving and loading alike: fxloom does not
  write their packed weights, and a record without them would load a layer that cannot run.

A packed layer's attributes and tensors are checked before anything is packed
(``module_shapes.check_module_shapes`` with the tensors to pack): torch's packing functions
divide by ``groups`` and ``stride`` (SIGFPE at 0 on FBGEMM and QNNPACK) and trust the
shapes they are given. Saving runs the same check on the live layer.

Classes of ``fxloom.quantize`` are keyed by their qualified names, so that this package never
imports it. Loading rebuilds a module from the file's values only: no pickle, and nothing
but torch's packing functions and the backends' rules runs on them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq
import torch.ao.nn.quantized.dynamic as nnqd
from torch import nn
from torch.ao.nn.quantized.dynamic.modules.rnn import PackedParameter, RNNCellBase
from torch.ao.nn.quantized.modules.conv import _ConvNd
from torch.ao.nn.quantized.modules.embedding_ops import EmbeddingPackedParams
from torch.ao.nn.quantized.modules.linear import LinearPackedParams
from torch.ao.nn.sparse.quantized import linear as sparse_linear
from torch.ao.nn.sparse.quantized.dynamic import linear as sparse_dynamic_linear

from fxloom.backends import SavedStateError, saved_module_rules
from fxloom.pytree import TreeSpec
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.module_shapes import check_module_shapes, record_packed
from fxloom.serialize.modules import (
    _MODULE_INTERNALS,
    MODULE_STATES,
    REBUILT_HOOKS,
    ModuleState,
    _check_attribute,
    _refuse_hooks,
    _special,
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


def _checked_for_saving(module: nn.Module, where: str, packed: dict[str, Any]) -> None:
    """What loading checks before packing, checked of the live layer before writing it."""
    try:
        check_module_shapes(module, where, packed)
    except SerializationError as e:
        raise SerializationError(f"cannot save {e}") from None


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
    _checked_for_saving(module, where, {"weight": weight, "bias": bias})
    return {
        "dtype": encode_value(module.dtype),
        "weight": writer.add(weight, f"{where}.weight"),
        "bias": None if bias is None else writer.add(bias, f"{where}.bias"),
    }


def _load_linear_packed(data: Any, reader: TensorReader, where: str) -> nn.Module:
    module = LinearPackedParams.__new__(LinearPackedParams)
    nn.Module.__init__(module)
    module.dtype = decode_value(_field(data, "dtype", dict, where), where=where)
    packed = {
        "weight": reader.get(data.get("weight"), f"{where}.weight"),
        "bias": _optional_tensor(reader, data.get("bias"), f"{where}.bias"),
    }
    check_module_shapes(module, where, packed)
    with _repacking(where):
        module.set_weight_bias(packed["weight"], packed["bias"])
    record_packed(module, packed)
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
        _checked_for_saving(module, where, {"weight": weight, "bias": bias})
        return {
            "attributes": _save_attributes(module, frozenset({packed}), where),
            "weight": writer.add(weight, f"{where}.weight"),
            "bias": None if bias is None else writer.add(bias, f"{where}.bias"),
        }

    def load(data: Any, reader: TensorReader, where: str) -> nn.Module:
        module = _empty_with_attributes(cls, data, where)
        weight = reader.get(data.get("weight"), f"{where}.weight")
        bias = _optional_tensor(reader, data.get("bias"), f"{where}.bias")
        check_module_shapes(module, where, {"weight": weight, "bias": bias})
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
        _checked_for_saving(module, where, named)
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
        check_module_shapes(module, where, weights)
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


# ------------------------------------------------------------- backends' modules
class _StateWriter:
    """``fxloom.backends.StateWriter``: a backend's values written as this file's data."""

    def __init__(self, writer: TensorWriter) -> None:
        self._writer = writer

    def tensor(self, tensor: torch.Tensor, where: str) -> Any:
        return self._writer.add(tensor, where)

    def value(self, value: Any, where: str) -> Any:
        return encode_value(value, where)

    def spec(self, spec: TreeSpec) -> Any:
        return encode_spec(spec)


class _StateReader:
    """``fxloom.backends.StateReader``: this file's data read back as a backend's values."""

    def __init__(self, reader: TensorReader) -> None:
        self._reader = reader

    def tensor(self, record: Any, where: str, *, data_on_cpu: bool = False) -> torch.Tensor:
        return self._reader.get(record, where, data_on_cpu=data_on_cpu)

    def value(self, data: Any, where: str) -> Any:
        return decode_value(data, None, where)

    def spec(self, data: Any, where: str) -> TreeSpec:
        return decode_spec(data, where)

    def field(self, data: Any, key: str, kind: type, where: str) -> Any:
        return _field(data, key, kind, where)

    def describe(self, data: Any) -> str:
        return short(data)


def backend_state(cls: type) -> ModuleState | None:
    """How modules of ``cls`` are saved when a registered backend makes them, or None.

    A backend registers when its module is imported, and its module classes come from there:
    loading resolves a class by importing its module (``OrtModule``'s imports
    ``fxloom.lower``, which registers ONNX Runtime) before it asks for its rule.
    """
    rule = _special(cls, saved_module_rules())
    if rule is None:
        return None

    def save(module: nn.Module, writer: TensorWriter, where: str) -> Any:
        try:
            return rule.save(module, _StateWriter(writer), where)
        except SavedStateError as e:
            raise SerializationError(str(e)) from None

    def load(data: Any, reader: TensorReader, where: str) -> nn.Module:
        try:
            return rule.load(data, _StateReader(reader), where)
        except SavedStateError as e:
            raise SerializationError(str(e)) from None

    return _refusing_hooks(ModuleState(save, load))


# ------------------------- what prepare() inserts, and torch's other packed layers: refused
def _refusing(why_not_saved: str, why_not_loaded: str) -> ModuleState:
    """A row that refuses modules of its class both ways, saying why."""

    def save(module: nn.Module, writer: TensorWriter, where: str) -> Any:
        raise SerializationError(
            f"cannot save {where} ({type(module).__qualname__}): {why_not_saved}"
        )

    def load(data: Any, reader: TensorReader, where: str) -> nn.Module:
        raise SerializationError(f"{where}: the file holds {why_not_loaded}; refused")

    return ModuleState(save, load)


def _refused(what: str) -> ModuleState:
    return _refusing(
        f"it is {what}, which fxloom.quantize.prepare and prepare_qat insert; a prepared "
        "model's quantization plan is not saved, so a loaded copy could not be converted. "
        "Call fxloom.quantize.convert(prepared) first and save the int8 model it returns",
        f"{what}, which fxloom does not load",
    )


def _not_saved(what: str) -> ModuleState:
    return _refusing(
        f"it holds {what} packed for torch's quantized kernels, which fxloom does not save; "
        "fxloom saves the quantized layers fxloom.quantize makes (Linear, Conv1d/2d/3d, LSTM, "
        "GRU): keep this one in float",
        f"{what} packed for torch's quantized kernels, which fxloom does not load",
    )


# ------------------------------------------------------------------- the rows
_ROWS: dict[type | str, ModuleState] = {
    LinearPackedParams: ModuleState(_save_linear_packed, _load_linear_packed),
    **{
        cls: _weight_bias_state(cls, "_packed_params")
        for cls in _subclasses(_ConvNd, nnq, nniq, nnqd)
    },
    nnqd.LSTM: _rnn_state(nnqd.LSTM),
    nnqd.GRU: _rnn_state(nnqd.GRU),
    nnq.Embedding: _not_saved("an embedding table"),  # and EmbeddingBag
    EmbeddingPackedParams: _not_saved("an embedding table"),
    RNNCellBase: _not_saved("a recurrent cell's weights"),  # LSTMCell, GRUCell, RNNCell
    PackedParameter: _not_saved("one cell of a dynamic LSTM/GRU (saved with its layer)"),
    sparse_linear.Linear: _not_saved("sparse linear weights"),
    sparse_linear.LinearPackedParams: _not_saved("sparse linear weights"),
    sparse_dynamic_linear.Linear: _not_saved("sparse linear weights"),
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
