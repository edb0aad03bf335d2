"""``QuantReport``: what was quantized, what was left in float and why.

``convert`` puts one in ``converted.meta["quantize_report"]``; ``report(gm)`` reads it (or
makes it from a prepared model's plan). It prints as a plain table, and as a rich table
with ``rich.print(report)`` or ``report.print()``::

    >>> import torch
    >>> from fxloom.quantize import prepare, report
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SELU()).eval()
    >>> print(report(prepare(model, (torch.randn(2, 4),))))
    static int8, engine x86: 1 int8, 1 float
      node  calls        int8/float  why
      _0    0, a Linear  int8        fxloom_q.linear_int8, float in/out (one int8 kernel)
      _1    1, a SELU    float       no int8 kernel for it in fxloom.quantize.table (add a row to STATIC_OPS or SHARES_QPARAMS)

Depends on: ``plan``; rich (imported when printing with it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fxloom.quantize.plan import Decision, QuantPlan
from fxloom.quantize.schemes import Kind

__all__ = ["QuantReport", "report"]

LABELS = {kind: kind.label for kind in Kind}  # kind -> what the report's column says


@dataclass(frozen=True)
class QuantReport:
    """One row per decided node, in graph order."""

    mode: str
    engine: str
    rows: tuple[Decision, ...]
    title: str = ""  # the scheme's (``QuantScheme.title``): "static int8", "w4 int4 (group 128)"
    kernels: str = "plain"

    @classmethod
    def of(cls, plan: QuantPlan, kernels: dict[str, str] | None = None) -> QuantReport:
        """The plan's decisions; ``kernels``: the reason with the kernel convert chose, by node."""
        kernels = kernels or {}
        rows = tuple(
            dataclasses.replace(row, reason=kernels[row.node]) if row.node in kernels else row
            for row in plan.decisions.values()
        )
        config = plan.config
        return cls(config.mode, config.engine, rows, config.scheme.title, config.kernels)

    @property
    def quantized(self) -> list[Decision]:
        return [row for row in self.rows if Kind(row.kind).quantized]

    @property
    def in_float(self) -> list[Decision]:
        return [row for row in self.rows if row.kind == Kind.FLOAT]

    def label(self, row: Decision) -> str:
        # A shared operator is int8 only inside an int8 region; the plan knows which.
        return Kind(row.kind).label

    def summary(self) -> str:
        title = self.title or f"{self.mode} int8"
        return (
            f"{title}, engine {self.engine}: {len(self.quantized)} int8, {len(self.in_float)} float"
        )

    def table_rows(self) -> list[tuple[str, str, str, str]]:
        return [(row.node, row.calls, self.label(row), row.reason) for row in self.rows]

    def __str__(self) -> str:
        header = ("node", "calls", "int8/float", "why")
        rows = [header, *self.table_rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = [self.summary()]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths)]
            lines.append("  " + "  ".join([*cells, row[3]]).rstrip())
        return "\n".join(lines)

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title=self.summary())
        for column in ("node", "calls", "int8/float", "why"):
            table.add_column(column)
        for node, calls, label, why in self.table_rows():
            style = "green" if label.startswith("int8") else "yellow" if label == "float" else ""
            table.add_row(node, calls, label, why, style=style)
        return table

    def print(self) -> None:
        """Print as a rich table."""
        import rich

        rich.print(self)


def report(gm: Any) -> QuantReport:
    """The report of a converted model, or of what ``convert`` will do to a prepared one."""
    meta = getattr(gm, "meta", {})
    if isinstance(meta.get("quantize_report"), QuantReport):
        return meta["quantize_report"]
    if isinstance(meta.get("quantize"), QuantPlan):
        return QuantReport.of(meta["quantize"])
    raise ValueError(
        f"this {type(gm).__name__} was neither prepared nor converted by fxloom.quantize"
    )
