"""fxloom on PyTorch's own distributed runtime.

* ``pipeline(model, example_inputs, stages=N)``: a captured program cut into balanced
  pipeline stages, each a GraphModule that ``torch.distributed.pipelining.PipelineStage`` runs
  under any of torch's schedules (``plan.build_stage(rank, device)``);
* ``run_local(fn, nprocs)``: run a function in local processes on loopback (tests, examples).

Depends on: ``torch.distributed`` (imported when used).
"""

from fxloom.distributed.boundaries import BoundaryError
from fxloom.distributed.launch import LaunchError, rpc_options, run_local
from fxloom.distributed.pipeline import PipelineError, pipeline
from fxloom.distributed.plan import PipelinePlan, StageReport
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
    "rpc_options",
    "run_local",
]
