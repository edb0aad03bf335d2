"""A residual block's add fused into the convolution before it (``table.FUSED_SUMS``).

- convert (plain kernels) fuses ``conv2d_int8 -> add_int8`` (the add's ReLU with it) into
  ``conv2d_add_int8`` where the add is the convolution's only user and both operands have the
  add's shape; the report says so on both nodes, naming the fused kernel;
- the fused model computes the float model within what int8 loses, closer than the unfused
  graph (the sum rounded once: the convolution's output is never clipped to its own range);
- a convolution read by another node, or ReLU'd before the add, is not fused;
- a fused model saves and loads (the safe loader admits ``conv2d_add_int8``) computing the
  same.
"""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import fxloom
from fxloom.quantize import calibrate, convert, ops, prepare, report, table

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Block(nn.Module):
    """A ResNet basic block: conv, ReLU, conv, add the input, ReLU."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + x)


class SharedConv(Block):
    """conv2's output is read by the add and by the output: not fusable."""

    def forward(self, x):
        y = self.conv2(torch.relu(self.conv1(x)))
        return torch.relu(y + x), y


class ReluBeforeAdd(Block):
    """conv2 ReLUs its own output before the add: the add reads the ReLU'd value."""

    def forward(self, x):
        return torch.relu(self.conv2(torch.relu(self.conv1(x)))) + x


def _images(n: int = 5, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 8, 10, 10, generator=g) for _ in range(n)]


def _converted(block: nn.Module) -> nn.Module:
    model = block.eval()
    images = _images()
    prepared = prepare(model, (images[0],))
    calibrate(prepared, images, progress=False)
    return convert(prepared)


def _calls(gm) -> list[str]:
    return [node.target.__name__ for node in gm.graph.nodes if node.op == "call_function"]


def test_a_residual_add_and_its_relu_fuse_into_the_convolution_before_it() -> None:
    int8 = _converted(Block())
    assert "add_int8" not in _calls(int8)
    (fused,) = [node for node in int8.graph.nodes if node.target is ops.conv2d_add_int8]
    assert fused.args[-1] is True  # the add's ReLU
    assert _calls(int8).count("conv2d_int8") == 1


def test_the_report_names_the_fusion_and_the_fused_kernel() -> None:
    rows = {row.node: row.reason for row in report(_converted(Block())).rows}
    assert "fused into %add (fxloom_q.conv2d_add_int8)" in rows["conv2"]
    assert "fused with %conv2 into fxloom_q.conv2d_add_int8" in rows["add"]
    # with VNNI, or without it on the narrow weights converted there by default
    assert "kernel: onednn.qconv2d_pointwise.binary (sum)" in rows["add"]


def test_the_fusion_is_a_table_row() -> None:
    row = table.FUSED_SUMS["conv2d_int8"]
    assert (row.sum, row.fused) == ("add_int8", "conv2d_add_int8")


def test_the_fused_model_computes_the_float_model_and_no_worse_than_unfused(monkeypatch) -> None:
    block = Block().eval()
    fused = _converted(block)
    monkeypatch.delitem(table.FUSED_SUMS, "conv2d_int8")  # the unfused graph
    unfused = _converted(block)
    assert "add_int8" in _calls(unfused)
    held_out = _images(4, seed=1)
    with torch.no_grad():
        ref = torch.cat([block(x) for x in held_out])
        errors = [
            (torch.cat([model(x) for x in held_out]) - ref).norm() / ref.norm()
            for model in (fused, unfused)
        ]
    assert errors[0] < 0.05 and errors[0] <= errors[1] * 1.05


@pytest.mark.parametrize("block", [SharedConv, ReluBeforeAdd])
def test_a_convolution_read_elsewhere_or_relu_d_before_the_add_is_not_fused(block) -> None:
    calls = _calls(_converted(block()))
    assert "conv2d_add_int8" not in calls and "add_int8" in calls


def test_a_fused_model_saves_and_loads_computing_the_same() -> None:
    int8 = _converted(Block())
    buffer = io.BytesIO()
    fxloom.save(int8, buffer)
    loaded = fxloom.load(buffer.getvalue())
    assert "conv2d_add_int8" in _calls(loaded)
    x = _images(1, seed=2)[0]
    assert torch.equal(loaded(x), int8(x))
