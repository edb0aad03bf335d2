"""Python's operators: which ``operator`` function each one calls, and how it is written.

``PYTHON_OPERATORS`` maps a function (``operator.add``, ``builtins.getattr``...) to a
``PythonOperator``: its ``kind``, its ``token``, its ``arity`` and the ``hook`` (magic method)
through which Python hands it to an object. Two readers build everything from it:

* the tracer's ``Proxy`` installs one magic method per hook, so ``x + 1`` on a proxy records
  ``operator.add`` (and ``__radd__``: ``1 + x`` records ``operator.add(1, x)``);
* codegen prints a call of the function as the operator (``add = x + 1``).

Kinds:

============ ============================ ====================================================
kind         written                      notes
============ ============================ ====================================================
binary       ``a + b``                    reflected hook too: ``1 + x`` calls ``x.__radd__``
comparison   ``a < b``                    Python reflects by swapping (``1 < x``: ``x > 1``)
unary        ``-a``, ``not a``
augmented    ``a += b``                   ``in_place_of`` names the binary operator it updates
                                          with; the token is that operator's token plus ``=``
call         ``abs(a)``                   a builtin with a hook; printed as a call
getitem      ``a[b]``
setitem      ``a[b] = c``
contains     ``b in a``                   ``contains(a, b)``: the container comes first
getattr      ``a.b``                      ``builtins.getattr`` with a constant name
============ ============================ ====================================================

``not``, ``is`` and ``is not`` have no hook: a proxy cannot record them (``not x`` asks for
``bool(x)``).

The table is Python's grammar, so it is closed: it is not an extension point. In-place
behaviour of these operators is in ``fxloom.ops.mutation``.

Depends on: ``operator`` and ``builtins`` only.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["KINDS", "PYTHON_OPERATORS", "PythonOperator"]

KINDS = (
    "binary",
    "comparison",
    "unary",
    "augmented",
    "call",
    "getitem",
    "setitem",
    "contains",
    "getattr",
)


@dataclass(frozen=True)
class PythonOperator:
    """One Python operator: the function it calls and how it is written (see the module)."""

    function: Callable[..., Any]
    kind: str
    token: str  # "+", "+=", "not ", "is not"; "" for forms written around their operands
    arity: int
    hook: str | None  # "__add__": the magic method; None: Python offers no hook
    in_place_of: Callable[..., Any] | None = None  # augmented: the binary operator it updates with

    @property
    def reflected_hook(self) -> str | None:
        """``"__radd__"`` for a binary operator with a hook, else ``None``."""
        if self.kind != "binary" or self.hook is None:
            return None
        return f"__r{self.hook[2:]}"


def _binary(function: Callable[..., Any], token: str, hook: str) -> PythonOperator:
    return PythonOperator(function, "binary", token, 2, f"__{hook}__")


def _comparison(function: Callable[..., Any], token: str, hook: str | None) -> PythonOperator:
    return PythonOperator(function, "comparison", token, 2, hook and f"__{hook}__")


def _unary(function: Callable[..., Any], token: str, hook: str | None) -> PythonOperator:
    return PythonOperator(function, "unary", token, 1, hook and f"__{hook}__")


_BINARY = (
    _binary(operator.add, "+", "add"),
    _binary(operator.sub, "-", "sub"),
    _binary(operator.mul, "*", "mul"),
    _binary(operator.truediv, "/", "truediv"),
    _binary(operator.floordiv, "//", "floordiv"),
    _binary(operator.mod, "%", "mod"),
    _binary(operator.pow, "**", "pow"),
    _binary(operator.matmul, "@", "matmul"),
    _binary(operator.lshift, "<<", "lshift"),
    _binary(operator.rshift, ">>", "rshift"),
    _binary(operator.and_, "&", "and"),
    _binary(operator.or_, "|", "or"),
    _binary(operator.xor, "^", "xor"),
)


def _augmented(binary: PythonOperator) -> PythonOperator:
    # ``x += y`` calls ``operator.iadd``, through ``__iadd__``: an object that can (a tensor)
    # updates itself and returns itself; one that cannot (an int) falls back to ``x + y``.
    stem = binary.hook[2:-2]  # "add"
    function = getattr(operator, f"i{stem}")
    return PythonOperator(
        function, "augmented", binary.token + "=", 2, f"__i{stem}__", binary.function
    )


_OTHERS = (
    _comparison(operator.eq, "==", "eq"),
    _comparison(operator.ne, "!=", "ne"),
    _comparison(operator.lt, "<", "lt"),
    _comparison(operator.le, "<=", "le"),
    _comparison(operator.gt, ">", "gt"),
    _comparison(operator.ge, ">=", "ge"),
    _comparison(operator.is_, "is", None),
    _comparison(operator.is_not, "is not", None),
    _unary(operator.neg, "-", "neg"),
    _unary(operator.pos, "+", "pos"),
    _unary(operator.invert, "~", "invert"),
    _unary(operator.not_, "not ", None),
    PythonOperator(operator.abs, "call", "", 1, "__abs__"),
    PythonOperator(operator.getitem, "getitem", "", 2, "__getitem__"),  # a[b], slices as a:b:c
    PythonOperator(operator.setitem, "setitem", "", 3, "__setitem__"),  # a[b] = c
    PythonOperator(operator.contains, "contains", "", 2, "__contains__"),  # b in a
    PythonOperator(builtins.getattr, "getattr", "", 2, None),  # a.name
)

PYTHON_OPERATORS: dict[Callable[..., Any], PythonOperator] = {
    entry.function: entry
    for entry in (*_BINARY, *(_augmented(binary) for binary in _BINARY), *_OTHERS)
}
