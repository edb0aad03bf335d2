"""The recompile budget: how many times a compiled function may compile, counted by reason.

Every miss of a compiled function's cache is a ``Recompile``: the guard of the front entry that
failed, read as a *reason* (its source and what it checks: the size of ``x``, the value of
``n``, the type of ``y``), the value the call brought there, and the user's line that read it.
The budget (``recompile_limit``) counts compiles, the first included, but a recompile costs
only when its reason is new:

* a source made symbolic by the recompile (a size that changed, a number the dynamic machinery
  promotes) costs once, however many values follow and however many of its dimensions are
  promoted after the first (it is one reason, generalised);
* a source that stays guarded by value (``dynamic=False``, ``mark_static``, a ``range(n)`` the
  graph unrolls, a type) costs once per value it brings.

So promotion comes before the budget runs out, and a program that keeps compiling is one that
keeps meeting new specialised values. At the limit, ``on_limit="eager"`` (the default) runs
the function as Python from then on, warning once; ``on_limit="raise"`` raises
``RecompileLimitError`` from the call that would compile. Both say the same thing: the
source, the values seen there, the line, and the fix (``_FIXES``).

Depends on ``fxloom.bytecode.guards`` (read only) and ``fxloom.bytecode.breaks``.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from fxloom.bytecode.breaks import RecompileLimitError
from fxloom.bytecode.sources import local_name

__all__ = ["Budget", "Recompile", "ON_LIMIT"]

ON_LIMIT = ("eager", "raise")


class Recompile(str):
    """One miss, as ``explain().recompiles`` lists it: the text of the guard that failed (so
    it reads as before), with ``source`` (the user's name for what changed), ``kind``
    (``_KINDS``), ``value`` (what the call brought), ``where`` (the line that read it, or
    ""), and ``outcome`` (``"compiled"``, ``"promoted"``, ``"ran as Python"``, ``"raised"``)."""

    source: str
    kind: str
    value: str
    where: str
    outcome: str

    def __new__(cls, text: str, source: str, kind: str, value: str, where: str) -> Recompile:
        made = super().__new__(cls, text)
        made.source, made.kind, made.value, made.where = source, kind, value, where
        made.outcome = "compiled"
        return made


# What a failing guard checks, told from its generated check (guards.py's forms): kind ->
# (the check's pattern, with the source's expression as ``expr``; the text's, with its name).
# Tried in order; a guard none matches is a "condition" (a relation between sizes, identities).
_KINDS: tuple[tuple[str, str, str], ...] = (
    ("type", r"type\((?P<expr>.+)\) is K\d+", r"type\((?P<name>.+)\) is "),
    ("tensor", r"(?P<expr>.+?)\.dtype is K\d+ and .*", r"(?P<name>.+?): dtype "),
    ("identity", r"(?P<expr>.+) is K\d+", r"(?P<name>.+) is the same "),
    ("value", r"(?P<expr>.+) (==|is) (K\d+|None|True|False|Ellipsis)", r"(?P<name>.+) (==|is) "),
    ("length", r"len\((?P<expr>.+)\) == \d+", r"len\((?P<name>.+)\) == "),
    ("keys", r"tuple\((?P<expr>.+)\) == K\d+", r"(?P<name>.+) has keys "),
    ("global state", r"STATE\(\) == K\d+", r"(?P<name>)"),
    ("module structure", r"TREE\.epoch == \d+", r"(?P<name>)"),
    ("module structure", r"all\(map\(K\d+, map\(K\d+, K\d+, K\d+\), K\d+\)\)", r"(?P<name>)"),
)

# kind -> what to do when that reason keeps recompiling (``{source}``: its name)
_FIXES: dict[str, str] = {
    "size": "mark it dynamic (fxloom.mark_dynamic(tensor, dim) before the call, or "
    "dynamic={{'<param>': {{dim: Dim('name')}}}}), or pass dynamic=True; if it is marked static "
    "or dynamic=False, drop that",
    "tensor": "pass tensors of one dtype, device and layout at {source}",
    "value": "pass dynamic=True (fxloom makes ints and floats symbols where it can), pass "
    "{source} as a tensor, or change the program so that its value does not shape the graph "
    "(a range({source}) is unrolled for each value)",
    "type": "pass one type at {source} on every call (convert it before the call)",
    "identity": "pass the same object at {source} on every call",
    "length": "pass {source} with one length, or as a tensor",
    "keys": "pass {source} with the same keys on every call",
    "fixed size": "the line it was read at needs the size as a plain number (range(), int(), "
    "native code, a string), which fixes it to each value: compute with the size inside tensor "
    "operations, or iterate over the tensor itself",
    "condition": "mark the size dynamic and keep the program's branches on it few, or make "
    "the branch a tensor operation (torch.where, fxloom.cond)",
    "global state": "call the function under one grad mode, autocast and default dtype",
    "module structure": "stop replacing the module's parameters, buffers or submodules "
    "between calls (assign into param.data, or compile after the model is built)",
}
_ALWAYS = "raise recompile_limit, or change the program"


@dataclass
class _Reason:
    """What the budget remembers per source: the values seen there, in order."""

    values: list[str] = field(default_factory=list)


class Budget:
    """One compiled function's recompile budget; see the module docstring."""

    def __init__(self, limit: int, on_limit: str) -> None:
        if on_limit not in ON_LIMIT:
            raise ValueError(
                f"fxloom.compile(on_limit=...) takes 'eager' or 'raise', not {on_limit!r}"
            )
        self.limit = limit
        self.on_limit = on_limit
        self.history: list[Recompile] = []
        self.charged: set[tuple] = set()  # the reasons paid for
        self.sources: dict[str, _Reason] = {}  # source name -> values seen there
        self.warned = False

    @property
    def spent(self) -> int:
        """Compiles counted: the first, then one per distinct reason."""
        return 1 + len(self.charged)

    def miss(self, entry: Any, failing: Any, call: tuple, fn: Any = None) -> Recompile:
        """Read the miss of ``entry`` (whose guard ``failing`` failed) on ``call`` (values,
        parameters, globals, closure) as a ``Recompile``, and remember its value."""
        if failing is None:
            recompile = Recompile("unknown", "?", "condition", "?", "")
        else:
            recompile = _read(entry, failing, call)
        root = re.match(r"[A-Za-z_]\w*", recompile.source)
        if not recompile.where and fn is not None and root and root.group() in call[1]:
            # an argument, read before the first line runs: name the function it enters
            code = fn.__code__
            file = code.co_filename.rsplit("/", 1)[-1]
            recompile.where = (
                f"{file}:{code.co_firstlineno}: argument {root.group()!r} of {fn.__qualname__}"
            )
        seen = self.sources.setdefault(recompile.source, _Reason())
        if not seen.values:
            assumed = _assumed(entry, failing, recompile)
            if assumed:
                seen.values.append(assumed)
        seen.values.append(recompile.value)
        self.history.append(recompile)
        return recompile

    def allows(self, recompile: Recompile, promoted: bool) -> bool:
        """Pay for ``recompile`` (a promoting one by its source, another by its value too);
        whether the budget still covers it. A reason already paid for is free."""
        key: tuple = (recompile.source, recompile.kind)
        if promoted:
            recompile.outcome = "promoted"
        else:
            key = (*key, recompile.value)
        if key in self.charged:
            return True
        if self.spent + 1 > self.limit:
            return False
        self.charged.add(key)
        return True

    def message(self, function: str, recompile: Recompile) -> str:
        """The one message of the limit: the source, its values, the line and the fix."""
        values = self.sources.get(recompile.source, _Reason()).values
        shown = ", ".join(values[-12:])
        if len(values) > 12:
            shown = f"... ({len(values) - 12} more), " + shown
        fix = _FIXES.get(recompile.kind, "").format(source=recompile.source)
        lines = [
            f"fxloom.compile({function}): recompile_limit={self.limit} reached: the guard "
            f"{recompile} failed, and this call would compile once more ({self.spent} "
            "compiles so far, counted by reason)",
            f"  source: {recompile.source} (its {recompile.kind})",
            f"  values seen at {recompile.source}: {shown}",
        ]
        if recompile.where:
            lines.append(f"  read at: {recompile.where}")
        lines.append(f"  fix: {fix + '; or ' if fix else ''}{_ALWAYS}")
        return "\n".join(lines)

    def at_limit(self, function: str, recompile: Recompile) -> str:
        """Act on the limit: raise (``on_limit="raise"``) or return the reason to run as
        Python (the caller warns once)."""
        text = self.message(function, recompile)
        if self.on_limit == "raise":
            recompile.outcome = "raised"
            raise RecompileLimitError(text, recompile)
        recompile.outcome = "ran as Python"
        return text


def _read(entry: Any, failing: Any, call: tuple) -> Recompile:
    guards = entry.guards
    where = _line_text(getattr(guards, "lines", {}).get(failing.check))
    for kind, check_pattern, text_pattern in _KINDS:
        check = re.fullmatch(check_pattern, failing.check)
        text = re.match(text_pattern, failing.text)
        if check is None or text is None:
            continue
        expr, name = check.groupdict().get("expr"), text.group("name") or kind
        value: Any = _MISSING if expr is None else _evaluate(expr, entry, call)
        if kind == "tensor":
            kind = "size" if _size_changed(guards, expr, value) else "tensor"
        return Recompile(failing.text, name, kind, _described(kind, value), where)
    return _condition(entry, failing, call, where)


def _line_text(place: tuple | None) -> str:
    """``file:line: code`` of a (code object, line) the interpreter was running."""
    if place is None:
        return ""
    import linecache

    code, line = place
    line = line or code.co_firstlineno
    file = code.co_filename.rsplit("/", 1)[-1]
    return f"{file}:{line}: {linecache.getline(code.co_filename, line).strip()}".rstrip(": ")


def _condition(entry: Any, failing: Any, call: tuple, where: str) -> Recompile:
    """A relation (``x.shape[0] > 3 (file:line: code)``, ``x is not y``): named by the
    tensors it mentions, valued by their shapes now."""
    text = failing.text
    located = re.fullmatch(r"(?P<condition>.+?) \((?P<where>[^()]+:\d+.*)\)", text)
    if located is not None:
        where = located.group("where")
        text = located.group("condition")
    names, values = [], []
    for source in entry.guards.tensor_sizes:
        if re.search(rf"(?<![\w.]){re.escape(source.text)}(?![\w])", text):
            names.append(source.text)
            values.append(_described("size", _evaluate(source.expr, entry, call)))
    name = ", ".join(names) or failing.text
    # ``x.shape[0] == 3``: the program fixed a symbolic size to one value
    kind = "fixed size" if re.fullmatch(r".+ == -?\d+", text) else "condition"
    return Recompile(failing.text, name, kind, ", ".join(values) or "?", where)


def _assumed(entry: Any, failing: Any, recompile: Recompile) -> str:
    """What the failing entry assumed at the source (its first value in the history)."""
    if failing is None:
        return ""
    if recompile.kind in ("size", "tensor", "condition", "fixed size"):
        for source, (shape, dims) in entry.guards.tensor_sizes.items():
            if source.text == recompile.source:
                return str(tuple("?" if d in dims else n for d, n in enumerate(shape)))
        return ""
    if recompile.kind in ("value", "length") and " == " in failing.text:
        return failing.text.rsplit(" == ", 1)[1]
    if recompile.kind == "value" and " is " in failing.text:
        return failing.text.rsplit(" is ", 1)[1]
    if recompile.kind == "type":
        return failing.text.rsplit(" is ", 1)[1]
    return ""


_MISSING = object()


def _evaluate(expr: str, entry: Any, call: tuple) -> Any:
    """The value at ``expr`` (a source expression) for this call, or ``_MISSING``."""
    values, parameters, globals_, closure = call
    namespace: dict[str, Any] = {"G": globals_, "C": closure or (), "R": entry.held or {},
                                 "MODULES": sys.modules}  # fmt: skip
    namespace.update(zip((local_name(name) for name in parameters), values))
    try:
        return eval(expr, namespace)  # noqa: S307 - our own source expressions
    except Exception:
        return _MISSING


def _size_changed(guards: Any, expr: str | None, value: Any) -> bool:
    if not isinstance(value, torch.Tensor):
        return False
    for source, (shape, _dims) in guards.tensor_sizes.items():
        if source.expr == expr:
            return tuple(value.shape) != shape
    return False


def _described(kind: str, value: Any) -> str:
    if kind in ("module structure", "global state"):
        return "changed"
    if value is _MISSING:
        return "?"
    if isinstance(value, torch.Tensor):
        if kind == "size":
            return str(tuple(value.shape))
        return f"{value.dtype} {value.device} {tuple(value.shape)}"
    if kind == "type":
        return type(value).__qualname__
    if kind == "length":
        try:
            return str(len(value))
        except TypeError:
            return type(value).__qualname__
    if kind == "identity":
        return f"<{type(value).__qualname__} at {id(value):#x}>"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
