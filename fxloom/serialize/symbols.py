"""Symbolic sizes in a saved exported program: sympy expressions as JSON trees, and the ShapeEnv.

An expression is written as a tree over the one table of sympy classes
(``fxloom.values.symbolic.interpret``: sums, products, powers, ``Mod``, ``floor``,
``Max``, relations, ``And``/``Or``/``Not``..., each by its ``SAVED_NAMES`` entry);
writing is an analysis folded by ``interpret`` (``ENCODERS``), reading builds each
operation's class from the same table::

    2*s0 + 1   ->   {"op": "Add", "args": [1, {"op": "Mul", "args": [2, {"symbol": "s0"}]}]}

Integers are JSON integers, ``true``/``false`` sympy's booleans, ``"oo"``/``"-oo"``
infinity, ``{"rational": [p, q]}`` and ``{"float": x}`` other numbers, and
``{"symbol": name}`` one of the ShapeEnv's symbols, declared once with its
assumptions. Reading builds each node by calling its class from the table on
its arguments: no text is parsed (never ``sympify``), nothing is imported, and
numbers and powers are bounded so a file cannot ask for a huge computation.

``encode_shape_env``/``decode_shape_env`` write and read the ShapeEnv
(symbols with hint, range, Dim name, source and declared range; replacements,
divisibility facts, facts, guards and deferred assertions). ``SymbolicCodecs``
is the ``MetaCodecs`` that writes the symbolic sizes of ``meta["val"]`` and
reads them back as ``torch.SymInt`` of the loaded ShapeEnv, in ``StandIn``s
like the ones export makes.

Depends on sympy, ``fxloom.values.symbolic`` and ``fxloom.serialize.meta``.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import sympy
import torch
from sympy.logic.boolalg import Boolean

from fxloom.serialize import limits
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.meta import MetaCodecs
from fxloom.serialize.values import expect_pair, short
from fxloom.values.stand_in import StandIn
from fxloom.values.symbolic.interpret import CLASSES, OPERAND_KINDS, SAVED_NAMES, interpret
from fxloom.values.symbolic.shape_env import Guard, ShapeEnv, SymbolInfo
from fxloom.values.symbolic.sym_node import SymNode, wrap_expr
from fxloom.values.symbolic_scalars import SYMBOLIC_TYPES

__all__ = [
    "ENCODERS",
    "encode_expr",
    "decode_expr",
    "encode_shape_env",
    "decode_shape_env",
    "ExpressionBudget",
    "expression_budget",
    "SymbolicCodecs",
]

# The name a file writes for each operation -> the operation (its class is CLASSES[operation]):
# read from the one table of sympy classes, so decoding cannot drift from it.
_OPERATION_SAVED_AS: dict[str, str] = {name: operation for operation, name in SAVED_NAMES.items()}
# What the operands of an operation must be, as sympy types.
_OPERAND_TYPES: dict[str, type] = {"number": sympy.Expr, "condition": Boolean}
_SYMBOL_NAME = re.compile(r"[sif][0-9]{1,9}")
_PYTYPES = {"int": int, "float": float, "bool": bool}


# ------------------------------------------------------------------ expressions
def _saved_as(name: str) -> Callable[[sympy.Basic, list[Any]], Any]:
    return lambda expr, args: {"op": name, "args": args}


# operation (fxloom.values.symbolic.interpret) -> its JSON tree from its operands' trees.
ENCODERS: dict[str, Callable[..., Any]] = {
    "boolean": bool,
    "infinity": lambda expr: "oo" if expr == sympy.oo else "-oo",
    "integer": int,
    "rational": lambda expr: {"rational": [int(expr.p), int(expr.q)]},
    "float": lambda expr: {"float": float(expr)},
    "symbol": lambda expr: {"symbol": expr.name},
    **{operation: _saved_as(name) for operation, name in SAVED_NAMES.items()},
}


def encode_expr(expr: Any, where: str = "an expression") -> Any:
    """``expr`` (a sympy expression, or a Python number) as a JSON tree."""
    if isinstance(expr, bool):
        return expr
    if isinstance(expr, (int, float)):
        expr = sympy.Integer(expr) if isinstance(expr, int) else sympy.Float(expr)

    def unsaveable(part: sympy.Basic) -> Any:
        raise SerializationError(
            f"cannot save {where}: {part} uses {type(part).__name__}, which is not among the "
            "sympy classes a file may hold (fxloom.values.symbolic.interpret.SAVED_NAMES)"
        )

    return interpret(expr, ENCODERS, default=unsaveable)


def decode_expr(
    data: Any, symbols: dict[str, sympy.Symbol], where: str, budget: ExpressionBudget | None = None
) -> sympy.Basic:
    """The sympy expression of ``data``; ``symbols`` are the names it may use.

    Nodes are built unevaluated (``evaluate=False``): a file's expression is read as
    written, and no simplification runs while loading. ``budget`` is the file's (see
    ``ExpressionBudget``); without one, this expression gets a budget of its own.
    """
    budget = budget if budget is not None else ExpressionBudget()
    return _ExpressionReader(symbols, where, budget).read(data, 0).expr


class ExpressionBudget:
    """What all the expressions of one file may still cost (``limits.MAX_EXPRESSION_NODES``).

    One budget per file, not per expression: a file of many small expressions is as
    bounded as one of a single large one.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limits.MAX_EXPRESSION_NODES if limit is None else limit
        self.spent = 0

    def charge(self, cost: int, where: str) -> None:
        self.spent += cost
        if self.spent > self.limit:
            raise limits.exceeded(
                f"{where}: the size of the file's symbolic expressions", self.limit, self.spent
            )


