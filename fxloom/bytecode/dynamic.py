"""Observed dynamism: which tensor sizes a compiled function takes as symbols, and their guards.

The first call of a compiled function is static: every size is guarded by value. When a call
misses the cache and a tensor read from some source has another size than the entry assumed
(``SizePolicy.observe``), that (place, source, dimension) is remembered as *dynamic*, and
the recompile gives it a symbol of a ``ShapeEnv`` (``fxloom.values.symbolic``), as export
does for a ``Dim``. Capture then runs on stand-ins whose sizes are ``torch.SymInt``: what the
program's Python decides on them (``if x.shape[0] > 4``, a meta kernel's broadcasting test,
``x.view(b, -1)``'s divisibility) is a guard the ShapeEnv records, and the graph computes
every size it passes from its inputs (``aten.sym_size.int`` nodes, ``SizeNodes``)::

    call 1: x [2, 8]   static entry     guard: x.shape == (2, 8)
    call 2: x [1, 8]   miss: x.shape[0] changed -> dynamic
                       symbolic entry   guard: len(x.shape) == 2 and x.shape[1] == 8 (s0 free)
    call 3: x [3, 8]   symbolic entry hit; no compile

A size the program itself changes is observed without waiting for the miss (``grew_state``):
a tensor read from an outside object's attribute and assigned back with another size (a key/
value cache grown by ``torch.cat``) makes that dimension dynamic, and the entry is captured
once more with it symbolic, since the next call brings the grown tensor. A call that fills
such state (an attribute that held None or an empty tensor assigned a tensor: a key/value
cache's prefill) makes the sizes of its tensor arguments that the filled tensor took symbolic
the same way, since the next fill (another prompt) brings others: Hugging Face ``generate``
then compiles one prefill for every prompt length and one decode for every cache length.

``dynamic=True`` makes every dimension of every tensor argument symbolic from the first call,
``dynamic=False`` none (every size static, recompiling per shape).

Where the program needs a symbolic size as a plain number (``int(n)``, ``range(n)``, a native
function, a string), the ShapeEnv fixes it to the example's value with a guard (``s0 == 3``):
that entry is then valid for that size only, and ``explain()`` says why (``why_static``).
The parameters and buffers of a compiled module are never symbolic (their sizes do not change
between calls; the module epoch and the held-metadata guard cover them).

Ints and floats follow the same rule (``SizePolicy.scalars``): guarded by value on the first
call, a number whose value changed at a miss (``GuardSet.changed_sizes`` reports it with dim
None) is read at the recompile as a symbol with no range (``ShapeEnv.create_number_symbol``):
a ``torch.SymInt`` for an int, a ``torch.SymFloat`` for a float (a Python scalar, not a 0-d
tensor: type promotion stays eager's), bound to its source in the guard (``type(_s0 := L_n)
is int``) and a graph input of its own (``GraphBuilder.number_input``). What needs the plain
value (``range(n)``, a hash, ``str(n)``, native code) specialises it by a guard (``concrete``,
and ``ShapeEnv.text_is_value`` while capture runs). ``bool`` stays static. An int or float
attribute, global or outside cell that the call itself assigns another value (a step
counter) is observed like a grown cache (``grew_state``): symbolic from the first compile.

``InputSymbols`` is one compilation's part (made by ``GuardSet``): the symbols of its inputs,
the ShapeEnv, and the guard expressions over them, as Python code for the generated guard
function (``_PYTHON``: one printer per size-tree operation).

Depends on ``fxloom.values.symbolic`` (loaded when a first symbol is made: sympy is not cheap)
and ``fxloom.bytecode.sources``.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from fxloom.bytecode.marks import marks_of
from fxloom.bytecode.sources import Attr, Item, Local, Source
from fxloom.values.symbolic_scalars import SYMBOLIC_TYPES

__all__ = [
    "InputSymbols",
    "SizePolicy",
    "compiling",
    "concrete",
    "grew_state",
    "current",
]

# Numbers a changed value makes symbolic: an int becomes a ``torch.SymInt``, a float a
# ``torch.SymFloat`` (bool stays static: a branch on it is the program's structure).
SCALAR_TYPES = frozenset((int, float))

START = ("start",)  # the place of entries that start the function (pieces: their cache key)


@dataclass
class SizePolicy:
    """Per compiled function: ``mode`` (None: observed, True: all dynamic, False: all static)
    and, for observed dynamism, the dims seen to change: (place, source expr) -> dims."""

    mode: bool | None = None
    dynamic: dict[tuple[Any, str], set[int]] = field(default_factory=dict)
    # Int and float sources seen to change: (place, source expr). Whatever ``mode`` says of
    # sizes, a number is static on the first call and symbolic once it changed.
    scalars: set[tuple[Any, str]] = field(default_factory=set)
    history: list[str] = field(default_factory=list)  # "x.shape[0]: 2 -> 1", for explain()
    # source expr -> dims marked static on the tensor last read there (``observe`` skips them)
    static_marks: dict[str, frozenset[int]] = field(default_factory=dict)

    # dims declared by a ``dynamic_shapes`` spec (``dynamic={"x": {0: Dim("b")}}``), by source
    # expr of the function's start: {dim: Dim | DimHint}; filled at the first call (budget.py)
    declared: dict[str, dict[int, Any]] = field(default_factory=dict)

    def dims(self, place: Any, source: Source, tensor: torch.Tensor) -> frozenset[int]:
        """The dimensions of ``tensor`` (read from ``source``) to make symbolic: the mode's
        or those seen to change, with the tensor's marks (``fxloom.bytecode.marks``) and the
        declared ones added and its static marks taken away."""
        tensor_marks = marks_of(tensor)
        declared = self.declared.get(source.expr) if place == START else None
        if tensor_marks is None and not declared:
            return self._observed(place, source, tensor)
        if not _dense(tensor):
            return frozenset()
        found = set(self._observed(place, source, tensor))
        if tensor_marks is not None:
            found |= tensor_marks.dynamic | tensor_marks.maybe
            if tensor_marks.static:
                self.static_marks[source.expr] = tensor_marks.static
        found |= set(declared or ())
        found = {d for d in found if d < tensor.dim() and self._fits(place, source, tensor, d)}
        return frozenset(found - (tensor_marks.static if tensor_marks is not None else set()))

    def _observed(self, place: Any, source: Source, tensor: torch.Tensor) -> frozenset[int]:
        if self.mode is False or not _dense(tensor):
            return frozenset()
        if self.mode is True:
            return frozenset(range(tensor.dim()))
        found = self.dynamic.get((place, source.expr))
        return frozenset(d for d in found if d < tensor.dim()) if found else frozenset()

    def bounds(
        self, place: Any, source: Source, tensor: torch.Tensor, dim: int
    ) -> tuple[int, int | None, bool]:
        """(min, max, strict) of ``dim``'s symbol: a declared Dim's range or a marked range
        (guarded), and whether fixing it to one value is an error (``mark_dynamic``, a Dim)."""
        spec = self.declared.get(source.expr, {}).get(dim) if place == START else None
        if spec is not None:
            from fxloom.values.symbolic.dims import DimHint
            from fxloom.values.symbolic.dynamic_shapes import symbol_range

            if isinstance(spec, DimHint):
                return (spec.min or 0), spec.max, spec.kind == "DYNAMIC"
            low, high = symbol_range(spec)
            return low, high, True
        tensor_marks = marks_of(tensor)
        if tensor_marks is None:
            return 0, None, False
        low, high = tensor_marks.ranges.get(dim, (None, None))
        return (low or 0), high, dim in tensor_marks.dynamic

    def _fits(self, place: Any, source: Source, tensor: torch.Tensor, dim: int) -> bool:
        """Whether ``dim``'s size lies in its symbol's range (outside it, the entry for this
        call keeps the size static: the symbolic entry's range guard sent the call here)."""
        low, high, _ = self.bounds(place, source, tensor, dim)
        size = tensor.shape[dim]
        return low <= size and (high is None or size <= high)

    def symbolic_scalar(self, place: Any, source: Source, value: Any) -> bool:
        """Whether the int or float ``value`` read from ``source`` is taken as a symbol."""
        return (
            self.mode is not False
            and type(value) in SCALAR_TYPES
            and (place, source.expr) in self.scalars
            and (type(value) is int or math.isfinite(value))  # sympy takes symbols as finite
        )

    def observe(
        self,
        place: Any,
        changed: list[tuple[str, str, int | None, Any, Any]],
        because: str = "",
    ) -> bool:
        """Remember the dims that ``changed`` ((expr, text, dim, old, new) from
        ``GuardSet.changed_sizes``; dim None: an int or float) as dynamic; whether any was
        new. ``because``: why, where it is not a call that brought another value."""
        why = f"now symbolic: {because}" if because else "now symbolic"
        if self.mode is False:
            return False
        grew = False
        for expr, text, dim, old, new in changed:
            if dim is None:  # a number
                if (place, expr) not in self.scalars:
                    self.scalars.add((place, expr))
                    grew = True
                    self.history.append(f"{text}: {old!r} -> {new!r} ({why})")
                continue
            if dim in self.static_marks.get(expr, ()):
                continue  # mark_static: stays guarded by value
            if self.mode is not None:
                continue
            dims = self.dynamic.setdefault((place, expr), set())
            if dim not in dims:
                dims.add(dim)
                grew = True
                self.history.append(f"{text}.shape[{dim}]: {old} -> {new} ({why})")
        return grew


# The compilation running now: (policy, place). Compilations do not nest (a compiled function
# called inside another's capture is interpreted, not compiled), but a stack costs nothing.
_ACTIVE: list[tuple[SizePolicy, Any]] = []


@contextlib.contextmanager
def compiling(policy: SizePolicy | None, place: Any = START) -> Iterator[None]:
    """Capture inside the block makes the sizes ``policy`` names at ``place`` symbolic."""
    if policy is None:
        yield
        return
    _ACTIVE.append((policy, place))
    made = len(_TEXT_ENVS)
    try:
        yield
    finally:
        _ACTIVE.pop()
        for env in _TEXT_ENVS[made:]:  # capture is over: reports show expressions again
            env.text_is_value = False
        del _TEXT_ENVS[made:]


# The ShapeEnvs made by the compilations running now, whose symbolic values format as their
# values (``ShapeEnv.text_is_value``) until their capture is over.
_TEXT_ENVS: list[Any] = []


def current() -> InputSymbols | None:
    """The symbols of a new ``GuardSet``: None outside a compilation with a size policy."""
    if not _ACTIVE:
        return None
    policy, place = _ACTIVE[-1]
    if policy.mode is False:
        return None
    return InputSymbols(policy, place)


def grew_state(recording: Any) -> bool:
    """Whether the capture in ``recording`` changed the size of state the program keeps on an
    outside object, so that the caller should capture again with sizes made dynamic
    (``SizePolicy.observe``):

    * it read a tensor from an outside object's attribute and assigned that attribute a
      tensor of another size (a cache it grows: ``self.keys = torch.cat([self.keys, k],
      dim=-2)``): each such static dimension of the tensor read. The next call reads the
      grown tensor back, so a guard on the size read now would miss at once: the change is
      observed without the miss.
    * it assigned an int or float attribute, global or outside cell it read another value of
      the same type (a counter: ``self.step += 1``, ``global n; n += 1``): that number,
      which the next call brings changed.
    * it assigned a tensor to an attribute that held none, or an empty one (a cache it
      fills: the prefill of a ``DynamicCache``): each static dimension of the call's tensor
      arguments whose size the filled tensor took (``_filled_from``). The next fill (a new
      prompt) brings other sizes there, and its call would miss an entry static in them;
      symbolic, it is the same entry (what the program decides on those sizes is guarded)."""
    if not _ACTIVE:
        return False
    policy, place = _ACTIVE[-1]
    if policy.mode is not None:  # True: symbolic already; False: static by request
        return False
    read = {source.expr: (source, sizes) for source, sizes in recording.guards.tensor_sizes.items()}
    numbers = {source.expr: (source, old) for source, old in recording.guards.numbers.items()}
    grown, filled = [], []
    # numbers assigned where they were read, with another value: counters
    assigned = [(source.expr, value) for source, value in recording.changes.stored_at_sources()]
    for owner, name, value in recording.writes.values():
        owner_source = recording.source_of(owner)
        if owner_source is None:
            continue
        if type(value) in SCALAR_TYPES:  # ``self.step += 1``
            assigned.append((Attr(owner_source, name).expr, value))
            continue
        if not isinstance(value, torch.Tensor):
            continue
        found = read.get(Attr(owner_source, name).expr)
        if found is None:
            if _was_empty(owner, name) and value.numel() > 0:
                filled.append(value)
            continue
        source, (shape, dims) = found
        if value.dim() != len(shape):
            continue
        for dim, (old, new) in enumerate(zip(shape, value.shape)):
            if dim not in dims and _differs(old, new):
                grown.append((source.expr, source.text, dim, old, _example(new)))
    counted = []
    for expr, value in assigned:
        source, old = numbers.get(expr, (None, None))
        if type(value) in SCALAR_TYPES and type(old) is type(value) and old != value:
            counted.append((expr, source.text, None, old, value))
    promoted = policy.observe(place, grown, because="the program grows it")
    promoted = policy.observe(place, counted, because="the program changes it") or promoted
    filling = _filled_from(filled, read.values())
    return policy.observe(place, filling, because="state the program fills takes it") or promoted


def _was_empty(owner: Any, name: str) -> bool:
    """Whether ``owner.name`` held no tensor, or an empty one, before the call (the capture
    keeps its writes aside: the object is as the call found it). Read from the instance's
    dict: a property is not state the program fills."""
    state = getattr(owner, "__dict__", None)
    if state is None:  # slots: what it held is not known here, so not taken as empty
        return False
    held = state.get(name)
    for table in _MODULE_TENSORS:  # a module keeps its parameters and buffers apart
        if held is None and name in state.get(table, ()):
            held = state[table][name]
    return held is None or (isinstance(held, torch.Tensor) and held.numel() == 0)


# nn.Module's dicts of tensors, where ``module.name`` is found outside its ``__dict__``
_MODULE_TENSORS = ("_parameters", "_buffers")


def _filled_from(filled: list[torch.Tensor], read: Any) -> list[tuple]:
    """The static dims of the call's tensor arguments (``_argument``) whose size is one of the
    ``filled`` tensors' sizes, as ``changed_sizes`` lists changes (the new value "any")."""
    if not filled:
        return []
    taken = {int(size) for tensor in filled for size in tensor.shape if type(size) is int}
    found = []
    for source, (shape, dims) in read:
        if not _argument(source):
            continue
        for dim, size in enumerate(shape):
            if dim not in dims and size in taken:
                found.append((source.expr, source.text, dim, size, "any"))
    return found


def _argument(source: Source) -> bool:
    """Whether ``source`` is an argument of the call, or an item of one (``kwargs["mask"]``,
    ``args[0]``): what a call brings, not state read from an object's attributes."""
    while isinstance(source, Item):
        source = source.base
    return isinstance(source, Local)


def _differs(old: int, new: Any) -> bool:
    """Whether the size ``new`` (an int, or a symbolic size from the capture) is not ``old``,
    asked without adding a guard."""
    if type(new) is int:
        return new != old
    expr = new.node.expr
    return not expr.is_number or int(expr) != old


def _example(size: Any) -> Any:
    """A size's example value, for ``explain()``'s history ("?" where it has none)."""
    if type(size) is int:
        return size
    hint = size.node.hint()
    return "?" if hint is None else hint


def concrete(value: Any) -> Any:
    """``value`` with every symbolic size in it fixed to its example's value, each by a guard
    (``s0 == 3``): for native code and strings, which would otherwise read ``s0``."""
    kind = type(value)
    if kind in SYMBOLIC_TYPES:
        return value.node.pytype(value)  # int(s0): the ShapeEnv records the specialisation
    if (kind is tuple or kind is list or kind is torch.Size) and any(
        type(item) in SYMBOLIC_TYPES for item in value
    ):
        return kind(concrete(item) for item in value)
    return value


@dataclass
class _Binding:
    source: Source
    dim: int | None  # None: the source is a number itself (an int or float argument)
    symbol: Any  # sympy.Symbol
    name: str  # the generated guard's local for it: ``_s0``
    strict: bool = False  # marked dynamic: the program may not fix it (``strict_fixed``)

    @property
    def text(self) -> str:
        """How messages name it: ``x.shape[0]``, or ``n`` for a number."""
        if self.dim is None:
            return self.source.text
        return f"{self.source.text}.shape[{self.dim}]"


class InputSymbols:
    """One compilation's input symbols; see the module docstring."""

    def __init__(self, policy: SizePolicy, place: Any) -> None:
        self.policy = policy
        self.place = place
        self.env: Any = None  # made with the first symbol
        self.bindings: list[_Binding] = []
        self._tensors = 0
        self._unprintable: list[Any] = []  # guard conditions checked by sympy (``_check``)
        self._scalars: dict[str, Any] = {}  # source expr -> its SymInt / SymFloat

    def scalar(self, source: Source, value: Any) -> Any:
        """The symbol for the number ``value`` read from ``source`` (a ``torch.SymInt`` or
        ``SymFloat`` with ``value`` as its example; one per source), or None where the
        policy keeps it static (guarded by value)."""
        found = self._scalars.get(source.expr)
        if found is not None or not self.policy.symbolic_scalar(self.place, source, value):
            return found
        from fxloom.values.symbolic.sym_node import SymNode

        env = self._env()
        kind = type(value)
        # Any value: a number has no size's range (negative ones included).
        symbol = env.create_number_symbol(value, source=source.text)
        symbolic = (torch.SymInt if kind is int else torch.SymFloat)(
            SymNode(symbol, env, kind, value)
        )
        self.bindings.append(_Binding(source, None, symbol, f"_{symbol.name}"))
        self._scalars[source.expr] = symbolic
        return symbolic

    def scalar_check(self, source: Source, type_constant: str) -> str:
        """The guard of a symbolic number: its exact type, binding the guard's local to it
        (``type(_s1 := L_n) is K3``); what the program decided on it follows
        (``shape_guards``)."""
        binding = next(b for b in self.bindings if b.dim is None and b.source.expr == source.expr)
        check = f"type({binding.name} := {source.expr}) is {type_constant}"
        if not binding.symbol.is_integer:  # finite: sympy's algebra (s - s == 0) assumes it
            check += f" and {binding.name} - {binding.name} == 0"
        return check

    def dims(self, source: Source, tensor: torch.Tensor) -> frozenset[int]:
        return self.policy.dims(self.place, source, tensor)

    def sizes(self, source: Source, tensor: torch.Tensor, dims: frozenset[int]) -> list[Any]:
        """``tensor``'s sizes with a new symbol for each of ``dims`` (any size: 0 and 1 too,
        until the program decides on them)."""
        from fxloom.values.symbolic import size_symint

        env = self._env()
        sizes: list[Any] = list(tensor.shape)
        for dim in sorted(dims):
            low, high, strict = self.policy.bounds(self.place, source, tensor, dim)
            size = size_symint(
                env, sizes[dim], min=low, max=high, source=f"{source.text}.shape[{dim}]"
            )
            symbol = size.node.expr
            self.bindings.append(_Binding(source, dim, symbol, f"_{symbol.name}", strict))
            sizes[dim] = size
        return sizes

    def strict_fixed(self) -> list[str]:
        """``why_static``'s lines for the sizes marked dynamic that the program fixed."""
        strict = {f"{b.source.text}.shape[{b.dim}]" for b in self.bindings if b.strict}
        return [line for line in self.why_static() if line.split(" == ")[0] in strict]

    def tensor_check(self, source: Source, tensor: torch.Tensor, dims: frozenset[int]) -> str:
        """The part of ``source``'s tensor guard on its sizes: its rank, its static sizes, and
        each symbolic one bound to the guard's local (``(_s0 := _t0[0]) >= 0``)."""
        self._tensors += 1
        shape = f"_t{self._tensors}"
        checks = [f"len({shape} := {source.expr}.shape) == {tensor.dim()}"]
        checks += [
            f"{shape}[{d}] == {size}" for d, size in enumerate(tensor.shape) if d not in dims
        ]
        for binding in self.bindings:
            if binding.source is source:
                checks.append(f"({binding.name} := {shape}[{binding.dim}]) >= 0")
        # Laid out as the stand-in is (``StandIn.with_sizes``): densely, in the example's order.
        order = _dim_order(tensor)
        if order == tuple(range(tensor.dim() - 1, -1, -1)):
            checks.append(f"{source.expr}.is_contiguous()")
        else:
            checks.append(f"DENSE({source.expr}, {order})")
        return " and ".join(checks)

    def shape_guards(self) -> list[tuple[str, str]]:
        """(Python check, text) of every condition the program's sizes were taken to meet:
        the ShapeEnv's guards and ``torch._check`` assertions, then each symbol's range."""
        if self.env is None:
            return []
        from fxloom.values.symbolic.size_trees import expr_text

        names = {b.symbol.name: b.text for b in self.bindings}
        found: list[tuple[str, str]] = []
        # The program's conditions first, so that a miss names the line that decided; then
        # each symbol's range (what the conditions narrowed it to, and what an index width did).
        for guard in (*self.env.guards, *self.env.deferred_assertions):
            where = f" ({guard.location}: {guard.code})" if guard.location else ""
            found.append((self._check(guard.expr), expr_text(guard.expr, names) + where))
        for binding in self.bindings:
            low, high = self.env.range_of(binding.symbol)
            text = names[binding.symbol.name]
            if low > 0:
                found.append((f"{binding.name} >= {int(low)}", f"{text} >= {int(low)}"))
            if high.is_finite:
                found.append((f"{binding.name} <= {int(high)}", f"{text} <= {int(high)}"))
        return found

    def _check(self, expr: Any) -> str:
        """``expr`` as a Python check; one no size tree encodes is evaluated by sympy at each
        call (slow, rare, and never skipped)."""
        try:
            return python_code(expr)
        except Exception:  # a float constant (``s > 0.5`` on a float symbol), say
            if expr in self._unprintable:  # asked again: one check
                index = self._unprintable.index(expr)
            else:
                index = len(self._unprintable)
                self._unprintable.append(expr)
            symbols = ", ".join(f"{b.symbol.name!r}: {b.name}" for b in self.bindings)
            return f"HOLDS(EXPRS[{index}], {{{symbols}}})"

    def why_static(self) -> list[str]:
        """A line per symbol the program fixed to one value: ``x.shape[0] == 3: file:line: code``."""
        if self.env is None:
            return []
        import sympy

        symbols = {b.symbol: b.text for b in self.bindings}
        lines = []
        for guard in self.env.guards:
            expr = guard.expr
            if isinstance(expr, sympy.Eq) and expr.free_symbols <= set(symbols):
                if len(expr.free_symbols) == 1 and (expr.lhs.is_Number or expr.rhs.is_Number):
                    (symbol,) = expr.free_symbols
                    value = expr.rhs if expr.rhs.is_Number else expr.lhs
                    value = int(value) if value.is_Integer else float(value)  # 9.0, not 9.000...
                    lines.append(
                        f"{symbols[symbol]} == {value}: {guard.location}: {guard.code}".rstrip(": ")
                    )
        return lines

    def value_code(self, value: Any, read: Any) -> str | None:
        """A Python expression computing the symbolic ``value`` from the sources its symbols
        are bound to (``read(expr)``: how the caller reads a source), without the graph: for
        the changes replayed when the graph raised, whose outputs never came. None where a
        symbol has no source (a value read from tensor data)."""
        expr = self.env.simplify(value.node.expr)
        by_symbol = {binding.symbol: binding for binding in self.bindings}
        reads = []
        for symbol in sorted(expr.free_symbols, key=lambda symbol: symbol.name):
            binding = by_symbol.get(symbol)
            if binding is None:
                return None
            where = binding.source.expr
            if binding.dim is not None:
                where = f"{where}.shape[{binding.dim}]"
            reads.append((binding.name, read(where)))
        try:
            code = python_code(expr)
        except Exception:
            return None
        code = f"{value.node.pytype.__name__}({code})"  # FRACTION(1, 3) * _s0 is no int
        if not reads:
            return code
        names = ", ".join(name for name, _ in reads)
        return f"(lambda {names}: {code})({', '.join(where for _, where in reads)})"

    def namespace(self) -> dict[str, Any]:
        if self.env is None:
            return {}
        return {"FLOOR": _floor, "CEIL": _ceil, "FRACTION": _fraction, "DENSE": _dense_in,
                "HOLDS": _holds, "EXPRS": self._unprintable}  # fmt: skip

    def shape_env(self) -> Any:
        """The compilation's ShapeEnv (made now if no symbol needed it yet)."""
        return self._env()

    def _env(self) -> Any:
        if self.env is None:
            self.env = _located_shape_env()
            self.env.text_is_value = True  # the program's str(n) is n's value (a guard)
            _TEXT_ENVS.append(self.env)
        return self.env


# ------------------------------------------------------------------ the ShapeEnv's lines
_LOCATED: list[type] = []


def _located_shape_env() -> Any:
    """A ShapeEnv whose guards name the interpreted program's line (the one being run by the
    bytecode interpreter), not the Python frame that called the compiled function."""
    if not _LOCATED:
        from fxloom.values.symbolic import ShapeEnv

        class LocatedShapeEnv(ShapeEnv):
            def __init__(self) -> None:
                super().__init__()
                # A size of 1 stays symbolic through broadcasting (see ShapeEnv); an operator
                # whose assertions then fail for the example runs again without it
                # (``GraphBuilder.call``), deciding by the example's value under a guard.
                self.backed_size_oblivious = True
                self.exact_floats = True  # the graph's floats are eager's (``sym_node._exact``)

            @contextlib.contextmanager
            def by_example(self) -> Iterator[None]:
                """Inside the block, ``guard_or_false`` questions are guarded by the example."""
                saved = self.backed_size_oblivious
                self.backed_size_oblivious = False
                try:
                    yield
                finally:
                    self.backed_size_oblivious = saved

            def evaluate(self, expr: Any, hint: Any, *, size_oblivious: bool = False) -> Any:
                before = len(self.guards)
                try:
                    return super().evaluate(expr, hint, size_oblivious=size_oblivious)
                finally:
                    _relocate(self.guards, before)

            def defer_assertion(self, expr: Any) -> bool:
                before = len(self.deferred_assertions)
                try:
                    return super().defer_assertion(expr)
                finally:
                    _relocate(self.deferred_assertions, before)

        _LOCATED.append(LocatedShapeEnv)
    return _LOCATED[0]()


def _relocate(guards: list, start: int) -> None:
    if len(guards) == start:
        return
    found = _interpreted_line()
    if found is None:
        return
    location, code = found
    for index in range(start, len(guards)):
        guard = guards[index]
        guards[index] = type(guard)(guard.expr, location, code)


def _interpreted_line() -> tuple[str, str] | None:
    """The user's line the bytecode interpreter is running (its innermost ``step``)."""
    interpreted = interpreted_frame()
    if interpreted is None:
        return None
    location = interpreted.location()
    return location.short, location.code or ""


def interpreted_frame() -> Any:
    """The interpreter's innermost ``Frame`` being run (its ``code`` and ``line``), or None
    outside an interpretation."""
    from fxloom.bytecode.interpreter import Interpreter

    step = Interpreter.step.__code__
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is step:
            interpreted = frame.f_locals.get("frame")
            if interpreted is not None:
                return interpreted
        frame = frame.f_back
    return None


# ------------------------------------------------------------------ guards as Python code
def python_code(expr: Any) -> str:
    """A sympy condition or size over symbols ``s<n>`` as a Python expression over the guard
    function's locals ``_s<n>`` (fully parenthesised; exact: rationals as ``Fraction``)."""
    from fxloom.values.symbolic.size_trees import fold_tree, size_tree

    return fold_tree(size_tree(expr), _PYTHON)


def _joined(operator: str) -> Any:
    return lambda tree, texts: "(" + f" {operator} ".join(texts) + ")"


def _called(name: str) -> Any:
    return lambda tree, texts: f"{name}({', '.join(texts)})"


# size-tree operation (``fxloom.values.symbolic.size_trees``) -> its Python code.
_PYTHON: dict[str, Any] = {
    "integer": str,
    "boolean": str,
    "symbol": lambda name: f"_{name}",
    "rational": lambda tree: f"FRACTION({tree[1]}, {tree[2]})",
    "add": _joined("+"),
    "mul": _joined("*"),
    "pow": lambda tree, texts: f"({texts[0]} ** {texts[1]})",
    "floordiv": _joined("//"),
    "mod": _joined("%"),
    "floor": _called("FLOOR"),
    "ceiling": _called("CEIL"),
    "max": _called("max"),
    "min": _called("min"),
    "abs": _called("abs"),
    "eq": _joined("=="),
    "ne": _joined("!="),
    "lt": _joined("<"),
    "le": _joined("<="),
    "gt": _joined(">"),
    "ge": _joined(">="),
    "and": _joined("and"),
    "or": _joined("or"),
    "not": lambda tree, texts: f"(not {texts[0]})",
}


def _holds(expr: Any, values: dict[str, int]) -> bool:
    """Whether the sympy condition ``expr`` holds for the symbols' ``values`` (by name)."""
    import sympy

    named = {
        symbol: sympy.Float(value) if type(value) is float else sympy.Integer(value)
        for symbol in expr.free_symbols
        for value in (values[symbol.name],)
    }
    return bool(expr.xreplace(named))


def _floor(value: Any) -> int:
    import math

    return math.floor(value)


def _ceil(value: Any) -> int:
    import math

    return math.ceil(value)


def _fraction(numerator: int, denominator: int) -> Any:
    from fractions import Fraction

    return Fraction(numerator, denominator)


def _dim_order(tensor: torch.Tensor) -> tuple[int, ...]:
    """``tensor``'s dimensions, innermost first (``StandIn.with_sizes``'s order)."""
    return tuple(sorted(range(tensor.dim()), key=lambda d: (tensor.stride(d), -d)))


def _dense(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` fills its memory without gaps (what ``StandIn.with_sizes`` lays out)."""
    return tensor.layout is torch.strided and _dense_in(tensor, _dim_order(tensor))


def _dense_in(tensor: torch.Tensor, order: tuple[int, ...]) -> bool:
    """Whether ``tensor`` is laid out densely with its dimensions in ``order``, innermost
    first (a dimension of size 1 may have any stride)."""
    expected = 1
    for dim in order:
        if tensor.size(dim) != 1 and tensor.stride(dim) != expected:
            return False
        expected *= tensor.size(dim)
    return True
