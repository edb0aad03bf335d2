"""docs/lower.md's Python blocks run as written, in order (later blocks reuse earlier names)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "lower.md"


def test_the_decoder_recipe_runs_as_written(capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    namespace: dict = {"__name__": "docs_lower"}
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, str(PAGE), "exec", dont_inherit=True), namespace)
    out = capsys.readouterr().out
    assert "LlamaForCausalLM: 2 of" in out and "past_key_values.0.key" in out
