"""Instructions the first stage of ``fxloom.compile`` stops at, each with its break kind.

They only run when an exception is raised or handled, or in code shapes the interpreter
does not follow yet; a break sends the function to run as Python.
"""

from __future__ import annotations

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.interpreter import handles

# op -> break kind
STOPS = {
    "CHECK_EG_MATCH": "exception", "CLEANUP_THROW": "exception",
    "CALL_INTRINSIC_1": "unsupported-instruction", "CALL_INTRINSIC_2": "unsupported-instruction",
    "SEND": "generator", "END_SEND": "generator", "GET_AWAITABLE": "generator",
    "GET_AITER": "generator", "GET_ANEXT": "generator", "BEFORE_ASYNC_WITH": "generator",
    "END_ASYNC_FOR": "generator", "GET_YIELD_FROM_ITER": "generator",
    "SETUP_ANNOTATIONS": "unsupported-instruction",
    "MATCH_CLASS": "unsupported-instruction", "MATCH_MAPPING": "unsupported-instruction",
    "MATCH_SEQUENCE": "unsupported-instruction", "MATCH_KEYS": "unsupported-instruction",
    "ASYNC_GEN_WRAP": "generator", "PREP_RERAISE_STAR": "exception",
}  # fmt: skip

# Opcodes ``dis`` knows that never reach the interpreter: they occur only in module and class
# bodies (name lookups in a namespace dict, ``import *``, the REPL's echo), or are CPython's
# pseudo-instructions, instrumented and internal forms, which ``co_code`` does not hold.
NOT_IN_FUNCTION_CODE = frozenset(
    ("LOAD_NAME", "STORE_NAME", "DELETE_NAME", "LOAD_CLASSDEREF", "LOAD_LOCALS",
     "LOAD_FROM_DICT_OR_DEREF", "LOAD_FROM_DICT_OR_GLOBALS", "IMPORT_STAR", "PRINT_EXPR",
     "ENTER_EXECUTOR", "INTERPRETER_EXIT", "RESERVED", "SETUP_CLEANUP", "SETUP_FINALLY",
     "SETUP_WITH", "POP_BLOCK", "JUMP_NO_INTERRUPT", "LOAD_SUPER_METHOD", "LOAD_ZERO_SUPER_ATTR",
     "LOAD_ZERO_SUPER_METHOD", "STORE_FAST_MAYBE_NULL", "EXIT_INIT_CHECK")
)  # fmt: skip
NOT_IN_FUNCTION_PREFIXES = ("INSTRUMENTED_",)


def _stop(interp, frame, instruction):
    raise Break(STOPS[instruction.op], f"{instruction.op} in {frame.code.co_name}")


for _op in STOPS:
    handles(_op)(_stop)
