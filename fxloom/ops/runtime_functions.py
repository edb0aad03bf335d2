"""The fxloom functions that graphs call at run time, by the name they are saved under.

Captured graphs call a few of fxloom's own functions: guards that check what
tracing assumed, export's input checks, ``cond``'s operator, pytree helpers.
This table is the one list of them. It is written out here, not collected by
registration, so that nothing imported earlier or later changes what a graph
may call: a saved program that uses ``cond`` loads in a fresh process whether
or not the module defining ``cond_op`` was imported. The export verifier and
the loader's allowlist read it; each name is resolved by importing its fxloom
module (``fxloom.serialize.call_table``).

A new run-time function gets a row here; ``tests/serialize/test_call_table.py``
checks that every row names a function that exists and prints as its name.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RUNTIME_FUNCTIONS", "EXPORT_RUNTIME_FUNCTIONS", "GRAPH_ARGUMENTS", "stays_on_host"]

# name -> what graphs call it for
RUNTIME_FUNCTIONS: dict[str, str] = {
    # guards of symbolic tracing (fxloom.guards): a call that breaks an assumption raises
    "fxloom.guards.check_bool": "the branch a traced `if` took",
    "fxloom.guards.check_fixed": "a concrete_args value",
    "fxloom.guards.check_float": "a value converted with float()",
    "fxloom.guards.check_index": "a value used as an index",
    "fxloom.guards.check_int": "a value converted with int()",
    "fxloom.guards.check_len": "the length of an unpacked value",
    "fxloom.guards.check_length": "the length of an iterated value",
    "fxloom.guards.check_tensor_input": "an example input's dtype and rank",
    "fxloom.guards.check_variadic_keys": "the keywords given to **kwargs",
    "fxloom.guards.check_variadic_length": "the number of *args",
    # export's input checks (fxloom.export.input_checks)
    "fxloom.export.input_checks.check_tensor": "an exported input's shape and dtype",
    "fxloom.export.input_checks.check_value": "an exported non-tensor input",
    "fxloom.export.input_checks.flatten_inputs": "exported inputs flattened by their tree spec",
    "fxloom.export.size_checks.check_sizes": "the sizes of exported inputs against their ranges",
    # structured control flow
    "fxloom.cond.cond_op": "the branch a cond node picks at run time",
}

# The rows an exported graph may call besides operator overloads.
EXPORT_RUNTIME_FUNCTIONS = frozenset({"fxloom.cond.cond_op"})

# The rows that call some of their arguments, and which: those must be graphs of the same
# file (get_attr nodes of GraphModule children), never a function value or a value the graph
# computed (which could be a bound method reached some other way).
GRAPH_ARGUMENTS: dict[str, tuple[int, ...]] = {"fxloom.cond.cond_op": (1, 2)}

# The checks lowering and splitting keep in the root module, ahead of any region or partition:
# symbolic tracing's guards and export's input and size checks. They cost next to nothing and
# are what makes a module refuse an input it was not captured for; a region handed to a
# backend (ONNX Runtime) would fold them away, or fail inside the backend with its own error.
_HOST_FUNCTIONS = frozenset(
    name
    for name in RUNTIME_FUNCTIONS
    if name.startswith(("fxloom.guards.", "fxloom.export.input_checks."))
    or name == "fxloom.export.size_checks.check_sizes"
)
# Classes whose instances are such checks (symbolic tracing's fixed and flattened arguments).
_HOST_CLASSES = frozenset({"fxloom.guards.FixedArgument", "fxloom.guards.FlattenedInput"})


def stays_on_host(target: Any) -> bool:
    """Whether a call_function node calling ``target`` stays in the root module, in PyTorch.

    Told by qualified name (this layer imports neither the guards nor export):

    >>> import torch
    >>> stays_on_host(torch.relu)
    False
    """
    if _qualified(target) in _HOST_FUNCTIONS:
        return True
    return _qualified(type(target)) in _HOST_CLASSES


def _qualified(value: Any) -> str:
    return f"{getattr(value, '__module__', None)}.{getattr(value, '__qualname__', None)}"
