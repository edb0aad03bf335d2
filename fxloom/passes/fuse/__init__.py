"""Conv/linear + batch-norm fusion for inference (the torch.fx paper, section 6.2.2).

In eval mode a batch norm is a fixed per-channel affine map, so it can be folded into the
weights of the convolution or linear layer that feeds it: one layer instead of two, and one
pass over the activations less::

    >>> import torch
    >>> from fxloom.passes.fuse import fuse
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.conv = torch.nn.Conv2d(3, 8, 3)
    ...         self.bn = torch.nn.BatchNorm2d(8)
    ...     def forward(self, x):
    ...         return torch.relu(self.bn(self.conv(x)))
    >>> model = Net().eval()
    >>> fused = fuse(model)
    >>> print(fused.code.strip())
    def forward(self, x):
        conv = self.conv(x);  x = None
        relu = torch.relu(conv);  conv = None
        return relu
    >>> x = torch.randn(2, 3, 16, 16)
    >>> torch.testing.assert_close(fused(x), model(x))

**What folds.** ``Conv{1,2,3}d`` + ``BatchNorm{1,2,3}d`` (same dims), ``ConvTranspose{1,2,3}d``
(any ``groups``) + the same, and ``Linear`` + ``BatchNorm1d``. Either side may be a module
(``call_module``) or its functional form (``F.conv2d``, ``F.conv_transpose2d``, ``F.linear``;
``F.batch_norm``, ``torch.batch_norm``) whose tensors are attributes reached by ``get_attr``
nodes. Convolutions without bias and batch norms without affine parameters fold too. The
pairs are rows of ``rules.FUSION_RULES``; add rows for your own layer classes.

**What stays as it is** (listed, with the reason, in ``gm.meta["fuse"]["unfused"]``): a pair
whose layer output has any other user than the batch norm; a batch norm without running
statistics (``track_running_stats=False``, which normalizes with each batch's statistics even
in eval mode); a module with forward hooks or pre-hooks (spectral and weight norm compute the
weight in one); a functional form whose tensors or flags are computed at run time; channel
counts that differ; a ``Linear`` whose output shape metadata says it is not 2-D (without
shape metadata, e.g. from ``ShapeProp``, a 2-D ``(N, features)`` output is assumed); a
convolution whose shape metadata says its input is unbatched. A subclass of a listed module
class kept as a ``call_module`` leaf is not folded unless added to the table (it may
override ``forward``); one the tracer traced through folds as the functions it calls.

**Training mode** is refused: if the model, or any batch norm in its graph, is in training
mode (a functional one called with ``training=True``), ``FusionError`` names it and says to
call ``.eval()``, and nothing is changed.

**What it does to the graph.** The layer node now computes the batch norm's result; the
batch-norm node is erased and its users use the layer node. A fused module is a new module
object (the input's modules are never modified) installed at the layer's path, or at
``<path>_fused`` when something else still uses the original module (it is called twice,
or its weight is read by ``get_attr``). A functional layer reads new attributes
``<weight>_fused`` and ``<bias>_fused`` (``<weight>_bias_fused`` if it had no bias) through
new ``get_attr`` nodes placed before it; the old ones go if nothing else uses them. Batch-norm modules and tensors that no node uses any
more are removed from the module.

**node.meta.** The layer node keeps its meta (``nn_module_stack``, ``source_fn_stack``,
``stack_trace`` and all other keys), except that the value keys ``val`` and ``tensor_meta``
are taken from the batch-norm node when it has them (the layer node now produces that
value; shape, dtype and layout are the same). The batch-norm node is erased with its meta.
New ``get_attr`` nodes copy the meta of the ``get_attr`` node they replace. ``gm.meta["fuse"]``
records ``{"fused": [(layer node, batch-norm node), ...], "unfused": {batch-norm node:
reason}}`` by node name.

**Names.** The layer node keeps its name; no node is renamed. New ``get_attr`` nodes are
named from their targets (``weight_fused``).

Depends on: the IR, and ``fxloom.symbolic_trace`` (imported when given a module that is not
a ``GraphModule``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from fxloom.export.program import ExportedProgram
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.passes.captured import module_to_transform
from fxloom.passes.fuse.attrs import AttrUses
from fxloom.passes.fuse.rewrite import install, remove_batch_norm
from fxloom.passes.fuse.rules import (
    FUSION_RULES,
    BatchNormStats,
    CannotFold,
    FoldFn,
    Layer,
    fold_conv,
    fold_conv_transpose,
    fold_linear,
)
from fxloom.passes.fuse.sites import (
    Producer,
    consumer_key,
    normalized_input,
    parameters_of,
    read_batch_norm,
    read_producer,
    training_mode_culprit,
)
from fxloom.passes.fuse.weights import fuse_conv_bn_weights, fuse_linear_bn_weights

__all__ = [
    "FUSION_RULES",
    "BatchNormStats",
    "CannotFold",
    "FoldFn",
    "FusionError",
    "Layer",
    "fold_conv",
    "fold_conv_transpose",
    "fold_linear",
    "fuse",
    "fuse_conv_bn_weights",
    "fuse_linear_bn_weights",
]


class FusionError(RuntimeError):
    """The model cannot be fused as asked (it is in training mode); nothing was changed."""


def fuse(model_or_gm: torch.nn.Module | ExportedProgram, inplace: bool = False) -> GraphModule:
    """Fold every eval-mode batch norm into the convolution or linear layer before it.

    See the module docstring for what folds, what does not, and what happens to
    ``node.meta`` and names.

    Args:
        model_or_gm: a ``GraphModule``, an exported program (fused as ``ep.module()``, a new
            module), or any ``nn.Module``, traced here as ``fxloom.symbolic_trace(model)``
            would (``fxloom.passes.captured.trace``; a model that needs ``concrete_args`` or
            ``example_inputs``: trace it yourself and pass the ``GraphModule``).
        inplace: ``False`` (default): the result is a new ``GraphModule`` that shares nothing
            with the input, which is left exactly as it was. ``True``: nothing is copied; a
            ``GraphModule`` is fused in place and returned; a plain module is traced and its
            trace fused (the module itself is still not modified, and the result shares its
            unfused submodules).

    Returns:
        The fused ``GraphModule``.

    Raises:
        FusionError: the model, or a batch norm in it, is in training mode.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3, bias=False), torch.nn.BatchNorm1d(3))
    >>> fused = fuse(model.eval())
    >>> fused.meta["fuse"]
    {'fused': [('_0', '_1')], 'unfused': {}}
    >>> [name for name, _ in fused.named_children()]
    ['0']
    """
    if not isinstance(model_or_gm, (torch.nn.Module, ExportedProgram)):
        raise TypeError(f"fuse() takes an nn.Module or GraphModule, got {type(model_or_gm)!r}")
    if isinstance(model_or_gm, torch.nn.Module) and model_or_gm.training:
        raise FusionError(
            f"fuse() folds batch norms for inference, but the model "
            f"({type(model_or_gm).__name__}) is in training mode; call .eval() on it first"
        )
    _check_rules()
    traced = not isinstance(model_or_gm, GraphModule)  # a new module, whoever made it
    gm = module_to_transform(model_or_gm, consumer="fxloom.passes.fuse.fuse")
    consumers = _batch_norm_nodes(gm)
    _refuse_training_mode(gm, consumers)
    if not inplace and not traced:  # the GraphModule given must stay exactly as it was
        gm = copy.deepcopy(gm)
        consumers = _batch_norm_nodes(gm)
    created: list[Any] = []
    gm.meta["fuse"] = _fuse_all(gm, consumers, created)
    if not inplace and traced:
        gm = _unshared(gm, created)
    return gm


def _check_rules() -> None:
    """Every function ``FUSION_RULES`` names must have its parameters named, or reading its
    nodes would fail halfway through the pass."""
    functions = {key for pair in FUSION_RULES for key in pair if not isinstance(key, type)}
    missing = [_key_name(fn) for fn in functions if not parameters_of(fn)]
    if missing:
        raise KeyError(
            f"FUSION_RULES names {', '.join(sorted(missing))}, but "
            "fxloom.passes.fuse.sites.FUNCTION_PARAMETERS does not; add its parameter names there"
        )


def _unshared(gm: GraphModule, created: list[Any]) -> GraphModule:
    """``gm`` with copies of the modules its trace shares with the model.

    Fusing a fresh trace never modifies the model (fused layers are new objects, installed in
    the trace's own containers), so only what survives fusion is copied: not the graph, nor
    the fused modules and tensors, which nothing else holds.
    """
    memo: dict[int, Any] = {id(gm.graph): gm.graph}
    memo.update((id(obj), obj) for obj in created)
    return copy.deepcopy(gm, memo)


def _batch_norm_nodes(gm: GraphModule) -> list[Node]:
    """The nodes calling a batch norm of ``FUSION_RULES``, in graph order."""
    keys = {consumer for _, consumer in FUSION_RULES}
    found = [n for n in gm.graph.find_nodes(op="call_module") if consumer_key(n, gm, keys)]
    for fn in keys:
        if callable(fn) and not isinstance(fn, type):
            found += gm.graph.find_nodes(op="call_function", target=fn)
    return sorted(found)


def _refuse_training_mode(gm: GraphModule, consumers: list[Node]) -> None:
    culprits = [c for c in (training_mode_culprit(n, gm) for n in consumers) if c]
    if not culprits:
        return
    more = f" (and {len(culprits) - 3} more)" if len(culprits) > 3 else ""
    raise FusionError(
        "fuse() folds batch norms with their running statistics, as inference uses them, but "
        f"{'; '.join(culprits[:3])}{more}. Call .eval() on the model before tracing and "
        "fusing it (folding would change what training mode computes); nothing was changed"
    )


def _fuse_all(gm: GraphModule, consumers: list[Node], created: list[Any]) -> dict[str, Any]:
    """Fold each batch norm (in graph order, so a second one after a fold folds too).

    Returns the report for ``gm.meta["fuse"]``; the new modules and tensors go to ``created``.
    """
    producer_keys = {producer for producer, _ in FUSION_RULES}
    consumer_keys = {consumer for _, consumer in FUSION_RULES}
    uses = AttrUses(gm)
    fused: list[tuple[str, str]] = []
    unfused: dict[str, str] = {}
    for bn_node in consumers:
        bn_name = bn_node.name
        try:
            producer = _foldable_producer(gm, bn_node, producer_keys)
            rule_key = (producer.key, consumer_key(bn_node, gm, consumer_keys))
            fold = FUSION_RULES.get(rule_key)
            if fold is None:
                raise CannotFold(
                    f"no rule folds {_key_name(rule_key[1])} into {_key_name(producer.key)}"
                )
            weight, bias = fold(producer.layer, read_batch_norm(bn_node, gm))
        except CannotFold as why:
            unfused[bn_name] = str(why)
            continue
        created += install(gm, producer, weight, bias, uses)
        remove_batch_norm(gm, bn_node, producer.node, uses)
        fused.append((producer.node.name, bn_name))
    return {"fused": fused, "unfused": unfused}


def _foldable_producer(gm: GraphModule, bn_node: Node, keys: set[Any]) -> Producer:
    source = normalized_input(bn_node)
    if not isinstance(source, Node):
        raise CannotFold(f"it normalizes {source!r}, not the output of a layer")
    producer = read_producer(source, gm, keys)
    if producer is None:
        raise CannotFold(f"its input %{source.name} is not a convolution or linear layer")
    others = [user for user in source.users if user is not bn_node]
    if others:
        raise CannotFold(f"the output of %{source.name} is also used by %{others[0].name}")
    return producer


def _key_name(key: Any) -> str:
    return getattr(key, "__name__", repr(key))
