"""The result of cost analysis: per-node figures, totals, per-module aggregates, rich tables.

``fxloom.passes.cost.analyze_cost`` builds a ``CostReport``; this module only holds and presents
it. Figures are plain ints (FLOPs, MACs, bytes, elements); ``format_count`` and ``format_bytes``
make them readable (``4.09 G``, ``97.5 MiB``).

Depends on: rich (tables, imported when one is drawn).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["CostReport", "ModuleCost", "NodeCost", "format_bytes", "format_count"]

ROOT = "(root)"  # the module path of nodes the root module runs itself


@dataclass(frozen=True)
class NodeCost:
    """The cost of one node.

    ``flops`` counts a multiply-add as 2 FLOPs; ``macs`` the multiply-adds alone.
    ``bytes_read``/``bytes_written``: tensor bytes the node reads (arguments, and the weights of
    a ``call_module``) and writes (its output; 0 for a view). ``allocated``: bytes of new memory
    its output takes (0 for views and in-place operations; the graph's inputs are counted
    separately). ``param_bytes``/``params``: bytes of the parameters and buffers it reads (a
    ``call_module``'s weights, a ``get_attr``'s tensor) and elements of those that are
    ``nn.Parameter``s; ``weights`` names them, so shared ones are counted once in totals.
    ``counted`` is False when no FLOP formula knows the node's operator (its FLOPs are 0).
    """

    name: str
    op: str
    target: str
    module_path: str
    flops: int = 0
    macs: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    allocated: int = 0
    param_bytes: int = 0
    params: int = 0
    counted: bool = True
    weights: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class ModuleCost:
    """The totals of the nodes under one module path (``"(root)"`` for the root's own nodes)."""

    path: str
    module_type: str
    nodes: int
    flops: int
    macs: int
    bytes_read: int
    bytes_written: int
    allocated: int
    params: int
    param_bytes: int


@dataclass
class CostReport:
    """Cost of a graph: per node (``nodes``, in graph order), totals, memory, what was not counted.

    Memory: ``input_bytes`` (the graph's inputs), ``param_bytes``/``params`` (weights the graph
    reads, each once), ``activation_bytes`` (new memory of all outputs together) and
    ``peak_activation_bytes``: the most activation memory live at once when nodes run in graph
    order and each value is freed after its last user (at ``peak_node``). ``not_counted`` maps
    each operator with no FLOP formula to the nodes that call it (their FLOPs are 0).
    """

    model: str
    mode: str  # how shapes were obtained: "meta", "real" or "recorded"
    nodes: list[NodeCost]
    inputs: list[str]  # the graph's tensor inputs: "x: Tensor[1, 3, 224, 224] float32"
    input_bytes: int
    params: int
    param_bytes: int
    activation_bytes: int
    peak_activation_bytes: int
    peak_node: str | None
    not_counted: dict[str, list[str]]
    notes: list[str] = field(default_factory=list)
    module_types: dict[str, str] = field(default_factory=dict, repr=False)
    weight_sizes: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    @property
    def flops(self) -> int:
        """Total FLOPs (a multiply-add counts 2)."""
        return sum(node.flops for node in self.nodes)

    @property
    def macs(self) -> int:
        """Total multiply-adds of contractions (matmul, linear, convolution, attention)."""
        return sum(node.macs for node in self.nodes)

    @property
    def bytes_read(self) -> int:
        return sum(node.bytes_read for node in self.nodes)

    @property
    def bytes_written(self) -> int:
        return sum(node.bytes_written for node in self.nodes)

    @property
    def peak_memory_bytes(self) -> int:
        """Estimated peak memory of a forward pass: weights + inputs + peak activations."""
        return self.param_bytes + self.input_bytes + self.peak_activation_bytes

    def by_module(self, depth: int | None = 1) -> list[ModuleCost]:
        """Totals per module path cut to ``depth`` components (``None``: full paths).

        ``depth=1`` gives the root's children (``layer1``, ``fc``); ``depth=2`` their children
        (``layer1.0``). Rows come in the order their first node appears in the graph (the
        placeholders lifting an exported program's weights, all at its top, aside).

        >>> import torch, fxloom
        >>> from fxloom.passes.cost import analyze_cost
        >>> block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> gm = fxloom.symbolic_trace(torch.nn.Sequential(block, torch.nn.Linear(4, 2)))
        >>> report = analyze_cost(gm, torch.Size([3, 4]))
        >>> [(row.path, row.macs) for row in report.by_module(depth=1)]
        [('(root)', 0), ('0', 48), ('1', 24)]
        >>> [(row.path, row.module_type) for row in report.by_module(depth=2)][1:]
        [('0.0', 'Linear'), ('0.1', 'ReLU'), ('1', 'Linear')]
        """
        if depth is not None and depth < 1:
            raise ValueError(f"depth must be at least 1 (or None for full paths), got {depth}")
        groups: dict[str, list[NodeCost]] = {}
        weights_last = sorted(self.nodes, key=_lifts_weights)  # stable: graph order otherwise
        for node in weights_last:
            groups.setdefault(_cut(node.module_path, depth), []).append(node)
        return [self._module_row(path, nodes) for path, nodes in groups.items()]

    def _module_row(self, path: str, nodes: list[NodeCost]) -> ModuleCost:
        weights = {name for node in nodes for name in node.weights}
        return ModuleCost(
            path=path,
            module_type=self.module_types.get(path, ""),
            nodes=len(nodes),
            flops=sum(node.flops for node in nodes),
            macs=sum(node.macs for node in nodes),
            bytes_read=sum(node.bytes_read for node in nodes),
            bytes_written=sum(node.bytes_written for node in nodes),
            allocated=sum(node.allocated for node in nodes),
            params=sum(self.weight_sizes[name][0] for name in weights),
            param_bytes=sum(self.weight_sizes[name][1] for name in weights),
        )

    # ------------------------------------------------------------------ presentation
    def summary(self) -> str:
        """A few lines: totals, memory, and what was not counted."""
        lines = [
            f"{self.model}: cost from {self.mode} shapes; inputs {', '.join(self.inputs) or '-'}",
            f"  FLOPs {format_count(self.flops)}  MACs {format_count(self.macs)}"
            "  (a multiply-add is 1 MAC = 2 FLOPs)",
            f"  parameters {format_count(self.params)}"
            f"  weights {format_bytes(self.param_bytes)} (parameters and buffers)",
            f"  inputs {format_bytes(self.input_bytes)}"
            f"  activations {format_bytes(self.activation_bytes)} in all,"
            f" peak {format_bytes(self.peak_activation_bytes)}"
            + (f" at %{self.peak_node}" if self.peak_node else ""),
            f"  peak memory estimate {format_bytes(self.peak_memory_bytes)}"
            " (weights + inputs + peak activations)",
        ]
        if self.not_counted:
            listed = "; ".join(
                f"{target} ({', '.join('%' + name for name in names)})"
                for target, names in self.not_counted.items()
            )
            lines.append(f"  not counted (no FLOP formula, 0 FLOPs assumed): {listed}")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def table(self, by: str = "module", depth: int | None = 1, top: int | None = None) -> Table:
        """A ``rich`` table, one row per module (``by="module"``, cut to ``depth``) or node.

        ``top`` keeps the rows with the most FLOPs (in graph order); a total row ends it.
        """
        if by == "module":
            return _module_table(self, self.by_module(depth), top)
        if by == "node":
            return _node_table(self, top)
        raise ValueError(f"by must be 'module' or 'node', got {by!r}")


def _lifts_weights(node: NodeCost) -> bool:
    """Whether ``node`` is a placeholder of an exported program that lifts weights."""
    return node.op == "placeholder" and bool(node.weights)


def _cut(path: str, depth: int | None) -> str:
    if not path:
        return ROOT
    if depth is None:
        return path
    return ".".join(path.split(".")[:depth])


def _keep_top(rows: list[Any], top: int | None) -> list[Any]:
    if top is None or top >= len(rows):
        return rows
    kept = set(map(id, sorted(rows, key=lambda row: row.flops, reverse=True)[:top]))
    return [row for row in rows if id(row) in kept]


def _share(flops: int, total: int) -> str:
    return f"{100 * flops / total:.1f}%" if total else "-"


def _new_table(title: str, columns: Iterable[str]) -> Table:
    from rich.table import Table

    table = Table(title=title, show_footer=True)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index < 2 else "right", overflow="fold")
    return table


