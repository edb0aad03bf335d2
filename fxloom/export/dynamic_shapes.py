"""TEMPORARY minimal resolution (replaced by the dims branch on merge)."""

from __future__ import annotations

from typing import Any

from fxloom import pytree


def resolve_dynamic_shapes(names: list[str], values: list[Any], dynamic_shapes: Any) -> list[dict]:
    result = []
    if isinstance(dynamic_shapes, (tuple, list)):
        dynamic_shapes = dict(zip(names, dynamic_shapes))
    dynamic_shapes = dynamic_shapes or {}
    for name, value in zip(names, values):
        leaves, spec = pytree.tree_flatten(value)
        entry = dynamic_shapes.get(name)
        if spec.is_leaf():
            result.append({k: v for k, v in (entry or {}).items() if v is not None})
        else:
            entries = pytree.tree_flatten(entry)[0] if entry else [None] * len(leaves)
            result.extend({k: v for k, v in (e or {}).items() if v is not None} for e in entries)
    return result
