"""fxloom on PyTorch's own distributed runtime.

* ``pipeline(model, example_inputs, stages=N)``: a captured program cut into balanced
  pipeline stages, each a GraphModule that ``torch.distributed.pipelining.PipelineStage`` runs
  under any of torch's schedules (``plan.build_stage(rank, device)``);
* ``run_local(fn, nprocs)``: run a function in local processes on loopback (tests, examples).
* Program scheduling on ``torch.distributed.rpc`` (``fxloom.distributed.rpc``):
  ``rpc.rpc_sync`` is a leaf of tracing and ``schedule_async`` starts each remote call early
  and waits for it late (``rpc_wait``), with or without importing this package.

Depends on: ``torch.distributed`` (``launch`` imports it when used; ``rpc`` on import).
Each name loads its module when first read (``_LAZY``).
"""

from fxloom._lazy import lazy_names

# name -> the module defining it, imported on first use (PEP 562): importing this package
# costs nothing until a name is read, and ``pipeline`` brings export and sympy only then.
_LAZY = {
    "BoundaryError": "fxloom.distributed.boundaries",
    "LaunchError": "fxloom.distributed.launch",
    "rpc_options": "fxloom.distributed.launch",
    "run_local": "fxloom.distributed.launch",
    "PipelineError": "fxloom.distributed.pipeline",
    "pipeline": "fxloom.distributed.pipeline",
    "PipelinePlan": "fxloom.distributed.plan",
    "StageReport": "fxloom.distributed.plan",
    "rpc_available": "fxloom.distributed.rpc",
    "rpc_wait": "fxloom.distributed.rpc",
    "SharedParameter": "fxloom.distributed.shared",
    "SharedParameterError": "fxloom.distributed.shared",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY)


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
