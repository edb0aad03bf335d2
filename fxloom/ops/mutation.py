"""What a call writes to: in-place operators, in-place names, mutating overloads, side effects.

The rules, each written once here and read by ``Node.is_impure``, the passes (``dce``,
``cse``, ``const_fold``, ``cost``, ``schedule``), and next functionalization and quantization:

* **Python operators.** The augmented ones (``x += y``: ``operator.iadd``, from the table in
  ``fxloom.ops.python_operators``) write to their first argument; so do ``setitem``,
  ``delitem``, ``setattr`` and ``delattr`` (``WRITES_FIRST_ARGUMENT``). Every other operator
  is pure, whatever its name (``operator.and_`` ends in ``_`` only to dodge a keyword).
* **Names.** A method or function whose name ends in one ``_`` updates its first argument in
  place and returns it (``x.add_(y)``, ``torch.relu_(x)``); dunders (``__add__``) and private
  names (``_helper_``) do not count (``fxloom.ops.identity.is_inplace_name``; the operator a
  torch spelling updates with is its ``op_key``: ``op_key("add_") == OpKey("add", True)``).
* **torch.ops overloads** say it in their schema: ``schema_is_mutable``, and which arguments
  they write (``schema_written_arguments``) or return views of (``schema_aliased_arguments``);
  ``bound_mutable_schema`` finds the schema a call of a torch function binds to, if mutable.
* **Keywords.** A call given ``out=`` writes into it; ``inplace=True`` writes its input.
* **Attributes.** A callable or module with a true ``_is_impure`` attribute has side effects;
  a module with ``inplace=True`` writes its input.
* **fxloom's run-time functions** (guards, input and size checks: ``fxloom.ops.runtime_functions``)
  say their effect in their row: a check is kept and writes nothing.
* **Registered functions.** ``SIDE_EFFECT_FUNCTIONS`` holds the functions dead-code
  elimination keeps although their results are unused; ``has_side_effect`` adds one. Of
  those, ``READ_ONLY_EFFECTS`` write to no value of the program (printing, checks, seeding)
  and ``WRITES_FIRST_ARGUMENT`` to their first argument only; an effect in neither may write
  to any input.

Extend the sets for your own functions::

    fxloom.has_side_effect(log_activation)   # keep calls to it (any input may be written)
    READ_ONLY_EFFECTS.add(log_activation)    # ... and it writes nothing
    WRITES_FIRST_ARGUMENT.add(fill_cache)    # ... or it writes its first argument only

Depends on: torch, ``fxloom.ops.identity``, ``fxloom.ops.python_operators``,
``fxloom.ops.runtime_functions`` and
``fxloom.ops.signatures``.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable, Container, Mapping
from typing import Any

import torch

from fxloom.ops import state_effects
from fxloom.ops.identity import is_inplace_name
from fxloom.ops.python_operators import PYTHON_OPERATORS
from fxloom.ops.runtime_functions import is_runtime_check
from fxloom.ops.signatures import function_candidates

__all__ = [
    "IN_PLACE_OPERATORS",
    "READ_ONLY_EFFECTS",
    "SIDE_EFFECT_FUNCTIONS",
    "TENSOR_IN_PLACE_OPERATORS",
    "WRITES_FIRST_ARGUMENT",
    "bound_mutable_schema",
    "function_has_side_effect",
    "has_side_effect",
    "is_inplace_function",
    "is_read_only_effect",
    "module_has_side_effect",
    "module_is_inplace",
    "schema_aliased_arguments",
    "schema_is_mutable",
    "schema_is_view",
    "schema_written_arguments",
    "writes_only_first_argument",
    "writes_through_keywords",
]

# ``x += y``: writes to its first argument when that can change (a tensor, a list).
IN_PLACE_OPERATORS = frozenset(
    entry.function for entry in PYTHON_OPERATORS.values() if entry.kind == "augmented"
)
# Those a tensor implements in place, returning itself; torch has no ``__imatmul__``, so
# ``x @= y`` computes ``x @ y`` into a new tensor and rebinds ``x``.
TENSOR_IN_PLACE_OPERATORS = frozenset(
    entry.function
    for entry in PYTHON_OPERATORS.values()
    if entry.kind == "augmented" and hasattr(torch.Tensor, entry.hook)
)

# Impure calls that write to their first argument only.
WRITES_FIRST_ARGUMENT: set[Any] = {
    *IN_PLACE_OPERATORS,
    operator.setitem,
    operator.delitem,
    builtins.setattr,
    builtins.delattr,
}
# ``torch.profiler.record_function`` ranges (packets and overloads): a range opened and never
# closed, or closed and never opened, would break the profile; kept like in torch.fx.
_PROFILER_RANGES = [
    getattr(torch.ops.profiler, name)
    for name in ("_record_function_enter", "_record_function_enter_new", "_record_function_exit")
]
# Impure calls that write to no value of the program: run-time checks, printing, profiling.
READ_ONLY_EFFECTS: set[Any] = {
    builtins.print,
    torch._assert,
    torch.ops.aten._assert_scalar.default,  # exported programs' runtime assertions
    torch.ops.aten._assert_async.msg,
    torch.manual_seed,  # changes the random stream, which random nodes account for
    torch._C._set_grad_enabled,  # grad mode switched inside a graph (a captured `no_grad`)
    state_effects.autocast_on,  # and autocast (a captured `with torch.autocast`)
    state_effects.autocast_back,
    *_PROFILER_RANGES,
    *(getattr(packet, overload) for packet in _PROFILER_RANGES for overload in packet.overloads()),
}
# Calls the dead-code eliminator must keep even when their result is unused.
SIDE_EFFECT_FUNCTIONS: set[Any] = {*WRITES_FIRST_ARGUMENT, *READ_ONLY_EFFECTS}


def has_side_effect(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as impure, so ``eliminate_dead_code`` keeps calls to it.

    Usable as a decorator::

        @fxloom.has_side_effect
        def log_activation(x): ...
    """
    SIDE_EFFECT_FUNCTIONS.add(fn)
    return fn


