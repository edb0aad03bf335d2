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
    "SETUP_ANNOTATIONS": "unsupported-instruction", "LOAD_BUILD_CLASS": "unsupported-instruction",
    "MATCH_CLASS": "unsupported-instruction", "MATCH_MAPPING": "unsupported-instruction",
    "MATCH_SEQUENCE": "unsupported-instruction", "MATCH_KEYS": "unsupported-instruction",
}  # fmt: skip


def _stop(interp, frame, instruction):
    raise Break(STOPS[instruction.op], f"{instruction.op} in {frame.code.co_name}")


for _op in STOPS:
    handles(_op)(_stop)
