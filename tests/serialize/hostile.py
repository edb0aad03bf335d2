"""Helpers that make hostile files: a valid model saved with ``fxloom.save``, then edited.

``saved`` writes a model (traced if it is not a GraphModule yet) to bytes; ``edited``
rewrites its ``fxloom/program.json`` through a function; ``record`` finds a module's
record in that JSON by its path; ``weights``/``with_weights`` read and rewrite the
safetensors member. ``no_code_runs`` watches, with ``sys.setprofile``, for any call of a
``forward`` (a module's, a generated one, a parametrization's) or of torch's property
getter for parametrized tensors while a block runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import zipfile
from collections.abc import Callable, Iterator

import safetensors.torch
from torch import nn

import fxloom

PROGRAM = "fxloom/program.json"
WEIGHTS = "fxloom/weights.safetensors"
# Functions whose call means a module's code ran: forwards, nn.Module's call path, and the
# getter torch's parametrize gives each parametrized tensor.
MODULE_CODE = frozenset({"forward", "_call_impl", "_wrapped_call_impl", "get_parametrized"})
# What calling a loaded module may raise: its graph is valid, its values may not fit.
RUN_ERRORS = (
    RuntimeError,
    TypeError,
    ValueError,
    IndexError,
    KeyError,
    AttributeError,
    ZeroDivisionError,
    OverflowError,
    NotImplementedError,
)


def saved(model: nn.Module) -> bytes:
    gm = model if isinstance(model, fxloom.GraphModule) else fxloom.symbolic_trace(model)
    f = io.BytesIO()
    fxloom.save(gm, f)
    return f.getvalue()


def member(data: bytes, name: str) -> bytes:
    return zipfile.ZipFile(io.BytesIO(data)).read(name)


def rewrite(data: bytes, name: str, content: bytes) -> bytes:
    """``data`` with the member ``name`` replaced by ``content``."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, content if info.filename == name else src.read(info))
    return out.getvalue()


def edited(data: bytes, edit: Callable[[dict], object]) -> bytes:
    """``data`` whose program went through ``edit(program)`` (in place)."""
    program = json.loads(member(data, PROGRAM))
    edit(program)
    return rewrite(data, PROGRAM, json.dumps(program).encode())


def record(program: dict, path: str = "") -> dict:
    """The record of the module at ``path`` (``"lin"``, ``"0.parametrizations.weight"``)."""
    found = program["module"]
    for name in filter(None, path.split(".")):
        found = found["children"][name]
    return found


def weights(data: bytes) -> dict:
    return safetensors.torch.load(member(data, WEIGHTS))


def with_weights(data: bytes, tensors: dict) -> bytes:
    return rewrite(data, WEIGHTS, safetensors.torch.save(tensors))


@contextlib.contextmanager
def no_code_runs() -> Iterator[list[str]]:
    """Records the module code (``MODULE_CODE``) called in the block; the test asserts the
    list it yields is empty afterwards."""
    called: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name in MODULE_CODE:
            called.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename})")

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield called
    finally:
        sys.setprofile(previous)
