"""Node ``meta`` in a saved file: the entries that describe, not the ones that run.

Saved: ``stack_trace`` (``source_location`` is read back from it on loading),
``nn_module_stack``, ``source_fn_stack``, ``tensor_meta``, ``val`` (tensors as their shape, dtype and stride; symbolic
sizes as expressions, through the ``symbols`` codec of exported programs),
and any other entry whose value is plain data (numbers, strings, containers of
these, dtypes...). Entries holding other objects (observers, modules,
closures) are left out: they belong to the session that made them.

Classes and functions in ``nn_module_stack``/``source_fn_stack`` are written by
name; loading gives the class back where its module is already imported and
it is a plain lookup, and otherwise keeps the name (a string). Nothing is
imported and nothing is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fxloom.serialize.devices import parse_device
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.values import decode_value, encode_value, expect_pair
from fxloom.source_location import innermost_location
from fxloom.values.symbolic_scalars import SYMBOLIC_TYPES

__all__ = ["encode_meta", "decode_meta", "MetaCodecs", "ClassName"]


class MetaCodecs:
    """How ``val``'s sizes are written: plain integers, or (exported programs) symbols too.

    ``encode_size``/``decode_size`` see each size of a tensor and each scalar
    ``val``; the default leaves out ``val`` entries with symbolic values, which only
    exported programs carry along with the shape environment that gives them meaning.
    """

    # ``nn_module_stack`` entries repeat from node to node (every node of a layer has the
    # same one): a graph's file holds each distinct stack once, nodes hold its index.
    def start_module_stacks(self, encoded: Any = None, where: str = "") -> Any:
        """Begin a graph: the table of its module stacks (from ``encoded`` when loading)."""
        saved = getattr(self, "_stacks", None), getattr(self, "_stack_index", None)
        self._stacks, self._stack_index = [], {}
        for entry in encoded if type(encoded) is list else [] if encoded is None else [None]:
            self._stacks.append(_decode_stack_entries(entry, where))
        return saved

    def end_module_stacks(self, saved: Any) -> list:
        """End a graph: the table to write; the previous graph's table is current again."""
        table = [[list(e) for e in stack] for stack in self._stack_index]
        self._stacks, self._stack_index = saved
        return table

    def encode_size(self, size: Any, where: str) -> Any:
        if isinstance(size, SYMBOLIC_TYPES):
            # Their symbols live in an exported program's ShapeEnv, which a GraphModule does
            # not carry: the entry is left out (fxloom.export.save keeps it).
            raise _NotData
        return size

    def decode_size(self, data: Any, where: str) -> Any:
        if type(data) is not int:
            raise SerializationError(f"{where}: a size must be an integer, found {data!r}")
        return data

    @staticmethod
    def move_device(device: torch.device) -> torch.device:
        """The device a value saved on ``device`` reports once loaded (set from ``map_location``)."""
        return device

    def make_tensor(
        self,
        sizes: list[Any],
        strides: list[Any],
        dtype: torch.dtype,
        where: str,
        device: torch.device | None = None,
    ) -> Any:
        """A meta tensor of this description (``device``, the value's real device, is for
        codecs whose tensors report one)."""
        try:
            return torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
        except (RuntimeError, ValueError, TypeError) as e:
            raise SerializationError(f"{where}: invalid tensor description: {e}") from None


def encode_meta(meta: dict[str, Any], codecs: MetaCodecs, where: str) -> dict[str, Any]:
    result = {}
    for key, value in meta.items():
        encoder = _ENCODERS.get(key, _encode_plain)
        try:
            encoded = encoder(value, codecs, f"{where}, meta[{key!r}]")
        except _NotData:
            continue
        result[key] = encoded
    return result


