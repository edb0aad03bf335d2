"""Who uses the attributes a fusion replaces, and where the fused ones go.

A fold replaces a layer's weights. Whether it may do so where they are, or must put the new
ones under a fresh name, depends on who else reaches them: another ``call_module`` of the
same module, a ``get_attr`` of its weight, a ``call_module`` of a container holding it.
``AttrUses`` answers that in O(depth of the path), from counts built once per pass.

Depends on: the IR (``GraphModule``, ``attr_path``).
"""

from __future__ import annotations

import re
from collections import Counter

import torch

from fxloom import attr_path
from fxloom.graph_module import GraphModule

__all__ = ["AttrUses", "fused_path"]

REFERRING_OPS = ("call_module", "get_attr")
_FUSED_SUFFIX = re.compile(r"_fused(_\d+)?$")


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
        for prefix in attr_path.prefixes(target):
            self._within[prefix] += 1

    def remove(self, target: str) -> None:
        self._exact[target] -= 1
        for prefix in attr_path.prefixes(target):
            self._within[prefix] -= 1

    def container_used(self, path: str) -> bool:
        """Whether a node uses a module holding ``path`` as a whole (``call_module``, ``get_attr``)."""
        return any(self._exact[prefix] > 0 for prefix in attr_path.prefixes(path)[:-1])

    def users(self, path: str) -> int:
        """How many nodes reach ``path`` itself or something under it, plus one if a node uses a
        container of it."""
        return self._within[path] + (1 if self.container_used(path) else 0)

    def is_used(self, path: str) -> bool:
        return self.users(path) > 0


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
    return attr_path.free_name(gm, wanted)
