"""The closed table of what a graph read from a file or from text may call and read.

A graph's targets come from a file that may be hostile, so what they may be is
enumerated, never inferred from where a name points. Each kind of entry:

* **ATen and prims operator overloads** that are pure computation, decided from
  their schemas: no argument they write to (in place or ``out=``), a result to
  return, no storage, file or packed-object argument; minus ``UNCHECKED_OPERATORS``,
  which look pure but trust their inputs (unchecked sparse or nested constructors,
  views unchecked against their storage) or act on the process. Of the ``quantized``
  namespace, only the elementwise kernels ``fxloom.quantize`` records; ``fxloom_q`` is
  fxloom's own quantized operators on plain tensors (``fxloom.quantize.ops``). An overload
  packet (``torch.ops.quantized.add``) picks its overload when called, so a packet
  call is allowed only where no refused overload could take its arguments
  (``packet_call_refusal``: an ``out`` overload needs one more tensor).
* **torch functions and Tensor methods by name** (``torch_names``): the public
  functions of torch's function namespaces and Tensor's public methods, minus those
  that change process-wide state, touch files, import or compile code, call a
  function they are given, or leave torch's values (``Tensor.numpy``).
* **operator and math functions** by name, minus the three of ``operator`` that
  call or reach anything by name.
* **builtins** without a callable parameter: ``SAFE_BUILTINS`` (``max``/``min``/
  ``sorted`` without ``key=``).
* **fxloom's run-time functions** (``fxloom.ops.runtime_functions``).
* **attribute reads** (``getattr``/``hasattr``): only names from ``attribute_table``,
  whose tables lead from tensors to sizes, dtypes, devices and numbers, never out.

A name outside the table is refused whatever it prints as. Users widen it for their
own functions and classes with ``register_serializable`` (``allowlist``).
"""

from __future__ import annotations

import builtins
import importlib
import math
import operator
import re
from typing import Any

import torch

from fxloom import attr_path
from fxloom._format import qualified_name
from fxloom._namespace import is_plain_identifier
from fxloom.ops.runtime_functions import runtime_function_named
from fxloom.serialize.torch_names import TENSOR_METHODS, TORCH_FUNCTIONS

__all__ = [
    "SAFE_BUILTINS",
    "CALLABLE_KEYWORDS",
    "OPERATOR_NAMESPACES",
    "UNCHECKED_OPERATORS",
    "TENSOR_METHODS",
    "TORCH_FUNCTIONS",
    "TORCH_CLASSES",
    "find_table_callable",
    "operator_refusal",
    "packet_call_refusal",
    "allowed_tensor_method",
]

MISSING = attr_path.MISSING

# Builtins a graph may call; eval, exec, open, __import__, setattr, type, map, filter... are not.
SAFE_BUILTINS = frozenset(
    "getattr hasattr len int float bool str tuple list dict slice range min max abs sum "
    "isinstance round divmod pow all any zip enumerate reversed sorted".split()
)
# Keywords of those builtins that take a function (which they would call): refused.
CALLABLE_KEYWORDS: dict[Any, frozenset[str]] = {
    max: frozenset({"key"}),
    min: frozenset({"key"}),
    sorted: frozenset({"key"}),
}
_OPERATOR_FUNCTIONS = frozenset(
    name
    for name in dir(operator)
    if not name.startswith("_") and name not in {"call", "methodcaller", "attrgetter", "itemgetter"}
)
_MATH_FUNCTIONS = frozenset(
    name for name in dir(math) if not name.startswith("_") and callable(getattr(math, name))
)
# torch classes a graph may call (to build a value); every other class of torch is refused.
TORCH_CLASSES = frozenset({"torch.Size", "torch.device", "torch.finfo", "torch.iinfo"})

