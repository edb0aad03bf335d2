"""Switches of torch's global state that a captured graph makes as effects, at run time.

``with torch.autocast(...)`` in a compiled function is recorded in the graph, as grad mode
is (``torch._C._set_grad_enabled``): its enter is a call of ``autocast_on`` with the
manager's device, enabled flag, dtype and cache flag, its exit a call of ``autocast_back``
with the state the enter found (the manager's ``prev``, ``prev_fastdtype`` and
``prev_cache_enabled``, as ``torch.autocast.__exit__`` restores them). The ops between run
under the state the graph switched, as in eager, and a graph break inside the block is no
boundary of its own: the piece before the break enters, the piece after it exits.

A graph op that raises between the two would leave the switch on: ``run`` saves the state
before the graph (``saved_autocast``) and puts it back if the graph raises
(``restore_autocast``), as eager's ``with`` does on the way out.

Depends on torch only (``fxloom.ops.mutation`` lists these functions as effects, kept by
dead-code elimination).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["autocast_back", "autocast_on", "restore_autocast", "saved_autocast"]


def autocast_on(device: str, enabled: bool, dtype: torch.dtype, cache_enabled: bool) -> None:
    """What entering ``torch.autocast(device, dtype, enabled, cache_enabled)`` switches."""
    torch.set_autocast_enabled(device, enabled)
    torch.set_autocast_dtype(device, dtype)
    torch.autocast_increment_nesting()
    torch.set_autocast_cache_enabled(cache_enabled)


def autocast_back(device: str, enabled: bool, dtype: torch.dtype, cache_enabled: bool) -> None:
    """What leaving it switches back to (the state the enter found); the weight cache is
    dropped when the last autocast region is left, as ``torch.autocast.__exit__`` does."""
    if torch.autocast_decrement_nesting() == 0:
        torch.clear_autocast_cache()
    torch.set_autocast_enabled(device, enabled)
    torch.set_autocast_dtype(device, dtype)
    torch.set_autocast_cache_enabled(cache_enabled)


# The devices whose autocast state ``saved_autocast`` keeps: those a graph may switch.
DEVICES = ("cpu", "cuda")


def saved_autocast() -> tuple[Any, ...]:
    """The whole autocast state: per device enabled and dtype, the cache flag, the nesting."""
    nesting = torch.autocast_increment_nesting() - 1  # (the only way to read it)
    torch.autocast_decrement_nesting()
    per_device = tuple(
        (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)) for device in DEVICES
    )
    return per_device, torch.is_autocast_cache_enabled(), nesting


def restore_autocast(saved: tuple[Any, ...]) -> None:
    """Put back what ``saved_autocast`` returned."""
    per_device, cache_enabled, nesting = saved
    for device, (enabled, dtype) in zip(DEVICES, per_device):
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)
    torch.set_autocast_cache_enabled(cache_enabled)
    now = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    for _ in range(now - nesting):
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
    for _ in range(nesting - now):
        torch.autocast_increment_nesting()
