"""fxloom.load never runs code from a file: every malicious file is refused with a
SerializationError naming the culprit, and nothing it asks for is executed.

Each test saves a small valid GraphModule, rewrites one member of the zip
(``fxloom/program.json``, ``fxloom/format.json`` or ``fxloom/weights.safetensors``)
and loads it with a sentinel watching ``os.system``, ``subprocess``, ``eval``,
``exec`` of file text, imports of unexpected modules and every way to unpickle.
"""

import builtins
import collections
import importlib
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile

import pytest
import torch
from torch import nn

import fxloom
from fxloom.serialize import allowlist, archive

PROGRAM = "fxloom/program.json"
FORMAT = "fxloom/format.json"
WEIGHTS = "fxloom/weights.safetensors"
MARKER = "fxloom_pwned"


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("scale", torch.ones(2))

    def forward(self, x):
        return torch.relu(self.lin(x)).add(self.scale).sum(dim=1, keepdim=True)


Point = collections.namedtuple("Point", "x y")  # a container class nobody registered


def saved(model=None) -> bytes:
    f = io.BytesIO()
    fxloom.save(fxloom.symbolic_trace(model or Small()), f)
    return f.getvalue()


def rewrite(data: bytes, member: str, content: bytes | None) -> bytes:
    """``data`` with ``member`` replaced by ``content`` (added if new, removed if None)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            if info.filename != member:
                dst.writestr(info, src.read(info))
        if content is not None:
            dst.writestr(member, content, zipfile.ZIP_DEFLATED)
    return out.getvalue()


def edited(edit, member: str = PROGRAM, data: bytes | None = None) -> bytes:
    """A saved file whose JSON ``member`` went through ``edit(document)`` (in place)."""
    data = data or saved()
    document = json.loads(zipfile.ZipFile(io.BytesIO(data)).read(member))
    edit(document)
    return rewrite(data, member, json.dumps(document).encode())


def node(program: dict, name: str) -> dict:
    return next(n for n in program["module"]["graph"]["nodes"] if n["name"] == name)


@pytest.fixture
def sentinel(monkeypatch, tmp_path):
    """Records every dangerous call made during the test; ``sentinel.target`` is the file
    a payload would create."""
    calls = []

    def record(what):
        return lambda *a, **k: calls.append((what, a))

    def refuse(what):
        def refused(*a, **k):
            calls.append((what, a))
            raise AssertionError(f"{what} called while loading")

        return refused

    real_eval, real_exec, real_import = builtins.eval, builtins.exec, importlib.import_module

    def watched(what, run):
        # Tracing and codegen compile their own code; text from a payload must never run.
        def run_unless_payload(source, *a, **k):
            text = source if isinstance(source, (str, bytes)) else ""
            if any(word in str(text) for word in (MARKER, "import", "system")):
                calls.append((what, source))
            return run(source, *a, **k)

        return run_unless_payload

    def watched_import(name, *a, **k):
        if not name.startswith(("torch", "fxloom", "safetensors")):
            calls.append(("import_module", name))
        return real_import(name, *a, **k)

    for owner, name in [(os, "system"), (subprocess, "Popen"), (subprocess, "run")]:
        monkeypatch.setattr(owner, name, record(f"{owner.__name__}.{name}"))
    monkeypatch.setattr(builtins, "eval", watched("eval", real_eval))
    monkeypatch.setattr(builtins, "exec", watched("exec", real_exec))
    monkeypatch.setattr(importlib, "import_module", watched_import)
    for owner, name in [
        (pickle, "loads"),
        (pickle, "load"),
        (pickle, "Unpickler"),
        (torch, "load"),
    ]:
        monkeypatch.setattr(owner, name, refuse(f"{owner.__name__}.{name}"))
    registered = allowlist.registered()

    class Sentinel:
        target = tmp_path / MARKER
        command = f"touch {tmp_path / MARKER}"

    yield Sentinel
    assert calls == []
    assert not Sentinel.target.exists()
    assert allowlist.registered() == registered  # a refused file changes no registered state


def refused(data: bytes, *culprits: str) -> str:
    """Loading ``data`` raises SerializationError (and returns nothing) naming each culprit."""
    modules = set(sys.modules)
    with pytest.raises(fxloom.SerializationError) as info:
        fxloom.load(data)
    imported = set(sys.modules) - modules
    assert all(m.startswith(("torch", "fxloom", "safetensors")) for m in imported), imported
    message = str(info.value)
    for culprit in culprits:
        assert culprit in message
    return message


def test_the_unmodified_file_loads(sentinel):
    model = Small()
    x = torch.randn(4, 3)
    assert torch.equal(fxloom.load(saved(model))(x), model(x))


# ------------------------------------------------------------ call targets
@pytest.mark.parametrize(
    "target",
    [
        "os.system",
        "posix.system",
        "builtins.eval",
        "builtins.exec",
        "builtins.__import__",
        "builtins.open",
        "eval",
        "__import__",
        "subprocess.Popen",
        "subprocess.run",
        "importlib.import_module",
        "torch.load",
        "torch.serialization.load",
        "operator.attrgetter",
        "operator.methodcaller",
        "torch.os.system",
        "torch.nn.functional.torch.os.system",
        "torch.serialization.pickle.loads",
        "torch.ops.aten.__dict__",
        "torch.ops.aten.add.Tensor.__call__",
        "torch.ops.aten.add.Tensor.Tensor.x",
        "torch.ops.aten",
        # generated code may call the reusing form (codegen decides it from the graph); a file
        # may not name it, nor the kernel table's machinery
        "fxloom.quantize.ops.conv2d_add_int8_into_other",
        "fxloom.quantize.ops._entry",
        "fxloom.quantize.kernels.run",
    ],
)
def test_call_function_target_off_the_allowlist_is_refused(sentinel, target):
    def edit(program):
        node(program, "relu")["target"] = target
        node(program, "relu")["args"] = [sentinel.command]

    refused(edited(edit), target, "allowlist")


@pytest.mark.parametrize("target", ["os.system", "builtins.eval", "subprocess.run"])
def test_function_value_off_the_allowlist_is_refused(sentinel, target):
    def edit(program):
        node(program, "add")["args"][1] = {"function": target}

    refused(edited(edit), target, "add")


@pytest.mark.parametrize("attribute", ["__class__", "__globals__", "__reduce_ex__"])
def test_getattr_of_a_dunder_is_refused(sentinel, attribute):
    def edit(program):
        node(program, "relu")["target"] = "getattr"
        node(program, "relu")["args"] = [{"node": "lin"}, attribute]

    refused(edited(edit), attribute, "relu")


def test_getattr_with_a_computed_name_is_refused(sentinel):
    """``getattr(x, "__cl" + "ass__")``: a name computed while running could be anything."""

    def edit(program):
        nodes = program["module"]["graph"]["nodes"]
        index = nodes.index(node(program, "relu"))
        nodes.insert(
            index,
            {
                "name": "attr",
                "op": "call_function",
                "target": "operator.add",
                "args": ["__cl", "ass__"],
            },
        )
        node(program, "relu")["target"] = "getattr"
        node(program, "relu")["args"] = [{"node": "lin"}, {"node": "attr"}]

    refused(edited(edit), "getattr", "relu")


@pytest.mark.parametrize("attribute", ["gi_frame", "f_globals", "tb_frame", "f_builtins"])
def test_getattr_of_frame_and_generator_internals_is_refused(sentinel, attribute):
    def edit(program):
        node(program, "relu")["target"] = "getattr"
        node(program, "relu")["args"] = [{"node": "lin"}, attribute]

    refused(edited(edit), attribute, "relu")


@pytest.mark.parametrize("method", ["__reduce_ex__", "__setattr__", "__getattribute__", "system"])
def test_call_method_off_the_tensor_methods_is_refused(sentinel, method):
    def edit(program):
        node(program, "add")["target"] = method

    refused(edited(edit), method, "add")


# ---------------------------------------------------------- module classes
@pytest.mark.parametrize(
    "cls",
    [
        "subprocess.Popen",
        "os._wrap_close",
        "collections.OrderedDict",
        "torch.nn.modules.linear.torch.os.system",
        "fxloom.__main__.main",
        "torch.nn.__main__.X",
    ],
)
def test_module_class_off_the_allowlist_is_refused(sentinel, cls):
    def edit(program):
        program["module"]["children"]["lin"]["class"] = cls

    refused(edited(edit), cls, "module class")


@pytest.mark.parametrize(
    "cls", ["subprocess.Popen", f"{Point.__module__}.{Point.__qualname__}", "os._wrap_close"]
)
def test_container_class_off_the_allowlist_is_refused(sentinel, cls):
    def edit(program):
        node(program, "add")["args"][1] = {
            "container": cls,
            "children": [sentinel.command],
            "context": None,
        }

    refused(edited(edit), cls)


# A ModelOutput class registers itself with torch's pytree when its module is imported: a
# file naming one from a module nobody imported is refused, and loading imports nothing.
UNIMPORTED_OUTPUT = "transformers.models.mamba2.modeling_mamba2.Mamba2Output"


@pytest.fixture
def unimported_output():
    module = UNIMPORTED_OUTPUT.rpartition(".")[0]
    assert module not in sys.modules
    yield UNIMPORTED_OUTPUT
    assert module not in sys.modules


def test_registered_container_class_of_a_module_not_imported_is_refused(
    sentinel, unimported_output
):
    def edit(program):
        node(program, "add")["args"][1] = {
            "container": unimported_output,
            "children": [sentinel.command],
            "context": ["logits"],
        }

    refused(edited(edit), unimported_output)


def test_tree_spec_naming_a_class_of_a_module_not_imported_is_refused(sentinel, unimported_output):
    def edit(program):
        spec = {"type": unimported_output, "context": ["logits"], "children": [None]}
        program["module"]["graph"]["codegen"] = {
            "kind": "pytree",
            "orig_args": ["x"],
            "in_spec": {"type": "tuple", "context": None, "children": [None]},
            "out_spec": spec,
        }

    refused(edited(edit), unimported_output)


# ------------------------------------------------- code through identifiers
INJECTIONS = ["x; import os", "x=__import__('os').system('true')", "a\nimport os", "", "1x"]


@pytest.mark.parametrize("name", INJECTIONS + ["for", "a.b"])
def test_node_name_that_is_not_an_identifier_is_refused(sentinel, name):
    def edit(program):
        node(program, "relu")["name"] = name

    refused(edited(edit), "node name", "not a valid identifier")


@pytest.mark.parametrize("target", INJECTIONS + ["*x; import os", "***x"])
def test_placeholder_target_that_is_not_an_identifier_is_refused(sentinel, target):
    def edit(program):
        node(program, "x")["target"] = target

    refused(edited(edit), "parameter name")


@pytest.mark.parametrize("key", INJECTIONS + ["dim=__import__('os')"])
def test_keyword_that_is_not_an_identifier_is_refused(sentinel, key):
    def edit(program):
        node(program, "sum_1")["kwargs"] = {key: 1}

    refused(edited(edit), "keyword")


@pytest.mark.parametrize(
    "path", ["scale.__class__", "x; import os", "scale..x", "_modules.__dict__"]
)
@pytest.mark.parametrize("op, name", [("get_attr", "scale"), ("call_module", "lin")])
def test_attribute_path_that_is_not_dotted_identifiers_is_refused(sentinel, op, name, path):
    def edit(program):
        node(program, name)["target"] = path

    refused(edited(edit), "attribute path")


def test_codegen_parameter_name_that_is_not_an_identifier_is_refused(sentinel):
    def edit(program):
        program["module"]["graph"]["codegen"] = {
            "kind": "pytree",
            "orig_args": ["x, y=__import__('os')"],
            "in_spec": None,
            "out_spec": None,
        }

    refused(edited(edit), "parameter name")


def test_graph_module_class_name_that_is_not_an_identifier_is_refused(sentinel):
    def edit(program):
        program["module"]["class_name"] = "G(__import__('os').system('true'))"

    refused(edited(edit), "class name")


@pytest.mark.parametrize(
    "name", ["forward", "_parameters", "__dict__", "__class__", "_call_impl", "x; import os"]
)
def test_module_attribute_that_is_not_plain_data_is_refused(sentinel, name):
    def edit(program):
        program["module"]["children"]["lin"]["attributes"][name] = 1

    refused(edited(edit), "attribute")


@pytest.mark.parametrize("name", ["__dict__", "x; import os"])
def test_parameter_buffer_and_child_names_must_be_identifiers(sentinel, name):
    for field in ("parameters", "buffers", "children"):

        def edit(program, field=field):
            program["module"]["children"]["lin"][field][name] = None

        refused(edited(edit), name)


# ---------------------------------------------------------------- devices
HOSTILE_DEVICES = [
    "cuda:0; import os",
    "__import__('os').system('true')",
    "cpu\n",
    " cuda",
    "CUDA",
    "cuda:-1",
    "cuda:00",
    "cuda:9999",  # torch keeps 8 bits of an index: this would be cuda:15
    "lazy",  # a device type torch knows, but not one a file may name
    "cuda:" + "9" * 10_000,
    7,
    {"device": "cpu"},
]


@pytest.mark.parametrize("device", HOSTILE_DEVICES, ids=repr)
def test_a_tensor_record_whose_device_is_not_a_plain_device_is_refused(sentinel, device):
    def edit(program):
        program["module"]["children"]["lin"]["parameters"]["weight"]["device"] = device

    refused(edited(edit), "lin.weight", "is not a device")


@pytest.mark.parametrize("device", HOSTILE_DEVICES, ids=repr)
def test_a_device_argument_that_is_not_a_plain_device_is_refused(sentinel, device):
    def edit(program):
        node(program, "sum_1")["kwargs"]["device"] = {"device": device}

    refused(edited(edit), "is not a device")


# ---------------------------------------------------------------- pickles
SYSTEM = os.system  # the real one: pickling a payload looks it up by name after the sentinel


class Payload:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (SYSTEM, (self.command,))


@pytest.mark.parametrize("member, culprit", [(WEIGHTS, "weights"), (PROGRAM, PROGRAM)])
def test_pickled_payload_as_a_member_is_refused_without_unpickling(sentinel, member, culprit):
    payload = pickle.dumps(Payload(sentinel.command), protocol=2)
    refused(rewrite(saved(), member, payload), culprit)


def test_pickled_payload_as_an_extra_member_is_refused_without_unpickling(sentinel):
    payload = pickle.dumps(Payload(sentinel.command), protocol=4)
    refused(rewrite(saved(), "data.pkl", payload), "data.pkl")


def test_torch_save_file_is_refused_without_unpickling(sentinel):
    f = io.BytesIO()
    torch.save({"payload": Payload(sentinel.command)}, f)
    refused(f.getvalue(), "not an fxloom file", "archive/")


# ------------------------------------------------------------- the archive
@pytest.mark.parametrize("member", ["../evil.json", "/etc/passwd", "fxloom/../../x", "C:x"])
def test_member_outside_the_archive_is_refused(sentinel, member):
    refused(rewrite(saved(), member, b"{}"), member, "outside the archive")


def test_member_larger_than_the_limit_is_refused(sentinel, monkeypatch):
    monkeypatch.setattr(archive, "MAX_JSON_BYTES", 1000)
    refused(_with_padding(2000), PROGRAM, "limit")


def _with_padding(size: int) -> bytes:
    data = saved()
    program = zipfile.ZipFile(io.BytesIO(data)).read(PROGRAM)
    return rewrite(data, PROGRAM, program + b" " * size)


def test_zip_bomb_member_is_refused_reading_no_more_than_the_limit(sentinel, monkeypatch):
    monkeypatch.setattr(archive, "MAX_JSON_BYTES", 2**20)
    data = rewrite(saved(), PROGRAM, b"[" + b" " * (64 * 2**20) + b"]")
    assert len(data) < 2**20  # highly compressible: 64 MiB of spaces in well under 1 MiB
    refused(data, PROGRAM, "limit")


def test_huge_format_header_is_refused(sentinel):
    refused(rewrite(saved(), FORMAT, b" " * (2**20 + 1)), FORMAT, "limit")


@pytest.mark.parametrize("depth", [100_000, 900, 400])
def test_deeply_nested_arguments_are_refused(sentinel, depth):
    """Too deep for the JSON parser (100000), for decoding (900), or for code generation (400)."""

    def edit(program):
        node(program, "relu")["args"] = ["__NESTED__"]

    data = edited(edit)
    text = zipfile.ZipFile(io.BytesIO(data)).read(PROGRAM).decode()
    text = text.replace('"__NESTED__"', "[" * depth + "]" * depth)
    refused(rewrite(data, PROGRAM, text.encode()), "nested too deeply")


@pytest.mark.parametrize("depth", [100_000, 900])
def test_deeply_nested_tensor_meta_and_specs_are_refused(sentinel, depth):
    def edit(program):
        node(program, "relu")["meta"] = {"val": "__NESTED__", "tensor_meta": "__NESTED__"}

    data = edited(edit)
    text = zipfile.ZipFile(io.BytesIO(data)).read(PROGRAM).decode()
    text = text.replace('"__NESTED__"', '{"tuple": [' * depth + "]}" * depth)
    refused(rewrite(data, PROGRAM, text.encode()), "nested too deeply")


@pytest.mark.parametrize("depth", [100_000, 900, 150])
def test_deeply_nested_modules_are_refused(sentinel, depth):
    def edit(program):
        program["module"]["children"]["lin"]["children"] = {"x": "__NESTED__"}

    text = zipfile.ZipFile(io.BytesIO(data := edited(edit))).read(PROGRAM).decode()
    child = '{"class": "torch.nn.modules.container.Sequential", "children": {"0": '
    text = text.replace('"__NESTED__"', child * depth + "null" + "}}" * depth)
    refused(rewrite(data, PROGRAM, text.encode()), "deep")


# ------------------------------------------------------------------ weights
def test_truncated_weights_are_refused(sentinel):
    data = saved()
    blob = zipfile.ZipFile(io.BytesIO(data)).read(WEIGHTS)
    for cut in (len(blob) - 4, len(blob) // 2, 9, 3):
        refused(rewrite(data, WEIGHTS, blob[:cut]), "weights")


def test_weights_whose_header_lies_about_sizes_are_refused(sentinel):
    data = saved()
    blob = zipfile.ZipFile(io.BytesIO(data)).read(WEIGHTS)
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + length])
    for entry in header.values():
        if isinstance(entry, dict) and "shape" in entry:
            entry["shape"] = [s * 1000 for s in entry["shape"]]
    text = json.dumps(header).encode()
    refused(
        rewrite(data, WEIGHTS, struct.pack("<Q", len(text)) + text + blob[8 + length :]), "weights"
    )


def test_weights_whose_header_length_is_huge_are_refused(sentinel):
    data = saved()
    blob = zipfile.ZipFile(io.BytesIO(data)).read(WEIGHTS)
    refused(rewrite(data, WEIGHTS, struct.pack("<Q", 2**62) + blob[8:]), "weights")


@pytest.mark.parametrize("field, value", [("shape", [3, 2]), ("dtype", {"dtype": "float64"})])
def test_tensor_disagreeing_with_its_record_is_refused(sentinel, field, value):
    def edit(program):
        program["module"]["children"]["lin"]["parameters"]["weight"][field] = value

    refused(edited(edit), "lin.weight")


def test_tensor_disagreeing_with_the_graph_meta_is_refused(sentinel):
    def edit(program):
        stride, dtype = [1], {"dtype": "float"}
        node(program, "scale")["meta"] = {
            "val": {"tensor": {"shape": [5], "stride": stride, "dtype": dtype}}
        }

    refused(edited(edit), "scale", "expects")


def test_linear_weight_disagreeing_with_its_features_is_refused(sentinel):
    def widen(program):
        program["module"]["children"]["lin"]["attributes"]["in_features"] = 4

    refused(edited(widen), "module lin", "weight", "in_features")


def test_conv_weight_disagreeing_with_its_channels_is_refused(sentinel):
    def widen(program):
        program["module"]["children"]["0"]["attributes"]["in_channels"] = 5

    data = saved(nn.Sequential(nn.Conv2d(3, 4, 3)))
    refused(edited(widen, data=data), "module 0", "weight", "in_channels")


# ------------------------------------------------------------------ headers
@pytest.mark.parametrize(
    "version, culprit",
    [
        (archive.FORMAT_VERSION + 1, "newer fxloom"),
        (10**6, "newer fxloom"),
        (-1, "-1"),
        (0, "0"),
        ("1", "integer"),
        (True, "integer"),
        (None, "integer"),
    ],
)
def test_unknown_format_version_is_refused(sentinel, version, culprit):
    def edit(header):
        header["version"] = version

    refused(edited(edit, FORMAT), "format version", culprit)


@pytest.mark.parametrize("name", ["pickle", "FXLOOM", None])
def test_wrong_format_name_is_refused(sentinel, name):
    def edit(header):
        header["format"] = name

    refused(edited(edit, FORMAT), "not an fxloom file")


def test_other_kind_of_file_is_refused(sentinel):
    def edit(header):
        header["kind"] = "pickled_module"

    refused(edited(edit, FORMAT), "pickled_module", "not a GraphModule")


@pytest.mark.parametrize(
    "data", [b"", b"not a zip", b"PK\x03\x04" + b"\x00" * 40, b"\x80\x04K\x01."]
)
def test_file_that_is_not_a_zip_is_refused(sentinel, data):
    refused(data, "not an fxloom file")


@pytest.mark.parametrize("member", [FORMAT, PROGRAM, WEIGHTS])
def test_file_missing_a_member_is_refused(sentinel, member):
    refused(rewrite(saved(), member, None), member)


@pytest.mark.parametrize("document", [b"[]", b"null", b'{"module": 1}', b"{", b"NaN"])
def test_program_that_is_not_a_program_is_refused(sentinel, document):
    refused(rewrite(saved(), PROGRAM, document))


def test_loading_from_a_path_refuses_the_same(sentinel, tmp_path):
    path = tmp_path / "evil.fxl"
    path.write_bytes(edited(lambda program: node(program, "relu").update(target="os.system")))
    refused(str(path), "os.system")
    refused(path, "os.system")


def test_a_late_failure_leaves_registered_names_unchanged(sentinel):
    """Modules are rebuilt, then the graph names a refused target: nothing is returned and
    the registry is as it was (the sentinel checks it)."""

    def edit(program):
        program["module"]["graph"]["nodes"][-1]["target"] = "not_output"

    refused(edited(edit), "output")


# ------------------------------------------------------- found by fuzzing
def test_placeholder_default_that_names_a_node_is_refused(sentinel):
    """A default value is evaluated where ``forward`` is defined: a node name there would
    read a global of the generated code."""

    def edit(program):
        y = {"name": "y", "op": "placeholder", "target": "y", "args": [{"node": "x"}]}
        program["module"]["graph"]["nodes"].insert(1, y)

    refused(edited(edit), "placeholder", "none of them a node")


def test_get_attr_with_arguments_is_refused(sentinel):
    def edit(program):
        node(program, "scale")["args"] = [{"node": "x"}]

    refused(edited(edit), "get_attr", "scale")


@pytest.mark.parametrize("value", [None, 1, ["torch.nn.Linear"], {"a": 1}])
def test_module_class_that_is_not_a_name_is_refused(sentinel, value):
    def edit(program):
        program["module"]["children"]["lin"]["class"] = value

    refused(edited(edit), "module class")


@pytest.mark.parametrize("value", [None, ["call_function"], {"op": 1}])
def test_opcode_that_is_not_a_name_is_refused(sentinel, value):
    def edit(program):
        node(program, "relu")["op"] = value

    refused(edited(edit), "relu", "unknown opcode")


def test_second_description_of_a_stored_tensor_is_checked_too(sentinel):
    """Tied tensors share one record; another record for the same bytes must not skip the
    checks because the tensor was already built."""

    def edit(program):
        lin = program["module"]["children"]["lin"]
        lin["buffers"]["extra"] = dict(lin["parameters"]["weight"], shape=[7], parameter=False)

    refused(edited(edit), "lin.extra", "described twice")
