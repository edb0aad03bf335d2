"""``SymNode``: fxloom's symbolic node behind ``torch.SymInt`` / ``SymFloat`` / ``SymBool``.

torch's symbolic scalars are thin shells: ``torch.SymInt(node)`` forwards every
operation to ``node`` (``s + 1`` calls ``node.add(node.wrap_int(1))``; ``bool(s > 2)``
calls ``node.gt(...).bool_()``; C++ meta kernels call ``guard_bool``,
``guard_size_oblivious``, ``expect_true``, ... with a file and line). This module
implements that protocol over a sympy expression of a ``ShapeEnv``'s symbols, the
example's value (the *hint*) and a Python type. Every decision goes to the
``ShapeEnv``; a protocol method fxloom does not implement raises ``AttributeError``
naming it rather than guessing.

    >>> import torch
    >>> from fxloom.values.symbolic import ShapeEnv, size_symint
    >>> env = ShapeEnv()
    >>> s0 = size_symint(env, 4)
    >>> s0 * 2 // 2, (s0 + 1).node.hint()
    (s0, 5)
    >>> torch.empty(s0, 3, device="meta").shape
    torch.Size([s0, 3])

Depends on sympy and the ShapeEnv.
"""

from __future__ import annotations

import builtins
import functools
import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch

from fxloom.values.symbolic.errors import DataDependentGuardError
from fxloom.values.symbolic.shape_env import ShapeEnv

__all__ = ["SymNode", "size_symint", "unbacked_symint", "wrap_expr"]

PyType = type
_EXPRESSION_CACHE_SIZE = 8192


