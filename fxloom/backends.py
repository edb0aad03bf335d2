"""``Backend``: what runs part of a graph in place of PyTorch, and the registry of backends.

A backend answers the questions every consumer of a captured program asks of it, in one
place: ``fxloom.lower`` (which operators it takes, how to compile the regions it takes),
``fxloom.compile`` (a named backend runs each captured graph), pipeline stages of
``fxloom.distributed`` (compile a stage; can it run backward?) and ``fxloom.save`` (how the
modules it makes are written to a file and read back). Subclass ``Backend``, override what
differs from the defaults, and register an instance under its name::

    >>> import torch
    >>> from fxloom.backends import Backend, register_backend
    >>> from fxloom.lower import lower
    >>> class ReluOnly(Backend):
    ...     name = "relu_only"
    ...     trainable = True  # its regions are GraphModules: autograd runs through them
    ...     def unsupported_reason(self, node, gm):
    ...         if node.op == "call_function" and node.target is torch.relu:
    ...             return None
    ...         return "relu_only runs torch.relu only"
    ...     def compile(self, region, example_inputs):
    ...         return region  # a real backend returns a module that runs the region its way
    >>> _ = register_backend(ReluOnly())
    >>> lowered = lower(lambda x: torch.relu(x) * 2, (torch.randn(3),), backend="relu_only")
    >>> print(lowered.lowering_report.summary())
    <lambda>: 1 of 1 region in relu_only, 1 of 2 operators lowered, 1 left in PyTorch
    >>> del BACKENDS["relu_only"]  # registrations last for the process

The questions, and the defaults a subclass inherits:

* ``unsupported_reason(node, gm)``: why the backend cannot run a node (None: it can).
  Default: it runs every node.
* ``compile(region, example_inputs) -> nn.Module``: a module computing what ``region`` (a
  GraphModule of supported nodes) computes. The one method a backend must write.
* ``trainable``: whether gradients flow through the modules ``compile`` returns. Pipeline
  stages that train need it; inference may use any backend. Default: False.
* ``runs_graph_code``: whether ``compile_program`` runs the captured graph's own Python code,
  effects and all (then ``fxloom.compile`` records ``with torch.autocast`` in the graph;
  a backend that translates operators keeps autocast at piece boundaries). Default: False.
* ``saved_modules``: the module classes ``compile`` returns whose state is more than
  parameters, buffers and plain attributes, each with its ``SavedModule`` rule (how
  ``fxloom.save`` writes it and ``fxloom.load`` rebuilds it from data). Default: none.

and the finer points lowering asks, each with a default that suits most backends:
``compile_region`` (compile with what lowering recorded: the region's outputs, its inputs at
other sizes, the settings below), ``require`` (raise ``ImportError`` naming the missing
package), ``not_worth_compiling`` (a supported region better left in PyTorch),
``lowering_settings`` (options shared by a lowering's regions, with a note for the report)
and ``compile_program`` (what ``fxloom.compile`` runs for a captured graph).

The registry starts with ``"eager"``; fxloom's own other backends are declared in it by
module and name (``"onnxruntime"``: ``fxloom.lower.onnxruntime_backend``) and ``get_backend``
imports one when first asked for it, so this module stays cheap to import (``fxloom.compile``
and ``fxloom.save`` read it; lowering's dependencies load only when a backend needs them) and
importing a module registers nothing. ``fxloom.compile`` resolves names here too: the
bytecode frontend keeps no registry of its own.

Depends on: ``fxloom.graph_module``, ``fxloom.node`` (types); ``fxloom.lower`` when its
backends are asked for (and ``fxloom.lower.lowering`` in ``compile_program``).
"""

from __future__ import annotations

import contextlib
import importlib
import operator
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

from fxloom.graph_module import GraphModule
from fxloom.node import Node

if TYPE_CHECKING:
    from fxloom.lower.dynamic_dims import SizeRun
    from fxloom.pytree import TreeSpec

__all__ = [
    "BACKENDS",
    "Backend",
    "EagerBackend",
    "LoweredProgram",
    "RegionExamples",
    "SavedModule",
    "SavedStateError",
    "StateReader",
    "UntranslatableNodesError",
    "StateWriter",
    "get_backend",
    "known_backends",
    "register_backend",
    "saved_module_rules",
]


