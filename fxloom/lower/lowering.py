"""``lower``: run the parts of a model a backend supports in that backend, the rest in PyTorch.

The torch.fx paper's lowering with automatic splitting (section 6.4). The backend
(``fxloom.backends``) is ONNX Runtime unless another is named; each step asks it what
it supports and how to compile. In steps:

1. take the module to lower (``fxloom.passes.captured.module_to_transform``: a plain module
   traced on the example inputs, a GraphModule as it is, an exported program as
   ``ep.module()``) and give its nodes shapes, which backends read (from the values
   export recorded, else by ``ShapeProp`` on the examples);
2. ask the backend about every operator (``Backend.unsupported_reason``; for ONNX Runtime,
   the translator's) and gather the supported ones into regions
   (``fxloom.passes.split_by_support``); unsupported operators
   stay in the parent, which runs them in PyTorch between the regions, and so do the
   run-time checks (``fxloom.ops.runtime_functions.stays_on_host``: tracing's guards,
   export's input checks), which keep refusing the inputs the module refuses;
3. run the split module once on the examples, recording what each region receives and
   returns;
4. compile each region on those inputs (``Backend.compile_region``) and put the module it
   returns in its place. ONNX Runtime (``fxloom.lower.onnxruntime_backend``) translates the
   region to ONNX, checks it (``onnx.checker``), starts its session, runs it once, and
   returns an ``OrtModule``.

Which regions are lowered. A region the backend finds not worth compiling stays in PyTorch
(``Backend.not_worth_compiling``; ONNX Runtime leaves a region that does no arithmetic, 0
FLOPs by ``fxloom.passes.cost``: a lone reshape, a getitem, a cat). A region whose
compilation fails (for ONNX Runtime: translation, check, session or trial run) also stays in
PyTorch; the report says why. With ``dynamic_shapes`` (or ``dynamic_batch``) the model runs
once more per dynamic ``Dim`` at another size; each region is translated with the sizes it
saw in those runs, so its dynamic dimensions are symbolic, and a region fed a number that
changes with them (a size passed from PyTorch) stays in PyTorch, so the lowered module runs
at any size (a number a region returns that changes with them is computed in ONNX and
returned to PyTorch as a number). A model may thus end up with nothing lowered: that is reported, not raised.

``check=True`` runs the eager model and the lowered one on the examples and records the
largest absolute and relative errors in the report; outputs further apart than
``torch.allclose(lowered, eager, rtol, atol)`` allows raise ``LoweringError`` (the defaults
1e-3 and 1e-4 leave room for ONNX Runtime's own kernels and fusions in float32).

The user's module is never modified: the result is a new GraphModule (sharing the
parameters of the regions left in PyTorch), and on any error nothing was changed. (A
GraphModule given to ``lower`` gets the ``tensor_meta`` of its nodes recorded, as
``ShapeProp`` does; its graph and code stay as they are.) The result keeps the calling
convention of the module lowered: it takes and returns the same structures (an exported
model's ``ModelOutput``, a dict) and refuses the same inputs with the same errors.

Depends on: ``fxloom.passes`` (captured, shape_prop, split_by_support),
``fxloom.backends`` (the backend asked at every step).
"""

from __future__ import annotations

import dataclasses
import operator
import time
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fxloom._format import describe_target
from fxloom.backends import Backend, RegionExamples, UntranslatableNodesError, get_backend
from fxloom.export.program import ExportedProgram
from fxloom.graph_module import GraphModule
from fxloom.lower.dynamic_dims import SizeRun, run_failed, runs_for, same_number
from fxloom.lower.report import CheckResult, LeftNode, LoweringReport, RegionReport
from fxloom.node import Node
from fxloom.ops.runtime_functions import stays_on_host
from fxloom.passes.captured import call_inputs, model_name, module_to_transform
from fxloom.pytree import tree_flatten
from fxloom.source_location import source_location

__all__ = ["LoweringError", "LoweringWarning", "lower", "too_little_lowered"]

REGION_PREFIX = "_run_on_acc_"


class LoweringError(RuntimeError):
    """``lower`` could not produce a module equal to the eager one; the message says why."""