class SymNode:
    """A symbolic int, float or bool: a sympy ``expr`` of ``env``'s symbols, with the example's value."""

    __slots__ = ("_expr", "env", "pytype", "_hint", "_simplified", "_version")

    def __init__(self, expr: sympy.Basic, env: ShapeEnv, pytype: PyType, hint) -> None:
        self._expr = sympy.sympify(expr)
        self.env = env
        self.pytype = pytype
        self._hint = hint
        self._simplified = self._expr
        self._version = -1

    @property
    def expr(self) -> sympy.Basic:
        """The expression, simplified with every fact the environment has learned so far."""
        if self._version != self.env.version:
            self._simplified = self.env.simplify(self._expr)
            self._version = self.env.version
        return self._simplified

    def __getattr__(self, name: str):
        raise AttributeError(
            f"fxloom's SymNode does not implement {name!r}, which torch asked of a symbolic size; "
            "add it to fxloom/values/symbolic/sym_node.py"
        )

    # ---- what kind of value

    def is_int(self) -> bool:
        return self.pytype is int

    def is_float(self) -> bool:
        return self.pytype is float

    def is_bool(self) -> bool:
        return self.pytype is bool

    def is_nested_int(self) -> bool:
        return False

    def nested_int(self) -> None:
        return None

    def is_symbolic(self) -> bool:
        return True

    def is_constant(self) -> bool:
        return False

    def constant_int(self) -> int | None:
        return self.maybe_as_int()

    def has_hint(self) -> bool:
        return self._hint is not None

    def hint(self):
        return self._hint

    def require_hint(self, fallback=None):
        if self._hint is not None:
            return self._hint
        if fallback is not None:
            return fallback
        raise RuntimeError(f"{self.expr} depends on tensor data and has no example value")

    def maybe_as_int(self) -> int | None:
        expr = self.expr
        return int(expr) if self.pytype is int and expr.is_Integer else None

    def maybe_as_float(self) -> float | None:
        expr = self.expr
        return float(expr) if self.pytype is float and expr.is_Number else None

    def maybe_as_bool(self) -> bool | None:
        expr = self.expr
        return bool(expr) if expr in (sympy.true, sympy.false) else None

    def wrap_int(self, value: int) -> SymNode:
        return SymNode(sympy.Integer(value), self.env, int, value)

    def wrap_float(self, value: float) -> SymNode:
        return SymNode(sympy.Float(value), self.env, float, value)

    def wrap_bool(self, value: bool) -> SymNode:
        return SymNode(sympy.true if value else sympy.false, self.env, bool, value)

    @property
    def shape_env(self) -> _ShapeEnvView:
        # torch's Python helpers (guard_or_false, statically_known_true) ask the node's
        # ``shape_env`` to decide; the view answers those questions through our ShapeEnv.
        return _ShapeEnvView(self.env)

    def clone(self) -> SymNode:
        return self

    def with_shape_env(self, env: ShapeEnv) -> SymNode:
        return SymNode(self._expr, env, self.pytype, self._hint)

    # ---- printing

    def str(self) -> builtins.str:
        return self._graph_repr()

    def __str__(self) -> builtins.str:
        return builtins.str(self.expr)

    def __repr__(self) -> builtins.str:
        return f"SymNode({self.expr}, hint={self._hint})"

    def _graph_repr(self) -> builtins.str:
        # ``str(n)``/``repr(n)`` of the SymInt: the expression (``s0``), or, where the
        # program's own text is being computed (``ShapeEnv.text_is_value``), its value,
        # fixed by a guard as ``int(n)`` is.
        if self.env.text_is_value and self._hint is not None:
            return builtins.repr(self.pytype(self.env.evaluate(self.expr, self._hint)))
        return builtins.str(self.expr)

    # ---- operations that are not one table entry

    def truediv(self, other: SymNode) -> SymNode:
        return self.float_truediv(other)

    def floordiv(self, other: SymNode) -> SymNode:
        return self.int_floordiv(other)

    def pow(self, other: SymNode) -> SymNode:
        natural = self.is_int() and other.is_int() and other._hint is not None and other._hint >= 0
        return self.pow_by_natural(other) if natural else self.float_pow(other)

    def sym_sum(self, args: list[SymNode]) -> SymNode:
        hints = [arg._hint for arg in args]
        hint = None if None in hints else sum(hints)
        return SymNode(sympy.Add(*(arg.expr for arg in args)), self.env, int, hint)

    def sym_ite(self, then_node: SymNode, else_node: SymNode) -> SymNode:
        expr = sympy.Piecewise((then_node.expr, self.expr), (else_node.expr, True))
        hint = None if self._hint is None else (then_node._hint if self._hint else else_node._hint)
        return SymNode(expr, self.env, then_node.pytype, hint)

    # ---- guards: every decision goes to the ShapeEnv

    def guard_bool(self, file: builtins.str = "", line: int = 0) -> bool:
        return bool(self.env.evaluate(self.expr, self._hint))

    def guard_int(self, file: builtins.str = "", line: int = 0) -> int:
        return int(self.env.evaluate(self.expr, self._hint))

    def guard_float(self, file: builtins.str = "", line: int = 0) -> float:
        return float(self.env.evaluate(self.expr, self._hint))

    def guard_size_oblivious(self, file: builtins.str = "", line: int = 0) -> bool:
        return bool(self.env.evaluate(self.expr, self._hint, size_oblivious=True))

    def guard_or_false(self, file: builtins.str = "", line: int = 0) -> bool:
        return self._guard_or(False)

    def guard_or_true(self, file: builtins.str = "", line: int = 0) -> bool:
        return self._guard_or(True)

    def _guard_or(self, fallback: bool) -> bool:
        # Without an example value (data-dependent), answer `fallback` rather than fail.
        known = self.env.static_value(self.expr)
        if known is not None:
            return known
        if self._hint is None or self.env.backed_size_oblivious:
            return fallback
        return self.guard_bool()

    def statically_known_true(self, file: builtins.str = "", line: int = 0) -> bool:
        return self.env.static_value(self.expr) is True

    def expect_true(self, file: builtins.str = "", line: int = 0) -> bool:
        if self._hint is not None:
            return self.guard_bool()
        return self.env.defer_assertion(self.expr)

    def expect_size(self, file: builtins.str = "", line: int = 0) -> bool:
        return self.ge(self.wrap_int(0)).expect_true(file, line)

    def bool_(self) -> bool:
        return self.guard_bool()

    def int_(self) -> int:
        return self.guard_int()


class _ShapeEnvView:
    """The questions torch's Python helpers ask ``node.shape_env``, answered by a ``ShapeEnv``."""

    __slots__ = ("env",)

    def __init__(self, env: ShapeEnv) -> None:
        self.env = env

    def evaluate_sym_node(self, node: SymNode, size_oblivious: bool = False, fallback_value=None):
        if fallback_value is not None:
            return node._guard_or(fallback_value)
        return node.guard_size_oblivious() if size_oblivious else node.guard_bool()

    def _maybe_evaluate_static(self, expr, *args, **kwargs):
        return self.env.static_value(expr)

    def __getattr__(self, name: str):
        raise AttributeError(
            f"fxloom's ShapeEnv does not answer {name!r}, which torch asked of a symbolic "
            "size's shape_env; add it to _ShapeEnvView in fxloom/values/symbolic/sym_node.py"
        )


