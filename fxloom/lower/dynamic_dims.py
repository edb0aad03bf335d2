"""Dynamic dimensions for ONNX: the extra runs that find them, and the names they get.

``lower`` and ``to_onnx`` take ``dynamic_shapes`` in ``fxloom.export``'s form (a dict by
forward's parameter names of ``{dimension: Dim}``, see ``fxloom.values.symbolic.dynamic_shapes``).
The translator works from concrete runs, not symbols: for each root ``Dim`` the model runs
once more with that Dim at another size (twice the example's, or the Dim's ``max`` when
that is smaller; derived dims such as ``2 * seq`` follow their root). A value that changes
between the runs is computed in the ONNX graph; a dimension that changes is declared
symbolic, named after the ``Dim`` whose run changed it when its sizes in both runs are that
Dim's (or a derived dim's) sizes, and given a name of its own otherwise (``output_0_dim_1``:
a size no input names, such as ``batch * seq`` after a flatten). Doubling rather than adding
one keeps a size computed by division (``seq // 2``) from looking fixed.

``dynamic_batch=True`` stays as sugar: dimension 0 of every tensor input is one Dim,
``batch``, doubled in its run.

Each run is a ``SizeRun``: the inputs at the other size, and the names of the sizes it
changes, keyed by (size in the examples, size in this run)::

    >>> import torch
    >>> from fxloom.export import Dim
    >>> seq = Dim("seq", max=64)
    >>> ids = torch.zeros(2, 5, dtype=torch.long)
    >>> (run,) = size_runs({"ids": ids}, {"ids": {1: seq}})
    >>> tuple(run.inputs["ids"].shape), run.names
    ((2, 10), {(5, 10): 'seq'})

Depends on ``fxloom.export`` (``Dim``, ``resolve_dynamic_shapes``) and ``fxloom.pytree``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fxloom.passes.captured import graph_module_of, lifted_state
from fxloom.pytree import tree_flatten, tree_unflatten
from fxloom.values.symbolic.dims import DerivedDim, Dim, DimHint
from fxloom.values.symbolic.dynamic_shapes import DynamicShapesError, resolve_dynamic_shapes

__all__ = [
    "BATCH",
    "SizeRun",
    "batch_runs",
    "dim_names",
    "input_names",
    "run_failed",
    "runs_for",
    "same_number",
    "size_runs",
]

BATCH = "batch"  # the name dynamic_batch gives dimension 0


@dataclass(frozen=True)
class SizeRun:
    """The examples with one Dim at another size, and the names of the sizes that changed."""

    inputs: Any  # like the examples: a tuple of positional inputs or a dict by name
    names: dict[tuple[int, int], str] = field(default_factory=dict)
    outputs: Any = None  # what a lowered region returned in this run (``lower`` records it)

    @property
    def option(self) -> str:
        """The argument that asked for this run, for messages."""
        return "dynamic_batch" if set(self.names.values()) == {BATCH} else "dynamic_shapes"

    def changed(self) -> str:
        """The sizes this run changes: ``seq 7 -> 14``."""
        return ", ".join(f"{name} {a} -> {b}" for (a, b), name in self.names.items())


def same_number(value: Any, other: Any) -> bool:
    """Whether a number (not a tensor) in a run at other sizes is the example's number."""
    return not isinstance(other, torch.Tensor) and type(other) is type(value) and other == value


def runs_for(
    gm: Any, example_inputs: Any, dynamic_batch: bool, dynamic_shapes: Any
) -> list[SizeRun]:
    """The runs ``translate`` and ``lower`` make for their ``dynamic_*`` arguments."""
    if dynamic_shapes is not None and dynamic_batch:
        raise ValueError(
            "dynamic_batch and dynamic_shapes both given; dynamic_batch is short for "
            "{0: Dim('batch')} on every input: give dynamic_shapes only"
        )
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if dynamic_batch:
        return batch_runs(example_inputs)
    if dynamic_shapes is None:
        return []
    return size_runs(example_inputs, dynamic_shapes, input_names(gm))


def input_names(gm: Any) -> list[str]:
    """The names of a graph's user inputs, in order (its placeholders, lifted state left out)."""
    lifted = lifted_state(gm)
    return [
        str(node.target).lstrip("*")
        for node in graph_module_of(gm).graph.find_nodes(op="placeholder")
        if node.name not in lifted
    ]


def run_failed(run: SizeRun, error: Exception, what: str = "the model") -> str:
    """The message for a model (or graph) that fails at a run's sizes."""
    sizes = "dimension 0 of every input doubled" if run.option == "dynamic_batch" else run.changed()
    return (
        f"{run.option}: {what} does not run with {sizes} ({type(error).__name__}: {error}); "
        "say which dimensions vary with dynamic_shapes (dimension 0 of every input must be "
        "the batch for dynamic_batch), or give the Dim a max the model accepts"
    )


