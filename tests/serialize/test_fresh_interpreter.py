"""Every kind of file fxloom writes loads in a fresh interpreter that has imported only ``fxloom``.

A test process has imported everything by the time it loads a file, so a loader that
works only because some module was imported earlier (and changed a table as it was)
passes there and fails for users. Here each kind of file is saved — a traced module, an
exported program, one with ``fxloom.cond``, one with dynamic shapes, an int8-quantized
module, a module lowered to ONNX Runtime — with its inputs and the outputs it gave, and
one fresh ``python`` loads them all and compares (one process: an interpreter start
with torch costs seconds).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import fxloom
from fxloom.export import Dim, export

ROOT = Path(__file__).resolve().parents[2]


class Gate(nn.Module):
    """A layer whose branch depends on its input's values: a cond node when captured."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fxloom.cond(x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: x.sin(), (x,))


class Flagged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, scale: bool = True) -> torch.Tensor:
        y = self.lin(x)
        return y * 2 if scale else y


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()


def traced(x: torch.Tensor) -> tuple[fxloom.GraphModule, tuple]:
    # concrete_args and example inputs: the file holds the guards both record.
    torch.manual_seed(0)
    gm = fxloom.symbolic_trace(Flagged(), {"scale": True}, example_inputs={"x": x})
    return gm, (x,)


def exported(x: torch.Tensor) -> tuple:
    return export(_mlp(), (x,)), (x,)


def exported_with_cond(x: torch.Tensor) -> tuple:
    torch.manual_seed(0)
    return export(Gate(), (x,)), (x,)


def exported_with_dynamic_shapes(x: torch.Tensor) -> tuple:
    ep = export(_mlp(), (x,), dynamic_shapes={"input": {0: Dim("batch", min=1, max=64)}})
    return ep, (torch.randn(7, 4),)  # another batch size than the example's


def quantized(x: torch.Tensor) -> tuple:
    from fxloom.quantize import QuantConfig, calibrate, convert, prepare

    prepared = prepare(_mlp(), (x,), QuantConfig())
    calibrate(prepared, [(x,), (x * 2,)], progress=False)
    return convert(prepared), (x,)


def lowered(x: torch.Tensor) -> tuple:
    pytest.importorskip("onnxruntime")
    from fxloom.lower import lower

    return lower(_mlp(), (x,)), (x,)


KINDS = {
    "exported_with_cond": exported_with_cond,  # first: loaded before any other file
    "traced": traced,
    "exported": exported,
    "exported_with_dynamic_shapes": exported_with_dynamic_shapes,
    "quantized": quantized,
    "lowered": lowered,
}

# Run by a fresh interpreter: import fxloom only, then load every file and compare.
LOADER = """
import sys
import fxloom
import torch

directory = sys.argv[1]
cases = torch.load(f"{directory}/cases.pt", weights_only=True)
# The export capture is not imported: loading must not need it (a verifier or allowlist
# that knew cond_op only once fxloom.export.cond_capture was imported would refuse it).
print("capture imported before loading:", "fxloom.export.cond_capture" in sys.modules)
for kind, case in cases.items():
    path = f"{directory}/{kind}.fxl"
    if kind.startswith("exported"):
        module = fxloom.export.load(path).module()
    else:
        module = fxloom.load(path)
    outputs = module(*case["inputs"])
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    for got, expected in zip(outputs, case["expected"], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    print("loaded", kind)
"""


def _save(kind: str, captured: object, path: Path) -> None:
    if kind.startswith("exported"):
        fxloom.export.save(captured, path)
    else:
        fxloom.save(captured, path)


def _run(captured: object, inputs: tuple) -> list[torch.Tensor]:
    module = captured.module() if hasattr(captured, "graph_signature") else captured
    outputs = module(*inputs)
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


@pytest.mark.slow
def test_every_kind_of_file_loads_in_a_fresh_interpreter(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 4)
    cases = {}
    for kind, make in KINDS.items():
        captured, inputs = make(x)
        _save(kind, captured, tmp_path / f"{kind}.fxl")
        cases[kind] = {"inputs": inputs, "expected": _run(captured, inputs)}
    torch.save(cases, tmp_path / "cases.pt")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", LOADER, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "capture imported before loading: False" in result.stdout
    assert [line.split()[1] for line in result.stdout.splitlines()[1:]] == list(KINDS)
