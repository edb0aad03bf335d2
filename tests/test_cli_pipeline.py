"""`fxloom pipeline MODEL --stages N`: the plan's table, its balance, and a check against eager.

Tested in-process (``cli.main``), reading what the command printed.
"""

from __future__ import annotations

import pytest

from fxloom import cli


def test_pipeline_prints_the_plan_and_checks_the_stages(capsys) -> None:
    assert cli.main(["pipeline", "resnet_tiny", "--stages", "2"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "pipeline: 2 stages, balanced by time; balance (max/mean time)" in out
    assert "layers.1 .. fc" in out  # stages named by the modules they span
    assert "resnet_tiny: stages run one after another equal eager: True" in out


def test_pipeline_code_prints_every_stage(capsys) -> None:
    args = ["pipeline", "transformer_tiny", "--stages", "3", "--balance", "flops", "--code"]
    assert cli.main(args) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "stage 2" in out and out.count("def forward(self") == 3


def test_too_many_stages_is_an_error_that_says_how_many(capsys) -> None:
    assert cli.main(["pipeline", "mlp_tiny", "--stages", "50"]) == cli.EXIT_FAILURE
    assert "ask for at most" in capsys.readouterr().err


def test_help_lists_the_balances(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["pipeline", "--help"])
    out = capsys.readouterr().out
    assert "--balance {time,flops,memory}" in out and "--stages N" in out