# ---------------------------------------------------------------- operators
OPERATOR_NAMESPACES = frozenset({"aten", "prims", "quantized", "fxloom_q"})
# fxloom's own operator namespaces -> the fxloom module that defines them, imported to look
# one up (a fresh process loading an exported int8 program has not imported it yet)
OWN_NAMESPACES = {"fxloom_q": "fxloom.quantize.ops"}
# The quantized kernels a file may call (what fxloom.quantize's graphs call): elementwise
# arithmetic on quantized tensors. The rest of the namespace prepacks and reads backends'
# packed formats.
QUANTIZED_OPERATORS = frozenset({"add", "add_relu", "mul", "mul_relu"})
# Operators (by name, any overload) refused although their schemas look pure: each trusts
# its inputs or acts on the process. Patterns cover families.
UNCHECKED_OPERATORS: dict[str, str] = {
    r".*sparse.*|.*nested.*|.*jagged.*": "builds or reads a sparse or nested layout without checking it",
    r"_reshape_alias.*|_copy_from.*|_make_per_.*_quantized_tensor|_unsafe_masked_index.*": "trusts its indices or layout",
    r"_.*pack.*|_cudnn_.*|_mkldnn.*|mkldnn_.*|miopen_.*|_fbgemm.*|fbgemm_.*": "reads a backend's packed format",
    r"from_file|_print|warn|_cufft_.*|_propagate_xla_data|_test_.*": "acts on the process or reads files",
    r".*_backward(?:_.*)?": "a gradient kernel, trusting the indices its forward saved",
}
_UNCHECKED = re.compile("|".join(f"(?:{pattern})" for pattern in UNCHECKED_OPERATORS))
# Operators that return nothing and are still allowed: the run-time checks exported graphs carry.
RETURNLESS_CHECKS = frozenset(
    {
        "_assert_async",
        "_assert_scalar",
        "_assert_tensor_metadata",
        "sym_constrain_range",
        "sym_constrain_range_for_size",
    }
)
_FILE_ARGUMENTS = frozenset({"filename", "path", "file"})


def operator_refusal(op: Any) -> str | None:
    """Why ``op`` (an OpOverload, or a packet with no allowed overload) may not be called from
    a file; None if it may. A packet's calls are checked one by one (``packet_call_refusal``)."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        reasons = [(name, operator_refusal(getattr(op, name))) for name in op.overloads()]
        if all(reason is not None for _, reason in reasons):
            name, reason = reasons[0]
            return f"has no allowed overload ({name!r} {reason})"
        return None
    if not isinstance(op, torch._ops.OpOverload):
        return "is not an operator overload"
    schema = op._schema
    namespace, _, bare = schema.name.partition("::")
    if namespace not in OPERATOR_NAMESPACES:
        return f"is in the namespace {namespace!r}; files may call {sorted(OPERATOR_NAMESPACES)}"
    if namespace == "quantized" and bare not in QUANTIZED_OPERATORS:
        return f"is not among the quantized kernels files may call {sorted(QUANTIZED_OPERATORS)}"
    if _UNCHECKED.fullmatch(bare):
        return _unchecked_reason(bare)
    if schema.is_mutable or any(a.is_out for a in schema.arguments):
        return "writes to its arguments (files hold functional operators)"
    for argument in schema.arguments:
        kind = str(argument.type)
        if "Storage" in kind or "__torch__" in kind or argument.name in _FILE_ARGUMENTS:
            return f"takes a storage, packed object or file argument ({argument.name})"
    if not schema.returns and bare not in RETURNLESS_CHECKS:
        return "returns nothing (it acts only by side effect)"
    return None


def packet_call_refusal(packet: Any, n_args: int, keywords: Any) -> str | None:
    """Why a call of ``packet`` with ``n_args`` positional arguments and ``keywords`` could
    pick a refused overload; None if every overload it could pick is allowed."""
    for name in packet.overloads():
        overload = getattr(packet, name)
        reason = operator_refusal(overload)
        if reason is not None and _could_bind(overload._schema, n_args, set(keywords)):
            return f"{packet} with these arguments could call its overload {name!r}, which {reason}"
    return None


def _could_bind(schema: Any, n_args: int, keywords: set[str]) -> bool:
    """Whether ``n_args`` positional arguments and ``keywords`` fit ``schema``'s parameters."""
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if n_args > len(positional) or not keywords <= {a.name for a in schema.arguments}:
        return False
    given = {a.name for a in positional[:n_args]} | keywords
    return all(a.name in given or a.has_default_value() for a in schema.arguments)


