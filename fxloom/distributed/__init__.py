"""fxloom on PyTorch's own distributed runtime.

* ``run_local(fn, nprocs)``: run a function in local processes on loopback (tests, examples).

Depends on: ``torch.distributed`` (imported when used).
"""

from fxloom.distributed.launch import LaunchError, rpc_options, run_local

__all__ = ["LaunchError", "rpc_options", "run_local"]