def lower(
    model_or_gm: nn.Module | Callable[..., Any],
    example_inputs: tuple[Any, ...] | dict[str, Any],
    *,
    backend: str | Backend = "onnxruntime",
    check: bool = False,
    dynamic_batch: bool = False,
    dynamic_shapes: Any = None,
    threads: int | None = None,
    spinning: bool | None = None,
    concrete_args: dict[str, Any] | None = None,
    rtol: float = 1e-3,
    atol: float = 1e-4,
    min_lowered: float = 0.0,
    size_runs: list[SizeRun] | None = None,
) -> GraphModule:
    """Lower the supported regions of a model to a backend (see the module docstring).

    A causal language model of Hugging Face ``transformers`` with its cache on (the default)
    is lowered with its key/value cache by ``fxloom.lower.decoder.lower_decoder``: the result
    is then a ``LoweredDecoder``, a drop-in forward for ``model.generate``.

    Args:
        model_or_gm: a module or function, traced here on ``example_inputs``, a
            GraphModule, or an ``fxloom.export`` program (lowered as ``ep.module()``).
        example_inputs: a tuple of positional inputs or a dict by name.
        backend: a backend's name in ``fxloom.backends.BACKENDS`` (``"onnxruntime"``,
            ``"eager"``, or one registered with ``register_backend``) or a ``Backend``.
        check: compare with eager PyTorch on the examples; raise past ``rtol``/``atol``.
        dynamic_batch: short for dimension 0 of every tensor input dynamic, one Dim
            named ``batch``.
        dynamic_shapes: which input dimensions may vary, in ``fxloom.export``'s form: a
            dict by forward's parameter names of ``{dimension: Dim}``
            (``{"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}``).
            The model runs once more per Dim at another size (``fxloom.lower.dynamic_dims``);
            each region's inputs and outputs get those dimensions symbolic.
        threads: ONNX Runtime's threads per operator (other backends may read it too:
            ``Backend.lowering_settings``). By default the settings follow where
            the work runs. When one region covers the whole model, its session gets ONNX
            Runtime's own defaults (one thread per physical core, worker threads spinning
            between calls), as torch.onnx + ONNX Runtime has them. When PyTorch runs
            operators between regions, spinning is off and the sessions take
            ``torch.get_num_threads()`` threads, so ONNX Runtime's idle workers do not take
            the cores PyTorch needs. The report's notes say which was chosen.
        min_lowered: the share of operators (0 to 1) below which ``lower`` warns
            (``LoweringWarning``, naming the regions and operators left and why); a model of
            which no operator lowered always warns. ``fxloom lower`` exits 1 there.
        spinning: whether ONNX Runtime's worker threads spin between calls; None decides as
            ``threads`` describes (on when one region covers the model). A benchmark that
            interleaves the lowered model with other work may want it off.
        concrete_args: parameters fixed while tracing a plain module (``{"use_cache": False}``).
        size_runs: the runs at other sizes given directly (``fxloom.lower.dynamic_dims.SizeRun``)
            instead of ``dynamic_shapes``: a decoder's attention mask is as long as its past
            and its new tokens together, a size no one ``Dim`` describes.

    Returns:
        A GraphModule calling the backend's module (an ``OrtModule`` for ONNX Runtime) per
        lowered region, with
        ``lowering_report`` (a ``LoweringReport``) attached.

    Example::

        >>> import torch, fxloom
        >>> from fxloom.lower.lowering import lower
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()).eval()
        >>> lowered = lower(model, (torch.randn(2, 4),), check=True)
        >>> print(lowered.lowering_report.summary()[:62])
        Sequential: 1 of 1 region in onnxruntime, 2 of 2 operators low
        >>> x = torch.randn(2, 4)
        >>> torch.allclose(lowered(x), model(x), atol=1e-6)
        True
    """
    from fxloom.lower.decoder import is_causal_lm, lower_decoder

    if is_causal_lm(model_or_gm, concrete_args):
        return lower_decoder(
            model_or_gm,
            example_inputs,
            backend=backend,
            threads=threads,
            check=check,
            min_lowered=min_lowered,
        )
    backend = get_backend(backend)
    backend.require()
    from fxloom.passes.split_by_support import split_by_support

    inputs = call_inputs(example_inputs, "lower")
    gm = module_to_transform(
        model_or_gm, example_inputs, consumer="fxloom.lower", concrete_args=concrete_args
    )
    _propagate_shapes(gm, inputs)
    if size_runs is None:
        size_runs = runs_for(gm, example_inputs, dynamic_batch, dynamic_shapes)
    runs = size_runs
    support = _Support(gm, backend.unsupported_reason)
    for _ in range(MAX_SPLIT_ROUNDS):
        split, _ = split_by_support(gm, support, prefix=REGION_PREFIX)  # keeps gm's convention
        _drop_unused_regions(split)
        seen = _record_regions(split, inputs)
        region_runs, fixed = _regions_at_sizes(split, seen, runs)
        settings, setting_note = backend.lowering_settings(
            whole_model=_one_region_covers(split), threads=threads, spinning=spinning
        )
        examples = {
            name: RegionExamples(name, args, outputs, tuple(region_runs[name]), settings)
            for name, (args, outputs) in seen.items()
        }
        lowered = [
            _lower_region(backend, split, examples[name], fixed.get(name))
            for name in _region_names(split)
            if name in examples  # a region never run on the examples (dead code) stays as it is
        ]
        regions = [region for region, _ in lowered]
        # A node the backend accepted but could not translate: split the region around it
        # (it runs in PyTorch, reported with the translator's reason), not the whole region.
        untranslatable = {name: reason for _, failed in lowered for name, reason in failed}
        if not support.refuse(untranslatable):
            break
    left = tuple(_left_node(node, reason) for node, reason in support.reasons.items())
    guards = len(support.guards)
    notes = (f"{guards} run-time check(s) (guards, input checks) run in PyTorch",) if guards else ()
    if setting_note is not None and any(region.lowered for region in regions):
        notes += (setting_note,)
    report = LoweringReport(model_name(gm), backend.name, tuple(regions), left, notes=notes)
    if check:
        eager = gm if isinstance(model_or_gm, ExportedProgram) else model_or_gm  # runs as given
        report = _checked(eager, split, inputs, report, concrete_args, rtol, atol)
    split.lowering_report = report
    too_little = too_little_lowered(report, min_lowered)
    if too_little is not None:
        warnings.warn(too_little, LoweringWarning, stacklevel=2)
    return split


