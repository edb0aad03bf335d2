"""Bounded work per byte: a small hostile file never costs the loader a large amount of work.

One test per limit of ``fxloom.serialize.limits``. Each builds the hostile input
(small, but asking for much work: a zip bomb, a million tensors, nested powers,
a line that made the old parser's regular expression backtrack) and shows that it
is refused with ``SerializationError`` (``GraphParseError`` for graph text) naming
what was exceeded and the limit. Where the failure used to be a hang or running
out of memory, the load runs in a child process with 1 GiB more address space
and 10 s more CPU time than the interpreter had after importing fxloom: the child
must finish and report the refusal. No test asserts a timing.
"""

from __future__ import annotations

import functools
import io
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import sympy
import torch
from torch import nn

import fxloom
from fxloom.export import Dim, export
from fxloom.serialize import SerializationError, archive, limits
from fxloom.serialize.graph_text import GraphParseError
from fxloom.serialize.safetensors_format import write_tensors
from fxloom.serialize.symbols import decode_expr

FORMAT = "fxloom/format.json"
PROGRAM = "fxloom/program.json"
WEIGHTS = "fxloom/weights.safetensors"


# ------------------------------------------------------------------ helpers
@functools.cache
def saved_module() -> bytes:
    f = io.BytesIO()
    fxloom.save(fxloom.symbolic_trace(nn.Sequential(nn.Linear(3, 2), nn.ReLU())), f)
    return f.getvalue()


class Flatten(nn.Module):
    def forward(self, x):
        return x.flatten(1) * 2


@functools.cache
def saved_dynamic() -> bytes:
    """An exported program with a symbolic batch size: it has a ShapeEnv and expressions."""
    ep = export(Flatten(), (torch.randn(4, 3, 5),), dynamic_shapes={"x": {0: Dim("b", max=64)}})
    f = io.BytesIO()
    fxloom.export.save(ep, f)
    return f.getvalue()


def members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(info.filename, z.read(info)) for info in z.infolist()]


def rezipped(data: bytes, replace: dict[str, bytes], stored: bool = False, extra=()) -> bytes:
    """``data`` with members replaced (deflated, or stored), and ``extra`` members appended."""
    out = io.BytesIO()
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(out, "w") as z:
        for name, content in [*members(data), *extra]:
            z.writestr(name, replace.get(name, content), method)
    return out.getvalue()


def with_program(data: bytes, change) -> bytes:
    """``data`` with its program.json edited by ``change(document)``."""
    document = json.loads(dict(members(data))[PROGRAM])
    change(document)
    return rezipped(data, {PROGRAM: json.dumps(document).encode()})


def weights_blob(header: dict, data: bytes = b"") -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    return len(text).to_bytes(8, "little") + text + data


def refused(load, data, *words: str) -> str:
    with pytest.raises(SerializationError) as info:
        load(data)
    message = str(info.value)
    for word in words:
        assert word in message, message
    return message


BOUNDED_CHILD = """
import resource, sys
import fxloom, fxloom.export
from fxloom.serialize import SerializationError

def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

extra = 2**30
resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + extra, vm_bytes() + extra))
cpu = int(resource.getrusage(resource.RUSAGE_SELF).ru_utime) + 10
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
data = open(sys.argv[1], "rb").read()
try:
    {load}
except SerializationError as e:
    print("refused:", e)
else:
    print("loaded")
"""


def refused_in_bounded_child(tmp_path: Path, data: bytes | str, load: str, *words: str) -> str:
    """Run ``load`` (code reading ``data``) in a child limited to 1 GiB and 10 s more than
    importing fxloom takes; it must finish and report a refusal naming ``words``."""
    path = tmp_path / "hostile"
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    script = BOUNDED_CHILD.replace("{load}", load)
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(path)],
        capture_output=True,
        text=True,
        timeout=300,  # a hang would first hit the CPU limit; this only guards the test run
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.startswith("refused:"), child.stdout[-2000:]
    for word in words:
        assert word in child.stdout, child.stdout
    return child.stdout


LOAD = "fxloom.load(data)"
EXPORT_LOAD = "fxloom.export.load(data)"
PARSE = "fxloom.parse_graph(data.decode())"


