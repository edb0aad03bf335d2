"""Where a captured program may be cut into pipeline stages, and the best cuts by cost.

A program's *work nodes* (every call node, in graph order) are grouped into **segments**,
the runs of consecutive nodes that belong to the same *block*. A block is a module a user
would name as a unit of a model: a direct child of the root (``lm_head``, ``layer1``) or an
element of a container (``transformer.h.3``, ``encoder.layer.0``, ``layer1.0``); a node
belongs to the innermost block it ran in (``node.meta["nn_module_stack"]``), the root ("")
when none. Candidate cuts lie between segments, so stages start and end on the module
boundaries their names show. A block that holds all the work (a model wrapped in a module
whose forward calls it) is opened into its children, to any depth, so a wrapped model cuts
at its layers as torch's ``pipeline()`` split points at any depth allow. ``cut_at="nodes"``
makes every work node its own segment.

``choose_cuts(costs, sends, stages)`` is an exact dynamic program over contiguous partitions:
it minimises the largest stage cost, a stage costing its segments plus what it sends to the
next stage. With n segments and k stages it takes O(n^2 k) steps (n is tens for module cuts).
Of the partitions whose largest stage is within ``tolerance`` of the least, it takes the one
with the earliest cuts: measured times vary from run to run (more on a busy machine), and
without a tolerance the choice among near-equal partitions (8 equal layers in 3 stages) would
follow that noise, so the same model timed twice could be cut in two ways.

Depends on: the IR (reads ``meta``), torch.nn's container classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxloom.node import Node
from fxloom.ops.runtime_functions import is_runtime_check

__all__ = ["CUT_AT", "Segment", "block_of", "choose_cuts", "segments", "work_blocks"]

CUT_AT = ("modules", "nodes")

# Modules whose children are the units of a model (layers, blocks), not parts of one.
_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)

WORK_OPS = frozenset({"call_function", "call_method", "call_module"})


@dataclass(frozen=True)
class Segment:
    """Work nodes ``start`` up to (not including) ``stop``, all in the block ``block``."""

    start: int
    stop: int
    block: str


def block_of(node: Node, opened: frozenset[str] = frozenset()) -> str:
    """The innermost block ``node`` ran in, or "" (the root's own code).

    ``opened``: blocks looked into as the root is: their children are blocks (``segments``
    opens a block that holds all the work, a model wrapped in another module).

    Read from ``node.meta["nn_module_stack"]`` alone (path -> (path, class), outermost
    first), so a GraphModule whose containers became plain modules still has its blocks. A
    module is a block when its parent is the root, or is a container that is a block itself,
    or was never called (a ``ModuleList`` is indexed, not called) and sits in a block or the
    root. Blocks thus nest from the root down: ``layer1.0`` is one, but the ``Sequential``
    inside a residual block (``layer1.0.downsample``) does not make its convolution one.
    """
    stack = dict(node.meta.get("nn_module_stack") or {})
    paths = {_path(key, value): _class(value) for key, value in stack.items()}
    if node.op == "call_module":
        paths.setdefault(str(node.target), None)
    blocks = {""}
    for path in paths:
        parent = path.rpartition(".")[0]
        if parent in opened and parent in blocks:
            is_block = True
        elif parent in paths:
            is_block = parent in blocks and _is_container(paths[parent])
        else:  # the root, or a container indexed rather than called
            is_block = parent == "" or parent.rpartition(".")[0] in blocks
        if is_block:
            blocks.add(path)
    return max(blocks, key=len)


def _path(key: Any, value: Any) -> str:
    return value[0] if isinstance(value, tuple) else str(key)


def _class(value: Any) -> Any:
    return value[1] if isinstance(value, tuple) and len(value) > 1 else None


def _is_container(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, _CONTAINERS)


def segments(work: Sequence[Node], cut_at: str) -> list[Segment]:
    """The segments of the work nodes ``work`` (see the module docstring)."""
    if cut_at not in CUT_AT:
        raise ValueError(f"cut_at={cut_at!r}; use one of {', '.join(map(repr, CUT_AT))}")
    if cut_at == "nodes":
        return [Segment(i, i + 1, block_of(node)) for i, node in enumerate(work)]
    blocks = work_blocks(work)
    found: list[Segment] = []
    start = 0
    for i in range(1, len(work) + 1):
        if i == len(work) or blocks[i] != blocks[i - 1]:
            found.append(Segment(start, i, blocks[i - 1]))
            start = i
    return found


def work_blocks(work: Sequence[Node]) -> list[str]:
    """Each work node's block, a block that holds all the work (``Wrapper(model)``, whose
    forward calls ``self.model``; a model inside a loss or task head's module) opened into
    its children, to any depth, so that a wrapped model cuts at its layers."""
    opened: frozenset[str] = frozenset()
    while True:
        blocks = _blocks_of(work, opened)
        only = set(blocks) - {""}
        if len(only) != 1 or only <= opened or len(work) < 2:
            return blocks
        deeper = _blocks_of(work, opened | only)
        if len(set(deeper) - {""}) <= 1 and set(deeper) == set(blocks):
            return blocks  # a leaf, or nothing inside to cut at
        opened |= only


def _blocks_of(work: Sequence[Node], opened: frozenset[str] = frozenset()) -> list[str]:
    """Each work node's block; a run-time check (an input check, a guard) takes the block of
    the node after it, so that checks never make a segment of their own."""
    blocks = [block_of(node, opened) for node in work]
    following = ""
    for i in range(len(work) - 1, -1, -1):
        if work[i].op == "call_function" and is_runtime_check(work[i].target):
            blocks[i] = following
        following = blocks[i]
    return blocks


def choose_cuts(
    costs: Sequence[float], sends: Sequence[float], stages: int, tolerance: float = 0.0
) -> list[int]:
    """The segment indices where stages 1..k-1 start, minimising the costliest stage.

    ``costs[i]`` is segment i's cost; ``sends[i]`` the cost of sending what crosses the
    boundary after segment i (``len(sends) == len(costs) - 1``). A stage ending at segment j
    costs ``sum(costs[i..j]) + sends[j]`` (the last stage sends nothing). Of the partitions
    whose costliest stage is at most ``(1 + tolerance)`` times the least possible, the one
    with the earliest cuts (so ties, and near-ties within the measure's noise, always go the
    same way).
    """
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} segments into {stages} stages")
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)

    def stage_cost(first: int, last: int) -> float:  # segments first..last, inclusive
        send = sends[last] if last < n - 1 else 0.0
        return prefix[last + 1] - prefix[first] + send

    bound = _least_costliest_stage(n, stages, stage_cost) * (1.0 + tolerance)
    return _earliest_cuts_within(n, stages, stage_cost, bound)


def _least_costliest_stage(n: int, stages: int, stage_cost: Any) -> float:
    """The least cost of the costliest stage over every cut of n segments into ``stages``."""
    # best[j]: the least max-cost of cutting segments 0..j into the stages so far
    best = [stage_cost(0, j) for j in range(n)]
    for k in range(1, stages):
        row = [float("inf")] * n
        for j in range(k, n):
            for i in range(k, j + 1):  # the last stage is segments i..j
                row[j] = min(row[j], max(best[i - 1], stage_cost(i, j)))
        best = row
    return best[n - 1]


def _earliest_cuts_within(n: int, stages: int, stage_cost: Any, bound: float) -> list[int]:
    """The earliest cuts of n segments into ``stages`` with no stage costing over ``bound``."""
    # fits[m][i]: segments i..n-1 can be cut into m stages none over the bound
    fits = [[False] * (n + 1) for _ in range(stages + 1)]
    fits[0][n] = True
    for m in range(1, stages + 1):
        for i in range(n - 1, -1, -1):
            fits[m][i] = any(fits[m - 1][j + 1] and stage_cost(i, j) <= bound for j in range(i, n))
    cuts, first = [], 0
    for left in range(stages, 1, -1):  # ``left`` stages still to place, from ``first`` on
        last = next(
            j for j in range(first, n) if stage_cost(first, j) <= bound and fits[left - 1][j + 1]
        )
        cuts.append(last + 1)
        first = last + 1
    return cuts
