"""Which modules every frontend keeps whole: ``is_torch_nn_leaf``.

Modules defined in ``torch.nn`` (and ``torch.ao.nn``) are PyTorch's own building blocks
(``Linear``, ``Conv2d``, ``LayerNorm``...): a captured graph calls them as one
``call_module`` rather than recording their insides, except ``Sequential`` (a container,
whose children are recorded one by one). Symbolic tracing's default
``Tracer.is_leaf_module`` and the bytecode frontend both ask this one function.

Depends on torch.
"""

from __future__ import annotations

import torch

__all__ = ["is_torch_nn_leaf"]


def is_torch_nn_leaf(module: torch.nn.Module) -> bool:
    """Whether ``module`` is one of torch's own modules that captures keep whole."""
    defined_in = type(module).__module__ or ""
    return defined_in.startswith(("torch.nn", "torch.ao.nn")) and not isinstance(
        module, torch.nn.Sequential
    )
