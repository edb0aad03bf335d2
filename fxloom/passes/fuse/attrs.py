"""The attributes of a GraphModule that a fusion reads, adds and removes, and who uses them.

A fold replaces a layer's weights. Whether it may do so where they are, or must put the new
ones under a fresh name, depends on who else reaches them: another ``call_module`` of the
same module, a ``get_attr`` of its weight, a ``call_module`` of a container holding it.
``AttrUses`` answers that in O(depth of the path), from counts built once per pass.

Depends on: torch, the IR (``GraphModule``, ``Node``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import torch

from fxloom.graph_module import GraphModule

__all__ = ["AttrUses", "delete_attr", "fetch_attr", "free_path", "fused_path", "set_attr"]

REFERRING_OPS = ("call_module", "get_attr")
_FUSED_SUFFIX = re.compile(r"_fused(_\d+)?$")


def _prefixes(path: str) -> list[str]:
    """``"a.b.c"`` -> ``["a", "a.b", "a.b.c"]``."""
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


class AttrUses:
    """Which attribute paths of ``gm`` the graph's ``call_module``/``get_attr`` nodes reach.

    A node reaching ``"layer1.0"`` reaches everything under it; a node reaching
    ``"layer1.0.conv.weight"`` needs ``"layer1.0.conv"`` to keep that weight. Kept current
    with ``add`` and ``remove`` as nodes are created and erased.
    """

    def __init__(self, gm: GraphModule) -> None:
        self._exact: Counter[str] = Counter()  # nodes whose target is this path
        self._within: Counter[str] = Counter()  # nodes whose target is this path or under it
        for op in REFERRING_OPS:
            for node in gm.graph.find_nodes(op=op, sort=False):
                self.add(node.target)

    def add(self, target: str) -> None:
        self._exact[target] += 1
        for prefix in _prefixes(target):
            self._within[prefix] += 1

    def remove(self, target: str) -> None:
        self._exact[target] -= 1
        for prefix in _prefixes(target):
            self._within[prefix] -= 1

    def container_used(self, path: str) -> bool:
        """Whether a node uses a module holding ``path`` as a whole (``call_module``, ``get_attr``)."""
        return any(self._exact[prefix] > 0 for prefix in _prefixes(path)[:-1])

    def users(self, path: str) -> int:
        """How many nodes reach ``path`` itself or something under it, plus one if a node uses a
        container of it."""
        return self._within[path] + (1 if self.container_used(path) else 0)

    def is_used(self, path: str) -> bool:
        return self.users(path) > 0


def fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    """The value at qualified path ``target`` (``"layer1.0.conv.weight"``)."""
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _owner(gm: torch.nn.Module, target: str) -> tuple[Any, str]:
    *path, field = target.split(".")
    return fetch_attr(gm, ".".join(path)) if path else gm, field


def fused_path(gm: torch.nn.Module, original: str, uses: AttrUses) -> str:
    """A free path for the fused version of ``original``: ``<original>_fused`` (or ``_fused_1``...).

    Beside the original, unless a node uses the module holding it as a whole: adding to that
    module would change it (and it may be the user's own), so then at the top level
    (``layer1_0_conv_fused``). Folding twice (conv, batch norm, batch norm) names from the
    original path again rather than stacking suffixes (``w_fused_fused``).
    """
    wanted = _FUSED_SUFFIX.sub("", original) + "_fused"
    if uses.container_used(original):
        wanted = wanted.replace(".", "_")
    return free_path(gm, wanted)


def free_path(gm: torch.nn.Module, wanted: str) -> str:
    """``wanted`` if nothing lives there in ``gm``, else ``wanted_1``, ``wanted_2``, ..."""
    owner, field = _owner(gm, wanted)
    candidate, suffix = field, 0
    while hasattr(owner, candidate):
        suffix += 1
        candidate = f"{field}_{suffix}"
    return wanted[: len(wanted) - len(field)] + candidate


def set_attr(gm: torch.nn.Module, target: str, value: Any, *, as_buffer: bool = False) -> None:
    """Put ``value`` at ``target`` (its owner must exist): a module, parameter or buffer."""
    owner, field = _owner(gm, target)
    if as_buffer and not isinstance(value, torch.nn.Parameter):
        owner.register_buffer(field, value)
    else:
        setattr(owner, field, value)


def delete_attr(gm: torch.nn.Module, target: str) -> None:
    """Remove whatever lives at ``target`` (a module, parameter, buffer or plain attribute)."""
    owner, field = _owner(gm, target)
    if hasattr(owner, field):
        delattr(owner, field)
