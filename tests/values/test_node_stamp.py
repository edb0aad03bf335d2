"""One recorder of node metadata: symbolic tracing, export and ``fxloom.compile`` stamp the same
keys (``fxloom.values.provenance.stamp_node``), so a consumer reads any frontend's graph alike."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxloom
from fxloom.export import export
from fxloom.tracer import Tracer
from fxloom.values.module_stack import ModuleStack
from fxloom.values.provenance import SourceStamper, stamp_node

STAMPED = {"nn_module_stack", "source_fn_stack", "stack_trace", "source_location"}
OPERATIONS = ("call_function", "call_method", "call_module")


class Block(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x) * 2


def traced_graph(model):
    tracer = Tracer(record_stack_traces=True)
    return tracer.trace(model)


def exported_graph(model):
    return export(model, (torch.randn(2, 3),)).graph


def compiled_graph(model):
    compiled = fxloom.compile(model)
    compiled(torch.randn(2, 3))
    (entry,) = compiled.compiled_forward.cache
    return entry.graph_module.graph


@pytest.mark.parametrize(
    "graph_of",
    [
        traced_graph,
        exported_graph,
        pytest.param(compiled_graph, marks=pytest.mark.bytecode, id="compiled_graph"),
    ],
)
def test_every_frontend_stamps_the_same_keys_on_each_operation(graph_of):
    graph = graph_of(Model())
    operations = [node for node in graph.nodes if node.op in OPERATIONS]
    assert operations
    for node in operations:
        assert STAMPED <= node.meta.keys(), (node.name, sorted(node.meta))


@pytest.mark.parametrize(
    "graph_of",
    [
        traced_graph,
        exported_graph,
        pytest.param(compiled_graph, marks=pytest.mark.bytecode, id="compiled_graph"),
    ],
)
def test_every_frontend_names_the_submodule_an_operation_ran_in(graph_of):
    graph = graph_of(Model())
    relu = next(n for n in graph.nodes if "relu" in n.name)
    assert list(relu.meta["nn_module_stack"]) == ["block"]
    assert relu.meta["nn_module_stack"]["block"] == ("block", Block)


def test_stamp_node_writes_each_fact_under_its_key():
    stack = ModuleStack()
    stack.enter("block", Block)
    meta: dict = {}
    where = SourceStamper(lambda filename: False, limit=1).locate()
    stamp_node(meta, modules=stack.entries, made_by=("relu", torch.relu), source=where)
    assert meta["nn_module_stack"] == {"block": ("block", Block)}
    assert meta["source_fn_stack"] == [("relu", torch.relu)]
    assert meta["source_location"].line > 0 and "test_node_stamp" in meta["stack_trace"]


def test_stamp_node_leaves_out_the_facts_not_given():
    meta: dict = {}
    stamp_node(meta, modules=None)
    assert meta == {}
