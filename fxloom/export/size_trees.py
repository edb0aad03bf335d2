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
Evaluation uses ``fractions.Fraction`` (no floats, no ``eval``). The encoders
and evaluators are tables keyed by the operation names of
``fxloom.values.symbolic.interpret`` (the one table of sympy classes): a new
operation is one entry in each.

Depends on sympy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Union

import sympy

from fxloom.values.symbolic.interpret import interpret

__all__ = [
    "SizeTree",
    "SizeTreeError",
    "evaluate_condition",
    "evaluate_size",
    "exact_value",
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
        "time; add an encoder to fxloom.export.size_trees.ENCODERS (and an evaluator)"
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
    if isinstance(tree, int):
        return Fraction(tree)
    if isinstance(tree, str):
        return Fraction(values[tree])
    operation, *operands = tree
    if operation == "frac":
        return Fraction(*operands)
    return EVALUATORS[operation]([exact_value(operand, values) for operand in operands])


def _product(operands: list[Fraction]) -> Fraction:
    return math.prod(operands, start=Fraction(1))


# operation -> its value from its operands' values (Fractions: exact, Python's floor semantics).
EVALUATORS: dict[str, Callable[[list[Fraction]], Fraction]] = {
    "add": lambda xs: sum(xs, Fraction(0)),
    "mul": _product,
    "pow": lambda xs: xs[0] ** int(xs[1]),
    "floordiv": lambda xs: Fraction(xs[0] // xs[1]),
    "floor": lambda xs: Fraction(math.floor(xs[0])),
    "ceiling": lambda xs: Fraction(math.ceil(xs[0])),
    "mod": lambda xs: xs[0] % xs[1],
    "max": max,
    "min": min,
    "abs": lambda xs: abs(xs[0]),
    # Conditions: 1 for true, 0 for false.
    "eq": lambda xs: Fraction(xs[0] == xs[1]),
    "ne": lambda xs: Fraction(xs[0] != xs[1]),
    "lt": lambda xs: Fraction(xs[0] < xs[1]),
    "le": lambda xs: Fraction(xs[0] <= xs[1]),
    "gt": lambda xs: Fraction(xs[0] > xs[1]),
    "ge": lambda xs: Fraction(xs[0] >= xs[1]),
    "and": lambda xs: Fraction(all(xs)),
    "or": lambda xs: Fraction(any(xs)),
    "not": lambda xs: Fraction(not xs[0]),
}


def size_symbols(tree: SizeTree) -> list[str]:
    """The symbols ``tree`` mentions, in order of first appearance."""
    if isinstance(tree, str):
        return [tree]
    if isinstance(tree, int) or tree[0] == "frac":
        return []
    found: dict[str, None] = {}
    for operand in tree[1:]:
        found.update(dict.fromkeys(size_symbols(operand)))
    return list(found)


def linear_form(
    tree: SizeTree, symbol: str, values: Mapping[str, int]
) -> tuple[Fraction, Fraction] | None:
    """``(a, b)`` with ``tree == a * symbol + b`` for the other symbols' ``values``, or None
    if ``tree`` is not linear in ``symbol`` (so a size solves for it: ``(size - b) / a``)."""
    if isinstance(tree, str) and tree == symbol:
        return Fraction(1), Fraction(0)
    if symbol not in size_symbols(tree):
        return Fraction(0), exact_value(tree, values)
    operation, *operands = tree
    forms = [linear_form(operand, symbol, values) for operand in operands]
    if operation not in ("add", "mul") or None in forms:
        return None
    if operation == "add":
        return sum(a for a, _ in forms), sum(b for _, b in forms)
    varying = [form for form in forms if form[0] != 0]
    if len(varying) != 1:
        return None
    constant = _product([b for a, b in forms if a == 0])
    return varying[0][0] * constant, varying[0][1] * constant


# ---------------------------------------------------------------- printing


def size_text(tree: SizeTree, names: Mapping[str, str] | None = None) -> str:
    """``tree`` as readable text, symbols renamed by ``names`` (a symbol to its Dim's name)."""
    names = names or {}
    if isinstance(tree, int):  # True and False too
        return str(tree)
    if isinstance(tree, str):
        return names.get(tree, tree)
    operation, *operands = tree
    if operation == "frac":
        return f"{operands[0]}/{operands[1]}"
    printer = PRINTERS.get(operation)
    texts = [size_text(operand, names) for operand in operands]
    if printer is None:
        return f"{operation}({', '.join(texts)})"
    return printer(operands, texts)


def _grouped(operand: SizeTree, text: str) -> str:
    """``text`` in parentheses unless it is a single term."""
    simple = isinstance(operand, (int, str)) or operand[0] not in ("add", "mod", "floordiv")
    return text if simple else f"({text})"


def _add_text(operands: list, texts: list[str]) -> str:
    # Constant terms last, as sympy prints them; a negative term as a subtraction.
    order = sorted(range(len(texts)), key=lambda i: isinstance(operands[i], int))
    result = texts[order[0]]
    for i in order[1:]:
        text = texts[i]
        result += f" - {text[1:]}" if text.startswith("-") else f" + {text}"
    return result


def _mul_text(operands: list, texts: list[str]) -> str:
    if operands[0] == -1:
        return "-" + _mul_text(operands[1:], texts[1:])
    first = operands[0]
    if isinstance(first, tuple) and first[0] == "frac" and len(operands) > 1:
        numerator, denominator = first[1:]  # 3*s0/2 rather than 3/2*s0
        return (
            f"{_mul_text([numerator, *operands[1:]], [str(numerator), *texts[1:]])}/{denominator}"
        )
    if first == 1 and len(operands) > 1:
        return _mul_text(operands[1:], texts[1:])
    return "*".join(_grouped(operand, text) for operand, text in zip(operands, texts))


def _relation(symbol: str) -> Callable[[list, list[str]], str]:
    return lambda operands, texts: f" {symbol} ".join(texts)


def _logic(word: str) -> Callable[[list, list[str]], str]:
    def text(operands: list, texts: list[str]) -> str:
        return f" {word} ".join(
            f"({t})" if isinstance(o, tuple) and o[0] in ("and", "or") else t
            for o, t in zip(operands, texts)
        )

    return text


PRINTERS: dict[str, Callable[[list, list[str]], str]] = {
    "add": _add_text,
    "mul": _mul_text,
    "pow": lambda ops, texts: (
        (texts[0] if isinstance(ops[0], (int, str)) else f"({texts[0]})") + f"**{texts[1]}"
    ),
    "floordiv": lambda ops, texts: f"{_grouped(ops[0], texts[0])}//{texts[1]}",
    "mod": lambda ops, texts: f"{_grouped(ops[0], texts[0])} % {_grouped(ops[1], texts[1])}",
    "eq": _relation("=="),
    "ne": _relation("!="),
    "lt": _relation("<"),
    "le": _relation("<="),
    "gt": _relation(">"),
    "ge": _relation(">="),
    "and": _logic("and"),
    "or": _logic("or"),
    "not": lambda ops, texts: f"not ({texts[0]})",
}
