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
      _0    0, a Linear  int8        quantized::linear, float in/out (one int8 kernel)
      _1    1, a SELU    float       no int8 kernel for it in fxloom.quantize.table (add a row to STATIC_OPS or SHARES_QPARAMS)

Depends on: ``plan``; rich (imported when printing with it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fxloom.quantize.plan import Decision, QuantPlan

__all__ = ["QuantReport", "report"]

# kind -> what the report's column says
LABELS = {
    "int8": "int8",
    "dynamic": "int8 dynamic",
    "fused": "int8 (fused)",
    "shared": "int8 (shared)",
    "float": "float",
    "identity": "removed",
}


@dataclass(frozen=True)
class QuantReport:
    """One row per decided node, in graph order."""

    mode: str
    engine: str
    rows: tuple[Decision, ...]

    @classmethod
    def of(cls, plan: QuantPlan, kernels: dict[str, str] | None = None) -> QuantReport:
        """The plan's decisions; ``kernels``: the kernel convert chose instead, by node."""
        kernels = kernels or {}
        rows = tuple(
            dataclasses.replace(row, reason=kernels[row.node]) if row.node in kernels else row
            for row in plan.decisions.values()
        )
        return cls(plan.config.mode, plan.config.engine, rows)

    @property
    def quantized(self) -> list[Decision]:
        return [row for row in self.rows if row.kind in ("int8", "dynamic")]

    @property
    def in_float(self) -> list[Decision]:
        return [row for row in self.rows if row.kind == "float"]

    def label(self, row: Decision) -> str:
        # A shared operator is int8 only inside an int8 region; the plan knows which.
        return LABELS.get(row.kind, row.kind)

    def summary(self) -> str:
        return (
            f"{self.mode} int8, engine {self.engine}: {len(self.quantized)} int8, "
            f"{len(self.in_float)} float"
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
