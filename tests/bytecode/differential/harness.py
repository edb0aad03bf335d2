"""Running one case eagerly and through ``fxloom.compile``, call by call, and comparing.

A ``Case`` is Python source that defines ``f`` (and the outside state ``f`` reads and
writes: globals, classes, closures), and a sequence of ``Call``s. ``run_case`` execs the
source into two fresh modules, deep-copies the calls once per side (so an argument passed to
several calls is one object on each side, and aliases stay aliases), then for every call runs
its ``before`` action (outside state advanced, an input changed in place) on both sides, calls
eager ``f`` and the compiled one under the call's grad mode, and compares, in this order:

- exceptions (type and message); a compiled call that raises where eager did not is a crash;
- results (``compare``), printed text, the arguments afterwards (in-place changes), the
  module's state afterwards (``module_state``: globals, containers, class attributes) and
  ``f``'s closure cells;
- the cache: a call identical to the one before it (same arguments by value, layout and
  aliasing, same outside state, same grad mode) compiles nothing, and the function's
  top-level entries never outnumber the distinct calls made.

The first difference ends the case and is returned as a ``Failure`` of one ``KINDS`` kind.
"""

from __future__ import annotations

import contextlib
import copy
import io
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import fxloom
from differential.compare import (
    PROGRAM_MODULE,
    Mismatch,
    compare,
    module_state,
    same_error,
    snapshot,
)

# The kinds of failure, the first one found in a call in this order.
KINDS = (
    "crash",  # compiled raised where eager returned
    "missed exception",  # eager raised, compiled returned
    "exception differs",
    "result",
    "printed text",
    "arguments",  # the arguments after the call (in-place changes)
    "outside state",
    "recompiled on an identical call",
    "recompiled on every repeated call",  # identical but for write-only globals, twice running
    "cache unbounded",
)


