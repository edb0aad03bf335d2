"""Every reason the bytecode frontend stops capturing, with what to do about it: one registry.

A *graph break* is a place where the interpreter cannot go on recording: something needs a
tensor's data, or a call it cannot follow. ``BREAKS`` names each kind once, with the
sentence ``explain()`` and ``fullgraph=True`` errors show and the fix they suggest; every
``Break`` raised in ``fxloom/bytecode/`` names one of its keys (a test checks this), so
messages stay consistent and the list of what fxloom cannot capture is in one place.

Depends on ``fxloom.source_location``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fxloom.source_location import SourceLocation

__all__ = [
    "BREAKS",
    "Break",
    "BreakKind",
    "CompileError",
    "DynamicDimError",
    "RecompileLimitError",
]


@dataclass(frozen=True, slots=True)
class BreakKind:
    title: str  # what happened, in a few words
    fix: str  # what the user can do


BREAKS: dict[str, BreakKind] = {
    "tensor-branch": BreakKind(
        "a branch depends on a tensor's value",
        "use fxloom.cond(pred, true_fn, false_fn, operands): fxloom.compile keeps both branches "
        "in the graph and picks one at run time; or compute the condition from shapes",
    ),
    "cond-branch": BreakKind(
        "a branch of fxloom.cond cannot be captured (a graph break inside it, output such as "
        "print, a change to an object the branch did not make, an in-place write, or branches "
        "that do not agree)",
        "nothing to do for a correct result: the whole cond runs as Python at every call. To "
        "keep it in the graph, make each branch compute new tensors from its operands (and "
        "what it closes over), return the same structure, shapes and dtypes from both, and "
        "move output and changes of outside objects out of the branches",
    ),
    "tensor-data": BreakKind(
        "the program reads a tensor's data (.item(), .tolist(), int(), float(), bool())",
        "keep the value as a tensor (use torch.where, masks or tensor arithmetic), or move the "
        "read after the compiled function",
    ),
    "data-dependent-op": BreakKind(
        "an operator's result size depends on data (nonzero, unique, boolean masks)",
        "use a fixed-size formulation (torch.where, masked_fill) or move it out of the "
        "compiled function",
    ),
    "unsupported-instruction": BreakKind(
        "a Python instruction fxloom.compile does not interpret yet",
        "move this code into a function called outside the compiled region, or report it",
    ),
    "outside-mutation": BreakKind(
        "the program changes an object that exists outside the compiled function",
        "return the new value instead of storing it, or change the object after the call",
    ),
    "changed-after-print": BreakKind(
        "a tensor the program printed is changed in place afterwards (printed text is shown "
        "after the graph, which would show the changed values)",
        "print a copy (print(y.clone())), or print after the change",
    ),
    "opaque-call": BreakKind(
        "a function implemented in C received a tensor",
        "call it outside the compiled function, or use a torch operator instead",
    ),
    "unknown-callable": BreakKind(
        "a function implemented in C that fxloom.compile's callee table does not list (it may "
        "read or change state no guard sees)",
        "nothing to do for a correct result: it runs as Python at every call. If its result "
        "depends only on its arguments and it changes nothing, declare it once with "
        'fxloom.bytecode.classify(fn, "native_pure") to keep the function in one graph',
    ),
    "unsupported-call": BreakKind(
        "a call fxloom.compile cannot follow (exec, eval, open, globals(), ...)",
        "nothing to do: it runs as Python at every call; move it out of the compiled function "
        "to keep one graph",
    ),
    "unguarded-value": BreakKind(
        "a native function or operator would read a value whose type alone is guarded (an "
        "object from outside, a numpy array, an iterator, a value Python computed at a graph "
        "break)",
        "nothing to do: it runs as Python at every call; to keep one graph, pass the value in "
        "as a tensor, or read plain attributes of it (ints, floats, strings are guarded by "
        "value)",
    ),
    "exception": BreakKind(
        "the program raises or handles an exception inside the compiled function",
        "check the condition outside the compiled function",
    ),
    "generator": BreakKind(
        "a generator or coroutine inside the compiled function",
        "build a list instead of yielding, or call the generator outside",
    ),
    "yield": BreakKind(
        "a yield of the compiled generator function: it hands a value to its consumer",
        "nothing to do: each yield ends a piece, and the code between yields is captured",
    ),
    "held-iterator": BreakKind(
        "a for loop over an iterator the program also holds (a variable, an attribute), which "
        "it may advance again after the loop",
        "loop over the list itself, or keep the iterator's use inside the loop",
    ),
    "return-object": BreakKind(
        "the function returns an object holding tensors that is not a registered pytree node",
        "return tuples, lists, dicts or dataclasses registered with torch.utils._pytree",
    ),
    "loop-step": BreakKind(
        "the next step of a for loop whose body has a graph break",
        "nothing to do: each step is taken as Python and the body's pieces are reused",
    ),
    "changing-result": BreakKind(
        "a call whose result changes between calls (time, randomness, the environment)",
        "nothing to do: it runs as Python at every call; pass the value in as an argument to "
        "keep the function in one graph",
    ),
    "inline-depth": BreakKind(
        "calls nest deeper than fxloom.compile inlines",
        "mark the deep helper with fxloom.compile's backend outside the region",
    ),
    "class-statement": BreakKind(
        "a class statement inside the compiled function (each call makes a new class)",
        "nothing to do: the class is made as Python at every call; define it outside the "
        "function to keep the function in one graph",
    ),
    "context-manager": BreakKind(
        "a with block whose manager runs as Python (a @contextmanager generator, or one of the "
        "standard library's or numpy's)",
        "nothing to do: its enter and exit run as Python at every call and the block's body is "
        "still captured; a manager class of your own is captured whole",
    ),
    "raises-inside-with": BreakKind(
        "an op that may raise on its inputs' data (an index out of range, a singular matrix) "
        "inside a with block whose manager's exit is Python code",
        "nothing to do for a correct result: the op runs as Python, so that if it raises the "
        "manager's __exit__ sees the exception, as in eager; to keep it in the graph, move it "
        "out of the with block",
    ),
    "global-state": BreakKind(
        "a call that switches torch's global state (default dtype, autocast, deterministic "
        "algorithms), which a graph does not record",
        "nothing to do: it runs as Python and the code after it is captured under the state "
        "it set; switch it outside the compiled function to keep one graph",
    ),
    "unknown-value": BreakKind(
        "the program uses a value fxloom.compile cannot represent",
        "pass it as an argument, or compute it outside the compiled function",
    ),
}


class Break(Exception):
    """The interpreter cannot go on: ``kind`` names a ``BREAKS`` row, ``detail`` the culprit,
    ``where`` the user's innermost line (filled in by the interpreter)."""

    def __init__(self, kind: str, detail: str, where: SourceLocation | None = None) -> None:
        if kind not in BREAKS:
            raise KeyError(f"no graph break kind {kind!r} in fxloom.bytecode.breaks.BREAKS")
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.where = where
        self.top_index: int | None = None  # the compiled frame's instruction it happened in

    @property
    def row(self) -> BreakKind:
        return BREAKS[self.kind]

    def message(self) -> str:
        where = f"{self.where.short}: " if self.where is not None else ""
        code = f"\n    {self.where.code}" if self.where is not None and self.where.code else ""
        return f"{where}{self.row.title}: {self.detail}{code}\n  fix: {self.row.fix}"

    def __str__(self) -> str:
        return self.message()


class CompileError(RuntimeError):
    """``fxloom.compile`` cannot compile this program (with ``fullgraph=True``: any break)."""


class RecompileLimitError(CompileError):
    """``fxloom.compile(on_limit="raise")``: this call would compile once more than
    ``recompile_limit`` allows. The message names the source that kept changing, the values
    seen there, the line that read it (where known) and the fix; ``recompile`` is the miss
    that hit the limit (``fxloom.bytecode.budget.Recompile``)."""

    def __init__(self, message: str, recompile: object = None) -> None:
        super().__init__(message)
        self.recompile = recompile


class DynamicDimError(CompileError):
    """A dimension marked dynamic (``fxloom.mark_dynamic``, ``torch._dynamo.mark_dynamic``, a
    ``Dim`` in ``dynamic=``) that the program fixed to one value: the message names the size,
    the line that fixed it and what to do (``maybe_mark_dynamic`` allows it)."""
