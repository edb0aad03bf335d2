"""Symbolic sizes as graph arguments: sympy expressions encoded as nested tuples, evaluated exactly.

A graph argument is an immutable plain value (DESIGN.md), so the checks an
exported module runs on its inputs' sizes carry their expressions as *size
trees*: an int, a symbol's name (a string), or a tuple ``(operation, *operands)``::

    >>> import sympy
    >>> s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    >>> size_tree(2 * s0 + 1)
    ('add', ('mul', 2, 's0'), 1)
    >>> size_tree(sympy.floor((s0 + 1) / 2))
    ('floordiv', ('add', 's0', 1), 2)
    >>> evaluate_size(('add', ('mul', 2, 's0'), 1), {"s0": 4})
    9
    >>> size_text(('add', ('mul', 2, 's0'), 1), {"s0": "seq"})
    '2*seq + 1'

Operations: ``add``, ``mul`` (any number of operands), ``pow`` (an integer
exponent), ``floordiv`` (by an integer), ``floor``, ``ceiling``, ``mod``,
``max``, ``min``, ``abs``, and ``("frac", p, q)`` for the rational ``p/q``.
Conditions on sizes (a guard such as ``s0 % 2 == 0``) encode the same way, with
``eq``, ``ne``, ``lt``, ``le``, ``gt``, ``ge``, ``and``, ``or``, ``not`` and
``True``/``False``; ``evaluate_condition`` answers them.
Evaluation uses ``fractions.Fraction`` (no floats, no ``eval``).

Every analysis is a table keyed by the operation names of
``fxloom.values.symbolic.interpret`` (the one table of sympy classes): encoding
(``ENCODERS``, folded over a sympy expression by ``interpret``), and over a tree
(folded by ``fold_tree``, the same fold for the tree form) exact evaluation
(``EVALUATORS``), solving for a symbol (``linear_form``), the symbols used, and
printing (``PRINTERS``, the one printer of sizes: ``expr_text`` prints a sympy
expression through its tree, for the shape report and assertion messages). A new
operation is one entry in each.

Frontend-neutral (any frontend whose graphs check symbolic sizes uses it), so it
lives with the shape environment. Depends on sympy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, Union

import sympy

from fxloom.values.symbolic.interpret import interpret

__all__ = [
    "SizeTree",
    "SizeTreeError",
    "evaluate_condition",
    "evaluate_size",
    "exact_value",
    "expr_text",
    "fold_tree",
    "linear_form",
    "size_symbols",
    "size_text",
    "size_tree",
]

SizeTree = Union[int, str, tuple]  # noqa: UP007 (a runtime alias)


class SizeTreeError(TypeError):
    """An expression of a kind no size tree encodes."""


# ---------------------------------------------------------------- encoding


def size_tree(expr: sympy.Basic) -> SizeTree:
    """``expr`` (integers, rationals, symbols and the operations above) as a size tree."""
    return interpret(expr, ENCODERS, default=_unsupported)


def _unsupported(expr: sympy.Basic) -> SizeTree:
    raise SizeTreeError(
        f"{expr} uses {type(expr).__name__}, which fxloom cannot check at call "
        "time; add an encoder to fxloom.values.symbolic.size_trees.ENCODERS (and an evaluator)"
    )


def _tagged(tag: str) -> Callable[[sympy.Basic, list[SizeTree]], SizeTree]:
    return lambda expr, operands: (tag, *operands)


def _in_order(ordered: list[sympy.Basic], expr: sympy.Basic, operands: list) -> list[SizeTree]:
    """``operands`` (encoded ``expr.args``) rearranged in sympy's printing order."""
    encoded = dict(zip(expr.args, operands))
    return [encoded[term] if term in encoded else size_tree(term) for term in ordered]


def _floor(expr: sympy.Basic, operands: list[SizeTree]) -> SizeTree:
    # floor(n / d) with an integer d reads best as n // d.
    numerator, denominator = sympy.fraction(sympy.together(expr.args[0]))
    if denominator.is_Integer and denominator > 1:
        return ("floordiv", size_tree(sympy.expand(numerator)), int(denominator))
    return ("floor", *operands)


