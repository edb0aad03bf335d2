"""The graph nodes that compute symbolic sizes: where each symbol is read, and its arithmetic.

Under dynamic shapes an operator's size arguments are ``torch.SymInt`` values:
``x.view(x.shape[0] * 4, -1)`` passes ``4*s0``. The graph must compute that
value from its inputs when it runs, so ``SizeNodes`` turns a symbolic value's
expression into nodes:

* each symbol has a *source*: an input size (``s0`` is dimension 0 of ``x``:
  ``aten.sym_size.int(x, 0)``), a data-dependent size (``i0`` is dimension 0
  of ``nonzero``'s result) or a scalar read from data (``i1`` is the result
  of ``aten._local_scalar_dense``);
* an expression is built from its symbols with Python's operators, one node
  per sympy operation, each node made once per expression.

How each operation becomes nodes is a table keyed by the operation names of
``fxloom.values.symbolic.interpret`` (the one table of sympy classes):
``OPERATORS`` for those that are one Python function folded over the operands
(``Max`` is ``torch.sym_max``), ``EMITTERS`` for all of them. Unlike the other
analyses it walks top-down, not with ``interpret``'s bottom-up fold: emitting
chooses which subexpressions get nodes (``s0 - s1`` is one subtraction, with no
node for ``-s1``; ``floor(a/b)`` one floor division, with none for ``a/b``).

A node for a symbol is only made when something uses it, at that point of
the graph, so the graph reads the sizes it needs where it needs them.

Frontend-neutral (any frontend that records operators with symbolic sizes
needs them), so it lives with the shape environment. Depends on sympy, the IR
and ``symbolic``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch

from fxloom.graph import Graph
from fxloom.node import Node
from fxloom.values.symbolic.interpret import UnsupportedExpression, operation_of
from fxloom.values.symbolic.shape_env import ShapeEnv
from fxloom.values.symbolic.sym_node import wrap_expr
from fxloom.values.symbolic_scalars import SYMBOLIC_TYPES, is_symbolic

__all__ = ["EMITTERS", "OPERATORS", "SIZE_FUNCTIONS", "SizeNodes"]

aten = torch.ops.aten

# operation -> the Python function computing it on ints and bools (folded over the
# operands left to right when there are more than two).
OPERATORS: dict[str, Callable[..., Any]] = {
    "mod": operator.mod,
    "pow": operator.pow,
    "max": torch.sym_max,
    "min": torch.sym_min,
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "and": operator.and_,
    "or": operator.or_,
    "not": torch.sym_not,
}

# Every function a size node may call (the verifier's allowance for exported graphs):
# the operators above, and those sums, products and rounded divisions are written with.
SIZE_FUNCTIONS: frozenset[Callable[..., Any]] = frozenset(
    {*OPERATORS.values(), operator.add, operator.mul, operator.sub, operator.neg}
    | {operator.floordiv, operator.truediv}
)


class SizeNodes:
    """Sources of symbols and nodes of expressions for one graph; see the module docstring."""

    def __init__(
        self,
        graph: Graph,
        env: ShapeEnv,
        stamp: Callable[[], dict],
        simplify: Callable[[sympy.Basic], sympy.Basic] | None = None,
    ) -> None:
        self.graph = graph
        self.env = env
        self.stamp = stamp  # metadata (provenance) for each new node
        # Everything the environment knows, by default; assertions must not use the very
        # facts they check (s0 % 2 is 0 once s0 is known even).
        self.simplify = env.simplify if simplify is None else simplify
        self.sources: dict[sympy.Symbol, tuple[Node, int | None]] = {}
        # Called for a symbol with no source here (a cond branch lifts its parent's sizes).
        self.lift_symbol: Callable[[sympy.Symbol], Node] | None = None
        self._nodes: dict[sympy.Basic, Node] = {}

    def bind_size(self, symbol: sympy.Symbol, tensor: Node, dim: int) -> None:
        """``symbol`` is dimension ``dim`` of ``tensor``'s value (the first binding wins)."""
        self.sources.setdefault(symbol, (tensor, dim))

    def bind_scalar(self, symbol: sympy.Symbol, scalar: Node) -> None:
        """``symbol`` is the value ``scalar`` computes."""
        self.sources.setdefault(symbol, (scalar, None))
        self._nodes[symbol] = scalar

    def bind_sizes(self, tensor: Node, sizes: Any) -> None:
        """Bind each size of ``sizes`` that is a bare symbol to its dimension of ``tensor``."""
        for dim, size in enumerate(sizes):
            if is_symbolic(size) and size.node.expr.is_Symbol:
                self.bind_size(size.node.expr, tensor, dim)

    def value(self, value: Any) -> Any:
        """``value`` for a node's arguments: a node for a symbolic scalar, else ``value``
        (a symbolic scalar fixed to one number as that Python number)."""
        if is_symbolic(value):
            return self.node(value.node.expr)
        if isinstance(value, SYMBOLIC_TYPES):
            return value.node.pytype(value.node.expr)
        return value

    def node(self, expr: sympy.Basic) -> Any:
        """The node computing ``expr`` (made once), or a Python number for a constant."""
        expr = self.simplify(expr)
        if expr.is_Integer:
            return int(expr)
        if expr.is_Number:
            return float(expr)
        if expr in (sympy.true, sympy.false):
            return bool(expr)
        found = self._nodes.get(expr)
        if found is None:
            found = self._nodes[expr] = self._build(expr)
        return found

    # ------------------------------------------------------------------ building
    def _build(self, expr: sympy.Basic) -> Node:
        try:
            emit = EMITTERS.get(operation_of(expr))
        except UnsupportedExpression:
            emit = None
        if emit is None:
            raise NotImplementedError(
                f"the size expression {expr} ({type(expr).__name__}) has no graph form; add its "
                "operation to fxloom.values.symbolic.size_nodes.EMITTERS"
            )
        return emit(self, expr)

    def _folded(self, expr: sympy.Basic) -> Node:
        """``expr``'s function (``OPERATORS``) folded over its operands' nodes."""
        function = OPERATORS[operation_of(expr)]
        args = [self.node(arg) for arg in expr.args]
        result = args[0]
        for arg in args[1:]:
            result = self._call(function, (result, arg))
        if len(args) == 1:
            result = self._call(function, (result,))
        return result

    def _read_symbol(self, symbol: sympy.Symbol) -> Node:
        source = self.sources.get(symbol)
        if source is None and self.lift_symbol is not None:
            return self.lift_symbol(symbol)
        if source is None:
            raise RuntimeError(
                f"the size {symbol} has no source in the graph (no input dimension or "
                "data-dependent value defines it); this is a bug in fxloom's export"
            )
        tensor, dim = source
        if dim is None:  # a scalar read from data: the node computing it
            return tensor
        node = self.graph.create_node(
            "call_function", aten.sym_size.int, (tensor, dim), {}, name="sym_size_int"
        )
        node.meta.update(self.stamp())
        node.meta["val"] = wrap_expr(self.env, symbol)
        return node

    def _sum(self, expr: sympy.Add) -> Node:
        # Terms with a negative coefficient are subtracted: s0 - 1 rather than s0 + -1.
        positive = [t for t in expr.args if not t.could_extract_minus_sign()]
        negative = [-t for t in expr.args if t.could_extract_minus_sign()]
        if not positive:
            return self._call(operator.neg, (self.node(sympy.Add(*negative)),))
        result = self.node(positive[0])
        for term in positive[1:]:
            result = self._call(operator.add, (result, self.node(term)))
        for term in negative:
            result = self._call(operator.sub, (result, self.node(term)))
        return result

    def _product(self, expr: sympy.Mul) -> Node:
        numerator, denominator = sympy.fraction(expr)
        if denominator != 1:  # s0/2 as a float (floor(s0/2) is handled as floor division)
            return self._call(operator.truediv, (self.node(numerator), self.node(denominator)))
        coefficient, rest = expr.as_coeff_Mul()
        factors = [*sympy.Mul.make_args(rest)] + ([coefficient] if coefficient != 1 else [])
        result = self.node(factors[0])
        for factor in factors[1:]:
            result = self._call(operator.mul, (result, self.node(factor)))
        return result

    def _rounded_division(self, expr: sympy.Basic) -> Node:
        numerator, denominator = sympy.fraction(sympy.together(expr.args[0]))
        if denominator == 1:  # floor of an integer expression is itself
            return self.node(numerator)
        if isinstance(expr, sympy.ceiling):  # ceil(a / b) == -((-a) // b)
            floored = self._call(operator.floordiv, (self.node(-numerator), self.node(denominator)))
            return self._call(operator.neg, (floored,))
        return self._call(operator.floordiv, (self.node(numerator), self.node(denominator)))

    def _call(self, function: Callable, args: tuple, name: str | None = None) -> Node:
        node = self.graph.create_node(
            "call_function", function, args, {}, name=name or function.__name__.strip("_")
        )
        node.meta.update(self.stamp())
        # The value is the function run on the arguments' symbolic values: a SymInt (SymBool)
        # of the same expression, without deciding anything.
        values = [arg.meta["val"] if isinstance(arg, Node) else arg for arg in args]
        node.meta["val"] = function(*values)
        return node


# operation -> how the nodes computing it are made.
EMITTERS: dict[str, Callable[[SizeNodes, sympy.Basic], Any]] = {
    "symbol": SizeNodes._read_symbol,
    "add": SizeNodes._sum,
    "mul": SizeNodes._product,
    "floor": SizeNodes._rounded_division,
    "ceiling": SizeNodes._rounded_division,
    **dict.fromkeys(OPERATORS, SizeNodes._folded),
}