def decode_meta(data: Any, codecs: MetaCodecs, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise SerializationError(f"{where}: meta must be an object")
    meta = {}
    for key, value in data.items():
        decoder = _DECODERS.get(key, _decode_plain)
        meta[key] = decoder(value, codecs, f"{where}, meta[{key!r}]")
    # Not written: the structured location is the stack trace's innermost frame.
    location = innermost_location(meta["stack_trace"]) if meta.get("stack_trace") else None
    if location is not None:
        meta["source_location"] = location
    return meta


class _NotData(Exception):
    """This meta entry holds something other than data; it is not saved."""


# ------------------------------------------------------------------ plain data
def _encode_plain(value: Any, codecs: MetaCodecs, where: str) -> Any:
    try:
        return encode_value(value, where)
    except SerializationError:
        raise _NotData from None


def _decode_plain(data: Any, codecs: MetaCodecs, where: str) -> Any:
    return decode_value(data, None, where)


# ---------------------------------------------------------------- named things
def _name(obj: Any) -> str:
    if isinstance(obj, str):
        return obj
    from fxloom._format import qualified_name
    from fxloom.serialize.allowlist import class_name

    return class_name(obj) if isinstance(obj, type) else qualified_name(obj)


class ClassName(str):
    """The name of a class (or function) that is not imported where a file is loaded.

    A plain string that also answers ``__name__`` as the class would, so code that
    names modules by their class (``unflatten``) still works.
    """

    @property
    def __name__(self) -> str:
        return self.rpartition(".")[2]


def _lookup(name: Any, where: str) -> Any:
    """The class or function at ``name`` among imported modules, else its ``ClassName``."""
    if not isinstance(name, str):
        raise SerializationError(f"{where}: expected a name, found {name!r}")
    found = _LOOKED_UP.get(name)
    if found is not None:
        return found
    from fxloom.serialize.allowlist import MISSING, find_callable, imported_class

    found = imported_class(name)
    if found is MISSING:
        found = find_callable(name)
    if found is MISSING:
        return ClassName(name)
    _LOOKED_UP[name] = found
    return found


# Classes and functions found by name (meta names the same module classes again and again).
_LOOKED_UP: dict[str, Any] = {}


def _encode_module_stack(value: Any, codecs: MetaCodecs, where: str) -> Any:
    if not isinstance(value, dict):
        raise _NotData
    stack = tuple((str(key), str(path), _name(cls)) for key, (path, cls) in value.items())
    if getattr(codecs, "_stack_index", None) is None:
        return [list(entry) for entry in stack]
    return codecs._stack_index.setdefault(stack, len(codecs._stack_index))


def _decode_module_stack(data: Any, codecs: MetaCodecs, where: str) -> dict:
    if type(data) is int:
        table = getattr(codecs, "_stacks", None) or []
        if not 0 <= data < len(table):
            raise SerializationError(f"{where}: no module stack number {data} in the graph")
        # A node's own entries: passes may edit one node's stack, and unflatten tells calls
        # of a module apart by which nodes share an entry object (the file does not record it).
        return {key: (path, cls) for key, (path, cls) in table[data].items()}
    return _decode_stack_entries(data, where)


def _decode_stack_entries(data: Any, where: str) -> dict:
    stack = {}
    for entry in data if type(data) is list else [None]:
        if type(entry) is not list or len(entry) != 3 or not all(type(p) is str for p in entry):
            raise SerializationError(f"{where}: expected [key, path, class] entries (strings)")
        key, path, cls = entry
        stack[key] = (path, _lookup(cls, where))
    return stack


def _encode_source_fn_stack(value: Any, codecs: MetaCodecs, where: str) -> Any:
    if not isinstance(value, list):
        raise _NotData
    return [[str(name), _name(target)] for name, target in value]


def _decode_source_fn_stack(data: Any, codecs: MetaCodecs, where: str) -> list:
    stack = []
    for entry in data if type(data) is list else [None]:
        if type(entry) is not list or len(entry) != 2:
            raise SerializationError(f"{where}: expected [name, target] entries")
        stack.append((entry[0], _lookup(entry[1], where)))
    return stack


def _encode_string(value: Any, codecs: MetaCodecs, where: str) -> Any:
    if not isinstance(value, str):
        raise _NotData
    return value


def _decode_string(data: Any, codecs: MetaCodecs, where: str) -> str:
    if not isinstance(data, str):
        raise SerializationError(f"{where}: expected a string")
    return data


# ------------------------------------------------------------ tensor descriptions
def _encode_tensor_meta(value: Any, codecs: MetaCodecs, where: str) -> Any:
    from fxloom.passes.shape_prop import TensorMetadata

    if isinstance(value, TensorMetadata):
        return {
            "tensor_meta": {name: encode_value(v, where) for name, v in value._asdict().items()}
        }
    if isinstance(value, (tuple, list)):
        items = [_encode_tensor_meta(v, codecs, where) for v in value]
        return {"tuple": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {
            "dict": [
                [encode_value(k, where), _encode_tensor_meta(v, codecs, where)]
                for k, v in value.items()
            ]
        }
    return _encode_plain(value, codecs, where)


def _decode_tensor_meta(data: Any, codecs: MetaCodecs, where: str) -> Any:
    from fxloom.passes.shape_prop import TensorMetadata

    if (
        isinstance(data, dict)
        and set(data) == {"tensor_meta"}
        and isinstance(data["tensor_meta"], dict)
    ):
        fields = {name: decode_value(v, None, where) for name, v in data["tensor_meta"].items()}
        if set(fields) != set(TensorMetadata._fields):
            raise SerializationError(
                f"{where}: tensor_meta must have the fields {TensorMetadata._fields}"
            )
        return TensorMetadata(**fields)
    if isinstance(data, list):
        return [_decode_tensor_meta(v, codecs, where) for v in data]
    if isinstance(data, dict) and set(data) == {"tuple"} and isinstance(data["tuple"], list):
        return tuple(_decode_tensor_meta(v, codecs, where) for v in data["tuple"])
    if isinstance(data, dict) and set(data) == {"dict"} and isinstance(data["dict"], list):
        return {
            decode_value(k, None, where): _decode_tensor_meta(v, codecs, where)
            for k, v in (expect_pair(item, where) for item in data["dict"])
        }
    return decode_value(data, None, where)


def _encode_val(value: Any, codecs: MetaCodecs, where: str) -> Any:
    if isinstance(value, torch.Tensor):
        described = {
            "shape": [codecs.encode_size(s, where) for s in value.shape],
            "stride": [codecs.encode_size(s, where) for s in value.stride()],
            "dtype": encode_value(value.dtype),
        }
        if value.device.type != "meta":  # a stand-in reports the device of the real value
            described["device"] = str(value.device)
        return {"tensor": described}
    if isinstance(value, SYMBOLIC_TYPES):
        return {"symbolic": codecs.encode_size(value, where)}
    if isinstance(value, (tuple, list)):
        items = [_encode_val(v, codecs, where) for v in value]
        return {"tuple": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {
            "dict": [
                [encode_value(k, where), _encode_val(v, codecs, where)] for k, v in value.items()
            ]
        }
    return _encode_plain(value, codecs, where)


def _decode_val(data: Any, codecs: MetaCodecs, where: str) -> Any:
    if isinstance(data, list):
        return [_decode_val(v, codecs, where) for v in data]
    if isinstance(data, dict) and len(data) == 1:
        ((kind, body),) = data.items()
        if kind == "tensor":
            if not isinstance(body, dict) or not all(
                isinstance(body.get(k), list) for k in ("shape", "stride")
            ):
                raise SerializationError(f"{where}: a tensor needs a shape and strides")
            dtype = decode_value(body.get("dtype"), None, where)
            if not isinstance(dtype, torch.dtype):
                raise SerializationError(f"{where}: invalid dtype")
            sizes = [codecs.decode_size(s, where) for s in body["shape"]]
            strides = [codecs.decode_size(s, where) for s in body["stride"]]
            return codecs.make_tensor(sizes, strides, dtype, where, _device(body, codecs, where))
        if kind == "symbolic":
            return codecs.decode_size(body, where)
        if kind == "tuple" and isinstance(body, list):
            return tuple(_decode_val(v, codecs, where) for v in body)
        if kind == "dict" and isinstance(body, list):
            return {
                decode_value(k, None, where): _decode_val(v, codecs, where)
                for k, v in (expect_pair(i, where) for i in body)
            }
    return decode_value(data, None, where)


def _device(body: dict, codecs: MetaCodecs, where: str) -> torch.device | None:
    if "device" not in body:
        return None
    return codecs.move_device(parse_device(body["device"], where))


_Codec = Callable[[Any, MetaCodecs, str], Any]
_ENCODERS: dict[str, _Codec] = {
    "stack_trace": _encode_string,
    "nn_module_stack": _encode_module_stack,
    "source_fn_stack": _encode_source_fn_stack,
    "tensor_meta": _encode_tensor_meta,
    "val": _encode_val,
}
_DECODERS: dict[str, _Codec] = {
    "stack_trace": _decode_string,
    "nn_module_stack": _decode_module_stack,
    "source_fn_stack": _decode_source_fn_stack,
    "tensor_meta": _decode_tensor_meta,
    "val": _decode_val,
}
