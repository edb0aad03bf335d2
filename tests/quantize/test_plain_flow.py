"""The default flow on plain tensors, and schemes as records.

- ``convert`` (default ``kernels="plain"``) calls fxloom's operators on plain integer
  tensors: no quantized tensor, no torch.ao module, in the graph or in the file it saves;
  its error is within that of torch.ao's modules (``kernels="torch.ao"``) on the zoo;
- static, dynamic (per tensor, or per token), w8 and w4 (group 32/64/128) are records of
  ``quantize.schemes``; a scheme written in this file quantizes end to end;
- the whole flow, save and load run in a fresh interpreter with ``torch.ao.quantization``
  blocked from import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from quantize_helpers import batches, relative_error
from torch import nn

import fxloom
from fxloom import zoo
from fxloom.quantize import QuantConfig, calibrate, convert, ops, prepare, report
from fxloom.quantize.schemes import SCHEMES, Kind, QuantScheme
from fxloom.zoo.deeprec import ratings
from tests.quantize.without_torch_ao import run_without_torch_ao

ROOT = Path(__file__).resolve().parents[2]
DATA = {
    "deeprec_tiny": lambda seed: ratings(16, 256, seed),
    "resnet_tiny": lambda seed: torch.randn(
        4, 3, 32, 32, generator=torch.Generator().manual_seed(seed)
    ),
}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)).eval()


def _rows(seed: int) -> torch.Tensor:
    return torch.randn(8, 64, generator=torch.Generator().manual_seed(seed))


def _converted(model: nn.Module, config: QuantConfig) -> fxloom.GraphModule:
    prepared = prepare(model, (_rows(0),), config)
    calibrate(prepared, batches(_rows, 4), progress=False)
    return convert(prepared)


def _quantized_dtypes(gm: nn.Module) -> set[torch.dtype]:
    quantized = {torch.quint8, torch.qint8, torch.qint32, torch.quint4x2}
    return {t.dtype for t in gm.state_dict().values() if t.dtype in quantized}


def test_static_convert_calls_fxloom_operators_on_plain_integer_tensors() -> None:
    int8 = _converted(_mlp(), QuantConfig())
    targets = [node.target for node in int8.graph.nodes if node.op == "call_function"]
    assert targets.count(ops.linear_int8) == 2 and ops.quantize in targets
    assert not any(node.op == "call_module" for node in int8.graph.nodes)
    assert not _quantized_dtypes(int8)
    assert {int8.get_buffer("weight_0").dtype, int8.get_buffer("scale_0").dtype} == {
        torch.int8,
        torch.float32,
    }


@pytest.mark.parametrize("name", ["deeprec_tiny", "resnet_tiny"])
def test_plain_error_is_within_1_2x_torch_ao_s_on_the_zoo(name: str) -> None:
    model, inputs = zoo.build(name)
    make = DATA[name]
    data, held_out = batches(make, 8), make(100)
    errors = {}
    for kernels in ("plain", "torch.ao"):
        prepared = prepare(model, inputs, QuantConfig(kernels=kernels))
        calibrate(prepared, data, progress=False)
        with torch.no_grad():
            errors[kernels] = relative_error(convert(prepared)(held_out), model(held_out))
    assert errors["plain"] <= 1.2 * errors["torch.ao"]


@pytest.mark.parametrize(
    "scheme, target", [("dynamic", "linear_int8"), ("w8", "linear_w8"), ("w4_g32", "linear_w4")]
)
def test_layer_schemes_swap_linears_for_their_operator(scheme: str, target: str) -> None:
    model = _mlp()
    int8 = _converted(model, QuantConfig(scheme=scheme))
    targets = [node.target for node in int8.graph.nodes if node.op == "call_function"]
    assert targets.count(getattr(ops, target)) == 2
    x = _rows(100)
    with torch.no_grad():
        assert relative_error(int8(x), model(x)) < (0.1 if scheme.startswith("w4") else 0.02)


def test_int4_weights_are_packed_two_a_byte() -> None:
    int4 = _converted(_mlp(), QuantConfig(scheme="w4_g64"))
    assert int4.get_buffer("weight_0").shape == (128, 32)
    assert int4.get_buffer("weight_0").dtype == torch.uint8
    assert int4.get_buffer("scale_0").shape == (128, 1)


def test_a_layer_whose_inputs_do_not_fill_whole_groups_stays_float_and_says_why() -> None:
    model = nn.Sequential(nn.Linear(48, 8)).eval()
    prepared = prepare(model, (torch.randn(2, 48),), QuantConfig(scheme="w4_g32"))
    (row,) = report(prepared).rows
    assert row.kind == Kind.FLOAT and "not a multiple of the group size 32" in row.reason


def test_schemes_are_records_that_say_what_they_quantize() -> None:
    assert SCHEMES["static"].calibrates and not SCHEMES["dynamic"].calibrates
    assert SCHEMES["dynamic"].activations == "per_tensor"
    assert SCHEMES["dynamic_per_token"].activations == "per_token"
    assert SCHEMES["qat"].trains and SCHEMES["qat"].calibrates
    assert [SCHEMES[f"w4_g{g}"].group_size for g in (32, 64, 128)] == [32, 64, 128]
    assert QuantConfig(scheme="w8").mode == "weight_only"
    assert QuantConfig(mode="dynamic").scheme is SCHEMES["dynamic"]


def test_a_scheme_written_here_quantizes_end_to_end() -> None:
    mine = QuantScheme(
        "mine", "weight_only", "layers", Kind.WEIGHT_ONLY, weight_bits=4, group_size=16,
        layers=(nn.Linear,), why="my int4 weights",
    )  # fmt: skip
    model = _mlp()
    int4 = _converted(model, QuantConfig(scheme=mine))
    text = str(report(int4))
    assert text.startswith("mine int4 (group 16)") and "my int4 weights" in text
    x = _rows(100)
    with torch.no_grad():
        assert relative_error(int4(x), model(x)) < 0.1


def test_the_report_names_the_scheme_and_the_fxloom_operator() -> None:
    text = str(report(_converted(_mlp(), QuantConfig())))
    assert text.startswith("static int8") and "fxloom_q.linear_int8" in text


def test_a_saved_plain_model_holds_no_quantized_dtype_and_loads(tmp_path: Path) -> None:
    int8 = _converted(_mlp(), QuantConfig())
    fxloom.save(int8, tmp_path / "int8.fxl")
    loaded = fxloom.load(tmp_path / "int8.fxl")
    assert not _quantized_dtypes(loaded)
    x = _rows(100)
    with torch.no_grad():
        assert torch.equal(loaded(x), int8(x))


BLOCKED_FLOW = r"""
import fxloom
from fxloom.quantize import QuantConfig, calibrate, convert, prepare

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
x = torch.randn(8, 16)
for scheme in ("static", "dynamic", "w8", "w4_g32"):
    prepared = prepare(model, (x,), QuantConfig(scheme=scheme))
    calibrate(prepared, [torch.randn(8, 16) for _ in range(4)], progress=False)
    int8 = convert(prepared)
    fxloom.save(int8, sys.argv[1])
    loaded = fxloom.load(sys.argv[1])
    assert torch.equal(loaded(x), int8(x))
    error = float((int8(x) - model(x)).norm() / model(x).norm())
    assert error < 0.1, (scheme, error)
    print(scheme, "ok")
