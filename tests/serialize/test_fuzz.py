"""Fuzzing fxloom.load: mutated files load as a working module or raise SerializationError.

Three valid files (an MLP, a conv net, a graph with kwargs, slices and dtypes)
are mutated three ways: random bytes of the zip, random edits of the parsed
``program.json`` (values replaced, deleted or inserted at random JSON paths,
node names swapped, opcodes and targets changed), and random bytes of the
safetensors blob. ``fxloom.load`` must either raise ``SerializationError`` or
return a GraphModule; that module, called on the example input, either runs
or raises one of ``RUN_ERRORS`` — the errors a valid graph with wrong values
raises (a shape mismatch, an index out of range), never a crash of the loader.
"""

import io
import json
import zipfile

import torch
from hostile import RUN_ERRORS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import fxloom
from fxloom.graph_module import GraphModule

PROGRAM = "fxloom/program.json"
WEIGHTS = "fxloom/weights.safetensors"

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Mixed(nn.Module):
    def forward(self, x):
        y = x[:, 1:3].to(dtype=torch.float64)
        z = torch.cat([y, y * 2], dim=-1)
        return z.sum(dim=(0,), keepdim=True).float(), x.shape[0]


def _files() -> list[tuple[bytes, torch.Tensor]]:
    torch.manual_seed(0)
    models = [
        (nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(3, 4)),
        (
            nn.Sequential(
                nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(32, 3)
            ).eval(),
            torch.randn(2, 1, 6, 6),
        ),
        (Mixed(), torch.randn(3, 5)),
    ]
    files = []
    for model, x in models:
        f = io.BytesIO()
        fxloom.save(fxloom.symbolic_trace(model), f)
        files.append((f.getvalue(), x))
    return files


FILES = _files()


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {name: z.read(name) for name in z.namelist()}


def rezipped(data: bytes, member: str, content: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, old in members(data).items():
            z.writestr(name, content if name == member else old, zipfile.ZIP_DEFLATED)
    return out.getvalue()


def assert_loads_or_refuses(data: bytes, x: torch.Tensor) -> None:
    try:
        gm = fxloom.load(data)
    except fxloom.SerializationError:
        return
    assert isinstance(gm, GraphModule)
    try:
        gm(x)
    except RUN_ERRORS:
        pass


def flipped(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    buffer = bytearray(data)
    for position, byte in edits:
        buffer[position % len(buffer)] = byte
    return bytes(buffer)


byte_edits = st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), min_size=1, max_size=6)
file_index = st.integers(0, len(FILES) - 1)


@FUZZ
@given(file_index, byte_edits)
def test_random_bytes_of_the_zip(index, edits):
    data, x = FILES[index]
    assert_loads_or_refuses(flipped(data, edits), x)


@FUZZ
@given(st.integers(0, 1), byte_edits, st.booleans())  # the files that have weights
def test_random_bytes_of_the_weights(index, edits, in_header):
    data, x = FILES[index]
    blob = members(data)[WEIGHTS]
    if in_header:  # the 8-byte length and the JSON header, where damage is not just values
        header_end = 8 + int.from_bytes(blob[:8], "little")
        edits = [(p % header_end, b) for p, b in edits]
    assert_loads_or_refuses(rezipped(data, WEIGHTS, flipped(blob, edits)), x)


# ----------------------------------------------------------- program.json edits
WORDS = [
    "x", "input_1", "output", "relu", "lin", "0", "1", "weight", "bias", "t0", "t1", "float",
    "float64", "cpu", "node", "tuple", "dict", "slice", "dtype", "function", "size", "tensor",
    "shape", "stride", "key", "class", "name", "op", "target", "args", "kwargs", "meta", "val",
    "children", "context", "container", "getattr", "__class__", "torch.relu", "operator.add",
    "os.system", "builtins.eval", "torch.nn.modules.linear.Linear", "placeholder", "call_module",
]  # fmt: skip
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 64)
    | st.floats(-10, 10, width=32)
    | st.sampled_from(WORDS),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(WORDS), children, max_size=3)
    ),
    max_leaves=8,
)
OPCODES = ["placeholder", "get_attr", "call_function", "call_method", "call_module", "output", "x"]
TARGETS = [
    "torch.relu", "operator.add", "operator.getitem", "getattr", "torch.cat", "size", "view",
    "0", "1", "0.weight", "x", "output", "os.system", "torch.ops.aten.add.Tensor", "float",
]  # fmt: skip