def _in(table: Container[Any], target: Any) -> bool:
    try:
        return target in table
    except TypeError:  # an unhashable callable: in no table
        return False


# -------------------------------------------------------------------- names
def is_inplace_function(target: Any) -> bool:
    """Whether calling ``target`` updates its first (tensor) argument in place and returns it.

    True for the augmented operators tensors implement (``operator.iadd``) and for functions
    named the in-place way (``torch.relu_``); never for other Python operators, whatever
    their names (``operator.and_``).
    """
    if _in(TENSOR_IN_PLACE_OPERATORS, target):
        return True
    if _in(PYTHON_OPERATORS.keys(), target):
        return False
    return is_inplace_name(getattr(target, "__name__", ""))


# ---------------------------------------------------------------- keywords
def writes_through_keywords(kwargs: Mapping[str, Any]) -> bool:
    """Whether a call's keywords make it write: ``out=`` given, or ``inplace=True``."""
    return "out" in kwargs or kwargs.get("inplace") is True


# ----------------------------------------------------------------- schemas
def schema_is_mutable(target: Any) -> bool:
    """Whether ``target`` is a torch.ops overload whose schema writes to an argument."""
    schema = getattr(target, "_schema", None)
    return schema is not None and bool(getattr(schema, "is_mutable", False))