"""


def test_the_flow_runs_saves_and_loads_with_torch_ao_quantization_blocked(tmp_path: Path) -> None:
    run_without_torch_ao(BLOCKED_FLOW, str(tmp_path / "m.fxl"))


@pytest.mark.parametrize("scheme", ["static", "dynamic", "w8", "w4_g32"])
def test_a_converted_model_exports_with_a_dynamic_batch_through_the_meta_kernels(
    scheme: str,
) -> None:
    from fxloom.export import Dim, export

    int8 = _converted(_mlp(), QuantConfig(scheme=scheme))
    batch = Dim("batch", min=2, max=64)
    program = export(int8, (_rows(0),), dynamic_shapes=({0: batch},))
    namespaces = {
        str(node.target).split(".")[0]
        for node in program.graph_module.graph.nodes
        if node.op == "call_function" and hasattr(node.target, "_schema")
    }
    assert "fxloom_q" in namespaces
    x = torch.randn(13, 64)
    with torch.no_grad():
        assert torch.equal(program.module()(x), int8(x))


LOAD_EXPORTED = r"""
import sys
import torch
import fxloom.export

program = fxloom.export.load(sys.argv[1])
x, expected = torch.load(sys.argv[2])
assert torch.equal(program.module()(x), expected)
print("loaded")
"""


def test_an_exported_int8_program_loads_in_a_fresh_interpreter(tmp_path: Path) -> None:
    from fxloom.export import export

    int8 = _converted(_mlp(), QuantConfig())
    fxloom.export.save(export(int8, (_rows(0),)), tmp_path / "int8.fxl")
    x = _rows(100)
    torch.save((x, int8(x)), tmp_path / "io.pt")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-c",
        LOAD_EXPORTED,
        str(tmp_path / "int8.fxl"),
        str(tmp_path / "io.pt"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]


def test_a_shared_row_not_known_to_compute_on_plain_integers_runs_in_float() -> None:
    from fxloom.quantize.table import SHARES_QPARAMS

    model = nn.Sequential(nn.Linear(8, 8), nn.Hardtanh(), nn.Linear(8, 4)).eval()
    SHARES_QPARAMS.add(nn.Hardtanh)  # right on torch.ao's quantized tensors, not on codes
    try:
        prepared = prepare(model, (torch.randn(4, 8),))
    finally:
        SHARES_QPARAMS.discard(nn.Hardtanh)
    row = {row.node: row for row in report(prepared).rows}["_1"]
    assert row.kind == Kind.FLOAT and "not in table.PLAIN_SHARES" in row.reason


def test_a_user_row_without_a_plain_operator_runs_in_float_and_says_why() -> None:
    import dataclasses

    from fxloom.quantize.table import STATIC_OPS

    model = nn.Sequential(nn.Linear(8, 4)).eval()
    row = STATIC_OPS[nn.Linear]
    STATIC_OPS[nn.Linear] = dataclasses.replace(row, plain="")  # a torch.ao-only row
    try:
        (decision,) = report(prepare(model, (torch.randn(4, 8),))).rows
    finally:
        STATIC_OPS[nn.Linear] = row
    assert decision.kind == Kind.FLOAT and "names no fxloom operator" in decision.reason


def test_a_convolution_padding_by_reflection_stays_float_and_says_why() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")).eval()
    (row,) = report(prepare(model, (torch.randn(1, 3, 8, 8),))).rows
    assert row.kind == Kind.FLOAT and "pads other than with zeros" in row.reason
