"""``resolve_dynamic_shapes``: a ``dynamic_shapes`` argument (torch.export's) matched to the inputs and checked.

``dynamic_shapes`` takes torch.export's forms: a dict keyed by forward's
parameter names (those left out are static) or a tuple with one entry per
parameter; each entry nested like its input (tuples, lists, dicts, named
tuples, dataclasses; a registered class may be given as the list of its
children) down to each tensor, whose entry is None (static), a dict
``{dimension: spec}`` (negative dimensions count from the end) or a list with
one spec per dimension. A spec is a ``Dim``, a derived dim (``2 * seq``), a
hint (``Dim.AUTO``/``STATIC``/``DYNAMIC``), an int (the example's size) or None.

The result has one dict ``{dimension: Dim | DerivedDim | DimHint}`` per leaf
of the inputs, in the order export lifts them (``fxloom.pytree.tree_flatten``
of each parameter's value), with the static dimensions left out::

    >>> import torch
    >>> from fxloom.export import Dim
    >>> batch = Dim("batch", max=64)
    >>> resolve_dynamic_shapes(
    ...     ["x", "pair"],
    ...     [torch.ones(4, 3), (torch.ones(4), 2.0)],
    ...     {"x": {0: batch, 1: None}, "pair": ((batch,), None)},
    ... )
    [{0: Dim('batch', max=64)}, {0: Dim('batch', max=64)}, {}]

Every mistake is a ``DynamicShapesError`` naming the input (``input 'pair[0]'``),
the dimension and what to do: an unknown name, a structure unlike the input's,
a dimension the tensor lacks, a spec on a value that is not a tensor, an example
size outside a Dim's range or of 0 or 1 (operators special-case those), a Dim
whose examples disagree, a derived dim its example does not fit, two different
Dims of one name. Two ``Dim`` objects with the same name and range are one Dim
(as in torch.export); the result holds the first. ``symbol_range`` gives the
range the symbol of a dynamic dimension takes.

Depends on ``fxloom.pytree`` and ``dims``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fxloom import pytree
from fxloom.values.symbolic.dims import DerivedDim, Dim, DimHint

__all__ = ["DynamicShapesError", "batch_dims", "resolve_dynamic_shapes", "symbol_range"]

Spec = Dim | DimHint  # a DerivedDim is a Dim
_SPEC_KINDS = "None, an int, a Dim, a derived Dim (2 * d), Dim.AUTO, Dim.STATIC or Dim.DYNAMIC"
_SMALL_SIZES = (
    "sizes 0 and 1 are special-cased by operators (broadcasting, empty tensors), so an example "
    "of that size cannot stand for the others"
)


class DynamicShapesError(ValueError):
    """``dynamic_shapes`` does not fit the inputs or their examples; the message says where."""


@dataclass(slots=True)
class _Use:
    """One dimension the user made dynamic: where, the example's size, and the spec."""

    where: str  # the input's path, e.g. 'inputs["ids"]'
    index: int
    size: int
    spec: Spec
    leaf: dict[int, Spec]  # the result's entry for this tensor, filled in once checked

    def __str__(self) -> str:
        return f"dimension {self.index} of input {self.where!r}"


def resolve_dynamic_shapes(
    names: list[str], values: list[Any], dynamic_shapes: Any
) -> list[dict[int, Spec]]:
    """One ``{dimension: spec}`` per input leaf; see the module docstring."""
    leaves: list[dict[int, Spec]] = []
    uses: list[_Use] = []
    for name, value, entry in zip(names, values, _entries_by_name(names, values, dynamic_shapes)):
        _match(value, entry, name, leaves, uses)
    _Examples().check(uses)
    return [dict(sorted(leaf.items())) for leaf in leaves]


def symbol_range(spec: Spec) -> tuple[int, int | None]:
    """The inclusive range of the symbol a dynamic dimension gets: ``(min, max or None)``.

    The spec's range with sizes 0 and 1 left out (the example had none of them, and a
    program traced on a larger size may not hold for them); a derived dim's symbol is
    its root's::

        >>> symbol_range(Dim("batch", max=64)), symbol_range(2 * Dim("seq", min=8))
        ((2, 64), (8, None))
    """
    if isinstance(spec, DerivedDim):
        spec = spec.root
    low = spec.min or 0
    return max(low, 2), spec.max


# ---------------------------------------------------------------- structure


