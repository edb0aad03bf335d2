"""The capture methods compared, one function each: ``capture(model, inputs) -> Captured``.

Every method gets the same set-up: the tensor inputs by name, and every other forward
parameter fixed (``fixed_args``): the output flags to ``FLAGS`` (no cache objects, plain
tuples), the rest to their defaults (``None`` for optional tensors not given). The symbolic
tracers get the fixed values as ``concrete_args``; torch.export gets them as constant kwargs.

    fxloom            fxloom.symbolic_trace with example inputs (control flow on traced
                      values follows the example, under run-time guards)
    fxloom-autoleaf   the same with autoleaf=True (untraceable submodules kept as leaves)
    torch.fx          torch.fx.symbolic_trace (no example inputs: torch.fx has none)
    torch.export      torch.export.export(strict=False).module(); its node count is of the
                      ATen-level graph, so compare it with the others only loosely
    fxloom.export     fxloom.export.export(...).module(), called as torch.export is (ATen level)
    torch.export-dynamic / fxloom.export-dynamic
                      the two exports with dimension 0 of every tensor input a shared
                      Dim("batch"); the program must also be correct at another batch size
    fxloom.compile / torch.compile
                      the model compiled on its first call (fxloom.compile; torch.compile
                      with backend="eager"), called as eager is; measured differently
                      (``COMPILERS``, ``worker.measure_compile``): graphs compiled after two
                      identical calls and after a call at another batch size, first-call
                      time, steady-state time per call

Depends on: torch, fxloom. torch.fx and torch.export are imported here only as comparisons.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch import nn

import fxloom
import fxloom.export
from fxloom.values.symbolic.dynamic_shapes import batch_dims

# Non-tensor flags fixed for every model that has them: tensors (or tuples of them) out.
FLAGS = {
    "use_cache": False,
    "output_attentions": False,
    "output_hidden_states": False,
    "return_dict": False,
}


@dataclass
class Captured:
    """A captured program, called as ``run(inputs)``, and the size of its graph."""

    run: Callable[[dict[str, Any]], Any]
    nodes: int
    # Exported programs: the node count after run_decompositions() (core ATen), computed
    # after the capture is timed.
    core_nodes: Callable[[], int] | None = None


def fixed_args(model: nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """Every parameter of ``model.forward`` not in ``inputs``: a flag in ``FLAGS``, else its default."""
    fixed = {}
    for name, parameter in inspect.signature(model.forward).parameters.items():
        if name in inputs or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.default is parameter.empty:
            raise TypeError(f"{type(model).__name__}.forward needs {name!r}; give it an input")
        fixed[name] = FLAGS.get(name, parameter.default)
    return fixed


def run_eager(model: nn.Module, inputs: dict[str, Any]) -> Any:
    return model(**inputs, **fixed_args(model, inputs))


def capture_fxloom(model: nn.Module, inputs: dict[str, Any], autoleaf: bool = False) -> Captured:
    gm = fxloom.symbolic_trace(
        model, fixed_args(model, inputs), example_inputs=inputs, autoleaf=autoleaf
    )
    gm.code  # noqa: B018 -- fxloom generates code lazily; count it in the capture time
    return Captured(lambda given: gm(**given), len(gm.graph.nodes))


def capture_fxloom_autoleaf(model: nn.Module, inputs: dict[str, Any]) -> Captured:
    return capture_fxloom(model, inputs, autoleaf=True)


def capture_torch_fx(model: nn.Module, inputs: dict[str, Any]) -> Captured:
    gm = torch.fx.symbolic_trace(model, concrete_args=fixed_args(model, inputs))
    return Captured(lambda given: gm(**given), len(gm.graph.nodes))


def capture_torch_export(model: nn.Module, inputs: dict[str, Any]) -> Captured:
    # Only the flags that differ from the defaults are passed; the exported module expects
    # the same kwargs on every call.
    flags = {k: v for k, v in fixed_args(model, inputs).items() if k in FLAGS}
    program = torch.export.export(model, args=(), kwargs={**inputs, **flags}, strict=False)
    module = program.module()
    return Captured(
        lambda given: module(**given, **flags),
        len(program.graph.nodes),
        lambda: len(program.run_decompositions().graph.nodes),
    )


def capture_fxloom_export(model: nn.Module, inputs: dict[str, Any]) -> Captured:
    # Called as torch.export is: the same kwargs, the same flags.
    flags = {k: v for k, v in fixed_args(model, inputs).items() if k in FLAGS}
    program = fxloom.export.export(model, args=(), kwargs={**inputs, **flags})
    module = program.module()
    return Captured(
        lambda given: module(**given, **flags),
        len(program.graph.nodes),
        lambda: len(program.run_decompositions().graph.nodes),
    )


def batch_dynamic_shapes(inputs: dict[str, Any], flags: dict[str, Any], dim: Any) -> dict:
    """``dynamic_shapes`` with dimension 0 of every batched tensor input one shared
    ``dim("batch")`` (``fxloom.values.symbolic.dynamic_shapes.batch_dims``; the same form for
    torch.export and fxloom.export); flags stay static."""
    return {**batch_dims(inputs, dim), **{name: None for name in flags}}


def capture_torch_export_dynamic(model: nn.Module, inputs: dict[str, Any]) -> Captured:
    flags = {k: v for k, v in fixed_args(model, inputs).items() if k in FLAGS}
    shapes = batch_dynamic_shapes(inputs, flags, torch.export.Dim)
    program = torch.export.export(
        model, args=(), kwargs={**inputs, **flags}, dynamic_shapes=shapes, strict=False
    )
    module = program.module()
    return Captured(lambda given: module(**given, **flags), len(program.graph.nodes))


def capture_fxloom_export_dynamic(model: nn.Module, inputs: dict[str, Any]) -> Captured:
    flags = {k: v for k, v in fixed_args(model, inputs).items() if k in FLAGS}
    shapes = batch_dynamic_shapes(inputs, flags, fxloom.export.Dim)
    program = fxloom.export.export(
        model, args=(), kwargs={**inputs, **flags}, dynamic_shapes=shapes
    )
    module = program.module()
    return Captured(lambda given: module(**given, **flags), len(program.graph.nodes))


@dataclass
class Compiler:
    """A compiler that compiles on the first call: ``compile(model)`` returns the callable,
    ``graphs(compiled)`` how many graphs it has compiled so far (every cache entry and every
    piece after a graph break), ``details(compiled)`` what else it says (breaks, why it
    recompiled), as JSON-able values."""

    compile: Callable[[nn.Module], Any]
    graphs: Callable[[Any], int]
    details: Callable[[Any], dict[str, Any]]


def _fxloom_compile(model: nn.Module) -> Any:
    return fxloom.compile(model)


def _fxloom_details(compiled: Any) -> dict[str, Any]:
    report = compiled.explain()
    return {
        "breaks": [f"{b.where}: {b.reason}: {b.detail}"[:200] for b in report.breaks],
        "recompiles": [text[:200] for text in report.recompiles],
        "as_python": report.runs_as_python,
        "pieces_as_python": [text[:200] for text in getattr(report, "pieces_as_python", ())],
    }


def _dynamo_compile(model: nn.Module) -> Any:
    return torch.compile(model, backend="eager")


def _dynamo_graphs(compiled: Any) -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _dynamo_details(compiled: Any) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    return {
        "breaks": [f"{reason}"[:200] for reason in counters["graph_break"]],
        "recompiles": [],
        "as_python": None,
    }


COMPILERS = {
    "fxloom.compile": Compiler(
        _fxloom_compile,
        lambda compiled: 0 if compiled is None else compiled.explain().graph_count,
        _fxloom_details,
    ),
    "torch.compile": Compiler(_dynamo_compile, _dynamo_graphs, _dynamo_details),
}


# Methods whose program must also compute eager's result at another batch size.
DYNAMIC_BATCH = {"torch.export-dynamic", "fxloom.export-dynamic"}

METHODS: dict[str, Callable[[nn.Module, dict[str, Any]], Captured]] = {
    "fxloom": capture_fxloom,
    "fxloom-autoleaf": capture_fxloom_autoleaf,
    "torch.fx": capture_torch_fx,
    "torch.export": capture_torch_export,
    "fxloom.export": capture_fxloom_export,
    "torch.export-dynamic": capture_torch_export_dynamic,
    "fxloom.export-dynamic": capture_fxloom_export_dynamic,
}

# Every method the zoo runs: the captures, then the compilers.
ALL_METHODS = [*METHODS, *COMPILERS]
