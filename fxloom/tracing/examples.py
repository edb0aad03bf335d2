"""Example values for tracing with ``example_inputs``: binding, computing on demand, restoring.

A proxy's example value (``Proxy._fxloom_example``) is what it evaluates to
for the example inputs, with tensors as ``StandIn``s: shapes, dtypes and
devices, no data. Each input's placeholder gets its example and, for a tensor,
a run-time guard on its dtype and rank.

Values are computed on demand (``ExampleRun``): each recorded operation is
queued, and the first read of a value runs the queue up to it, in recording
order, on stand-ins (``MetadataMode``: torch's meta kernels, no compute). Only
a question on data (``bool(x.sum() > 0)``, ``int(x.max())``), or an operation
whose result the metadata cannot tell (``nonzero``, ``.item()``), runs the
queue for real, on copies of the examples, so recorded in-place operations do
not touch the caller's tensors. While either run goes, the trace's patches
stand aside (``patches.Gate``); the module state a run could change (buffer
slots; buffer values and RNG before a real run) is saved, to be put back by
``close``. A program whose tracing never asks about a value runs nothing;
one that asks only about shapes computes nothing real.

Depends on ``fxloom.proxy``, ``fxloom.guards``, ``fxloom.pytree``,
``fxloom.values.stand_in``, ``metadata_mode``, ``patcher`` and ``root_args`` (``PH``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from fxloom.node import Target
from fxloom.proxy import NO_VALUE, PENDING, Attribute, Proxy, TraceError
from fxloom.pytree import tree_map
from fxloom.runtime_checks import check_tensor_input
from fxloom.tracing.patcher import original_module_call
from fxloom.tracing.root_args import PH
from fxloom.values.metadata_mode import MetadataMode, holds_tensor
from fxloom.values.signature import parameters_of
from fxloom.values.stand_in import StandIn

if TYPE_CHECKING:
    from fxloom.tracer import Tracer
    from fxloom.tracing.patches import Gate

__all__ = ["bind_examples", "ExampleRun"]


class Unknown(Exception):
    """Some proxy among the arguments has no example value."""


def _value(leaf: Any) -> Any:
    if isinstance(leaf, Proxy):
        value = leaf._fxloom_example
        if value is NO_VALUE:
            raise Unknown
        return value
    return leaf


def values_of(a: Any) -> Any:
    """``a`` with every proxy replaced by its example value (``Unknown`` if one has none)."""
    return tree_map(_value, a)


def _clone(leaf: Any) -> Any:
    return leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf


def clone_tensors(value: Any) -> Any:
    """Example inputs are cloned for the real run: recorded in-place ops must not change the
    caller's tensors."""
    return tree_map(_clone, value)


def bind_examples(
    fn: Callable[..., Any],
    is_module: bool,
    concrete_args: dict[str, Any] | None,
    example_inputs: tuple[Any, ...] | dict[str, Any] | None,
) -> dict[str, Any] | None:
    """Example inputs by parameter name, as a call ``fn(*tuple)`` or ``fn(**dict)`` binds them.

    A tuple fills the positional parameters not fixed by ``concrete_args``, in
    order, the rest going to ``*args``; names of a dict that are no parameter go
    to ``**kwargs``. Those become ``{"args": (...)}``/``{"kwargs": {...}}``.
    Parameters the examples leave out are no inputs (``root_args``).
    """
    if example_inputs is None:
        return None
    # Not ``values.signature.bind``: on purpose, a tuple of examples skips the parameters
    # ``concrete_args`` fixes, and parameters left out get no default (they are no inputs).
    parameters = parameters_of(fn, skip_first=is_module)
    if isinstance(example_inputs, dict):
        return _bind_by_name(fn, parameters, example_inputs)
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    fixed = {k for k, v in (concrete_args or {}).items() if v is not PH}
    return _bind_by_position(parameters, fixed, tuple(example_inputs))


def _bind_by_name(
    fn: Callable[..., Any], parameters: list[inspect.Parameter], given: dict[str, Any]
) -> dict[str, Any]:
    named = {p.name for p in parameters if p.kind not in _VARIADIC}
    bound = {name: value for name, value in given.items() if name in named}
    extra = {name: value for name, value in given.items() if name not in named}
    if extra:
        stars = _parameter_of_kind(parameters, inspect.Parameter.VAR_KEYWORD)
        if stars is None:
            raise TraceError(
                f"example_inputs names {sorted(extra)}, which are not parameters of "
                f"{getattr(fn, '__qualname__', fn)}; its parameters are "
                f"{[p.name for p in parameters]} (and no **kwargs to take others)"
            )
        bound[stars.name] = extra
    return bound


def _bind_by_position(
    parameters: list[inspect.Parameter], fixed: set[str], given: tuple[Any, ...]
) -> dict[str, Any]:
    names = [p.name for p in parameters if p.name not in fixed and p.kind in _POSITIONAL]
    bound = dict(zip(names, given))
    if len(given) > len(names):
        star = _parameter_of_kind(parameters, inspect.Parameter.VAR_POSITIONAL)
        if star is None:
            raise TraceError(
                f"{len(given)} example inputs given, but only {len(names)} parameters "
                f"({names}) can take them"
            )
        bound[star.name] = given[len(names) :]
    return bound


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _parameter_of_kind(
    parameters: list[inspect.Parameter], kind: inspect._ParameterKind
) -> inspect.Parameter | None:
    return next((p for p in parameters if p.kind is kind), None)


