"""Calls of a compiled function checked against eager, one by one: the helpers the tests of
sizes and numbers that change share."""

from __future__ import annotations

import warnings
from typing import Any

import torch

import fxloom
from fxloom import pytree


def run_calls(fn: Any, calls: list[tuple], **options: Any) -> Any:
    """Compile ``fn`` (with ``options``), make each call, compare each result with eager's
    (``assert_same``); returns the compiled function."""
    compiled = fxloom.compile(fn, **options)
    for args in calls:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got, expected = compiled(*args), fn(*args)
        assert_same(got, expected)
    return compiled


def assert_same(got: Any, expected: Any) -> None:
    """The same leaves: tensors of one dtype and shape and close values, other values equal
    and of one type."""
    got_leaves, expected_leaves = pytree.tree_leaves(got), pytree.tree_leaves(expected)
    assert len(got_leaves) == len(expected_leaves)
    for a, b in zip(got_leaves, expected_leaves):
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        else:
            assert type(a) is type(b) and a == b


def graphs(compiled: Any) -> int:
    return compiled.explain().graph_count
