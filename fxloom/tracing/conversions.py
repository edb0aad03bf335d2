"""Turning a proxy into a Python value: ``bool``, ``len``, ``int``/``float``/index, iteration.

A traced value has no Python value while tracing. Without example inputs
these conversions are refused with an error naming the line and a fix; with
them, the example's value is used and a run-time guard is recorded that raises
if another input would come out differently. Sizes come from the stand-ins
(``len(x)``, ``int(x.shape[0])``, a loop over rows); only a value that holds
a tensor (``bool(x.sum() > 0)``) is computed for real (``Tracer.example_data``).
Unpacking into a fixed number of names (``a, b = x.shape``) needs no value:
the count is read from the caller's bytecode and guarded. ``Tracer.to_bool``,
``length``, ``to_python`` and ``iter`` delegate here.

Depends on ``fxloom.proxy``, ``fxloom.guards`` and ``frames``.
"""

from __future__ import annotations

import dis
import types
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from fxloom.guards import SPECIALIZATION_GUARDS, check_length
from fxloom.proxy import NO_VALUE, PENDING, Proxy
from fxloom.values.frames import short_location, user_frame

if TYPE_CHECKING:
    from fxloom.tracer import Tracer

__all__ = ["to_bool", "length", "to_python", "iterate"]


def to_bool(tracer: Tracer, obj: Proxy) -> bool:
    """``bool(obj)``: the example's branch under a guard, refused without examples."""
    value = obj._fxloom_example
    if value is NO_VALUE:
        raise tracer.trace_error(
            "symbolically traced variables cannot be used as inputs to control flow",
            hint=(
                "to keep both branches, write fxloom.cond(pred, true_fn, false_fn, operands); "
                "for a test on sizes (x.shape[0] > 4), fxloom.export.export with "
                "dynamic_shapes keeps it symbolic; else make the module doing this a leaf "
                "(Tracer.is_leaf_module), wrap the function (fxloom.wrap), fix its input with "
                "concrete_args, trace with autoleaf=True, or pass example_inputs so the branch "
                "is specialised under a run-time guard"
            ),
        )
    if isinstance(value, (tuple, list, dict)):  # whether it is empty: the stand-ins know
        return _specialize(tracer, obj, bool, value)
    return _specialize(tracer, obj, bool, tracer.example_data(obj))


def length(tracer: Tracer, obj: Proxy) -> int:
    """``len(obj)``: a rank or a tuple's arity as it is, else the example's length under a guard."""
    value = obj._fxloom_example
    if value is NO_VALUE:
        raise tracer.trace_error(
            "'len' is not supported in symbolic tracing by default. If you want this call "
            "to be recorded, please call fxloom.wrap('len') at module scope",
            hint="use x.size(dim) / x.shape[dim], which are recorded, or pass example_inputs",
        )
    if isinstance(value, (torch.Size, tuple, list)):  # a rank or a tuple's arity: fixed
        return len(value)
    return _specialize(tracer, obj, len, value)  # a tensor's length is a size: no data needed


def to_python(tracer: Tracer, obj: Proxy, convert: Callable[[Any], Any]) -> Any:
    """``convert(obj)`` (``int``, ``float``, ``operator.index``): the example's value under a guard."""
    if obj._fxloom_example is NO_VALUE:
        kind = {int: "int", float: "float"}.get(convert, "an index (int)")
        raise tracer.trace_error(
            f"a traced value (%{obj.node.name}) cannot be converted to {kind} during "
            "symbolic tracing: its value is only known when the traced code runs",
            hint="keep it a tensor/size expression, fix it with concrete_args, or pass "
            "example_inputs to specialise on it under a run-time guard",
            kind=TypeError,  # what Python raises for int(obj) where obj has no __int__
        )
    return _specialize(tracer, obj, convert, tracer.example_data(obj))


