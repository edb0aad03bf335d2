"""The fxloom functions that graphs call at run time: one row each, by the name they are saved under.

Captured graphs call a few of fxloom's own functions: guards that check what
tracing assumed, the input checks of traced and exported modules, the size
check of dynamic shapes, ``cond``'s operator. Each has one row in
``RUNTIME_FUNCTIONS`` saying everything the rest of fxloom asks about it:

* ``effect``: ``"check"`` (reads its arguments and raises or not: dead-code
  elimination keeps it, it writes nothing, passes may move it like a pure node)
  or ``"pure"``;
* ``exported``: whether the export verifier allows it in an exported graph;
* ``on_host``: whether lowering and splitting keep it in the root module, on the
  host (a run-time check stays a check of the module's own inputs);
* ``twin``: its TorchScript twin (``fxloom._guards_torchscript``), or None and
  ``no_twin`` saying why;
* ``graph_arguments``: the positions of arguments it calls, which a file may
  only fill with graphs of the same file;
* ``instances``: the row names a class whose *instances* are called
  (``FixedArgument``); those hold Python objects, are never saved, and are
  found by their type;
* ``alias_of``: a name files saved before the function moved; loading resolves
  it to the row it names;
* ``fresh``: its result shares no storage with its arguments, and it writes and
  keeps none of them (so a value read only by such functions has no other alias);
* ``reuses``: ``(position, name)``: the function (``name``) generated code calls
  instead where the argument at ``position`` dies at this call and nothing else
  can see its storage, which may write its result there (``reused_argument``
  says when; ``codegen`` asks).

The table is written out here, not collected by registration, so nothing
imported earlier or later changes what a graph may call or what a pass
concludes: a saved program that uses ``cond`` loads in a fresh process. A
target is matched to its row by its own name, and only if that name leads to
the object itself in its (already imported) module, so no impostor printing
as ``fxloom.guards.check_bool`` gets a row's answers. One query API:
``runtime_function`` (by object), ``runtime_function_named`` (by saved name),
and the questions built on them (``is_runtime_check``, ``stays_on_host``,
``exported_graph_may_call``, ``saved_names``).

A new run-time function (the bytecode frontend's guards, a pipeline split
marker) gets a row here; ``tests/serialize/test_call_table.py`` checks that
every saved row names a function that exists and prints as its name.

Depends on the standard library only (reads ``sys.modules``, imports nothing).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "RUNTIME_FUNCTIONS",
    "RuntimeFunction",
    "exported_graph_may_call",
    "is_runtime_check",
    "returns_fresh",
    "reusing_functions",
    "runtime_function",
    "runtime_function_named",
    "saved_names",
    "stays_on_host",
]

Effect = Literal["check", "pure"]


@dataclass(frozen=True)
class RuntimeFunction:
    """One function graphs call at run time; see the module docstring for each field."""

    name: str
    purpose: str
    effect: Effect = "check"
    exported: bool = False
    on_host: bool = True
    twin: str | None = None
    no_twin: str = ""
    graph_arguments: tuple[int, ...] = ()
    instances: bool = False
    alias_of: str | None = None
    fresh: bool = False
    reuses: tuple[int, str] | None = None


_TWINS = "fxloom._guards_torchscript"
_CHECKS = "fxloom.runtime_checks"
_NOT_SCRIPTED_ROOT = "only *args/**kwargs roots call it, and TorchScript scripts neither"
_NOT_SCRIPTED_EXPORT = "exported modules are not scripted (their graphs are ATen)"
_NOT_SCRIPTED_STAGE = "pipeline stages run under torch.distributed.pipelining, not TorchScript"
_NOT_SCRIPTED_QUANT = (
    "a torch.library operator (torch.ops.fxloom_q): TorchScript calls it there, not here"
)
# fxloom.quantize.ops: its functions (this module imports nothing, so the names are written here);
# each returns new tensors and keeps none of its arguments (``fresh``)
_QUANTIZED_OPERATORS = (
    "quantize",
    "dequantize",
    "choose_qparams",
    "linear_int8",
    "linear_w8",
    "linear_w4",
    "conv2d_int8",
    "conv2d_add_int8",
    "add_int8",
    "mul_int8",
    "max_pool2d_int8",
)
# the fused residual add may write its sum into ``other`` (argument 10: oneDNN's "sum" post-op
# accumulates there), saving a copy of it per call, where generated code never reads it again
_REUSES = {"conv2d_add_int8": (10, "fxloom.quantize.ops.conv2d_add_int8_into_other")}


def _rows(*rows: RuntimeFunction) -> dict[str, RuntimeFunction]:
    return {row.name: row for row in rows}


RUNTIME_FUNCTIONS: dict[str, RuntimeFunction] = _rows(
    # ---- guards of symbolic tracing (fxloom.guards): the conversions a trace specialised on
    RuntimeFunction("fxloom.guards.check_bool", "the branch a traced `if` took", twin=f"{_TWINS}.check_bool"),
    RuntimeFunction("fxloom.guards.check_int", "a value converted with int()", twin=f"{_TWINS}.check_int"),
    RuntimeFunction("fxloom.guards.check_index", "a value used as an index", twin=f"{_TWINS}.check_index"),
    RuntimeFunction("fxloom.guards.check_float", "a value converted with float()", twin=f"{_TWINS}.check_float"),
    RuntimeFunction("fxloom.guards.check_len", "the length of an unpacked value", twin=f"{_TWINS}.check_len"),
    RuntimeFunction("fxloom.guards.check_length", "the length of an iterated value", twin=f"{_TWINS}.check_length"),
    # ---- input checks of traced and exported modules (fxloom.runtime_checks)
    RuntimeFunction(f"{_CHECKS}.check_tensor_input", "a traced input's dtype and rank", twin=f"{_TWINS}.check_tensor_input"),
    RuntimeFunction(f"{_CHECKS}.check_fixed", "a concrete_args literal", twin=f"{_TWINS}.check_fixed"),
    RuntimeFunction(f"{_CHECKS}.check_variadic_length", "the number of *args", no_twin=_NOT_SCRIPTED_ROOT),
    RuntimeFunction(f"{_CHECKS}.check_variadic_keys", "the keywords given to **kwargs", no_twin=_NOT_SCRIPTED_ROOT),
    RuntimeFunction(
        f"{_CHECKS}.FixedArgument", "a concrete_args object (held by the instance)", instances=True,
        no_twin="TorchScript compiles no callable object from a forward's globals",
    ),
    RuntimeFunction(
        f"{_CHECKS}.FlattenedInput", "a concrete_args structure with PH leaves", instances=True,
        no_twin="TorchScript compiles no callable object from a forward's globals",
    ),
    RuntimeFunction(f"{_CHECKS}.check_tensor", "an exported input's shape and dtype", no_twin=_NOT_SCRIPTED_EXPORT),
    RuntimeFunction(f"{_CHECKS}.check_value", "an exported non-tensor input", no_twin=_NOT_SCRIPTED_EXPORT),
    RuntimeFunction(f"{_CHECKS}.flatten_inputs", "exported inputs flattened by their tree spec", no_twin=_NOT_SCRIPTED_EXPORT),
    RuntimeFunction("fxloom.values.symbolic.size_checks.check_sizes", "exported inputs' sizes against their ranges", no_twin=_NOT_SCRIPTED_EXPORT),
    # ---- structured control flow: a higher-order operator, computed where the graph runs
    RuntimeFunction(
        "fxloom.cond.cond_op", "the branch a cond node picks at run time", effect="pure",
        exported=True, on_host=False, graph_arguments=(1, 2),
        no_twin="its branches are GraphModules, which TorchScript calls as modules, not functions",
    ),
    # ---- pipeline stage boundaries (fxloom.distributed): what stages send, as tensors
    RuntimeFunction(
        "fxloom.distributed.carried.carry", "numbers a pipeline stage sends on, as one tensor",
        effect="pure", on_host=False, no_twin=_NOT_SCRIPTED_STAGE,
    ),
    RuntimeFunction(
        "fxloom.distributed.carried.uncarry", "numbers a pipeline stage received, rebuilt",
        effect="pure", on_host=False, no_twin=_NOT_SCRIPTED_STAGE,
    ),
    RuntimeFunction(
        "fxloom.pytree.tensor_leaves", "the tensors of a last pipeline stage's output",
        effect="pure", on_host=False, no_twin=_NOT_SCRIPTED_STAGE,
    ),
    # ---- fxloom's quantized operators on plain tensors (fxloom.quantize.ops, torch.ops.fxloom_q)
    *(
        RuntimeFunction(
            f"fxloom.quantize.ops.{name}", "a quantized operator on plain integer tensors",
            effect="pure", exported=True, on_host=False, no_twin=_NOT_SCRIPTED_QUANT,
            fresh=True, reuses=_REUSES.get(name),
        )
        for name in _QUANTIZED_OPERATORS
    ),
    # ---- names saved by earlier releases, before the input checks moved to one module
    RuntimeFunction("fxloom.guards.check_tensor_input", "saved name", alias_of=f"{_CHECKS}.check_tensor_input"),
    RuntimeFunction("fxloom.guards.check_fixed", "saved name", alias_of=f"{_CHECKS}.check_fixed"),
    RuntimeFunction("fxloom.guards.check_variadic_length", "saved name", alias_of=f"{_CHECKS}.check_variadic_length"),
    RuntimeFunction("fxloom.guards.check_variadic_keys", "saved name", alias_of=f"{_CHECKS}.check_variadic_keys"),
    RuntimeFunction("fxloom.export.input_checks.check_tensor", "saved name", alias_of=f"{_CHECKS}.check_tensor"),
    RuntimeFunction("fxloom.export.input_checks.check_value", "saved name", alias_of=f"{_CHECKS}.check_value"),
    RuntimeFunction("fxloom.export.input_checks.flatten_inputs", "saved name", alias_of=f"{_CHECKS}.flatten_inputs"),
    # ---- before the size files moved under fxloom/values/symbolic (issue 23)
    RuntimeFunction("fxloom.export.size_checks.check_sizes", "saved name", alias_of="fxloom.values.symbolic.size_checks.check_sizes"),
)  # fmt: skip


# ------------------------------------------------------------------ queries
def runtime_function_named(name: str) -> RuntimeFunction | None:
    """The row a saved name stands for (an alias gives the row it names), or None."""
    row = RUNTIME_FUNCTIONS.get(name)
    if row is not None and row.alias_of is not None:
        return RUNTIME_FUNCTIONS[row.alias_of]
    return row


def saved_names() -> Iterator[tuple[str, RuntimeFunction]]:
    """Every name a file may call a run-time function by, with the row it stands for
    (aliases included; classes whose instances are called are not saved)."""
    for name in RUNTIME_FUNCTIONS:
        row = runtime_function_named(name)
        if row is not None and not row.instances:
            yield name, row


def runtime_function(target: Any) -> RuntimeFunction | None:
    """The row of ``target`` (a call_function node's target), or None if it has none.

    A function matches by its own module and qualified name, an instance of a listed
    class by its type; either way only when that name leads to the object in its module.
    """
    try:
        row = _FOUND.get(target)
    except TypeError:  # an unhashable callable: found by name below, not cached
        row = None
    if row is not None:
        return row
    # An instance's __module__ is its class's: one read tells fxloom's own from the rest, so
    # dead-code elimination, which asks of every node, pays little for other targets.
    module = getattr(target, "__module__", None)
    if type(module) is not str or not module.startswith("fxloom."):
        return None
    row = _genuine_row(target, module, instances=False)
    if row is not None:
        _FOUND[target] = row  # module-level functions live as long as the process
        return row
    return _genuine_row(type(target), module, instances=True)


# Targets already matched to their rows.
_FOUND: dict[Any, RuntimeFunction] = {}


def _genuine_row(obj: Any, module: str, instances: bool) -> RuntimeFunction | None:
    qualname = getattr(obj, "__qualname__", None)
    row = RUNTIME_FUNCTIONS.get(f"{module}.{qualname}")
    if row is None or row.alias_of is not None or row.instances != instances:
        return None
    owner = sys.modules.get(module)
    return row if owner is not None and vars(owner).get(qualname) is obj else None


def reusing_functions() -> dict[Any, tuple[int, Any]]:
    """target -> (position, the function to call instead) for each row with ``reuses`` whose
    module is imported already (a target of an unimported module is in no graph); the
    reusing form must live in its operator's module, or the row is skipped."""
    found = {}
    for name, row in RUNTIME_FUNCTIONS.items():
        if row.reuses is None:
            continue
        module, _, qualname = name.rpartition(".")
        owner = sys.modules.get(module)
        position, instead = row.reuses
        instead_module, _, instead_name = instead.rpartition(".")
        if owner is None or instead_module != module or instead_name not in vars(owner):
            continue
        found[vars(owner)[qualname]] = (position, vars(owner)[instead_name])
    return found


def returns_fresh(target: Any) -> bool:
    """Whether ``target``'s result shares no storage with its arguments, and it writes and
    keeps none of them."""
    row = runtime_function(target)
    return row is not None and row.fresh


def is_runtime_check(target: Any) -> bool:
    """Whether ``target`` is one of fxloom's run-time checks: kept by dead-code elimination,
    writing nothing, free to move among other nodes (tracer guards, input and size checks)."""
    row = runtime_function(target)
    return row is not None and row.effect == "check"


def stays_on_host(target: Any) -> bool:
    """Whether lowering and splitting keep calls of ``target`` in the root module, outside
    backend regions: True for every run-time check (tracer guards, exported input checks,
    ``flatten_inputs``, size checks)."""
    row = runtime_function(target)
    return row is not None and row.on_host


def exported_graph_may_call(target: Any) -> bool:
    """Whether the export verifier allows ``target``, one of fxloom's run-time functions,
    in an exported graph."""
    row = runtime_function(target)
    return row is not None and row.exported