# The budget of the file each decoded ShapeEnv came from: its sizes and range constraints
# are charged to it too.
_BUDGETS: weakref.WeakKeyDictionary[ShapeEnv, ExpressionBudget] = weakref.WeakKeyDictionary()


def expression_budget(env: ShapeEnv | None) -> ExpressionBudget:
    """The budget of the file ``env`` was read from (a fresh one for any other env)."""
    found = _BUDGETS.get(env) if env is not None else None
    return found if found is not None else ExpressionBudget()


class _Decoded(NamedTuple):
    expr: sympy.Basic
    nodes: int  # nodes of its tree
    bits: int  # an upper bound on the bits its value needs at sizes below limits.MAX_INTEGER


_SIZE_BITS = (limits.MAX_INTEGER - 1).bit_length()
_INFINITIES = {"oo": sympy.oo, "-oo": -sympy.oo}


class _ExpressionReader:
    """Reads one expression tree, charging ``budget`` and bounding depth, arguments and bits."""

    def __init__(self, symbols: dict, where: str, budget: ExpressionBudget) -> None:
        self.symbols, self.where, self.budget = symbols, where, budget

    def read(self, data: Any, depth: int) -> _Decoded:
        self.budget.charge(1, self.where)
        if depth > limits.MAX_EXPRESSION_DEPTH:
            raise limits.exceeded(
                f"{self.where}: the nesting of an expression", limits.MAX_EXPRESSION_DEPTH, depth
            )
        if isinstance(data, bool):
            return _Decoded(sympy.true if data else sympy.false, 1, 1)
        if type(data) is int:
            return _Decoded(sympy.Integer(_bounded(data, self.where)), 1, data.bit_length())
        if isinstance(data, str) and data in _INFINITIES:
            return _Decoded(_INFINITIES[data], 1, 1)
        if not isinstance(data, dict) or len(data) not in (1, 2):
            raise SerializationError(f"{self.where}: invalid expression {short(data)}")
        if len(data) == 1:
            return self.leaf(data)
        return self.node(data, depth)

    def leaf(self, data: dict) -> _Decoded:
        ((kind, body),) = data.items()
        where = self.where
        if kind == "symbol":
            symbol = self.symbols.get(body) if isinstance(body, str) else None
            if symbol is None:
                raise SerializationError(f"{where}: unknown symbol {short(body)}")
            return _Decoded(symbol, 1, _SIZE_BITS)
        if kind == "rational":
            p, q = _pair_of_ints(body, where)
            if q == 0:
                raise SerializationError(f"{where}: a rational with denominator 0")
            return _Decoded(sympy.Rational(p, q), 1, max(p.bit_length(), q.bit_length()))
        if kind == "float":
            if not isinstance(body, (int, float)) or isinstance(body, bool):
                raise SerializationError(f"{where}: invalid float {short(body)}")
            return _Decoded(sympy.Float(body), 1, _SIZE_BITS)
        raise SerializationError(f"{where}: invalid expression {short(data)}")

    def node(self, data: dict, depth: int) -> _Decoded:
        where, name, args = self.where, data.get("op"), data.get("args")
        operation = _OPERATION_SAVED_AS.get(name) if isinstance(name, str) else None
        if operation is None or set(data) != {"op", "args"} or not isinstance(args, list):
            raise SerializationError(f"{where}: invalid expression {short(data)}")
        most = limits.MAX_EXPRESSION_ARGUMENTS.get(name, limits.MAX_OTHER_EXPRESSION_ARGUMENTS)
        if len(args) > most:
            raise limits.exceeded(f"{where}: the argument count of one {name}", most, len(args))
        decoded = [self.read(arg, depth + 1) for arg in args]
        kind = _OPERAND_TYPES.get(OPERAND_KINDS.get(operation, ""))
        if kind is not None and not all(isinstance(d.expr, kind) for d in decoded):
            raise SerializationError(
                f"{where}: {name} of {short(args)} mixes numbers and truth values"
            )
        nodes = 1 + sum(d.nodes for d in decoded)
        if name in limits.MAX_EXPRESSION_ARGUMENTS:  # evaluating it compares arguments pairwise
            self.budget.charge(len(decoded) * (nodes - 1), where)
        bits = _bits(operation, decoded, where)
        if bits > limits.MAX_EXPRESSION_BITS:
            what = f"{where}: the bits the value of a {name} may need"
            raise limits.exceeded(what, limits.MAX_EXPRESSION_BITS, bits)
        return _Decoded(_build(operation, name, [d.expr for d in decoded], where), nodes, bits)


