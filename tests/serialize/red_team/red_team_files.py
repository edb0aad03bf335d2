"""Building hostile files: save a small valid model, then rewrite a member of the zip.

Helpers only; each family's test module builds its own files from these.
"""

from __future__ import annotations

import copy
import io
import json
import zipfile
from collections.abc import Callable

import torch
from torch import nn

import fxloom
import fxloom.export

PROGRAM = "fxloom/program.json"
FORMAT = "fxloom/format.json"
WEIGHTS = "fxloom/weights.safetensors"
COMMAND = "touch fxloom_red_team_pwned"


class Small(nn.Module):
    """x (4, 3) -> relu(lin(x)) + scale, summed over dim 1."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 2)
        self.register_buffer("scale", torch.ones(2))

    def forward(self, x):
        return torch.relu(self.lin(x)).add(self.scale).sum(dim=1, keepdim=True)


class Square(nn.Module):
    """A Linear whose weight is square (so a tensor of the same shape can shadow it)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x) * 2


class Cond(nn.Module):
    """x (n, 3) -> fxloom.cond(x.sum() > 0, relu(lin(x)), lin(x) - 1): an exported cond file."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return fxloom.cond(
            x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: self.lin(x) - 1, (x,)
        )


def saved(model: nn.Module | None = None) -> bytes:
    buffer = io.BytesIO()
    fxloom.save(fxloom.symbolic_trace(model or Small()), buffer)
    return buffer.getvalue()


def exported(model: nn.Module, args: tuple, **kwargs) -> bytes:
    buffer = io.BytesIO()
    fxloom.export.save(fxloom.export.export(model, args, **kwargs), buffer)
    return buffer.getvalue()


def read(data: bytes, member: str = PROGRAM):
    return json.loads(zipfile.ZipFile(io.BytesIO(data)).read(member))


def rewrite(data: bytes, replacements: dict[str, bytes | None], extra: list | None = None) -> bytes:
    """``data`` with members replaced (added if new, removed if None); ``extra`` appends
    ``(name, bytes)`` members even if the name exists (duplicate members)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            if info.filename not in replacements:
                dst.writestr(info, src.read(info))
        for name, content in replacements.items():
            if content is not None:
                dst.writestr(name, content, zipfile.ZIP_DEFLATED)
        for name, content in extra or []:
            dst.writestr(name, content, zipfile.ZIP_DEFLATED)
    return out.getvalue()


def edited(edit: Callable[[dict], None], data: bytes | None = None, member: str = PROGRAM) -> bytes:
    """A saved file whose JSON ``member`` went through ``edit(document)`` (in place)."""
    data = data if data is not None else saved()
    document = read(data, member)
    edit(document)
    return rewrite(data, {member: json.dumps(document).encode()})


def with_tensors(data: bytes, tensors: dict[str, torch.Tensor]) -> bytes:
    """``data`` whose weights member also holds ``tensors`` (by key)."""
    from safetensors.torch import load, save

    weights = load(zipfile.ZipFile(io.BytesIO(data)).read(WEIGHTS))
    weights.update({k: v.contiguous() for k, v in tensors.items()})
    return rewrite(data, {WEIGHTS: save(weights)})


def record(key: str, tensor: torch.Tensor, **extra) -> dict:
    """The tensor record fxloom writes for ``tensor`` stored under ``key``."""
    from fxloom.serialize.values import encode_value

    return {"key": key, "shape": list(tensor.shape), "dtype": encode_value(tensor.dtype), **extra}


# ---------------------------------------------------------------- graph edits
def graph_of(program: dict) -> dict:
    root = program["module"] if "module" in program else program["graph_module"]
    return root["graph"]


def nodes_of(program: dict) -> list[dict]:
    return graph_of(program)["nodes"]


def node(program: dict, name: str) -> dict:
    return next(n for n in nodes_of(program) if n["name"] == name)


def call(name: str, target: str, *args, op: str = "call_function", **kwargs) -> dict:
    result = {"name": name, "op": op, "target": target, "args": list(args)}
    if kwargs:
        result["kwargs"] = kwargs
    return result


def ref(name: str) -> dict:
    return {"node": name}


def insert_before_output(program: dict, *new_nodes: dict, returns: str | None = None) -> None:
    """Add ``new_nodes`` just before the output; with ``returns``, the output returns that node
    (else the output is unchanged: the generated forward still runs every node)."""
    nodes = nodes_of(program)
    output = nodes.pop()
    nodes.extend(new_nodes)
    if returns is not None:
        output["args"] = [ref(returns)]
    nodes.append(output)


def graph_with(*new_nodes: dict, returns: str | None = None, data: bytes | None = None) -> bytes:
    """The small traced model with ``new_nodes`` added before its output."""
    return edited(lambda p: insert_before_output(p, *new_nodes, returns=returns), data)


def graph_module_record(*new_nodes: dict, returns: str = "x") -> dict:
    """A module record of a GraphModule ``x -> new_nodes -> returns``: a payload to hide."""
    return {
        "class": "fxloom.graph_module.GraphModule",
        "training": False,
        "class_name": "Payload",
        "graph": {
            "nodes": [
                {"name": "x", "op": "placeholder", "target": "x"},
                *new_nodes,
                {"name": "output", "op": "output", "target": "output", "args": [ref(returns)]},
            ],
            "codegen": {"kind": "default"},
        },
        "attributes": {},
        "parameters": {},
        "buffers": {},
        "children": {},
    }


