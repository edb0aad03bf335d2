"""Structural: ``fxloom.load``/``fxloom.export.load`` run no module code while loading.

A ``sys.setprofile`` hook watches every Python function called while a valid file loads
(weight-normalised layers, GraphModules holding GraphModules, an exported ``cond``); none may
be a generated ``forward`` (code compiled by fxloom, file ``<fxloom-generated>/...``), any
module's ``forward``, or a parametrization's ``forward``/``right_inverse`` — loading rebuilds
state, it does not run the model.
"""

from __future__ import annotations

import io
import sys

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import fxloom
import fxloom.export

GENERATED = "<fxloom-generated>"
PARAMETRIZE_FILE = parametrize.__file__


def _forbidden(code) -> str | None:
    filename, name = code.co_filename, code.co_name
    # The generated source is compiled at load, after it was checked to be one ``def
    # forward``: its module level only defines the function. The function itself must not run.
    if filename.startswith(GENERATED) and name != "<module>":
        return f"generated code {filename}:{name}"
    if name == "forward":
        return f"a module's forward ({filename}:{code.co_firstlineno})"
    if filename == PARAMETRIZE_FILE and name in ("forward", "right_inverse", "get_parametrized"):
        return f"torch parametrization {name}"
    return None


def calls_while(load):
    seen = []

    def profile(frame, event, arg):
        if event == "call":
            what = _forbidden(frame.f_code)
            if what is not None:
                seen.append(what)

    sys.setprofile(profile)
    try:
        result = load()
    finally:
        sys.setprofile(None)
    return result, seen


def _saved(gm) -> bytes:
    buffer = io.BytesIO()
    fxloom.save(gm, buffer)
    return buffer.getvalue()


def _exported(model, args, **kwargs) -> bytes:
    buffer = io.BytesIO()
    fxloom.export.save(fxloom.export.export(model, args, **kwargs), buffer)
    return buffer.getvalue()


class _Cond(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return fxloom.cond(
            x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: self.lin(x) - 1, (x,)
        )


def _weight_norm():
    model = nn.Sequential(
        nn.utils.parametrizations.weight_norm(nn.Linear(3, 4)),
        nn.ReLU(),
        nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 2, 1), name="weight"),
    )
    return _saved(fxloom.symbolic_trace(nn.Sequential(model[0], model[1])))


def _nested_graph_modules():
    inner = fxloom.symbolic_trace(nn.Sequential(nn.Linear(3, 3), nn.ReLU()))
    outer = fxloom.symbolic_trace(nn.Sequential(nn.Linear(3, 3)))
    outer.add_submodule("inner", inner)
    output = next(n for n in outer.graph.nodes if n.op == "output")
    with outer.graph.inserting_before(output):
        wrapped = outer.graph.call_module("inner", (output.args[0],))
    output.args = (wrapped,)
    outer.recompile()
    return _saved(outer)


FILES = {
    "weight-norm-linear": (_weight_norm, fxloom.load),
    "graph-module-holding-a-graph-module": (_nested_graph_modules, fxloom.load),
    "exported": (lambda: _exported(nn.Linear(3, 2), (torch.randn(4, 3),)), fxloom.export.load),
    "exported-cond": (lambda: _exported(_Cond(), (torch.randn(4, 3),)), fxloom.export.load),
}


@pytest.mark.parametrize("name", list(FILES))
def test_loading_calls_no_forward(name):
    """No generated forward, module forward or parametrization runs while the file loads."""
    make, load = FILES[name]
    data = make()
    loaded, seen = calls_while(lambda: load(data))
    assert loaded is not None
    assert not seen, f"{name}: loading ran module code: {sorted(set(seen))}"


def test_the_hook_does_see_forward_and_parametrizations_when_the_module_runs():
    """Control: calling the loaded module is seen (generated forward, parametrization), so an
    empty list while loading means nothing ran, not that the hook is blind."""
    loaded = fxloom.load(_weight_norm())
    _, seen = calls_while(lambda: loaded(torch.randn(2, 3)))
    assert any(s.startswith("generated code") for s in seen), seen
    assert any("parametrization" in s or "forward" in s for s in seen), seen
