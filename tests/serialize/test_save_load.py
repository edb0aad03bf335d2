"""``fxloom.save`` / ``fxloom.load``: a GraphModule comes back the same, graph, code and numbers.

The file is a zip of JSON and safetensors; every kind of argument value the IR allows,
annotations, node meta and the module tree survive the trip. What cannot be loaded safely
is refused when saving, naming it, before anything is written.
"""

from __future__ import annotations

import io
import json
import operator
import os
import stat
import zipfile

import pytest
import torch
from torch import nn

import fxloom
from fxloom import zoo
from fxloom.lint import LEAF_ARGUMENT_TYPES
from fxloom.serialize.archive import FORMAT_VERSION


def round_trip(gm: fxloom.GraphModule) -> fxloom.GraphModule:
    buffer = io.BytesIO()
    fxloom.save(gm, buffer)
    return fxloom.load(buffer.getvalue())


def assert_same(gm: fxloom.GraphModule, loaded: fxloom.GraphModule, *inputs) -> None:
    assert str(loaded.graph) == str(gm.graph)
    assert loaded.code == gm.code
    assert type(loaded).__name__ == type(gm).__name__
    assert [(n, type(m)) for n, m in loaded.named_modules()][1:] == [
        (n, type(m)) for n, m in gm.named_modules()
    ][1:]
    for (name, a), (_, b) in zip(gm.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    torch.testing.assert_close(loaded(*inputs), gm(*inputs), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["mlp_tiny", "resnet_tiny", "transformer_tiny", "cnn_small"])
def test_embedded_model_round_trips(name):
    model, inputs = zoo.build(name)
    gm = fxloom.symbolic_trace(model)
    assert_same(gm, round_trip(gm), *inputs)


def test_loaded_model_runs_on_another_batch_size():
    model, (x,) = zoo.build("resnet_tiny")
    gm = fxloom.symbolic_trace(model)
    other = torch.randn(5, *x.shape[1:])
    torch.testing.assert_close(round_trip(gm)(other), model(other))


def argument_values(x: fxloom.Node | None) -> tuple:
    """One value of each kind an argument may hold (``fxloom.lint.LEAF_ARGUMENT_TYPES``, the
    containers, a function), ``x`` inside containers."""
    return (
        1,
        -2.5,
        float("inf"),
        True,
        None,
        "text",
        slice(1, None, 2),
        Ellipsis,
        torch.float16,
        torch.device("cpu"),
        torch.channels_last,
        torch.strided,
        torch.Size([2, 3]),
        (1, (2, [3, {"k": 4}])),
        {"a": x, 1: [x, 2]},
        3 + 4j,
        b"bytes",
        range(0, 4, 2),
        torch.relu,
    )


def test_every_kind_of_argument_value_round_trips():
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    values = argument_values(x)
    original = graph.call_function(operator.getitem, (x, values))
    graph.output(x)
    loaded = round_trip(fxloom.GraphModule(nn.Module(), graph))
    (node,) = [n for n in loaded.graph.nodes if n.op == "call_function"]
    assert node.format_node() == original.format_node()
    assert node.args[1][:14] == values[:14] and node.args[1][15:] == values[15:]
    assert [type(v) for v in node.args[1]] == [type(v) for v in original.args[1]]


def test_the_round_trip_covers_every_leaf_type_the_ir_allows():
    # Symbolic sizes are values of a trace, saved as symbols in meta, never as constants.
    symbolic = {torch.SymInt, torch.SymFloat, torch.SymBool}
    covered = {type(value) for value in argument_values(None)}
    assert LEAF_ARGUMENT_TYPES - symbolic <= covered


def test_a_node_breaking_an_argument_rule_is_refused_when_saving(tmp_path):
    root = nn.Module()
    root.register_buffer("weight", torch.ones(1))
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    graph.create_node("get_attr", "weight", (x,), name="odd")  # a get_attr takes nothing
    graph.output(x)
    with pytest.raises(
        fxloom.SerializationError, match=r"cannot save node %odd: a get_attr node takes"
    ):
        fxloom.save(fxloom.GraphModule(root, graph), tmp_path / "odd.fxl")
    assert not (tmp_path / "odd.fxl").exists()


def test_keyword_arguments_and_method_calls_round_trip():
    def f(x, y):
        return torch.cat([x, y], dim=-1).sum(dim=(0, 1), keepdim=True).to(torch.float64)

    gm = fxloom.symbolic_trace(f)
    x, y = torch.randn(2, 3), torch.randn(2, 4)
    assert_same(gm, round_trip(gm), x, y)


def test_node_meta_that_describes_comes_back():
    model, (x,) = zoo.build("cnn_small")
    gm = fxloom.symbolic_trace(model)
    from fxloom.passes.shape_prop import ShapeProp

    ShapeProp(gm).propagate(x)
    loaded = round_trip(gm)
    for before, after in zip(gm.graph.nodes, loaded.graph.nodes, strict=True):
        assert after.meta.get("tensor_meta") == before.meta.get("tensor_meta")
        assert after.meta.get("nn_module_stack") == before.meta.get("nn_module_stack")
        assert after.meta.get("stack_trace") == before.meta.get("stack_trace")


def test_generic_annotations_keep_their_arguments():
    # Python 3.10 counts ``tuple[torch.Tensor]`` as a class; it must not come back as ``tuple``.
    g = fxloom.Graph()
    pair = g.placeholder("pair", type_expr=tuple[torch.Tensor, ...])
    g.output(g.call_function(operator.getitem, (pair, 0)))
    loaded = round_trip(fxloom.GraphModule(nn.Module(), g))
    (placeholder,) = [n for n in loaded.graph.nodes if n.op == "placeholder"]
    assert placeholder.type == tuple[torch.Tensor, ...]


def test_tied_weights_are_stored_once_and_stay_tied():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids):
            return self.head(self.embed(ids))

    loaded = round_trip(fxloom.symbolic_trace(Tied()))
    assert loaded.head.weight is loaded.embed.weight