@dataclass(frozen=True)
class RegionExamples:
    """What lowering recorded of one region, given to ``Backend.compile_region``.

    Attributes:
        name: the region's submodule name in the lowered module (``_run_on_acc_0``).
        inputs: the arguments it received on the example inputs.
        outputs: what it returned there.
        at_other_sizes: its inputs (and outputs) in the runs at other sizes that
            ``dynamic_shapes`` asked for (``fxloom.lower.dynamic_dims``); empty when static.
        settings: what ``Backend.lowering_settings`` chose for this lowering.
    """

    name: str
    inputs: tuple[Any, ...]
    outputs: Any
    at_other_sizes: tuple[SizeRun, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)


class UntranslatableNodesError(RuntimeError):
    """Raised by ``Backend.compile_region`` for nodes it accepted (``unsupported_reason``
    said None) but cannot compile after all; ``nodes`` lists ``(node, reason)``, nodes of the
    region's graph. ``fxloom.lower`` then splits the region around them: they run in PyTorch,
    reported with the reason, and the rest of the region is compiled."""

    def __init__(self, message: str, nodes: list[tuple[Any, str]]) -> None:
        super().__init__(message)
        self.nodes = nodes


class SavedStateError(ValueError):
    """A module's saved state is invalid or unsafe; ``fxloom.load`` and ``fxloom.save`` raise
    it as ``SerializationError`` with the same message."""


class StateWriter(Protocol):
    """What ``fxloom.save`` offers a ``SavedModule.save``: values turned into file data."""

    def tensor(self, tensor: torch.Tensor, where: str) -> Any:
        """A record of ``tensor``, written with the file's other tensors."""

    def value(self, value: Any, where: str) -> Any:
        """A Python value (number, string, tuple, dict, dtype...) as data."""

    def spec(self, spec: TreeSpec) -> Any:
        """A pytree structure (``fxloom.pytree.TreeSpec``) as data."""


class StateReader(Protocol):
    """What ``fxloom.load`` offers a ``SavedModule.load``: file data turned back into values.

    Each method raises for data it refuses; the data may be hostile (docs/serialization.md).
    """

    def tensor(self, record: Any, where: str, *, data_on_cpu: bool = False) -> torch.Tensor:
        """The tensor a ``StateWriter.tensor`` record names (on the CPU if ``data_on_cpu``)."""

    def value(self, data: Any, where: str) -> Any:
        """The value ``StateWriter.value`` wrote."""

    def spec(self, data: Any, where: str) -> TreeSpec:
        """The structure ``StateWriter.spec`` wrote."""

    def field(self, data: Any, key: str, kind: type, where: str) -> Any:
        """``data[key]``, which must be a ``kind``: the parts of a state are checked on use."""

    def describe(self, data: Any) -> str:
        """``data`` shortened for an error message."""


@dataclass(frozen=True)
class SavedModule:
    """How modules of one class a backend makes are written to a file and read back.

    ``save(module, writer, where) -> data`` returns JSON data (tensors as
    ``writer.tensor`` records); ``load(data, reader, where) -> module`` rebuilds the module
    from that data alone, running none of it. Both raise ``SavedStateError`` for what a file
    may not hold; ``where`` names the module in the file (``module.region``).
    """

    save: Callable[[nn.Module, StateWriter, str], Any]
    load: Callable[[Any, StateReader, str], nn.Module]


