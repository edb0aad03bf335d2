"""Tables the CLI prints stay readable at 80 columns when stdout is not a terminal.

In a pipe rich prints at ``COLUMNS``, or 80 columns when it is unset; a table wider than that
is folded (one block per row, ``column  value`` lines: ``fxloom.cli.console``) instead of
being squeezed into unreadable columns or cut with "…". Each command runs piped with
``COLUMNS`` unset; no line may pass 80 columns and every cell must be there whole.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.table import Table

from fxloom import zoo
from fxloom.cli.console import FittingConsole
from fxloom.distributed import pipeline

WIDTH = 80


def run_piped(*args: str, columns: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR")}
    env["NO_COLOR"] = "1"
    if columns is not None:
        env["COLUMNS"] = columns
    done = subprocess.run(
        [sys.executable, "-m", "fxloom", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def assert_fits(output: str) -> None:
    too_wide = [line for line in output.splitlines() if len(line) > WIDTH]
    assert not too_wide, "\n".join(too_wide)
    assert "…" not in output  # no cell cut short


def test_the_pipeline_plan_fits_80_columns_with_every_stage_whole():
    output = run_piped("pipeline", "resnet_tiny", "--stages", "2", "--balance", "flops")
    assert_fits(output)
    model, inputs = zoo.build("resnet_tiny")
    plan = pipeline(model.eval(), inputs, stages=2, balance="flops")
    for stage in plan.stages:
        assert f"stage {stage.index}" in output
        assert f"{stage.first} .. {stage.last}" in output
    assert "balanced by flops" in output


def test_the_cost_table_fits_80_columns_with_every_cell_whole():
    output = run_piped("cost", "resnet50")
    assert_fits(output)
    for cell in ("module layer3", "AdaptiveAvgPool2d", "BatchNorm2d", "8.24 G", "25.56 M"):
        assert cell in output
    assert "module total" in output  # the footer row too


def test_the_quantize_report_fits_80_columns():
    output = run_piped("quantize", "deeprec_tiny")
    assert_fits(output)
    assert "node encoder_1" in output and "encoder.1, a SELU" in output
    assert "no int8 kernel for it" in output


@pytest.mark.bytecode
def test_compile_explain_fits_80_columns():
    assert_fits(run_piped("compile", "transformer_tiny", "--explain"))


def test_a_wider_columns_setting_keeps_the_table_as_a_table():
    output = run_piped("cost", "resnet50", columns="200")
    assert "┃ module " in output and "AdaptiveAvgPool2d" in output
    assert "module layer3" not in output


# ------------------------------------------------ the console itself, without a subprocess
def console_output(table: Table, width: int) -> str:
    console = FittingConsole(file=io.StringIO(), width=width, no_color=True)
    console.print(table)
    return console.file.getvalue()


def wide_table() -> Table:
    table = Table(title="layers")
    for name in ("layer", "kind", "why it stays in float"):
        table.add_column(name, no_wrap=True)
    table.add_row("encoder.1", "SELU", "no int8 kernel for it in fxloom.quantize.table")
    table.add_row("decoder.3", "Linear", "")
    return table


def test_a_table_that_fits_prints_as_a_table():
    assert "┃ layer " in console_output(wide_table(), width=120)


def test_a_table_too_wide_is_folded_into_one_block_per_row():
    output = console_output(wide_table(), width=40)
    assert [line.rstrip() for line in output.splitlines()] == [
        "layers",
        "layer encoder.1",
        "  kind                   SELU",
        "  why it stays in float  no int8 kernel",
        "                         for it in",
        "                         fxloom.quantize",
        "                         .table",
        "layer decoder.3",
        "  kind                   Linear",
    ]


@pytest.mark.parametrize("width", [30, 50, 80])
def test_a_folded_table_never_passes_the_width(width):
    output = console_output(wide_table(), width=width)
    assert max(len(line) for line in output.splitlines()) <= width


def test_the_lowering_report_fits_80_columns_with_every_region_named():
    output = run_piped("lower", "resnet_tiny")
    assert_fits(output)
    assert "_run_on_acc_0" in output
    assert "onnxruntime" in output