def _bits(operation: str, args: list[_Decoded], where: str) -> int:
    """An upper bound on the bits of the operation's value, from its arguments' bounds."""
    if operation == "mul":
        return sum(a.bits for a in args)
    if operation == "pow":
        return args[0].bits * _exponent(args, where)
    widest = max((a.bits for a in args), default=1)
    return widest + len(args).bit_length() if operation == "add" else widest


def _exponent(args: list[_Decoded], where: str) -> int:
    """The size of a power's exponent: a number (a size's power or inverse), and a small one."""
    if len(args) != 2:
        raise SerializationError(f"{where}: a power takes a base and an exponent")
    exponent = args[1].expr
    if not exponent.is_Rational:
        raise SerializationError(
            f"{where}: the exponent {short(exponent)} is not a number; refused"
        )
    size = max(abs(exponent.p), 1)
    if size > limits.MAX_EXPONENT:
        raise limits.exceeded(f"{where}: the exponent of a power", limits.MAX_EXPONENT, size)
    return size


# Operations built without ``evaluate=False``: they do no work on their arguments anyway.
_ALWAYS_EVALUATED = frozenset({"case"})


def _build(operation: str, name: str, args: list[sympy.Basic], where: str) -> sympy.Basic:
    cls = CLASSES[operation]
    try:
        if operation in _ALWAYS_EVALUATED:
            return cls(*args)
        return cls(*args, evaluate=False)
    except (TypeError, ValueError, AttributeError) as e:
        raise SerializationError(f"{where}: cannot build {name}: {e}") from None


def _bounded(value: int, where: str) -> int:
    if abs(value) > limits.MAX_INTEGER:
        found = f"an integer of {value.bit_length()} bits"
        raise limits.exceeded(f"{where}: the magnitude of an integer", limits.MAX_INTEGER, found)
    return value


def _pair_of_ints(data: Any, where: str) -> tuple[int, int]:
    if not isinstance(data, list) or len(data) != 2 or not all(type(v) is int for v in data):
        raise SerializationError(f"{where}: expected two integers, found {short(data)}")
    return _bounded(data[0], where), _bounded(data[1], where)


