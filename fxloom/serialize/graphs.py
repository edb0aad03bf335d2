"""A ``Graph`` as JSON data, and back.

One record per node, in order::

    {"name": "add", "op": "call_function", "target": "operator.add",
     "args": [{"node": "x"}, 1], "kwargs": {}, "meta": {...}}

``args`` is the list of positional arguments, ``kwargs`` an object; values
are written by ``values``. Targets of ``call_function`` are names resolved
through the allowlist; ``call_method`` targets must be Tensor methods;
``get_attr``/``call_module`` targets are dotted attribute paths. Every name
that generated code will contain or that is looked up (node names, parameter
names, attribute paths, keyword names) is checked to be a plain ASCII
identifier before the graph is built (``_namespace.is_plain_identifier``), so a
file cannot smuggle code into ``forward``, and no two names that read
differently become one when Python folds identifiers to NFKC.
"""

from __future__ import annotations

import operator
import types
import typing
import unicodedata
from functools import reduce
from typing import Any

import torch

from fxloom._namespace import is_plain_identifier
from fxloom.codegen import CodeGen
from fxloom.graph import Graph
from fxloom.lint import argument_rule_violation
from fxloom.node import OPCODES, Node
from fxloom.pytree_codegen import PyTreeCodeGen, PyTreeInfo
from fxloom.serialize import allowlist
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.limits import MAX_ARGUMENT_DEPTH  # noqa: F401  (values enforces it)
from fxloom.serialize.meta import MetaCodecs, decode_meta, encode_meta
from fxloom.serialize.values import decode_spec, decode_value, encode_spec, encode_value, short

__all__ = [
    "encode_graph",
    "decode_graph",
    "check_identifier",
    "check_path",
]

_OPCODES = frozenset(OPCODES)  # the IR's


def encode_graph(graph: Graph, codecs: MetaCodecs | None = None) -> dict[str, Any]:
    codecs = codecs or MetaCodecs()
    nodes = []
    saved = codecs.start_module_stacks()
    for node in graph.nodes:
        where = f"node %{node.name}"
        _check_argument_shape(node, where, saving=True)
        record: dict[str, Any] = {
            "name": node.name,
            "op": node.op,
            "target": _encode_target(node, where),
        }
        if node.args:
            record["args"] = [
                encode_value(a, f"{where}, args[{i}]") for i, a in enumerate(node.args)
            ]
        if node.kwargs:
            record["kwargs"] = {
                k: encode_value(v, f"{where}, kwargs[{k!r}]") for k, v in node.kwargs.items()
            }
        if node.type is not None:
            annotation = _encode_type(node.type)
            if annotation is not None:
                record["type"] = annotation
        meta = encode_meta(node.meta, codecs, where)
        if meta:
            record["meta"] = meta
        nodes.append(record)
    encoded = {"nodes": nodes, "codegen": _encode_codegen(graph._codegen)}
    module_stacks = codecs.end_module_stacks(saved)
    if module_stacks:
        encoded["module_stacks"] = module_stacks
    return encoded


def decode_graph(data: Any, codecs: MetaCodecs | None = None, where: str = "graph") -> Graph:
    codecs = codecs or MetaCodecs()
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise SerializationError(f"{where}: expected an object with a list of nodes")
    graph = Graph()
    nodes: dict[str, Node] = {}
    saved = codecs.start_module_stacks(data.get("module_stacks"), f"{where}, module_stacks")
    try:
        for index, record in enumerate(data["nodes"]):
            node = _decode_node(record, graph, nodes, codecs, f"{where}, node {index}")
            nodes[node.name] = node
    finally:
        codecs.end_module_stacks(saved)
    graph.set_codegen(_decode_codegen(data.get("codegen"), where))
    return graph


def _encode_target(node: Node, where: str) -> Any:
    """The target's name, refused here for whatever loading would refuse."""
    if node.op == "call_function":
        name = allowlist.name_of(node.target, f"target of {where}")
        try:
            allowlist.check_call(node.target, node.args, node.kwargs)
        except SerializationError as e:
            raise SerializationError(f"cannot save {where}: {e}") from None
        return name
    if not isinstance(node.target, str):
        raise SerializationError(f"cannot save {where}: its target {node.target!r} is not a name")
    if node.op in ("get_attr", "call_module"):
        try:
            check_path(node.target, f"{where}: the attribute path")
        except SerializationError as e:
            raise SerializationError(f"cannot save {e}; rename the attribute") from None
    if node.op == "call_method" and not allowlist.allowed_method(node.target):
        raise SerializationError(
            f"cannot save {where}: loading refuses the method {node.target!r}, which is not in "
            "fxloom's table of Tensor methods (fxloom.serialize.torch_names)"
        )
    return node.target