def paths(document, prefix=()):
    """Every JSON path in ``document`` (keys and indices), parents before children."""
    yield prefix
    if isinstance(document, dict):
        for key, value in document.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            yield from paths(value, (*prefix, i))


def at(document, path):
    for step in path:
        document = document[step]
    return document


def mutate(document, draw) -> None:
    """One random edit of ``document``, in place."""
    nodes = _nodes(document)
    kind = draw(st.sampled_from(["replace", "delete", "insert", "swap", "op", "target"]))
    if kind in ("swap", "op", "target") and nodes:
        node = nodes[draw(st.integers(0, len(nodes) - 1))]
        if kind == "swap":
            other = nodes[draw(st.integers(0, len(nodes) - 1))]
            node["name"], other["name"] = other.get("name"), node.get("name")
        else:
            node[kind] = draw(st.sampled_from(OPCODES if kind == "op" else TARGETS))
        return
    all_paths = list(paths(document))[1:]
    if not all_paths:
        return
    path = all_paths[draw(st.integers(0, len(all_paths) - 1))]
    parent, step = at(document, path[:-1]), path[-1]
    if kind == "replace":
        parent[step] = draw(json_values)
    elif kind == "delete":
        del parent[step]
    elif isinstance(parent, list):
        parent.insert(step, draw(json_values))
    else:
        parent[draw(st.sampled_from(WORDS))] = draw(json_values)


def _nodes(document) -> list:
    try:
        nodes = document["module"]["graph"]["nodes"]
    except (KeyError, TypeError, IndexError):
        return []
    return [n for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []


@FUZZ
@given(file_index, st.data())
def test_random_edits_of_the_program(index, data):
    original, x = FILES[index]
    document = json.loads(members(original)[PROGRAM])
    for _ in range(data.draw(st.integers(1, 3))):
        mutate(document, data.draw)
    edited = rezipped(original, PROGRAM, json.dumps(document).encode())
    assert_loads_or_refuses(edited, x)


def test_the_unmutated_files_load_and_run():
    for data, x in FILES:
        fxloom.load(data)(x)


# ------------------------------------------------------------ symbolic expressions
# An exported program with a symbolic batch size; expressions drawn below (deep, wide, with
# big exponents and integers) replace or join those of its ShapeEnv and node meta.
# ``fxloom.export.load`` must return an ExportedProgram or raise SerializationError, within
# the limits (``fxloom.serialize.limits``) that keep each load small.
class Flatten(nn.Module):
    def forward(self, x):
        return x.flatten(1) * 2


def _dynamic_file() -> bytes:
    from fxloom.export import Dim, export

    ep = export(Flatten(), (torch.randn(4, 3, 5),), dynamic_shapes={"x": {0: Dim("b", max=64)}})
    f = io.BytesIO()
    fxloom.export.save(ep, f)
    return f.getvalue()


DYNAMIC = _dynamic_file()
EXPRESSION_OPS = ["Add", "Mul", "Pow", "Mod", "floor", "Max", "Min", "Eq", "Lt", "And", "Not"]
expression_leaves = (
    st.integers(-(2**70), 2**70)
    | st.sampled_from(["oo", "-oo", True, False])
    | st.builds(lambda n: {"symbol": n}, st.sampled_from(["s0", "s1", "i0", "x", ""]))
    | st.builds(lambda p, q: {"rational": [p, q]}, st.integers(-9, 9), st.integers(-9, 9))
    | st.builds(lambda v: {"float": v}, st.floats(-1e6, 1e6))
)


def _nest(op: str, depth: int, leaf, exponent: int) -> dict:
    """``op`` applied ``depth`` times (a power raises to ``exponent`` each time)."""
    for _ in range(depth):
        leaf = {"op": op, "args": [leaf, exponent] if op == "Pow" else [leaf, 1]}
    return leaf


def _expressions(children):
    ops = st.sampled_from(EXPRESSION_OPS)
    return (
        st.builds(lambda op, args: {"op": op, "args": args}, ops, st.lists(children, max_size=4))
        | st.builds(  # wide: one node of many arguments (leaves: repeating a wide child
            # would multiply the file's size, not the work per byte)
            lambda op, n, leaf: {"op": op, "args": [leaf] * n},
            ops,
            st.integers(0, 400),
            expression_leaves,
        )
        | st.builds(_nest, ops, st.sampled_from([2, 3, 8, 70, 300]), children, st.integers(-99, 99))
    )


expressions = st.recursive(expression_leaves, _expressions, max_leaves=12)


def _symbolic_sizes(document) -> list:
    """The ``{"expr": ...}`` sizes in the program's node meta (where a drawn one can go)."""
    return [
        value
        for path in paths(document)
        if isinstance(value := at(document, path), dict) and set(value) == {"expr", "type"}
    ]


def _place_expression(document, where: str, expr, draw) -> None:
    env = document["shape_env"]
    symbol = env["symbols"][0]["name"]
    expr = json.loads(json.dumps(expr).replace('"s0"', json.dumps(symbol)))
    sizes = _symbolic_sizes(document)
    if where == "size" and sizes:
        sizes[draw(st.integers(0, len(sizes) - 1))]["expr"] = expr
    elif where == "guard":
        env["guards"].append({"expr": expr, "location": None, "code": "x.shape[0] > 1"})
    elif where == "replacement":
        env["replacements"].append([symbol, expr])
    elif where == "range":
        document["range_constraints"].append([expr, 0, "oo"])
    else:
        env["facts"].extend([expr] * draw(st.integers(1, 50)))


@settings(FUZZ, max_examples=60)
@given(st.data())
def test_mutated_symbolic_expressions_load_or_are_refused(data):
    document = json.loads(members(DYNAMIC)[PROGRAM])
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(["size", "guard", "replacement", "range", "facts"]))
        _place_expression(document, where, data.draw(expressions), data.draw)
    edited = rezipped(DYNAMIC, PROGRAM, json.dumps(document).encode())
    try:
        loaded = fxloom.export.load(edited)
    except fxloom.SerializationError:
        return
    assert isinstance(loaded, fxloom.export.ExportedProgram)


