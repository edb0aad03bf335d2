"""``fxloom save MODEL -o FILE`` and ``fxloom show FILE``: write a captured model, read one back.

``save`` traces MODEL (a zoo name or ``package.module:factory``, see ``fxloom.cli.model_spec``)
with ``fxloom.symbolic_trace`` and writes it with ``fxloom.save``; with ``--export`` it exports
it (``fxloom.export.export`` on the example inputs; ``--dynamic-batch`` makes dimension 0 one
``Dim("batch")``) and writes the program with ``fxloom.export.save``.

``show`` describes a saved file without building a module or running anything: it reads the
archive's JSON (``fxloom.serialize.archive.read_archive``) and decodes only the graphs
(``graphs.decode_graph``, node meta left out), so what it prints is the header (format version,
kind, the fxloom and torch versions that wrote it), each graph as ``print(graph)`` shows it
(``--code``: the Python code it generates instead), the module tree (the class at each path),
the parameters and other tensors counted by dtype from their records, the nodes by opcode and
the most common targets, the devices tensors were saved on, and, for exported programs, the
``signature`` and ``range_constraints`` documents (``PROGRAM_SECTIONS``) when the file has them.

Every string ``show`` prints from the file (class names, module paths, header strings, device
and dtype names, node names and arguments, refused names, the program sections' keys) is
escaped as it is read (``fxloom._format.printable``: control characters, escape sequences,
bidi overrides and newlines as ``repr`` writes them), so the ``FileSummary`` holds escaped
strings; graphs are printed a node a line, each line escaped whole; and every line printed is
escaped once more on its way out. A file cannot clear the screen, hide a line or forge one.

A file that names something ``fxloom.load`` would refuse (a Hugging Face ``ModelOutput`` class
whose module is not imported, a function off the allowlist, a module class) is still
described: the names are listed with where they are used and why loading refuses them
(``fxloom.serialize.refused_names``), and the graphs print them by name, nothing resolved or
run. A graph that cannot be decoded at all is listed with the reason, the rest still shown.
Only a file that is not an fxloom file (or a damaged one) gives the ``SerializationError``
message and exit code 2.

Depends on: ``fxloom.cli.model_spec``, ``fxloom.serialize``, ``fxloom.export`` (``--export``),
rich.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fxloom._format import describe_target, graph_lines, printable
from fxloom.passes._cost_report import format_bytes
from fxloom.serialize.refused_names import Refusal, find_refusals, standing_in

__all__ = [
    "add_save_arguments",
    "add_show_arguments",
    "run_save",
    "run_show",
    "FileSummary",
    "summarise",
]

EXIT_BAD_FILE = 2
MODULE_ROWS = 40  # module paths listed before the rest are summarised by class
TOP_TARGETS = 10
# Documents of an exported program's file printed as they are, when the file has them.
PROGRAM_SECTIONS = ("graph_signature", "range_constraints", "shape_constraints")
# Where each kind of file keeps its root module record (fxloom.save / fxloom.export.save).
ROOT_MODULE_KEYS = {"graph_module": "module", "exported_program": "graph_module"}


# ------------------------------------------------------------------------------ fxloom save
def add_save_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fxloom save``."""
    parser.add_argument("model", metavar="MODEL", help="a zoo model name or package.module:factory")
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="the file to write (e.g. model.fxl)"
    )
    parser.add_argument(
        "--export",
        action="store_true",
        help="export the model (fxloom.export.export on its example inputs) and write the "
        "ExportedProgram with fxloom.export.save, instead of the traced GraphModule",
    )
    parser.add_argument(
        "--dynamic-batch",
        action="store_true",
        help="with --export: make dimension 0 of every batched input one Dim('batch')",
    )


def run_save(args: argparse.Namespace) -> int:
    """Trace (or export) MODEL and write it; errors are raised, for the CLI to report."""
    import fxloom
    from fxloom.cli.model_spec import load_model, trace_model

    if args.dynamic_batch and not args.export:
        print("fxloom save: error: --dynamic-batch applies to --export", file=sys.stderr)
        return EXIT_BAD_FILE
    loaded = load_model(args.model)
    if args.export:
        ep = _export(loaded, args.dynamic_batch)
        _export_save()(ep, args.output)
        what, graph = "exported program", ep.graph
    else:
        gm = trace_model(loaded)
        fxloom.save(gm, args.output)
        what, graph = "traced GraphModule", gm.graph
    size = Path(args.output).stat().st_size
    print(
        f"saved {loaded.name} ({what}, {len(graph.nodes)} nodes) to {args.output} "
        f"({format_bytes(size)}); 'fxloom show {args.output}' describes it"
    )
    return 0