def bound_mutable_schema(target: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The schema a call of torch function ``target`` binds to, if it writes to an argument.

    Best effort, as torch.fx's ``check_mutable_operations``: an answer only when
    exactly one of the operator's schemas takes these arguments
    (``torch.sigmoid(x, out=y)`` binds ``aten::sigmoid.out`` alone; ``torch.log_(x)``
    has one schema); ``None`` when none or several do, or ``target`` has no schema.
    """
    found = function_candidates(target)
    if found is None:
        return None
    bound = []
    for candidate in found[0]:
        # Not values.signature.bind, on purpose: a misfit is no error, only an overload that
        # does not take these arguments (and ops, the foundation, imports no values layer).
        try:
            candidate.signature.bind(*args, **kwargs)
        except TypeError:
            continue
        bound.append(candidate.schema)
    if len(bound) == 1 and bound[0] is not None and bound[0].is_mutable:
        return bound[0]
    return None


def schema_written_arguments(target: Any) -> tuple[str, ...]:
    """Names of the arguments a torch.ops overload writes to (``("self",)`` for ``add_``)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return ()
    return tuple(
        argument.name
        for argument in schema.arguments
        if argument.alias_info is not None and argument.alias_info.is_write
    )


def schema_aliased_arguments(target: Any) -> tuple[str, ...]:
    """Names of the arguments a torch.ops overload's result may share storage with.

    ``("self",)`` for views (``aten.view``) and for in-place overloads, which return their
    input; ``()`` for overloads returning new tensors.
    """
    schema = getattr(target, "_schema", None)
    if schema is None:
        return ()
    returned: set[str] = set()
    for result in schema.returns:
        if result.alias_info is not None:
            returned.update(result.alias_info.before_set)
    return tuple(
        argument.name
        for argument in schema.arguments
        if argument.alias_info is not None and returned & set(argument.alias_info.before_set)
    )


def schema_is_view(target: Any) -> bool:
    """Whether ``target`` is a torch.ops overload returning a view of an argument, writing none.

    The one schema-level answer to "is a view": the memory estimate (``cost``) and
    functionalization (``export.functionalize``) read it; ``ops.effects.view_kind`` adds the
    torch-level spellings.
    """
    # Any aliased argument counts: list results (``split``'s ``Tensor(a)[]``) carry their
    # alias on the element type, where ``schema_aliased_arguments`` does not look.
    schema = getattr(target, "_schema", None)
    if schema is None or schema.is_mutable:
        return False
    return any(argument.alias_info is not None for argument in schema.arguments)


# ------------------------------------------------------------ side effects
def writes_only_first_argument(op: str, target: Any, kwargs: Mapping[str, Any]) -> bool:
    """For a call known to have side effects: whether it writes to its first argument only.

    In-place methods (a method with side effects is one), ``inplace=True`` calls,
    ``WRITES_FIRST_ARGUMENT`` and in-place functions.
    """
    if op == "call_method" or kwargs.get("inplace") is True:
        return True
    return _in(WRITES_FIRST_ARGUMENT, target) or is_inplace_function(target)


def function_has_side_effect(target: Any) -> bool:
    """Whether a ``call_function`` of ``target`` must be kept although its result is unused.

    Registered functions (``has_side_effect``), fxloom's run-time checks, callables with a
    true ``_is_impure`` attribute, mutating torch.ops overloads and in-place functions (see
    the module).
    """
    # The rules of the helpers above, inlined: dead-code elimination asks this of every
    # call_function node, and a frame per rule costs a third of its time.
    try:
        if target in SIDE_EFFECT_FUNCTIONS:
            return True
        python_operator = target in PYTHON_OPERATORS
    except TypeError:  # an unhashable callable: in no table
        python_operator = False
    if getattr(target, "_is_impure", False):
        return True
    schema = getattr(target, "_schema", None)
    if schema is not None and getattr(schema, "is_mutable", False):
        return True
    if python_operator:  # named by Python's grammar, not the in-place convention
        return target in TENSOR_IN_PLACE_OPERATORS
    if is_inplace_name(getattr(target, "__name__", "")):
        return True
    # Last, and only for fxloom's own objects: its run-time checks (their registry rows).
    module = getattr(target, "__module__", None)
    return type(module) is str and module.startswith("fxloom.") and is_runtime_check(target)


def is_read_only_effect(target: Any) -> bool:
    """Whether ``target``'s side effect writes to no value of the program (``print``)."""
    return _in(READ_ONLY_EFFECTS, target) or is_runtime_check(target)


def module_has_side_effect(module: torch.nn.Module) -> bool:
    """Whether calls of ``module`` must be kept although unused (a true ``_is_impure``)."""
    return bool(getattr(module, "_is_impure", False))


def module_is_inplace(module: torch.nn.Module) -> bool:
    """Whether ``module`` writes its input (``nn.ReLU(inplace=True)``)."""
    return getattr(module, "inplace", False) is True