def _entries_by_name(names: list[str], values: list[Any], dynamic_shapes: Any) -> list[Any]:
    if dynamic_shapes is None:
        return [None] * len(names)
    if isinstance(dynamic_shapes, dict):
        unknown = [key for key in dynamic_shapes if key not in names]
        if unknown:
            raise DynamicShapesError(_unknown_names(unknown, names, values))
        return [dynamic_shapes.get(name) for name in names]
    if isinstance(dynamic_shapes, (tuple, list)):
        if len(dynamic_shapes) > len(names):
            raise DynamicShapesError(
                f"dynamic_shapes has {len(dynamic_shapes)} entries, but forward takes "
                f"{len(names)} inputs ({_listed(names)}); give one entry per input, in order"
            )
        return [*dynamic_shapes, *[None] * (len(names) - len(dynamic_shapes))]
    raise DynamicShapesError(
        f"dynamic_shapes must be None, a dict keyed by forward's parameter names, or a tuple "
        f"with one entry per input; got a {type(dynamic_shapes).__name__}"
    )


def _unknown_names(unknown: list[Any], names: list[str], values: list[Any]) -> str:
    message = (
        f"dynamic_shapes names {_listed(unknown)}, which forward does not take (its inputs are "
        f"{_listed(names)}); key dynamic_shapes by forward's parameter names"
    )
    if len(names) == 1 and isinstance(values[0], dict):
        message += f", e.g. {{{names[0]!r}: {{...}}}} for the dict input {names[0]!r}"
    return message


def _match(value: Any, entry: Any, where: str, leaves: list, uses: list[_Use]) -> None:
    """Walk ``value`` as ``fxloom.pytree`` flattens it, ``entry`` alongside, recording leaves."""
    container = pytree.container_type(type(value))
    if value is None:  # an input left None is fixed, not lifted (export's ``none_is_leaf``)
        _leaf_dims(value, entry, where, uses)  # refuses a dynamic entry for it all the same
        return
    if container is None:
        leaves.append(_leaf_dims(value, entry, where, uses))
        return
    children, context = container.flatten(value)
    for child, (child_entry, child_where) in zip(
        children, _child_entries(container, value, children, context, entry, where)
    ):
        _match(child, child_entry, child_where, leaves, uses)


def _child_entries(
    container: pytree.ContainerType,
    value: Any,
    children: Any,
    context: Any,
    entry: Any,
    where: str,
) -> list[tuple[Any, str]]:
    if container.kind == "dict":
        paths = [f"{where}[{_key_text(key)}]" for key in context]
        if entry is None:
            return [(None, path) for path in paths]
        if not isinstance(entry, dict):
            raise _mismatch(value, entry, where, f"a dict with keys {list(context)}")
        unknown = [key for key in entry if key not in context]
        if unknown:
            raise DynamicShapesError(
                f"input {where!r} has no key {unknown[0]!r} (its keys are {list(context)}), "
                "but dynamic_shapes gives one; nest the entry like the input"
            )
        return [(entry.get(key), path) for key, path in zip(context, paths)]
    fields = getattr(type(value), "_fields", None) or (
        context if container.kind == "dataclass" else None
    )
    paths = [
        f"{where}.{fields[index]}" if fields else f"{where}[{index}]"
        for index in range(len(children))
    ]
    if entry is None:
        return [(None, path) for path in paths]
    if type(entry) is type(value) and not isinstance(entry, (tuple, list)):
        entry = container.flatten(entry)[0]  # a dataclass of specs, like the input
    if not isinstance(entry, (tuple, list)) or len(entry) != len(children):
        raise _mismatch(value, entry, where, f"a tuple or list of {len(children)} entries")
    return list(zip(entry, paths))


def _key_text(key: Any) -> str:
    return json.dumps(key) if isinstance(key, str) else repr(key)


def _mismatch(value: Any, entry: Any, where: str, expected: str) -> DynamicShapesError:
    return DynamicShapesError(
        f"input {where!r} is a {_describe(value)}, but its dynamic_shapes entry is {entry!r}; "
        f"nest the entry like the input: {expected} (None for a static part)"
    )


def _describe(value: Any) -> str:
    try:
        return f"{type(value).__name__} of {len(value)}"
    except TypeError:
        return type(value).__name__


# ---------------------------------------------------------------- one leaf