class LoweringWarning(UserWarning):
    """``lower`` ran less of the model in the backend than asked (``min_lowered``), or none."""


def too_little_lowered(report: LoweringReport, min_lowered: float = 0.0) -> str | None:
    """Why ``report`` lowered too little: none of its operators, or a share below
    ``min_lowered``; None when enough ran in the backend."""
    total = report.nodes_lowered + report.nodes_in_pytorch
    if total == 0:
        return None
    share = report.nodes_lowered / total
    if report.nodes_lowered and share >= min_lowered:
        return None
    reasons = [f"{region.name}: {region.reason}" for region in report.regions if not region.lowered]
    reasons += [f"%{left.name} ({left.op}): {left.reason}" for left in report.left[:3]]
    more = len(report.left) - 3
    listed = "; ".join(reasons) + (f"; and {more} more operators" if more > 0 else "")
    return (
        f"{report.model}: {report.nodes_lowered} of {total} operators lowered to "
        f"{report.backend} ({share:.0%}, below the {min_lowered:.0%} asked)"
        if report.nodes_lowered
        else f"{report.model}: no operator lowered to {report.backend}"
    ) + f": {listed or 'see the report'}"


_ENDS = ("placeholder", "output")
# How many times a model is split again around nodes the translator refused (each round
# moves at least one node to PyTorch; a model needing more keeps its last regions' reports).
MAX_SPLIT_ROUNDS = 8


def _drop_unused_regions(split: GraphModule) -> None:
    """Regions whose results nothing reads (what fed only a guard that folded away) go: a
    call into them would cost time and compute nothing the program returns."""
    for node in reversed(list(split.graph.find_nodes(op="call_module"))):
        if not node.users and node.target.startswith(REGION_PREFIX):
            region = split.get_submodule(node.target)
            if not any(n.is_impure() for n in region.graph.nodes if n.op not in _ENDS):
                split.graph.erase_node(node)
                split.delete_submodule(node.target)
    split.recompile()


