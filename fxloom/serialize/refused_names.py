"""What loading a file would refuse, by name, found without loading it (``fxloom show``).

``find_refusals`` reads the module records of a file's program JSON — each
module's class, each ``call_function`` target, each function named among a
node's arguments — and lists the names ``fxloom.load`` would refuse, each once,
with where it is used and the loader's reason (which says how to allow it).
``standing_in(refusals)`` then lets the graphs be decoded for printing: each
refused function name resolves to an inert ``RefusedName`` that prints as the
name and refuses to be called. Nothing is imported and nothing from the file runs.
What a refusal says where it is used, and what a placeholder prints, is escaped
(``fxloom._format.printable``); ``Refusal.name`` stays the file's name, which the
placeholders stand in for.

Depends on ``allowlist``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fxloom._format import printable
from fxloom.serialize import allowlist
from fxloom.serialize.errors import DisallowedNameError, SerializationError

__all__ = ["Refusal", "RefusedName", "find_refusals", "standing_in"]


@dataclass
class Refusal:
    """A name loading would refuse: the kind of use, where it is used (first few), and why."""

    name: str
    kind: str  # "module class", "function"
    reason: str
    places: list[str] = field(default_factory=list)


class RefusedName:
    """Stands for a refused function in a graph decoded only to be described.

    It prints (``repr``, and its ``__module__``/``__name__``, which the graph's text form
    reads) as the file's name escaped (``printable``): the name is the file's string.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        module, _, qualname = printable(name).rpartition(".")
        self.__module__ = module
        self.__name__ = self.__qualname__ = qualname

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise SerializationError(f"{self.name} is not on fxloom's allowlist; it is only described")

    def __repr__(self) -> str:
        return printable(self.name)


def find_refusals(modules: Iterable[tuple[str, dict]]) -> list[Refusal]:
    """The refused names of the ``(path, module record)`` pairs of a file, in order of use."""
    found: dict[tuple[str, str], Refusal] = {}

    def refuse(name: str, kind: str, error: DisallowedNameError, place: str) -> None:
        refusal = found.setdefault((kind, name), Refusal(name, kind, str(error)))
        refusal.places.append(place)

    for path, record in modules:
        where = printable(f"module {path}" if path else "the root module")
        try:
            allowlist.resolve_module_class(record.get("class"))
        except DisallowedNameError as e:
            refuse(e.name, "module class", e, where)
        for node in _node_records(record):
            place = printable(f"node %{node.get('name')} of {where}")
            target = node.get("target")
            if node.get("op") == "call_function" and isinstance(target, str):
                if allowlist.find_callable(target) is allowlist.MISSING:
                    refuse(target, "function", DisallowedNameError(target, "function"), place)
            for name in _function_values([node.get("args"), node.get("kwargs")]):
                if allowlist.find_callable(name) is allowlist.MISSING:
                    refuse(name, "function", DisallowedNameError(name, "function"), place)
    return list(found.values())


@contextlib.contextmanager
def standing_in(refusals: Iterable[Refusal]) -> Iterator[None]:
    """Within the block, each refused function resolves to a ``RefusedName`` placeholder."""
    placeholders = {r.name: RefusedName(r.name) for r in refusals if r.kind == "function"}
    with allowlist.names_standing_in(placeholders):
        yield


def _node_records(record: dict) -> list[dict]:
    graph = record.get("graph")
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    return [n for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []


def _function_values(value: Any) -> Iterator[str]:
    """The names of ``{"function": name}`` values anywhere in ``value`` (a node's arguments)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if set(item) == {"function"} and isinstance(item["function"], str):
                yield item["function"]
            else:
                stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