def _decode_node(
    record: Any, graph: Graph, nodes: dict[str, Node], codecs: MetaCodecs, where: str
) -> Node:
    if not isinstance(record, dict):
        raise SerializationError(f"{where}: expected an object")
    name, op, target = record.get("name"), record.get("op"), record.get("target")
    check_identifier(name, f"{where}: node name")
    where = f"node %{name}"
    if not isinstance(op, str) or op not in _OPCODES:
        raise SerializationError(f"{where}: unknown opcode {short(op)}")
    if name in nodes:
        raise SerializationError(f"{where}: the name is used twice")
    args, kwargs = record.get("args", ()), record.get("kwargs", {})
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
        raise SerializationError(f"{where}: args must be a list and kwargs an object")
    args = tuple([decode_value(a, nodes, where) for a in args])
    for key in kwargs:
        check_identifier(key, f"{where}: keyword")
    kwargs = {k: decode_value(v, nodes, where) for k, v in kwargs.items()}
    target = _decode_target(op, target, where)
    if op == "call_function":
        try:
            allowlist.check_call(target, args, kwargs)
        except SerializationError as e:
            raise SerializationError(f"{where}: {e}") from None
    type_expr = _decode_type(record["type"], where) if "type" in record else None
    meta = decode_meta(record.get("meta", {}), codecs, where)
    try:
        node = graph.create_node(op, target, args, kwargs, name=name, type_expr=type_expr)
    except (TypeError, ValueError, RuntimeError) as e:
        raise SerializationError(f"{where}: {e}") from None
    if node.name != name:
        raise SerializationError(f"{where}: the name clashes with another name in the graph")
    _check_argument_shape(node, where)
    node.meta = meta
    return node


def _check_argument_shape(node: Node, where: str, saving: bool = False) -> None:
    """The IR's rules for an opcode's arguments (``fxloom.lint.ARGUMENT_RULES``), checked when
    saving too, so that no file is written that loading would refuse."""
    problem = argument_rule_violation(node)
    if problem is None:
        return
    if saving:
        raise SerializationError(
            f"cannot save {where}: {problem}, and loading would refuse it; fix the node "
            "(graph.lint() names the rule), then save"
        )
    raise SerializationError(f"{where}: {problem}")


def _decode_target(op: str, target: Any, where: str) -> Any:
    if op == "call_function":
        if not isinstance(target, str):
            raise SerializationError(f"{where}: the target must be a name")
        return allowlist.resolve_callable(target, f"call_function target of {where}")
    if op == "call_method":
        if not allowlist.allowed_method(target):
            raise SerializationError(
                f"{where}: call_method target {short(target)} is not an allowed Tensor method; "
                "register_serializable(<function>, name=...) to allow another"
            )
        return target
    if op == "placeholder":
        # ``*args``/``**kwargs`` parameters keep their stars in the target.
        check_identifier(
            target.lstrip("*") if isinstance(target, str) else target, f"{where}: parameter name"
        )
        if isinstance(target, str) and target.startswith("***"):
            raise SerializationError(f"{where}: invalid parameter name {target!r}")
        return target
    if op == "output":
        if target != "output":
            raise SerializationError(f"{where}: the output's target must be 'output'")
        return target
    check_path(target, f"{where}: attribute path")
    return target


def check_identifier(name: Any, where: str) -> str:
    """A plain ASCII identifier (``[A-Za-z_][A-Za-z0-9_]*``, not a keyword)."""
    if not is_plain_identifier(name):
        raise SerializationError(
            f"{where} {short(name)} is not a valid identifier{_ascii_hint(name)}"
        )
    return name


def check_path(path: Any, where: str) -> str:
    """A dotted path of plain identifiers (``layer.0.weight``: digits name sequence entries)."""
    if not isinstance(path, str) or not path:
        raise SerializationError(f"{where} {short(path)} is not a dotted path")
    for part in path.split("."):
        if not (is_plain_identifier(part) or part.isascii() and part.isdigit()):
            raise SerializationError(
                f"{where} {short(path)} is not a dotted path of plain identifiers{_ascii_hint(path)}"
            )
        if part.startswith("__"):
            raise SerializationError(f"{where} {short(path)} reaches a private attribute")
    return path


def _ascii_hint(name: Any) -> str:
    if not isinstance(name, str) or name.isascii():
        return ""
    return (
        " (names in files are ASCII: Python would read this one as "
        f"{short(unicodedata.normalize('NFKC', name))})"
    )