@dataclass
class Call:
    """One call: ``f(*args, **kwargs)`` under ``grad`` mode, after ``before(namespace, args,
    kwargs)`` ran on that side (None: nothing). ``label`` says what this call varies."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    label: str = ""
    before: Callable[[dict, tuple, dict], None] | None = None
    grad: bool = True


@dataclass
class Case:
    source: str
    calls: list[Call]
    name: str = "case"
    # globals the program only writes (appends, items set): their changes do not make the
    # next call a different one for the identical-call check
    write_only: frozenset[str] = frozenset()

    def describe(self) -> str:
        return f"program:\n{self.source}\ncalls:\n{describe_calls(self.calls)}"


@dataclass
class Failure:
    kind: str
    call: int  # index into the case's calls
    detail: str
    case: Case

    def __str__(self) -> str:
        label = self.case.calls[self.call].label
        return f"{self.kind} at call {self.call} ({label}): {self.detail}\n{self.case.describe()}"


# ------------------------------------------------------------------ running
def fresh_module(source: str, name: str = PROGRAM_MODULE) -> dict:
    """``source`` exec'd into a new module's namespace: state no other run shares."""
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 - the program under test
    return module.__dict__


@dataclass
class _Outcome:
    result: Any = None
    error: BaseException | None = None
    printed: str = ""


def _call(fn: Callable[..., Any], call: Call, args: tuple, kwargs: dict) -> _Outcome:
    outcome, out = _Outcome(), io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.set_grad_enabled(call.grad):
            try:
                outcome.result = fn(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - compared with eager's
                outcome.error = error
    outcome.printed = out.getvalue()
    return outcome


def compiles(compiled: Any) -> int:
    """How many times ``compiled`` compiled: entries, pieces after breaks, places given up."""
    pieces = sum(len(entries) for entries in compiled.pieces.values())
    return len(compiled.cache) + pieces + len(compiled.as_python)


def run_case(case: Case, compile: Callable[[Any], Any] = fxloom.compile) -> Failure | None:
    """Run ``case`` both ways (see the module docstring); the first failure, or None."""
    eager_ns, compiled_ns = fresh_module(case.source), fresh_module(case.source)
    eager_f, compiled_f = eager_ns["f"], compile(compiled_ns["f"])
    eager_calls, compiled_calls = copy.deepcopy(case.calls), copy.deepcopy(case.calls)
    cache = _CacheWatch(compiled_f, case.write_only)
    for index, (mine, theirs) in enumerate(zip(compiled_calls, eager_calls)):
        for ns, call in ((eager_ns, theirs), (compiled_ns, mine)):
            if call.before is not None:
                call.before(ns, call.args, call.kwargs)
        cache.before(compiled_ns, mine)
        want = _call(eager_f, theirs, theirs.args, theirs.kwargs)
        got = _call(compiled_f, mine, mine.args, mine.kwargs)
        found = _differs(got, want, (mine, compiled_ns, compiled_f), (theirs, eager_ns, eager_f))
        found = found or cache.after()
        if found is not None:
            return Failure(found[0], index, found[1], case)
    return None


class _CacheWatch:
    """The cache checks: a call identical to the one before compiles nothing; one identical
    but for globals the program only writes may compile, but not twice running (a guard
    that never holds); top-level entries never outnumber the distinct calls."""

    def __init__(self, compiled: Any, write_only: frozenset) -> None:
        self.compiled = compiled if hasattr(compiled, "pieces") else None
        self.write_only = write_only
        self.previous: tuple | None = None  # (full, loose) fingerprints of the call before
        self.loose_repeat_compiled = False
        self.distinct = 0

    def before(self, namespace: dict, call: Call) -> None:
        full = fingerprint(namespace, call)
        loose = fingerprint(namespace, call, self.write_only)
        last = self.previous
        self.identical = last is not None and _same(full, last[0])
        self.loosely = last is not None and _same(loose, last[1])
        self.distinct += not self.identical
        self.previous = (full, loose)
        self.compiles = compiles(self.compiled) if self.compiled is not None else 0

    def after(self) -> tuple | None:
        if self.compiled is None:
            return None
        new = compiles(self.compiled) - self.compiles
        reasons = "; ".join(self.compiled.misses[-2:]) or "a piece after a break compiled again"
        if self.identical and new:
            return "recompiled on an identical call", f"{new} compile(s): {reasons}"
        if self.loosely and new and self.loose_repeat_compiled:
            return "recompiled on every repeated call", f"{new} compile(s): {reasons}"
        self.loose_repeat_compiled = self.loosely and new > 0
        if len(self.compiled.cache) > self.distinct:
            return "cache unbounded", (
                f"{len(self.compiled.cache)} entries after {self.distinct} distinct calls"
            )
        return None


def _differs(got: _Outcome, want: _Outcome, mine: tuple, theirs: tuple) -> tuple | None:
    if got.error is not None and want.error is None:
        return "crash", f"{type(got.error).__name__}: {got.error}"
    if want.error is not None and got.error is None:
        return "missed exception", f"eager raised {type(want.error).__name__}: {want.error}"
    error = same_error(got.error, want.error)
    if error is not None:
        return "exception differs", error
    checks = (
        ("result", lambda: compare(got.result, want.result)),
        ("printed text", lambda: compare(got.printed, want.printed, "printed")),
        ("arguments", lambda: _compare_arguments(mine[0], theirs[0])),
        ("outside state", lambda: _compare_state(mine, theirs)),
    )
    for kind, check in checks:
        try:
            check()
        except Mismatch as mismatch:
            return kind, str(mismatch)
    return None


def _compare_arguments(mine: Call, theirs: Call) -> None:
    compare(snapshot(list(mine.args)), snapshot(list(theirs.args)), "args")
    compare(snapshot(mine.kwargs), snapshot(theirs.kwargs), "kwargs")


def _compare_state(mine: tuple, theirs: tuple) -> None:
    (_, my_ns, _), (_, their_ns, _) = mine, theirs
    compare(module_state(my_ns), module_state(their_ns), "module")
    compare(_cells(my_ns["f"]), _cells(their_ns["f"]), "closure")


def _cells(fn: Any) -> list:
    return [snapshot(cell.cell_contents) for cell in fn.__closure__ or ()]


# ------------------------------------------------------------------ identical calls
def fingerprint(namespace: dict, call: Call, write_only: frozenset = frozenset()) -> tuple:
    """What decides whether a call is identical to the one before: the arguments' values and
    layouts and which of them are one object or share storage, the module's state (but the
    ``write_only`` globals), the closure cells, grad mode."""
    objects: dict[int, int] = {}
    storages: dict[int, int] = {}
    arguments = [_tensor_print(v, objects, storages) for v in _leaves((call.args, call.kwargs))]
    state = {k: v for k, v in module_state(namespace).items() if k not in write_only}
    return (arguments, state, _cells(namespace["f"]), call.grad)


def _tensor_print(value: Any, objects: dict, storages: dict) -> Any:
    alias = objects.setdefault(id(value), len(objects))
    if not isinstance(value, torch.Tensor):
        return (alias, snapshot(value))
    storage = storages.setdefault(value.untyped_storage().data_ptr(), len(storages))
    layout = (value.dtype, tuple(value.shape), value.stride(), value.storage_offset())
    # exact values (NaN never equal: such a call is not taken as identical)
    return (alias, storage, layout, value.requires_grad, value.detach().flatten().tolist())


def _leaves(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


def _same(a: Any, b: Any) -> bool:
    try:
        compare(a, b, "state")
    except Mismatch:
        return False
    return True


# ------------------------------------------------------------------ descriptions
def describe_calls(calls: list[Call]) -> str:
    """The calls as text, each tensor named by its object (``t0``, ``t1``, ...) across the
    whole sequence so aliasing and reuse show."""
    names: dict[int, str] = {}
    lines = []
    for index, call in enumerate(calls):
        shown = [_describe(v, names) for v in call.args]
        shown += [f"{k}={_describe(v, names)}" for k, v in call.kwargs.items()]
        grad = "" if call.grad else " under torch.no_grad()"
        lines.append(f"  {index}: f({', '.join(shown)}){grad}  # {call.label}")
    return "\n".join(lines)


def _describe(value: Any, names: dict) -> str:
    if not isinstance(value, torch.Tensor):
        return repr(value)
    known = id(value) in names
    name = names.setdefault(id(value), f"t{len(names)}")
    if known:
        return name
    flags = "" if value.is_contiguous() else f" stride {value.stride()}"
    flags += " requires_grad" if value.requires_grad else ""
    dtype = str(value.dtype).removeprefix("torch.")
    return f"{name}={dtype}{list(value.shape)}{flags}"
