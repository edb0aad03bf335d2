"""``describe_target(node)``: the one way messages name what a node calls or reads (shape
propagation's failures, ONNX translation's refusals, the matcher's reasons)."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

import fxloom
from fxloom._format import describe_target
from fxloom.passes.shape_prop import ShapeProp, ShapePropError


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.scale = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)).view(-1) + self.scale


@pytest.fixture(scope="module")
def described() -> dict[str, str]:
    gm = fxloom.symbolic_trace(Block())
    return {node.name: describe_target(node) for node in gm.graph.nodes}


def test_a_function_is_named_by_its_public_dotted_name(described: dict[str, str]) -> None:
    assert described["relu"] == "torch.relu"
    assert described["add"] == "operator.add"


def test_a_method_is_named_on_tensor(described: dict[str, str]) -> None:
    assert described["view"] == "Tensor.view"


def test_a_module_is_named_by_its_path_and_class(described: dict[str, str]) -> None:
    assert described["lin"] == "lin, a Linear"


def test_an_attribute_and_a_placeholder_are_named_by_their_target(
    described: dict[str, str],
) -> None:
    assert described["scale"] == "scale" and described["x"] == "x"


def test_an_aten_operator_is_named_under_torch_ops() -> None:
    graph = fxloom.Graph()
    node = graph.call_function(torch.ops.aten.add.Tensor, (graph.placeholder("x"), 1))
    assert describe_target(node) == "torch.ops.aten.add.Tensor"


def test_a_module_missing_from_the_owner_is_said_to_be_missing() -> None:
    gm = fxloom.symbolic_trace(Block())
    node = gm.graph.call_module("gone", ())
    assert describe_target(node) == "gone, a missing module"


def test_a_module_the_graph_has_no_owner_for_is_named_by_its_path() -> None:
    graph = fxloom.Graph()
    node = graph.call_module("block.lin", (graph.placeholder("x"),))
    assert describe_target(node) == "block.lin"


def test_shape_prop_names_the_failing_node_with_it() -> None:
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(operator.matmul, (x, x)))
    gm = fxloom.GraphModule(nn.Module(), graph)
    with pytest.raises(ShapePropError, match=r"\(call_function operator\.matmul\) failed on"):
        ShapeProp(gm).propagate(torch.ones(2, 3))


def test_a_label_names_a_module_by_its_class_alone() -> None:
    gm = fxloom.symbolic_trace(Block())
    (lin,) = gm.graph.find_nodes(op="call_module")
    assert describe_target(lin, "label") == "Linear"


def test_a_label_names_an_aten_operator_without_torch_ops() -> None:
    graph = fxloom.Graph()
    node = graph.call_function(torch.ops.aten.add.Tensor, (graph.placeholder("x"), 1))
    assert describe_target(node, "label") == "aten.add.Tensor"


def test_a_label_takes_the_module_class_from_the_caller_where_no_module_is_live() -> None:
    graph = fxloom.Graph()
    node = graph.call_module("block.lin", (graph.placeholder("x"),))
    assert describe_target(node, "label", module_class="Linear") == "Linear"


def test_the_text_style_is_the_target_as_the_graph_prints_it() -> None:
    gm = fxloom.symbolic_trace(Block())
    texts = {node.name: describe_target(node, "text") for node in gm.graph.nodes}
    assert texts["view"] == "view" and texts["lin"] == "lin" and texts["relu"] == "torch.relu"
    assert f"[target={texts['add']}]" in str(gm.graph)
