"""Sequences of calls that vary, side by side: fxloom.compile against torch.compile.

    python benchmarks/bench_recompiles.py [--cases NAME ...] [--record]

The first half of ``fxloom.compile`` specialised every size and number, so a call sequence
whose sizes, ints or floats change compiled once per call. Each case here is a program and a
sequence of calls as users make them (issue 35's list: an int argument 1..8, a float over 8
values, a growing key/value length, batch 2,1,3,1,4, a per-call counter attribute, layers
reading their own int index, a loop bound that changes, a closure with a break, a break under
``no_grad``, ``autocast`` with a break, a user context manager with a break, a generator
function). Each case runs in a fresh process per method (``--worker CASE METHOD``), which
builds the program, calls it eagerly and compiled on copies of each call's arguments, and
reports

- whether every call's result equals eager's (tensor leaves, rtol 1e-4 / atol 1e-5) and the
  program's own state after every call (a counter attribute) too;
- graphs compiled over the whole sequence, counted alike: fxloom's ``explain().graph_count``
  (cache entries and pieces whose graph holds at least one operation: Dynamo compiles no
  empty graph, so a piece that only hands values on between breaks is not counted; all
  pieces, empty ones too, are ``piece_count``, shown beside it); Dynamo's: the calls of a
  counting backend, ``torch.compile(fn, backend=counter)``, which Dynamo calls once per
  graph it compiles;
- whether the sequence ended running as Python (fxloom: ``explain()``'s reason; Dynamo: a
  recompile-limit warning).

Targets (issue 35): equal to eager on every call; graphs at most Dynamo's on every case, and
at most 0.6 of Dynamo's in total.

Depends on: torch (torch.compile only here, as the peer), fxloom.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from benchmarks._common import load_average, machine_line, noise_line, publish

RTOL, ATOL = 1e-4, 1e-5
PREFIX = "RECOMPILE-RESULT "
METHODS = ("fxloom.compile", "torch.compile")


@dataclass
class Case:
    """A program and its calls: ``make()`` returns ``(callable, [(args, kwargs), ...])``;
    ``state(callable)`` (optional) is the program state compared after every call."""

    make: Callable[[], tuple[Callable[..., Any], list[tuple[tuple, dict]]]]
    what: str
    state: Callable[[Any], Any] | None = None


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


# ------------------------------------------------------------------ the cases
def int_argument():
    def f(x, n):
        return x * n + n

    return f, [((_x(4), n), {}) for n in range(1, 9)]


def float_argument():
    def f(x, scale):
        return torch.sigmoid(x * scale) + scale

    return f, [((_x(4), 0.5 + 0.25 * i), {}) for i in range(8)]


def growing_kv():
    def attend(q, k_cache, v_cache, k_new, v_new):
        k = torch.cat([k_cache, k_new], dim=1)
        v = torch.cat([v_cache, v_new], dim=1)
        weights = torch.softmax(q @ k.transpose(1, 2) / 4.0, dim=-1)
        return weights @ v, k, v

    calls = []
    for length in range(1, 9):
        calls.append(((_x(1, 1, 16), _x(1, length, 16), _x(1, length, 16), _x(1, 1, 16), _x(1, 1, 16)), {}))  # fmt: skip
    return attend, calls


def batch_sizes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    return model, [((_x(batch, 8),), {}) for batch in (2, 1, 3, 1, 4)]


class Stepped(nn.Module):
    """Counts its calls in an int attribute and uses it (a step counter, a schedule)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.step = 0

    def forward(self, x):
        self.step += 1
        return self.linear(x) * self.step


def counter_attribute():
    torch.manual_seed(0)
    return Stepped(), [((_x(2, 4),), {}) for _ in range(8)]


