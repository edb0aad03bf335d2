"""Graphs captured by ``fxloom.compile`` carry the node metadata symbolic tracing and export
give: which modules each operation ran in (``nn_module_stack``), what made it
(``source_fn_stack``) and where it came from (``stack_trace``, ``source_location``), so
consumers keyed on modules (pipeline cuts, per-module quantization, cost by module) read
compiled graphs as they read traced ones."""

from __future__ import annotations

import operator

import torch
from torch import nn

import fxloom
from fxloom.distributed.cuts import block_of

OPERATIONS = ("call_function", "call_method", "call_module")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) + 1


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Block()
        self.second = Block()

    def forward(self, x):
        return self.second(self.first(x)).sum(dim=1)


def compiled_graph(model: nn.Module, *args):
    compiled = fxloom.compile(model)
    compiled(*args)
    (entry,) = compiled.cache
    return entry.graph_module.graph


def module_paths(graph) -> list[tuple[str, list[str]]]:
    return [
        (node.name, list(node.meta["nn_module_stack"]))
        for node in graph.nodes
        if node.op in OPERATIONS
    ]


def test_every_operation_names_the_modules_it_ran_in_as_symbolic_tracing_does():
    model, x = Model(), torch.randn(2, 4)
    assert module_paths(compiled_graph(model, x)) == module_paths(
        fxloom.symbolic_trace(model).graph
    )


def test_a_leaf_module_call_ends_its_stack_with_the_leaf_itself():
    graph = compiled_graph(Model(), torch.randn(2, 4))
    call = next(node for node in graph.nodes if node.op == "call_module")
    assert call.meta["nn_module_stack"] == {
        "first": ("first", Block),
        "first.fc": ("first.fc", nn.Linear),
    }


def test_operations_carry_the_metadata_keys_symbolic_tracing_gives_them():
    model, x = Model(), torch.randn(2, 4)
    traced = fxloom.symbolic_trace(model).graph
    keys = {key for node in traced.nodes if node.op in OPERATIONS for key in node.meta}
    for node in compiled_graph(model, x).nodes:
        if node.op in OPERATIONS:
            assert keys - {"stack_trace", "source_location"} <= set(node.meta), node.name
            assert node.meta["source_location"].line > 0


def test_source_fn_stack_names_the_function_or_module_class_that_made_each_node():
    graph = compiled_graph(Model(), torch.randn(2, 4))
    made_by = {node.name: node.meta["source_fn_stack"][-1][1] for node in graph.nodes
               if node.op in OPERATIONS}  # fmt: skip
    assert made_by["first_fc"] is nn.Linear
    assert made_by["relu"] is torch.relu


def test_pipeline_blocks_are_found_on_a_compiled_graph():
    graph = compiled_graph(Model(), torch.randn(2, 4))
    blocks = {block_of(node) for node in graph.nodes if node.op in OPERATIONS}
    assert blocks == {"first", "second", ""}


def test_the_items_of_an_operation_with_several_results_share_its_modules():
    class Splits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Identity()

        def forward(self, x):
            return self.inner(x).split(2, dim=1)

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.part = Splits()

        def forward(self, x):
            first, second = self.part(x)
            return first * second

    graph = compiled_graph(Outer(), torch.randn(2, 4))
    items = [node for node in graph.nodes if node.target is operator.getitem]
    assert items and all("part" in node.meta["nn_module_stack"] for node in items)
