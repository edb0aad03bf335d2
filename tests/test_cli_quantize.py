"""`fxloom quantize MODEL`: calibrate on random or given data, print speedup, error and report.

One run in a fresh interpreter, as a user types it; the options are tested in-process
(``cli.main``), reading what the command printed.
"""

from __future__ import annotations

import pytest
import torch
from test_cli import run_fxloom

from fxloom import cli
from fxloom.cli.quantize import random_batches


@pytest.fixture(scope="module")
def quantize_run():
    return run_fxloom("quantize", "deeprec_tiny")


def test_quantize_prints_speedup_error_and_the_report(quantize_run) -> None:
    result = quantize_run
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "deeprec_tiny: static int8, engine x86, 8 random batches"
    text = " ".join(result.stdout.split())  # the summary line wraps at 80 columns
    summary = text[text.index("latency on the example") : text.index("static int8, engine x86:")]
    assert summary.startswith("latency on the example: fp32 ") and text.index(summary) < 100
    assert "x; median of " in summary
    assert ", 1 thread); error against fp32: relative 0.0" in summary
    assert ", cosine 0.99" in summary
    assert "static int8, engine x86: 6 int8, 5 float" in result.stdout
    assert "encoder.1, a SELU" in result.stdout and "no int8 kernel for it" in result.stdout


def test_quantize_is_quiet_about_torch_s_deprecation_notices(quantize_run) -> None:
    assert "deprecated" not in quantize_run.stderr


def test_quantize_dynamic_needs_no_calibration(capsys) -> None:
    assert cli.main(["quantize", "deeprec_tiny", "--mode", "dynamic"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("deeprec_tiny: dynamic int8, engine x86, no calibration")
    assert "int8 dynamic" in out


def test_quantize_takes_the_engine_and_the_number_and_size_of_batches(capsys) -> None:
    args = ["quantize", "cnn_small", "--engine", "qnnpack", "--batches", "2", "--batch-size", "1"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("cnn_small: static int8, engine qnnpack, 2 random batches")
    assert "static int8, engine qnnpack: 6 int8, 2 float" in out  # average pool, flatten


def test_quantize_calibrates_on_a_saved_tensor_cut_into_batches(tmp_path, capsys) -> None:
    data = tmp_path / "ratings.pt"
    torch.save(torch.rand(12, 256), data)
    assert cli.main(["quantize", "deeprec_tiny", "--data", str(data), "--batch-size", "4"]) == 0
    assert f"3 batches from {data}" in capsys.readouterr().out


def test_quantize_calibrates_on_a_saved_list_of_batches(tmp_path, capsys) -> None:
    data = tmp_path / "ratings.pt"
    torch.save([torch.rand(8, 256) for _ in range(5)], data)
    assert cli.main(["quantize", "deeprec_tiny", "--data", str(data)]) == 0
    assert f"5 batches from {data}" in capsys.readouterr().out


def test_quantize_data_of_the_wrong_kind_is_a_one_line_error(tmp_path, capsys) -> None:
    data = tmp_path / "bad.pt"
    torch.save({"x": torch.rand(2, 256)}, data)
    assert cli.main(["quantize", "deeprec_tiny", "--data", str(data)]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert "holds a dict; save a list of batches" in err and err.count("\n") == 1


def test_quantize_of_a_factory_without_example_inputs_says_how_to_give_them(capsys) -> None:
    assert cli.main(["quantize", "fxloom.zoo.mlp:mlp_tiny"]) == cli.EXIT_FAILURE
    assert "return (model, example_inputs)" in capsys.readouterr().err


def test_quantize_refuses_a_batch_count_below_one(capsys) -> None:
    assert cli.main(["quantize", "deeprec_tiny", "--batches", "0"]) == cli.EXIT_FAILURE
    assert "--batches and --batch-size take a positive number" in capsys.readouterr().err


def test_quantize_help_lists_its_options() -> None:
    result = run_fxloom("quantize", "--help")
    assert result.returncode == 0
    for option in ("--mode {static,dynamic}", "--engine {x86,fbgemm,qnnpack}", "--data FILE.pt"):
        assert option in result.stdout


def test_random_batches_are_shaped_like_the_inputs_with_the_batch_size_asked() -> None:
    ids = torch.tensor([[3, 7, 5]])
    batches = random_batches((torch.randn(2, 4), ids), count=3, batch_size=5)
    assert len(batches) == 3
    floats, tokens = batches[0]
    assert floats.shape == (5, 4) and tokens.shape == (5, 3)
    assert tokens.dtype == torch.long and 3 <= int(tokens.min()) and int(tokens.max()) <= 7


def test_random_batches_keep_inputs_by_name() -> None:
    (batch,) = random_batches({"x": torch.randn(2, 4)}, count=1, batch_size=None)
    assert batch["x"].shape == (2, 4)
