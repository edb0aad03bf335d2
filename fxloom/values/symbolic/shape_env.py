"""``ShapeEnv``: the one object that owns symbolic sizes, their ranges and what guards taught.

A capture creates one ``ShapeEnv``. It hands out symbols (``s0``, ``s1`` for input
sizes, ``i0`` for data-dependent values), keeps each symbol's inclusive range and
the example's value (the *hint*), and decides guards: a condition on symbols is
answered from the ranges and the facts learned so far when it can be (nothing is
recorded), otherwise it is answered with the example's value and recorded as a
``Guard`` with the user's line, and what it implies becomes a fact:

* ``s1 == s0`` (or ``s1 == 2*s0``): ``s1`` is replaced by ``s0`` (``2*s0``) everywhere;
* ``s0 >= 3``, ``s0 < 10``: the range of ``s0`` shrinks;
* ``s0 % 2 == 0``: ``s0`` is known divisible by 2 (``(s0 // 2) * 2`` simplifies to ``s0``);
* anything else is kept as a fact and answers the same question later.

A symbol declared by the user (a ``Dim``) must keep its whole range: a guard that
would narrow it, specialise it, tie it to another ``Dim`` or require divisibility
raises ``ConstraintViolationError`` naming the Dim, its range, the condition and the
line, with the fix. One kind of guard is the exception: a bound that comes from an
index width (``802816*s0 <= 2**31 - 1``, a kernel's 32-bit indexing; ``index_width``)
narrows the range instead and is kept in ``index_bounds`` for the reports.
Everything else asks this object; nothing re-derives ranges.

    >>> env = ShapeEnv()
    >>> s0 = env.create_symbol(4, dim_name="batch", min=2, max=64)
    >>> env.static_value(s0 >= 1)
    True
    >>> env.evaluate(s0 * 2 > 3, hint=True)  # decided from the range: no guard
    True
    >>> env.guards
    []

Depends on sympy, ``ranges`` and fxloom.values.frames (the user's line).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import sympy
from sympy.logic.boolalg import BooleanAtom, BooleanFunction

from fxloom.values.frames import describe_frame, program_frame
from fxloom.values.symbolic import index_width
from fxloom.values.symbolic.errors import ConstraintViolationError, DataDependentGuardError
from fxloom.values.symbolic.interpret import OPERATIONS
from fxloom.values.symbolic.ranges import Bounds, bounds

__all__ = ["ShapeEnv", "Guard", "SymbolInfo", "SpecializationRefused", "IndexNarrowing"]


class SpecializationRefused(RuntimeError):
    """A kernel asked for a symbolic size's value inside ``specialization_refused`` (the message
    says "symbolic sizes", which is how ``compute_symbolic_meta`` tells a refusal)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message} (refused: it would specialise symbolic sizes)")


@dataclass(slots=True)
class SymbolInfo:
    """What the environment knows of one symbol; ``hint`` is None for data-dependent ones."""

    symbol: sympy.Symbol
    hint: int | None
    lower: sympy.Expr
    upper: sympy.Expr
    dim_name: str | None  # the user's Dim: its range is a promise the program must keep
    source: str | None  # where the value comes from, e.g. "x.size(0)"
    # The user's range when it differs from the one reasoned with (a Dim(min=0) reasons >= 2).
    declared: tuple[int, int | None] | None = None


@dataclass(frozen=True, slots=True)
class Guard:
    """A condition that held for the example and that the captured program relies on."""

    expr: sympy.Basic
    location: str | None  # the user's "file:line"
    code: str  # the user's source line

    def __str__(self) -> str:
        return f"{self.expr}  # {self.location}: {self.code.strip()}"


@dataclass(frozen=True, slots=True)
class IndexNarrowing:
    """A guard from an index width, taken as a narrowing: ``symbol`` (None when the bound is
    on a product of sizes, then asserted when the program runs) is at most ``upper``."""

    bound: index_width.IndexBound
    fact: sympy.Basic
    symbol: sympy.Symbol | None
    upper: sympy.Expr | None
    location: str | None
    code: str