class Indexed(nn.Module):
    """A layer that reads its own index (Hugging Face's ``layer_idx``)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.layer_idx = index
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x) + self.layer_idx


def layer_index():
    torch.manual_seed(0)
    layers = [Indexed(i) for i in range(8)]

    def run_layer(layer, x):
        return layer(x)

    return run_layer, [((layer, _x(2, 4)), {}) for layer in layers]


def loop_bound():
    def f(x, n):
        for i in range(n):
            x = x * 0.5 + i
        return x

    return f, [((_x(4), n), {}) for n in (2, 3, 4, 2, 5, 3)]


def closure_with_break():
    def f(x):
        scale = 2.0
        shifted = lambda t: t * scale  # noqa: E731 - a closure over a cell of f
        total = x.sum().item()  # a graph break
        scale = total
        return shifted(x) + 1

    return f, [((_x(4) + i,), {}) for i in range(4)]


def break_under_no_grad():
    torch.manual_seed(0)
    linear = nn.Linear(4, 4)

    def f(x):
        with torch.no_grad():
            y = linear(x)
            m = y.max().item()  # a graph break inside the with
            y = y / m
        return y * 2

    return f, [((_x(2, 4) + i,), {}) for i in range(4)]


def autocast_with_break():
    torch.manual_seed(0)
    linear = nn.Linear(4, 4)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = linear(x)
            m = y.float().abs().max().item()
            y = linear(y / m)
        return y.float()

    return f, [((_x(2, 4) + i,), {}) for i in range(4)]


class Timer:
    """A user context manager: counts entries and exits."""

    entered = exited = 0

    def __enter__(self):
        Timer.entered += 1
        return self

    def __exit__(self, *exc):
        Timer.exited += 1
        return False


def user_context_manager_with_break():
    def f(x):
        with Timer():
            y = x * 2
            m = y.sum().item()
            y = y - m
        return y

    return f, [((_x(4) + i,), {}) for i in range(4)]


def generator_function():
    def f(x):
        yield x + 1
        yield x * 2
        yield x.sum()

    return f, [((_x(4) + i,), {}) for i in range(4)]


CASES: dict[str, Case] = {
    "int argument 1..8": Case(int_argument, "f(x, n) = x * n + n, n = 1..8"),
    "float argument x8": Case(float_argument, "sigmoid(x * s) + s over 8 values of s"),
    "growing kv 1..8": Case(growing_kv, "attention over a cache of length 1..8"),
    "batch 2,1,3,1,4": Case(batch_sizes, "an MLP over batches 2, 1, 3, 1, 4"),
    "counter attribute": Case(counter_attribute, "self.step += 1 used in forward, 8 calls",
                              state=lambda model: model.step),
    "layers' own index": Case(layer_index, "one function over 8 layers reading layer_idx"),
    "loop bound": Case(loop_bound, "for i in range(n), n = 2, 3, 4, 2, 5, 3"),
    "closure with a break": Case(closure_with_break, "a closure over a cell, .item() break"),
    "break under no_grad": Case(break_under_no_grad, ".item() break inside torch.no_grad()"),
    "autocast with a break": Case(autocast_with_break, "bfloat16 autocast, .item() break"),
    "user context manager": Case(user_context_manager_with_break,
                                 "a class with __enter__/__exit__, .item() break inside",
                                 state=lambda _: (Timer.entered, Timer.exited)),
    "generator function": Case(generator_function, "yield three values, list() of them"),
}  # fmt: skip


# ------------------------------------------------------------------ one process
def _compile(
    method: str, fn: Any
) -> tuple[Any, Callable[[], tuple[int, int]], Callable[[], str | None]]:
    """The compiled callable, how many graphs (and pieces) it compiled so far, and why it runs
    as Python."""
    if method == "fxloom.compile":
        import fxloom

        compiled = fxloom.compile(fn)

        def graphs() -> tuple[int, int]:
            report = compiled.explain()
            return report.graph_count, report.piece_count

        def as_python() -> str | None:
            reason = getattr(compiled, "eager_reason", None)
            if reason is None and hasattr(compiled, "compiled_forward"):
                reason = getattr(compiled.compiled_forward, "eager_reason", None)
            return reason

        return compiled, graphs, as_python
    count = [0]
    limit_hit: list[str] = []

    def counter(gm: Any, example_inputs: Any) -> Any:
        count[0] += 1
        return gm.forward

    compiled = torch.compile(fn, backend=counter)
    warnings.simplefilter("always")
    original = warnings.showwarning

    def seen(message, *args, **kwargs):  # Dynamo warns once when it falls back
        if "recompile_limit" in str(message) or "cache_size_limit" in str(message):
            limit_hit.append(str(message).splitlines()[0])
        return original(message, *args, **kwargs)

    warnings.showwarning = seen
    return compiled, lambda: (count[0], count[0]), lambda: limit_hit[0] if limit_hit else None


def _equal(actual: Any, expected: Any) -> bool:
    if isinstance(expected, torch.Tensor):
        return (
            isinstance(actual, torch.Tensor)
            and actual.shape == expected.shape
            and actual.dtype == expected.dtype
            and torch.allclose(actual.detach(), expected.detach(), rtol=RTOL, atol=ATOL)
        )
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(actual, (list, tuple))
            and len(actual) == len(expected)
            and all(_equal(a, e) for a, e in zip(actual, expected))
        )
    return actual == expected


def _copied(value: Any) -> Any:
    """Each call's arguments for one side: tensors cloned (a side may change them in
    place), modules and other objects shared (their identity is part of the call)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(item) for item in value)
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    return value


