"""Example values for tracing with ``example_inputs``: binding, computing on demand, restoring.

A proxy's ``value`` is what it evaluates to for the example inputs. The
inputs are bound to the root's parameters and copied, so recorded in-place
operations do not touch the caller's tensors; each input's placeholder gets
its example and, for a tensor, a run-time guard on its dtype and rank.

Values are computed on demand (``ExampleRun``): each recorded operation is
queued, and the first read of a value runs the queue up to it, in recording
order, so side effects happen in the program's order. While it runs, the
trace's patches stand aside (``patches.Gate``) and the module state it could
change (buffers, RNG) is saved, to be put back by ``close``. A program whose
tracing never asks about a value (no control flow on tensors, no ``x.dim()``
outside leaf modules) runs nothing: examples then cost nothing.

Depends on ``fxloom.proxy``, ``fxloom.guards``, ``fxloom.pytree``, ``patcher``
and ``root_args`` (``PH``).
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fxloom.guards import check_tensor_input
from fxloom.node import Target
from fxloom.proxy import NO_VALUE, PENDING, Proxy, TraceError
from fxloom.pytree import tree_map
from fxloom.tracing.patcher import original_module_call
from fxloom.tracing.root_args import PH

if TYPE_CHECKING:
    from fxloom.tracer import Tracer
    from fxloom.tracing.patches import Gate

__all__ = ["bind_examples", "ExampleRun"]


class Unknown(Exception):
    """Some proxy among the arguments has no example value."""


def _value(leaf: Any) -> Any:
    if isinstance(leaf, Proxy):
        value = leaf.value
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
    """Example inputs are cloned: recorded in-place ops must not change the caller's tensors."""
    return tree_map(_clone, value)


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
    """The example inputs of one trace, and its recorded operations run on them when first needed.

    ``attach_input`` gives a placeholder its example; ``record`` queues an
    operation (its proxy's value becomes ``PENDING``); ``value_of`` runs the
    queue in recording order until that proxy has its value. The module state
    is saved just before the first operation runs and put back by ``close``,
    after which nothing more is recorded or computed (pending values stay unknown).
    """

    def __init__(self, tracer: Tracer, inputs: dict[str, Any], gate: Gate) -> None:
        self.tracer = tracer
        self.inputs = inputs  # by parameter name (``bind_examples``)
        self.gate = gate
        self.queue: deque[tuple[Proxy, str, Target, tuple, dict]] = deque()
        self.saved_state: ModuleState | None = None
        self.closed = False

    def attach_input(self, placeholder: Proxy, param: inspect.Parameter) -> None:
        """Give an input's proxy its example value; tensors get a dtype/rank guard."""
        if param.name in self.inputs:
            example = clone_tensors(self.inputs[param.name])
        elif param.default is not param.empty:
            example = param.default
        else:
            return
        placeholder.value = example
        if isinstance(example, torch.Tensor):
            self.tracer.create_proxy(
                "call_function",
                check_tensor_input,
                (placeholder, example.dtype, example.dim(), param.name),
                {},
                "guard",
            )

    def record(self, proxy: Proxy, kind: str, target: Target, args: tuple, kwargs: dict) -> None:
        if self.closed:
            return
        if kind == "get_attr":  # read now: the attribute may be reassigned later in forward
            proxy._value = self.tracer.attribute_value(target)
            return
        proxy._value = PENDING
        self.queue.append((proxy, kind, target, args, kwargs))

    def value_of(self, proxy: Proxy) -> Any:
        if proxy._value is not PENDING:
            return proxy._value
        if self.closed:  # values not computed while tracing never will be
            return NO_VALUE
        if self.saved_state is None:
            self.saved_state = ModuleState(self.tracer.root)
        queue = self.queue
        grad_enabled = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            with self.gate.closed():
                while proxy._value is PENDING:
                    if not queue:  # a PENDING proxy this run never queued: nothing to compute
                        proxy._value = NO_VALUE
                        break
                    entry = queue.popleft()
                    entry[0]._value = self._run(*entry)
        finally:
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
                kind=type(err),
            ) from err

    def close(self) -> None:
        """End of the trace: put the module state back; compute and record nothing more."""
        self.closed = True
        self.queue.clear()
        if self.saved_state is not None:
            self.saved_state.restore()