class ModuleState:
    """The module state running the examples could change, put back when tracing ends.

    Which tensor each buffer slot holds is noted when the examples first run
    (a module that assigns a buffer while running must not keep a stand-in);
    buffer values and the RNG state are saved only before the first real run
    (batch norm statistics and dropout in training mode must not change the
    user's model), since stand-ins change no real tensor.
    """

    def __init__(self, root: torch.nn.Module) -> None:
        self.slots = [
            (module, name, buffer)
            for module in root.modules()
            for name, buffer in module._buffers.items()
        ]
        self.values: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.rng: torch.Tensor | None = None

    def save_values(self) -> None:
        self.values = [(b, b.detach().clone()) for _, _, b in self.slots if b is not None]
        self.rng = torch.get_rng_state()

    def restore(self) -> None:
        for module, name, buffer in self.slots:
            if module._buffers.get(name) is not buffer:
                module._buffers[name] = buffer
        if self.values is not None:
            with torch.no_grad():
                for buffer, saved in self.values:
                    buffer.copy_(saved)
            torch.set_rng_state(self.rng)


def _has_stand_in(tensor: torch.Tensor) -> bool:
    """Whether a stand-in can describe ``tensor`` (dense, strided, not quantized)."""
    return tensor.layout is torch.strided and not tensor.is_quantized


# One recorded operation: (its proxy, kind, target, args, kwargs).
Step = tuple[Proxy, str, Target, tuple, dict]