def os_system_chain(x: str = "x") -> list[dict]:
    """Nodes reaching ``os.system`` from a tensor by ordinary attributes, and calling it with
    ``max(key=...)``: ``max([cmd], key=x.numpy().ctypes._ctypes._os.system)``."""
    return [
        call("arr", "numpy", ref(x), op="call_method"),
        call("np_ctypes", "getattr", ref("arr"), "ctypes"),
        call("ctypes_module", "getattr", ref("np_ctypes"), "_ctypes"),
        call("os_module", "getattr", ref("ctypes_module"), "_os"),
        call("system", "getattr", ref("os_module"), "system"),
        call("run", "max", [COMMAND], key=ref("system")),
    ]


def deep(value):
    return copy.deepcopy(value)


# ------------------------------------------------------------- parametrized
def parametrized_file(module: nn.Module, tensor: str = "weight", path: str = "0") -> bytes:
    """``Sequential(module)`` with ``module.<tensor>`` weight-normalised, saved."""
    nn.utils.parametrizations.weight_norm(module, tensor)
    return saved(nn.Sequential(module))


def module_at(program: dict, path: str) -> dict:
    record = program["module"] if "module" in program else program["graph_module"]
    for part in path.split(".") if path else []:
        record = record["children"][part]
    return record


def payload_parametrization(program: dict, path: str, tensor: str, payload: dict) -> None:
    """Replace the parametrization of ``path``'s ``tensor`` by ``payload`` (a module record)."""
    plist = module_at(program, path)["children"]["parametrizations"]["children"][tensor]
    plist["children"]["0"] = payload


def two_input_payload(*new_nodes: dict, returns: str = "v") -> dict:
    """A GraphModule ``(g, v) -> new_nodes -> v``: stands in for weight_norm's (g, v) -> weight."""
    record = graph_module_record(*new_nodes, returns=returns)
    record["graph"]["nodes"][0] = {"name": "g", "op": "placeholder", "target": "g"}
    record["graph"]["nodes"].insert(1, {"name": "v", "op": "placeholder", "target": "v"})
    return record


# ------------------------------------------------------------------- LSTM
def lstm_file(hidden: int = 4) -> bytes:
    """A traced ``x -> LSTM(4, hidden)(x)[0]`` built by editing JSON (``fxloom.save`` of an
    LSTM may fail on torch 2.13), with the LSTM's own weights."""
    from fxloom.serialize.values import encode_value

    torch.manual_seed(0)
    lstm = nn.LSTM(4, hidden)
    data = saved(Small())

    def edit(program):
        root = program["module"]
        attributes = {
            name: encode_value(value)
            for name, value in lstm.__dict__.items()
            if name
            in (
                "mode",
                "input_size",
                "hidden_size",
                "num_layers",
                "bias",
                "batch_first",
                "dropout",
                "bidirectional",
                "proj_size",
                "_flat_weights_names",
                "_all_weights",
            )
        }
        root["children"] = {
            "lstm": {
                "class": "torch.nn.modules.rnn.LSTM",
                "training": False,
                "attributes": attributes,
                "parameters": {
                    name: record(f"lstm.{name}", p, parameter=True, requires_grad=True)
                    for name, p in lstm._parameters.items()
                },
                "buffers": {},
                "children": {},
            }
        }
        root["buffers"] = {}
        root["graph"]["nodes"] = [
            {"name": "x", "op": "placeholder", "target": "x"},
            call("lstm", "lstm", ref("x"), op="call_module"),
            call("out", "operator.getitem", ref("lstm"), 0),
            {"name": "output", "op": "output", "target": "output", "args": [ref("out")]},
        ]
        root["graph"].pop("module_stacks", None)
        for n in root["graph"]["nodes"]:
            n.pop("meta", None)

    data = edited(edit, data)
    return with_tensors(data, {f"lstm.{n}": p.detach() for n, p in lstm._parameters.items()})


# ------------------------------------------------------------ ONNX Runtime
def lowered_file() -> bytes:
    """``fxloom.lower`` of a small Linear+ReLU to ONNX Runtime, saved (an OrtModule region)."""
    from fxloom.lower import lower

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    return saved_gm(lower(model, (torch.randn(4, 3),)))


def saved_gm(gm) -> bytes:
    buffer = io.BytesIO()
    fxloom.save(gm, buffer)
    return buffer.getvalue()


def ort_records(program: dict) -> list[dict]:
    """Every OrtModule record of a program (depth first)."""
    found = []

    def walk(record):
        if record is None:
            return
        if record.get("class") == "fxloom.lower.runtime.OrtModule":
            found.append(record)
        for child in record.get("children", {}).values():
            walk(child)

    walk(program["module"])
    return found


def with_onnx_model(data: bytes, edit_model: Callable) -> bytes:
    """``data`` (a lowered file) whose ONNX model went through ``edit_model(onnx.ModelProto)``."""
    import onnx
    from safetensors.torch import load

    program = read(data)
    region = ort_records(program)[0]
    key = region["state"]["onnx_model"]["key"]
    weights = load(zipfile.ZipFile(io.BytesIO(data)).read(WEIGHTS))
    model = onnx.load_from_string(weights[key].numpy().tobytes())
    edit_model(model)
    raw = torch.frombuffer(bytearray(model.SerializeToString()), dtype=torch.uint8)
    region["state"]["onnx_model"]["shape"] = [raw.numel()]
    data = rewrite(data, {PROGRAM: json.dumps(program).encode()})
    return with_tensors(data, {key: raw.clone()})
