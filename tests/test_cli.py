"""The `fxloom` command line: its help, the demo, the version line, and how it reports mistakes.

Most tests run the CLI the way a user does, in a fresh interpreter (`python -m fxloom ...`).
The error-reporting tests call `cli.main()` in-process so they can make a command fail.
"""

from __future__ import annotations

import operator
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fxloom
import fxloom.export
from fxloom import cli

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_fxloom(*args: str, program: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess, as a pipe (not a terminal), and return what it printed."""
    hidden = ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS", "LINES")  # a pipe at 80 columns
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env["NO_COLOR"] = "1"
    command = (program or [sys.executable, "-m", "fxloom"]) + list(args)
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    result.stdout = ANSI_ESCAPE.sub("", result.stdout)
    result.stderr = ANSI_ESCAPE.sub("", result.stderr)
    return result


def test_help_lists_every_subcommand() -> None:
    result = run_fxloom("--help")
    assert result.returncode == 0, result.stderr
    assert "usage: fxloom" in result.stdout
    help_text = " ".join(result.stdout.split())  # argparse wraps long lines
    for subcommand in cli.SUBCOMMANDS:
        assert f"{subcommand.name} {subcommand.summary}" in help_text


@pytest.mark.parametrize("name", [subcommand.name for subcommand in cli.SUBCOMMANDS])
def test_each_subcommand_explains_itself(name: str) -> None:
    result = run_fxloom(name, "--help")
    assert result.returncode == 0, result.stderr
    assert f"usage: fxloom {name}" in result.stdout


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("demo")


@pytest.fixture(scope="module")
def demo_run(demo_dir) -> subprocess.CompletedProcess:
    """One `fxloom demo` run, shared by the tests that read its output."""
    return run_fxloom("demo", "--output-dir", str(demo_dir))


def test_demo_shows_the_generated_code_and_reports_that_results_match(demo_run) -> None:
    result = demo_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert "def forward" in result.stdout  # the generated code is printed
    assert "match" in result.stdout
    assert "MISMATCH" not in result.stdout
    assert "OK" in result.stdout


def test_demo_tables_fit_80_columns_when_piped(demo_run) -> None:
    """Tables fold to fit (fxloom.cli.console); only code and graph text, printed whole so
    that it can be copied, may pass 80 columns."""
    assert "…" not in demo_run.stdout  # no cell cut short
    for line in demo_run.stdout.splitlines():
        assert len(line) <= 80 or line.startswith(("    ", "def ")), line
    assert "node encoder_1" in demo_run.stdout  # the quantization report, folded


def test_demo_traces_the_embedded_models_and_checks_them_against_eager(demo_run) -> None:
    from fxloom.cli import demo

    result = demo_run
    assert result.returncode == 0, result.stdout + result.stderr
    hand_built = result.stdout.index("Build a graph by hand")
    for name in (demo.SMALL_MODEL, demo.BIG_MODEL):
        assert result.stdout.index(f"zoo.build('{name}')") > hand_built  # hand-built steps first
    assert "torch.flatten" in result.stdout  # the small model's table
    assert re.search(r"\.\.\. \d+ more lines", result.stdout)  # the big model's code, trimmed
    assert re.search(r"mlp_tiny\s.*True", result.stdout)
    assert re.search(r"resnet_tiny\s.*True", result.stdout)
    assert "traced models vs eager: match" in result.stdout


def test_demo_runs_the_passes_and_draws_a_graph(demo_run, demo_dir) -> None:
    result = demo_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert "node.meta['tensor_meta']" in result.stdout  # shapes propagated
    assert "MACs" in result.stdout and "25.56 M" in result.stdout  # ResNet-50's cost
    assert "folds each batch norm" in result.stdout and "matches eager: True" in result.stdout
    assert list(demo_dir.glob("resnet_tiny.*"))  # .svg, or .dot where Graphviz is missing


def test_demo_exports_a_model_and_checks_the_program_against_eager(demo_run) -> None:
    result = demo_run
    assert result.returncode == 0, result.stdout + result.stderr
    exported = result.stdout[result.stdout.index("Export a model to ATen operators") :]
    exported = " ".join(exported.split())  # rich wraps long lines at the pipe's 80 columns
    assert "inputs: 29 parameters, 27 buffers, 1 user input" in exported  # the signature summary
    assert "torch.ops.aten.convolution.default(x, p_conv1_weight" in exported
    assert "(the same as the traced graph's)" in exported  # cost on the exported program
    assert "ep.module() matches eager: True" in exported
    assert "one export" in exported and "batches 3, 8 match eager: True" in exported


def test_an_exported_program_that_differs_from_eager_fails_the_demo(monkeypatch) -> None:
    import io

    from rich.console import Console

    from fxloom.cli import demo, demo_export

    monkeypatch.setattr(demo_export, "matches_eager", lambda *args: False)
    console = Console(file=io.StringIO(), width=100, no_color=True)
    state = demo.DemoState(console=console, results_match=True, traced_match=True)
    demo_export.export_model(state)
    assert demo._summarise(state) == 1
    assert "MISMATCH: the exported program differ" in console.file.getvalue()


def test_demo_quantizes_a_model_and_reports_its_speedup_error_and_float_fallbacks(demo_run) -> None:
    result = demo_run
    assert result.returncode == 0, result.stdout + result.stderr
    quantized = result.stdout[result.stdout.index("Quantize a model to int8: DeepRecommender") :]
    quantized = " ".join(quantized.split())
    assert "latency on the example: fp32 " in quantized and "error against fp32" in quantized
    assert "median of " in quantized and "1 thread)" in quantized
    assert "static int8, engine x86: 6 int8, 5 float" in quantized
    assert "within relative error 0.1 and cosine 0.99 of fp32: True" in quantized
    assert "the int8 model is close to fp32" in quantized  # the final verdict


def test_an_int8_model_far_from_fp32_fails_the_demo(monkeypatch) -> None:
    import io

    from rich.console import Console

    from fxloom.cli import demo, demo_quantize

    monkeypatch.setattr(demo_quantize, "MAX_RELATIVE_ERROR", 0.0)
    console = Console(file=io.StringIO(), width=100, no_color=True)
    state = demo.DemoState(console=console, results_match=True, traced_match=True)
    demo_quantize.quantize_model(state)
    assert demo._summarise(state) == 1
    assert "the int8 DeepRecommender at 1024 items, batch 32 (too far from fp32)" in (
        " ".join(console.file.getvalue().split())
    )


def test_a_traced_model_that_differs_from_eager_fails_the_demo(monkeypatch, tmp_path) -> None:
    import io

    from rich.console import Console

    import fxloom
    from fxloom.cli import demo

    def tracing_off_by_one(model):
        traced = real_symbolic_trace(model)
        (output,) = traced.graph.find_nodes(op="output")
        with traced.graph.inserting_before(output):
            shifted = traced.graph.call_function(operator.add, (output.args[0], 1.0))
        output.args = (shifted,)
        traced.recompile()
        return traced

    real_symbolic_trace = fxloom.symbolic_trace
    monkeypatch.setattr(fxloom, "symbolic_trace", tracing_off_by_one)
    console = Console(file=io.StringIO(), width=100, no_color=True)
    assert demo.run(console, drawing_dir=tmp_path) == 1
    printed = console.file.getvalue()
    assert "traced models vs eager: MISMATCH" in printed
    assert "MISMATCH: the traced zoo models differ from eager PyTorch." in printed


def test_version_names_fxloom_torch_and_python() -> None:
    result = run_fxloom("version")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"fxloom \S+ \(torch \S+, Python \S+\)\n", result.stdout)


def test_the_installed_console_script_runs() -> None:
    script = Path(sys.executable).with_name("fxloom")
    if not script.exists():
        pytest.skip("fxloom is not installed as a console script here (pip install -e .)")
    result = run_fxloom("version", program=[str(script)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("fxloom ")


def test_the_console_script_and_python_m_both_run_cli_main() -> None:
    import importlib

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    entry_point = tomllib.loads(pyproject.read_text())["project"]["scripts"]["fxloom"]
    module_name, _, function_name = entry_point.partition(":")
    assert getattr(importlib.import_module(module_name), function_name) is cli.main
    assert importlib.import_module("fxloom.__main__").main is cli.main


def test_a_factory_in_the_current_directory_is_found(tmp_path) -> None:
    (tmp_path / "mymodel.py").write_text(
        "import torch\n\n"
        "def make():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 2)), (torch.randn(3, 4),)\n"
    )
    # As the console script starts: its own directory, not the current one, on sys.path.
    console_script = "import sys; sys.path.pop(0); from fxloom.cli import main; sys.exit(main())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    result = subprocess.run(
        [sys.executable, "-c", console_script, "cost", "mymodel:make"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "Linear" in result.stdout


def test_an_unknown_subcommand_exits_2_and_names_the_valid_ones() -> None:
    result = run_fxloom("frobnicate")
    assert result.returncode == 2
    assert "invalid choice: 'frobnicate'" in result.stderr
    for subcommand in cli.SUBCOMMANDS:
        assert subcommand.name in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["compile", "export", "lower", "cost", "draw", "pipeline"])
def test_a_model_that_is_neither_in_the_zoo_nor_importable_is_a_usage_error(command, capsys):
    assert cli.main([command, "resnet18"]) == cli.EXIT_USAGE
    error = capsys.readouterr().err
    assert error.startswith(f"fxloom {command}: error: no zoo model named 'resnet18'")
    assert "resnet_tiny" in error and error.count("\n") == 1


def test_a_factory_that_cannot_be_imported_is_a_usage_error(capsys):
    assert cli.main(["export", "no_such_package:make"]) == cli.EXIT_USAGE
    assert "cannot import 'no_such_package'" in capsys.readouterr().err


def test_no_subcommand_exits_2_and_points_to_help() -> None:
    result = run_fxloom()
    assert result.returncode == 2
    assert "usage: fxloom" in result.stderr
    assert "fxloom --help" in result.stderr


def test_a_failing_command_prints_one_line_not_a_traceback(monkeypatch, capsys) -> None:
    import fxloom.cli.demo

    def broken_demo(console=None, drawing_dir=None) -> int:
        raise RuntimeError("node %add has no users\n(the graph follows)")

    monkeypatch.setattr(fxloom.cli.demo, "run", broken_demo)
    assert cli.main(["demo"]) == cli.EXIT_FAILURE
    error_output = capsys.readouterr().err
    assert error_output.count("\n") == 1
    assert "fxloom demo: error: RuntimeError: node %add has no users" in error_output
    assert "Traceback" not in error_output


def test_traceback_flag_shows_where_a_command_failed(monkeypatch, capsys) -> None:
    import fxloom.cli.demo

    def broken_demo(console=None, drawing_dir=None) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(fxloom.cli.demo, "run", broken_demo)
    assert cli.main(["demo", "--traceback"]) == cli.EXIT_FAILURE
    error_output = capsys.readouterr().err
    assert "Traceback (most recent call last)" in error_output
    assert "broken_demo" in error_output


def test_a_demo_mismatch_is_exit_code_1(monkeypatch, capsys) -> None:
    import fxloom.cli.demo

    monkeypatch.setattr(fxloom.cli.demo, "run", lambda console=None, drawing_dir=None: 1)
    assert cli.main(["demo"]) == 1
    assert capsys.readouterr().err == ""  # a mismatch, not an error


@pytest.fixture(scope="module")
def export_run() -> subprocess.CompletedProcess:
    """One `fxloom export mlp_tiny --check` run, shared by the tests that read its output."""
    return run_fxloom("export", "mlp_tiny", "--check")


def test_export_prints_a_summary_the_programs_code_and_its_graph_signature(export_run) -> None:
    result = export_run
    assert result.returncode == 0, result.stdout + result.stderr
    summary = "mlp_tiny: 17 nodes, 9 operator calls; inputs: 6 parameters, 1 user input"
    assert result.stdout.startswith(summary)
    assert "def forward(self, p_layers_0_weight," in result.stdout
    assert "torch.ops.aten.addmm.default(" in result.stdout
    signature = result.stdout[result.stdout.index("Graph signature:") :]
    assert "p_layers_0_weight: PARAMETER target='layers.0.weight'" in signature
    assert "x: USER_INPUT" in signature and "addmm_2: USER_OUTPUT" in signature


def test_export_check_compares_the_program_with_eager(export_run) -> None:
    assert "ep.module() matches eager PyTorch on the example inputs: True" in export_run.stdout


def test_export_dynamic_batch_prints_the_range_constraints() -> None:
    result = run_fxloom("export", "mlp_tiny", "--dynamic-batch", "--check")
    assert result.returncode == 0, result.stderr
    assert "Range constraints: {s0: VR[0, inf]}" in result.stdout
    assert "sym_size" in result.stdout  # the batch is read from the input, not fixed
    assert "matches eager PyTorch on the example inputs: True" in result.stdout


def test_export_graph_prints_the_graph_in_the_irs_text_form() -> None:
    result = run_fxloom("export", "mlp_tiny", "--graph")
    assert result.returncode == 0, result.stderr
    assert "%x : [num_users=1] = placeholder[target=x]" in result.stdout
    assert "def forward" not in result.stdout


def test_export_of_a_factory_without_example_inputs_says_how_to_give_them(capsys) -> None:
    assert cli.main(["export", "fxloom.zoo.mlp:mlp_tiny"]) == cli.EXIT_FAILURE
    error_output = capsys.readouterr().err
    assert "comes with no example inputs" in error_output
    assert "return (model, example_inputs)" in error_output


def test_export_check_exits_1_when_the_program_differs_from_eager(monkeypatch, capsys) -> None:
    from fxloom.cli import export

    monkeypatch.setattr(export, "matches_eager", lambda *args: False)
    assert cli.main(["export", "mlp_tiny", "--check"]) == 1
    assert "matches eager PyTorch on the example inputs: False" in capsys.readouterr().out


@pytest.mark.parametrize(
    "command, load",
    [
        (["export", "mlp_tiny"], lambda path: fxloom.export.load(path).module()),
        (["lower", "mlp_tiny"], lambda path: fxloom.load(path)),
        (["quantize", "mlp_tiny", "--mode", "dynamic"], lambda path: fxloom.load(path)),
    ],
    ids=["export", "lower", "quantize"],
)
def test_output_saves_what_the_command_made_and_says_how_to_load_it(
    command, load, tmp_path, capsys
):
    path = tmp_path / "made.fxl"
    assert cli.main([*command, "-o", str(path)]) == cli.EXIT_OK
    assert f"saved to {path}" in capsys.readouterr().out
    model, inputs = fxloom.zoo.build("mlp_tiny")
    with torch.no_grad():
        expected, got = model(*inputs), load(path)(*inputs)
    tolerance = 0.1 if command[0] == "quantize" else 1e-5
    assert torch.allclose(got, expected, atol=tolerance, rtol=tolerance)


NOTHING_LOWERS = """
import torch


class Spectrum(torch.nn.Module):
    def forward(self, x):
        return torch.fft.fft(x).real


def make():
    return Spectrum(), (torch.randn(4, 8),)
"""


def test_lower_of_a_model_nothing_of_which_lowers_exits_1_without_a_speedup(
    tmp_path, capsys, monkeypatch
):
    (tmp_path / "nothing_lowers.py").write_text(NOTHING_LOWERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["lower", "nothing_lowers:make"]) == cli.EXIT_FAILURE
    out = capsys.readouterr().out
    assert "no operator lowered to onnxruntime" in out and "fft_fft" in out
    assert "x)" not in out.splitlines()[-1] and "speed" not in out.lower()
