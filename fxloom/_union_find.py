"""Disjoint sets of hashable items (union-find with path halving): the alias classes that
dead-code elimination (``fxloom._dead_code``) and the passes' effect analysis
(``fxloom.passes._effects``) build, each over the same graph walk's joins."""

from __future__ import annotations

from typing import Any


class UnionFind:
    """Items joined into classes; an item never joined is a class of its own."""

    def __init__(self) -> None:
        self._parent: dict[Any, Any] = {}

    def find(self, item: Any) -> Any:
        """The representative of ``item``'s class."""
        parent = self._parent
        while True:
            up = parent.get(item, item)
            if up is item or up == item:
                return item
            grand = parent.get(up, up)
            parent[item] = grand  # path halving: the walk after this one is shorter
            item = grand

    def union(self, a: Any, b: Any) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a is not root_b and root_a != root_b:
            self._parent[root_a] = root_b
