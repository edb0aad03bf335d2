"""``fxloom.passes.captured``: the one place a consumer turns what it is given into a graph.

A plain module is traced (on the examples, recording source lines), a GraphModule is used as it
is, an exported program is taken as ``ep.module()`` by consumers that return a module and as its
own graph by consumers that read one. ``record_captured_shapes`` (``passes.shape_prop``) reuses
the shapes export recorded instead of running the graph again.
"""

from __future__ import annotations

import pytest
import torch

import fxloom
from fxloom._notes import notes_of
from fxloom.export import Dim, export
from fxloom.passes.captured import (
    call_inputs,
    captured_module,
    graph_module_of,
    module_to_transform,
    program_to_read,
    trace,
)
from fxloom.passes.shape_prop import ShapeProp, record_captured_shapes


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return self.linear(x).relu() * scale


class GoesThroughNumpy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy())


X = torch.randn(2, 4)


def test_a_plain_module_is_traced_on_the_examples_with_its_defaults() -> None:
    gm = module_to_transform(Scaled(), (X,), consumer="a test")
    assert [n.target for n in gm.graph.find_nodes(op="placeholder")] == ["x"]
    assert type(gm).__name__ == "Scaled"


def test_a_trace_records_each_node_s_source_line() -> None:
    gm = trace(Scaled(), (X,), consumer="a test")
    (relu,) = [n for n in gm.graph.nodes if n.name == "relu"]
    assert "test_captured.py" in relu.meta["stack_trace"]


def test_a_failed_trace_keeps_its_error_and_says_how_to_trace_it_yourself() -> None:
    with pytest.raises(Exception) as raised:
        trace(GoesThroughNumpy(), (X,), consumer="a test")
    notes = "\n".join(notes_of(raised.value))
    assert "a test traced GoesThroughNumpy" in notes and "trace it yourself" in notes


def test_a_graph_module_is_used_as_it_is() -> None:
    gm = fxloom.symbolic_trace(Scaled())
    assert module_to_transform(gm, consumer="a test") is gm
    assert program_to_read(gm, consumer="a test") is gm


def test_an_exported_program_is_transformed_as_its_module() -> None:
    ep = export(Scaled(), (X,))
    gm = module_to_transform(ep, consumer="a test")
    assert type(gm).__name__ == "ExportedModule"
    torch.testing.assert_close(gm(X), ep.module()(X))


def test_an_exported_program_is_read_as_its_own_graph() -> None:
    ep = export(Scaled(), (X,))
    assert program_to_read(ep, consumer="a test") is ep
    assert graph_module_of(ep) is ep.graph_module


def test_a_consumer_without_examples_refuses_a_plain_module_saying_how_to_trace_it() -> None:
    with pytest.raises(TypeError, match="a test works on an fxloom.GraphModule, got Scaled"):
        captured_module(Scaled(), "a test")


@pytest.mark.parametrize(
    "given, expected",
    [((X,), ((X,), {})), ({"x": X}, ((), {"x": X})), (X, ((X,), {}))],
    ids=["tuple", "dict", "tensor"],
)
def test_example_inputs_become_args_and_kwargs(given, expected) -> None:
    assert call_inputs(given, "a test") == expected


def test_example_inputs_of_another_kind_are_refused() -> None:
    with pytest.raises(TypeError, match="a test: example_inputs must be a tuple"):
        call_inputs(3, "a test")


# ------------------------------------------------------------ shapes export recorded
def test_export_s_recorded_shapes_are_the_ones_a_run_finds() -> None:
    ep = export(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()), (X,))
    recorded, run = ep.module(), ep.module()
    assert record_captured_shapes(recorded.graph)
    ShapeProp(run).propagate(X)
    for mine, theirs in zip(recorded.graph.nodes, run.graph.nodes, strict=True):
        assert mine.meta.get("type") == theirs.meta.get("type"), mine.name
        meta, expected = mine.meta.get("tensor_meta"), theirs.meta.get("tensor_meta")
        assert (meta is None) == (expected is None), mine.name
        if meta is not None and hasattr(meta, "shape"):
            assert (meta.shape, meta.dtype) == (expected.shape, expected.dtype), mine.name


def test_a_traced_module_has_no_recorded_shapes_and_keeps_its_meta() -> None:
    gm = fxloom.symbolic_trace(Scaled())
    assert not record_captured_shapes(gm.graph)
    assert not any("tensor_meta" in n.meta for n in gm.graph.nodes)


def test_symbolic_sizes_are_not_taken_for_the_examples_sizes() -> None:
    ep = export(Scaled(), (X,), dynamic_shapes={"x": {0: Dim("batch")}})
    gm = ep.module()
    assert not record_captured_shapes(gm.graph)
    assert not any("tensor_meta" in n.meta for n in gm.graph.nodes)


# ------------------------------------------------------------ every consumer takes a program
class Heads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.norm = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.norm(self.conv(x))
        return {"features": y, "pooled": y.mean((2, 3))}


IMAGE = torch.randn(2, 3, 8, 8)


def test_fuse_takes_an_exported_program_and_keeps_its_output_dict() -> None:
    from fxloom.passes.fuse import fuse

    model = Heads().eval()
    fused = fuse(export(model, (IMAGE,)))
    got, expected = fused(IMAGE), model(IMAGE)
    assert type(got) is dict and got.keys() == expected.keys()
    torch.testing.assert_close(got["pooled"], expected["pooled"])


def test_prepare_qat_takes_an_exported_program_and_keeps_its_output_dict() -> None:
    from fxloom.quantize import prepare_qat

    prepared = prepare_qat(export(Heads().eval(), (IMAGE,)), (IMAGE,))
    assert type(prepared(IMAGE)) is dict


def test_split_by_support_takes_an_exported_program() -> None:
    from fxloom.passes.split_by_support import split_by_support

    split, _ = split_by_support(export(Heads().eval(), (IMAGE,)), lambda node: True)
    assert type(split(IMAGE)) is dict
