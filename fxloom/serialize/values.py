"""Argument values as JSON, and back: every kind of value a node's arguments may hold.

JSON's own types stand for themselves (``null``, booleans, integers, strings,
finite floats, lists); every other kind is a one-key object naming its kind::

    (1, 2)            {"tuple": [1, 2]}
    {"dim": 1}        {"dict": [["dim", 1]]}
    %x                {"node": "x"}
    slice(0, None)    {"slice": [0, null, null]}
    ...               {"ellipsis": null}
    float("inf")      {"float": "inf"}
    torch.float16     {"dtype": "float16"}
    torch.device(..)  {"device": "cpu"}
    torch.Size([2])   {"size": [2]}
    torch.relu        {"function": "torch.relu"}

plus ``layout``, ``memory_format``, ``qscheme``, ``complex``, ``bytes``,
``range``, ``numpy`` scalars, ``treespec`` (a pytree's shape) and ``container`` for
registered container classes.
Functions and classes are written by name and resolved on loading through
``allowlist``; decoding never evaluates text.
"""

from __future__ import annotations

import base64
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fxloom._format import printable
from fxloom.immutable_collections import immutable_dict
from fxloom.lint import TORCH_VALUE_TYPES
from fxloom.node import Node
from fxloom.pytree import NONE_SPEC, TreeSpec, container_type
from fxloom.serialize import allowlist, limits
from fxloom.serialize.devices import parse_device
from fxloom.serialize.errors import SerializationError

__all__ = [
    "encode_value",
    "decode_value",
    "encode_spec",
    "decode_spec",
    "short",
    "expect_list",
    "expect_pair",
    "TORCH_ENUMS",
    "NUMPY_SCALARS",
]

# Values of torch's enum-like types, by the name torch gives them (``torch.float32``): those
# an argument may hold (``fxloom.lint.TORCH_VALUE_TYPES``), and quantization schemes, which only
# metadata holds.
TORCH_ENUMS: dict[str, type] = {**TORCH_VALUE_TYPES, "qscheme": torch.qscheme}
_BY_NAME: dict[str, dict[str, Any]] = {
    kind: {name: value for name, value in vars(torch).items() if isinstance(value, cls)}
    for kind, cls in TORCH_ENUMS.items()
}
_NAME_OF_VALUE: dict[Any, tuple[str, str]] = {
    value: (kind, name) for kind, names in _BY_NAME.items() for name, value in names.items()
}


def encode_value(value: Any, where: str = "") -> Any:
    """``value`` as JSON data; ``where`` names it in errors (``node %add, args[1]``)."""
    t = type(value)
    if value is None or t in (bool, int, str):
        return value
    if t is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if t is Node:
        return {"node": value.name}
    encoder = _ENCODERS.get(t)
    if encoder is not None:
        return encoder(value, where)
    if t in _NAME_OF_VALUE or isinstance(value, tuple(TORCH_ENUMS.values())):
        kind, name = _NAME_OF_VALUE[value]
        return {kind: name}
    if t.__module__ == "numpy" and t.__name__ in NUMPY_SCALARS:
        return {"numpy": [t.__name__, value.item()]}
    entry = container_type(t)
    if entry is not None:
        return _encode_container(value, entry, where)
    if callable(value):
        return {"function": allowlist.name_of(value, f"function at {where}")}
    raise SerializationError(
        f"cannot save the value {value!r} ({t.__name__}) at {where or 'the top level'}: "
        "arguments may only be numbers, strings, None, containers of these, dtypes, "
        "devices, slices, torch.Size and allowlisted functions"
    )


def _encode_container(value: Any, entry: Any, where: str) -> Any:
    kind = entry.kind
    if kind == "tuple":
        return {"tuple": [encode_value(v, where) for v in value]}
    if kind == "list":
        return [encode_value(v, where) for v in value]
    if kind == "dict" and type(value) in _PLAIN_DICTS:
        return {
            "dict": [[encode_value(k, where), encode_value(v, where)] for k, v in value.items()]
        }
    children, context = entry.flatten(value)
    return {
        "container": allowlist.name_of(entry.type, f"container class at {where}", container=True),
        "children": [encode_value(v, where) for v in children],
        "context": encode_value(context, where),
    }


# Dicts written as ``{"dict": [[key, value], ...]}`` (the graph freezes them again on loading).
_PLAIN_DICTS = (dict, immutable_dict, OrderedDict)


def decode_value(data: Any, nodes: Mapping[str, Node] | None = None, where: str = "") -> Any:
    """The value ``encode_value`` wrote as ``data``; ``nodes`` maps node names to nodes.

    Containers may nest ``limits.MAX_ARGUMENT_DEPTH`` deep (``((1,),)`` is 2), as in
    graph text; deeper is refused before it is walked further.
    """
    return _decode(data, nodes, where, 0)


