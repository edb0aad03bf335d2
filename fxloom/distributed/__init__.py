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

import importlib as _importlib
import sys as _sys
import types as _types
from typing import Any

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fxloom.distributed' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(_types.ModuleType):
    """This package, whose function ``pipeline`` shares its name with the module defining it.

    Importing a submodule sets the package's attribute of that name to the submodule, so
    ``import fxloom.distributed.pipeline`` anywhere would turn ``fxloom.distributed.pipeline``
    into a module; here the attribute stays the function, as with an eager import."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, _types.ModuleType) and _LAZY.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


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