# ------------------------------------------------------------------ the ShapeEnv
def encode_shape_env(env: ShapeEnv) -> dict[str, Any]:
    """What a loaded program's ``ShapeEnv`` needs to answer what the original's did."""
    return {
        "symbols": [_encode_symbol(info) for info in env.symbols.values()],
        "replacements": [
            [symbol.name, encode_expr(expr, f"the replacement of {symbol}")]
            for symbol, expr in env.replacements.items()
        ],
        "divisible": [
            [encode_expr(e, "a divisibility fact"), encode_expr(d, "a divisibility fact")]
            for e, d in sorted(env.divisible, key=str)
        ],
        "facts": [encode_expr(fact, "a fact") for fact in sorted(env.facts, key=str)],
        "guards": [_encode_guard(guard) for guard in env.guards],
        "deferred_assertions": [_encode_guard(guard) for guard in env.deferred_assertions],
    }


def _encode_symbol(info: SymbolInfo) -> dict[str, Any]:
    symbol = info.symbol
    return {
        "name": symbol.name,
        "integer": bool(symbol.is_integer),
        "sign": "positive"
        if symbol.is_positive
        else "nonnegative"
        if symbol.is_nonnegative
        else None,
        "hint": info.hint,
        "lower": encode_expr(info.lower, f"the range of {symbol}"),
        "upper": encode_expr(info.upper, f"the range of {symbol}"),
        "dim_name": info.dim_name,
        "source": info.source,
        "declared": None if info.declared is None else [_plain_bound(b) for b in info.declared],
    }


def _plain_bound(bound: Any) -> int | None:
    return None if bound is None or bound == sympy.oo else int(bound)


def _encode_guard(guard: Guard) -> dict[str, Any]:
    return {
        "expr": encode_expr(guard.expr, "a guard"),
        "location": guard.location,
        "code": guard.code,
    }


def decode_shape_env(data: Any, where: str = "shape_env") -> ShapeEnv:
    """The ShapeEnv ``data`` describes; its expressions, and later the sizes and range
    constraints decoded for it, share one budget (``expression_budget(env)``)."""
    if not isinstance(data, dict):
        raise SerializationError(f"{where}: expected an object")
    env = ShapeEnv()
    budget = _BUDGETS.setdefault(env, ExpressionBudget())
    symbols: dict[str, sympy.Symbol] = {}
    for record in _list(data, "symbols", where):
        info = _decode_symbol(record, env, where, budget)
        if info.symbol.name in symbols:  # by name: a set, not a scan per symbol
            raise SerializationError(f"{where}, symbol {info.symbol.name}: declared twice")
        symbols[info.symbol.name] = info.symbol
        env.symbols[info.symbol] = info
    for record in _list(data, "replacements", where):
        name, expr = expect_pair(record, where)
        if name not in symbols:
            raise SerializationError(f"{where}: a replacement of the unknown symbol {short(name)}")
        env.replacements[symbols[name]] = decode_expr(
            expr, symbols, f"{where}, replacements", budget
        )
    for record in _list(data, "divisible", where):
        dividend, divisor = expect_pair(record, where)
        env.divisible.add(
            (
                decode_expr(dividend, symbols, f"{where}, divisible", budget),
                decode_expr(divisor, symbols, f"{where}, divisible", budget),
            )
        )
    env.facts.update(
        decode_expr(fact, symbols, f"{where}, facts", budget)
        for fact in _list(data, "facts", where)
    )
    env.guards.extend(
        _decode_guard(g, symbols, where, budget) for g in _list(data, "guards", where)
    )
    env.deferred_assertions.extend(
        _decode_guard(g, symbols, where, budget) for g in _list(data, "deferred_assertions", where)
    )
    env.version = 1
    return env