def _pow(expr: sympy.Basic, operands: list[SizeTree]) -> SizeTree:
    base, exponent = expr.args
    if not exponent.is_Integer:
        raise SizeTreeError(f"the size {expr} has a non-integer exponent; it cannot be checked")
    return ("pow", operands[0], int(exponent))


# operation (fxloom.values.symbolic.interpret) -> encoder of the operands' trees.
# Terms and factors in printing order, so the trees read like the sizes.
ENCODERS: dict[str, Callable[..., SizeTree]] = {
    "boolean": bool,
    "integer": int,
    "rational": lambda e: ("frac", int(e.p), int(e.q)),
    "symbol": lambda e: e.name,
    "add": lambda e, xs: ("add", *_in_order(e.as_ordered_terms(), e, xs)),
    "mul": lambda e, xs: ("mul", *_in_order(e.as_ordered_factors(), e, xs)),
    "pow": _pow,
    "floor": _floor,
    **{
        operation: _tagged(operation)
        for operation in ("ceiling", "mod", "max", "min", "abs", "eq", "ne", "lt", "le")
        + ("gt", "ge", "and", "or", "not")
    },
}


# ---------------------------------------------------------------- folding


def fold_tree(tree: SizeTree, analysis: Mapping[str, Callable[..., Any]]) -> Any:
    """Fold ``tree`` bottom-up with ``analysis``, as ``interpret`` folds a sympy expression.

    The handlers are keyed by the same operation names, plus ``floordiv``: a leaf's
    (``integer``, ``boolean``, ``symbol``, ``rational`` for ``("frac", p, q)``) gets the
    leaf, an operation's gets ``(tree, operands)`` with its operands already folded.
    """
    if isinstance(tree, bool):
        return analysis["boolean"](tree)
    if isinstance(tree, int):
        return analysis["integer"](tree)
    if isinstance(tree, str):
        return analysis["symbol"](tree)
    if tree[0] == "frac":
        return analysis["rational"](tree)
    return analysis[tree[0]](tree, [fold_tree(operand, analysis) for operand in tree[1:]])


# ---------------------------------------------------------------- evaluating


def evaluate_size(tree: SizeTree, values: Mapping[str, int]) -> int:
    """The value of ``tree`` for the symbols' ``values``; a ``ValueError`` if it is not an integer."""
    value = exact_value(tree, values)
    if value.denominator != 1:
        raise ValueError(f"the size {size_text(tree)} is {value}, not an integer, for {values}")
    return int(value)


def evaluate_condition(tree: SizeTree, values: Mapping[str, int]) -> bool:
    """Whether the condition ``tree`` holds for the symbols' ``values``."""
    return bool(exact_value(tree, values))


def exact_value(tree: SizeTree, values: Mapping[str, int]) -> Fraction:
    """The exact (rational) value of ``tree``; a ``KeyError`` names a symbol without a value."""
    return fold_tree(tree, {**EVALUATORS, "symbol": lambda name: Fraction(values[name])})


def _product(operands: list[Fraction]) -> Fraction:
    return math.prod(operands, start=Fraction(1))


def _truth(
    test: Callable[[list[Fraction]], bool],
) -> Callable[[SizeTree, list[Fraction]], Fraction]:
    """A condition's evaluator: 1 for true, 0 for false."""
    return lambda tree, xs: Fraction(test(xs))


