"""fxloom on PyTorch's own distributed runtime.

* ``pipeline(model, example_inputs, stages=N)``: a captured program cut into balanced
  pipeline stages, each a GraphModule that ``torch.distributed.pipelining.PipelineStage`` runs
  under any of torch's schedules (``plan.build_stage(rank, device)``);
* ``run_local(fn, nprocs)``: run a function in local processes on loopback (tests, examples).
* Program scheduling on ``torch.distributed.rpc`` (``fxloom.distributed.rpc``): importing
  this package makes ``rpc.rpc_sync`` a leaf of tracing and lets ``schedule_async`` start
  each remote call early and wait for it late (``rpc_wait``).

Depends on: ``torch.distributed`` (``launch`` imports it when used; ``rpc`` on import).
"""

from fxloom.distributed.boundaries import BoundaryError
from fxloom.distributed.launch import LaunchError, rpc_options, run_local
from fxloom.distributed.pipeline import PipelineError, pipeline
from fxloom.distributed.plan import PipelinePlan, StageReport
from fxloom.distributed.rpc import rpc_available, rpc_wait
from fxloom.distributed.shared import SharedParameter, SharedParameterError

__all__ = [
    "BoundaryError",
    "LaunchError",
    "PipelineError",
    "PipelinePlan",
    "SharedParameter",
    "SharedParameterError",
    "StageReport",
    "pipeline",
    "rpc_available",
    "rpc_options",
    "rpc_wait",
    "run_local",
]
