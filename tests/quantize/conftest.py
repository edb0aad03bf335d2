"""Shared by the quantization tests: one torch thread, error measures, calibration data.

- ``one_thread`` (automatic): the machine is shared and these models are small.
- ``relative_error(out, ref)``: ``||out - ref|| / ||ref||``; ``cosine(out, ref)``.
- ``batches(make, count)``: ``count`` batches ``make(seed)`` for seeds 1..count (calibration);
  held-out data uses seeds from 100 on, never seen in calibration.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def quiet_quantized_dtype_deprecation():
    # torch 2.13 warns that its quantized dtypes move to torchao; the kernels are what we test.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        warnings.filterwarnings("ignore", message=".*torchao.*")
        yield


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).norm() / ref.norm())


def cosine(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0))


def batches(make: Callable[[int], torch.Tensor], count: int, first: int = 1) -> list:
    return [make(seed) for seed in range(first, first + count)]
