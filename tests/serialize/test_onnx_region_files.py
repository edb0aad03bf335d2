"""An ONNX Runtime region in a file asks ONNX Runtime for nothing outside its model.

Its ONNX model may not keep tensors in external files (in the main graph or any
subgraph) nor use operators only a custom-op library provides; its session options
(threads, spinning) come from fxloom, never from the file. Each hostile file is refused
on loading (written by a writer that skips the check) and on saving.
"""

from __future__ import annotations

import pytest
import torch
from hostile import edited, record, saved
from test_module_records import loads_without_running, refused, refused_on_saving
from torch import nn

import fxloom
from fxloom.lower import runtime_saving

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def region_model(**changes) -> bytes:
    """An ONNX model ``y = x + c`` (c: an initializer); ``changes`` make it hostile."""
    c = helper.make_tensor("c", TensorProto.FLOAT, [2], [1.0, 2.0])
    if changes.get("external"):
        c.data_location = TensorProto.EXTERNAL
        c.external_data.add(key="location", value="../../secret.bin")
    add = helper.make_node("Add", ["x", "c"], ["y"], domain=changes.get("domain", ""))
    nodes = [add]
    if changes.get("external_in_branch"):
        hidden = helper.make_tensor("h", TensorProto.FLOAT, [2], [0.0, 0.0])
        hidden.data_location = TensorProto.EXTERNAL
        branch = helper.make_graph(
            [helper.make_node("Constant", [], ["b"], value=hidden)],
            "branch",
            [],
            [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])],
        )
        cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
        nodes = [
            add,
            helper.make_node("Constant", [], ["k"], value=cond),
            helper.make_node("If", ["k"], ["unused"], then_branch=branch, else_branch=branch),
        ]
    graph = helper.make_graph(
        nodes,
        "region",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [c],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model.SerializeToString()


def region_program(model_bytes: bytes) -> fxloom.GraphModule:
    from fxloom.lower.runtime import OrtModule

    root = nn.Module()
    root.region = OrtModule(model_bytes, name="region")
    graph = fxloom.Graph()
    graph.output(graph.call_module("region", (graph.placeholder("x"),)))
    return fxloom.GraphModule(root, graph)


def saved_unchecked(model_bytes: bytes, monkeypatch) -> bytes:
    """A region file written by a writer that does not check the ONNX model."""
    with monkeypatch.context() as patch:
        patch.setattr(runtime_saving, "check_onnx_model", lambda *a: None)
        return saved(region_program(model_bytes))


def test_a_region_round_trips_and_runs_with_fxloom_session_options():
    pytest.importorskip("onnxruntime")
    loaded = loads_without_running(saved(region_program(region_model())))
    assert loaded.region.intra_op_num_threads is None  # torch's thread count, at the call
    assert torch.equal(loaded(torch.zeros(2)), torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize(
    "hostile, culprit",
    [
        ({"external": True}, "'c' (the main graph) keeps its values in an external file"),
        ({"external_in_branch": True}, "keeps its values in an external file"),
        ({"domain": "com.evil.ops"}, "'com.evil.ops', which only a custom-op library"),
    ],
    ids=["external data", "external data in a subgraph", "custom operator domain"],
)
def test_hostile_onnx_regions_are_refused_on_loading_and_saving(
    hostile, culprit, monkeypatch, tmp_path
):
    model = region_model(**hostile)
    refused(saved_unchecked(model, monkeypatch), "module.region", culprit)
    refused_on_saving(region_program(model), culprit, tmp_path=tmp_path)


def test_a_region_is_refused_when_onnx_is_missing(monkeypatch):
    data = saved(region_program(region_model()))

    def missing(name):
        raise ImportError(name)

    monkeypatch.setattr(runtime_saving.importlib, "import_module", missing)
    refused(data, "module.region", "needs the onnx package")


def test_session_options_in_a_file_are_not_used():
    def edit(program):
        settings = record(program, "region")["state"]["settings"]
        settings.update(intra_op_num_threads=1, inter_op_num_threads=1, allow_spinning=True)

    loaded = fxloom.load(edited(saved(region_program(region_model())), edit))
    assert loaded.region.intra_op_num_threads is None
    assert loaded.region.allow_spinning is False


def test_a_file_asking_for_more_threads_than_cores_is_refused():
    def edit(program):
        record(program, "region")["state"]["settings"]["inter_op_num_threads"] = 200_000

    refused(edited(saved(region_program(region_model())), edit), "inter_op_num_threads=200000")


@pytest.mark.parametrize(
    "name, value, culprit",
    [
        ("allow_spinning", "yes", "allow_spinning cannot be"),
        ("scalar_outputs", {"tuple": [5]}, "positions among its 1 outputs"),
        ("custom_op_library", "/tmp/evil.so", "no setting 'custom_op_library'"),
    ],
)
def test_invalid_region_settings_are_refused(name, value, culprit):
    def edit(program):
        record(program, "region")["state"]["settings"][name] = value

    refused(edited(saved(region_program(region_model())), edit), "module.region", culprit)
