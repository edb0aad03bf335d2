"""What a loaded module holds at a qualified path, read from its dictionaries only.

``attr_path.find`` falls back to ``getattr``, which runs properties, and a parametrized
tensor is a property that runs its parametrizations. The loader's checks must not run
anything a file chose, so they look paths up here: a module's ``_modules``,
``_parameters``, ``_buffers``, then its parametrized tensors (as ``ParametrizedTensor``,
their computed shape and dtype, not their value), then its ``__dict__``. Anything else
(a class attribute, a value reached through a non-module) is ``MISSING``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fxloom.attr_path import MISSING
from fxloom.serialize import parametrized

__all__ = ["MISSING", "ParametrizedTensor", "held_at"]


@dataclass(frozen=True)
class ParametrizedTensor:
    """Where a parametrized tensor is: its shape and dtype, computed without running it."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def held_at(root: nn.Module, path: str) -> Any:
    """The value ``root`` holds at ``path`` (``"layer1.0.weight"``), or ``MISSING``."""
    value: Any = root
    for name in path.split("."):
        if not isinstance(value, nn.Module):
            return MISSING
        value = _held(value, name)
        if value is MISSING:
            return MISSING
    return value


def _held(module: nn.Module, name: str) -> Any:
    for table in (module._modules, module._parameters, module._buffers):
        if name in table:
            return table[name]
    if name in parametrized.parametrized_names(module):
        plist = module._modules["parametrizations"]._modules[name]
        originals = [*plist._parameters.values(), *plist._buffers.values()]
        shape = parametrized.check_parametrization_list(plist, name)
        return ParametrizedTensor(shape, originals[0].dtype)
    return vars(module).get(name, MISSING)
