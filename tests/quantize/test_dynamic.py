"""Dynamic quantization (int8 weights, activations quantized per batch): a Hugging Face BERT
from a tiny config, an LSTM model, side by side with torch.ao's ``quantize_dynamic``.

Bounds on held-out inputs (another batch size and length than the example):

    model                  relative error   cosine similarity
    BERT (hidden 128)      < 0.02           > 0.9995
    LSTM + Linear          < 0.03           > 0.999
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from quantize_helpers import cosine, relative_error
from torch import nn
from torch.ao.quantization import quantize_dynamic

import fxloom
from fxloom.quantize import QuantConfig, convert, prepare, report
from fxloom.zoo.hf_configs import BERT_LIKE, VOCAB, hf

DYNAMIC = QuantConfig(mode="dynamic")


@pytest.fixture(scope="module")
def bert():
    """A BERT with hidden size 128 (big enough for int8 to matter), traced on an example."""
    pytest.importorskip("transformers")
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.zoo.methods import fixed_args

    settings = dict(BERT_LIKE, hidden_size=128, intermediate_size=512, num_attention_heads=4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = hf("BertModel", "BertConfig", **settings)().eval()
    example = tokens(2, 16, seed=0)
    traced = fxloom.symbolic_trace(model, fixed_args(model, example), example_inputs=example)
    return model, example, traced


def tokens(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def last_hidden_state(output) -> torch.Tensor:
    return output[0]


def test_bert_dynamic_int8_is_close_to_fp32_on_held_out_inputs(bert) -> None:
    model, example, traced = bert
    int8 = convert(prepare(traced, example, DYNAMIC))  # no calibration in dynamic mode
    held_out = tokens(4, 24, seed=100)
    with torch.no_grad():
        ref = last_hidden_state(model(**held_out, return_dict=False))
        out = last_hidden_state(int8(**held_out))
    assert relative_error(out, ref) < 0.02
    assert cosine(out, ref) > 0.9995


def test_bert_every_linear_layer_is_dynamic_int8(bert) -> None:
    _, example, traced = bert
    rows = report(convert(prepare(traced, example, DYNAMIC))).rows
    assert len(rows) == 13  # 6 per layer, 2 layers, and the pooler
    assert {row.kind for row in rows} == {"dynamic"}


def test_bert_error_is_no_worse_than_torch_ao_quantize_dynamic(bert) -> None:
    model, example, traced = bert
    int8 = convert(prepare(traced, example, DYNAMIC))
    theirs = quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    held_out = tokens(4, 24, seed=101)
    with torch.no_grad():
        ref = last_hidden_state(model(**held_out, return_dict=False))
        ours_error = relative_error(last_hidden_state(int8(**held_out)), ref)
        theirs_error = relative_error(last_hidden_state(theirs(**held_out, return_dict=False)), ref)
    assert ours_error <= 1.1 * theirs_error


def test_bert_attention_left_in_float_by_module_path(bert) -> None:
    _, example, traced = bert
    config = DYNAMIC.set_module_path("encoder.layer.0.attention", None)
    rows = {row.node: row for row in report(convert(prepare(traced, example, config))).rows}
    assert rows["encoder_layer_0_attention_self_query"].kind == "float"
    assert rows["encoder_layer_0_intermediate_dense"].kind == "dynamic"


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


def test_lstm_and_linear_become_dynamic_int8_modules() -> None:
    torch.manual_seed(0)
    model = Tagger().eval()
    ao = QuantConfig(mode="dynamic", kernels="torch.ao")  # torch's dynamic LSTM (no plain one)
    int8 = convert(prepare(model, (torch.randn(2, 7, 16),), ao))
    kinds = {name: type(m).__name__ for name, m in int8.named_children()}
    assert kinds == {"lstm": "LSTM", "head": "Linear"}
    assert type(int8.lstm) is not nn.LSTM and type(int8.head) is not nn.Linear
    x = torch.randn(3, 11, 16)
    with torch.no_grad():
        assert relative_error(int8(x), model(x)) < 0.03
        assert cosine(int8(x), model(x)) > 0.999
