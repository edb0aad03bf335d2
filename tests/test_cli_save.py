"""`fxloom save MODEL -o FILE` and `fxloom show FILE`, run in-process as `cli.main([...])`.

`show` describes a file from its JSON alone: it must never build a module or run anything, and
a file it refuses gives the loader's message and exit code 2, without a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import fxloom
from fxloom import cli, zoo
from fxloom.serialize import FORMAT_VERSION


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """resnet_tiny written by `fxloom save`, shared by the tests that read it."""
    path = tmp_path_factory.mktemp("save") / "resnet_tiny.fxl"
    assert cli.main(["save", "resnet_tiny", "-o", str(path)]) == cli.EXIT_OK
    return path


def rewritten(source: Path, target: Path, edit) -> Path:
    """A copy of ``source`` whose program.json went through ``edit(program)``."""
    with zipfile.ZipFile(source) as z:
        members = {name: z.read(name) for name in z.namelist()}
    program = json.loads(members["fxloom/program.json"])
    edit(program)
    members["fxloom/program.json"] = json.dumps(program).encode()
    with zipfile.ZipFile(target, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return target


def test_save_writes_a_file_that_loads_and_matches_the_model(saved) -> None:
    model, inputs = zoo.build("resnet_tiny")
    loaded = fxloom.load(saved)
    with torch.no_grad():
        assert torch.equal(loaded(*inputs), model.eval()(*inputs))


def test_save_says_what_it_wrote(tmp_path, capsys) -> None:
    path = tmp_path / "mlp.fxl"
    assert cli.main(["save", "mlp_tiny", "-o", str(path)]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "saved mlp_tiny (traced GraphModule" in out and str(path) in out


def test_save_dynamic_batch_without_export_is_a_usage_error(tmp_path, capsys) -> None:
    path = tmp_path / "m.fxl"
    assert cli.main(["save", "mlp_tiny", "-o", str(path), "--dynamic-batch"]) == cli.EXIT_USAGE
    assert "--dynamic-batch applies to --export" in capsys.readouterr().err
    assert not path.exists()


def test_save_export_writes_an_exported_program_or_says_it_cannot(tmp_path, capsys) -> None:
    import fxloom.export

    path = tmp_path / "mlp.pt2"
    code = cli.main(["save", "mlp_tiny", "--export", "-o", str(path)])
    if hasattr(fxloom.export, "save"):
        assert code == cli.EXIT_OK and path.exists()
    else:
        assert code == cli.EXIT_FAILURE
        assert "needs fxloom.export.save" in capsys.readouterr().err


def test_show_prints_the_header_the_graph_and_the_summary(saved, capsys) -> None:
    assert cli.main(["show", str(saved)]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert f"format version {FORMAT_VERSION}, kind graph_module" in out
    assert f"torch {torch.__version__}" in out
    assert "%conv1 : [num_users=1] = call_module[target=conv1](args = (%x,), kwargs = {})" in out
    assert "layers.0.conv1: torch.nn.modules.conv.Conv2d" in out
    assert "Parameters: float32 19,954" in out
    assert "Nodes: 35 (28 call_module" in out
    assert "Conv2d x9" in out


def test_show_code_prints_the_generated_forward(saved, capsys) -> None:
    assert cli.main(["show", str(saved), "--code"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "def forward(self, x" in out
    assert "conv1 = self.conv1(x)" in out
    assert "placeholder[target=x]" not in out


def test_show_no_graph_prints_the_summary_only(saved, capsys) -> None:
    assert cli.main(["show", str(saved), "--no-graph"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "graph():" not in out and "Nodes: 35" in out


def test_show_builds_no_module(saved, capsys, monkeypatch) -> None:
    from fxloom.serialize import modules

    def refuse(*args, **kwargs):
        raise AssertionError("fxloom show built a module")

    monkeypatch.setattr(modules, "decode_module", refuse)
    assert cli.main(["show", str(saved)]) == cli.EXIT_OK


def test_show_lists_a_function_off_the_allowlist_without_running_it(
    saved, tmp_path, capsys, monkeypatch
) -> None:
    import os

    def call_os_system(program: dict) -> None:
        for node in program["module"]["graph"]["nodes"]:
            if node["target"] == "operator.add":
                node["target"] = "os.system"

    ran = []
    monkeypatch.setattr(os, "system", lambda *args: ran.append(args))
    bad = rewritten(saved, tmp_path / "bad.fxl", call_os_system)
    assert cli.main(["show", str(bad)]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert "fxloom.load would refuse (1):" in captured.out
    assert "function 'os.system' (at node %add of the root module" in captured.out
    assert "register_serializable" in captured.out
    assert "call_function[target=os.system]" in captured.out  # the graph, by name
    assert ran == [] and captured.err == ""


def test_show_refuses_a_file_that_is_not_an_fxloom_file(tmp_path, capsys) -> None:
    path = tmp_path / "model.pt"
    torch.save({"weight": torch.ones(2)}, path)  # a pickle: never read as one
    assert cli.main(["show", str(path)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "fxloom show: error:" in err and "not an fxloom file" in err


def test_show_of_a_missing_file_says_so(tmp_path, capsys) -> None:
    assert cli.main(["show", str(tmp_path / "nothing.fxl")]) == cli.EXIT_USAGE
    assert "no file" in capsys.readouterr().err


def test_show_prints_the_signature_and_range_constraints_it_finds(saved, tmp_path, capsys) -> None:
    def add_sections(program: dict) -> None:
        program["graph_signature"] = {"input_specs": [{"kind": "USER_INPUT", "name": "x"}]}
        program["range_constraints"] = {"s0": [2, 64]}

    path = rewritten(saved, tmp_path / "with_signature.fxl", add_sections)
    assert cli.main(["show", str(path), "--no-graph"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert 'Graph signature:\n  input_specs:\n    {"kind": "USER_INPUT", "name": "x"}' in out
    assert "Range constraints:\n  s0: [2, 64]" in out


def test_show_prints_an_exported_programs_signature_and_ranges_as_export_does(tmp_path, capsys):
    path = tmp_path / "exported.fxl"
    assert cli.main(["save", "mlp_tiny", "--export", "--dynamic-batch", "-o", str(path)]) == 0
    capsys.readouterr()
    assert cli.main(["show", str(path), "--no-graph"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "kind exported_program" in out
    assert (
        "Graph signature:\n  # inputs\n  p_layers_0_weight: PARAMETER target='layers.0.weight'"
        in out
    )
    assert "  x: USER_INPUT\n  # outputs\n" in out
    assert "Range constraints:\n  s0: [0, inf]" in out
    assert '{"kind"' not in out


def test_loading_an_exported_file_as_a_graph_module_names_both_kinds(tmp_path, capsys):
    path = tmp_path / "exported.fxl"
    assert cli.main(["save", "mlp_tiny", "--export", "-o", str(path)]) == 0
    with pytest.raises(fxloom.serialize.SerializationError) as info:
        fxloom.load(path)
    assert "holds an ExportedProgram (fxloom.export.save), not a GraphModule" in str(info.value)


def test_the_demo_step_saves_loads_and_compares_a_traced_model() -> None:
    import io

    from rich.console import Console

    from fxloom.cli import demo, demo_save

    model, inputs = zoo.build(demo_save.SAVE_MODEL)
    state = demo.DemoState(console=Console(file=io.StringIO(), width=120))
    state.traced[demo_save.SAVE_MODEL] = demo.TracedModel(
        model, inputs, fxloom.symbolic_trace(model)
    )
    demo_save.save_and_load(state)
    out = state.console.file.getvalue()
    assert state.save_match
    assert "fxloom.save / fxloom.load" in out and "torch.load(weights_only=False)" in out
    assert "same graph and outputs as the traced one: True" in out


def test_show_lists_a_module_class_off_the_allowlist(saved, tmp_path, capsys) -> None:
    def subprocess_module(program: dict) -> None:
        program["module"]["children"]["fc"]["class"] = "subprocess.Popen"

    bad = rewritten(saved, tmp_path / "bad_class.fxl", subprocess_module)
    assert cli.main(["show", str(bad)]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "fc: subprocess.Popen" in out
    assert "module class 'subprocess.Popen' (at module fc)" in out
    assert "is not on fxloom's allowlist" in out


def test_show_lists_a_graph_it_cannot_decode_and_shows_the_rest(saved, tmp_path, capsys) -> None:
    def bad_opcode(program: dict) -> None:
        program["module"]["graph"]["nodes"][1]["op"] = "exec"

    bad = rewritten(saved, tmp_path / "bad_graph.fxl", bad_opcode)
    assert cli.main(["show", str(bad), "--no-graph"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "(the whole graph)' (at graph of the root module): " in out
    assert "unknown opcode" in out and "Parameters: float32" in out


def test_show_leaves_the_allowlist_as_it_was(saved, tmp_path, capsys) -> None:
    from fxloom.serialize import allowlist

    def call_os_system(program: dict) -> None:
        program["module"]["graph"]["nodes"][1]["target"] = "os.system"

    before = allowlist.registered()
    cli.main(["show", str(rewritten(saved, tmp_path / "bad.fxl", call_os_system))])
    assert allowlist.registered() == before
    assert allowlist.find_callable("os.system") is allowlist.MISSING


def test_show_says_where_tensors_were_saved(saved, capsys) -> None:
    assert cli.main(["show", str(saved), "--no-graph"]) == cli.EXIT_OK
    assert "Tensors saved on: cpu " in capsys.readouterr().out


HF_FACTORY = """
import torch
from fxloom.zoo.hf_configs import BERT_LIKE, hf


