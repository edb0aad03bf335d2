"""Saved Hugging Face models load and show after ``import transformers``, as users write it.

A traced decoder returns transformers' output classes and its key/value cache
(``DynamicCache``, ``EncoderDecoderCache``). ``import transformers`` is lazy: the modules
that define those classes are not imported by it. The loader finds them through an
enumerated table (``allowlist.LIBRARY_CLASS_MODULES``), never from a name in the file; ``fxloom show`` imports the library the file names, as a
user would, and shows every node. Each check runs in a fresh interpreter: a test process
has imported every submodule long before.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import fxloom  # noqa: E402
from fxloom.zoo.hf_configs import BART_LIKE, GPT2_LIKE, T5_LIKE, hf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


def whisper():
    settings = {k: v for k, v in BART_LIKE.items() if k != "max_position_embeddings"}
    return hf(
        "WhisperModel",
        "WhisperConfig",
        **settings,
        num_mel_bins=16,
        max_source_positions=16,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )()


def ids(length: int) -> torch.Tensor:
    return torch.randint(3, 100, (1, length), generator=torch.Generator().manual_seed(length))


MODELS = {
    "gpt2": (lambda: hf("GPT2Model", "GPT2Config", **GPT2_LIKE)(), lambda: {"input_ids": ids(5)}),
    "t5": (
        lambda: hf("T5Model", "T5Config", **T5_LIKE)(),
        lambda: {"input_ids": ids(6), "decoder_input_ids": ids(3)},
    ),
    "whisper": (
        whisper,
        lambda: {
            "input_features": torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(0)),
            "decoder_input_ids": ids(3),
        },
    ),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, tuple[Path, int]]:
    """Each model traced with its default cache and saved: (path, number of nodes)."""
    files = {}
    for name, (build, inputs) in MODELS.items():
        torch.manual_seed(0)
        model = build().eval()
        gm = fxloom.symbolic_trace(model, example_inputs=inputs())
        path = tmp_path_factory.mktemp(name) / f"{name}.fxl"
        fxloom.save(gm, path)
        torch.save(inputs(), path.with_suffix(".inputs"))
        with torch.no_grad():
            torch.save(model(**inputs()).last_hidden_state, path.with_suffix(".expected"))
        files[name] = (path, len(gm.graph.nodes))
    return files


def test_each_file_loads_after_import_transformers_alone_and_computes_what_eager_did(saved):
    paths = {name: str(path) for name, (path, _) in saved.items()}
    result = run_python(
        f"""
import sys, torch, transformers, fxloom
assert "transformers.cache_utils" not in sys.modules  # lazy: the loader must find it
for name, path in {paths!r}.items():
    gm = fxloom.load(path)
    inputs = torch.load(path[:-4] + ".inputs")
    expected = torch.load(path[:-4] + ".expected")
    with torch.no_grad():
        out = gm(**inputs)
    assert type(out).__module__.startswith("transformers."), type(out)
    torch.testing.assert_close(out.last_hidden_state, expected)
    print(name, "ok")
"""
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["gpt2", "ok", "t5", "ok", "whisper", "ok"]


def test_fxloom_show_lists_every_node_of_each_file(saved):
    for name, (path, nodes) in saved.items():
        result = subprocess.run(
            [sys.executable, "-m", "fxloom", "show", str(path), "--no-graph"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr
        assert f"Nodes: {nodes} (" in result.stdout, name
        assert "would refuse" not in result.stdout, result.stdout


def test_a_name_outside_the_enumerated_modules_is_refused_and_its_module_not_imported(
    saved, tmp_path
):
    path, _ = saved["gpt2"]
    hostile = tmp_path / "hostile.fxl"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(hostile, "w") as target:
        for member in source.namelist():
            data = source.read(member)
            if member == "fxloom/program.json":
                text = data.decode().replace(
                    "transformers.cache_utils.DynamicCache", "transformers.trainer.Trainer"
                )
                data = json.dumps(json.loads(text)).encode()
            target.writestr(member, data)
    result = run_python(
        f"""
import sys, transformers, fxloom
try:
    fxloom.load({str(hostile)!r})
except fxloom.serialize.SerializationError as error:
    print("refused:", "transformers.trainer.Trainer" in str(error))
print("imported:", "transformers.trainer" in sys.modules)
"""
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["refused:", "True", "imported:", "False"]
