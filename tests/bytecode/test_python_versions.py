"""``fxloom.compile`` reads CPython 3.11+ bytecode; on 3.10 it says so (fxloom itself imports).

The 3.10 cell of ``make test-matrix`` runs the refusals; CI (3.11) runs the other test.
"""

from __future__ import annotations

import sys

import pytest
import torch

import fxloom
from fxloom.bytecode.breaks import CompileError
from fxloom.bytecode.instructions import UnsupportedPython, decode

OLD_PYTHON = sys.version_info < (3, 11)


@pytest.mark.skipif(not OLD_PYTHON, reason="the refusal happens before Python 3.11")
def test_compile_on_python_310_names_the_version_and_the_alternatives():
    with pytest.raises(CompileError, match=r"3\.11.*symbolic_trace"):
        fxloom.compile(torch.relu)


@pytest.mark.skipif(not OLD_PYTHON, reason="the refusal happens before Python 3.11")
def test_decode_on_python_310_is_refused():
    with pytest.raises(UnsupportedPython, match="3.11") as refused:
        decode(test_decode_on_python_310_is_refused.__code__)
    assert isinstance(refused.value, CompileError)


@pytest.mark.skipif(OLD_PYTHON, reason="Python 3.11+ only")
def test_compile_works_from_python_311():
    compiled = fxloom.compile(lambda x: torch.relu(x) * 2)
    x = torch.randn(3)
    assert torch.equal(compiled(x), torch.relu(x) * 2)