def _result_type(kind: str, a: SymNode, b: SymNode | None) -> PyType:
    if kind != "promote":
        return {"int": int, "float": float, "bool": bool}[kind]
    return float if a.pytype is float or (b is not None and b.pytype is float) else a.pytype


def _define_binary(name: str, on_expr: Callable, on_value: Callable, kind: str) -> None:
    # Meta kernels repeat the same size arithmetic (strides, broadcasting checks) on
    # every call; building sympy relations is what costs, so results are remembered.
    on_expr = functools.lru_cache(maxsize=_EXPRESSION_CACHE_SIZE)(on_expr)

    def method(self: SymNode, other: SymNode) -> SymNode:
        hint = (
            None if self._hint is None or other._hint is None else on_value(self._hint, other._hint)
        )
        pytype = _result_type(kind, self, other)
        if self.env.exact_floats and not _exact(pytype, self, other):
            return _specialised(pytype, hint, self, other)
        return SymNode(on_expr(self.expr, other.expr), self.env, pytype, hint)

    method.__name__ = name
    setattr(SymNode, name, method)


def _define_unary(name: str, on_expr: Callable, on_value: Callable, kind: str) -> None:
    on_expr = functools.lru_cache(maxsize=_EXPRESSION_CACHE_SIZE)(on_expr)

    def method(self: SymNode) -> SymNode:
        hint = None if self._hint is None else on_value(self._hint)
        pytype = _result_type(kind, self, None)
        # One operation on an int (``sym_float(2*s0 - 1)``, which meta kernels ask for a
        # scalar argument) folds nothing a float would round.
        if self.env.exact_floats and self.pytype is not int and not _exact(pytype, self):
            return _specialised(pytype, hint, self)
        return SymNode(on_expr(self.expr), self.env, pytype, hint)

    method.__name__ = name
    setattr(SymNode, name, method)


def _exact(pytype: PyType, *operands: SymNode) -> bool:
    """Whether sympy's form of an operation on ``operands`` computes, in the graph, what
    Python computes (``ShapeEnv.exact_floats``). Integer arithmetic is exact; float rounding
    is not (sympy folds ``s * 0.1 * 3`` into ``0.3*s``, ``n / 3 + n / 7`` into ``10*n/21``, and
    ``s / 3 > 1`` into ``s > 3``), so an operation whose result is a float, or that reads a
    float, is kept only on bare symbols and numbers: one Python operation, rounded once."""
    if pytype is not float and all(operand.pytype is not float for operand in operands):
        return True
    return all(_bare(operand.expr) for operand in operands)


def _bare(expr: sympy.Basic) -> bool:
    """A symbol, a number, or a negated symbol."""
    if expr.is_Symbol or expr.is_Number:
        return True
    return isinstance(expr, sympy.Mul) and len(expr.args) == 2 and -1 in expr.args


def _specialised(pytype: PyType, hint: Any, *operands: SymNode) -> SymNode:
    """The operation's result as a constant: each symbol of the operands fixed to its
    example's value by a guard (``f0 == 0.5``: then every value computed from it is the one
    Python computed), the result computed by Python (``hint``), exactly as eager."""
    env = operands[0].env
    symbols = sorted(
        {symbol for operand in operands for symbol in operand.expr.free_symbols}, key=str
    )
    if hint is None or any(env.symbols[symbol].hint is None for symbol in symbols):
        # no example value: a float read from tensor data (fxloom.compile breaks here)
        raise DataDependentGuardError(
            "a float computed from a value read from tensor data cannot be computed exactly "
            "by the graph\nFix: read it with .item() outside the compiled function",
            condition=None,
            location=None,
        )
    for symbol in symbols:
        env.evaluate(sympy.Eq(symbol, _number(env.symbols[symbol].hint)), True)
    if pytype is bool:
        return SymNode(sympy.true if hint else sympy.false, env, bool, bool(hint))
    number = sympy.Float(hint) if type(hint) is float else sympy.Integer(hint)
    return SymNode(number, env, pytype, hint)


