"""``LoweringReport``: what ``fxloom.lower`` ran in its backend, what stayed in PyTorch, and why.

The report is plain data (frozen dataclasses): one ``RegionReport`` per region the
splitter made, lowered or kept in PyTorch with the reason; one ``LeftNode`` per operator the
backend does not support, with its reason and the user's source line; with
``check=True``, the largest errors of the lowered module against eager PyTorch. ``str()``
gives a text summary; printing with rich shows a table.

Depends on: the standard library; rich when rendered as a table.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CheckResult", "LeftNode", "LoweringReport", "RegionReport"]


@dataclass(frozen=True)
class RegionReport:
    """One region of supported operators.

    Attributes:
        name: the submodule's name in the lowered module (``_run_on_acc_0``).
        nodes: the names of its call nodes, in order.
        ops: how many of each operator it holds (``{"conv2d": 3, "relu": 3}``).
        lowered: True when it runs in the backend (``LoweringReport.backend``).
        reason: why it stayed in PyTorch (None when lowered).
        translate_seconds: translating, checking and starting its session.
        differences: what the backend computes otherwise than PyTorch there on purpose
            (``Backend.differences``), a sentence each.
    """

    name: str
    nodes: tuple[str, ...]
    ops: dict[str, int]
    lowered: bool
    reason: str | None = None
    translate_seconds: float = 0.0
    differences: tuple[str, ...] = ()

    def ops_text(self, limit: int = 6) -> str:
        common = Counter(self.ops).most_common()
        shown = ", ".join(f"{op} x{count}" if count > 1 else op for op, count in common[:limit])
        return shown + (f", +{len(common) - limit} more" if len(common) > limit else "")


@dataclass(frozen=True)
class LeftNode:
    """An operator left in PyTorch because the backend does not support it."""

    name: str
    op: str
    reason: str
    source: str | None = None  # "file.py:41: code", when the trace recorded it


@dataclass(frozen=True)
class CheckResult:
    """Lowered against eager PyTorch on the example inputs (``check=True``)."""

    max_abs_error: float
    max_rel_error: float  # the largest |lowered - eager| / max |eager| over the outputs
    passed: bool
    rtol: float
    atol: float


@dataclass(frozen=True)
class LoweringReport:
    """What ``fxloom.lower`` did (see the module docstring)."""

    model: str
    backend: str
    regions: tuple[RegionReport, ...]
    left: tuple[LeftNode, ...]
    check: CheckResult | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def lowered(self) -> tuple[RegionReport, ...]:
        return tuple(region for region in self.regions if region.lowered)

    @property
    def nodes_lowered(self) -> int:
        return sum(len(region.nodes) for region in self.lowered)

    @property
    def nodes_in_pytorch(self) -> int:
        kept = sum(len(region.nodes) for region in self.regions if not region.lowered)
        return kept + len(self.left)

    def summary(self) -> str:
        total = self.nodes_lowered + self.nodes_in_pytorch
        line = (
            f"{self.model}: {len(self.lowered)} of {len(self.regions)} region"
            f"{'s' * (len(self.regions) != 1)} in {self.backend}, "
            f"{self.nodes_lowered} of {total} operators lowered, "
            f"{self.nodes_in_pytorch} left in PyTorch"
        )
        if self.check is not None:
            verdict = "ok" if self.check.passed else "TOO LARGE"
            line += (
                f"; check: max abs error {self.check.max_abs_error:.3g}, "
                f"max rel error {self.check.max_rel_error:.3g} ({verdict})"
            )
        return line

    def __str__(self) -> str:
        lines = [self.summary()]
        for region in self.regions:
            where = self.backend if region.lowered else f"PyTorch ({region.reason})"
            lines.append(
                f"  {region.name}: {len(region.nodes)} operators -> {where}: {region.ops_text()}"
            )
        for node in self.left:
            source = f" at {node.source}" if node.source else ""
            lines.append(f"  %{node.name} ({node.op}) stays in PyTorch{source}: {node.reason}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(show_header=True, header_style="bold", title_justify="left")
        for column in ("part", "operators", "runs in", "what / why"):
            table.add_column(column)
        for region in self.regions:
            where = self.backend if region.lowered else "PyTorch"
            what = region.ops_text() if region.lowered else f"{region.reason}: {region.ops_text()}"
            table.add_row(region.name, str(len(region.nodes)), where, what)
        for node in self.left:
            why = node.reason + (f" ({node.source})" if node.source else "")
            table.add_row(f"%{node.name}", node.op, "PyTorch", why)
        notes = [Text(f"note: {note}", style="dim") for note in self.notes]
        return Group(Text(self.summary(), style="bold"), table, *notes)
