"""What consumers of captured programs work on: one helper, one policy, for every pass and backend.

``lower``, ``translate``, ``to_onnx``, ``quantize.prepare``/``prepare_qat``, ``fuse``,
``analyze_cost``, ``ShapeProp`` and ``split_module`` take a plain ``nn.Module`` (or function), a
``GraphModule`` (traced, or an exported program's ``ep.module()``), or an ``ExportedProgram``.
They turn it into a graph here, and nowhere else:

* ``module_to_transform(model, example_inputs, consumer=...)`` is the module a consumer that
  returns a module rewrites (lowering, quantization, fusion, splitting): a GraphModule as it
  is; an ``ExportedProgram`` as ``ep.module()``, which takes the user's inputs, checks them,
  and returns the program's output structure (the calling convention the result keeps); a
  plain module traced by ``trace``.
* ``captured_module(model, consumer=...)`` is the same for a consumer that takes no example
  inputs (``split_module``, ``split_by_support``, ``schedule_async``): a plain module is
  refused, with how to trace it.
* ``trace(model, example_inputs, consumer=...)`` is the one way a consumer traces: the
  tracer on the examples (they bind by name or position as ``symbolic_trace`` binds them,
  parameters left out keep their defaults), each node's source line recorded for the
  consumer's messages, and a note on failure that says how to trace it yourself.
* ``program_to_read(model, example_inputs, consumer=...)`` is what a consumer that reads a
  graph without returning a module (``translate``, ``to_onnx``) works on: a plain module
  traced as above, anything captured as it is.
* ``graph_module_of(program)`` and ``lifted_state(program)`` are the graph a consumer that
  reads (``ShapeProp``, ``analyze_cost``, ``translate``, the drawer) runs: an exported
  program's own graph, ``ep.graph_module``, whose placeholders for parameters, buffers and
  constants (``p_conv1_weight``, ``b_bn1_running_mean``, ``c_...``) the consumer binds to the
  program's tensors, so a caller passes only the user inputs, as to ``ep.module()``.

Depends on: the tracer (entry point only), ``fxloom.export`` (the program and its signature).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxloom._notes import add_note
from fxloom.export.program import ExportedProgram
from fxloom.export.signature import STATE_KINDS, InputKind
from fxloom.graph_module import GraphModule
from fxloom.values.signature import call_of

__all__ = [
    "LiftedTensor",
    "call_inputs",
    "captured_module",
    "graph_module_of",
    "lifted_state",
    "model_name",
    "module_to_transform",
    "program_to_read",
    "trace",
]

Program = torch.nn.Module | Callable[..., Any] | ExportedProgram


@dataclass(frozen=True)
class LiftedTensor:
    """The program state one placeholder stands for: ``conv1.weight``, a PARAMETER."""

    target: str
    tensor: torch.Tensor
    kind: InputKind

    @property
    def is_parameter(self) -> bool:
        return self.kind is InputKind.PARAMETER


def graph_module_of(module: Any) -> Any:
    """``ep.graph_module`` for an ``ExportedProgram``; any other module as it is."""
    return module.graph_module if isinstance(module, ExportedProgram) else module


def lifted_state(module: Any) -> dict[str, LiftedTensor]:
    """Placeholder name -> the state it lifts, for an ``ExportedProgram`` (else empty).

    >>> import torch
    >>> from fxloom.export import export
    >>> ep = export(torch.nn.Linear(3, 2), (torch.randn(1, 3),))
    >>> {name: lifted.target for name, lifted in lifted_state(ep).items()}
    {'p_weight': 'weight', 'p_bias': 'bias'}
    """
    if not isinstance(module, ExportedProgram):
        return {}
    return {
        spec.arg.name: LiftedTensor(
            spec.target, module.tensor_of(spec.target, spec.kind), spec.kind
        )
        for spec in module.graph_signature.input_specs
        if spec.kind in STATE_KINDS
    }


def module_to_transform(
    model: Program,
    example_inputs: Any = None,
    *,
    consumer: str,
    concrete_args: dict[str, Any] | None = None,
) -> GraphModule:
    """The GraphModule ``consumer`` rewrites: ``model`` itself, ``ep.module()``, or a trace.

    ``example_inputs`` (a tuple by position, a dict by name, or one tensor) are used only to
    trace a plain module; ``concrete_args`` fix parameters while tracing. A GraphModule is
    returned as it is (the consumer copies it if it must leave it untouched); so is the
    module of an exported program, which is new on every call.

    >>> import torch
    >>> from fxloom.export import export
    >>> ep = export(torch.nn.Linear(3, 2), (torch.randn(1, 3),))
    >>> type(module_to_transform(ep, consumer="an example")).__name__
    'ExportedModule'
    """
    if isinstance(model, (GraphModule, ExportedProgram)):
        return captured_module(model, consumer)
    return trace(model, example_inputs, consumer=consumer, concrete_args=concrete_args)


def program_to_read(
    model: Program,
    example_inputs: Any = None,
    *,
    consumer: str,
    concrete_args: dict[str, Any] | None = None,
) -> GraphModule | ExportedProgram:
    """What a consumer that reads a graph (``translate``) works on: an exported program as it
    is (its own graph, read with ``graph_module_of`` and ``lifted_state``), a GraphModule as it
    is, a plain module traced on ``example_inputs``."""
    if isinstance(model, (GraphModule, ExportedProgram)):
        return model
    return trace(model, example_inputs, consumer=consumer, concrete_args=concrete_args)


def captured_module(model: GraphModule | ExportedProgram, consumer: str) -> GraphModule:
    """For a consumer that does not trace (it has no example inputs): a GraphModule as it is,
    an exported program's ``ep.module()``; anything else is refused, saying how to capture it.
    """
    if isinstance(model, ExportedProgram):
        return model.module()
    if isinstance(model, GraphModule):
        return model
    raise TypeError(
        f"{consumer} works on an fxloom.GraphModule, got {type(model).__name__}; trace the "
        "model first: fxloom.symbolic_trace(model), or pass an exported program"
    )


def trace(
    model: torch.nn.Module | Callable[..., Any],
    example_inputs: Any = None,
    *,
    consumer: str,
    concrete_args: dict[str, Any] | None = None,
) -> GraphModule:
    """``model`` traced as every consumer traces it (see the module docstring).

    A failure keeps its own error, with a note naming ``consumer`` and what to do instead.
    """
    from fxloom.tracer import Tracer  # the tracer's entry point, the one place passes trace

    if not callable(model):
        raise TypeError(
            f"{consumer} takes an nn.Module, a function, a GraphModule or an exported program, "
            f"got {type(model).__name__}"
        )
    args, kwargs = call_inputs(example_inputs, consumer) if example_inputs is not None else ((), {})
    # Stack traces: reports and errors name the user's lines. The passes trace as fxloom does
    # beyond torch.fx: writes recorded where the program writes (x += y in place), buffers traced.
    tracer = Tracer(record_stack_traces=True, record_inplace_operators=True)
    tracer.proxy_buffer_attributes = True
    try:
        graph = tracer.trace(model, concrete_args, example_inputs=_examples(args, kwargs))
    except Exception as error:
        add_note(
            error,
            f"{consumer} traced {model_name(model)} with fxloom.symbolic_trace on the example "
            "inputs; trace it yourself (with concrete_args, or autoleaf=True to keep an "
            "untraceable submodule whole) and pass the GraphModule, or pass an exported "
            "program (fxloom.export.export)",
        )
        raise
    return GraphModule(tracer.root, graph, model_name(model))


def _examples(args: tuple, kwargs: dict) -> tuple | dict | None:
    """What the tracer binds: inputs by name, or by position, or none (all symbolic)."""
    if kwargs:
        return kwargs
    return args if args else None


def call_inputs(example_inputs: Any, consumer: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` for example inputs given as a tuple or list, a dict, or one tensor."""
    if isinstance(example_inputs, (dict, tuple, list, torch.Tensor)):
        return call_of(example_inputs)
    raise TypeError(
        f"{consumer}: example_inputs must be a tuple of positional inputs or a dict by name, "
        f"got {type(example_inputs).__name__}"
    )


def model_name(model: Any) -> str:
    """How messages and reports name a model: its class, or a function's name."""
    if isinstance(model, torch.nn.Module):
        return model._get_name()
    return getattr(model, "__name__", type(model).__name__)