def _number(value: Any) -> sympy.Number:
    return sympy.Float(value) if type(value) is float else sympy.Integer(value)


def _floor_divide(a, b):
    return sympy.floor(a / b)


# protocol name -> (on sympy expressions, on the example's values, result type);
# "promote" is float if either side is a float, else the left side's type.
BINARY_OPERATIONS: dict[str, tuple[Callable, Callable, str]] = {
    "add": (operator.add, operator.add, "promote"),
    "sub": (operator.sub, operator.sub, "promote"),
    "mul": (operator.mul, operator.mul, "promote"),
    "mod": (sympy.Mod, operator.mod, "promote"),
    "int_floordiv": (_floor_divide, operator.floordiv, "promote"),
    "int_truediv": (operator.truediv, operator.truediv, "float"),
    "float_truediv": (operator.truediv, operator.truediv, "float"),
    "pow_by_natural": (operator.pow, operator.pow, "int"),
    "float_pow": (operator.pow, lambda a, b: float(a) ** b, "float"),
    "sym_max": (sympy.Max, max, "promote"),
    "sym_min": (sympy.Min, min, "promote"),
    "eq": (sympy.Eq, operator.eq, "bool"),
    "ne": (sympy.Ne, operator.ne, "bool"),
    "lt": (sympy.Lt, operator.lt, "bool"),
    "le": (sympy.Le, operator.le, "bool"),
    "gt": (sympy.Gt, operator.gt, "bool"),
    "ge": (sympy.Ge, operator.ge, "bool"),
    "and_": (sympy.And, lambda a, b: a and b, "bool"),
    "or_": (sympy.Or, lambda a, b: a or b, "bool"),
    "sym_and": (sympy.And, lambda a, b: a and b, "bool"),
    "sym_or": (sympy.Or, lambda a, b: a or b, "bool"),
}

UNARY_OPERATIONS: dict[str, tuple[Callable, Callable, str]] = {
    "neg": (operator.neg, operator.neg, "promote"),
    "pos": (lambda a: a, lambda a: a, "promote"),
    "abs": (sympy.Abs, builtins.abs, "promote"),
    "sym_not": (sympy.Not, operator.not_, "bool"),
    "sym_float": (lambda a: a, float, "float"),
    "sym_int": (sympy.floor, int, "int"),  # truncation; sizes are non-negative
    "floor": (sympy.floor, lambda a: int(a // 1), "int"),
    "ceil": (sympy.ceiling, lambda a: -int(-a // 1), "int"),
    "trunc": (sympy.floor, int, "int"),
}

for _name, (_on_expr, _on_value, _kind) in BINARY_OPERATIONS.items():
    _define_binary(_name, _on_expr, _on_value, _kind)
for _name, (_on_expr, _on_value, _kind) in UNARY_OPERATIONS.items():
    _define_unary(_name, _on_expr, _on_value, _kind)


def wrap_expr(env: ShapeEnv, expr: sympy.Basic, pytype: PyType = int):
    """``expr`` as a ``torch.SymInt`` / ``SymFloat`` / ``SymBool`` whose hint comes from the env."""
    node = SymNode(expr, env, pytype, env.hint_of(expr))
    return {int: torch.SymInt, float: torch.SymFloat, bool: torch.SymBool}[pytype](node)


def size_symint(
    env: ShapeEnv,
    hint: int,
    *,
    min: int = 2,
    max: int | None = None,
    dim_name: str | None = None,
    source=None,
) -> torch.SymInt:
    """A new input size ``s<n>`` (see ``ShapeEnv.create_symbol``) as a ``torch.SymInt``."""
    symbol = env.create_symbol(hint, min=min, max=max, dim_name=dim_name, source=source)
    return torch.SymInt(SymNode(symbol, env, int, hint))


def unbacked_symint(
    env: ShapeEnv, *, min: int = 0, max: int | None = None, source=None
) -> torch.SymInt:
    """A new data-dependent value ``i<n>`` (no example value) as a ``torch.SymInt``."""
    symbol = env.create_unbacked_symbol(min=min, max=max, source=source)
    return torch.SymInt(SymNode(symbol, env, int, None))