# ------------------------------------------------------------ graph text
# Printed graphs, edited at random (tokens inserted, repeated thousands of times for depth,
# text cut out) or replaced by garbage: ``parse_graph`` returns a Graph or raises
# GraphParseError, never another exception, and never hangs.
TEXTS = [
    str(fxloom.symbolic_trace(Mixed()).graph),
    str(fxloom.symbolic_trace(nn.Sequential(nn.Linear(4, 8), nn.ReLU())).graph),
]
TEXT_PIECES = [
    "(", ")", "[", "]", "{", "}", ",", ":", "=", "%x", "'", '"', "\\", "...", "-", "1e5", ".5",
    "-inf", "torch.relu", "os.system", " [num_users=1] = ", "\n", "%", "slice(", "device(",
    "torch.Size([", "list[", " | ", "9" * 50, "args = (", "kwargs = {", "return ", "graph():",
]  # fmt: skip
text_edits = st.lists(
    st.tuples(
        st.integers(0, 2**16),  # where
        st.sampled_from(TEXT_PIECES) | st.text(max_size=4),  # what
        st.sampled_from([1, 1, 1, 2, 70, 3000]),  # how many times
        st.integers(0, 8),  # how many characters it replaces
    ),
    min_size=1,
    max_size=5,
)


def edited_text(text: str, edits) -> str:
    for where, piece, times, cut in edits:
        where %= len(text) + 1
        text = text[:where] + piece * times + text[where + cut :]
    return text


@settings(FUZZ, max_examples=150)
@given(st.sampled_from(TEXTS), text_edits)
def test_mutated_graph_text_parses_or_is_refused(text, edits):
    from fxloom.serialize.graph_text import GraphParseError

    try:
        graph = fxloom.parse_graph(edited_text(text, edits))
    except GraphParseError:
        return
    assert isinstance(graph, fxloom.Graph)


@settings(FUZZ, max_examples=100)
@given(st.text(max_size=300))
def test_garbage_after_the_graph_line_is_refused(garbage):
    from fxloom.serialize.graph_text import GraphParseError

    try:
        fxloom.parse_graph("graph():\n    " + garbage)
    except GraphParseError:
        pass
