"""``explain()`` offers the fields ``torch._dynamo.explain`` users know, beside its own table.

``graphs``, ``graph_count``, ``graph_break_count``, ``break_reasons`` (``reason``,
``user_stack``), ``op_count``, ``ops_per_graph``, ``out_guards`` and ``compile_times`` are
attributes of fxloom's report with the same names. Each case runs ``torch._dynamo.explain``
(the peer) on the same program, and checks side by side what the two agree on: the number
of graphs and of breaks, and the user's line each break is on.
"""

from __future__ import annotations

import inspect
import operator
import traceback

import pytest
import torch

import fxloom


def branch_on_data(x):
    y = torch.sin(x) + 1
    if y.sum() > 0:  # a break in both: the branch depends on a tensor's value
        return torch.cos(y) * 2
    return y - 1


class BlockWithABranch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)

    def forward(self, x):
        h = torch.relu(self.lin(x))
        if h.sum() > 0:  # a break in both
            h = h * 2
        return h + 1


def no_break(x):
    return torch.relu(x) * 2


def line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.fixture
def x() -> torch.Tensor:
    return torch.ones(3)  # positive: the branches take their first side


def dynamo_explain(fn, *args):
    import torch._dynamo  # the peer

    torch._dynamo.reset()
    try:
        return torch._dynamo.explain(fn)(*args)
    finally:
        torch._dynamo.reset()


def test_a_function_with_a_break_has_dynamos_graph_and_break_counts(x):
    ours, theirs = fxloom.explain(branch_on_data, x), dynamo_explain(branch_on_data, x)
    assert (ours.graph_count, ours.graph_break_count) == (2, 1)
    assert (ours.graph_count, ours.graph_break_count) == (
        theirs.graph_count,
        theirs.graph_break_count,
    )


def test_a_break_reason_names_the_users_line_as_dynamos_does(x):
    ours, theirs = fxloom.explain(branch_on_data, x), dynamo_explain(branch_on_data, x)
    (reason,) = ours.break_reasons
    frame = reason.user_stack[-1]
    assert isinstance(frame, traceback.FrameSummary)
    assert (frame.filename, frame.lineno) == (__file__, line_of(branch_on_data, "if y.sum()"))
    assert frame.lineno == theirs.break_reasons[0].user_stack[-1].lineno
    assert reason.reason == "a branch depends on a tensor's value"


def test_ops_per_graph_lists_dynamos_function_calls_and_fxloom_also_lists_methods(x):
    ours, theirs = fxloom.explain(branch_on_data, x), dynamo_explain(branch_on_data, x)
    functions = [[op for op in ops if not isinstance(op, str)] for ops in ours.ops_per_graph]
    assert (
        functions
        == theirs.ops_per_graph
        == [
            [torch.sin, operator.add, operator.gt],
            [torch.cos, operator.mul],
        ]
    )
    assert "sum" in ours.ops_per_graph[0]  # a method call, which Dynamo's list leaves out
    assert ours.op_count == sum(len(ops) for ops in ours.ops_per_graph) == 6


def test_a_module_with_a_break_has_dynamos_graph_and_break_counts(x):
    model = BlockWithABranch()
    ours, theirs = fxloom.explain(model, x), dynamo_explain(model, x)
    assert (ours.graph_count, ours.graph_break_count) == (2, 1)
    assert (ours.graph_count, ours.graph_break_count) == (
        theirs.graph_count,
        theirs.graph_break_count,
    )
    line = line_of(BlockWithABranch.forward, "if h.sum()")
    assert ours.break_reasons[0].user_stack[-1].lineno == line
    assert theirs.break_reasons[0].user_stack[-1].lineno == line


def test_a_submodule_call_is_listed_by_its_path_where_dynamo_lists_its_functions(x):
    model = BlockWithABranch()
    ours, theirs = fxloom.explain(model, x), dynamo_explain(model, x)
    assert ours.ops_per_graph[0][0] == "lin"  # fxloom keeps the Linear a call_module
    assert theirs.ops_per_graph[0][0] is torch._C._nn.linear  # Dynamo inlines it


def test_graphs_are_the_captured_graph_modules(x):
    report = fxloom.explain(branch_on_data, x)
    assert len(report.graphs) == report.graph_count
    assert all(isinstance(graph, fxloom.GraphModule) for graph in report.graphs)
    assert torch.equal(report.graphs[0](x)[0], torch.sin(x) + 1)


def test_out_guards_are_every_entrys_guards_in_one_list(x):
    report = fxloom.explain(branch_on_data, x)
    assert [guard.text for guard in report.out_guards] == [
        text for entry in report.guards for text in entry
    ]
    assert any(guard.text.startswith("x: dtype torch.float32") for guard in report.out_guards)


def test_compile_times_is_text_with_each_graphs_time(x):
    report = fxloom.explain(branch_on_data, x)
    assert isinstance(report.compile_times, str)
    assert "per graph" in report.compile_times
    assert report.compile_times.count(",") >= report.graph_count - 1


def test_a_function_without_a_break_has_no_break_reasons(x):
    ours, theirs = fxloom.explain(no_break, x), dynamo_explain(no_break, x)
    assert (ours.graph_count, ours.graph_break_count, ours.break_reasons) == (1, 0, [])
    assert (theirs.graph_count, theirs.graph_break_count) == (1, 0)
    assert ours.ops_per_graph == theirs.ops_per_graph == [[torch.relu, operator.mul]]
