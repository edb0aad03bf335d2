"""Signatures of call targets, for ``normalize``: the parameter each argument of a call binds to.

Where signatures come from, most trusted first:

* ``SIGNATURES`` (users extend it): target -> an ``inspect.Signature``, or a function
  whose signature the target shares (``F.max_pool2d`` dispatches on a flag through a
  ``(*args, **kwargs)`` wrapper to functions that take the same parameters);
* Python functions, methods and module ``forward``s: ``inspect.signature``, exact;
* ``torch.ops`` overloads: their operator schema, exact;
* torch's C++ functions and Tensor methods (``torch.add``, ``Tensor.transpose``): every
  schema of the ATen operator of the same name. These are candidates: the Python binding
  may rename, hide or add signatures. A candidate counts only if the Python binding
  accepts a call in its keyword form (``Probe``), and ``normalize`` acts only when all
  such candidates agree.

``parameter_names(target)`` answers the simpler question "what is each position called" for
formulas that read arguments by name (``fxloom.ops.flops``), whatever the spelling.

Depends on: torch (operator schemas, ``TorchFunctionMode`` for probing) and
``fxloom.ops.identity``. No ``torch.jit``.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from fxloom.ops.identity import op_key

__all__ = [
    "SIGNATURES",
    "parameter_names",
    "UNKNOWN",
    "Candidate",
    "Probe",
    "function_candidates",
    "method_candidates",
    "module_signature",
    "FORWARD_BINDING_CALLS",
    "BUILTIN_CALLABLE_TYPES",
]

# ``__call__`` implementations that bind their arguments to ``forward`` unchanged (a module
# class with any other ``__call__`` has no known signature). GraphModule adds its own, which
# only annotates errors, when it is defined: this package sits below the IR and imports none of it.
FORWARD_BINDING_CALLS: set[Callable[..., Any]] = {nn.Module.__call__}

# target -> Signature, or a function with the same signature. Checked first.
SIGNATURES: dict[Any, inspect.Signature | Callable[..., Any]] = {
    F.max_pool1d: F.max_pool1d_with_indices,
    F.max_pool2d: F.max_pool2d_with_indices,
    F.max_pool3d: F.max_pool3d_with_indices,
    F.adaptive_max_pool1d: F.adaptive_max_pool1d_with_indices,
    F.adaptive_max_pool2d: F.adaptive_max_pool2d_with_indices,
    F.adaptive_max_pool3d: F.adaptive_max_pool3d_with_indices,
    F.fractional_max_pool2d: F.fractional_max_pool2d_with_indices,
    F.fractional_max_pool3d: F.fractional_max_pool3d_with_indices,
}

# Callables implemented in C (``torch.relu``, ``torch.Tensor.add``, ``x.__add__``): no Python
# code, and often no signature ``inspect`` can read.
BUILTIN_CALLABLE_TYPES = (
    types.BuiltinFunctionType,  # also types.BuiltinMethodType
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
)


@dataclass(frozen=True)
class Candidate:
    """One signature a call may bind to.

    ``types``: the schema type of each parameter (``"Tensor"``, ``"Optional[int]"``...)
    for candidates read from operator schemas that the Python binding may not follow;
    ``None`` for exact signatures.
    """

    signature: inspect.Signature
    types: dict[str, str] | None = None
    # The operator schema it was read from (``torch._C.FunctionSchema``), if any.
    schema: Any = None


class _Accepted(Exception):
    """Raised by the probing mode once the Python binding has accepted a call's arguments."""


class _ProbeMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        raise _Accepted


