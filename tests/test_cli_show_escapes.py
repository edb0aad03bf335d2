"""`fxloom show FILE` prints a file's strings escaped, never as the terminal would act on them.

A hostile file hides terminal controls in the strings show prints (class names, module paths,
the header, devices, dtypes, refused targets, a graph's arguments, the program sections): an
escape sequence could clear the screen or conceal the "fxloom.load would refuse" lines, a
newline could forge one. Show prints each as ``repr`` would write the character (``\\x1b``),
on the line it belongs to; a normal file prints exactly as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import fxloom
import fxloom.export
from fxloom import cli
from fxloom.cli import save as show_module

CLEAR_SCREEN = "\x1b[2J\x1b[H"
CLIPBOARD = "\x1b]52;c;dG91Y2g=\x07"
RIGHT_TO_LEFT = "\u202e"
FORGED = "\nfxloom.load would refuse (0):"


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 2)
        self.register_buffer("scale", torch.ones(2))

    def forward(self, x):
        return torch.relu(self.lin(x)).add(self.scale)


def forbidden(text: str) -> set[str]:
    """Characters a terminal acts on, but the newlines and tabs show writes itself."""
    return {
        c
        for c in text
        if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs")
    }


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("show") / "small.fxl"
    fxloom.save(fxloom.symbolic_trace(Small()), path)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("show") / "small_exported.fxl"
    fxloom.export.save(fxloom.export.export(Small(), (torch.randn(4, 3),)), path)
    return path


def rewritten(source: Path, target: Path, edit, member: str = "fxloom/program.json") -> Path:
    """A copy of ``source`` whose JSON ``member`` went through ``edit(document)``."""
    with zipfile.ZipFile(source) as z:
        members = {name: z.read(name) for name in z.namelist()}
    document = json.loads(members[member])
    edit(document)
    members[member] = json.dumps(document).encode()
    with zipfile.ZipFile(target, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return target


def show(path: Path, capsys, *options: str) -> tuple[int, str, str]:
    code = cli.main(["show", str(path), *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _node(program: dict, name: str) -> dict:
    root = program.get("module") or program["graph_module"]
    return next(n for n in root["graph"]["nodes"] if n["name"] == name)


def _lin(program: dict) -> dict:
    return program["module"]["children"]["lin"]


def test_show_escapes_a_class_name_that_clears_the_screen(traced, tmp_path, capsys):
    def edit(program):
        _lin(program)["class"] = "torch.nn.modules.linear.Linear" + CLEAR_SCREEN

    code, out, _ = show(rewritten(traced, tmp_path / "bad.fxl", edit), capsys)
    assert code == cli.EXIT_OK and not forbidden(out)
    assert "  lin: torch.nn.modules.linear.Linear\\x1b[2J\\x1b[H" in out.splitlines()
    assert "fxloom.load would refuse (1):" in out


def test_show_keeps_a_module_path_holding_a_newline_on_its_own_line(traced, tmp_path, capsys):
    def edit(program):
        program["module"]["children"]["lin" + FORGED] = _lin(program)

    code, out, _ = show(rewritten(traced, tmp_path / "bad.fxl", edit), capsys, "--no-graph")
    assert code == cli.EXIT_OK and not forbidden(out)
    assert "fxloom.load would refuse (0):" not in out.splitlines()
    assert "  lin\\nfxloom.load would refuse (0):: torch.nn.modules.linear.Linear" in out


def test_show_escapes_device_and_dtype_names(traced, tmp_path, capsys):
    def edit(program):
        _lin(program)["parameters"]["weight"].update(device="cpu" + CLIPBOARD)
        _lin(program)["parameters"]["bias"].update(dtype="float" + RIGHT_TO_LEFT)

    code, out, _ = show(rewritten(traced, tmp_path / "bad.fxl", edit), capsys, "--no-graph")
    assert code == cli.EXIT_OK and not forbidden(out)
    assert "cpu\\x1b]52;c;dG91Y2g=\\x07 1" in out
    assert "Parameters: float32 6 (24 B); float\\u202e 2 (0 B)" in out


def test_show_prints_a_refused_target_escaped_in_the_graph_code_and_refusals(
    traced, tmp_path, capsys
):
    def edit(program):
        _node(program, "relu")["target"] = "os.system" + CLEAR_SCREEN

    bad = rewritten(traced, tmp_path / "bad.fxl", edit)
    code, out, _ = show(bad, capsys)
    assert code == cli.EXIT_OK and not forbidden(out)
    assert "call_function[target=os.system\\x1b[2J\\x1b[H]" in out  # the graph
    assert "  function 'os.system\\x1b[2J\\x1b[H' (at node %relu of the root module)" in out
    code, out, _ = show(bad, capsys, "--code")
    assert code == cli.EXIT_OK and not forbidden(out)
    assert "\\x1b[2J" in out


def test_show_prints_a_node_with_a_newline_in_a_dict_key_on_one_line(traced, tmp_path, capsys):
    def edit(program):
        _node(program, "add")["args"].append({"dict": [["k" + FORGED, 1]]})

    code, out, _ = show(rewritten(traced, tmp_path / "bad.fxl", edit), capsys)
    assert code == cli.EXIT_OK and not forbidden(out)
    assert "fxloom.load would refuse (0):" not in [line.strip() for line in out.splitlines()]
    assert "{k\\nfxloom.load would refuse (0):: 1}" in out


def test_show_escapes_a_node_name_it_cannot_decode_in_the_refusal(traced, tmp_path, capsys):
    def edit(program):
        _node(program, "relu")["name"] = "relu" + CLEAR_SCREEN

    code, out, _ = show(rewritten(traced, tmp_path / "bad.fxl", edit), capsys)
    assert code == cli.EXIT_OK and not forbidden(out)
    assert "node name 'relu\\x1b[2J\\x1b[H' is not a valid identifier" in out


def test_show_escapes_the_keys_of_a_program_section(exported, tmp_path, capsys):
    def edit(program):
        program["graph_signature"]["extra" + CLEAR_SCREEN] = "value" + CLIPBOARD

    code, out, _ = show(rewritten(exported, tmp_path / "bad.fxl", edit), capsys, "--no-graph")
    assert code == cli.EXIT_OK and not forbidden(out)
    assert '  extra\\x1b[2J\\x1b[H: "value\\u001b]52;c;dG91Y2g=\\u0007"' in out


def test_show_of_a_header_holding_controls_prints_the_refusal_escaped(traced, tmp_path, capsys):
    def edit(header):
        header["fxloom_version"] = "0.1.0" + CLEAR_SCREEN + FORGED

    bad = rewritten(traced, tmp_path / "bad.fxl", edit, member="fxloom/format.json")
    code, out, err = show(bad, capsys)
    assert code == cli.EXIT_USAGE and out == "" and not forbidden(err)
    assert len(err.splitlines()) == 1
    assert "'0.1.0\\x1b[2J\\x1b[H\\nfxloom.load would refuse (0):'" in err


def test_the_summary_holds_escaped_strings(traced, tmp_path):
    def edit(program):
        _lin(program)["class"] = "torch.nn.modules.linear.Linear" + RIGHT_TO_LEFT

    summary = show_module.summarise(rewritten(traced, tmp_path / "bad.fxl", edit))
    assert summary.modules["lin"] == "torch.nn.modules.linear.Linear\\u202e"
    assert [r.name for r in summary.refusals] == ["torch.nn.modules.linear.Linear\\u202e"]


@pytest.mark.parametrize("options", [[], ["--code"]], ids=["graph", "code"])
@pytest.mark.parametrize("kind", ["traced", "exported"])
def test_escaping_leaves_what_show_prints_of_a_normal_file_as_it_was(
    kind, options, request, monkeypatch, capsys
):
    path = request.getfixturevalue(kind)
    escaped = show(path, capsys, *options)
    monkeypatch.setattr(show_module, "printable", lambda text: text)
    assert show(path, capsys, *options) == escaped


def test_show_in_a_pipe_writes_no_control_characters_of_its_own(traced, tmp_path):
    """rich styles the headings in a terminal only: in a pipe show writes plain text."""

    def edit(program):
        _lin(program)["class"] = "torch.nn.modules.linear.Linear" + CLEAR_SCREEN

    bad = rewritten(traced, tmp_path / "bad.fxl", edit)
    result = subprocess.run(
        [sys.executable, "-m", "fxloom", "show", str(bad), "--code"],
        capture_output=True,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if k != "FORCE_COLOR"},
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        },
        check=True,
    )
    assert not forbidden(result.stdout + result.stderr)
    assert "Linear\\x1b[2J\\x1b[H" in result.stdout