def iterate(tracer: Tracer, obj: Proxy) -> Iterator[Proxy]:
    """``iter(obj)``: unpacking of a known length works, loops need the examples."""
    if obj._fxloom_value is PENDING:
        # ``a, b = x.shape``: the unpacking says how many, under a guard, without
        # running the examples up to here.
        count = unpack_length(user_frame())
        if count is not None:
            _check_unpack(tracer, obj, count)
            return iter([obj[i] for i in range(count)])
    value = obj._fxloom_example
    if value is not NO_VALUE:
        if isinstance(value, (tuple, list)):  # e.g. x.unbind(0): arity follows a size
            _check_unpack(tracer, obj, len(value))
            return iter([obj[i] for i in range(len(value))])
        if isinstance(value, torch.Size):  # the rank, fixed by the input guards
            return iter([obj[i] for i in range(len(value))])
        return _iterate_rows(tracer, obj, value)
    count = unpack_length(user_frame())
    if count is not None:
        _check_unpack(tracer, obj, count)
        return iter([obj[i] for i in range(count)])
    variadic = _variadic_parameter(obj)
    if variadic is not None:
        raise tracer.trace_error(
            f"{variadic} cannot be expanded or iterated: the root's {variadic} is traced as "
            "one input whose entries are unknown while tracing",
            hint=f"index it ({variadic.lstrip('*')}[0]), or trace with fixed entries: "
            + _VARIADIC_CONCRETE_ARGS[variadic.startswith("**")].format(variadic.lstrip("*")),
        )
    raise tracer.trace_error(
        "Proxy object cannot be iterated: the number of elements of a traced value is "
        "unknown while tracing",
        hint="unpack into a fixed number of names (a, b = x.chunk(2)), index explicitly, "
        "or pass example_inputs",
    )


# How to give a root's *args (False) or **kwargs (True) fixed entries.
_VARIADIC_CONCRETE_ARGS = {
    False: "concrete_args={{'{0}': (PH, PH)}} for two positional inputs",
    True: "concrete_args={{'{0}': {{'bias': PH}}}} for a keyword input 'bias'",
}


def _variadic_parameter(obj: Proxy) -> str | None:
    """``"*args"``/``"**kwargs"`` if ``obj`` is the root's variadic input (or its keys/values/items)."""
    if type(obj) is not Proxy:
        return None
    node = obj.node
    if node.op == "call_method" and node.target in ("keys", "values", "items") and node.args:
        node = node.args[0]
    target = getattr(node, "target", None)
    if getattr(node, "op", None) == "placeholder" and str(target).startswith("*"):
        return str(target)
    return None


def _specialize(tracer: Tracer, obj: Proxy, convert: Callable[[Any], Any], value: Any) -> Any:
    """``convert(value)`` (``obj``'s example value), plus a graph guard that it stays so at run
    time. ``value`` has real tensors where ``convert`` reads data (``bool``, ``int``), stand-ins
    are enough where it reads a size (``len``)."""
    guard = SPECIALIZATION_GUARDS.get(convert)
    if guard is None:
        raise TypeError(
            f"no run-time guard for specialising on {convert!r}; register one in "
            "fxloom.guards.SPECIALIZATION_GUARDS (conversion -> check(value, expected, where))"
        )
    expected = convert(value)
    where = short_location(user_frame())
    tracer.create_proxy("call_function", guard, (obj, expected, where), {}, "guard")
    return expected


def _check_unpack(tracer: Tracer, obj: Proxy, count: int) -> None:
    # A node, not a proxy (create_node): torch.fx records no check here, so a client that
    # lists what passes through create_proxy (torchvision's node names) sees torch.fx's nodes.
    where = short_location(user_frame())
    tracer.create_node("call_function", check_length, (obj.node, count, where), {}, "guard")


def _iterate_rows(tracer: Tracer, obj: Proxy, value: Any) -> Iterator[Proxy]:
    """Rows of a tensor, lazily: only a loop that runs to the end depends on the length,
    so only then is a guard on it recorded (code that peeks at the first row does not)."""
    for i in range(len(value)):
        yield obj[i]
    _specialize(tracer, obj, len, value)


# Weak: generated forwards come and go, their code objects must not be kept alive here.
_instructions_by_code: weakref.WeakKeyDictionary[types.CodeType, dict[int, dis.Instruction]] = (
    weakref.WeakKeyDictionary()
)


def unpack_length(frame: types.FrameType | None) -> int | None:
    """If ``frame`` is executing ``a, b, ... = <value>``, the number of targets."""
    if frame is None:
        return None
    code = frame.f_code
    instructions = _instructions_by_code.get(code)
    if instructions is None:
        instructions = {inst.offset: inst for inst in dis.get_instructions(code)}
        _instructions_by_code[code] = instructions
    inst = instructions.get(frame.f_lasti)  # a byte offset, like Instruction.offset
    if inst is not None and inst.opname == "UNPACK_SEQUENCE":
        return inst.argval
    return None
