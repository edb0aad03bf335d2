"""What each node of a program costs, by the measure a pipeline is balanced on.

``run_example(gm, args, kwargs)`` runs the program once on one microbatch with fxloom's
``Interpreter``, timing every node (the best of ``repeats`` runs after a warm-up) and keeping
what each node produced: a ``TensorSpec`` (shape, dtype) for a tensor, the value itself for
anything else (sizes, flags, tuples). Stage boundaries are sized and typed from it, and
``PipelineStage`` gets its static input and output metadata from it.

``node_costs(balance, ...)`` turns that into one number per node:

* ``"time"``: the measured seconds;
* ``"flops"``: ``analyze_cost``'s FLOPs (memory-bound operations count 0);
* ``"memory"``: the bytes a node allocates plus the parameter bytes it reads;
* a callable ``balance(node) -> float``: the user's own measure.

Each measure comes with the cost of one byte sent between stages (``PER_BYTE``), so that a
cut's traffic and the stages' work add up in one unit, and with its ``tolerance``: stage costs
closer than that are equal to the cut chooser (times are noisy; the other measures exact).

Depends on: ``fxloom.interpreter``, ``fxloom.passes.shape_prop``, ``fxloom.passes.cost``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxloom.graph_module import GraphModule
from fxloom.interpreter import Interpreter
from fxloom.node import Node

__all__ = [
    "BALANCES",
    "Example",
    "TensorSpec",
    "cost_report",
    "describe",
    "evened",
    "node_costs",
    "run_example",
    "tolerance",
    "value_bytes",
]

BALANCES = ("time", "flops", "memory")

# A measure's cost of sending one byte to the next stage: gloo on loopback moves about 1 GB/s
# (../shared/design/distributed.md); a CPU here does some 10 GFLOP/s on small matmuls, so a
# byte sent weighs as 10 FLOPs; memory balance counts a received byte as a byte held.
DEFAULT_BANDWIDTH = 1e9
FLOPS_PER_SECOND = 1e10


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's shape and dtype, as stage metadata needs them."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * torch.empty((), dtype=self.dtype).element_size()

    def empty(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device=device)


@dataclass
class Example:
    """One microbatch through the program: per node, its seconds and what it produced."""

    seconds: dict[Node, float]
    values: dict[Node, Any]  # TensorSpec for tensors, the value itself for the rest
    runs: int = 1  # timed runs; each node's time is its best
    threads: int = 1  # torch's threads while timing
    spread: float = 0.0  # how far the median run's total is above the best run's (0.1: 10%)


def value_bytes(value: Any) -> int:
    """Bytes ``value`` takes on the wire: its tensors' bytes, 8 per number otherwise."""
    if isinstance(value, TensorSpec):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(value_bytes(item) for item in value)
    if isinstance(value, dict):
        return sum(value_bytes(item) for item in value.values())
    return 8 if isinstance(value, (int, float, bool)) else 0


class _TimingInterpreter(Interpreter):
    def __init__(self, module: GraphModule) -> None:
        super().__init__(module)
        self.seconds: dict[Node, float] = {}
        self.values: dict[Node, Any] = {}

    def run_node(self, n: Node) -> Any:
        start = time.perf_counter()
        result = super().run_node(n)
        elapsed = time.perf_counter() - start
        self.seconds[n] = min(elapsed, self.seconds.get(n, elapsed))
        self.values[n] = result if n.op == "output" else describe(result)
        return result


def describe(value: Any) -> Any:
    """A tensor as its ``TensorSpec`` (in tuples and lists too); anything else as it is."""
    if isinstance(value, torch.Tensor):
        return TensorSpec(tuple(value.shape), value.dtype, value.requires_grad)
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list, torch.Size):
        return type(value)(describe(item) for item in value)
    return value


TIMING_RUNS = 5
TIMING_THREADS = 1