def _decode(data: Any, nodes: Mapping[str, Node] | None, where: str, depth: int) -> Any:
    """``decode_value`` of ``data``, found inside ``depth`` containers."""
    t = type(data)
    if data is None or t in (bool, int, str, float):
        return data
    if t is list:
        _check_depth(depth, where)
        return [_decode(v, nodes, where, depth + 1) for v in data]
    if t is not dict or len(data) not in (1, 3):
        raise SerializationError(f"{where}: cannot read the value {short(data)}")
    if len(data) == 3:
        _check_depth(depth, where)
        return _decode_container(data, nodes, where, depth + 1)
    ((kind, body),) = data.items()
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise SerializationError(f"{where}: unknown kind of value {kind!r}")
    if kind in _CONTAINER_KINDS:
        _check_depth(depth, where)
    return decoder(body, nodes, where, depth + 1)


# Kinds of value that hold other values: each is one level of nesting (a tree spec counts
# its own levels, ``_decode_spec``).
_CONTAINER_KINDS = frozenset({"tuple", "dict", "slice"})


def _check_depth(depth: int, where: str) -> None:
    """Refuse a container inside ``depth`` others when that makes too many levels."""
    if depth >= limits.MAX_ARGUMENT_DEPTH:
        raise limits.exceeded(
            f"{where}: a value",
            limits.MAX_ARGUMENT_DEPTH,
            f"level {depth + 1}",
            problem="is nested too deeply",
        )


def _decode_node(name: Any, nodes: Mapping[str, Node] | None, where: str, depth: int) -> Node:
    if nodes is None or not isinstance(name, str) or name not in nodes:
        raise SerializationError(f"{where}: node %{name} is used before it is defined")
    return nodes[name]


def _decode_torch_enum(kind: str) -> Decoder:
    def decode(name: Any, nodes: Any, where: str, depth: int) -> Any:
        if not isinstance(name, str) or name not in _BY_NAME[kind]:
            raise SerializationError(f"{where}: unknown {kind} {short(name)}")
        return _BY_NAME[kind][name]

    return decode


def _decode_float(text: Any, nodes: Any, where: str, depth: int) -> float:
    if text not in ("inf", "-inf", "nan"):
        raise SerializationError(f"{where}: {short(text)} is not a special float")
    return float(text)


def _decode_device(text: Any, nodes: Any, where: str, depth: int) -> torch.device:
    return parse_device(text, where)


def _decode_container(data: dict, nodes: Any, where: str, depth: int) -> Any:
    if set(data) != {"container", "children", "context"}:
        raise SerializationError(f"{where}: cannot read the value {short(data)}")
    cls = allowlist.resolve_container_class(_string(data["container"], "class", where))
    entry = container_type(cls) if isinstance(cls, type) else None
    if entry is None:
        raise SerializationError(f"{where}: {data['container']} is not a container class")
    children = expect_list(data["children"], where)
    context = _decode(data["context"], nodes, where, depth)
    try:
        return entry.unflatten([_decode(c, nodes, where, depth) for c in children], context)
    except SerializationError:
        raise
    except Exception as e:
        raise SerializationError(f"{where}: cannot rebuild {data['container']}: {e}") from None