def _decode_symbol(record: Any, env: ShapeEnv, where: str, budget: ExpressionBudget) -> SymbolInfo:
    if not isinstance(record, dict):
        raise SerializationError(f"{where}: a symbol must be an object")
    name = record.get("name")
    if not isinstance(name, str) or not _SYMBOL_NAME.fullmatch(name):
        raise SerializationError(f"{where}: invalid symbol name {short(name)}")
    where = f"{where}, symbol {name}"
    sign = record.get("sign")
    if sign not in (None, "positive", "nonnegative") or not isinstance(record.get("integer"), bool):
        raise SerializationError(f"{where}: invalid assumptions")
    kind = {"integer": True} if record["integer"] else {"real": True}
    symbol = sympy.Symbol(name, **kind, **({sign: True} if sign else {}))
    prefix, index = name[0], int(name[1:])
    env._counters[prefix] = max(env._counters[prefix], index + 1)  # new symbols do not clash
    hint = record.get("hint")
    if hint is not None and type(hint) is not int:
        raise SerializationError(f"{where}: the hint must be an integer or null")
    if hint is not None:
        _bounded(hint, f"{where}: the hint")  # sizes are computed from it
    declared = record.get("declared")
    if declared is not None:
        if (
            not isinstance(declared, list)
            or len(declared) != 2
            or type(declared[0]) is not int
            or not (declared[1] is None or type(declared[1]) is int)
        ):
            raise SerializationError(f"{where}: invalid declared range {short(declared)}")
        declared = (declared[0], declared[1])
    lower = decode_expr(record.get("lower"), {}, where, budget)
    upper = decode_expr(record.get("upper"), {}, where, budget)
    if not (lower.is_Integer or lower == -sympy.oo) or not (upper.is_Integer or upper == sympy.oo):
        raise SerializationError(f"{where}: the range must be integers or infinite")
    return SymbolInfo(
        symbol,
        hint,
        lower,
        upper,
        _optional_string(record.get("dim_name"), where),
        _optional_string(record.get("source"), where),
        declared,
    )


def _decode_guard(data: Any, symbols: dict, where: str, budget: ExpressionBudget) -> Guard:
    if not isinstance(data, dict) or not isinstance(data.get("code"), str):
        raise SerializationError(f"{where}: a guard needs an expression and its source line")
    return Guard(
        decode_expr(data.get("expr"), symbols, f"{where}, guard", budget),
        _optional_string(data.get("location"), where),
        data["code"],
    )


def _optional_string(value: Any, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise SerializationError(f"{where}: expected a string or null, found {short(value)}")
    return value


def _list(data: dict, key: str, where: str) -> list:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise SerializationError(f"{where}: {key} must be a list")
    return value


# ------------------------------------------------------------------ meta["val"]
class SymbolicCodecs(MetaCodecs):
    """Sizes of ``meta["val"]`` as expressions over ``env``'s symbols; tensors as ``StandIn``s.

    A symbolic size is written ``{"expr": <tree>, "type": "int"}`` and read back as a
    ``torch.SymInt`` (``SymFloat``, ``SymBool``) of ``env``, with its hint from
    ``env``; a plain size stays an integer.
    """

    def __init__(self, env: ShapeEnv | None) -> None:
        self.env = env
        self.symbols = {s.name: s for s in env.symbols} if env is not None else {}
        self.budget = expression_budget(env)  # the file's, when env was read from one

    def encode_size(self, size: Any, where: str) -> Any:
        if not isinstance(size, SYMBOLIC_TYPES):
            return size
        node = size.node
        if not isinstance(node, SymNode) or node.env is not self.env:
            raise SerializationError(
                f"{where}: the symbolic size {size} does not belong to the program's ShapeEnv"
            )
        pytype = {int: "int", float: "float", bool: "bool"}[node.pytype]
        return {"expr": encode_expr(node.expr, where), "type": pytype}

    def decode_size(self, data: Any, where: str) -> Any:
        if type(data) is int:
            return data
        if not isinstance(data, dict) or set(data) != {"expr", "type"}:
            raise SerializationError(f"{where}: invalid size {short(data)}")
        pytype = _PYTYPES.get(data["type"]) if isinstance(data["type"], str) else None
        if pytype is None or self.env is None:
            raise SerializationError(f"{where}: invalid symbolic size {short(data)}")
        expr = decode_expr(data["expr"], self.symbols, where, self.budget)
        if pytype is int and expr.is_Integer:
            return int(expr)
        return wrap_expr(self.env, expr, pytype)

    def make_tensor(
        self,
        sizes: list[Any],
        strides: list[Any],
        dtype: torch.dtype,
        where: str,
        device: torch.device | None = None,
    ) -> Any:
        meta = super().make_tensor(sizes, strides, dtype, where)
        return StandIn(meta, device if device is not None else torch.device("cpu"))
