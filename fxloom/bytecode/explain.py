"""``explain()``: what ``fxloom.compile`` made of a function — graphs, breaks, guards, cache.

    >>> import torch, fxloom
    >>> def f(x):
    ...     return torch.relu(x) * 2
    >>> report = fxloom.explain(f, torch.randn(3))
    >>> report.graph_count, report.break_count
    (1, 0)

``print(report)`` renders it with rich, as the CLI's tables: one row per graph (its node
count, the call it came from and how long compiling took), every break with the user's
file:line, the reason and what to do, and each cache entry's guards in the user's names.

The fields ``torch._dynamo.explain`` users know are there too, with the same names:
``graphs`` (the GraphModules), ``graph_count``, ``graph_break_count``, ``break_reasons``
(each with ``reason`` and ``user_stack``), ``op_count``, ``ops_per_graph``, ``out_guards``
and ``compile_times`` (docs/compile.md has the table of what each holds here).

    >>> report.graph_break_count, report.op_count, len(report.ops_per_graph[0])
    (0, 2, 2)

Depends on ``fxloom.bytecode.compiled`` (read only) and rich.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Explanation", "explain"]


@dataclass(frozen=True)
class GraphReport:
    entry: int  # pieces after graph breaks are numbered after the function's own entries
    nodes: int  # operations (placeholders and the output left out)
    inputs: int
    seconds: float


@dataclass(frozen=True)
class BreakReport:
    where: str  # file:line
    code: str  # the user's source line
    reason: str
    detail: str
    fix: str
    # the user's frame the break happened in, as torch._dynamo's break_reasons give it
    # (the innermost only: fxloom keeps no outer frames for a break)
    user_stack: list[traceback.FrameSummary] = field(default_factory=list)


@dataclass
class Explanation:
    """What ``fxloom.compile`` made of one function; see the module docstring."""

    function: str
    # one row per cache entry and piece compiled (``piece_count``), empty ones too
    graph_reports: list[GraphReport] = field(default_factory=list)
    breaks: list[BreakReport] = field(default_factory=list)
    guards: list[list[str]] = field(default_factory=list)  # per cache entry
    # Every miss, in order (``fxloom.bytecode.budget.Recompile``): reads as the text of the
    # guard that failed, with ``source``, ``kind``, ``value`` (what the call brought),
    # ``where`` (the line that read it) and ``outcome`` (compiled, promoted, ran as Python, raised)
    recompiles: list[Any] = field(default_factory=list)
    recompile_limit: int = 8
    recompiles_counted: int = 0  # compiles the budget counted: the first, then one per reason
    runs_as_python: str | None = None
    # Where, after a graph break, no piece could be captured: "file:line: why" each
    pieces_as_python: list[str] = field(default_factory=list)
    # Sizes made symbolic ("x.shape[0]: 2 -> 1 (now symbolic)"), and symbolic sizes the program
    # fixed to one value ("x.shape[0] == 3: file:line: n = int(x.shape[0])")
    dynamic_sizes: list[str] = field(default_factory=list)
    why_static: list[str] = field(default_factory=list)

    # ---- torch._dynamo.explain's fields (ExplainOutput), with fxloom's content
    # the captured GraphModules that hold an operation (``graph_count``), with their operations
    graphs: list[Any] = field(default_factory=list)
    ops_per_graph: list[list[Any]] = field(default_factory=list)
    out_guards: list[Any] = field(default_factory=list)  # every entry's Guard objects

    @property
    def graph_count(self) -> int:
        """Graphs that hold at least one operation, as Dynamo counts (it compiles no empty
        graph): a piece that only hands values on, between two breaks, is not one."""
        return len(self.graphs)

    @property
    def piece_count(self) -> int:
        """Every cache entry and piece compiled, empty ones too (``graph_reports``)."""
        return len(self.graph_reports)

    @property
    def break_count(self) -> int:
        return len(self.breaks)

    @property
    def graph_break_count(self) -> int:
        """The breaks met, each once (Dynamo counts ``graph_count - 1``, the same for a
        function whose pieces all compiled)."""
        return len(self.breaks)

    @property
    def break_reasons(self) -> list[BreakReport]:
        """The breaks, each with ``reason`` and ``user_stack`` as Dynamo's, and fxloom's
        ``detail`` (the culprit) and ``fix``."""
        return self.breaks

    @property
    def op_count(self) -> int:
        return sum(len(ops) for ops in self.ops_per_graph)

    @property
    def compile_seconds(self) -> float:
        return sum(graph.seconds for graph in self.graph_reports)

    @property
    def compile_times(self) -> str:
        """How long each graph took to capture, as text (Dynamo's is its timer table)."""
        each = ", ".join(f"{graph.seconds:.4f}" for graph in self.graph_reports)
        return f"fxloom.compile capture times (s), per graph: [{each}], total {self.compile_seconds:.4f}"

    @classmethod
    def of(cls, compiled: Any) -> Explanation:
        report = cls(compiled.fn.__qualname__, runs_as_python=compiled.eager_reason)
        entries = [
            *compiled.cache,
            *compiled.retired,
            *(piece for pieces in compiled.pieces.values() for piece in pieces),
        ]
        for number, entry in enumerate(entries):
            nodes = entry.graph_module.graph.nodes
            operations = sum(1 for node in nodes if node.op not in ("placeholder", "output"))
            inputs = sum(1 for node in nodes if node.op == "placeholder")
            report.graph_reports.append(GraphReport(number, operations, inputs, entry.seconds))
            ops = [node.target for node in nodes if node.op in _OPERATIONS]
            if ops:
                report.graphs.append(entry.graph_module)
                report.ops_per_graph.append(ops)
            report.guards.append([guard.text for guard in entry.guards])
            report.out_guards.extend(entry.guards)
        seen = set()
        for stop in compiled.breaks:
            where = stop.where
            key = (where, stop.kind, stop.detail)
            if key in seen:  # met again by a piece compiled for other values
                continue
            seen.add(key)
            report.breaks.append(
                BreakReport(
                    where=where.short if where is not None else "?",
                    code=where.code if where is not None else "",
                    reason=stop.row.title,
                    detail=stop.detail,
                    fix=stop.row.fix,
                    user_stack=_user_stack(where),
                )
            )
        budget = getattr(compiled, "budget", None)
        if budget is not None:
            report.recompiles = list(budget.history)
            report.recompile_limit, report.recompiles_counted = budget.limit, budget.spent
        else:
            report.recompiles = list(compiled.misses)
        report.pieces_as_python = list(compiled.as_python.values())
        report.dynamic_sizes = list(compiled.sizes.history)
        report.why_static = list(
            dict.fromkeys(line for entry in entries for line in entry.guards.why_static())
        )
        return report

    # ------------------------------------------------------------ rendering
    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        parts: list[Any] = [Text(self.summary(), style="bold")]
        if self.graph_reports:
            title = (
                f"pieces ({self.piece_count}), graphs ({self.graph_count}: those with an operation)"
            )
            graphs = Table(show_header=True, header_style="bold", title=title)
            for column in ("entry", "operations", "inputs", "compile ms"):
                graphs.add_column(column, justify="right")
            for graph in self.graph_reports:
                graphs.add_row(
                    str(graph.entry),
                    str(graph.nodes),
                    str(graph.inputs),
                    f"{graph.seconds * 1e3:.1f}",
                )
            parts.append(graphs)
        if self.breaks:
            breaks = Table(show_header=True, header_style="bold", title="graph breaks")
            for column in ("where", "reason", "what to do"):
                breaks.add_column(column, overflow="fold")
            for stop in self.breaks:
                breaks.add_row(
                    f"{stop.where}\n{stop.code}", f"{stop.reason}: {stop.detail}", stop.fix
                )
            parts.append(breaks)
        for number, texts in enumerate(self.guards):
            guards = Table(show_header=False, title=f"guards of entry {number}")
            guards.add_column("guard", overflow="fold")
            for text in texts:
                guards.add_row(text)
            parts.append(guards)
        if self.recompiles:
            parts.append(self._recompile_table())
        for text in self.pieces_as_python:
            parts.append(Text(f"runs as Python after a break: {text}"))
        for text in self.dynamic_sizes:
            parts.append(Text(f"dynamic size: {text}"))
        for text in self.why_static:
            parts.append(Text(f"why static: {text}"))
        return Group(*parts)

    def _recompile_table(self) -> Any:
        from rich.table import Table

        title = (
            f"recompiles ({self.recompiles_counted} of recompile_limit={self.recompile_limit} "
            "compiles counted, by reason)"
        )
        table = Table(show_header=True, header_style="bold", title=title)
        for column in ("#", "reason (the guard that failed)", "source", "value seen", "outcome"):
            table.add_column(column, overflow="fold")
        for number, recompile in enumerate(self.recompiles, start=1):
            where = getattr(recompile, "where", "")
            reason = f"{recompile}\n{where}" if where else str(recompile)
            table.add_row(
                str(number),
                reason,
                f"{getattr(recompile, 'source', '?')} ({getattr(recompile, 'kind', '?')})",
                getattr(recompile, "value", "?"),
                getattr(recompile, "outcome", "compiled"),
            )
        return table

    def summary(self) -> str:
        text = (
            f"{self.function}: {self.graph_count} graph(s), {self.break_count} break(s), "
            f"{self.piece_count} piece(s), "
            f"{sum(len(g) for g in self.guards)} guard(s), compiled in "
            f"{self.compile_seconds * 1e3:.1f} ms"
        )
        if self.runs_as_python:
            text += f"\nruns as Python: {self.runs_as_python}"
        return text

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=120, record=True, file=_Discard())
        console.print(self)
        return console.export_text().rstrip()


# the nodes ops_per_graph lists, as their targets: a function, or the name of a method or
# submodule (Dynamo lists call_function targets only; it inlines modules and methods into them)
_OPERATIONS = ("call_function", "call_method", "call_module")


def _user_stack(where: Any) -> list[traceback.FrameSummary]:
    if where is None:
        return []
    return [traceback.FrameSummary(where.file, where.line, where.function, line=where.code)]


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def explain(fn: Any, *args: Any, **kwargs: Any) -> Explanation:
    """Compile ``fn`` (a function or module), call it once with ``args``/``kwargs``, and return
    what ``fxloom.compile`` made of it."""
    from fxloom.bytecode.compiled import compile as compile_

    compiled = compile_(fn)
    compiled(*args, **kwargs)
    return compiled.explain()