def size_runs(
    example_inputs: tuple | dict[str, Any], dynamic_shapes: Any, names: Sequence[str] = ()
) -> list[SizeRun]:
    """One ``SizeRun`` per root Dim of ``dynamic_shapes``.

    ``example_inputs`` is a dict by parameter name, or a tuple whose parameters ``names``
    gives in order (``dynamic_shapes`` may then also be a tuple, one entry per input).
    """
    if isinstance(example_inputs, dict):
        names, values = list(example_inputs), list(example_inputs.values())
    else:
        names, values = list(names)[: len(example_inputs)], list(example_inputs)
    leaf_specs = resolve_dynamic_shapes(names, values, dynamic_shapes)
    flat = [tree_flatten(value) for value in values]
    leaves = [leaf for value_leaves, _ in flat for leaf in value_leaves]
    roots = _roots(leaves, leaf_specs)
    runs = []
    for root, example in roots.items():
        other = _other_size(root, example)
        resized = [
            _resized(leaf, {d: _size(s, other) for d, s in specs.items() if _root(s) is root})
            for leaf, specs in zip(leaves, leaf_specs)
        ]
        names_by_size = {
            (_size(spec, example), _size(spec, other)): _name(spec)
            for specs in leaf_specs
            for spec in specs.values()
            if _root(spec) is root
        }
        rebuilt = _rebuilt(resized, flat, names)
        inputs = rebuilt if isinstance(example_inputs, dict) else tuple(rebuilt.values())
        runs.append(SizeRun(inputs, names_by_size))
    return runs


def batch_runs(example_inputs: Any) -> list[SizeRun]:
    """``dynamic_batch``'s one run: dimension 0 of every tensor input doubled."""
    leaves, spec = tree_flatten(example_inputs)
    resized = [
        _resized(leaf, {0: 2 * leaf.shape[0]}) if _batched(leaf) else leaf for leaf in leaves
    ]
    sizes = {(leaf.shape[0], 2 * leaf.shape[0]): BATCH for leaf in leaves if _batched(leaf)}
    return [SizeRun(tree_unflatten(resized, spec), sizes)]


def dim_names(
    shape: Sequence[int],
    others: Sequence[Sequence[int] | None],
    runs: Sequence[SizeRun],
    fresh: str,
) -> list[Any]:
    """``shape`` with each dimension that changed in a run replaced by its name.

    ``others[i]`` is the shape in ``runs[i]`` (None: not seen there). A dimension changed
    by one run whose sizes that run names takes that name; one changed otherwise (by several
    runs, or to sizes no input has) is ``{fresh}_dim_{index}``.
    """
    result: list[Any] = list(shape)
    for index, size in enumerate(shape):
        changed = [
            i
            for i, other in enumerate(others)
            if other is not None and _differs(other, index, size)
        ]
        if not changed:
            continue
        named = runs[changed[0]].names.get((size, others[changed[0]][index]))
        result[index] = named if len(changed) == 1 and named else f"{fresh}_dim_{index}"
    return result


# ---------------------------------------------------------------- steps
def _differs(other: Sequence[int], index: int, size: int) -> bool:
    return len(other) > index and other[index] != size


def _batched(leaf: Any) -> bool:
    return isinstance(leaf, torch.Tensor) and leaf.dim() > 0


def _root(spec: Dim | DimHint) -> Any:
    """The Dim a spec moves with: a derived dim's root; a hint is a size of its own."""
    return spec.root if isinstance(spec, DerivedDim) else spec


def _size(spec: Dim | DimHint, root_value: int) -> int:
    return spec.of(root_value) if isinstance(spec, DerivedDim) else root_value


def _name(spec: Dim | DimHint) -> str:
    return spec.__name__ if isinstance(spec, Dim) else f"dynamic_{id(spec):x}"


def _roots(leaves: list[Any], leaf_specs: list[dict[int, Any]]) -> dict[Any, int]:
    """Each root Dim (or hint) and its value in the examples, in the order first met."""
    roots: dict[Any, int] = {}
    for leaf, specs in zip(leaves, leaf_specs):
        for index, spec in specs.items():
            size = leaf.shape[index]
            value = spec.root_value(size) if isinstance(spec, DerivedDim) else size
            roots.setdefault(_root(spec), value)
    return roots


def _other_size(root: Dim | DimHint, example: int) -> int:
    """Twice the example, within the root's range; below it when the range ends there."""
    low = max(root.min or 0, 2)
    high = root.max
    if high is None or 2 * example <= high:
        return 2 * example
    if high > example:
        return high
    if example - 1 >= low:
        return example - 1
    raise DynamicShapesError(
        f"{root!r} can take no size but the example's ({example}); widen its range, or leave "
        "that dimension static"
    )


def _resized(leaf: Any, sizes: dict[int, int]) -> Any:
    """``leaf`` with dimension ``d`` of size ``sizes[d]``: its entries repeated cyclically."""
    for index, size in sizes.items():
        positions = torch.arange(size, device=leaf.device) % leaf.shape[index]
        leaf = leaf.index_select(index, positions)
    return leaf


def _rebuilt(resized: list[Any], flat: list[tuple[list, Any]], names: list[str]) -> dict:
    """The resized leaves put back into each input's structure, by name."""
    rebuilt, start = {}, 0
    for name, (value_leaves, spec) in zip(names, flat):
        rebuilt[name] = tree_unflatten(resized[start : start + len(value_leaves)], spec)
        start += len(value_leaves)
    return rebuilt
