"""Program scheduling on torch.distributed.rpc: a parameter-server lookup overlapped with local work.

Two processes on this machine: ``trainer`` runs a ranking model whose forward computes a
dense MLP, then fetches embeddings from ``ps`` (a parameter server) with a blocking
``rpc.rpc_sync`` right before it needs them. ``fxloom.symbolic_trace`` records the remote
call as one node; ``schedule_async`` starts it with ``rpc_async`` as soon as its input
exists and waits for it just before ``torch.cat``, so the lookup runs while the MLP does::

    python examples/rpc_schedule.py

prints the scheduled code, whether both modules compute the same, and their times.
``tests/distributed/test_rpc_schedule.py`` runs ``trainer`` in its processes.
"""

from __future__ import annotations

import time

import torch
import torch.distributed.rpc as rpc
from torch import nn

import fxloom
import fxloom.distributed  # run_local, rpc_options (rpc_sync is a leaf of tracing without it)
from fxloom.passes.schedule import schedule_async

SERVICE_SECONDS = 0.004  # what the server's work and the network take, per lookup
ROWS, WIDTH = 1000, 16


def embedding_table() -> torch.Tensor:
    """The parameter server's table (the same on every call: seeded)."""
    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(0))


def lookup(ids: torch.Tensor) -> torch.Tensor:
    """Runs on the parameter server: the rows of ``ids``, after the service time."""
    time.sleep(SERVICE_SECONDS)
    return embedding_table()[ids]


class Ranker(nn.Module):
    """Local work first, then the remote lookup, then both together."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, WIDTH))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        h = self.mlp(dense)
        embedded = rpc.rpc_sync("ps", lookup, args=(ids,))
        return torch.cat([h, embedded], dim=1)


def trainer() -> dict:
    """Trace, schedule and run the model against ``ps``; return what happened."""
    torch.manual_seed(0)
    model = Ranker()
    blocking = fxloom.symbolic_trace(model)
    scheduled = schedule_async(fxloom.symbolic_trace(model))
    dense, ids = torch.randn(64, 256), torch.randint(0, ROWS, (64,))
    seconds = {}
    for name, module in (("blocking", blocking), ("scheduled", scheduled)):
        module(dense, ids)  # warm up: the first call makes the code and the connection
        start = time.perf_counter()
        out = [module(dense, ids) for _ in range(10)][-1]
        seconds[name] = (time.perf_counter() - start) / 10
    return {
        "code": scheduled.code,
        "equal": torch.equal(blocking(dense, ids), scheduled(dense, ids)),
        "equal_to_eager": torch.equal(model(dense, ids), out),
        "seconds": seconds,
    }


def worker(rank: int, world_size: int) -> dict | None:
    """Rank 0 is the trainer, rank 1 the parameter server (it serves until shutdown)."""
    name = "trainer" if rank == 0 else "ps"
    rpc.init_rpc(
        name, rank=rank, world_size=world_size, rpc_backend_options=fxloom.distributed.rpc_options()
    )
    try:
        return trainer() if rank == 0 else None
    finally:
        rpc.shutdown()  # waits for every process: the server stays until the trainer is done


if __name__ == "__main__":
    result = fxloom.distributed.run_local(worker, nprocs=2, init="rpc")[0]
    print(result["code"])
    print("scheduled == blocking:", result["equal"], "  == eager:", result["equal_to_eager"])
    for name, seconds in result["seconds"].items():
        print(f"{name:>9}: {seconds * 1e3:.1f} ms per forward")