def _export_save() -> Any:
    import fxloom.export

    save = getattr(fxloom.export, "save", None)
    if save is None:
        raise RuntimeError(
            "fxloom save --export needs fxloom.export.save, which this fxloom does not have; "
            "save the traced GraphModule instead (leave out --export)"
        )
    return save


def _export(loaded: Any, dynamic_batch: bool) -> Any:
    from fxloom.cli.export import batch_shapes
    from fxloom.cli.model_spec import example_inputs_of, split_inputs
    from fxloom.export import export

    example_inputs_of(loaded, "export runs the model on them")
    positional, keywords = split_inputs(loaded.inputs)
    shapes = batch_shapes(loaded.model, positional, keywords) if dynamic_batch else None
    return export(loaded.model, positional, keywords, dynamic_shapes=shapes)


# ------------------------------------------------------------------------------ fxloom show
def add_show_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fxloom show``."""
    parser.add_argument("file", metavar="FILE", help="a file written by fxloom.save or fxloom save")
    parser.add_argument(
        "--code",
        action="store_true",
        help="print the Python code generated from each graph instead of the graph text",
    )
    parser.add_argument(
        "--no-graph", action="store_true", help="leave out the graphs (and code): summary only"
    )


def run_show(args: argparse.Namespace) -> int:
    """Describe FILE; exit code 2 (and the loader's message) for a file it refuses."""
    from fxloom.serialize.errors import SerializationError

    try:
        summary = summarise(args.file)
    except (SerializationError, FileNotFoundError, IsADirectoryError) as error:
        message = str(error) if isinstance(error, SerializationError) else f"no file {args.file}"
        print(_escaped_lines(f"fxloom show: error: {message}"), file=sys.stderr)
        return EXIT_BAD_FILE
    _print_summary(summary, args.file, code=args.code, graphs=not args.no_graph)
    return 0


@dataclass
class FileSummary:
    """What ``fxloom show`` prints about a file, read from its JSON alone.

    Its strings from the file are escaped (``printable``) as they are read; the graphs are the
    file's own (printed through ``printable`` a node a line) and the program sections its own
    JSON documents (printed by ``json.dumps``, which escapes every control character).
    """

    header: dict[str, Any]  # its strings escaped
    graphs: dict[str, Any]  # a Graph per module path ("" is the root), decoded without meta
    modules: dict[str, str]  # module path -> class name, root first
    tensors: dict[str, Counter]  # "parameters", ... -> {(dtype, "elements" | "bytes"): count}
    opcodes: Counter
    targets: Counter
    program_sections: dict[str, Any]  # those of PROGRAM_SECTIONS the file has
    devices: Counter = field(default_factory=Counter)  # saved device -> tensors stored
    refusals: list[Refusal] = field(default_factory=list)  # what fxloom.load would refuse


def summarise(path: str | Path) -> FileSummary:
    """Read ``path``'s documents and decode its graphs; nothing is built or run.

    >>> import tempfile, torch, fxloom
    >>> gm = fxloom.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()))
    >>> path = tempfile.mkdtemp() + "/m.fxl"
    >>> fxloom.save(gm, path)
    >>> s = summarise(path)
    >>> s.header["kind"], s.modules["0"], dict(s.opcodes)
    ('graph_module', 'torch.nn.modules.linear.Linear', {'placeholder': 1, 'call_module': 2, 'output': 1})
    """
    from fxloom.serialize.archive import described_kind, read_archive
    from fxloom.serialize.errors import SerializationError
    from fxloom.serialize.graph_module_files import guarded_load

    archive = read_archive(path)
    program = archive.program
    if not isinstance(program, dict):
        raise SerializationError(f"{path}: program.json must be an object")
    root = program.get(ROOT_MODULE_KEYS.get(archive.kind, ""))
    if not isinstance(root, dict):
        raise SerializationError(
            f"{path}: {described_kind(archive.kind)} file without its module record"
        )
    _import_named_libraries(program)
    return guarded_load(root, lambda record: _summarise_tree(archive.header, program, record))


def _import_named_libraries(program: dict) -> None:
    """Import the libraries (``allowlist.LIBRARY_CLASS_MODULES``: transformers) whose classes
    the file names, when installed: what a user of ``fxloom.load`` does before loading, so
    that ``show`` finds their output and cache classes as ``load`` does. Only the library
    itself is imported here; its modules that define the classes are imported from the
    allowlist's enumerated table, never from a name in the file."""
    import importlib
    import importlib.util

    from fxloom.serialize.allowlist import LIBRARY_CLASS_MODULES

    text = json.dumps(program)
    for library in LIBRARY_CLASS_MODULES:
        if f'"{library}.' in text and library not in sys.modules:
            if importlib.util.find_spec(library) is not None:
                importlib.import_module(library)


def _summarise_tree(header: dict, program: dict, root: dict) -> FileSummary:
    summary = FileSummary(_escaped_header(header), {}, {}, {}, Counter(), Counter(), {})
    summary.refusals = find_refusals(_module_records(root))
    with standing_in(summary.refusals):  # refused names decode as inert placeholders
        _summarise_modules(summary, program, root)
    # A refusal's name is the file's (the placeholders stood in for it): shown escaped.
    summary.refusals = [replace(r, name=printable(r.name)) for r in summary.refusals]
    return summary


def _escaped_header(header: dict) -> dict[str, Any]:
    """format.json's entries with their strings escaped (other values print by ``repr``)."""
    return {
        printable(str(key)): printable(value) if isinstance(value, str) else value
        for key, value in header.items()
    }


def _summarise_modules(summary: FileSummary, program: dict, root: dict) -> None:
    from fxloom.serialize.errors import SerializationError

    seen_tensors: set[str] = set()
    for path, record in _module_records(root):
        summary.modules[printable(path)] = printable(str(record.get("class")))
        if "graph" in record:
            try:
                summary.graphs[printable(path)] = _decode_graph_only(record["graph"], path)
            except SerializationError as e:  # listed, and the rest of the file still shown
                where = printable(f"graph of {path or 'the root module'}")
                summary.refusals.append(Refusal("(the whole graph)", "graph", str(e), [where]))
        for kind, records in _tensor_records(record):
            for tensor in records:
                _count_once(summary, kind, tensor, seen_tensors)
    for path, graph in summary.graphs.items():
        for node in graph.nodes:
            summary.opcodes[node.op] += 1
            target = _target_label(node, path, summary.modules)
            if target is not None:
                summary.targets[printable(target)] += 1
    for key, value in program.items():  # an exported program's state_dict, constants, ...
        if value is not root:
            for tensor in _find_tensor_records(value):
                _count_once(summary, printable(key.replace("_", " ")), tensor, seen_tensors)
    for key in PROGRAM_SECTIONS:
        if key in program:
            summary.program_sections[key] = program[key]


def _count_once(summary: FileSummary, kind: str, tensor: dict, seen: set[str]) -> None:
    if tensor.get("key") in seen:
        return  # a tied tensor is stored, and counted, once
    seen.add(tensor.get("key"))
    _count_tensor(summary.tensors.setdefault(kind, Counter()), tensor)
    summary.devices[printable(str(tensor.get("device", "cpu")))] += 1  # version 1: the CPU


def _module_records(root: dict) -> Iterator[tuple[str, dict]]:
    """(path, record) for every module of the tree, depth first, root ("") first."""
    stack: list[tuple[str, Any]] = [("", root)]
    while stack:
        path, record = stack.pop()
        if not isinstance(record, dict):
            continue
        yield path, record
        children = record.get("children")
        if isinstance(children, dict):
            prefix = f"{path}." if path else ""
            stack.extend(reversed([(prefix + str(k), v) for k, v in children.items()]))


def _decode_graph_only(data: Any, path: str) -> Any:
    """The graph without its node meta: meta is not shown, and may hold symbolic sizes."""
    from fxloom.serialize.graphs import decode_graph

    if isinstance(data, dict) and isinstance(data.get("nodes"), list):
        nodes = [
            {k: v for k, v in node.items() if k != "meta"} if isinstance(node, dict) else node
            for node in data["nodes"]
        ]
        data = {**data, "nodes": nodes}
    return decode_graph(data, where=f"graph of {path or 'the root module'}")


def _tensor_records(record: dict) -> Iterator[tuple[str, list[dict]]]:
    parameters = record.get("parameters")
    if isinstance(parameters, dict):
        yield "parameters", [p for p in parameters.values() if _is_tensor_record(p)]
    others = [v for k, v in record.items() if k not in ("parameters", "children", "graph")]
    yield "other tensors", list(_find_tensor_records(others))


def _find_tensor_records(value: Any) -> Iterator[dict]:
    """Tensor records anywhere in ``value`` (buffers, constants, a module's saved state)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if _is_tensor_record(item):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _is_tensor_record(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("key"), str) and "shape" in value


def _count_tensor(counts: Counter, record: dict) -> None:
    from fxloom.serialize.values import decode_value

    dtype = decode_value(record.get("dtype"), None, f"tensor {record.get('key')}")
    shape = record.get("shape")
    if not isinstance(shape, list) or not all(type(n) is int for n in shape):
        return
    elements = math.prod(shape)
    name = printable(str(dtype).removeprefix("torch."))
    counts[(name, "elements")] += elements
    counts[(name, "bytes")] += elements * getattr(dtype, "itemsize", 0)


def _target_label(node: Any, path: str, modules: dict[str, str]) -> str | None:
    """What a node of the module at ``path`` calls, as counted; ``None`` for what only reads."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return None
    full = printable(f"{path}.{node.target}" if path else str(node.target))
    saved_class = modules.get(full, str(node.target)) if node.op == "call_module" else None
    module_class = saved_class.rsplit(".", 1)[-1] if saved_class else None
    return describe_target(node, "label", module_class=module_class)


# ------------------------------------------------------------------------------ printing
def _print_summary(summary: FileSummary, path: str, *, code: bool, graphs: bool) -> None:
    from rich.syntax import Syntax
    from rich.text import Text

    from fxloom.cli.console import cli_console

    # Every line goes out through _escaped_lines: a no-op on what was escaped as it was read,
    # and the last defence for anything that was not (rich's Text keeps ESC as it is).
    console = cli_console()
    if not console.is_terminal:
        console.width = 160  # a pipe or a file: don't fold long lines into 80 columns
    header = summary.header
    console.print(
        Text(
            _escaped_lines(
                f"{path}: fxloom file, format version {header.get('version')}, kind "
                f"{header.get('kind')}; written by fxloom {header.get('fxloom_version', '?')}, "
                f"torch {header.get('torch_version', '?')}"
            ),
            style="bold",
        ),
        soft_wrap=True,
    )
    if graphs:
        for module_path, graph in summary.graphs.items():
            console.print()
            title = _escaped_lines(f"Graph of {module_path or 'the root module'}:")
            console.print(Text(title, style="bold"))
            if code:
                source = _escaped_lines(graph.python_code("self").src.strip("\n"))
                console.print(Syntax(source, "python", background_color="default"), soft_wrap=True)
            else:
                # A node a line, escaped whole: a newline inside a name cannot start a line.
                text = "\n".join(printable(line) for line in graph_lines(graph))
                console.print(Text(text), soft_wrap=True)
    for line in _summary_lines(summary):
        style = "bold" if line.endswith(":") else ""
        console.print(Text(_escaped_lines(line), style=style), soft_wrap=True)


def _escaped_lines(text: str) -> str:
    """``text`` with each of its lines escaped (``printable``), the newlines between them kept."""
    return "\n".join(printable(line) for line in text.split("\n"))


def _summary_lines(summary: FileSummary) -> list[str]:
    lines = ["", f"Modules ({len(summary.modules)}):"]
    for index, (module_path, cls) in enumerate(summary.modules.items()):
        if index == MODULE_ROWS:
            rest = Counter(c.rsplit(".", 1)[-1] for c in list(summary.modules.values())[index:])
            counted = ", ".join(f"{n} {c}" for c, n in rest.most_common())
            lines.append(f"  ... {len(summary.modules) - index} more: {counted}")
            break
        lines.append(f"  {module_path or '(root)'}: {cls}")
    kinds = ["parameters", "other tensors"]
    kinds += [kind for kind in summary.tensors if kind not in kinds]
    for kind in kinds:
        counts = summary.tensors.get(kind, Counter())
        dtypes = sorted({dtype for dtype, _ in counts})
        described = "; ".join(
            f"{dtype} {counts[(dtype, 'elements')]:,} ({format_bytes(counts[(dtype, 'bytes')])})"
            for dtype in dtypes
        )
        lines.append(f"{kind.capitalize()}: {described or 'none'}")
    nodes = sum(summary.opcodes.values())
    by_op = ", ".join(f"{count} {op}" for op, count in summary.opcodes.most_common())
    lines += ["", f"Nodes: {nodes} ({by_op})"]
    top = summary.targets.most_common(TOP_TARGETS)
    if top:
        lines.append("Most common targets: " + ", ".join(f"{t} x{n}" for t, n in top))
    if summary.devices:
        saved_on = ", ".join(f"{device} {n}" for device, n in summary.devices.most_common())
        lines.append(f"Tensors saved on: {saved_on}")
    for key, value in summary.program_sections.items():
        lines += ["", f"{key.replace('_', ' ').capitalize()}:", *_section_lines(key, value)]
    return lines + _refusal_lines(summary.refusals)


def _section_lines(key: str, value: Any) -> list[str]:
    """An exported program's section as ``fxloom export`` prints it (``x: USER_INPUT``,
    ``s0: [2, 64]``); a section of an unexpected shape (a damaged or newer file) as JSON."""
    try:
        return _SECTION_TEXT[key](value)
    except (KeyError, TypeError, ValueError, AttributeError):
        return _json_lines(value)


def _signature_lines(signature: dict[str, Any]) -> list[str]:
    if set(signature) != {"inputs", "outputs"}:
        raise ValueError("a signature with other keys: shown as it is")
    lines = ["  # inputs"]
    for spec in signature["inputs"]:
        persistent = spec.get("persistent")
        lines.append(
            f"  {_argument_text(spec['arg'])}: {printable(spec['kind'])}{_target_text(spec)}"
            + ("" if persistent is None else f" persistent={bool(persistent)}")
        )
    lines.append("  # outputs")
    for spec in signature["outputs"]:
        lines.append(
            f"  {_argument_text(spec['arg'])}: {printable(spec['kind'])}{_target_text(spec)}"
        )
    return lines


def _argument_text(argument: dict[str, Any]) -> str:
    if set(argument) == {"tensor"}:
        return printable(argument["tensor"])
    if set(argument) == {"constant", "value"}:
        return (
            printable(argument["constant"]) if argument["constant"] else _compact(argument["value"])
        )
    raise ValueError("an argument of another kind")


def _target_text(spec: dict[str, Any]) -> str:
    target = spec.get("target")
    return "" if target is None else f" target={printable(target)!r}"


def _range_lines(ranges: list[Any]) -> list[str]:
    lines = [
        f"  {_expression_text(symbol)}: [{_expression_text(lower)}, {_expression_text(upper)}]"
        for symbol, lower, upper in ranges
    ]
    return lines or ["  (none)"]


def _constraint_lines(constraints: list[Any]) -> list[str]:
    return [f"  {printable(str(line))}" for line in constraints] or ["  (none)"]


def _expression_text(data: Any) -> str:
    """A saved expression as sympy prints it, read by the file format's own decoder (which
    builds unevaluated sympy nodes from a closed table: nothing of the file runs)."""
    import sympy

    from fxloom.serialize.symbols import decode_expr

    if data in ("oo", "-oo"):
        return "inf" if data == "oo" else "-inf"
    names: set[str] = set()
    _symbol_names(data, names)
    expression = decode_expr(data, {name: sympy.Symbol(name) for name in names}, "show")
    return printable(str(expression))


def _symbol_names(data: Any, names: set[str]) -> None:
    if isinstance(data, dict):
        if set(data) == {"symbol"} and isinstance(data["symbol"], str):
            names.add(data["symbol"])
        for item in data.values():
            _symbol_names(item, names)
    elif isinstance(data, list):
        for item in data:
            _symbol_names(item, names)


_SECTION_TEXT = {
    "graph_signature": _signature_lines,
    "range_constraints": _range_lines,
    "shape_constraints": _constraint_lines,
}


def _refusal_lines(refusals: list[Refusal]) -> list[str]:
    """What ``fxloom.load`` would refuse, one name a line, with where it is used and why."""
    if not refusals:
        return []
    lines = ["", f"fxloom.load would refuse ({len(refusals)}):"]
    for refusal in refusals:
        shown = ", ".join(refusal.places[:3])
        more = f" and {len(refusal.places) - 3} more" if len(refusal.places) > 3 else ""
        lines.append(f"  {refusal.kind} '{refusal.name}' (at {shown}{more}): {refusal.reason}")
    return lines


def _json_lines(value: Any) -> list[str]:
    """A document one entry per line: a list's items, an object's keys (lists of objects or
    lists unrolled, one item a line)."""
    if isinstance(value, list):
        return [f"  {_compact(item)}" for item in value] or ["  (none)"]
    if not isinstance(value, dict):
        return [f"  {_compact(value)}"]
    lines = []
    for key, item in value.items():
        key = printable(key)  # json.dumps escapes what it writes; a key printed bare is not
        if isinstance(item, list) and any(isinstance(e, (dict, list)) for e in item):
            lines.append(f"  {key}:")
            lines += [f"    {_compact(entry)}" for entry in item]
        else:
            lines.append(f"  {key}: {_compact(item)}")
    return lines or ["  (none)"]


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "))