class ShapeEnv:
    """Symbols, their ranges and hints, facts learned from guards, and simplification."""

    def __init__(self) -> None:
        self.symbols: dict[sympy.Symbol, SymbolInfo] = {}
        self.replacements: dict[sympy.Symbol, sympy.Expr] = {}
        self.divisible: set[tuple[sympy.Expr, sympy.Integer]] = set()
        self.facts: set[sympy.Basic] = set()
        self.guards: list[Guard] = []
        self.deferred_assertions: list[Guard] = []
        self.index_bounds: dict[sympy.Basic, IndexNarrowing] = {}  # by the guard's fact
        self.version = 0  # bumped when a fact changes what simplification gives
        # Meta kernels ask the same questions on every call: answers per version.
        self._answers: dict[tuple[sympy.Basic, bool], bool | None] = {}
        self._answers_version = 0
        self._counters = {"s": 0, "i": 0, "f": 0}
        self._refusing_specialization = False
        # torch's ``guard_or_false``/``guard_or_true`` on a size with an example value: False
        # (True) when ranges and facts do not decide it, instead of a guard with the example's
        # answer (torch's ``backed_size_oblivious``). Sound where the caller keeps torch's
        # contract: the fallback path is right for every value, given the ``torch._check``
        # assertions it adds (which are guards here). ``fxloom.compile`` turns it on, so a
        # size of 1 stays symbolic through broadcasting; export keeps it off.
        self.backed_size_oblivious = False
        # ``str``/``repr`` of a symbolic value: its expression (``s0``: export's messages), or,
        # while ``fxloom.compile`` runs a program that may format it natively (``str([n])``,
        # ``",".join(map(str, sizes))``), its value under a guard, as ``int(n)`` is.
        self.text_is_value = False
        # Float arithmetic kept symbolic only where sympy's form rounds as Python does
        # (``sym_node._exact``), the rest fixed to its value under a guard: ``fxloom.compile``,
        # whose graphs must give eager's floats; export has no float inputs.
        self.exact_floats = False

    # ---- symbols

    def create_symbol(
        self,
        hint: int,
        *,
        min: int = 2,
        max: int | None = None,
        dim_name: str | None = None,
        source: str | None = None,
    ) -> sympy.Symbol:
        """A new size symbol ``s<n>`` with the example's value ``hint``, in ``[min, max]``.

        The default range ``[2, oo)`` is torch.export's for sizes: 0 and 1 are
        special-cased by many kernels, so an example of size 0 or 1 cannot stand for
        the others. ``dim_name`` marks the range as the user's (a ``Dim``).
        """
        upper = sympy.oo if max is None else sympy.Integer(max)
        if not min <= hint <= upper:
            name = dim_name or source or "a size"
            raise ValueError(
                f"the example's value {hint} of {name} lies outside its range [{min}, {upper}]"
            )
        return self._new_symbol("s", hint, min, upper, dim_name, source)

    def create_number_symbol(self, hint: int | float, *, source: str | None = None) -> sympy.Symbol:
        """A new symbol for a number the program reads (an int argument ``s<n>``, a float
        ``f<n>``), with the example's value ``hint`` and no range: unlike a size, any value."""
        prefix = "f" if type(hint) is float else "s"
        return self._new_symbol(prefix, hint, -sympy.oo, sympy.oo, None, source)

    def create_unbacked_symbol(
        self,
        *,
        min: int | None = 0,
        max: int | None = None,
        real: bool = False,
        source: str | None = None,
    ) -> sympy.Symbol:
        """A new symbol for a value read from tensor data: it has no example value.

        Integers are ``i<n>`` (``min=None``: unbounded below), real numbers ``f<n>``.
        """
        lower = -sympy.oo if min is None else sympy.Integer(min)
        upper = sympy.oo if max is None else sympy.Integer(max)
        return self._new_symbol("f" if real else "i", None, lower, upper, None, source)

    def _new_symbol(self, prefix, hint, lower, upper, dim_name, source) -> sympy.Symbol:
        name = f"{prefix}{self._counters[prefix]}"
        self._counters[prefix] += 1
        sign = {"positive": True} if lower >= 1 else {"nonnegative": True} if lower >= 0 else {}
        kind = {"real": True} if prefix == "f" else {"integer": True}
        symbol = sympy.Symbol(name, **kind, **sign)
        self.symbols[symbol] = SymbolInfo(
            symbol, hint, sympy.sympify(lower), upper, dim_name, source
        )
        return symbol

    def range_of(self, symbol: sympy.Symbol) -> Bounds:
        """The inclusive ``(min, max)`` of ``symbol`` as known now."""
        info = self.symbols[symbol]
        return info.lower, info.upper

    def ranges(self, *, size_oblivious: bool = False) -> dict[sympy.Symbol, Bounds]:
        """Every symbol's range; size-oblivious reasoning takes data-dependent sizes as ``>= 2``."""
        result = {}
        for symbol, info in self.symbols.items():
            lower = info.lower
            if size_oblivious and info.hint is None and lower >= 0:
                lower = sympy.Max(lower, 2)
            result[symbol] = (lower, info.upper)
        return result

    def hint_of(self, expr: sympy.Basic) -> int | float | bool | None:
        """The value of ``expr`` for the example, or None if it depends on tensor data."""
        values = {s: info.hint for s, info in self.symbols.items() if info.hint is not None}
        value = sympy.sympify(expr).xreplace({s: _number(v) for s, v in values.items()})
        if value.free_symbols:
            return None
        return _python_value(value)

    # ---- simplification

    def simplify(self, expr: sympy.Basic) -> sympy.Basic:
        """``expr`` with equal symbols replaced and divisibility facts applied."""
        expr = sympy.sympify(expr)
        if self.replacements:
            expr = expr.xreplace(self.replacements)
        if self.divisible:
            expr = expr.replace(
                lambda e: isinstance(e, (sympy.Mod, sympy.floor)), self._apply_divisibility
            )
        return expr

    def _apply_divisibility(self, expr: sympy.Basic) -> sympy.Basic:
        if isinstance(expr, sympy.Mod):
            return sympy.S.Zero if tuple(expr.args) in self.divisible else expr
        numerator, denominator = sympy.fraction(sympy.together(expr.args[0]))
        if denominator.is_Integer and (numerator, denominator) in self.divisible:
            return numerator / denominator  # floor(s0 / 2) is s0 / 2 when 2 divides s0
        return expr

    def bounds(self, expr: sympy.Basic, *, size_oblivious: bool = False) -> Bounds:
        """Inclusive bounds of ``expr`` over the ranges of its symbols."""
        return bounds(self.simplify(expr), self.ranges(size_oblivious=size_oblivious))

    # ---- deciding guards

    def static_value(self, expr: sympy.Basic, *, size_oblivious: bool = False) -> bool | None:
        """True/False when ranges and facts decide the condition ``expr``, else None."""
        if self._answers_version != self.version:  # facts changed: answers may too
            self._answers.clear()
            self._answers_version = self.version
        key = (expr, size_oblivious)
        if key not in self._answers:
            self._answers[key] = self._static_value(expr, size_oblivious)
        return self._answers[key]

    def _static_value(self, expr: sympy.Basic, size_oblivious: bool) -> bool | None:
        expr = self.simplify(expr)
        if expr in (sympy.true, sympy.false):
            return bool(expr)
        if expr in self.facts:
            return True
        if sympy.Not(expr) in self.facts:
            return False
        if _operation(expr) in _RELATION_DECISIONS:
            return self._decide_relation(expr, size_oblivious)
        return self._decide_logic(expr, size_oblivious)

    def _decide_relation(self, rel: sympy.Basic, size_oblivious: bool) -> bool | None:
        difference = sympy.expand(rel.lhs - rel.rhs)
        if difference.is_Number:
            return bool(rel.func(difference, 0))
        ranges = self.ranges(size_oblivious=size_oblivious)
        decide = _RELATION_DECISIONS[_operation(rel)]
        decided = decide(*bounds(difference, ranges))
        if decided is None:
            # Interval bounds lose that both terms share a symbol: s0*s1 - s0 is
            # unbounded, its factored form s0*(s1 - 1) is not.
            decided = decide(*bounds(sympy.factor(difference), ranges))
        return decided

    def _decide_logic(self, expr: sympy.Basic, size_oblivious: bool) -> bool | None:
        if isinstance(expr, sympy.Not):
            inner = self.static_value(expr.args[0], size_oblivious=size_oblivious)
            return None if inner is None else not inner
        if isinstance(expr, (sympy.And, sympy.Or)):
            values = [self.static_value(arg, size_oblivious=size_oblivious) for arg in expr.args]
            absorbing = isinstance(expr, sympy.Or)  # True decides an Or, False an And
            if absorbing in values:
                return absorbing
            return None if None in values else not absorbing
        return None

    def implied_by_ranges(self, expr: sympy.Basic) -> bool:
        """Whether the symbols' ranges alone make the condition ``expr`` hold (no other facts)."""
        if _operation(expr) in _RELATION_DECISIONS:
            return self._decide_relation(expr, False) is True
        return False

    def evaluate(self, expr: sympy.Basic, hint, *, size_oblivious: bool = False):
        """Decide a guard: statically when possible, else record it with the example's answer.

        ``expr`` is a condition (answered True/False) or a number-valued expression
        (answered with its value: the program specialised to ``hint``). ``hint`` is
        the example's answer, None when the expression depends on tensor data.
        """
        expr = _normalized(self.simplify(expr))
        if not _is_condition(expr):
            return self._evaluate_number(expr, hint)
        known = self.static_value(expr, size_oblivious=size_oblivious)
        if known is not None:
            return known
        location, code = _user_location()
        if hint is None:
            raise self._data_dependent(expr, location, code)
        holds = expr if hint else sympy.Not(expr)
        self._learn(holds, location, code)
        self.guards.append(Guard(holds, location, code))
        return bool(hint)

    def _evaluate_number(self, expr: sympy.Expr, hint):
        if expr.is_Number:
            return _python_value(expr)
        if self._refusing_specialization:
            raise SpecializationRefused(
                f"a kernel asked for the value of {expr}, which would fix symbolic sizes"
            )
        location, code = _user_location()
        if hint is None:
            raise self._data_dependent(expr, location, code, as_number=True)
        holds = sympy.Eq(expr, hint)
        self._learn(holds, location, code)
        self.guards.append(Guard(holds, location, code))
        return hint

    def defer_assertion(self, expr: sympy.Basic) -> bool:
        """Assume ``expr`` (a ``torch._check``-style promise): a fact now, a runtime check later."""
        expr = self.simplify(expr)
        if self.static_value(expr) is True:
            return True
        location, code = _user_location()
        self._learn(expr, location, code)
        self.deferred_assertions.append(Guard(expr, location, code))
        return True

    def _data_dependent(self, expr, location, code, as_number=False) -> DataDependentGuardError:
        unbacked = sorted(
            (s for s in expr.free_symbols if self.symbols[s].hint is None), key=lambda s: s.name
        )
        read = ", ".join(f"{s} from {self.symbols[s].source or 'tensor data'}" for s in unbacked)
        if as_number:  # int(n), range(n), a list index: a Python number is asked for
            what = f"needs {expr} as a Python number"
            fix = (
                "keep it symbolic: use n = t.item() and pass n to operators (torch.zeros(n), "
                "x[:n]), with torch._check(...) for what you know of it"
            )
        else:
            what = f"branches on {expr}"
            fix = (
                "state what you know with torch._check(...) before this line, or branch "
                "with fxloom.cond(pred, true_fn, false_fn, operands)"
            )
        return DataDependentGuardError(
            f"the program {what}, which depends on tensor data ({read}), at "
            f"{location}: {code}\nFix: {fix}.",
            condition=expr,
            location=location,
        )

    # ---- trying things

    @contextlib.contextmanager
    def specialization_refused(self, refuse: bool = True) -> Iterator[None]:
        """Inside the block (if ``refuse``), asking for a symbolic size as a number raises
        ``SpecializationRefused`` instead of fixing it to the example's value."""
        saved = self._refusing_specialization
        self._refusing_specialization = refuse
        try:
            yield
        finally:
            self._refusing_specialization = saved

    @contextlib.contextmanager
    def rollback_on_error(self) -> Iterator[None]:
        """Undo every guard, fact and range change made inside the block if it raises.

        An attempt that fails half-way (a C++ kernel that guarded on a size, then
        refused symbolic sizes) must not leave its guards behind.
        """
        saved = self._state()
        try:
            yield
        except BaseException:
            self._restore(saved)
            raise

    def _state(self) -> tuple:
        ranges = {symbol: (info.lower, info.upper) for symbol, info in self.symbols.items()}
        collections = (
            dict(self.replacements),
            set(self.divisible),
            set(self.facts),
            dict(self.index_bounds),
        )
        return ranges, collections, len(self.guards), len(self.deferred_assertions)

    def _restore(self, saved: tuple) -> None:
        ranges, collections, guards, deferred = saved
        for symbol, (lower, upper) in ranges.items():
            self.symbols[symbol].lower, self.symbols[symbol].upper = lower, upper
        self.replacements, self.divisible, self.facts, self.index_bounds = collections
        del self.guards[guards:], self.deferred_assertions[deferred:]
        self.version += 1  # a new version: what was simplified meanwhile is stale

    # ---- learning facts

    def _learn(self, fact: sympy.Basic, location: str | None, code: str) -> None:
        bound = index_width.upper_bound(fact)
        if bound is not None:  # narrows a Dim's range, never refuses it (index_width)
            self._learn_index_bound(bound, fact, location, code)
            self.facts.add(fact)
            self.version += 1
            return
        if _operation(fact) == "eq":
            self._learn_equality(fact, location, code)
        elif _operation(fact) in _AT_LEAST_ZERO and _over_integers(fact):
            # Ranges are of integers (``s > 1`` is ``s >= 2``); a relation on a float symbol
            # stays a fact.
            self._learn_bound(fact, location, code)
        # What the learners above could not turn into a range or a replacement (a product,
        # a sum of two Dims, s0 != 3) is still a promise the declared ranges do not make.
        declared = [s for s in fact.free_symbols if self._is_declared(s)]
        if declared and len(declared) == len(fact.free_symbols):
            self._refuse_if_declared(declared[0], fact, location, code)
        self.facts.add(fact)
        self.version += 1

    def _learn_index_bound(self, bound, fact, location, code) -> None:
        """``bound.expr <= bound.limit``: on one size, its upper end moves there; on a product
        of sizes, it stays a fact (and a guard, asserted when the program runs)."""
        symbol = upper = None
        if len(bound.expr.free_symbols) == 1:
            (candidate,) = bound.expr.free_symbols
            slope = bound.expr.coeff(candidate)
            offset = sympy.expand(bound.expr - slope * candidate)
            if slope.is_Rational and slope > 0 and offset.is_Number:
                info = self.symbols[candidate]
                symbol = candidate
                upper = sympy.Min(info.upper, sympy.floor((bound.limit - offset) / slope))
                if upper < info.lower:
                    raise ValueError(
                        f"{fact} leaves no value for {symbol} in [{info.lower}, {info.upper}] "
                        f"at {location}"
                    )
                info.upper = upper
        self.index_bounds[fact] = IndexNarrowing(bound, fact, symbol, upper, location, code)

    def _learn_equality(self, fact: sympy.Eq, location, code) -> None:
        difference = sympy.expand(fact.lhs - fact.rhs)
        _, term = difference.as_coeff_Mul()  # 3*Mod(s0, 2) == 0 says what Mod(s0, 2) == 0 does
        if isinstance(term, sympy.Mod):
            self._learn_divisibility(term, fact, location, code)
            return
        solved = self._solve_for_one_symbol(difference)
        if solved is None:
            return
        symbol, solution = solved
        self._refuse_if_declared(symbol, fact, location, code, solution=solution)
        self._transfer_range(symbol, solution, fact, location, code)
        self.replacements = {
            s: e.xreplace({symbol: solution}) for s, e in self.replacements.items()
        }
        self.replacements[symbol] = solution

    def _solve_for_one_symbol(self, difference: sympy.Expr):
        """``(symbol, solution)`` for ``difference == 0``, eliminating a user-free, newest symbol."""
        order = sorted(difference.free_symbols, key=self._elimination_rank)
        for symbol in order:
            coefficient = difference.coeff(symbol)
            rest = sympy.expand(difference - coefficient * symbol)
            if coefficient in (1, -1) and symbol not in rest.free_symbols:
                return symbol, sympy.expand(-rest / coefficient)
        return None

    def _is_declared(self, symbol: sympy.Symbol) -> bool:
        info = self.symbols.get(symbol)
        return info is not None and info.dim_name is not None

    def _elimination_rank(self, symbol: sympy.Symbol):
        info = self.symbols.get(symbol)
        declared = info is not None and info.dim_name is not None
        return (declared, -int(symbol.name[1:]) if symbol.name[1:].isdigit() else 0)

    def _learn_divisibility(self, mod: sympy.Mod, fact, location, code) -> None:
        dividend, divisor = mod.args
        for symbol in dividend.free_symbols:
            self._refuse_if_declared(symbol, fact, location, code)
        self.divisible.add((dividend, divisor))

    def _learn_bound(self, fact, location, code) -> None:
        # Normalise to `e >= 0` over the integers.
        difference = sympy.expand(fact.lhs - fact.rhs)
        nonnegative = _AT_LEAST_ZERO[_operation(fact)](difference)
        if len(nonnegative.free_symbols) != 1:
            return
        (symbol,) = nonnegative.free_symbols
        slope = nonnegative.coeff(symbol)
        offset = sympy.expand(nonnegative - slope * symbol)
        if not (slope.is_Rational and offset.is_Number) or slope == 0:
            return  # s0/2 >= 3 bounds s0 too (a rational slope, after a divisibility fact)
        limit = -offset / slope
        if slope > 0:
            self._narrow(symbol, sympy.ceiling(limit), None, fact, location, code)
        else:
            self._narrow(symbol, None, sympy.floor(limit), fact, location, code)

    def _transfer_range(self, symbol, solution, fact, location, code) -> None:
        """The range of an eliminated symbol constrains the symbol of its replacement."""
        lower, upper = self.range_of(symbol)
        if solution.is_Number:  # specialised: its range is that one value
            self._narrow(symbol, solution, solution, fact, location, code)
            return
        if len(solution.free_symbols) != 1:
            return
        (other,) = solution.free_symbols
        if not other.is_integer:  # a float's range is not rounded to integers
            return
        slope = solution.coeff(other)
        offset = sympy.expand(solution - slope * other)
        if not (slope.is_Integer and slope > 0 and offset.is_Number):
            return
        self._narrow(
            other,
            sympy.ceiling((lower - offset) / slope),
            sympy.floor((upper - offset) / slope),
            fact,
            location,
            code,
        )

    def _narrow(self, symbol, lower, upper, fact, location, code) -> None:
        info = self.symbols[symbol]
        new_lower = info.lower if lower is None else sympy.Max(info.lower, lower)
        new_upper = info.upper if upper is None else sympy.Min(info.upper, upper)
        if (new_lower, new_upper) == (info.lower, info.upper):
            return
        self._refuse_if_declared(symbol, fact, location, code, new_range=(new_lower, new_upper))
        if new_lower > new_upper:
            raise ValueError(
                f"{fact} leaves no value for {symbol} in [{info.lower}, {info.upper}] at {location}"
            )
        info.lower, info.upper = new_lower, new_upper

    def _refuse_if_declared(
        self, symbol, fact, location, code, *, solution=None, new_range=None
    ) -> None:
        info = self.symbols.get(symbol)
        if info is None or info.dim_name is None:
            return
        declared = info.declared or (info.lower, info.upper)
        advice = _advice(info, fact, solution, new_range, self.symbols)
        high = "oo" if declared[1] in (None, sympy.oo) else declared[1]
        message = (
            f"Dim {info.dim_name!r} ({symbol}) was declared with range [{declared[0]}, {high}], "
            f"but the program requires {fact} at {location or 'an unknown line'}: {code or ''}\n"
            f"{advice}"
        )
        raise ConstraintViolationError(
            message,
            symbol=symbol,
            dim_name=info.dim_name,
            declared=declared,
            condition=fact,
            location=location,
        )


