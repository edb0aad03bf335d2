"""What every test file may use: the devices a test can put tensors on, and the GPU marker.

* ``second_device``: a device other than the CPU that tensors can move to — ``cuda`` where a
  GPU is present, else ``meta`` (tensors without data: for tests of where tensors go and of
  shapes, never of values).
* ``accelerator``: ``cuda`` where a GPU is present, else the CPU: for tests that run a model
  on whatever the machine computes on, with values compared.
* ``@pytest.mark.cuda``: the test needs a GPU and is skipped (saying so) without one.
* ``@pytest.mark.bytecode``: the test runs ``fxloom.compile``, which reads Python 3.11+
  bytecode and refuses older Pythons by design (``tests/bytecode/test_python_versions.py``
  checks the refusal); skipped, saying so, on Python 3.10. Every test under ``tests/bytecode``
  has it, but for the refusal's own tests.
* ``@pytest.mark.cpu_only``: the test states something true of CPU tensors only (a device
  compared with ``"cpu"``, a CPU kernel's numerics); it runs everywhere, since the tensors it
  makes are on the CPU, and ``-m cpu_only`` lists them when the suite moves to a GPU.

Tests make their tensors on the CPU unless they ask for a device: the suite passes on a GPU
machine as it does on a CPU-only one (``tools/gpu_check.sh`` checks that).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
HAS_BYTECODE_COMPILE = sys.version_info >= (3, 11)
_BYTECODE_TESTS = Path(__file__).parent / "bytecode"
_REFUSAL_TESTS = _BYTECODE_TESTS / "test_python_versions.py"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a GPU (skipped without one)")
    config.addinivalue_line(
        "markers", "bytecode: runs fxloom.compile, which needs Python 3.11+ (skipped before)"
    )
    config.addinivalue_line(
        "markers", "cpu_only: asserts what holds of CPU tensors only (see tests/conftest.py)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a GPU: torch.cuda.is_available() is False here")
    old_python = pytest.mark.skip(
        reason=f"fxloom.compile reads Python 3.11+ bytecode and refuses Python "
        f"{sys.version_info.major}.{sys.version_info.minor} by design"
    )
    for item in items:
        path = Path(str(item.fspath))
        if _BYTECODE_TESTS in path.parents and path != _REFUSAL_TESTS:
            item.add_marker(pytest.mark.bytecode)
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(no_gpu)
        if "bytecode" in item.keywords and not HAS_BYTECODE_COMPILE:
            item.add_marker(old_python)


@pytest.fixture
def second_device() -> torch.device:
    return torch.device("cuda") if HAS_CUDA else torch.device("meta")


@pytest.fixture
def accelerator() -> torch.device:
    return torch.device("cuda") if HAS_CUDA else torch.device("cpu")


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module's tests (``pytest.mark.usefixtures("one_thread")``):
    the models are tiny, and two threads on a busy two-core machine spin against each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
