"""Error measures and data for the quantization tests (imported by them; see conftest.py).

- ``relative_error(out, ref)``: ``||out - ref|| / ||ref||``; ``cosine(out, ref)``.
- ``batches(make, count)``: ``count`` batches ``make(seed)`` for seeds 1..count (calibration);
  held-out data uses seeds from 100 on, never seen in calibration.
- ``WHOLE_CODES``: marks a test of oneDNN's whole-code int8 rows against 8-bit weights, which
  run on VNNI CPUs only (elsewhere the table runs the split rows or the reference:
  ``kernels.vnni``); ``SPLIT`` and ``ROWS``: the names of the linear rows without VNNI, for
  8-bit and narrow weights; ``LINEAR_HERE``: what a converted model's dynamic int8 linears
  run here (narrow weights by default without VNNI: ``QuantSpec.narrow_weights``);
- ``SeenOperators``: a dispatch mode that passes every call on, noting which operators it
  saw (what a tracer or an exporter would see of a call).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fxloom.quantize import kernels

WHOLE_CODES = pytest.mark.skipif(
    not kernels.vnni() or "onednn" not in kernels.cpu_features(),
    reason="oneDNN's whole-code int8 rows run on VNNI CPUs only (without, int16 pair sums "
    "saturate: the split rows or the reference run)",
)


SPLIT = "onednn.qconv_pointwise (codes split in halves)"
ROWS = "onednn.qconv_pointwise (rows as pixels)"
LINEAR_HERE = {
    "per_tensor": "onednn.qlinear_pointwise (dynamic per tensor)" if kernels.vnni() else ROWS,
    "per_token": "aten._int_mm" if kernels.vnni() else ROWS,
}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).norm() / ref.norm())


def cosine(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0))


def batches(make: Callable[[int], torch.Tensor], count: int, first: int = 1) -> list:
    return [make(seed) for seed in range(first, first + count)]


class SeenOperators(TorchDispatchMode):
    """Passes every call on, noting which operators it saw (``seen``)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))
