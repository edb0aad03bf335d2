"""The last stage's output: its tensors as a tuple, read back as the model's own output.

``torch.distributed.pipelining`` treats what the last stage returns as a tensor or a tuple of
tensors (it detaches them after backward), so a stage cannot return a Hugging Face
``ModelOutput`` or a dict. When the model's output is anything but a tensor or a tuple of
tensors, the last stage returns ``fxloom.pytree.tensor_leaves(output)``, and ``OutputLayout.rebuild`` turns
that tuple back into the model's output: ``plan.loss(loss_fn)`` does so before calling the
loss, ``plan.output(result)`` for what the last rank's ``schedule.step`` returns.

Depends on: ``fxloom.pytree``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fxloom import pytree

__all__ = ["OutputLayout", "needs_layout"]


def needs_layout(value: Any) -> bool:
    """Whether ``value`` is more than a tensor or a plain tuple of tensors."""
    if isinstance(value, torch.Tensor):
        return False
    return not (type(value) is tuple and all(isinstance(v, torch.Tensor) for v in value))


@dataclass(frozen=True)
class OutputLayout:
    """How to rebuild an output from its tensors: its pytree spec and its other leaves."""

    spec: Any
    others: tuple[Any, ...]  # the leaves, with None where a tensor goes
    is_tensor: tuple[bool, ...]

    @classmethod
    def of(cls, example: Any) -> OutputLayout:
        leaves, spec = pytree.tree_flatten(example)
        is_tensor = tuple(isinstance(leaf, torch.Tensor) for leaf in leaves)
        others = tuple(None if t else leaf for leaf, t in zip(leaves, is_tensor))
        return cls(spec, others, is_tensor)

    def rebuild(self, tensors: Any) -> Any:
        """The model's output from the tuple of tensors the last stage returned."""
        supply = iter(tensors if isinstance(tensors, (tuple, list)) else (tensors,))
        leaves = [next(supply) if t else other for t, other in zip(self.is_tensor, self.others)]
        return pytree.tree_unflatten(leaves, self.spec)
