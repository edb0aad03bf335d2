"""Latency as the CLI and the demo report it: threads pinned, interleaved calls, medians.

A speedup printed by ``fxloom lower``, ``fxloom quantize`` or ``fxloom demo`` compares two
ways of running one model on one input. On a busy machine, torch's default thread count
(one per core) makes that comparison noise: threads that wait on each other at every
operator lose their cores to other processes, and a ratio such as "1025x" comes out. So
both sides run with the same, stated number of threads (``TIMING_THREADS`` unless the user
asks for more; torch's and, through ``lower(threads=...)``, ONNX Runtime's), take turns
(each going first in alternate rounds, so neither profits from a warm cache or a quiet
moment), and each reports the median of at least ``TIMING_RUNS`` calls, more for a fast
model (up to ``MIN_SECONDS`` of calls per side).

Depends on: torch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Latency", "TIMING_THREADS", "compare_latency", "pinned_threads"]

TIMING_THREADS = 1
TIMING_RUNS = 20
MAX_RUNS = 500
MIN_SECONDS = 0.3


@contextmanager
def pinned_threads(count: int) -> Iterator[int]:
    """``torch.set_num_threads(count)`` inside the block; the previous setting after it."""
    if count < 1:
        raise ValueError(f"a thread count is a positive number, got {count}")
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class Latency:
    """Median seconds of one call of each side, how many calls, and with how many threads."""

    labels: tuple[str, str]
    seconds: tuple[float, float]
    runs: int
    threads: int

    @property
    def speedup(self) -> float:
        """How many times faster the second side is than the first."""
        return self.seconds[0] / self.seconds[1]

    def summary(self) -> str:
        first, second = (f"{label} {s * 1e3:.3f} ms" for label, s in zip(self.labels, self.seconds))
        thread_text = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        return (
            f"latency on the example (median of {self.runs}, {thread_text}): {first}, {second} "
            f"({self.speedup:.2f}x)"
        )


def compare_latency(
    first: Callable[[], Any],
    second: Callable[[], Any],
    *,
    labels: tuple[str, str] = ("eager", "lowered"),
    threads: int = TIMING_THREADS,
    runs: int = TIMING_RUNS,
) -> Latency:
    """Time two calls on ``threads`` torch threads, interleaved; medians (see the module).

    ``runs`` is the fewest calls per side (a slow model in the demo takes fewer than 20).

    >>> fast = compare_latency(lambda: sum(range(1000)), lambda: None)
    >>> fast.speedup > 1, fast.threads
    (True, 1)
    """
    sides = [first, second]
    with pinned_threads(threads), torch.no_grad():
        start = time.perf_counter()
        for call in sides:  # warm up: sessions, allocators, packed weights
            call()
        runs = _runs_for(time.perf_counter() - start, runs)
        samples: list[list[float]] = [[], []]
        for repeat in range(runs):
            order = (0, 1) if repeat % 2 == 0 else (1, 0)
            for side in order:
                began = time.perf_counter()
                sides[side]()
                samples[side].append(time.perf_counter() - began)
    medians = (statistics.median(samples[0]), statistics.median(samples[1]))
    return Latency(labels, medians, runs, threads)


def _runs_for(warm_up_seconds: float, fewest: int) -> int:
    """At least ``fewest``; more while each side's calls take under ``MIN_SECONDS``."""
    enough = int(2 * MIN_SECONDS / max(warm_up_seconds, 1e-6))
    return max(fewest, min(MAX_RUNS, enough))
