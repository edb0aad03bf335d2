"""fxloom's higher-order operators: operators that take graphs, with one implementation per capture mode.

An operator such as ``fxloom.cond_op`` computes its result eagerly, but under a
capture it must record itself instead, and each frontend records it its own
way (the symbolic tracer into proxies, export into stand-ins). Which frontend
records a call, and with what, is a table the operator is declared with: one
``Implementation`` row per frontend, naming the frontend's module and the
functions in it by name. Nothing registers itself when a module is imported.
A row is resolved through ``sys.modules`` only: a frontend whose module is not
loaded cannot be capturing, so the operator never imports a frontend (no layer
reaches up) and an import never changes what a call does.

The operator asks the loaded rows in order of ``precedence`` and runs the first
that claims the call (``claims``: the capture in progress, else None); unclaimed
calls run eagerly. The rows change how a call is *captured*, never what a graph
may call: the export verifier allows these operators by type
(``isinstance(target, HigherOrderOperator)``), the loader by their rows in
``fxloom.ops.runtime_functions``.

Depends on the standard library only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["HigherOrderOperator", "Implementation"]


@dataclass(frozen=True)
class Implementation:
    """How one frontend captures calls of a higher-order operator, by name.

    In ``module`` (once loaded), ``claims(*args)`` returns the frontend's capture in progress
    if it records this call (else None) and ``run(capture, *args)`` records it;
    ``value_types`` name the frontend's values the operator accepts where it takes tensors
    (the tracer's ``Proxy``).
    """

    frontend: str
    module: str
    claims: str
    run: str
    precedence: int = 0
    value_types: tuple[str, ...] = ()

    def loaded(self) -> Any:
        """The frontend's module, or None while it is not imported."""
        return sys.modules.get(self.module)


class HigherOrderOperator:
    """Base of fxloom's operators that take graphs; dispatches captured calls by its table."""

    def __init__(self, implementations: tuple[Implementation, ...]) -> None:
        self.implementations = tuple(sorted(implementations, key=_precedence))

    def captured_by(self, *args: Any) -> tuple[Callable[..., Any], Any] | None:
        """The recording function that claims a call with ``args``, and its capture; None to
        run it."""
        for implementation in self.implementations:
            module = implementation.loaded()
            if module is None:
                continue
            capture = getattr(module, implementation.claims)(*args)
            if capture is not None:
                return getattr(module, implementation.run), capture
        return None

    def value_types(self) -> tuple[type, ...]:
        """The loaded frontends' values that stand for tensors in a call (``Proxy``)."""
        return tuple(
            getattr(module, name)
            for implementation in self.implementations
            if (module := implementation.loaded()) is not None
            for name in implementation.value_types
        )


def _precedence(implementation: Implementation) -> int:
    return implementation.precedence