def _materialised(value: Any) -> Any:
    """A generator function's result as the list of what it yields."""
    import types

    return list(value) if isinstance(value, types.GeneratorType) else value


def worker(name: str, method: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    case = CASES[name]
    eager_fn, calls = case.make()
    compiled_fn = case.make()[0]  # its own state (a counter attribute), the same weights
    compiled, graphs, as_python = _compile(method, compiled_fn)
    correct = True
    for args, kwargs in calls:
        eager_args, compiled_args = _copied((args, kwargs)), _copied((args, kwargs))
        if name == "user context manager":
            Timer.entered = Timer.exited = 0
        expected = _materialised(eager_fn(*eager_args[0], **eager_args[1]))
        eager_state = case.state(eager_fn) if case.state else None
        if name == "user context manager":
            Timer.entered = Timer.exited = 0
        got = _materialised(compiled(*compiled_args[0], **compiled_args[1]))
        compiled_state = case.state(compiled_fn) if case.state else None
        correct = correct and _equal(got, expected) and eager_state == compiled_state
    graph_count, piece_count = graphs()
    return {"correct": correct, "graphs": graph_count, "pieces": piece_count,
            "as_python": as_python()}  # fmt: skip


# ------------------------------------------------------------------ the run
def run_case(name: str, method: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, __file__, "--worker", name, method],
        capture_output=True,
        text=True,
        timeout=900,
    )
    for line in result.stdout.splitlines():
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX) :])
    tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": tail[:200]}


def report(results: dict[str, dict[str, dict[str, Any]]], loads: tuple[float, float]) -> str:
    lines = [
        "## fxloom.compile against torch.compile over call sequences that vary — "
        + __import__("datetime").date.today().isoformat(),
        "",
        f"{machine_line()}. `python benchmarks/bench_recompiles.py`: each case in a "
        "fresh process per method, one torch thread; every call compared with eager (and the "
        "program's state where it has one); graphs over the whole sequence: fxloom "
        "`explain().graph_count` (graphs holding an operation, as Dynamo compiles no empty "
        "graph; in brackets every piece, `piece_count`), Dynamo the calls of a counting backend "
        "(`torch.compile(fn, backend=counter)`). Target: equal on every call, graphs <= "
        "Dynamo's on every case, <= 0.6x in total.",
        "",
        "| case | calls | correct: fxloom / Dynamo | graphs: fxloom / Dynamo | ran as Python at the end | target |",
        "|---|---|---|---:|---|---|",
    ]
    totals = [0, 0]
    for name, by_method in results.items():
        ours, theirs = by_method["fxloom.compile"], by_method["torch.compile"]
        if "error" in ours or "error" in theirs:
            lines.append(f"| {name} | {CASES[name].what} | error: {ours.get('error', '')} / "
                         f"{theirs.get('error', '')} | | | **error** |")  # fmt: skip
            continue
        totals[0] += ours["graphs"]
        totals[1] += theirs["graphs"]
        met = ours["correct"] and ours["graphs"] <= theirs["graphs"]
        python = ", ".join(
            f"{who}: {why[:80]}" for who, why in (("fxloom", ours["as_python"]),
                                                   ("Dynamo", theirs["as_python"])) if why
        ) or "no"  # fmt: skip
        lines.append(
            f"| {name} | {CASES[name].what} | {'yes' if ours['correct'] else '**no**'} / "
            f"{'yes' if theirs['correct'] else 'no'} | {ours['graphs']} ({ours['pieces']}) / "
            f"{theirs['graphs']} | "
            f"{python} | {'met' if met else '**not met**'} |"
        )
    ratio = totals[0] / totals[1] if totals[1] else float("nan")
    lines += [
        "",
        f"Total graphs: fxloom {totals[0]}, Dynamo {totals[1]}: {ratio:.2f}x "
        f"({'met' if ratio <= 0.6 else '**not met**'}: <= 0.6x).",
        "",
        noise_line(loads, "."),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), metavar="CASE")
    parser.add_argument("--record", action="store_true", help="append the table to RESULTS.md")
    parser.add_argument("--worker", nargs=2, metavar=("CASE", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        with contextlib.redirect_stdout(sys.stderr):
            outcome = worker(*args.worker)
        print(PREFIX + json.dumps(outcome))
        return
    before = load_average()
    results = {}
    for name in args.cases or list(CASES):
        results[name] = {method: run_case(name, method) for method in METHODS}
        print(name, results[name], flush=True)
    publish(report(results, (before, load_average())), args.record)


if __name__ == "__main__":
    main()