# ----------------------------------------------------------------- annotations
# Types an annotation may name; any other annotation is left out of the file.
_ANNOTATION_TYPES: dict[str, type] = {
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "complex": complex,
    "torch.Tensor": torch.Tensor,
    "torch.Size": torch.Size,
    "torch.dtype": torch.dtype,
    "torch.device": torch.device,
}
_GENERICS: dict[str, Any] = {
    "list": list,
    "tuple": tuple,
    "dict": dict,
    "typing.Union": typing.Union,
    # typing.Unpack is new in Python 3.11 (``*args: *Ts``); 3.10 cannot have written it.
    **({"typing.Unpack": typing.Unpack} if hasattr(typing, "Unpack") else {}),
}


def _encode_type(t: Any) -> Any:
    """An annotation as data, or None when it names a type outside ``_ANNOTATION_TYPES``
    (the annotation is then left out; it only documents). Classes are written by name and
    read back only from modules already imported."""
    if t is None or t is type(None):
        return "None"
    if t is Ellipsis:
        return "..."  # ``tuple[int, ...]``
    if isinstance(t, str):
        return {"text": t}  # ``from __future__ import annotations``: printed as a string literal
    for name, cls in _ANNOTATION_TYPES.items():
        if t is cls:
            return name
    # ``tuple[int]`` passes isinstance(..., type) on Python 3.10: a generic is told by its origin.
    if isinstance(t, type) and typing.get_origin(t) is None:
        # Other classes by name: loading looks them up among imported modules, never imports.
        return {"class": f"{t.__module__}.{t.__qualname__}"}
    args = typing.get_args(t)
    if isinstance(t, types.UnionType):
        kind = "union"  # ``int | None``
    else:
        origin = typing.get_origin(t)
        kind = next((name for name, generic in _GENERICS.items() if origin is generic), None)
        if kind is None or not args:
            return None
    parts = [_encode_type(a) for a in args]
    return None if None in parts else {"generic": kind, "args": parts}


def _decode_type(data: Any, where: str) -> Any:
    if data == "None":
        return type(None)
    if data is None:
        return None
    if data == "...":
        return Ellipsis
    if isinstance(data, str) and data in _ANNOTATION_TYPES:
        return _ANNOTATION_TYPES[data]
    if isinstance(data, dict) and set(data) == {"text"} and isinstance(data["text"], str):
        return data["text"]
    if isinstance(data, dict) and set(data) == {"class"} and isinstance(data["class"], str):
        found = allowlist.imported_class(data["class"])
        return None if found is allowlist.MISSING else found
    kind = data.get("generic") if isinstance(data, dict) else None
    if (
        (kind in _GENERICS or kind == "union")
        and isinstance(data.get("args"), list)
        and data["args"]
    ):
        args = tuple(_decode_type(a, where) for a in data["args"])
        if None in args:  # a class that is not imported: the annotation is left out
            return None
        if kind == "union":
            return reduce(operator.or_, args)
        return _GENERICS[kind][args if len(args) > 1 else args[0]]
    raise SerializationError(f"{where}: cannot read the annotation {short(data)}")


# --------------------------------------------------------------------- codegen
def _encode_codegen(codegen: CodeGen) -> Any:
    from fxloom.export.input_checks import ExportedCodeGen

    kind = _CODEGEN_KINDS.get(type(codegen))
    if kind is None:
        if type(codegen) is ExportedCodeGen:
            kind = "exported"
        else:
            raise SerializationError(
                f"cannot save a graph whose code is framed by {type(codegen).__qualname__}; "
                "only fxloom's own CodeGen classes are saved"
            )
    if kind == "default":
        return {"kind": kind}
    info = codegen.pytree_info
    return {
        "kind": kind,
        "orig_args": list(info.orig_args),
        "in_spec": encode_spec(info.in_spec),
        # A leaf spec is written as null too: whether there is an out_spec is its own field.
        "out_spec": encode_spec(info.out_spec) if info.out_spec is not None else None,
        "has_out_spec": info.out_spec is not None,
    }


def _decode_codegen(data: Any, where: str) -> CodeGen:
    if data is None or data == {"kind": "default"}:
        return CodeGen()
    if not isinstance(data, dict) or data.get("kind") not in ("pytree", "exported"):
        raise SerializationError(f"{where}: unknown codegen {short(data)}")
    names = data.get("orig_args")
    if not isinstance(names, list):
        raise SerializationError(f"{where}: codegen needs its parameter names")
    for name in names:
        check_identifier(name, f"{where}: parameter name")
    has_out_spec = data.get("has_out_spec", data.get("out_spec") is not None)
    info = PyTreeInfo(
        names,
        decode_spec(data.get("in_spec"), where),
        decode_spec(data.get("out_spec"), where) if has_out_spec else None,
    )
    if data["kind"] == "exported":
        from fxloom.export.input_checks import ExportedCodeGen

        return ExportedCodeGen(info)
    return PyTreeCodeGen(info)


_CODEGEN_KINDS: dict[type, str] = {CodeGen: "default", PyTreeCodeGen: "pytree"}
