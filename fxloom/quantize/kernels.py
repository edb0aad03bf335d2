"""The kernel table: for each of fxloom's quantized operators, which kernel runs on this CPU.

Placeholder: every operator runs its reference (``ops.reference_<op>``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["run"]


def run(name: str, reference: Callable[..., Any], args: tuple) -> Any:
    return reference(*args)