def _module_table(report: CostReport, rows: list[ModuleCost], top: int | None) -> Table:
    from rich.text import Text

    table = _new_table(
        f"{report.model}: cost by module",
        ("module", "type", "FLOPs", "MACs", "share", "params", "read", "written", "activations"),
    )
    total = report.flops
    for row in _keep_top(rows, top):
        table.add_row(
            Text(row.path),
            Text(row.module_type),
            format_count(row.flops),
            format_count(row.macs),
            _share(row.flops, total),
            format_count(row.params),
            format_bytes(row.bytes_read),
            format_bytes(row.bytes_written),
            format_bytes(row.allocated),
        )
    _add_total_row(table, report, with_share=True)
    return table


def _node_table(report: CostReport, top: int | None) -> Table:
    from rich.text import Text

    table = _new_table(
        f"{report.model}: cost by node",
        ("node", "target", "module", "FLOPs", "MACs", "read", "written", "allocated"),
    )
    for node in _keep_top(report.nodes, top):
        flops = format_count(node.flops) if node.counted else "not counted"
        table.add_row(
            Text("%" + node.name),
            Text(f"{node.op} {node.target}"),
            Text(node.module_path or ROOT),
            flops,
            format_count(node.macs),
            format_bytes(node.bytes_read),
            format_bytes(node.bytes_written),
            format_bytes(node.allocated),
        )
    _add_total_row(table, report, with_share=False)
    return table


def _add_total_row(table: Table, report: CostReport, with_share: bool) -> None:
    cells = ["total", "", format_count(report.flops), format_count(report.macs)]
    if with_share:
        cells += ["100%", format_count(report.params)]
    else:
        cells.insert(2, "")
    cells += [
        format_bytes(report.bytes_read),
        format_bytes(report.bytes_written),
        format_bytes(report.activation_bytes),
    ]
    for column, cell in zip(table.columns, cells):
        column.footer = cell


def format_count(value: int) -> str:
    """``value`` with a decimal prefix: ``4.09 G``, ``25.56 M``, ``512``.

    >>> format_count(4_089_184_256), format_count(25_557_032), format_count(512)
    ('4.09 G', '25.56 M', '512')
    """
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}"
    return str(value)


def format_bytes(value: int) -> str:
    """``value`` bytes with a binary prefix: ``97.49 MiB``, ``12 B``.

    >>> format_bytes(102_228_128), format_bytes(12)
    ('97.49 MiB', '12 B')
    """
    for prefix, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}"
    return f"{value} B"
