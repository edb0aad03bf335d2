"""The MODEL argument of ``fxloom cost``, ``draw`` and ``export``: load, trace, propagate shapes.

A MODEL is either the name of an embedded reference model (``fxloom.zoo``: ``resnet_tiny``,
``transformer_tiny``, ...) or ``package.module:factory`` (found on ``sys.path`` with the
current directory first, as ``python -m`` has it), a function called with no
arguments that returns a model, or ``(model, example_inputs)`` with the inputs as a tuple of
positional arguments or a dict of keyword arguments. Example inputs let the tracer answer
questions about tensors and let shape propagation run.

Depends on: the tracer, ``fxloom.zoo``; ``fxloom.passes.shape_prop`` when it is present.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

from fxloom import attr_path
from fxloom.graph_module import GraphModule
from fxloom.tracer import symbolic_trace

__all__ = [
    "LoadedModel",
    "example_inputs_of",
    "call_model",
    "load_model",
    "propagate_shapes",
    "split_inputs",
    "trace_model",
]


class UsageError(ValueError):
    """The command line names something that does not exist (a MODEL that is neither a zoo
    model nor an importable factory): a usage error, exit status 2, as for a bad option."""


@dataclass(frozen=True)
class LoadedModel:
    """A model from the command line, its example inputs (or None) and a name for it."""

    name: str
    model: torch.nn.Module
    inputs: tuple[Any, ...] | dict[str, Any] | None


def example_inputs_of(loaded: LoadedModel, why: str) -> tuple[Any, ...] | dict[str, Any]:
    """``loaded``'s example inputs, for a command that ``why`` (e.g. "export runs the model on
    them"); a model without any is refused with what to do."""
    if loaded.inputs is None:
        raise ValueError(
            f"{loaded.name} comes with no example inputs, and {why}: make the MODEL factory "
            "return (model, example_inputs)"
        )
    return loaded.inputs


def load_model(spec: str) -> LoadedModel:
    """The model named by ``spec``: a zoo name or ``package.module:factory``.

    >>> loaded = load_model("mlp_tiny")
    >>> loaded.name, type(loaded.model).__name__, type(loaded.inputs).__name__
    ('mlp_tiny', 'MLPTiny', 'tuple')
    >>> load_model("fxloom.zoo.mlp:mlp_tiny").inputs is None
    True
    """
    if ":" in spec:
        return _from_factory(spec)
    from fxloom import zoo

    if spec not in zoo.MODELS:
        raise UsageError(
            f"no zoo model named {spec!r}: give one of {', '.join(sorted(zoo.MODELS))}, "
            "or a factory as package.module:function"
        )
    model, inputs = zoo.build(spec)
    return LoadedModel(spec, model, inputs)


def _from_factory(spec: str) -> LoadedModel:
    module_name, _, attribute_path = spec.partition(":")
    _search_the_current_directory()
    try:
        factory: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"cannot import {module_name!r} (from MODEL {spec!r}): {error}") from error
    factory = attr_path.find(factory, attribute_path)
    if factory is attr_path.MISSING:
        raise UsageError(f"{module_name!r} has no {attribute_path!r} (from MODEL {spec!r})")
    if not callable(factory):
        raise UsageError(
            f"{spec} is a {type(factory).__name__}, not a function that builds a model"
        )
    made = factory()
    model, inputs = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(model, torch.nn.Module) or not isinstance(inputs, (tuple, dict, type(None))):
        raise TypeError(
            f"{spec} returned {type(made).__name__}; a MODEL factory returns a torch.nn.Module "
            "or (module, example_inputs) with the inputs as a tuple or a dict"
        )
    return LoadedModel(attribute_path.rsplit(".", 1)[-1], model, inputs)


def _search_the_current_directory() -> None:
    """Put the current directory first on ``sys.path``, as ``python -m`` does, so that
    ``fxloom draw mymodel:make`` finds ``mymodel.py`` where the user runs it. (The
    ``fxloom`` console script starts with its own directory there instead.)"""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def split_inputs(
    inputs: tuple[Any, ...] | dict[str, Any],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Example inputs as ``(args, kwargs)``: a dict is keyword inputs, a tuple positional ones."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    return tuple(inputs), {}


def trace_model(loaded: LoadedModel) -> GraphModule:
    """``fxloom.symbolic_trace`` of the model, on its example inputs when it has them.

    The inputs given are the traced module's inputs; parameters they leave out keep their
    defaults, as in a call ``model(**inputs)`` (the rule of every fxloom entry point that
    traces from example inputs: ``prepare``, ``lower``, ``to_onnx``).
    """
    if loaded.inputs is None:
        return symbolic_trace(loaded.model)
    return symbolic_trace(loaded.model, example_inputs=loaded.inputs)


def call_model(model: Any, inputs: tuple[Any, ...] | dict[str, Any]) -> Any:
    """``model`` called on example inputs: a tuple positionally, a dict by name."""
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def propagate_shapes(gm: GraphModule, loaded: LoadedModel) -> str | None:
    """Record tensor shapes in ``gm``'s nodes; return why not (a note), or None when done."""
    if loaded.inputs is None:
        return "shapes are not drawn: the MODEL factory returned no example inputs"
    try:
        from fxloom.passes.shape_prop import ShapeProp
    except ImportError:
        return "shapes are not drawn: fxloom.passes.shape_prop is not available"
    try:
        with torch.no_grad():
            call_model(ShapeProp(gm).propagate, loaded.inputs)
    except Exception as error:  # a drawing without shapes is still worth having
        first_line = (str(error).strip().splitlines() or [""])[0]
        return (
            f"shapes are not drawn: shape propagation failed: {type(error).__name__}: {first_line}"
        )
    return None
