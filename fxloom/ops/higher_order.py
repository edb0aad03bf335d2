"""fxloom's higher-order operators: operators that take graphs, with one implementation per capture mode.

An operator such as ``fxloom.cond_op`` computes its result eagerly, but under a
capture it must record itself instead, and each frontend records it its own
way (the symbolic tracer into proxies, export into stand-ins). The operator
holds no knowledge of the frontends: each frontend registers an
``Implementation`` when its module is imported, saying which calls it claims
(``claims``: the capture in progress, else None) and how it records them. The
operator asks the registered implementations in order of ``precedence`` and
runs the first that claims the call; unclaimed calls run eagerly.

Registering an implementation changes how a call is *captured*, never what a
graph may call: the export verifier allows these operators by type
(``isinstance(target, HigherOrderOperator)``), the loader by their rows in
``fxloom.ops.runtime_functions``.

Depends on the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["HigherOrderOperator", "Implementation"]


@dataclass(frozen=True)
class Implementation:
    """How one frontend captures calls of a higher-order operator.

    ``claims(*args)`` returns the frontend's capture in progress if it records this call
    (else None); ``run(capture, *args)`` records it. ``value_types`` are the frontend's
    values the operator accepts where it takes tensors (the tracer's ``Proxy``).
    """

    frontend: str
    claims: Callable[..., Any]
    run: Callable[..., Any]
    precedence: int = 0
    value_types: tuple[type, ...] = ()


class HigherOrderOperator:
    """Base of fxloom's operators that take graphs; dispatches captured calls by registration."""

    def __init__(self) -> None:
        self._implementations: dict[str, Implementation] = {}

    def register(self, implementation: Implementation) -> None:
        """Capture calls the way ``implementation`` says (one per frontend: a frontend's module
        imported again replaces its own)."""
        self._implementations[implementation.frontend] = implementation

    def captured_by(self, *args: Any) -> tuple[Implementation, Any] | None:
        """The implementation that claims a call with ``args``, and its capture; None to run it."""
        for implementation in sorted(self._implementations.values(), key=_precedence):
            capture = implementation.claims(*args)
            if capture is not None:
                return implementation, capture
        return None

    def value_types(self) -> tuple[type, ...]:
        """The frontends' values that stand for tensors in a call (``Proxy``)."""
        return tuple(t for i in self._implementations.values() for t in i.value_types)


def _precedence(implementation: Implementation) -> int:
    return implementation.precedence
