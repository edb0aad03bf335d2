"""``run_local``: run a function in several local processes, the way tests and examples need.

Each process is started with ``spawn`` (a fresh interpreter: nothing of the parent's state,
so what works here works under ``torchrun`` too), finds the others on loopback only, uses one
CPU thread (two stages on a two-core machine must not fight over cores) and, unless told
otherwise, joins a gloo process group before ``fn(rank, world_size, *args)`` runs::

    def work(rank, world_size):
        t = torch.tensor([rank + 1.0])
        torch.distributed.all_reduce(t)
        return t.item()

    fxloom.distributed.run_local(work, nprocs=2)   # -> [3.0, 3.0], one result per rank

``fn`` must be importable by name from a module (spawned processes import it; a lambda or a
function defined inside another cannot travel). Its return value comes back pickled; an
exception in any rank is raised here as ``LaunchError`` with that rank's traceback.

``init="rpc"`` starts no process group: the environment (``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ``WORLD_SIZE``) is set for ``torch.distributed.rpc.init_rpc`` — see
``rpc_options()`` for TensorPipe options that stay on loopback.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["LaunchError", "free_port", "rpc_options", "run_local"]

# init= values: what each process joins before fn runs
_INITS = ("gloo", "rpc", None)


class LaunchError(RuntimeError):
    """A process started by ``run_local`` failed; the message carries its traceback."""


def free_port() -> int:
    """A TCP port on loopback nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def loopback_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    """What torch.distributed reads to find the other processes, on this machine only."""
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "TP_SOCKET_IFNAME": "lo",
    }


def rpc_options(timeout: float = 60.0) -> Any:
    """TensorPipe options for ``init_rpc`` under ``run_local``: TCP on loopback only.

    The shared-memory transport depends on ``/dev/shm``; ``uv`` (TCP) works everywhere.
    """
    from torch.distributed import rpc

    return rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rpc_timeout=timeout,
        _transports=["uv"],
        _channels=["basic"],
    )


def run_local(
    fn: Callable[..., Any],
    nprocs: int = 2,
    *,
    args: tuple[Any, ...] = (),
    init: str | None = "gloo",
    threads: int = 1,
    timeout: float = 600.0,
) -> list[Any]:
    """Run ``fn(rank, nprocs, *args)`` in ``nprocs`` spawned processes; return their results.

    Args:
        fn: a module-level function (spawned processes import it by name).
        nprocs: how many processes (ranks 0 .. nprocs - 1).
        args: more positional arguments for ``fn``; they are pickled to each process.
        init: ``"gloo"`` joins a gloo process group before ``fn`` and leaves it after;
            ``"rpc"`` or ``None`` only sets the loopback environment (``fn`` calls
            ``init_rpc`` itself, with ``rpc_options()``).
        threads: torch's intra-op threads per process (1: one core per process).
        timeout: seconds the process group waits for a peer before failing.

    Returns:
        ``fn``'s return value per rank, in rank order.

    Raises:
        LaunchError: a process raised or died; the message names the rank and has its
            traceback.
    """
    _check_arguments(fn, nprocs, args, init)
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="fxloom-run-") as folder:
        try:
            mp.start_processes(
                _child,
                args=(fn, nprocs, args, init, threads, timeout, port, folder),
                nprocs=nprocs,
                join=True,
                start_method="spawn",
            )
        except ProcessException as err:
            raise LaunchError(_failure_text(err, Path(folder), nprocs)) from None
        return [_result(Path(folder), rank) for rank in range(nprocs)]


def _check_arguments(fn: Callable[..., Any], nprocs: int, args: tuple, init: str | None) -> None:
    if init not in _INITS:
        raise ValueError(f"run_local: init={init!r}; use one of {_INITS}")
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"run_local: nprocs={nprocs!r}; give a positive int")
    try:
        pickle.dumps((fn, args))
    except Exception as err:
        raise TypeError(
            f"run_local: {getattr(fn, '__qualname__', fn)!r} or its args cannot be sent to a "
            f"spawned process ({err}). Define the function at the top level of a module "
            "(not a lambda or a nested function) and pass picklable arguments"
        ) from None


def _child(
    rank: int,
    fn: Callable[..., Any],
    nprocs: int,
    args: tuple,
    init: str | None,
    threads: int,
    timeout: float,
    port: int,
    folder: str,
) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    os.environ.update(loopback_environment(rank, nprocs, port))
    torch.set_num_threads(threads)
    if init == "gloo":
        dist.init_process_group(
            "gloo", rank=rank, world_size=nprocs, timeout=datetime.timedelta(seconds=timeout)
        )
    try:
        result = fn(rank, nprocs, *args)
    except BaseException:
        Path(folder, f"error-{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        if init == "gloo" and dist.is_initialized():
            dist.destroy_process_group()
    with open(Path(folder, f"result-{rank}.pkl"), "wb") as out:
        pickle.dump(result, out)


def _result(folder: Path, rank: int) -> Any:
    with open(folder / f"result-{rank}.pkl", "rb") as stream:
        return pickle.load(stream)  # written by our own child process, not a user file


def _failure_text(err: Exception, folder: Path, nprocs: int) -> str:
    failed = [r for r in range(nprocs) if (folder / f"error-{r}.txt").exists()]
    if not failed:
        return f"run_local: a process died without a Python error: {err}"
    rank = failed[0]
    text = (folder / f"error-{rank}.txt").read_text()
    return f"run_local: rank {rank} of {nprocs} raised:\n{text}"
