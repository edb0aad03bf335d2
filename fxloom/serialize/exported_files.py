"""``fxloom.export.save(ep, f)`` and ``fxloom.export.load(f)``: exported programs in a file.

The file is the one ``fxloom.save`` writes (see ``archive``), of kind
``"exported_program"``; its ``program.json`` holds every field of the
``ExportedProgram``::

    {"shape_env": {...}, "graph_module": <module record>, "graph_signature": {...},
     "state_dict": {name: <tensor record>}, "constants": {...},
     "in_spec": ..., "out_spec": ..., "arg_names": [...], "example_inputs": ...,
     "range_constraints": [[symbol, lower, upper]], "shape_constraints": [...],
     "module_hierarchy": [[path, class name]], "verifier": "fxloom.export.verifier.verify"}

The ShapeEnv is read first, so the symbolic sizes of ``meta["val"]`` come back as
``torch.SymInt`` of the loaded ShapeEnv (``symbols.SymbolicCodecs``). Classes of
``module_hierarchy`` are found among imported modules, or kept by name
(``meta.ClassName``); nothing is imported. The loaded program is checked by
fxloom's export verifier before it is returned: one that breaks the Export IR's
rules is refused with ``SerializationError``. A verifier of the user's own is
not saved (it is code): the loaded program carries fxloom's default one.

``example_inputs`` are saved when they are tensors and plain values in
containers fxloom knows; otherwise the loaded program has ``example_inputs=None``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy
import torch

from fxloom import pytree
from fxloom.lint import is_default_literal
from fxloom.serialize.allowlist import class_name
from fxloom.serialize.archive import PathOrFile, described_kind, read_archive, write_archive
from fxloom.serialize.devices import MapLocation, Placement, move_graph_devices
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.graph_module_files import _versions, check_loaded, guarded_load
from fxloom.serialize.graphs import check_identifier, check_path
from fxloom.serialize.meta import ClassName
from fxloom.serialize.modules import decode_module, encode_module
from fxloom.serialize.symbols import (
    SymbolicCodecs,
    decode_expr,
    decode_shape_env,
    encode_expr,
    encode_shape_env,
    expression_budget,
)
from fxloom.serialize.tensors import TensorReader, TensorWriter
from fxloom.serialize.values import decode_spec, decode_value, encode_spec, encode_value, short

if TYPE_CHECKING:
    from fxloom.export.program import ExportedProgram

__all__ = ["save", "load", "KIND"]

KIND = "exported_program"
_VERIFIER = "fxloom.export.verifier.verify"


def save(ep: ExportedProgram, f: PathOrFile) -> None:
    """Write the exported program ``ep`` — graph, signature, weights, symbolic sizes — to ``f``.

    ``f`` is a path or a binary file. ``fxloom.export.load`` reads it back
    without running anything from the file::

        >>> import io, torch
        >>> from fxloom.export import Dim, export, load, save
        >>> ep = export(torch.nn.Linear(3, 2), (torch.randn(4, 3),),
        ...             dynamic_shapes={"input": {0: Dim("batch")}})
        >>> buffer = io.BytesIO()
        >>> save(ep, buffer)
        >>> loaded = load(buffer.getvalue())
        >>> loaded.range_constraints == ep.range_constraints
        True
        >>> x = torch.randn(7, 3)
        >>> torch.equal(loaded.module()(x), ep.module()(x))
        True
    """
    from fxloom.export.program import ExportedProgram

    if not isinstance(ep, ExportedProgram):
        raise TypeError(
            f"fxloom.export.save takes an ExportedProgram, got {type(ep).__name__} "
            "(use fxloom.save for a GraphModule)"
        )
    writer = TensorWriter()
    env = ep.shape_env
    codecs = SymbolicCodecs(env)
    program = {
        "shape_env": None if env is None else encode_shape_env(env),
        "graph_module": encode_module(ep.graph_module, writer, codecs, "the program's graph"),
        "graph_signature": _encode_signature(ep.graph_signature),
        "state_dict": _encode_tensors(ep.state_dict, writer, "state_dict"),
        "constants": _encode_tensors(ep.constants, writer, "constants"),
        "in_spec": encode_spec(ep.in_spec),
        "out_spec": encode_spec(ep.out_spec),
        "arg_names": [_encode_arg_name(name) for name in ep.arg_names],
        "example_inputs": _encode_examples(ep.example_inputs, writer),
        "range_constraints": [
            [encode_expr(symbol), _encode_bound(r.lower), _encode_bound(r.upper)]
            for symbol, r in ep.range_constraints.items()
        ],
        "shape_constraints": [str(line) for line in ep.shape_constraints],
        "module_hierarchy": [
            [path, cls if isinstance(cls, str) else class_name(cls)]
            for path, cls in ep.module_hierarchy.items()
        ],
        "verifier": None if ep.verifier is None else _VERIFIER,
    }
    write_archive(f, KIND, program, writer.tensors, _versions())


def load(f: PathOrFile | bytes, map_location: MapLocation = None) -> ExportedProgram:
    """The ``ExportedProgram`` saved in ``f`` (a path, a binary file or the file's bytes).

    Its state, constants and example inputs go back to the devices they were
    saved on, or where ``map_location`` says (as for ``fxloom.load``; see
    ``fxloom.serialize.devices``); with a device, string or dict, the devices
    the graph names (``device=`` arguments, ``meta["val"]``) move with them.

    Raises ``SerializationError`` (or ``FileNotFoundError``) if the file is
    damaged, holds something else (a GraphModule: load it with ``fxloom.load``),
    names anything off the allowlist, or its program breaks the Export IR's rules.
    See ``save`` for an example.
    """
    placement = Placement(map_location)  # a wrong kind of map_location is the caller's error
    archive = guarded_load(f, read_archive)
    if archive.kind != KIND:
        hint = " (load it with fxloom.load)" if archive.kind == "graph_module" else ""
        raise SerializationError(
            f"the file holds {described_kind(archive.kind)}, not an ExportedProgram{hint}"
        )
    return guarded_load(archive, lambda archive: _build(archive, placement))


# ------------------------------------------------------------------ loading
def _build(archive: Any, placement: Placement) -> ExportedProgram:
    from fxloom.export.program import ExportedProgram
    from fxloom.export.verifier import ExportVerifierError, verify
    from fxloom.graph_module import GraphModule

    program = archive.program
    if not isinstance(program, dict):
        raise SerializationError("program.json must be an object")
    env_data = program.get("shape_env")
    env = None if env_data is None else decode_shape_env(env_data)
    codecs = SymbolicCodecs(env)
    if placement.moves_devices:
        codecs.move_device = placement.device_for
    reader = TensorReader(archive.weights, placement)
    gm = decode_module(program.get("graph_module"), reader, codecs, "graph_module")
    if not isinstance(gm, GraphModule):
        raise SerializationError(f"the program's graph is held by a {type(gm).__name__}")
    check_loaded(gm)
    move_graph_devices(gm, placement)
    signature = _decode_signature(program.get("graph_signature"))
    state_dict = _decode_tensors(program, "state_dict", reader)
    constants = _decode_tensors(program, "constants", reader)
    _check_state(signature, state_dict, constants)
    arg_names = program.get("arg_names")
    if not isinstance(arg_names, list):
        raise SerializationError("arg_names must be a list")
    in_spec = decode_spec(program.get("in_spec"), "in_spec")
    out_spec = decode_spec(program.get("out_spec"), "out_spec")
    _check_calling_convention(signature, in_spec, out_spec, arg_names)
    verifier = program.get("verifier")
    if verifier not in (None, _VERIFIER):
        raise SerializationError(f"unknown verifier {short(verifier)}")
    try:
        ep = ExportedProgram(
            gm,
            signature,
            state_dict,
            constants,
            in_spec=in_spec,
            out_spec=out_spec,
            arg_names=[_decode_arg_name(name) for name in arg_names],
            example_inputs=_decode_examples(program.get("example_inputs"), reader),
            range_constraints=_decode_ranges(program.get("range_constraints"), env),
            module_hierarchy=_decode_hierarchy(program.get("module_hierarchy")),
            shape_env=env,
            shape_constraints=_strings(program.get("shape_constraints", []), "shape_constraints"),
            verifier=verify,  # always checked: a file cannot switch the check off
        )
    except ExportVerifierError as e:
        raise SerializationError(f"the saved program breaks the Export IR's rules: {e}") from None
    if verifier is None:
        ep.verifier = None
    return ep


def _check_calling_convention(signature: Any, in_spec: Any, out_spec: Any, names: list) -> None:
    """``module()`` takes the arguments ``names`` of structure ``in_spec`` (one leaf per user
    input) and returns ``out_spec`` (one leaf per user output): the three must agree."""
    from fxloom.export.signature import InputKind, OutputKind

    user_inputs = sum(s.kind is InputKind.USER_INPUT for s in signature.input_specs)
    user_outputs = sum(s.kind is OutputKind.USER_OUTPUT for s in signature.output_specs)
    if in_spec.is_leaf() or len(in_spec.children) != len(names):
        raise SerializationError(f"in_spec does not describe the {len(names)} arguments arg_names")
    if in_spec.num_leaves != user_inputs or out_spec.num_leaves != user_outputs:
        raise SerializationError(
            f"in_spec/out_spec have {in_spec.num_leaves}/{out_spec.num_leaves} leaves, but the "
            f"signature lists {user_inputs} user inputs and {user_outputs} user outputs"
        )


def _check_state(signature: Any, state_dict: dict, constants: dict) -> None:
    from fxloom.export.signature import STATE_KINDS

    for spec in signature.input_specs:
        if (
            spec.kind in STATE_KINDS
            and spec.target not in state_dict
            and spec.target not in constants
        ):
            raise SerializationError(
                f"input {spec.arg.name} is the {spec.kind.name.lower()} {spec.target!r}, "
                "which the file's state_dict and constants do not hold"
            )


# ------------------------------------------------------------------ signature
def _encode_signature(signature: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "kind": spec.kind.name,
                "arg": _encode_argument(spec.arg),
                "target": spec.target,
                "persistent": spec.persistent,
            }
            for spec in signature.input_specs
        ],
        "outputs": [
            {"kind": spec.kind.name, "arg": _encode_argument(spec.arg), "target": spec.target}
            for spec in signature.output_specs
        ],
    }


def _encode_argument(arg: Any) -> dict[str, Any]:
    from fxloom.export.signature import ConstantArgument

    if isinstance(arg, ConstantArgument):
        where = f"the constant input or output {arg.name or arg.value!r}"
        return {"constant": arg.name, "value": encode_value(arg.value, where)}
    return {"tensor": arg.name}


def _decode_signature(data: Any) -> Any:
    from fxloom.export.signature import (
        ExportGraphSignature,
        InputKind,
        InputSpec,
        OutputKind,
        OutputSpec,
    )

    if not isinstance(data, dict):
        raise SerializationError("graph_signature must be an object")
    inputs, outputs = [], []
    for index, record in enumerate(_records(data, "inputs")):
        where = f"graph_signature, input {index}"
        kind = _enum(InputKind, record.get("kind"), where)
        persistent = record.get("persistent")
        if persistent not in (None, True, False):
            raise SerializationError(f"{where}: persistent must be true, false or null")
        target = _target(record.get("target"), kind is InputKind.USER_INPUT, where)
        inputs.append(
            InputSpec(kind, _decode_argument(record.get("arg"), where), target, persistent)
        )
    for index, record in enumerate(_records(data, "outputs")):
        where = f"graph_signature, output {index}"
        kind = _enum(OutputKind, record.get("kind"), where)
        target = _target(record.get("target"), kind is OutputKind.USER_OUTPUT, where)
        outputs.append(OutputSpec(kind, _decode_argument(record.get("arg"), where), target))
    return ExportGraphSignature(inputs, outputs)


def _decode_argument(data: Any, where: str) -> Any:
    from fxloom.export.signature import ConstantArgument, TensorArgument

    if isinstance(data, dict) and set(data) == {"tensor"}:
        name = data["tensor"]
        return TensorArgument(name if name == "" else check_identifier(name, f"{where}: name"))
    if isinstance(data, dict) and set(data) == {"constant", "value"}:
        name = data["constant"]
        if name != "":
            check_identifier(name, f"{where}: name")
        return ConstantArgument(name, decode_value(data["value"], None, where))
    raise SerializationError(f"{where}: invalid argument {short(data)}")


def _target(target: Any, user: bool, where: str) -> str | None:
    """State is named by a dotted path (it becomes an attribute of ``module()``)."""
    if target is None and user:
        return None
    return check_path(target, f"{where}: target")


def _enum(cls: Any, name: Any, where: str) -> Any:
    if not isinstance(name, str) or name not in cls.__members__:
        raise SerializationError(f"{where}: unknown kind {short(name)}")
    return cls[name]


def _records(data: dict, key: str) -> list[dict]:
    records = data.get(key)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise SerializationError(f"graph_signature: {key} must be a list of objects")
    return records


# ------------------------------------------------------------------ tensors
def _encode_tensors(tensors: dict, writer: TensorWriter, field: str) -> dict[str, Any]:
    records = {}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise SerializationError(
                f"cannot save {field}[{name!r}]: a {type(tensor).__name__}, not a tensor"
            )
        records[name] = writer.add(tensor, f"{field}[{name!r}]")
    return records


def _decode_tensors(program: dict, field: str, reader: TensorReader) -> dict[str, torch.Tensor]:
    records = program.get(field, {})
    if not isinstance(records, dict):
        raise SerializationError(f"{field} must be an object")
    for name in records:
        check_path(name, f"{field}: name")
    return {name: reader.get(record, f"{field}[{name!r}]") for name, record in records.items()}


# ------------------------------------------------------------------ arg_names
def _encode_arg_name(text: str) -> dict[str, Any]:
    """``"*args"``, ``"x"`` or ``"flag=True"`` (a literal default) as its parts."""
    import ast

    stars = len(text) - len(text.lstrip("*"))
    name, has_default, default = text[stars:].partition("=")
    record: dict[str, Any] = {"name": name, "stars": stars}
    if has_default:  # our own text, made by export from a literal
        record["default"] = encode_value(ast.literal_eval(default), f"the default of {name}")
    return record


def _decode_arg_name(data: Any) -> str:
    """The parameter text again; only an identifier and a literal's ``repr`` go in it."""
    if not isinstance(data, dict) or data.get("stars") not in (0, 1, 2):
        raise SerializationError(f"arg_names: invalid entry {short(data)}")
    name = check_identifier(data.get("name"), "arg_names: parameter name")
    text = "*" * data["stars"] + name
    if "default" in data:
        default = decode_value(data["default"], None, f"the default of {name}")
        if not is_default_literal(default):
            raise SerializationError(f"arg_names: the default of {name} must be a literal")
        text += f"={default!r}"
    return text


# ------------------------------------------------------------------ example inputs
def _encode_examples(examples: Any, writer: TensorWriter) -> Any:
    """The examples as tensors and plain values in a tree, or None when they are anything else."""
    if examples is None:
        return None
    leaves, spec = pytree.tree_flatten(examples)
    try:
        encoded_spec = encode_spec(spec)
        values = [
            None if isinstance(leaf, torch.Tensor) else encode_value(leaf, "an example input")
            for leaf in leaves
        ]
    except SerializationError:
        return None  # documented: such examples are not saved
    records = [
        {"tensor": writer.add(leaf, f"example input {i}")}
        if isinstance(leaf, torch.Tensor)
        else {"value": value}
        for i, (leaf, value) in enumerate(zip(leaves, values))
    ]
    return {"spec": encoded_spec, "leaves": records}


def _decode_examples(data: Any, reader: TensorReader) -> Any:
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("leaves"), list):
        raise SerializationError("example_inputs: expected a spec and leaves")
    leaves = []
    for index, record in enumerate(data["leaves"]):
        where = f"example input {index}"
        if isinstance(record, dict) and set(record) == {"tensor"}:
            leaves.append(reader.get(record["tensor"], where))
        elif isinstance(record, dict) and set(record) == {"value"}:
            leaves.append(decode_value(record["value"], None, where))
        else:
            raise SerializationError(f"{where}: invalid record")
    spec = decode_spec(data.get("spec"), "example_inputs")
    try:
        return pytree.tree_unflatten(leaves, spec)
    except (ValueError, TypeError, IndexError) as e:
        raise SerializationError(f"example_inputs do not fit their structure: {e}") from None