def bert():
    model = hf("BertModel", "BertConfig", **BERT_LIKE)().eval()
    ids = torch.randint(0, 100, (2, 8))
    return model, {"input_ids": ids, "attention_mask": torch.ones(2, 8, dtype=torch.long)}
"""


def test_show_describes_a_file_saved_from_a_hugging_face_factory(
    tmp_path, capsys, monkeypatch
) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "tiny_hf_factory.py").write_text(HF_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "bert.fxl"
    assert cli.main(["save", "tiny_hf_factory:bert", "-o", str(path)]) == cli.EXIT_OK
    capsys.readouterr()
    assert cli.main(["show", str(path)]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "kind graph_module" in out and "Parameters: float32" in out
    assert "target=transformers.modeling_outputs.BaseModelOutputWithPooling" in out
    # A fresh process has not imported transformers: show imports the library the file names,
    # as a user of fxloom.load would, and finds the ModelOutput class through the loader's
    # enumerated table, so nothing is refused.
    fresh = subprocess.run(
        [sys.executable, "-m", "fxloom", "show", str(path), "--no-graph"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(fxloom.__file__).parents[1])},
    )
    assert fresh.returncode == cli.EXIT_OK, fresh.stderr
    assert "would refuse" not in fresh.stdout
    assert "Nodes: 0 " not in fresh.stdout and "Nodes: " in fresh.stdout