class Backend:
    """What runs a region of a graph in place of PyTorch (see the module docstring)."""

    name: ClassVar[str] = ""
    trainable: ClassVar[bool] = False
    runs_graph_code: ClassVar[bool] = False
    saved_modules: ClassVar[Mapping[type, SavedModule]] = MappingProxyType({})

    def unsupported_reason(self, node: Node, gm: GraphModule) -> str | None:
        """Why this backend cannot run ``node`` of ``gm``, or None when it can."""
        return None

    def compile(self, region: GraphModule, example_inputs: tuple[Any, ...]) -> nn.Module:
        """A module that computes what ``region`` computes, for inputs like these."""
        raise NotImplementedError(f"the backend {self.name!r} does not say how to compile")

    def compile_region(self, region: GraphModule, examples: RegionExamples) -> nn.Module:
        """``compile``, given all that lowering recorded; override to use more than the inputs."""
        return self.compile(region, examples.inputs)

    def require(self) -> None:
        """Raise ``ImportError`` naming what to install when the backend cannot run here."""

    def not_worth_compiling(self, region: GraphModule) -> str | None:
        """Why a region of supported nodes is better left in PyTorch, or None to compile it."""
        return None

    def differences(self, region: GraphModule) -> tuple[str, ...]:
        """What the backend computes otherwise than PyTorch in ``region`` on purpose, a
        sentence each (``lower``'s check names them when it fails)."""
        return ()

    def lowering_settings(
        self, *, whole_model: bool, threads: int | None, spinning: bool | None
    ) -> tuple[dict[str, Any], str | None]:
        """Settings for every region of one lowering (``RegionExamples.settings``) and a note
        saying what was chosen; ``whole_model``: one region covers the model. ``threads`` and
        ``spinning`` are ``lower``'s arguments."""
        return {}, None

    def compile_program(
        self, graph_module: GraphModule, example_inputs: list[Any]
    ) -> Callable[..., Any]:
        """What ``fxloom.compile`` runs for one captured graph: by default the graph lowered
        with this backend (its supported regions compiled, the rest run by PyTorch), lowered
        again where a parameter or buffer it may have copied changed (``LoweredProgram``)."""
        return LoweredProgram(self, graph_module, example_inputs)

    def __repr__(self) -> str:
        return f"<backend {self.name!r}>"


class EagerBackend(Backend):
    """PyTorch itself: a region runs as the GraphModule it is (autograd included)."""

    name = "eager"
    trainable = True
    runs_graph_code = True

    def compile(self, region: GraphModule, example_inputs: tuple[Any, ...]) -> nn.Module:
        return region

    def compile_program(
        self, graph_module: GraphModule, example_inputs: list[Any]
    ) -> Callable[..., Any]:
        return graph_module.forward  # the generated code, without nn.Module's call machinery


# name -> backend. ``register_backend`` adds to it; importing a module adds nothing.
BACKENDS: dict[str, Backend] = {"eager": EagerBackend()}
# fxloom's own backends beyond "eager", declared: name -> (module, attribute) of the instance.
# One enters ``BACKENDS`` when first asked for (``get_backend``), or once its module is loaded
# (``saved_module_rules``: a file loaded in a fresh process names the module class, whose
# module brings the backend), so the registry never depends on what was imported before.
_BUILT_IN: dict[str, tuple[str, str]] = {
    "onnxruntime": ("fxloom.lower.onnxruntime_backend", "ONNX_RUNTIME"),
}


def register_backend(backend: Backend, *, replace: bool = False) -> Backend:
    """Make ``backend`` known by its name to ``lower``, ``fxloom.compile``, pipeline stages
    and ``fxloom.save``/``load``; returns it. ``replace=True`` replaces one of the same name."""
    if not isinstance(backend, Backend):
        raise TypeError(f"register_backend takes a Backend instance, got {type(backend).__name__}")
    name = backend.name
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(
            f"{type(backend).__name__}.name must be a name like 'my_backend', got {name!r}"
        )
    if name in BACKENDS and not replace:
        raise ValueError(
            f"a backend named {name!r} is registered already ({BACKENDS[name]!r}); pass "
            "replace=True to replace it"
        )
    for cls in backend.saved_modules:
        owner = _saving_backend(cls)
        if owner is not None and owner.name != name:
            raise ValueError(
                f"{cls.__qualname__} is saved by the backend {owner.name!r} already; a module "
                "class has one saving rule"
            )
    BACKENDS[name] = backend
    return backend


def get_backend(name_or_backend: str | Backend) -> Backend:
    """The backend registered under a name (a ``Backend`` is returned as it is)."""
    if isinstance(name_or_backend, Backend):
        return name_or_backend
    named = isinstance(name_or_backend, str)
    if named and name_or_backend in _BUILT_IN:
        _resolve_built_in(name_or_backend)
    found = BACKENDS.get(name_or_backend) if named else None
    if found is None:
        raise ValueError(
            f"no backend {name_or_backend!r}; known: {', '.join(known_backends())}. Write one "
            "(a fxloom.backends.Backend subclass) and register it with "
            "fxloom.backends.register_backend"
        )
    return found


def known_backends() -> list[str]:
    """The names ``get_backend`` knows: those registered and fxloom's own, sorted."""
    return sorted({*BACKENDS, *_BUILT_IN})


