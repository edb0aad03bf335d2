"""``explain().graph_count`` counts graphs as Dynamo does: those that hold an operation.

A piece that only hands values on (before a first break, or between two breaks) compiles no graph in Dynamo; fxloom still makes a cache entry
for it, counted in ``piece_count`` and listed in ``graph_reports``.
"""

from __future__ import annotations

import torch

import fxloom

X = torch.randn(1)


def two_breaks_with_nothing_between(x):
    a = float(x)  # a break first: the entry before it holds no operation
    b = float(x)  # a break right after: the piece between holds none either
    return x * (a + b)


def test_a_piece_without_operations_is_not_a_graph():
    compiled = fxloom.compile(two_breaks_with_nothing_between)
    torch.testing.assert_close(compiled(X), two_breaks_with_nothing_between(X))
    report = compiled.explain()
    assert report.piece_count > report.graph_count
    assert all(ops for ops in report.ops_per_graph)


def test_graph_count_is_the_number_of_graphs_listed():
    compiled = fxloom.compile(two_breaks_with_nothing_between)
    compiled(X)
    report = compiled.explain()
    assert report.graph_count == len(report.graphs) == len(report.ops_per_graph)
    assert report.piece_count == len(report.graph_reports)


def test_a_function_without_breaks_is_one_graph_and_one_piece():
    report = fxloom.explain(lambda x: torch.relu(x) * 2, X)
    assert (report.graph_count, report.piece_count) == (1, 1)


def test_the_table_shows_both_counts():
    compiled = fxloom.compile(two_breaks_with_nothing_between)
    compiled(X)
    report = compiled.explain()
    text = str(report)
    assert f"{report.graph_count} graph(s)" in text
    assert f"{report.piece_count} piece(s)" in text