def _unchecked_reason(bare: str) -> str:
    reason = next(r for p, r in UNCHECKED_OPERATORS.items() if re.fullmatch(p, bare))
    return f"{reason} (fxloom.serialize.call_table.UNCHECKED_OPERATORS)"


# ------------------------------------------------------------------ lookups
def find_table_callable(name: str) -> Any:
    """The object the table allows under ``name``, or ``MISSING``. Never imports anything
    but fxloom's own modules of run-time functions."""
    parts = name.split(".")
    if len(parts) == 1 or (parts[0] == "builtins" and len(parts) == 2):
        return getattr(builtins, parts[-1]) if parts[-1] in SAFE_BUILTINS else MISSING
    head, _, last = name.rpartition(".")
    if head in ("operator", "_operator"):
        return getattr(operator, last) if last in _OPERATOR_FUNCTIONS else MISSING
    if head == "math":
        return getattr(math, last) if last in _MATH_FUNCTIONS else MISSING
    if parts[:2] == ["torch", "ops"]:
        return _operator(parts[2:])
    row = runtime_function_named(name)
    if row is not None and not row.instances:
        return _runtime_function(row.name)  # an old name (alias) gives today's function
    if name in TORCH_FUNCTIONS or name in TORCH_CLASSES:
        return _printed_as(_torch_object(head, last), name)
    if head == "torch.return_types" and not last.startswith("_"):
        found = vars(torch.return_types).get(last, MISSING)
        return found if isinstance(found, type) and issubclass(found, tuple) else MISSING
    return MISSING


def allowed_tensor_method(name: Any) -> bool:
    """A ``call_method`` target: a listed Tensor method, or an operator's dunder
    (``__getitem__``, ``__radd__``: what ``operator``'s own functions call)."""
    if not isinstance(name, str):
        return False
    if name in TENSOR_METHODS:
        return True
    if not (name.startswith("__") and name.endswith("__")) or not hasattr(torch.Tensor, name):
        return False
    bare = name[2:-2]
    return any(b in _OPERATOR_FUNCTIONS for b in (bare, bare[1:], bare.rstrip("_")) if b)


def _operator(parts: list[str]) -> Any:
    """``torch.ops.<namespace>.<op>[.<overload>]``, if ``operator_refusal`` allows it."""
    if len(parts) not in (2, 3) or parts[0] not in OPERATOR_NAMESPACES:
        return MISSING
    if any(not is_plain_identifier(p) or p.startswith("__") for p in parts):
        return MISSING
    if parts[0] in OWN_NAMESPACES:
        importlib.import_module(OWN_NAMESPACES[parts[0]])  # fxloom's own, named by the table
    namespace = getattr(torch.ops, parts[0])
    try:
        found = getattr(namespace, parts[1])
        if len(parts) == 3:
            found = getattr(found, parts[2])
    except (AttributeError, RuntimeError):
        return MISSING
    return found if operator_refusal(found) is None else MISSING


def _torch_object(head: str, last: str) -> Any:
    module = _TORCH_MODULES.get(head)
    return MISSING if module is None else vars(module).get(last, MISSING)


def _printed_as(found: Any, name: str) -> Any:
    """``found``, if it is what prints as ``name`` (no other object under a listed name)."""
    if found is MISSING:
        return MISSING
    if isinstance(found, type):
        return found if f"torch.{found.__name__}" == name else MISSING
    return found if qualified_name(found) == name else MISSING


def _runtime_function(name: str) -> Any:
    module_name, _, attr = name.rpartition(".")
    module = importlib.import_module(module_name)  # fxloom's own, named by a registry row
    found = vars(module).get(attr, MISSING)
    return found if found is not MISSING and qualified_name(found) == name else MISSING


# The modules listed names live in (read with vars(): no attribute hook runs).
_TORCH_MODULES: dict[str, Any] = {
    "torch": torch,
    "torch.nn.functional": torch.nn.functional,
    "torch.special": torch.special,
    "torch.linalg": torch.linalg,
    "torch.fft": torch.fft,
    "torch._C._nn": torch._C._nn,
    "torch._C._fft": torch._C._fft,
    "torch._C._linalg": torch._C._linalg,
    "torch._C._special": torch._C._special,
}