# ------------------------------------------------------------------ archive members
def test_a_member_past_its_size_limit_is_refused_while_decompressing(monkeypatch):
    monkeypatch.setattr(archive, "MAX_JSON_BYTES", 3 * limits.READ_CHUNK_BYTES)
    padded = b"[" + b" " * (4 * limits.READ_CHUNK_BYTES) + b"]"
    refused(fxloom.load, rezipped(saved_module(), {PROGRAM: padded}), PROGRAM, "limit of")


def test_a_zip_bomb_is_refused_by_its_compression_ratio():
    bomb = b"[" + b" " * (128 * 2**20) + b"]"  # 128 MiB of spaces deflate to about 128 KiB
    data = rezipped(saved_module(), {PROGRAM: bomb})
    assert len(data) < 2**20
    ratio = f"limit of {limits.MAX_COMPRESSION_RATIO}"
    refused(fxloom.load, data, "compression ratio", PROGRAM, ratio)


def test_compressed_weights_are_refused_by_their_compression_ratio():
    """1 MiB of file asking for 2.3 GB used to be read whole; now reading stops at the ratio."""
    blob = io.BytesIO()
    write_tensors(blob, {"0.weight": torch.zeros(16 * 2**20, dtype=torch.uint8)})
    data = rezipped(saved_module(), {WEIGHTS: blob.getvalue()})
    refused(fxloom.load, data, "compression ratio", WEIGHTS)


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_a_member_held_twice_is_refused():
    data = saved_module()
    program = dict(members(data))[PROGRAM]
    twice = rezipped(data, {}, extra=[(PROGRAM, program)])
    refused(fxloom.load, twice, PROGRAM, "twice")


def test_json_values_are_counted_before_parsing(tmp_path):
    """4 million empty objects (12 MiB, stored) would take gigabytes once parsed."""
    many = b"[" + b"{}," * limits.MAX_JSON_VALUES + b"{}]"
    data = rezipped(saved_module(), {PROGRAM: many}, stored=True)
    refused_in_bounded_child(tmp_path, data, LOAD, "values of", PROGRAM, "limit of")


def test_a_real_file_is_far_below_every_archive_limit():
    data = saved_module()
    program = dict(members(data))[PROGRAM]
    assert program.count(b",") + program.count(b"{") + program.count(b"[") < 1000
    assert fxloom.load(data) is not None


# ------------------------------------------------------------------ safetensors weights
def test_more_empty_tensors_than_the_limit_are_refused_before_any_is_made(tmp_path):
    """A million of them took 20 s to make; twice the limit fit in a header of 16 MB."""
    entry = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
    header = {f"t{i}": entry for i in range(2 * limits.MAX_TENSORS)}
    data = rezipped(saved_module(), {WEIGHTS: weights_blob(header)}, stored=True)
    refused_in_bounded_child(tmp_path, data, LOAD, "tensors", f"limit of {limits.MAX_TENSORS:,}")


def test_a_weights_header_past_its_limit_is_refused():
    blob = (limits.MAX_SAFETENSORS_HEADER_BYTES + 1).to_bytes(8, "little") + b"{}"
    refused(fxloom.load, rezipped(saved_module(), {WEIGHTS: blob}), "header", "limit of")


def test_tensors_sharing_bytes_are_refused():
    """Many tensors naming the same bytes would each be allocated: memory past the file's."""
    entry = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    blob = weights_blob({"a": entry, "b": entry}, bytes(16))
    refused(fxloom.load, rezipped(saved_module(), {WEIGHTS: blob}), "overlap")