class ExampleRun:
    """The example inputs of one trace, and its recorded operations run on them when first needed.

    ``attach_input`` gives a placeholder its example; ``record`` queues an
    operation (its proxy's value becomes ``PENDING``). Two runs go through the
    queue, each in recording order and only as far as asked:

    - ``value_of``: the stand-in run, on ``StandIn`` tensors in a
      ``MetadataMode`` (shapes, dtypes, devices; no compute). An operation
      whose result depends on data (``nonzero``, ``.item()``), or that fails
      on stand-ins, is computed by the real run instead.
    - ``data_of``: the real run, on copies of the examples, for a value whose
      stand-in holds a tensor (a branch on ``x.sum() > 0``). Its results also
      serve as the stand-in run's values for the operations it ran.

    The module state is noted before the first operation runs and put back by
    ``close``, after which nothing more is recorded or computed (pending
    values stay unknown).
    """

    def __init__(self, tracer: Tracer, inputs: dict[str, Any], gate: Gate) -> None:
        self.tracer = tracer
        self.inputs = inputs  # by parameter name (``bind_examples``)
        self.gate = gate
        self.steps: list[Step | None] = []  # None: done by the real run, forgotten
        self.stand_in_next = 0  # the next step each run does
        self.real_next = 0
        self.placeholders: list[tuple[Proxy, Any]] = []  # given their data at the first real run
        self.mode = MetadataMode()
        self.state: ModuleState | None = None
        self.closed = False

    def attach_input(self, placeholder: Proxy, param: inspect.Parameter) -> None:
        """Give an input's proxy its example value; tensors get a dtype/rank guard."""
        if param.name in self.inputs:
            example = self.inputs[param.name]
        elif param.default is not param.empty:
            example = param.default
        else:
            return
        placeholder._fxloom_value = tree_map(self._stand_in_of_leaf, example)
        self.placeholders.append((placeholder, example))
        if isinstance(example, torch.Tensor):
            self.tracer.create_proxy(
                "call_function",
                check_tensor_input,
                (placeholder, example.dtype, example.dim(), param.name),
                {},
                "guard",
            )

    def _stand_in_of_leaf(self, leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and _has_stand_in(leaf):
            return StandIn.like(leaf)
        return leaf  # a sparse or quantized example: operations on it will run for real

    def record(self, proxy: Proxy, kind: str, target: Target, args: tuple, kwargs: dict) -> None:
        if self.closed:
            return
        if kind == "get_attr":  # read now: the attribute may be reassigned later in forward
            proxy._fxloom_value = proxy._fxloom_data = self.tracer.attribute_value(target)
            return
        proxy._fxloom_value = PENDING
        self.steps.append((proxy, kind, target, args, kwargs))

    # ------------------------------------------------------------ the stand-in run
    def value_of(self, proxy: Proxy) -> Any:
        """``proxy``'s example value, tensors as stand-ins (``NO_VALUE`` if unknown)."""
        if proxy._fxloom_value is not PENDING:
            return proxy._fxloom_value
        if self.closed:  # values not computed while tracing never will be
            return NO_VALUE
        with self._running():
            while proxy._fxloom_value is PENDING:
                with self.mode:  # entered once for many steps: entering costs as much as a step
                    needs_data = self._stand_ins_until(proxy)
                if needs_data is not None:  # outside the mode: real tensors compute for real
                    needs_data._fxloom_value = self._run_real_until(needs_data)
        return proxy._fxloom_value

    def _stand_ins_until(self, proxy: Proxy) -> Proxy | None:
        """Run steps on stand-ins until ``proxy`` has its value, or until a step's result
        needs data (nonzero, .item()) or fails on stand-ins: that step's proxy is returned."""
        steps = self.steps
        while proxy._fxloom_value is PENDING:
            index = max(self.stand_in_next, self.real_next)
            if index >= len(steps):  # a PENDING proxy this run never queued
                proxy._fxloom_value = NO_VALUE
                break
            self.stand_in_next = index + 1
            step = steps[index]
            try:
                step[0]._fxloom_value = self._on_stand_ins(step)
            except TraceError:
                raise
            except Exception:  # DataDependentError, or a failure the real run will explain
                return step[0]
        return None

    def _on_stand_ins(self, step: Step) -> Any:
        try:
            arg_values = values_of(step[3])
            kwarg_values = values_of(step[4])
        except Unknown:
            return NO_VALUE
        return self._apply(step[1], step[2], arg_values, kwarg_values)

    # ----------------------------------------------------------------- the real run
    def data_of(self, proxy: Proxy) -> Any:
        """``proxy``'s example value with real tensors, computed for real only if it holds one."""
        value = self.value_of(proxy)
        if value is NO_VALUE or not holds_tensor(value):
            return value  # a Python value (a size, a dtype, a flag): the stand-ins knew it
        with self._running():
            return self._run_real_until(proxy)

    def _run_real_until(self, proxy: Proxy) -> Any:
        if isinstance(proxy, Attribute):
            return self._attribute_data(proxy)
        if proxy._fxloom_data is not PENDING:
            return proxy._fxloom_data
        if self.closed:
            return NO_VALUE
        if self.state.values is None:
            self._start_real_run()
        steps = self.steps
        while proxy._fxloom_data is PENDING:
            if self.real_next >= len(steps):  # a proxy this run never queued
                return NO_VALUE
            step = steps[self.real_next]
            steps[self.real_next] = None  # both runs are past it now
            self.real_next += 1
            data = self._on_real_values(step)
            step[0]._fxloom_data = data
            if step[0]._fxloom_value is PENDING:
                step[0]._fxloom_value = data
        return proxy._fxloom_data

    def _start_real_run(self) -> None:
        """Save what the real run may change; give the inputs copies of their examples."""
        self.state.save_values()
        for placeholder, example in self.placeholders:
            placeholder._fxloom_data = clone_tensors(example)

    def _attribute_data(self, attribute: Attribute) -> Any:
        root = self._run_real_until(attribute.root)
        if root is NO_VALUE:
            return NO_VALUE
        try:
            return getattr(root, attribute.attr)
        except Exception:  # the recorded program will fail the same way when run
            return NO_VALUE

    def _on_real_values(self, step: Step) -> Any:
        """One recorded operation on the real example values (``NO_VALUE`` if some are unknown)."""
        try:
            arg_values = tree_map(self._data_of_leaf, step[3])
            kwarg_values = tree_map(self._data_of_leaf, step[4])
        except Unknown:
            return NO_VALUE
        try:
            return self._apply(step[1], step[2], arg_values, kwarg_values)
        except TraceError:
            raise
        except Exception as err:
            node = step[0].node
            stack = node.meta.get("nn_module_stack") or {}
            module = f" in module {next(reversed(stack))!r}" if stack else ""
            raise self.tracer.trace_error(
                f"running {node.format_node()}{module} on the example "
                f"inputs failed: {type(err).__name__}: {err}",
                hint="the example inputs must be valid inputs of the model",
                kind=type(err),
            ) from err

    def _data_of_leaf(self, leaf: Any) -> Any:
        if isinstance(leaf, Proxy):
            data = self._run_real_until(leaf) if isinstance(leaf, Attribute) else leaf._fxloom_data
            if data is PENDING or data is NO_VALUE:
                raise Unknown
            return data
        return leaf

    # ------------------------------------------------------------------- both runs
    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """Patches stood aside, no autograd, module state noted for ``close``."""
        if self.state is None:
            self.state = ModuleState(self.tracer.root)
        grad_enabled = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            with self.gate.closed():
                yield
        finally:
            torch.set_grad_enabled(grad_enabled)

    def _apply(self, kind: str, target: Target, args: tuple, kwargs: dict) -> Any:
        if kind == "call_function":
            return target(*args, **kwargs)
        if kind == "call_method":
            return getattr(args[0], target)(*args[1:], **kwargs)
        if kind == "call_module":
            module = self.tracer.module_at(target)
            return original_module_call(module, *args, **kwargs)
        return NO_VALUE

    def close(self) -> None:
        """End of the trace: put the module state back; compute and record nothing more."""
        self.closed = True
        self.steps.clear()
        self.placeholders.clear()
        self.mode = MetadataMode()  # let go of the real tensors the stand-in run read
        if self.state is not None:
            self.state.restore()
