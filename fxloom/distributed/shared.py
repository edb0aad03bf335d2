"""Parameters that more than one stage uses (tied embeddings), found and kept in step.

GPT-2 reads ``transformer.wte.weight`` in its first block (the embedding) and again in its
last (``lm_head``, tied). Cut into stages on different processes, each holds its own copy and
computes a gradient for its own use only; the copies drift apart after the first optimizer
step unless the gradients are summed. torch's own ``pipeline()`` copies such parameters into
each stage and leaves the sum to the user.

``find_shared(stage_modules)`` lists every parameter or buffer more than one stage holds, as
``SharedParameter`` rows (the names per stage: a tied weight is ``transformer.wte.weight`` in
one stage and ``lm_head.weight`` in another). A pipeline plan either refuses them
(``shared="error"``) or sums their gradients after backward (``shared="sync"``:
``sum_gradients``, over a small process group per shared set). A shared buffer that a stage
updates in place cannot be kept in step this way and is always refused.

Depends on: torch.distributed (only when gradients are summed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from fxloom.graph_module import GraphModule

__all__ = ["SHARED", "SharedParameter", "SharedParameterError", "find_shared", "sum_gradients"]

SHARED = ("sync", "error")


class SharedParameterError(ValueError):
    """Stages share a parameter or buffer the plan cannot keep in step."""


@dataclass(frozen=True)
class SharedParameter:
    """One tensor held by several stages: stage -> its names there."""

    names: dict[int, tuple[str, ...]]
    is_parameter: bool

    @property
    def stages(self) -> tuple[int, ...]:
        return tuple(sorted(self.names))

    def describe(self) -> str:
        where = "; ".join(
            f"stage {s}: {', '.join(names)}" for s, names in sorted(self.names.items())
        )
        return f"{'parameter' if self.is_parameter else 'buffer'} shared by stages {self.stages} ({where})"


def find_shared(stage_modules: list[GraphModule]) -> list[SharedParameter]:
    """Every tensor that more than one stage module holds, in order of first appearance."""
    holders: dict[int, dict[int, list[str]]] = {}
    kinds: dict[int, bool] = {}
    for stage, module in enumerate(stage_modules):
        for name, tensor, is_parameter in _tensors(module):
            holders.setdefault(id(tensor), {}).setdefault(stage, []).append(name)
            kinds[id(tensor)] = is_parameter
    return [
        SharedParameter({s: tuple(n) for s, n in names.items()}, kinds[key])
        for key, names in holders.items()
        if len(names) > 1
    ]


def _tensors(module: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor, bool]]:
    for name, parameter in module.named_parameters(remove_duplicate=False):
        yield name, parameter, True
    for name, buffer in module.named_buffers(remove_duplicate=False):
        yield name, buffer, False


def check_shared(shared: list[SharedParameter], policy: str, updated_in_place: set[str]) -> None:
    """Refuse what ``policy`` and in-place updates do not allow (see the module docstring)."""
    if policy not in SHARED:
        raise ValueError(f"shared={policy!r}; use one of {', '.join(map(repr, SHARED))}")
    for row in shared:
        written = sorted(
            {name for names in row.names.values() for name in names} & updated_in_place
        )
        if written:
            raise SharedParameterError(
                f"the {row.describe()} is updated in place ({', '.join(written)}), so copies on "
                "different processes would differ; cut so that one stage holds it (cut_at, "
                "balance, or fewer stages)"
            )
        if policy == "error" and row.is_parameter:
            raise SharedParameterError(
                f"the {row.describe()}: each stage would train its own copy. Pass "
                "shared='sync' to sum its gradients after backward (plan.sync_shared_grads), "
                "or cut so that one stage holds it"
            )


def sum_gradients(
    row: SharedParameter, local: dict[int, torch.nn.Module], group: Any | None
) -> None:
    """Sum ``row``'s gradients over the stages that hold it; every copy gets the sum.

    ``local`` maps the stages on this process to their modules; ``group`` is the process group
    of the ranks holding the row (None when they are all this process).
    """
    parameters = _unique(
        module.get_parameter(name)
        for stage, module in local.items()
        if stage in row.names
        for name in row.names[stage]
    )
    if not parameters:
        return
    total = sum(
        (p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters),
        start=torch.zeros_like(parameters[0]),
    )
    if group is not None:
        import torch.distributed as dist

        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    for parameter in parameters:
        parameter.grad = total.clone() if len(parameters) > 1 else total


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for tensor in tensors:
        seen.setdefault(id(tensor), tensor)
    return list(seen.values())
