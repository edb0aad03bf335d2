"""Example values for tracing with ``example_inputs``: binding, cloning, reading back.

A proxy's ``value`` is what it evaluates to for the example inputs. These
helpers bind examples to parameters, copy them so recorded in-place operations
do not touch the caller's tensors, replace proxies by their values, and save
and restore the module state that running the examples could change.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from fxloom.proxy import NO_VALUE, Proxy, TraceError

__all__ = ["PH", "Unknown", "values_of", "clone_tensors", "bind_examples", "ModuleState"]


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