def _leaf_dims(value: Any, entry: Any, where: str, uses: list[_Use]) -> dict[int, Spec]:
    """``{dimension: spec}`` of a tensor's entry (ints and None dropped); records the uses."""
    if not isinstance(value, torch.Tensor):
        if entry is not None and not _is_static(entry):
            raise DynamicShapesError(
                f"input {where!r}: dynamic_shapes gives {entry!r} for a "
                f"{type(value).__name__}, but only tensor dimensions can be dynamic (export "
                "fixes other inputs to the example's value); give None here"
            )
        return {}
    shape = tuple(value.shape)
    dims: dict[int, Spec] = {}
    for index, spec in _indexed(entry, shape, where):
        spec = _checked_spec(spec, shape[index], where, index)
        if spec is not None:
            uses.append(_Use(where, index, shape[index], spec, dims))
    return dims


def _indexed(entry: Any, shape: tuple[int, ...], where: str) -> list[tuple[int, Any]]:
    rank = len(shape)
    if entry is None:
        return []
    if isinstance(entry, (tuple, list)):
        if len(entry) != rank:
            raise DynamicShapesError(
                f"input {where!r}: dynamic_shapes gives {len(entry)} entries, but the example "
                f"has {rank} dimensions (shape {list(shape)}); give one entry per dimension "
                "(None for a static one), or a dict {dimension: Dim}"
            )
        return list(enumerate(entry))
    if isinstance(entry, dict):
        indexed: dict[int, Any] = {}
        for index, spec in entry.items():
            if type(index) is not int or not -rank <= index < rank:
                raise DynamicShapesError(
                    f"input {where!r}: dynamic_shapes names dimension {index!r}, but the "
                    f"example has {rank} dimensions (shape {list(shape)}); use an index in "
                    f"[{-rank}, {rank - 1}]"
                )
            if index % rank in indexed:
                raise DynamicShapesError(
                    f"input {where!r}: dynamic_shapes gives dimension {index % rank} twice "
                    f"(as {index % rank} and {index % rank - rank}); give it once"
                )
            indexed[index % rank] = spec
        return list(indexed.items())
    raise DynamicShapesError(
        f"input {where!r}: dynamic_shapes gives {entry!r} for a tensor; give a dict "
        "{dimension: Dim} (e.g. {0: batch}) or a list with one entry per dimension"
    )


def _checked_spec(spec: Any, size: int, where: str, index: int) -> Spec | None:
    """The spec if the dimension may be dynamic; None for a static one (checked against the example)."""
    if spec is None or _is_static(spec):
        return None
    if isinstance(spec, (Dim, DimHint)):
        return spec
    if type(spec) is int:
        if spec != size:
            raise DynamicShapesError(
                f"input {where!r}: dynamic_shapes fixes dimension {index} to {spec}, but it is "
                f"{size} in the example; pass an example of that size, or drop the {spec}"
            )
        return None
    raise DynamicShapesError(
        f"input {where!r}: dynamic_shapes gives {spec!r} for dimension {index}; each "
        f"dimension's entry is {_SPEC_KINDS}"
    )


def _is_static(spec: Any) -> bool:
    return isinstance(spec, DimHint) and spec.kind == "STATIC"


# ---------------------------------------------------------------- the examples


