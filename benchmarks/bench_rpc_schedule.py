"""Program scheduling on torch.distributed.rpc (torch.fx paper, 6.2.3): blocking vs scheduled remote calls.

Two processes on loopback (``fxloom.distributed.run_local``, one torch thread each):

    trainer  runs a ranking model: local work (an MLP, "small" or "large"), then LOOKUPS
             fetches from the parameter server with ``rpc.rpc_sync``, then ``torch.cat``;
    ps       serves ``lookup(ids, service)``: ``time.sleep(service)`` standing for the
             server's work and the network (a sleep takes no CPU, so the two cores are not
             contended), then a real gather from its embedding table.

For each local work x service time, ``blocking`` is ``fxloom.symbolic_trace(model)`` and
``scheduled`` is ``schedule_async`` of the same trace: every fetch starts right after the
inputs (``rpc_async``) and is waited for just before ``torch.cat``. Each repetition times
FORWARDS forwards of each (QPS = forwards per second), the two taking turns to go first;
reported are the median QPS of each, the ratio (the median over repetitions of scheduled /
blocking timed next to each other) and the analytical bound

    (local + LOOKUPS x (service + rpc)) / max(local, service + rpc)

the blocking time over the best the scheduled one can do (its fetches overlap the local
work and each other: the server serves them at once), with ``local`` (the MLP alone) and
``rpc`` (an empty round trip) measured in the same run. "equal": both modules return the
same tensor. Tests never assert timings; only ratios measured in one run mean anything.

    python benchmarks/bench_rpc_schedule.py              # services 0-16 ms x small/large
    python benchmarks/bench_rpc_schedule.py --quick      # smoke run: 2 services, small only
    python benchmarks/bench_rpc_schedule.py --record     # append the table to RESULTS.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from datetime import date
from functools import cache
from pathlib import Path

import torch
import torch.distributed.rpc as rpc
from torch import nn

import fxloom
from fxloom.distributed import rpc_options, run_local
from fxloom.passes.schedule import schedule_async

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    freeze_startup_heap,
    load_average,
    machine_line,
    noise_line,
    publish,
    rotated,
    timed,
)

BATCH, ROWS, WIDTH = 128, 100_000, 32  # lookups per fetch, table rows, embedding width
LOCAL_WORK = {"small": (2, 128), "large": (4, 512)}  # name -> (linear layers, width)
SERVICES_MS = (0, 2, 4, 8, 16)
SIDES = ("blocking", "scheduled")


@dataclass(frozen=True)
class Settings:
    services_ms: tuple[float, ...]
    local_work: tuple[str, ...]
    repeats: int
    forwards: int  # per timed run
    lookups: int  # fetches per forward


@dataclass
class Row:
    local_work: str
    service_ms: float
    local_ms: float
    rpc_ms: float
    qps: dict[str, list[float]]  # side -> one value per repetition
    equal: bool


# ------------------------------------------------------------------ the parameter server
@cache
def embedding_table() -> torch.Tensor:
    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(0))


def lookup(ids: torch.Tensor, service_s: float) -> torch.Tensor:
    """Runs on the server: wait the service time, then gather the rows."""
    time.sleep(service_s)
    return embedding_table()[ids]


def empty() -> None:
    """Runs on the server and does nothing: one call is the cost of an rpc round trip."""


# ------------------------------------------------------------------ the trainer's model
class Ranker(nn.Module):
    def __init__(self, layers: int, width: int, service_s: float, lookups: int) -> None:
        super().__init__()
        mlp: list[nn.Module] = []
        for _ in range(layers):
            mlp += [nn.Linear(width, width), nn.ReLU()]
        self.mlp = nn.Sequential(*mlp)
        self.service_s = service_s
        self.lookups = lookups

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        h = self.mlp(dense)
        fetched = [
            rpc.rpc_sync("ps", lookup, args=(ids[i], self.service_s)) for i in range(self.lookups)
        ]
        return torch.cat([h, *fetched], dim=1)


def run_forwards(module: nn.Module, dense: torch.Tensor, ids: torch.Tensor, forwards: int) -> None:
    for _ in range(forwards):
        module(dense, ids)


def median_seconds(fn, runs: int) -> float:
    return statistics.median(timed(fn) for _ in range(runs))


def measure(settings: Settings, local_work: str, service_ms: float, rpc_s: float) -> Row:
    layers, width = LOCAL_WORK[local_work]
    torch.manual_seed(0)
    model = Ranker(layers, width, service_ms / 1e3, settings.lookups).eval()
    modules = {
        "blocking": fxloom.symbolic_trace(model),
        "scheduled": schedule_async(fxloom.symbolic_trace(model)),
    }
    dense = torch.randn(BATCH, width)
    ids = torch.randint(0, ROWS, (settings.lookups, BATCH))
    equal = torch.equal(modules["blocking"](dense, ids), modules["scheduled"](dense, ids))
    local_s = median_seconds(lambda: model.mlp(dense), 20)
    qps: dict[str, list[float]] = {side: [] for side in SIDES}
    for repeat in range(settings.repeats):
        for side in rotated(list(SIDES), repeat):
            seconds = timed(lambda m=modules[side]: run_forwards(m, dense, ids, settings.forwards))
            qps[side].append(settings.forwards / seconds)
    return Row(local_work, service_ms, local_s * 1e3, rpc_s * 1e3, qps, equal)


def trainer(settings: Settings) -> list[Row]:
    freeze_startup_heap()
    rows = []
    with torch.no_grad():
        rpc_s = median_seconds(lambda: rpc.rpc_sync("ps", empty), 50)
        for local_work in settings.local_work:
            for service_ms in settings.services_ms:
                rows.append(measure(settings, local_work, service_ms, rpc_s))
                print(f"{local_work} local work, {service_ms:g} ms service: done", flush=True)
    return rows


def worker(rank: int, world_size: int, settings: Settings) -> list[dict] | None:
    """Rank 0 measures, rank 1 serves. Rows travel back as dicts: run as a script, this
    module is ``__mp_main__`` in the processes, a name the parent cannot unpickle from."""
    rpc.init_rpc(
        ("trainer", "ps")[rank], rank=rank, world_size=world_size, rpc_backend_options=rpc_options()
    )
    try:
        return [asdict(row) for row in trainer(settings)] if rank == 0 else None
    finally:
        rpc.shutdown()


# ------------------------------------------------------------------ report
def bound(row: Row, lookups: int) -> float:
    remote = row.service_ms + row.rpc_ms
    return (row.local_ms + lookups * remote) / max(row.local_ms, remote)


def table(rows: list[Row], lookups: int) -> list[str]:
    lines = [
        "| local work | local ms | service ms | rpc ms | blocking QPS | scheduled QPS | ratio "
        "| bound | equal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        ratio = statistics.median(s / b for s, b in zip(row.qps["scheduled"], row.qps["blocking"]))
        lines.append(
            f"| {row.local_work} | {row.local_ms:.2f} | {row.service_ms:g} | {row.rpc_ms:.2f} "
            f"| {statistics.median(row.qps['blocking']):.1f} "
            f"| {statistics.median(row.qps['scheduled']):.1f} | {ratio:.2f} "
            f"| {bound(row, lookups):.2f} | {row.equal} |"
        )
    return lines


def markdown(rows: list[Row], settings: Settings, command: str, loads: tuple[float, float]) -> str:
    lines = [
        f"## Program scheduling on torch.distributed.rpc — {date.today().isoformat()}",
        "",
        f"{machine_line()}; 1 torch thread per process. `{command}`. Two processes on "
        f"loopback (TensorPipe over TCP): a trainer and a parameter server; {settings.lookups} "
        f"fetches of {BATCH} rows per forward; {settings.repeats} repetitions of "
        f"{settings.forwards} forwards per side, the sides taking turns to go first. QPS: "
        "median over repetitions; ratio: median of scheduled / blocking in the same "
        "repetition; bound: (local + fetches x (service + rpc)) / max(local, service + rpc), "
        "local and rpc (an empty round trip) measured in this run.",
        "",
        *table(rows, settings.lookups),
        "",
        noise_line(loads, "."),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="services 0 and 4 ms, small only")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per side")
    parser.add_argument("--forwards", type=int, default=20, help="forwards per timed run")
    parser.add_argument("--lookups", type=int, default=2, help="fetches per forward")
    parser.add_argument("--record", action="store_true", help="append the table to RESULTS.md")
    args = parser.parse_args()
    if args.quick:
        settings = Settings((0, 4), ("small",), 2, 5, args.lookups)
    else:
        settings = Settings(
            SERVICES_MS, tuple(LOCAL_WORK), args.repeats, args.forwards, args.lookups
        )
    load_before = load_average()
    rows = [Row(**row) for row in run_local(worker, 2, init="rpc", args=(settings,))[0]]
    command = "python benchmarks/bench_rpc_schedule.py" + (" --quick" if args.quick else "")
    for flag, default in (("repeats", 7), ("forwards", 20), ("lookups", 2)):
        if getattr(args, flag) != default:
            command += f" --{flag} {getattr(args, flag)}"
    publish(markdown(rows, settings, command, (load_before, load_average())), args.record)


if __name__ == "__main__":
    main()