def run_example(
    gm: GraphModule, inputs: list[Any], repeats: int = TIMING_RUNS, threads: int = TIMING_THREADS
) -> Example:
    """Run ``gm``'s graph on ``inputs`` (one per placeholder) ``repeats`` times after a warm-up,
    with torch pinned to ``threads`` threads (torch's default takes every core, and on a busy
    machine one stage's time then rests on what else runs); each node keeps its best time,
    and the example says how far the runs spread.

    The warm-up is a ``ShapeProp`` run: it leaves each node's ``tensor_meta``, so the cost
    report (``analyze_cost(gm, mode="recorded")``) needs no run of its own.
    """
    from fxloom.passes.shape_prop import ShapeProp

    ShapeProp(gm).run(*inputs, enable_io_processing=False)
    interpreter = _TimingInterpreter(gm)
    totals = []
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            interpreter.run(*inputs, enable_io_processing=False)
            totals.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    best, median = min(totals), statistics.median(totals)
    spread = median / best - 1 if best > 0 else 0.0
    return Example(interpreter.seconds, interpreter.values, repeats, threads, spread)


def cost_report(gm: GraphModule) -> Any:
    """``analyze_cost`` from the shapes ``run_example`` recorded; None where it cannot count."""
    from fxloom.passes.cost import analyze_cost

    try:
        return analyze_cost(gm, mode="recorded")
    except Exception:  # FLOPs are a column of the report; planning by time still works
        return None


def node_costs(
    balance: str | Callable[[Node], float],
    gm: GraphModule,
    example: Example,
    report: Any,
    bandwidth: float = DEFAULT_BANDWIDTH,
) -> tuple[dict[Node, float], float]:
    """Per-node cost by ``balance``, and what one byte sent to the next stage costs.

    ``report`` is ``cost_report(gm)`` (needed for ``"flops"`` and ``"memory"``).
    """
    if callable(balance):
        return {node: float(balance(node)) for node in gm.graph.nodes}, 0.0
    if balance == "time":
        return dict(example.seconds), 1.0 / bandwidth
    if balance in ("flops", "memory"):
        if report is None:
            from fxloom.passes.cost import analyze_cost

            analyze_cost(gm, mode="recorded")  # raises, saying why it cannot count
        by_name = {row.name: row for row in report.nodes}
        if balance == "flops":
            costs = {n: float(getattr(by_name.get(n.name), "flops", 0)) for n in gm.graph.nodes}
            return costs, FLOPS_PER_SECOND / bandwidth
        costs = {n: float(_memory(by_name.get(n.name))) for n in gm.graph.nodes}
        return costs, 1.0
    raise ValueError(
        f"balance={balance!r}; use one of {', '.join(map(repr, BALANCES))} or a function "
        "node -> cost"
    )


# How far apart (relative) two stage costs may be and still count as equal when the cuts are
# chosen: a node's best time over a few runs at one thread still moves by a few percent from
# one measurement to the next (more on a busy machine), so partitions within that of the best
# are taken as equal and the earliest wins; FLOPs, bytes and a function's costs are exact.
TOLERANCES = {"time": 0.05}


def tolerance(balance: str | Callable[[Node], float]) -> float:
    """The relative difference in stage cost that ``balance``'s measure cannot tell apart."""
    return TOLERANCES.get(balance, 0.0) if isinstance(balance, str) else 0.0


def evened(
    gm: GraphModule, groups: list[list[Node]], seconds: list[float], example: Example
) -> list[float]:
    """``seconds`` (one per group of nodes), groups that do the same work sharing their mean.

    The same work is the same operations (a module's class, a function, a method) producing
    the same shapes and dtypes, in the same order: a model's identical layers. What tells
    their measured times apart is noise, and cuts chosen on it would move from one timing to
    the next.
    """
    totals: dict[tuple[Any, ...], list[float]] = {}
    kinds = [_work_of(gm, nodes, example) for nodes in groups]
    for kind, measured in zip(kinds, seconds):
        totals.setdefault(kind, []).append(measured)
    return [statistics.fmean(totals[kind]) for kind in kinds]


def _work_of(gm: GraphModule, nodes: list[Node], example: Example) -> tuple[Any, ...]:
    return tuple((n.op, _operation(gm, n), repr(example.values.get(n))) for n in nodes)


def _operation(gm: GraphModule, node: Node) -> Any:
    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target)))
    return node.target


def _memory(row: Any) -> int:
    return 0 if row is None else row.allocated + row.param_bytes