class Probe:
    """Asks torch's Python binding whether it accepts arguments, without running anything.

    The binding parses arguments before it hands the call to a ``__torch_function__``
    mode; this mode stops the call right there.
    """

    def __init__(self, call: Callable[..., Any], receiver: bool) -> None:
        self._call = call
        self._receiver = receiver  # a Tensor method: a dummy tensor goes first

    def accepts(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if self._receiver:
            args = (dummy_tensor(), *args)
        try:
            with _ProbeMode():
                self._call(*args, **kwargs)
        except _Accepted:
            return True
        except Exception:  # the binding refused these arguments (TypeError, mostly)
            return False
        return False  # ran without reaching torch: not a call we understand


_DUMMY: list[torch.Tensor] = []


def dummy_tensor() -> torch.Tensor:
    """A tiny tensor standing for a tensor argument while probing."""
    if not _DUMMY:
        _DUMMY.append(torch.empty(0))
    return _DUMMY[0]


# --------------------------------------------------------------- lookup
def function_candidates(target: Any) -> tuple[list[Candidate], Probe | None] | None:
    """Candidate signatures of a ``call_function`` target and, for C++ ones, a probe."""
    if _in_table(target):
        return [Candidate(_table_signature(target))], None
    if isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        return [Candidate(schema_signature(schema, self_name="self"), schema=schema)], None
    if isinstance(target, (type, torch._ops.OpOverloadPacket)):
        return None  # constructors and unresolved overload packets: left alone
    if not isinstance(target, BUILTIN_CALLABLE_TYPES):
        signature = _python_signature(target)
        return ([Candidate(signature)], None) if signature is not None else None
    if not getattr(target, "__module__", "").startswith("torch"):
        return None  # a C builtin of Python or another library: no schema to go by
    candidates = _aten_candidates(target.__name__, drop_self=False)
    return (candidates, Probe(target, receiver=False)) if candidates else None


def method_candidates(name: str) -> tuple[list[Candidate], Probe | None] | None:
    """Candidate signatures of Tensor method ``name`` (without ``self``), and a probe."""
    method = getattr(torch.Tensor, name, None)
    if method is None:
        return None
    if not isinstance(method, BUILTIN_CALLABLE_TYPES):
        signature = _python_signature(method)
        if signature is None or not signature.parameters:
            return None
        parameters = list(signature.parameters.values())[1:]  # drop self
        return [Candidate(signature.replace(parameters=parameters))], None
    candidates = _aten_candidates(name, drop_self=True)
    return (candidates, Probe(method, receiver=True)) if candidates else None


def module_signature(module: nn.Module) -> inspect.Signature | None:
    """The signature calls of ``module`` bind to, if they bind to ``forward`` alone.

    ``None`` for modules with forward hooks (hooks see the positional arguments, so moving
    them to keywords would change what hooks get) and modules with their own ``__call__``.
    """
    if type(module).__call__ not in FORWARD_BINDING_CALLS:
        return None
    if module._forward_hooks or module._forward_pre_hooks or _global_module_hooks():
        return None
    return _python_signature(module.forward)


def _global_module_hooks() -> bool:
    state = nn.modules.module
    hooks = ("_global_forward_hooks", "_global_forward_pre_hooks")
    return any(getattr(state, name, None) for name in hooks)


def _in_table(target: Any) -> bool:
    try:
        return target in SIGNATURES
    except TypeError:
        return False


def _table_signature(target: Any) -> inspect.Signature:
    entry = SIGNATURES[target]
    return entry if isinstance(entry, inspect.Signature) else inspect.signature(entry)


def _python_signature(target: Any) -> inspect.Signature | None:
    try:
        # Not following __wrapped__: a wrapper's own parameters are what it accepts.
        return inspect.signature(target, follow_wrapped=False)
    except (TypeError, ValueError):
        return None


_PARAMETER_NAMES: dict[Any, tuple[str, ...]] = {}


def parameter_names(target: Any) -> tuple[str, ...]:
    """The names of ``target``'s parameters, in order (cached): an ATen overload's schema, a
    Python function's signature, or else (a torch builtin) the schema of its ATen operator."""
    try:
        return _PARAMETER_NAMES[target]
    except KeyError:
        found = _PARAMETER_NAMES[target] = _read_parameter_names(target)
        return found
    except TypeError:  # unhashable
        return ()


def _read_parameter_names(target: Any) -> tuple[str, ...]:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return tuple(argument.name for argument in schema.arguments)
    signature = _table_signature(target) if _in_table(target) else _python_signature(target)
    parameters = signature.parameters.values() if signature is not None else ()
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if named:
        return tuple(named)
    key = op_key(target)
    packet = getattr(torch.ops.aten, key.name, None) if key is not None else None
    overloads = packet.overloads() if packet is not None else ()
    if not overloads:
        return ()
    overload = "default" if "default" in overloads else overloads[0]
    return tuple(argument.name for argument in getattr(packet, overload)._schema.arguments)


# --------------------------------------------------------------- schemas
_SCHEMA_CACHE: dict[tuple[str, bool], list[Candidate]] = {}


def _aten_candidates(name: str, drop_self: bool) -> list[Candidate]:
    key = (name, drop_self)
    cached = _SCHEMA_CACHE.get(key)
    if cached is None:
        cached = _SCHEMA_CACHE[key] = list(_read_aten_candidates(name, drop_self))
    return cached


def _read_aten_candidates(name: str, drop_self: bool):  # noqa: ANN202 - a generator
    try:
        packet = getattr(torch.ops.aten, name)
        overloads = packet.overloads()
    except (AttributeError, RuntimeError):
        return
    for overload in overloads:
        schema = getattr(packet, overload)._schema
        arguments = schema.arguments
        if drop_self:
            if not arguments or arguments[0].name != "self":
                continue  # not a method of its first argument
            arguments = arguments[1:]
        try:
            signature = schema_signature(schema, self_name="input", arguments=arguments)
        except ValueError:  # a schema Python cannot express as a signature
            continue
        types = {a.name if a.name != "self" else "input": _type_name(a) for a in arguments}
        yield Candidate(signature, types, schema)


def _type_name(argument: Any) -> str:
    return str(getattr(argument, "real_type", argument.type))


def schema_signature(
    schema: Any, self_name: str, arguments: list[Any] | None = None
) -> inspect.Signature:
    """An ``inspect.Signature`` for an operator schema; ``self`` is called ``self_name``.

    (Torch's Python functions call the schemas' ``self`` argument ``input``.)
    """
    parameters = []
    for argument in schema.arguments if arguments is None else arguments:
        name = self_name if argument.name == "self" else argument.name
        kind = inspect.Parameter.KEYWORD_ONLY if argument.kwarg_only else _POSITIONAL
        default = argument.default_value if argument.has_default_value() else _EMPTY
        parameters.append(inspect.Parameter(name, kind, default=default))
    return inspect.Signature(parameters)


_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_EMPTY = inspect.Parameter.empty


# --------------------------------------------------------------- dummies
UNKNOWN = object()  # no stand-in value is known for a schema type

# Schema type -> a value of that type the Python binding accepts, for probing.
_DUMMY_VALUES: dict[str, Any] = {
    "int": 1,
    "float": 1.0,
    "number": 1,
    "bool": False,
    "str": "",
    "ScalarType": torch.float32,
    "Layout": torch.strided,
    "Device": torch.device("cpu"),
    "MemoryFormat": torch.contiguous_format,
}


def dummy_for(schema_type: str) -> Any:
    """A stand-in value of ``schema_type`` for probing (``UNKNOWN`` if none is known)."""
    if schema_type.startswith("Optional[") and schema_type.endswith("]"):
        schema_type = schema_type[len("Optional[") : -1]
    if schema_type == "Tensor":
        return dummy_tensor()
    if schema_type.startswith("List[") and schema_type.endswith("]"):
        item = dummy_for(schema_type[len("List[") : -1])
        return UNKNOWN if item is UNKNOWN else [item]
    return _DUMMY_VALUES.get(schema_type, UNKNOWN)


def element_type(schema_type: str) -> str | None:
    """``X`` for ``List[X]`` or ``Optional[List[X]]``; ``None`` for other types."""
    if schema_type.startswith("Optional[") and schema_type.endswith("]"):
        schema_type = schema_type[len("Optional[") : -1]
    if schema_type.startswith("List[") and schema_type.endswith("]"):
        return schema_type[len("List[") : -1]
    return None


def is_tensor_type(schema_type: str) -> bool:
    """Whether a parameter of this schema type takes tensors (or lists of them)."""
    return "Tensor" in schema_type
