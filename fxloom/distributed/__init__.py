"""fxloom on PyTorch's own distributed runtime.

* ``run_local(fn, nprocs)``: run a function in local processes on loopback (tests, examples).
* Program scheduling on ``torch.distributed.rpc`` (``fxloom.distributed.rpc``): importing
  this package makes ``rpc.rpc_sync`` a leaf of tracing and lets ``schedule_async`` start
  each remote call early and wait for it late (``rpc_wait``).

Depends on: ``torch.distributed`` (``launch`` imports it when used; ``rpc`` on import).
"""

from fxloom.distributed.launch import LaunchError, rpc_options, run_local
from fxloom.distributed.rpc import rpc_available, rpc_wait

__all__ = ["LaunchError", "rpc_available", "rpc_options", "rpc_wait", "run_local"]
