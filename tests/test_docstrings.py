"""The examples in fxloom's docstrings run and print what they say."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import fxloom

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(fxloom.__path__, prefix="fxloom.")
    if info.name not in ("fxloom.__main__", "fxloom.cli")  # fxloom.cli.cost etc. are tested
)


@pytest.mark.parametrize(
    "name",
    [  # fxloom.compile's own modules run their examples on Python 3.11+ only
        pytest.param(name, marks=pytest.mark.bytecode)
        if name.startswith("fxloom.bytecode")
        else name
        for name in MODULES
    ],
)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0


def test_the_core_modules_have_examples():
    tried = {
        name: doctest.testmod(importlib.import_module(name)).attempted
        for name in ("fxloom.node", "fxloom.graph", "fxloom.graph_module", "fxloom.tracer")
    }
    assert all(count > 0 for count in tried.values()), tried