# ---------------------------------------------------------------- capture
def _call(module: Callable[..., Any], inputs: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
    args, kwargs = inputs
    with torch.no_grad():
        return module(*args, **kwargs)


def _propagate_shapes(gm: GraphModule, inputs: tuple[tuple, dict]) -> None:
    """Shapes and dtypes for the backend: the ones export recorded, else from a run (a
    traced module has none recorded, and an exported one with dynamic sizes has only
    symbolic ones, which say nothing about the examples)."""
    from fxloom.passes.shape_prop import ShapeProp, record_captured_shapes

    if record_captured_shapes(gm.graph):
        return
    args, kwargs = inputs
    with torch.no_grad():
        ShapeProp(gm).propagate(*args, **kwargs)


# ---------------------------------------------------------------- support
class _Support:
    """``split_by_support``'s question, asked of the backend; keeps its reasons."""

    def __init__(self, gm: GraphModule, unsupported_reason: Callable[..., str | None]) -> None:
        self.gm = gm
        self.unsupported_reason = unsupported_reason
        self.reasons: dict[Node, str] = {}  # unsupported operators, in graph order
        self.guards: list[Node] = []
        self.untranslatable: dict[
            str, str
        ] = {}  # node name -> why the backend's translator refused it
        self._by_name = {node.name: node for node in gm.graph.nodes}

    def refuse(self, untranslatable: dict[str, str]) -> bool:
        """Mark the nodes named in ``untranslatable`` (name -> the translator's reason)
        unsupported, for the next split; whether any was new."""
        new = {
            name: reason
            for name, reason in untranslatable.items()
            if name in self._by_name and self._by_name[name] not in self.reasons
        }
        self.untranslatable.update(new)
        return bool(new)

    def __call__(self, node: Node) -> bool:
        if node.op == "call_function" and stays_on_host(node.target):
            if node not in self.guards:
                self.guards.append(node)  # a run-time check: cheap, kept a check, before regions
            return False
        if node.name in self.untranslatable:
            self.reasons[node] = f"translation failed: {self.untranslatable[node.name]}"
            return False
        try:
            reason = self.unsupported_reason(node, self.gm)
        except Exception as error:  # the backend cannot tell: PyTorch runs it, reported
            reason = f"the backend could not judge it ({type(error).__name__}: {error})"
        if reason is not None:
            self.reasons[node] = reason
        return reason is None


# ---------------------------------------------------------------- regions
def _one_region_covers(split: GraphModule) -> bool:
    """Whether nothing but one region's call, guards and unpacking its result runs in PyTorch."""
    calls = [n for n in split.graph.nodes if n.op not in _ENDS]
    regions = [n for n in calls if n.op == "call_module" and n.target.startswith(REGION_PREFIX)]
    rest = [n for n in calls if n not in regions]
    unpacking = all(
        n.op == "call_function" and (n.target is operator.getitem or stays_on_host(n.target))
        for n in rest
    )
    return len(regions) == 1 and unpacking


def _region_names(split: GraphModule) -> list[str]:
    return [name for name, _ in split.named_children() if name.startswith(REGION_PREFIX)]


def _record_regions(split: GraphModule, inputs: tuple[tuple, dict]) -> dict[str, tuple]:
    """Run ``split`` once; return each region's (inputs, output) on the examples."""
    seen: dict[str, tuple] = {}
    handles = []
    for name in _region_names(split):

        def record(module: nn.Module, args: tuple, output: Any, name: str = name) -> None:
            seen[name] = (args, output)

        handles.append(getattr(split, name).register_forward_hook(record))
    try:
        _call(split, inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _regions_at_sizes(
    split: GraphModule, seen: dict[str, tuple], runs: list[SizeRun]
) -> tuple[dict[str, list[SizeRun]], dict[str, str]]:
    """Each region's inputs in every run at other sizes, and the regions that cannot vary.

    The whole model runs once per run (``fxloom.lower.dynamic_dims``); what each region
    received there is its own run, from which the backend finds its dynamic dimensions.
    A region fed a number that changes with the sizes (the backend would get it fixed), or
    not reached at some size, stays in PyTorch, so the lowered module runs at any size.
    """
    at_sizes: dict[str, list[SizeRun]] = {name: [] for name in seen}
    fixed: dict[str, str] = {}
    for run in runs:
        try:
            grown = _record_regions(split, call_inputs(run.inputs, "lower"))
        except Exception as error:
            raise LoweringError(run_failed(run, error)) from error
        for name, (args, _) in seen.items():
            other = grown.get(name)
            reason = _fixed_reason(run, args, other[0] if other else None)
            if reason is not None:
                fixed.setdefault(name, reason)
            elif other is not None:
                at_sizes[name].append(SizeRun(other[0], run.names, outputs=other[1]))
    return at_sizes, fixed


def _fixed_reason(run: SizeRun, args: tuple, other: tuple | None) -> str | None:
    """Why a region cannot follow the run's sizes: it was not reached, or a number changed."""
    changed = ", ".join(sorted(set(run.names.values())))
    if other is None:
        return f"{run.option}: not run when {changed} changes"
    for position, value in enumerate(args):
        holds_tensor = any(isinstance(leaf, torch.Tensor) for leaf in tree_flatten(value)[0])
        if not holds_tensor and not same_number(value, other[position]):
            return (
                f"{run.option}: its input {position} ({value!r}) changes with {changed}, "
                "and the backend would get it fixed"
            )
    return None


def _lower_region(
    backend: Backend, split: GraphModule, examples: RegionExamples, fixed: str | None = None
) -> tuple[RegionReport, list[tuple[str, str]]]:
    """The region's report, and the nodes the backend's translator refused (name, reason):
    ``lower`` splits the region again around them."""
    name = examples.name
    region: GraphModule = getattr(split, name)
    nodes = tuple(
        n for n in region.graph.nodes if n.op in ("call_function", "call_method", "call_module")
    )
    names = tuple(n.name for n in nodes)
    ops = dict(Counter(describe_target(n, "label") for n in nodes))
    why_not = fixed or backend.not_worth_compiling(region)
    if why_not is not None:
        return RegionReport(name, names, ops, lowered=False, reason=why_not), []
    start = time.perf_counter()
    try:
        replacement = backend.compile_region(region, examples)
    except UntranslatableNodesError as error:  # split again around these nodes (``lower``)
        failed = [(node.name, reason) for node, reason in error.nodes]
        named = ", ".join(f"%{node_name}" for node_name, _ in failed)
        reason = f"translation failed at {named}: {failed[0][1]}" if failed else str(error)
        return RegionReport(name, names, ops, lowered=False, reason=reason), failed
    except Exception as error:  # any other failure keeps the region in PyTorch, reported
        first = (str(error).strip().splitlines() or [""])[0]
        reason = f"translation failed: {type(error).__name__}: {first}"
        return RegionReport(name, names, ops, lowered=False, reason=reason), []
    # The split is lowering's own module: its region is replaced in the table directly, as
    # ``attr_path`` installs, without torch's global registration hooks, which report changes
    # to the user's modules (fxloom.compile counts them: its entries would never hold).
    split._modules[name] = replacement
    report = RegionReport(
        name, names, ops, lowered=True, translate_seconds=time.perf_counter() - start,
        differences=backend.differences(region),
    )  # fmt: skip
    return report, []


def _left_node(node: Node, reason: str) -> LeftNode:
    return LeftNode(node.name, describe_target(node, "label"), reason, _source(node))


def _source(node: Node) -> str | None:
    """The innermost frame of the user's program that made the node: ``file.py:41: code``."""
    location = source_location(node)
    if location is None:
        return None
    return f"{location.short}: {location.code}" if location.code else location.short


# ---------------------------------------------------------------- check
def _checked(
    model: Callable[..., Any],
    lowered: GraphModule,
    inputs: tuple[tuple, dict],
    report: LoweringReport,
    concrete_args: dict[str, Any] | None,
    rtol: float,
    atol: float,
) -> LoweringReport:
    args, kwargs = inputs
    expected = _call(model, (args, {**kwargs, **(concrete_args or {})}))
    got = _call(lowered, inputs)
    pairs = _tensor_pairs(got, expected)
    max_abs = max_rel = 0.0
    passed = True
    for value, reference in pairs:
        difference = (value.double() - reference.double()).abs()
        scale = reference.double().abs().max().clamp(min=1e-12)
        max_abs = max(max_abs, float(difference.max()) if difference.numel() else 0.0)
        max_rel = max(max_rel, float(difference.max() / scale) if difference.numel() else 0.0)
        passed = passed and torch.allclose(value.double(), reference.double(), rtol, atol)
    report = dataclasses.replace(report, check=CheckResult(max_abs, max_rel, passed, rtol, atol))
    if not passed:
        expected_differences = dict.fromkeys(d for r in report.lowered for d in r.differences)
        why = "".join(f"\n  {difference}" for difference in expected_differences)
        raise LoweringError(
            f"the lowered {report.model} differs from eager PyTorch beyond rtol={rtol}, "
            f"atol={atol} on the example inputs (max abs error {max_abs:.3g}, relative "
            f"{max_rel:.3g}); the regions below ran in {report.backend}: "
            + (
                f"it computes these operators otherwise, on purpose:{why}\n"
                if why
                else "lower it again with check=False to inspect it, or report the operator "
                "at fault\n"
            )
            + str(report)
        )
    return report


def _tensor_pairs(got: Any, expected: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    got_leaves = [v for v in _leaves(got) if isinstance(v, torch.Tensor)]
    expected_leaves = [v for v in _leaves(expected) if isinstance(v, torch.Tensor)]
    if len(got_leaves) != len(expected_leaves):
        raise LoweringError(
            f"the lowered module returns {len(got_leaves)} tensors, eager PyTorch "
            f"{len(expected_leaves)}"
        )
    for value, reference in zip(got_leaves, expected_leaves):
        if value.shape != reference.shape or value.dtype != reference.dtype:
            raise LoweringError(
                f"the lowered module returns {value.dtype} {tuple(value.shape)} where eager "
                f"PyTorch returns {reference.dtype} {tuple(reference.shape)}"
            )
    return list(zip(got_leaves, expected_leaves))


def _leaves(output: Any) -> list[Any]:
    """Every value in an output: tuples, lists, dicts, and Hugging Face's ModelOutput."""
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    leaves, _ = tree_flatten(output)
    return leaves
