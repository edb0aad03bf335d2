"""Every graph break names a row of one registry, and every row is used.

``fxloom.bytecode.breaks.BREAKS`` holds each kind of graph break once, with the sentence
``explain()`` shows and the fix it suggests; a ``Break`` naming an unknown kind fails when it
is raised, and this test finds, by reading the sources, a kind named nowhere or a ``Break``
whose kind is not a literal the registry holds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fxloom.bytecode.breaks import BREAKS, Break

PACKAGE = Path(__file__).resolve().parents[2] / "fxloom" / "bytecode"


def break_kinds_named_in_the_sources() -> dict[str, list[str]]:
    named: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Break":
                kind = node.args[0]
                where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
                if path.name == "unsupported.py":  # its kinds come from its STOPS table
                    continue
                assert isinstance(kind, ast.Constant), f"{where}: Break's kind must be a literal"
                named.setdefault(kind.value, []).append(where)
            if isinstance(node, ast.Dict) and path.name == "unsupported.py":
                for value in node.values:  # STOPS: op -> kind
                    if isinstance(value, ast.Constant) and value.value in BREAKS:
                        named.setdefault(value.value, []).append(str(path.name))
    return named


def test_every_break_names_a_registered_kind():
    unknown = {
        kind: where
        for kind, where in break_kinds_named_in_the_sources().items()
        if kind not in BREAKS
    }
    assert not unknown


def test_every_registered_kind_is_used():
    assert set(BREAKS) <= set(break_kinds_named_in_the_sources())


def test_every_kind_says_what_happened_and_what_to_do():
    for kind, row in BREAKS.items():
        assert row.title and row.fix, kind


def test_an_unknown_kind_is_refused_when_raised():
    with pytest.raises(KeyError, match="no graph break kind"):
        Break("no-such-kind", "detail")