class _Examples:
    """Checks the uses against the examples' sizes; learns each root Dim's value on the way."""

    def __init__(self) -> None:
        self.by_name: dict[str, Dim] = {}  # the first Dim of each name: the one kept
        self.values: dict[int, tuple[int, _Use]] = {}  # id(root) -> (value, where it came from)

    def check(self, uses: list[_Use]) -> None:
        """Put each use's spec in its leaf's dict (a Dim of an earlier one's name and range
        replaced by that one), or leave it out when export keeps the dimension static."""
        # Roots first, so a derived dim's error can say where its root's value came from.
        for use in sorted(uses, key=lambda use: isinstance(use.spec, DerivedDim)):
            if isinstance(use.spec, DimHint):
                kept = self._hint(use, use.spec)
            elif isinstance(use.spec, DerivedDim):
                kept = self._derived(use, use.spec)
            else:
                kept = self._root(use, use.spec)
            if kept is not None:
                use.leaf[use.index] = kept

    def _hint(self, use: _Use, hint: DimHint) -> DimHint | None:
        if hint.kind == "AUTO" and use.size < 2:
            return None  # export keeps it static, as torch.export does
        if hint.kind == "DYNAMIC" and use.size < 2:
            raise DynamicShapesError(_small_size(use, "Dim.DYNAMIC"))
        low = 0 if hint.min is None else hint.min
        if not low <= use.size <= (use.size if hint.max is None else hint.max):
            raise DynamicShapesError(_outside(use, low, hint.max, repr(hint), "widen it"))
        return hint

    def _root(self, use: _Use, dim: Dim) -> Dim:
        dim = self._canonical(dim)
        if use.size < 2:
            raise DynamicShapesError(_small_size(use, f"Dim {dim.__name__!r}"))
        if not _in_range(use.size, dim):
            raise DynamicShapesError(
                _outside(
                    use,
                    dim.min,
                    dim.max,
                    f"Dim {dim.__name__!r}",
                    "declare the Dim's range to include it",
                )
            )
        seen = self.values.setdefault(id(dim), (use.size, use))
        if seen[0] != use.size:
            first = seen[1]
            raise DynamicShapesError(
                f"Dim {dim.__name__!r} is {first} ({first.size} in the example) and {use} "
                f"({use.size} in the example); one Dim is one size, so the examples must "
                "agree: pass examples where these dimensions are equal, or use two Dims"
            )
        return dim

    def _derived(self, use: _Use, derived: DerivedDim) -> DerivedDim:
        root = self._canonical(derived.root)
        if root is not derived.root:
            derived = DerivedDim(root, derived.coefficient, derived.offset)
        declared = (
            f"input {use.where!r}: dimension {use.index} is {use.size} in the example, "
            f"declared {derived.__name__}"
        )
        name = root.__name__
        seen = self.values.get(id(root))
        if seen is not None and derived.of(seen[0]) != use.size:
            root_value, source = seen
            raise DynamicShapesError(
                f"{declared}, but {name} is {root_value} ({source}), which makes it "
                f"{derived.of(root_value)}; pass examples that keep this relation"
            )
        value = derived.root_value(use.size)
        if value is None:
            raise DynamicShapesError(
                f"{declared}, which no integer {name} gives; pass an example of that form"
            )
        if value < 2 or not _in_range(value, root):
            reason = _SMALL_SIZES if value < 2 else "outside its range"
            raise DynamicShapesError(
                f"{declared}, which makes {name} = {value}, but Dim {name!r} has the range "
                f"{_range_text(root.min, root.max)} ({reason}); pass an example where {name} "
                "lies in that range and is at least 2"
            )
        self.values.setdefault(id(root), (value, use))
        return derived

    def _canonical(self, dim: Dim) -> Dim:
        first = self.by_name.setdefault(dim.__name__, dim)
        if first is not dim and (first.min, first.max) != (dim.min, dim.max):
            raise DynamicShapesError(
                f"two different Dims are named {dim.__name__!r}: {first!r} and {dim!r}; use "
                "one Dim object for dimensions that are equal, or give them different names"
            )
        return first


def _small_size(use: _Use, what: str) -> str:
    return (
        f"input {use.where!r}: dimension {use.index} is {use.size} in the example, but {what} "
        f"makes it dynamic: {_SMALL_SIZES}; pass an example with this dimension of size 2 or "
        "more, or use Dim.AUTO to let export keep it static"
    )


def _in_range(value: int, dim: Dim) -> bool:
    return dim.min <= value and (dim.max is None or value <= dim.max)


def _outside(use: Any, low: int, high: int | None, what: str, fix: str) -> str:
    return (
        f"input {use.where!r}: dimension {use.index} is {use.size} in the example, outside "
        f"the range {_range_text(low, high)} of {what}; pass an example inside the range, or {fix}"
    )


def _range_text(low: int, high: int | None) -> str:
    return f"[{low}, {'inf' if high is None else high}]"


def _listed(names: list[Any]) -> str:
    return ", ".join(repr(name) for name in names)


def batch_dims(values: Mapping[str, Any], dim: Callable[[str], Any] = Dim) -> dict[str, Any]:
    """``dynamic_shapes`` making dimension 0 of every batched input one ``dim("batch")``: an
    input is batched if its dimension 0 has the first tensor's size (a shared mask is not);
    other values stay static. ``dim`` builds the Dim (torch.export's, to compare)::

        >>> import torch
        >>> batch_dims({"x": torch.ones(4, 3), "mask": torch.ones(7, 7), "flag": True})
        {'x': {0: Dim('batch')}, 'mask': None, 'flag': None}
    """
    tensors = [v for v in values.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    if not tensors:
        raise ValueError("batch_dims: the inputs hold no tensor with a batch dimension")
    size, batch = tensors[0].shape[0], dim("batch")
    return {
        name: {0: batch}
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size
        else None
        for name, value in values.items()
    }