def test_module_with_weight_norm_round_trips():
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(2, 3, 3))
    gm = fxloom.symbolic_trace(nn.Sequential(conv, nn.ReLU()))
    loaded = round_trip(gm)
    assert type(getattr(loaded, "0")).__name__ == "ParametrizedConv1d"
    x = torch.randn(1, 2, 8)
    torch.testing.assert_close(loaded(x), gm(x), rtol=0, atol=0)


def test_save_to_a_path_replaces_the_file_only_when_done(tmp_path):
    gm = fxloom.symbolic_trace(nn.Linear(3, 2))
    path = tmp_path / "model.fxl"
    fxloom.save(gm, path)
    assert torch.equal(fxloom.load(path).weight, gm.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["model.fxl"]


def test_file_is_a_zip_of_json_and_safetensors_with_a_format_version():
    buffer = io.BytesIO()
    fxloom.save(fxloom.symbolic_trace(nn.Linear(3, 2)), buffer)
    with zipfile.ZipFile(buffer) as z:
        assert sorted(z.namelist()) == [
            "fxloom/format.json",
            "fxloom/program.json",
            "fxloom/weights.safetensors",
        ]
        header = json.loads(z.read("fxloom/format.json"))
    assert header["format"] == "fxloom"
    assert header["version"] == FORMAT_VERSION
    assert header["kind"] == "graph_module"


def test_unregistered_function_is_refused_when_saving_and_nothing_is_written(tmp_path):
    def double(x):
        return x * 2

    graph = fxloom.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(double, (x,)))
    gm = fxloom.GraphModule(nn.Module(), graph)
    path = tmp_path / "model.fxl"
    with pytest.raises(fxloom.SerializationError, match="register_serializable"):
        fxloom.save(gm, path)
    assert not path.exists()