def test_a_tensor_of_too_many_dimensions_is_refused():
    entry = {"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}
    blob = weights_blob({"a": entry}, bytes(4))
    refused(fxloom.load, rezipped(saved_module(), {WEIGHTS: blob}), "dimensions", "limit of 64")


# ------------------------------------------------------------------ symbolic sizes
def add_fact(fact):
    return lambda program: program["shape_env"]["facts"].append(fact)


def nested_powers(levels: int) -> dict:
    expr = {"symbol": "s0"}
    for _ in range(levels):
        expr = {"op": "Pow", "args": [expr, 64]}
    return expr


def max_of_sums(count: int, terms: int) -> dict:
    def term(a, k):
        return {"op": "Mul", "args": [a + k + 1, {"symbol": "s0"}]}

    sums = [{"op": "Add", "args": [term(a, k) for k in range(terms)]} for a in range(count)]
    return {"op": "Max", "args": sums}


def symbol_of(data: bytes) -> str:
    return json.loads(dict(members(data))[PROGRAM])["shape_env"]["symbols"][0]["name"]


def test_nested_powers_are_refused_by_the_bits_their_value_needs(tmp_path):
    """(((s0**64)**64)**64)...: 2 KB of file whose value has more bits than memory."""
    original = saved_dynamic()
    fact = json.loads(json.dumps(nested_powers(40)).replace("s0", symbol_of(original)))
    data = with_program(original, add_fact({"op": "Eq", "args": [fact, 1]}))
    refused_in_bounded_child(tmp_path, data, EXPORT_LOAD, "bits", "limit of")


def test_one_max_of_many_sums_is_refused_by_its_argument_count(tmp_path):
    original = saved_dynamic()
    fact = json.loads(json.dumps(max_of_sums(256, 4)).replace("s0", symbol_of(original)))
    data = with_program(original, add_fact({"op": "Ge", "args": [fact, 1]}))
    refused_in_bounded_child(tmp_path, data, EXPORT_LOAD, "argument count of one Max", "16")


def test_many_small_expressions_share_one_budget_per_file(tmp_path):
    """Each Max is small; their number is what the file-wide budget bounds."""
    original = saved_dynamic()
    symbol = symbol_of(original)
    fact = json.loads(json.dumps(max_of_sums(16, 8)).replace("s0", symbol))
    fact = {"op": "Ge", "args": [fact, 1]}

    def many(program):
        program["shape_env"]["facts"].extend([fact] * 400)

    data = with_program(original, many)
    refused_in_bounded_child(tmp_path, data, EXPORT_LOAD, "symbolic expressions", "limit of")


def test_many_symbols_are_charged_to_the_same_budget(tmp_path):
    """Each symbol's range is two expressions; declaring symbols used to scan the others."""
    original = saved_dynamic()

    def many(program):
        (record,) = program["shape_env"]["symbols"]
        program["shape_env"]["symbols"] = [
            {**record, "name": f"s{i}"} for i in range(limits.MAX_EXPRESSION_NODES)
        ]

    data = with_program(original, many)
    refused_in_bounded_child(tmp_path, data, EXPORT_LOAD, "symbolic expressions", "limit of")


def test_an_exponent_must_be_a_small_number():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    power = {"op": "Pow", "args": [2, {"symbol": "s0"}]}
    with pytest.raises(SerializationError, match="not a number"):
        decode_expr(power, {"s0": s0}, "test")
    with pytest.raises(SerializationError, match="exponent of a power.*limit of 64"):
        decode_expr({"op": "Pow", "args": [{"symbol": "s0"}, 65]}, {"s0": s0}, "test")


def test_integers_in_expressions_are_bounded():
    with pytest.raises(SerializationError, match="magnitude of an integer"):
        decode_expr(2**65, {}, "test")


def test_expressions_are_read_as_written_without_simplifying():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    read = decode_expr({"op": "Add", "args": [1, 2, {"symbol": "s0"}]}, {"s0": s0}, "test")
    assert isinstance(read, sympy.Add) and read.args == (1, 2, s0)


def test_a_real_dynamic_program_is_far_below_the_expression_budget():
    loaded = fxloom.export.load(saved_dynamic())
    assert loaded.module()(torch.randn(7, 3, 5)).shape == (7, 15)


# ------------------------------------------------------------------ graph text
HEADER = "graph():\n    %x : [num_users=1] = placeholder[target=x]\n"


def call_line(args: str) -> str:
    """A node ``%y`` calling ``operator.getitem`` on ``args``."""
    call = "call_function[target=operator.getitem]"
    return f"    %y : [num_users=1] = {call}(args = ({args}), kwargs = {{}})\n"


def test_one_megabyte_line_of_graph_text_is_read_in_linear_time(tmp_path):
    """The old header pattern backtracked on this line without end."""
    line = "    %a : " + " [num_users=1] = x[target=" * (2**20 // 25)
    refused_in_bounded_child(tmp_path, HEADER + line, PARSE, "expected '%name")


def test_one_megabyte_of_arguments_parses(tmp_path):
    text = HEADER + call_line("%x, [" + "1, " * (2**20 // 3) + "]") + "    return y"
    path = tmp_path / "text"
    path.write_text(text)
    script = BOUNDED_CHILD.replace("{load}", PARSE).replace('print("loaded")', 'print("parsed")')
    child = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0 and child.stdout.startswith("parsed"), child.stderr[-2000:]


def nested(depth: int) -> str:
    return "(" * depth + "0," + ")" * depth


def test_graph_text_and_files_share_one_nesting_limit():
    depth = limits.MAX_ARGUMENT_DEPTH
    graph = fxloom.parse_graph(HEADER + call_line(f"%x, {nested(depth)}") + "    return y")
    gm = fxloom.GraphModule(nn.Module(), graph)
    f = io.BytesIO()
    fxloom.save(gm, f)
    assert str(fxloom.load(f.getvalue()).graph) == str(graph)
    too_deep = HEADER + call_line(f"%x, {nested(depth + 1)}")
    message = f"nested too deeply: level {depth + 1}.*limit of {depth}"
    with pytest.raises(GraphParseError, match=message):
        fxloom.parse_graph(too_deep)


def test_a_file_nested_one_level_past_the_limit_is_refused():
    depth = limits.MAX_ARGUMENT_DEPTH
    graph = fxloom.parse_graph(HEADER + call_line(f"%x, {nested(depth)}") + "    return y")

    def deeper(program):
        (node,) = [n for n in program["module"]["graph"]["nodes"] if n["name"] == "y"]
        node["args"][1] = {"tuple": [node["args"][1]]}

    f = io.BytesIO()
    fxloom.save(fxloom.GraphModule(nn.Module(), graph), f)
    refused(fxloom.load, with_program(f.getvalue(), deeper), "nested too deeply", "limit of 64")


@pytest.mark.parametrize("depth", [100, 10_000, 200_000])
def test_deep_nesting_in_graph_text_is_a_parse_error_not_a_recursion_error(depth):
    with pytest.raises(GraphParseError, match="nested too deeply"):
        fxloom.parse_graph(HEADER + call_line(f"%x, {nested(depth)}"))
    with pytest.raises(GraphParseError, match="nested too deeply"):
        fxloom.parse_graph(HEADER + call_line(f"%x, {'[' * depth + ']' * depth}"))


def test_deeply_nested_type_annotations_are_refused():
    annotation = "list[" * 500 + "int" + "]" * 500
    text = f"graph():\n    %x : {annotation} [num_users=1] = placeholder[target=x]\n"
    with pytest.raises(GraphParseError, match="type annotation is nested too deeply"):
        fxloom.parse_graph(text)


def test_graph_text_past_its_size_limit_is_refused(monkeypatch):
    monkeypatch.setattr(limits, "MAX_GRAPH_TEXT_BYTES", 100)
    with pytest.raises(GraphParseError, match="graph text is too large.*limit of 100"):
        fxloom.parse_graph(HEADER + call_line("%x, 0") + "    return y")


def test_graph_text_past_its_node_limit_is_refused(monkeypatch):
    monkeypatch.setattr(limits, "MAX_GRAPH_NODES", 1)
    with pytest.raises(GraphParseError, match="nodes of the graph text.*limit of 1"):
        fxloom.parse_graph(HEADER + call_line("%x, 0") + "    return y")


@pytest.mark.parametrize(
    "argument, message",
    [
        ("1" * 5000, "invalid number"),
        ("'\\N{no such character}'", "invalid string"),
        ("device('cuda:99999999999999999999')", "cannot build device"),
        ("'" + "\\'" * 1000, "cannot read"),
    ],
)
def test_malformed_values_in_graph_text_are_parse_errors(argument, message):
    with pytest.raises(GraphParseError, match=message):
        fxloom.parse_graph(HEADER + call_line(f"%x, {argument}"))