def _advice(info: SymbolInfo, fact, solution, new_range, symbols) -> str:
    name = info.dim_name
    if new_range is not None:
        low, high = new_range
        if info.declared is not None and low == info.lower:  # the lower end is not the issue
            low = info.declared[0]
        high_text = "" if high == sympy.oo else f", max={high}"
        return f"Fix: declare Dim({name!r}, min={low}{high_text}), or change the program."
    if solution is not None and solution.is_Number:
        return f"Fix: the program specialises {name} to {solution}; make that dimension static (drop {name!r} from dynamic_shapes)."
    if solution is not None:
        named = solution.xreplace(
            {s: sympy.Symbol(i.dim_name or s.name) for s, i in symbols.items()}
        )
        return f"Fix: use one Dim for both sizes, or the derived Dim {name} = {named}."
    if fact.has(sympy.Mod):
        return f"Fix: {name} must be a multiple here; declare it as a derived Dim (e.g. 2 * Dim('{name}_half'))."
    return f"Fix: the declared range does not promise this; make {name} static (drop it from dynamic_shapes), or change the program."


def _operation(expr: sympy.Basic) -> str | None:
    """``expr``'s operation name (``fxloom.values.symbolic.interpret``), None for a leaf."""
    return OPERATIONS.get(type(expr))


