"""How passes see an ``ExportedProgram``: its graph module and the state its placeholders lift.

An exported graph takes the program's parameters, buffers and constant tensors as placeholders
(``p_conv1_weight``, ``b_bn1_running_mean``, ``c_...``) ahead of the user's inputs, and its
``graph_signature`` says which placeholder stands for what. Passes that accept an
``ExportedProgram`` (``ShapeProp``, ``analyze_cost``) bind those placeholders to the program's
own tensors, so a caller passes only the user inputs, as to ``ep.module()``.

Depends on: ``fxloom.export`` (the program and its signature).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fxloom.export.program import ExportedProgram
from fxloom.export.signature import STATE_KINDS, InputKind

__all__ = ["LiftedTensor", "graph_module_of", "lifted_state"]


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