def _string(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise SerializationError(f"{where}: expected a {what} name, found {short(value)}")
    return value


def expect_list(value: Any, where: str, length: int | None = None) -> list:
    """``value`` if it is a JSON list (of ``length`` items, when given); else the error."""
    if not isinstance(value, list) or length is not None and len(value) != length:
        expected = f"a list of {length}" if length is not None else "a list"
        raise SerializationError(f"{where}: expected {expected}, found {short(value)}")
    return value


def expect_pair(value: Any, where: str) -> tuple[Any, Any]:
    """The two items of a ``[first, second]`` JSON list; else the error."""
    first, second = expect_list(value, where, 2)
    return first, second


def _ints(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise SerializationError(f"{where}: expected a list of integers, found {short(value)}")
    return value


def short(value: Any) -> str:
    """``value`` quoted for a message: its ``repr``, escaped (``printable``: a placeholder's
    ``repr`` is the file's own name) and cut to 80 characters."""
    text = printable(repr(value))
    return text if len(text) <= 80 else text[:77] + "..."


def _decode_dict(items: Any, nodes: Any, where: str, depth: int) -> dict:
    result = {}
    for item in expect_list(items, where):
        key, value = expect_pair(item, where)
        key = _decode(key, nodes, where, depth)
        if not isinstance(key, (str, int, float, bool, type(None))):
            raise SerializationError(f"{where}: dict keys must be plain values, found {short(key)}")
        result[key] = _decode(value, nodes, where, depth)
    return result


def _decode_slice(parts: Any, nodes: Any, where: str, depth: int) -> slice:
    return slice(*(_decode(p, nodes, where, depth) for p in expect_list(parts, where, 3)))


def _decode_complex(parts: Any, nodes: Any, where: str, depth: int) -> complex:
    real, imag = expect_list(parts, where, 2)
    if not all(isinstance(p, (int, float)) for p in (real, imag)):
        raise SerializationError(f"{where}: invalid complex number {short(parts)}")
    return complex(real, imag)


def _decode_bytes(text: Any, nodes: Any, where: str, depth: int) -> bytes:
    try:
        return base64.b64decode(_string(text, "base64", where), validate=True)
    except ValueError as e:
        raise SerializationError(f"{where}: invalid bytes: {e}") from None


def _decode_range(parts: Any, nodes: Any, where: str, depth: int) -> range:
    return range(*_ints(expect_list(parts, where, 3), where))


# numpy scalars (``np.float64(5.65)``, a constant some models compute with numpy).
NUMPY_SCALARS = frozenset("float16 float32 float64 int8 int16 int32 int64 uint8 bool_".split())


def _decode_numpy(parts: Any, nodes: Any, where: str, depth: int) -> Any:
    name, value = expect_list(parts, where, 2)
    if name not in NUMPY_SCALARS or not isinstance(value, (int, float, bool)):
        raise SerializationError(f"{where}: invalid numpy scalar {short(parts)}")
    import numpy

    return getattr(numpy, name)(value)


def _decode_function(name: Any, nodes: Any, where: str, depth: int) -> Any:
    return allowlist.resolve_callable(_string(name, "function", where), f"function at {where}")


# Each decoder reads the body of its kind of value: (body, nodes, where, depth), where depth
# counts the containers around the body, this value included.
Decoder = Callable[[Any, Any, str, int], Any]
_DECODERS: dict[str, Decoder] = {
    "treespec": lambda spec, nodes, where, depth: _decode_spec(spec, where, depth),
    "node": _decode_node,
    "tuple": lambda items, nodes, where, depth: tuple(
        _decode(v, nodes, where, depth) for v in expect_list(items, where)
    ),
    "dict": _decode_dict,
    "slice": _decode_slice,
    "ellipsis": lambda body, nodes, where, depth: Ellipsis,
    "float": _decode_float,
    "complex": _decode_complex,
    "bytes": _decode_bytes,
    "range": _decode_range,
    "size": lambda dims, nodes, where, depth: torch.Size(_ints(dims, where)),
    "device": _decode_device,
    "function": _decode_function,
    "numpy": _decode_numpy,
    **{kind: _decode_torch_enum(kind) for kind in TORCH_ENUMS},
}

_ENCODERS: dict[type, Callable[[Any, str], Any]] = {
    TreeSpec: lambda v, where: {"treespec": encode_spec(v)},
    torch.Size: lambda v, where: {"size": list(v)},
    slice: lambda v, where: {"slice": [encode_value(p, where) for p in (v.start, v.stop, v.step)]},
    type(Ellipsis): lambda v, where: {"ellipsis": None},
    torch.device: lambda v, where: {"device": str(v)},
    complex: lambda v, where: {"complex": [v.real, v.imag]},
    bytes: lambda v, where: {"bytes": base64.b64encode(v).decode("ascii")},
    range: lambda v, where: {"range": [v.start, v.stop, v.step]},
}


# ------------------------------------------------------------------ tree specs
def encode_spec(spec: TreeSpec) -> Any:
    """A ``TreeSpec`` as data: ``null`` for a leaf, ``"none"`` for an input fixed to None
    (``NONE_SPEC``), else its container class, context and children."""
    if spec.is_leaf():
        return None
    if spec is NONE_SPEC or spec.type is type(None):
        return "none"
    return {
        "type": allowlist.name_of(spec.type, "container class of a tree spec", container=True),
        "context": encode_value(spec.context, "a tree spec's context"),
        "children": [encode_spec(c) for c in spec.children],
    }


def decode_spec(data: Any, where: str) -> TreeSpec:
    """The ``TreeSpec`` ``encode_spec`` wrote; specs nest at most as deep as values do."""
    return _decode_spec(data, where, 0)


def _decode_spec(data: Any, where: str, depth: int) -> TreeSpec:
    if data is None:
        return TreeSpec(None)
    if data == "none":
        return NONE_SPEC
    if not isinstance(data, dict) or not isinstance(data.get("children"), list):
        raise SerializationError(f"{where}: invalid tree spec {short(data)}")
    _check_depth(depth, where)
    cls = allowlist.resolve_container_class(data.get("type"))
    entry = container_type(cls) if isinstance(cls, type) else None
    if entry is None:
        raise SerializationError(f"{where}: {data.get('type')} is not a container class")
    context = _decode(data.get("context"), None, where, depth + 1)
    children = tuple(_decode_spec(c, where, depth + 1) for c in data["children"])
    return TreeSpec(entry, context, children)
