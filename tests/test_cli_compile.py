"""`fxloom compile MODEL`: compile a model with fxloom.compile, compare with eager, explain.

The options are tested in-process (``cli.main``), reading what the command printed; the demo's
compile step is tested on the demo's own run (``tests/test_cli.py``'s ``demo_run``).
"""

from __future__ import annotations

import pytest

from fxloom import cli

pytestmark = pytest.mark.bytecode  # fxloom.compile: Python 3.11+


def test_compile_reports_graphs_breaks_and_that_it_matches_eager(capsys) -> None:
    assert cli.main(["compile", "transformer_tiny"]) == cli.EXIT_OK
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("transformer_tiny: 1 graph(s), 0 break(s), first call ")
    assert line.endswith("equal to eager")


def test_compile_explain_prints_the_report(capsys) -> None:
    assert cli.main(["compile", "resnet_tiny", "--explain"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "ResNetTiny.forward: 1 graph(s), 0 break(s)" in out
    assert "guards of entry 0" in out and "x: dtype torch.float32" in out


def test_compile_code_prints_the_guard_the_run_function_and_the_graph(capsys) -> None:
    assert cli.main(["compile", "mlp_tiny", "--code"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "def guard(" in out and "def run(" in out and "def forward(self" in out


def test_the_demo_compiles_a_model_with_a_print_and_a_branch(capsys) -> None:
    from rich.console import Console

    from fxloom.cli import demo, demo_compile

    state = demo.DemoState(console=Console(width=120))
    demo_compile.compile_model(state)
    out = capsys.readouterr().out
    assert state.compile_match
    assert "(printed by the model: hidden has shape (2, 16))" in out
    assert (
        "a branch depends" in out and "demo_compile.py:" in out
    )  # the break, wrapped in its table
