"""Example values for tracing with ``example_inputs``: binding, computing, reading back.

A proxy's ``value`` is what it evaluates to for the example inputs. These
helpers bind examples to parameters, copy them so recorded in-place operations
do not touch the caller's tensors, replace proxies by their values, and save
and restore the module state that running the examples could change.

Values are computed on demand (``ExampleRun``): each recorded operation is
queued, and the first read of a value runs the queue up to it, in recording
order, so side effects happen in the program's order. A program whose tracing
never asks about a value (no control flow on tensors, no ``x.dim()`` outside
leaf modules) runs nothing: examples then cost nothing.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fxloom._patching import original_module_call
from fxloom.node import Target
from fxloom.proxy import NO_VALUE, PENDING, Proxy, TraceError

if TYPE_CHECKING:
    from fxloom.tracer import Tracer

__all__ = [
    "PH",
    "Unknown",
    "values_of",
    "clone_tensors",
    "bind_examples",
    "ModuleState",
    "ExampleRun",
]


class _PlaceholderMarker:
    """``concrete_args={"x": PH}`` keeps ``x`` an input while other arguments are fixed."""

    def __repr__(self) -> str:
        return "PH"


PH = _PlaceholderMarker()


class Unknown(Exception):
    """Some proxy among the arguments has no example value."""


def values_of(a: Any) -> Any:
    """``a`` with every proxy replaced by its example value."""
    if isinstance(a, Proxy):
        if a.value is NO_VALUE:
            raise Unknown
        return a.value
    t = type(a)
    if t is tuple or t is list:
        return t(values_of(x) for x in a)
    if isinstance(a, dict):
        return {k: values_of(v) for k, v in a.items()}
    if isinstance(a, tuple) and hasattr(a, "_fields"):
        return t(*(values_of(x) for x in a))
    if t is slice:
        return slice(values_of(a.start), values_of(a.stop), values_of(a.step))
    return a


def clone_tensors(value: Any) -> Any:
    """Example inputs are cloned: recorded in-place ops must not change the caller's tensors."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if type(value) in (tuple, list):
        return type(value)(clone_tensors(v) for v in value)
    if type(value) is dict:
        return {k: clone_tensors(v) for k, v in value.items()}
    return value


def bind_examples(
    fn: Callable[..., Any],
    is_module: bool,
    concrete_args: dict[str, Any] | None,
    example_inputs: tuple[Any, ...] | dict[str, Any] | None,
) -> dict[str, Any] | None:
    """Example inputs by parameter name (positional ones fill the non-fixed parameters in order)."""
    if example_inputs is None:
        return None
    if isinstance(example_inputs, dict):
        return dict(example_inputs)
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    fixed = {k for k, v in (concrete_args or {}).items() if v is not PH}
    parameters = list(inspect.signature(fn).parameters.values())[1 if is_module else 0 :]
    names = [
        p.name
        for p in parameters
        if p.name not in fixed and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(example_inputs) > len(names):
        raise TraceError(
            f"{len(example_inputs)} example inputs given, but only {len(names)} parameters "
            f"({names}) can take them"
        )
    return dict(zip(names, example_inputs))


class ModuleState:
    """Buffers and RNG state, saved before tracing with example inputs and put back after.

    Running the examples through modules in training mode (batch norm
    statistics, dropout) must not change the user's model.
    """

    def __init__(self, root: torch.nn.Module) -> None:
        self.buffers = [(b, b.detach().clone()) for b in root.buffers() if b is not None]
        self.rng = torch.get_rng_state()

    def restore(self) -> None:
        with torch.no_grad():
            for buffer, saved in self.buffers:
                buffer.copy_(saved)
        torch.set_rng_state(self.rng)


class ExampleRun:
    """The recorded operations of one trace, run on the example values when first needed.

    ``record`` queues an operation (its proxy's value becomes ``PENDING``);
    ``value_of`` runs the queue in recording order until that proxy has its
    value. The module state is saved just before the first operation runs and
    put back by ``restore`` after tracing.
    """

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.queue: deque[tuple[Proxy, str, Target, tuple, dict]] = deque()
        self.saved_state: ModuleState | None = None

    def record(self, proxy: Proxy, kind: str, target: Target, args: tuple, kwargs: dict) -> None:
        if kind == "get_attr":  # read now: the attribute may be reassigned later in forward
            proxy._value = self.tracer.attribute_value(target)
            return
        proxy._value = PENDING
        self.queue.append((proxy, kind, target, args, kwargs))

    def value_of(self, proxy: Proxy) -> Any:
        if proxy._value is not PENDING:
            return proxy._value
        tracer = self.tracer
        if self.saved_state is None:
            self.saved_state = ModuleState(tracer.root)
        queue = self.queue
        grad_enabled = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        tracer._computing_value = True
        try:
            while proxy._value is PENDING:
                if not queue:  # a PENDING proxy this run never queued: nothing to compute
                    proxy._value = NO_VALUE
                    break
                entry = queue.popleft()
                entry[0]._value = self._run(*entry)
        finally:
            tracer._computing_value = False
            torch.set_grad_enabled(grad_enabled)
        return proxy._value

    def _run(self, proxy: Proxy, kind: str, target: Target, args: tuple, kwargs: dict) -> Any:
        """One recorded operation on the example values (``NO_VALUE`` if some are unknown)."""
        try:
            arg_values = values_of(args)
            kwarg_values = values_of(kwargs)
        except Unknown:
            return NO_VALUE
        try:
            if kind == "call_function":
                return target(*arg_values, **kwarg_values)
            if kind == "call_method":
                return getattr(arg_values[0], target)(*arg_values[1:], **kwarg_values)
            if kind == "call_module":
                module = self.tracer.module_at(target)
                return original_module_call(module, *arg_values, **kwarg_values)
            return NO_VALUE
        except TraceError:
            raise
        except Exception as err:
            node = proxy.node
            stack = node.meta.get("nn_module_stack") or {}
            module = f" in module {next(reversed(stack))!r}" if stack else ""
            raise self.tracer.trace_error(
                f"running {node.format_node()}{module} on the example "
                f"inputs failed: {type(err).__name__}: {err}",
                hint="the example inputs must be valid inputs of the model",
            ) from err

    def restore(self) -> None:
        if self.saved_state is not None:
            self.saved_state.restore()
