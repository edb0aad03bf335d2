"""The graph signature: what each input and output of an exported graph is.

An exported graph takes the program's state as inputs and returns its state
changes as outputs, so the graph alone does not say which placeholder is a
weight and which is the user's tensor. The signature does, in order::

    >>> from fxloom.export import export
    >>> import torch
    >>> ep = export(torch.nn.BatchNorm1d(3), (torch.randn(4, 3),))
    >>> for spec in ep.graph_signature.input_specs[:2]:
    ...     print(spec)
    p_weight: PARAMETER target='weight'
    p_bias: PARAMETER target='bias'
    >>> ep.graph_signature.buffers_to_mutate
    {'getitem_3': 'running_mean', 'getitem_4': 'running_var', 'add': 'num_batches_tracked'}

Input kinds: ``PARAMETER``, ``BUFFER``, ``CONSTANT_TENSOR`` (tensors the
program holds that are neither), ``USER_INPUT``. Output kinds: the writes
(``BUFFER_MUTATION``, ``PARAMETER_MUTATION``, ``USER_INPUT_MUTATION``) come
first, then ``USER_OUTPUT``. Names and kinds follow torch.export's.

Depends on nothing of fxloom.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "InputKind",
    "STATE_KINDS",
    "OutputKind",
    "TensorArgument",
    "ConstantArgument",
    "InputSpec",
    "OutputSpec",
    "ExportGraphSignature",
]


class InputKind(enum.Enum):
    USER_INPUT = enum.auto()
    PARAMETER = enum.auto()
    BUFFER = enum.auto()
    CONSTANT_TENSOR = enum.auto()


# Inputs that are the program's state (lifted attributes of the module), not the user's.
STATE_KINDS = frozenset({InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR})


class OutputKind(enum.Enum):
    USER_OUTPUT = enum.auto()
    BUFFER_MUTATION = enum.auto()
    PARAMETER_MUTATION = enum.auto()
    USER_INPUT_MUTATION = enum.auto()


@dataclass(frozen=True)
class TensorArgument:
    """A graph value (a placeholder or a node) by name."""

    name: str


@dataclass(frozen=True)
class ConstantArgument:
    """A value fixed at export: a non-tensor input or output (an int, a string, None)."""

    name: str
    value: Any


Argument = TensorArgument | ConstantArgument


@dataclass(frozen=True)
class InputSpec:
    """One placeholder: its kind, its name in the graph and, for state, the state's name."""

    kind: InputKind
    arg: Argument
    target: str | None = None  # "linear.weight" for state; None for user inputs
    persistent: bool | None = None  # buffers only: whether state_dict() holds it

    def __str__(self) -> str:
        target = "" if self.target is None else f" target={self.target!r}"
        persistent = "" if self.persistent is None else f" persistent={self.persistent}"
        return f"{self.arg.name}: {self.kind.name}{target}{persistent}"


@dataclass(frozen=True)
class OutputSpec:
    """One output value: what it is, and for a write, what it writes."""

    kind: OutputKind
    arg: Argument
    target: str | None = None  # the buffer, parameter or user input written

    def __str__(self) -> str:
        target = "" if self.target is None else f" target={self.target!r}"
        name = self.arg.name or repr(getattr(self.arg, "value", None))  # a constant: its value
        return f"{name}: {self.kind.name}{target}"


@dataclass
class ExportGraphSignature:
    """The input and output specs of an exported graph, in placeholder and output order."""

    input_specs: list[InputSpec] = field(default_factory=list)
    output_specs: list[OutputSpec] = field(default_factory=list)

    def _inputs(self, kind: InputKind) -> list[InputSpec]:
        return [s for s in self.input_specs if s.kind is kind]

    def _outputs(self, kind: OutputKind) -> list[OutputSpec]:
        return [s for s in self.output_specs if s.kind is kind]

    @property
    def parameters(self) -> list[str]:
        return [s.target for s in self._inputs(InputKind.PARAMETER)]

    @property
    def buffers(self) -> list[str]:
        return [s.target for s in self._inputs(InputKind.BUFFER)]

    @property
    def non_persistent_buffers(self) -> list[str]:
        return [s.target for s in self._inputs(InputKind.BUFFER) if s.persistent is False]

    @property
    def lifted_tensor_constants(self) -> list[str]:
        return [s.target for s in self._inputs(InputKind.CONSTANT_TENSOR)]

    @property
    def user_inputs(self) -> list[Any]:
        return [
            s.arg.name if isinstance(s.arg, TensorArgument) else s.arg.value
            for s in self._inputs(InputKind.USER_INPUT)
        ]

    @property
    def user_outputs(self) -> list[Any]:
        return [
            s.arg.name if isinstance(s.arg, TensorArgument) else s.arg.value
            for s in self._outputs(OutputKind.USER_OUTPUT)
        ]

    @property
    def inputs_to_parameters(self) -> dict[str, str]:
        return {s.arg.name: s.target for s in self._inputs(InputKind.PARAMETER)}

    @property
    def inputs_to_buffers(self) -> dict[str, str]:
        return {s.arg.name: s.target for s in self._inputs(InputKind.BUFFER)}

    @property
    def inputs_to_lifted_tensor_constants(self) -> dict[str, str]:
        return {s.arg.name: s.target for s in self._inputs(InputKind.CONSTANT_TENSOR)}

    @property
    def buffers_to_mutate(self) -> dict[str, str]:
        return {s.arg.name: s.target for s in self._outputs(OutputKind.BUFFER_MUTATION)}

    @property
    def parameters_to_mutate(self) -> dict[str, str]:
        return {s.arg.name: s.target for s in self._outputs(OutputKind.PARAMETER_MUTATION)}

    @property
    def user_inputs_to_mutate(self) -> dict[str, str]:
        return {s.arg.name: s.target for s in self._outputs(OutputKind.USER_INPUT_MUTATION)}

    def __str__(self) -> str:
        lines = ["# inputs"]
        lines += [f"{spec}" for spec in self.input_specs]
        lines.append("")
        lines.append("# outputs")
        lines += [f"{spec}" for spec in self.output_specs]
        return "\n".join(lines)
