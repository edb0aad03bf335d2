"""Fixtures of the quantization tests (helpers are in quantize_helpers.py).

- ``one_thread`` (automatic): the machine is shared and these models are small.
- ``quiet_quantized_dtype_deprecation`` (automatic): torch's warnings about its quantized
  dtypes moving to torchao.
- ``weight_only_references``: ``linear_w8``/``linear_w4`` run their references, for tests
  of what an operator means (an import, a rename) rather than of the kernels, whose fp32
  rows round activations to bf16 (``kernels.BF16_BOUND``; test_kernels.py checks them).
"""

from __future__ import annotations

import warnings

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


@pytest.fixture
def weight_only_references(monkeypatch):
    from fxloom.quantize import kernels

    for name in ("linear_w8", "linear_w4"):
        monkeypatch.setitem(kernels.KERNELS, name, ())
    monkeypatch.setattr(kernels, "PLANS", {})  # decisions made with the rows in place