# ------------------------------------------------------------------ ranges, classes
def _encode_bound(bound: Any) -> Any:
    if bound == float("inf"):
        return "oo"
    if bound == float("-inf"):
        return "-oo"
    return int(bound)


def _decode_ranges(data: Any, env: Any) -> dict[Any, Any]:
    from fxloom.values.symbolic.ranges import ValueRange

    if not isinstance(data, list):
        raise SerializationError("range_constraints must be a list")
    symbols = {s.name: s for s in env.symbols} if env is not None else {}
    budget = expression_budget(env)  # the file's: one budget for all its expressions
    ranges = {}
    for entry in data:
        if not isinstance(entry, list) or len(entry) != 3:
            raise SerializationError("range_constraints: expected [symbol, lower, upper] entries")
        symbol = decode_expr(entry[0], symbols, "range_constraints", budget)
        lower, upper = (decode_expr(e, {}, "range_constraints", budget) for e in entry[1:])
        if not (lower.is_Integer or lower == -sympy.oo) or not (
            upper.is_Integer or upper == sympy.oo
        ):
            raise SerializationError("range_constraints: bounds must be integers or infinite")
        ranges[symbol] = ValueRange(lower, upper)
    return ranges


def _decode_hierarchy(data: Any) -> dict[str, Any]:
    from fxloom.serialize.allowlist import MISSING, imported_class

    if not isinstance(data, list):
        raise SerializationError("module_hierarchy must be a list")
    hierarchy: dict[str, Any] = {}
    for entry in data:
        if not (
            isinstance(entry, list) and len(entry) == 2 and all(isinstance(e, str) for e in entry)
        ):
            raise SerializationError("module_hierarchy: expected [path, class name] entries")
        path, name = entry
        if path:
            check_path(path, "module_hierarchy: path")
        if not name.isprintable():  # print(ep) shows it as it is
            raise SerializationError(f"module_hierarchy: {short(name)} is not a class name")
        found = imported_class(name)
        hierarchy[path] = ClassName(name) if found is MISSING else found
    return hierarchy


def _strings(data: Any, field: str) -> list[str]:
    """Lines ``print(ep)`` shows as they are: printable text only (no terminal controls)."""
    if not isinstance(data, list) or not all(isinstance(line, str) for line in data):
        raise SerializationError(f"{field} must be a list of strings")
    for line in data:
        if not line.isprintable():
            raise SerializationError(f"{field}: {short(line)} holds control characters")
    return data
