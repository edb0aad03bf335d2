"""Where a node came from: one stamper (``fxloom.values.provenance.SourceStamper``) writes
``meta["stack_trace"]`` and ``meta["source_location"]`` for symbolic tracing and export alike,
and one reader (``fxloom.source_location``) serves every message, report and drawing."""

from __future__ import annotations

import inspect

import torch
from torch import nn

import fxloom
from fxloom.export import export
from fxloom.source_location import (
    SourceLocation,
    format_stack_trace,
    parse_stack_trace,
    source_location,
)
from fxloom.values.provenance import location_of, stamp_source

TRACE = (
    '  File "/src/app.py", line 3, in main\n'
    "    model(x)\n"
    '  File "/src/model.py", line 12, in forward\n'
    "    return torch.relu(x)\n"
)


class Relu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)  # the line every stamp names


RELU_LINE = inspect.getsourcelines(Relu.forward)[1] + 1


def _relu_node(graph: fxloom.Graph) -> fxloom.Node:
    return next(node for node in graph.nodes if "relu" in str(node.target))


def test_a_stack_trace_parses_into_its_frames_outermost_first() -> None:
    assert parse_stack_trace(TRACE) == [
        SourceLocation("/src/app.py", 3, "main", "model(x)"),
        SourceLocation("/src/model.py", 12, "forward", "return torch.relu(x)"),
    ]


def test_formatting_the_parsed_frames_gives_the_text_back() -> None:
    assert format_stack_trace(parse_stack_trace(TRACE)) == TRACE


def test_a_frame_without_its_code_line_parses_with_empty_code() -> None:
    trace = '  File "<string>", line 1, in <module>\n  File "m.py", line 2, in f\n    y = 1\n'
    assert [loc.code for loc in parse_stack_trace(trace)] == ["", "y = 1"]


def test_text_in_no_tracebacks_form_has_no_frames() -> None:
    assert parse_stack_trace("made by hand") == [] and parse_stack_trace(None) == []


def test_the_short_form_names_the_file_without_directories() -> None:
    assert SourceLocation("/src/model.py", 12, "forward").short == "model.py:12"


def test_tracing_with_stack_traces_stamps_the_user_line_as_fields() -> None:
    graph = fxloom.Tracer(record_stack_traces=True).trace(Relu())
    location = _relu_node(graph).meta["source_location"]
    assert (location.file, location.line) == (__file__, RELU_LINE)
    assert (location.function, location.code) == (
        "forward",
        "return torch.relu(x)  # the line every stamp names",
    )


def test_tracing_keeps_the_last_three_user_frames_in_the_text() -> None:
    def two_deep(m: nn.Module) -> fxloom.Graph:
        return fxloom.Tracer(record_stack_traces=True).trace(m)

    node = _relu_node(two_deep(Relu()))
    frames = parse_stack_trace(node.meta["stack_trace"])
    assert len(frames) == 3 and frames[-1] == node.meta["source_location"]


def test_export_stamps_the_same_structured_location() -> None:
    ep = export(Relu(), (torch.ones(2),))
    location = _relu_node(ep.graph).meta["source_location"]
    assert (location.file, location.line, location.function) == (__file__, RELU_LINE, "forward")
    assert parse_stack_trace(_relu_node(ep.graph).meta["stack_trace"])[-1] == location


def test_a_node_without_a_stamp_is_located_from_its_stack_trace() -> None:
    graph = fxloom.Graph()
    node = graph.placeholder("x")
    node.stack_trace = TRACE
    assert source_location(node) == SourceLocation(
        "/src/model.py", 12, "forward", "return torch.relu(x)"
    )


def test_setting_a_new_stack_trace_replaces_the_stamped_location() -> None:
    graph = fxloom.Tracer(record_stack_traces=True).trace(Relu())
    node = _relu_node(graph)
    node.stack_trace = TRACE
    assert "source_location" not in node.meta
    assert source_location(node).file == "/src/model.py"


def test_the_location_is_carried_by_a_transformer() -> None:
    gm = fxloom.GraphModule(Relu(), fxloom.Tracer(record_stack_traces=True).trace(Relu()))
    carried = _relu_node(fxloom.Transformer(gm).transform().graph)
    assert carried.meta["source_location"] == _relu_node(gm.graph).meta["source_location"]


def test_verbose_code_comments_the_innermost_frame() -> None:
    graph = fxloom.Tracer(record_stack_traces=True).trace(Relu())
    src = graph.python_code("self", verbose=True).src
    assert f'# File "{__file__}", line {RELU_LINE}, in forward | return torch.relu(x)' in src


def test_a_loaded_program_reads_its_locations_back_from_the_stack_traces(tmp_path) -> None:
    ep = export(Relu(), (torch.ones(2),))
    fxloom.export.save(ep, tmp_path / "relu.fxl")
    loaded = fxloom.export.load(tmp_path / "relu.fxl")
    assert (
        _relu_node(loaded.graph).meta["source_location"]
        == _relu_node(ep.graph).meta["source_location"]
    )


def test_a_frontend_that_knows_its_frames_by_code_and_line_stamps_the_same_way() -> None:
    location = location_of(Relu.forward.__code__, RELU_LINE)
    meta: dict = {}
    stamp_source(meta, format_stack_trace([location]), location)
    assert meta["source_location"] == location
    assert location.code == "return torch.relu(x)  # the line every stamp names"
    assert parse_stack_trace(meta["stack_trace"]) == [location]