# relation (by operation name) -> whether it holds, from the bounds of lhs - rhs (None: unknown).
_RELATION_DECISIONS = {
    "eq": lambda low, high: True if low == high == 0 else False if low > 0 or high < 0 else None,
    "ne": lambda low, high: False if low == high == 0 else True if low > 0 or high < 0 else None,
    "gt": lambda low, high: True if low > 0 else False if high <= 0 else None,
    "ge": lambda low, high: True if low >= 0 else False if high < 0 else None,
    "lt": lambda low, high: True if high < 0 else False if low >= 0 else None,
    "le": lambda low, high: True if high <= 0 else False if low > 0 else None,
}

# inequality (by operation name) -> the integer expression, from lhs - rhs, that it says is >= 0.
_AT_LEAST_ZERO = {
    "ge": lambda difference: difference,
    "gt": lambda difference: difference - 1,
    "le": lambda difference: -difference,
    "lt": lambda difference: -difference - 1,
}


def _normalized(expr: sympy.Basic) -> sympy.Basic:
    """``3*Mod(s0, 2) == 0`` as ``Mod(s0, 2) == 0``: a relation to zero without its factor."""
    if isinstance(expr, (sympy.Eq, sympy.Ne)) and expr.rhs == 0:
        coefficient, term = expr.lhs.as_coeff_Mul()
        if coefficient.is_Number and coefficient != 0 and coefficient != 1:
            return expr.func(term, 0)
    return expr


def _is_condition(expr: sympy.Basic) -> bool:
    # A sympy Symbol is also a Boolean; conditions are relations and logic.
    return isinstance(expr, (sympy.Rel, BooleanFunction, BooleanAtom))


def _over_integers(fact: sympy.Basic) -> bool:
    """Whether every symbol of ``fact`` is an integer (no float symbol, ``create_number_symbol``)."""
    return all(symbol.is_integer for symbol in fact.free_symbols)


def _number(value: int | float) -> sympy.Number:
    """A symbol's example value as sympy's number: exact for ints, the same double for floats."""
    return sympy.Float(value) if type(value) is float else sympy.Integer(value)


def _python_value(value: sympy.Basic):
    if value in (sympy.true, sympy.false):
        return bool(value)
    if value.is_Integer:
        return int(value)
    return float(value)


def _user_location() -> tuple[str | None, str]:
    """The user's ``file:line`` and source line: the first frame outside fxloom and torch."""
    location, code = describe_frame(program_frame(2))
    return location, code.strip()