def test_registered_function_is_saved_and_loaded_by_its_name():
    def triple(x):
        return x * 3

    fxloom.register_serializable(triple, name="tests.triple")
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(triple, (x,)))
    loaded = round_trip(fxloom.GraphModule(nn.Module(), graph))
    assert torch.equal(loaded(torch.ones(2)), torch.full((2,), 3.0))


def rewrite_json(data: bytes, member: str, change) -> bytes:
    """``data`` (a saved file) with the JSON document ``member`` passed through ``change``."""
    rewritten = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(rewritten, "w") as target:
        for info in source.infolist():
            content = source.read(info)
            if info.filename == member:
                content = json.dumps(change(json.loads(content))).encode()
            target.writestr(info, content)
    return rewritten.getvalue()


def saved_linear() -> bytes:
    buffer = io.BytesIO()
    fxloom.save(fxloom.symbolic_trace(nn.Linear(3, 2)), buffer)
    return buffer.getvalue()


def test_loading_a_file_of_another_kind_says_which_loader_to_use():
    data = rewrite_json(
        saved_linear(), "fxloom/format.json", lambda h: {**h, "kind": "exported_program"}
    )
    with pytest.raises(fxloom.SerializationError, match="fxloom.export.load"):
        fxloom.load(data)


def test_files_of_an_older_format_version_are_upgraded_when_loaded(monkeypatch):
    from fxloom.serialize import archive

    # Imagine format version 0 called the root module record "root".
    data = rewrite_json(saved_linear(), "fxloom/program.json", lambda p: {"root": p["module"]})
    data = rewrite_json(data, "fxloom/format.json", lambda h: {**h, "version": 0})

    def upgrade_0_to_1(old: archive.Archive) -> archive.Archive:
        old.program = {"module": old.program.pop("root")}
        return old

    monkeypatch.setattr(archive, "OLDEST_VERSION", 0)
    monkeypatch.setattr(archive, "UPGRADES", {**archive.UPGRADES, 0: upgrade_0_to_1})
    assert fxloom.load(data).weight.shape == (2, 3)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic batch"])
def test_module_of_an_exported_program_round_trips(dynamic):
    from fxloom.export import Dim, export

    model, (x,) = zoo.build("resnet_tiny")
    x = torch.randn(2, *x.shape[1:])
    shapes = ({0: Dim("batch")},) if dynamic else None
    gm = export(model, (x,), dynamic_shapes=shapes).module()
    loaded = round_trip(gm)
    assert_same(gm, loaded, x)
    if dynamic:  # sizes the graph computes come back; meta["val"] with symbols is left out
        other = torch.randn(5, *x.shape[1:])
        torch.testing.assert_close(loaded(other), gm(other), rtol=0, atol=0)


def test_weights_member_is_a_safetensors_file_the_library_reads():
    from safetensors.torch import load as load_safetensors

    model, _ = zoo.build("cnn_small")
    buffer = io.BytesIO()
    fxloom.save(fxloom.symbolic_trace(model), buffer)
    with zipfile.ZipFile(buffer) as z:
        tensors = load_safetensors(z.read("fxloom/weights.safetensors"))
    stored = sorted(tuple(t.shape) for t in tensors.values())
    assert stored == sorted(tuple(t.shape) for t in model.state_dict().values())


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_a_saved_file_gets_the_mode_the_umask_allows_as_open_would_give_it(tmp_path):
    gm = fxloom.symbolic_trace(nn.Linear(2, 2))
    previous = os.umask(0o027)
    try:
        fxloom.save(gm, tmp_path / "new.fxl")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "new.fxl").stat().st_mode) == 0o640


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_saving_over_a_file_keeps_that_files_mode(tmp_path):
    path = tmp_path / "shared.fxl"
    gm = fxloom.symbolic_trace(nn.Linear(2, 2))
    fxloom.save(gm, path)
    path.chmod(0o664)
    fxloom.save(gm, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o664