# operation -> its value from its operands' values (Fractions: exact, Python's floor semantics).
EVALUATORS: dict[str, Callable[..., Fraction]] = {
    "integer": Fraction,
    "boolean": Fraction,
    "rational": lambda tree: Fraction(tree[1], tree[2]),
    "add": lambda tree, xs: sum(xs, Fraction(0)),
    "mul": lambda tree, xs: _product(xs),
    "pow": lambda tree, xs: xs[0] ** int(xs[1]),
    "floordiv": lambda tree, xs: Fraction(xs[0] // xs[1]),
    "floor": lambda tree, xs: Fraction(math.floor(xs[0])),
    "ceiling": lambda tree, xs: Fraction(math.ceil(xs[0])),
    "mod": lambda tree, xs: xs[0] % xs[1],
    "max": lambda tree, xs: max(xs),
    "min": lambda tree, xs: min(xs),
    "abs": lambda tree, xs: abs(xs[0]),
    "eq": _truth(lambda xs: xs[0] == xs[1]),
    "ne": _truth(lambda xs: xs[0] != xs[1]),
    "lt": _truth(lambda xs: xs[0] < xs[1]),
    "le": _truth(lambda xs: xs[0] <= xs[1]),
    "gt": _truth(lambda xs: xs[0] > xs[1]),
    "ge": _truth(lambda xs: xs[0] >= xs[1]),
    "and": _truth(all),
    "or": _truth(any),
    "not": _truth(lambda xs: not xs[0]),
}


def _no_symbols(leaf: SizeTree) -> dict[str, None]:
    return {}


def _symbols_of_operands(tree: SizeTree, operands: list[dict[str, None]]) -> dict[str, None]:
    found: dict[str, None] = {}
    for symbols in operands:
        found.update(symbols)
    return found


# Every operation's symbols are its operands', in order of first appearance.
_SYMBOLS: dict[str, Callable[..., dict[str, None]]] = {
    **dict.fromkeys(EVALUATORS, _symbols_of_operands),
    **dict.fromkeys(("integer", "boolean", "rational"), _no_symbols),
    "symbol": lambda name: {name: None},
}


def size_symbols(tree: SizeTree) -> list[str]:
    """The symbols ``tree`` mentions, in order of first appearance."""
    return list(fold_tree(tree, _SYMBOLS))


# ---------------------------------------------------------------- solving

# (a, b): a size equal to a * symbol + b; None: not linear in the symbol.
Linear = Union[tuple[Fraction, Fraction], None]  # noqa: UP007 (a runtime alias)


def linear_form(tree: SizeTree, symbol: str, values: Mapping[str, int]) -> Linear:
    """``(a, b)`` with ``tree == a * symbol + b`` for the other symbols' ``values``, or None
    if ``tree`` is not linear in ``symbol`` (so a size solves for it: ``(size - b) / a``)."""

    def leaf(name: str) -> Linear:
        return (
            (Fraction(1), Fraction(0)) if name == symbol else (Fraction(0), Fraction(values[name]))
        )

    return fold_tree(tree, {**_LINEAR, "symbol": leaf})


def _constant(evaluate: Callable[..., Fraction]) -> Callable[..., Linear]:
    """A leaf's, or an operation's on operands free of the symbol, form ``(0, value)``;
    any other operation is not linear."""

    def form(tree: SizeTree, operands: list[Linear] | None = None) -> Linear:
        if operands is None:
            return Fraction(0), evaluate(tree)
        if any(operand is None or operand[0] != 0 for operand in operands):
            return None
        return Fraction(0), evaluate(tree, [b for _, b in operands])

    return form


def _linear_sum(tree: SizeTree, operands: list[Linear]) -> Linear:
    if None in operands:
        return None
    return sum(a for a, _ in operands), sum(b for _, b in operands)


def _linear_product(tree: SizeTree, operands: list[Linear]) -> Linear:
    if None in operands:
        return None
    varying = [form for form in operands if form[0] != 0]
    constant = _product([b for a, b in operands if a == 0])
    if not varying:
        return Fraction(0), constant
    if len(varying) != 1:
        return None
    return varying[0][0] * constant, varying[0][1] * constant


# operation -> its linear form from its operands' (sums and products of one varying operand
# stay linear; anything else is linear only when constant).
_LINEAR: dict[str, Callable[..., Linear]] = {
    **{name: _constant(evaluate) for name, evaluate in EVALUATORS.items()},
    "add": _linear_sum,
    "mul": _linear_product,
}


# ---------------------------------------------------------------- printing


def size_text(tree: SizeTree, names: Mapping[str, str] | None = None) -> str:
    """``tree`` as readable text, symbols renamed by ``names`` (a symbol to its Dim's name)."""
    names = names or {}
    return fold_tree(tree, {**PRINTERS, "symbol": lambda name: names.get(name, name)})


def expr_text(expr: sympy.Basic, names: Mapping[str, str] | None = None) -> str:
    """A sympy expression as ``size_text`` prints its size tree (``x.size(0) % 2 == 0``),
    symbols renamed by ``names``; sympy's own text for one no size tree encodes."""
    try:
        tree = size_tree(expr)
    except SizeTreeError:
        renamed = {
            s: sympy.Symbol(names[s.name]) for s in expr.free_symbols if s.name in (names or {})
        }
        return str(expr.xreplace(renamed))
    return size_text(tree, names)


def _grouped(operand: SizeTree, text: str) -> str:
    """``text`` in parentheses unless it is a single term."""
    simple = isinstance(operand, (int, str)) or operand[0] not in ("add", "mod", "floordiv")
    return text if simple else f"({text})"


def _add_text(tree: tuple, texts: list[str]) -> str:
    # Constant terms last, as sympy prints them; a negative term as a subtraction.
    operands = tree[1:]
    order = sorted(range(len(texts)), key=lambda i: isinstance(operands[i], int))
    result = texts[order[0]]
    for i in order[1:]:
        text = texts[i]
        result += f" - {text[1:]}" if text.startswith("-") else f" + {text}"
    return result


def _mul_text(tree: tuple, texts: list[str]) -> str:
    return _product_text(list(tree[1:]), texts)


def _product_text(operands: list, texts: list[str]) -> str:
    if operands[0] == -1:
        return "-" + _product_text(operands[1:], texts[1:])
    first = operands[0]
    if isinstance(first, tuple) and first[0] == "frac" and len(operands) > 1:
        numerator, denominator = first[1:]  # 3*s0/2 rather than 3/2*s0
        text = _product_text([numerator, *operands[1:]], [str(numerator), *texts[1:]])
        return f"{text}/{denominator}"
    if first == 1 and len(operands) > 1:
        return _product_text(operands[1:], texts[1:])
    return "*".join(_grouped(operand, text) for operand, text in zip(operands, texts))


def _pow_text(tree: tuple, texts: list[str]) -> str:
    base = texts[0] if isinstance(tree[1], (int, str)) else f"({texts[0]})"
    return f"{base}**{texts[1]}"


def _call_text(name: str) -> Callable[[tuple, list[str]], str]:
    return lambda tree, texts: f"{name}({', '.join(texts)})"


def _infix(symbol: str) -> Callable[[tuple, list[str]], str]:
    return lambda tree, texts: f" {symbol} ".join(texts)


def _logic(word: str) -> Callable[[tuple, list[str]], str]:
    def text(tree: tuple, texts: list[str]) -> str:
        return f" {word} ".join(
            f"({t})" if isinstance(o, tuple) and o[0] in ("and", "or") else t
            for o, t in zip(tree[1:], texts)
        )

    return text


# How each relation between sizes reads (the Python operator it is).
RELATION_SYMBOLS: dict[str, str] = {
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
}

# operation -> its text from its operands' texts (the operands' trees decide parentheses).
PRINTERS: dict[str, Callable[..., str]] = {
    "integer": str,
    "boolean": str,
    "rational": lambda tree: f"{tree[1]}/{tree[2]}",
    "add": _add_text,
    "mul": _mul_text,
    "pow": _pow_text,
    "floordiv": lambda tree, texts: f"{_grouped(tree[1], texts[0])}//{texts[1]}",
    "mod": lambda tree, texts: f"{_grouped(tree[1], texts[0])} % {_grouped(tree[2], texts[1])}",
    **{name: _call_text(name) for name in ("floor", "ceiling", "max", "min", "abs")},
    **{relation: _infix(symbol) for relation, symbol in RELATION_SYMBOLS.items()},
    "and": _logic("and"),
    "or": _logic("or"),
    "not": lambda tree, texts: f"not ({texts[0]})",
}