def saved_module_rules() -> dict[type, SavedModule]:
    """Every registered backend's module classes and how each is saved (for fxloom.save), the
    declared backends whose module is loaded included."""
    for name, (module_name, _) in _BUILT_IN.items():
        if module_name in sys.modules:
            _resolve_built_in(name)
    return {cls: rule for b in BACKENDS.values() for cls, rule in b.saved_modules.items()}


def _resolve_built_in(name: str) -> None:
    """Enter fxloom's declared backend ``name`` in ``BACKENDS`` (once; one the user registered
    under that name stays)."""
    if name in BACKENDS:
        return
    module_name, attribute = _BUILT_IN[name]
    BACKENDS[name] = getattr(importlib.import_module(module_name), attribute)


_VERSION = operator.attrgetter("_version")


class LoweredProgram:
    """A captured graph lowered with a backend, as ``fxloom.compile`` runs it.

    Calls go to the lowered module's generated ``forward`` (not through nn.Module's call
    machinery). A backend may copy what its regions read from the module (ONNX Runtime keeps
    the weights in its session), so the parameters and buffers the graph reads but does not
    write are checked on every call by their version counters: where one changed in place
    since the graph was lowered (an optimizer step, ``load_state_dict``), the graph is lowered
    again, on the call's inputs, before it runs. A write through ``param.data`` moves no
    counter and is not seen (docs/compile.md).

    A graph that writes into its inputs or the module's state is lowered on copies of the
    inputs, with the module's state put back afterwards: lowering runs the graph several
    times (shapes, regions, a trial run), and the caller's tensors must change once, when the
    entry runs.
    """

    __slots__ = ("lowered", "_backend", "_graph_module", "_forward", "_state", "_versions")

    def __init__(self, backend: Backend, graph_module: GraphModule, example_inputs: list[Any]):
        from fxloom.lower.held_storage import written_state

        self._backend = backend
        self._graph_module = graph_module
        written = written_state(graph_module)
        self._state = tuple(
            tensor
            for tensor in _state_tensors(graph_module)
            if id(tensor) not in written and not tensor.is_inference()  # inference: no counter
        )
        self._lower(example_inputs)

    @property
    def lowering_report(self) -> Any:
        return self.lowered.lowering_report

    def __call__(self, *args: Any) -> Any:
        if tuple(map(_VERSION, self._state)) != self._versions:
            self._lower(list(args))
        return self._forward(*args)

    def _lower(self, inputs: list[Any]) -> None:
        from fxloom.lower.held_storage import writes_held_storage
        from fxloom.lower.lowering import lower

        graph_module, backend = self._graph_module, self._backend
        if not writes_held_storage(graph_module):
            self.lowered = lower(graph_module, tuple(inputs), backend=backend)
        else:
            with _state_kept(graph_module):
                copies = tuple(_private_copies(inputs))
                self.lowered = lower(graph_module, copies, backend=backend)
        self._forward = self.lowered.forward
        self._versions = tuple(map(_VERSION, self._state))  # after: putting state back counts


@contextlib.contextmanager
def _state_kept(module: nn.Module) -> Iterator[None]:
    """Put the values of ``module``'s parameters and buffers (its submodules' included) back
    as they were on leaving."""
    saved = [(tensor, tensor.detach().clone()) for tensor in _state_tensors(module)]
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)


def _state_tensors(module: nn.Module) -> list[torch.Tensor]:
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return [tensor for tensor in tensors.values() if tensor.layout is torch.strided]


def _private_copies(values: list[Any]) -> list[Any]:
    """Copies of the tensors among ``values`` that share storage as the originals do (a view
    and its base stay a view and its base), so a graph that writes into its inputs can run on
    them while it is lowered without changing the caller's tensors."""
    storages: dict[int, Any] = {}

    def copy(value: Any) -> Any:
        if type(value) not in (torch.Tensor, nn.Parameter) or value.layout is not torch.strided:
            return value
        storage = value.untyped_storage()
        key = storage.data_ptr() or id(value)  # an empty storage stands for itself
        copied = storages.get(key)
        if copied is None:
            copied = storages[key] = storage.clone()
        with torch.no_grad():
            made = torch.empty(0, dtype=value.dtype, device=value.device)
            return made.set_(copied, value.storage_offset(), value.size(), value.stride())

    return [copy(value) for value in values]


def _saving_backend(cls: type) -> Backend | None:
    return next((b for b in BACKENDS.values() if cls in b.saved_modules), None)
