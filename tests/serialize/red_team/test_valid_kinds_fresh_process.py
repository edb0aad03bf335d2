"""Every kind of valid file loads and runs in a FRESH interpreter, with the saving process's outputs.

Files are saved here (traced zoo and Hugging Face models, exported programs plain, with
``fxloom.cond`` and with dynamic shapes, a quantized model, a model lowered to ONNX Runtime);
one child process then loads each with ``fxloom.load``/``fxloom.export.load`` (and nothing
else imported first: no capture, quantize or lower module of its own) and compares the
outputs with the ones saved here (passed with ``torch.save``: that is the test's own file).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from red_team_files import Cond
from red_team_harness import REPO, _child_env
from torch import nn

import fxloom
import fxloom.export


def _traced_zoo():
    from fxloom import zoo

    model, inputs = zoo.build("resnet_tiny")
    return fxloom.symbolic_trace(model.eval()), inputs


def _traced_bert():
    sys.path.insert(0, str(REPO))
    from benchmarks.zoo.methods import fixed_args
    from fxloom.zoo.hf_configs import BERT_LIKE, hf

    torch.manual_seed(0)
    model = hf("BertModel", "BertConfig", **BERT_LIKE)().eval()
    example = {
        "input_ids": torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    }
    gm = fxloom.symbolic_trace(model, fixed_args(model, example), example_inputs=example)
    return gm, (example["input_ids"],)


class _Small(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x).relu()


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def _exported():
    return fxloom.export.export(_Small(), (_x(4, 3),)), (_x(4, 3),)


def _exported_cond():
    return fxloom.export.export(Cond(), (_x(4, 3),)), (_x(4, 3),)


def _exported_dynamic():
    from fxloom.export import Dim

    ep = fxloom.export.export(_Small(), (_x(4, 3),), dynamic_shapes={"x": {0: Dim("batch")}})
    return ep, (_x(7, 3),)  # another batch size than the example


def _quantized():
    from fxloom.quantize import convert, prepare

    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    prepared = prepare(model, (_x(4, 3),))
    for _ in range(4):
        prepared(_x(4, 3))
    return convert(prepared), (_x(4, 3),)


def _lowered():
    from fxloom.lower import lower

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    return lower(model, (_x(4, 3),)), (_x(4, 3),)


KINDS = {
    "traced-zoo-resnet_tiny": _traced_zoo,
    "traced-hf-bert-tiny": _traced_bert,
    "exported": _exported,
    "exported-cond": _exported_cond,
    "exported-dynamic": _exported_dynamic,
    "quantized": _quantized,
    "lowered-onnxruntime": _lowered,
}

CHILD = textwrap.dedent(
    """
    import json, sys, torch, fxloom, fxloom.export
    manifest = json.load(open(sys.argv[1]))
    for kind, entry in manifest.items():
        try:
            for name in entry["imports"]:
                __import__(name)
            if entry["exported"]:
                module = fxloom.export.load(entry["file"]).module()
            else:
                module = fxloom.load(entry["file"])
            saved = torch.load(entry["io"])  # the test's own tensors, not the file under test
            with torch.no_grad():
                got = module(*saved["inputs"])
            flat_got = [t for t in fxloom.pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
            flat_want = saved["output"]
            same = len(flat_got) == len(flat_want) and all(
                torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(flat_got, flat_want)
            )
            print(json.dumps({kind: "same" if same else "different outputs"}), flush=True)
        except Exception as e:
            print(json.dumps({kind: f"{type(e).__name__}: {str(e)[:400]}"}), flush=True)
    """
)


@pytest.fixture(scope="module")
def fresh_results(tmp_path_factory) -> dict[str, str]:
    workdir = tmp_path_factory.mktemp("valid-kinds")
    manifest, results = {}, {}
    for kind, make in KINDS.items():
        try:
            program, inputs = make()
            exported = isinstance(program, fxloom.export.ExportedProgram)
            module = program.module() if exported else program
            with torch.no_grad():
                output = module(*inputs)
            buffer = io.BytesIO()
            (fxloom.export.save if exported else fxloom.save)(program, buffer)
        except Exception as e:
            results[kind] = f"could not build or save it here: {type(e).__name__}: {str(e)[:400]}"
            continue
        (workdir / f"{kind}.fxl").write_bytes(buffer.getvalue())
        leaves = [t for t in fxloom.pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
        torch.save({"inputs": list(inputs), "output": leaves}, workdir / f"{kind}.pt")
        # Container classes (a Hugging Face ModelOutput) are found only among modules already
        # imported, as docs/serialization.md says: the user of such a file imports its library.
        imports = ["transformers.modeling_outputs"] if "hf" in kind else []
        manifest[kind] = {
            "file": f"{kind}.fxl",
            "io": f"{kind}.pt",
            "exported": exported,
            "imports": imports,
        }
    (workdir / "manifest.json").write_text(json.dumps(manifest))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "manifest.json"],
        cwd=workdir,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            results.update(json.loads(line))
    for kind in manifest:
        results.setdefault(
            kind, f"the child gave no answer (rc {proc.returncode}): {proc.stderr[-800:]}"
        )
    return results


@pytest.mark.parametrize("kind", list(KINDS))
def test_valid_file_loads_and_runs_in_a_fresh_interpreter(kind, fresh_results):
    """Saved here, loaded in a new process: the same outputs."""
    assert fresh_results[kind] == "same", f"{kind}: {fresh_results[kind]}"


# ------------------------------------------------- the red-team harness's controls
from red_team_files import Small, exported, saved  # noqa: E402
from red_team_harness import Case, family  # noqa: E402

CONTROLS = family(
    "controls",
    [
        Case("control-traced", "the unmodified traced file", lambda: saved()),
        Case(
            "control-exported",
            "the unmodified exported file",
            lambda: exported(Small(), (torch.randn(4, 3),)),
            kind="exported",
        ),
        Case(
            "control-text",
            "plain graph text",
            lambda: (
                "graph():\n    %x : [num_users=1] = placeholder[target=x]\n"
                "    %r : [num_users=1] = call_function[target=torch.relu](args = (%x,), kwargs = {})\n"
                "    return r"
            ),
            kind="text",
        ),
    ],
)


@pytest.mark.parametrize("control", CONTROLS, ids=[c.id for c in CONTROLS])
def test_the_red_team_harness_loads_and_runs_a_valid_file_recording_nothing(control, verdicts):
    """The recorders and limits do not stop a valid file: a refusal elsewhere is the loader's."""
    verdict = verdicts[control.id]
    assert verdict.get("outcome") == "loaded_and_ran", verdict
    assert verdict["recorded"] == [] and verdict["files_changed"] == [], verdict
