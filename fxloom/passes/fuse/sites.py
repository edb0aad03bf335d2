"""Reading a node as a fusion producer (a layer) or consumer (a batch norm), module or function.

A ``call_module`` node is read through its module (``weight``, ``bias``, ``groups``;
``running_mean``, ``running_var``, ``eps``, ``training``). A ``call_function`` node is read
through its arguments, named by ``parameters_of``; tensors must come from ``get_attr``
nodes (values stored on the module, known now), everything else from literal arguments.
Anything that is only known at run time makes the pair ``CannotFold``.

Depends on: torch, the IR, ``rules``, ``attrs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fxloom import attr_path
from fxloom._format import describe_target
from fxloom.graph_module import GraphModule
from fxloom.node import Argument, Node
from fxloom.ops.identity import op_key
from fxloom.ops.signatures import parameter_names
from fxloom.passes.fuse.rules import BatchNormStats, CannotFold, Layer

__all__ = [
    "FUNCTION_PARAMETERS",
    "parameters_of",
    "Producer",
    "bind",
    "consumer_key",
    "normalized_input",
    "read_batch_norm",
    "read_producer",
    "set_argument",
    "training_mode_culprit",
]

# Parameter names of your own functions that FUSION_RULES names; torch's are read by
# ``fxloom.ops.signatures.parameter_names`` (a Python signature, or a builtin's ATen schema).
FUNCTION_PARAMETERS: dict[Any, tuple[str, ...]] = {}
# The defaults of the parameters a fold reads, where a call may leave them out.
_DEFAULTS = {"bias": None, "groups": 1, "weight": None, "training": False, "eps": 1e-5}


def parameters_of(function: Any) -> tuple[str, ...]:
    """The names of ``function``'s positional parameters (``()`` if unknown): a torch
    operator's are read, a function of yours is named in ``FUNCTION_PARAMETERS`` (a fold
    writes its bias and weight, which its signature alone does not promise to take)."""
    if function in FUNCTION_PARAMETERS:
        return FUNCTION_PARAMETERS[function]
    return parameter_names(function) if op_key(function) is not None else ()


def bind(node: Node) -> dict[str, Argument]:
    """The arguments of a ``call_function`` node by parameter name, defaults filled in."""
    names = parameters_of(node.target)
    if not names:
        raise KeyError(
            f"%{node.name} calls {describe_target(node)}, which FUSION_RULES names but "
            "fxloom.passes.fuse.sites.FUNCTION_PARAMETERS does not; add its parameter names "
            "there"
        )
    bound = dict(_DEFAULTS)
    bound.update(zip(names, node.args))
    bound.update(node.kwargs)
    return bound


def set_argument(node: Node, name: str, value: Argument) -> None:
    """Set parameter ``name`` of a ``call_function`` node, where the call passed it (or by keyword)."""
    index = parameters_of(node.target).index(name)
    if index < len(node.args):
        node.update_arg(index, value)
    else:
        node.update_kwarg(name, value)


def known_rank(node: Node) -> int | None:
    """The rank of ``node``'s value, if shape metadata (ShapeProp's, an exporter's) records it."""
    for key in ("tensor_meta", "val"):
        shape = getattr(node.meta.get(key), "shape", None)
        if shape is not None:
            return len(shape)
    return None


def stored_tensor(gm: GraphModule, arg: Argument, owner: Node, what: str) -> torch.Tensor | None:
    """The tensor ``arg`` stands for if it is ``None`` or a ``get_attr`` of a tensor."""
    if arg is None:
        return None
    if isinstance(arg, Node) and arg.op == "get_attr":
        value = attr_path.get(gm, arg.target)
        if isinstance(value, torch.Tensor):
            return value
    shown = f"%{arg.name}" if isinstance(arg, Node) else repr(arg)
    raise CannotFold(
        f"the {what} of %{owner.name} is {shown}, not a tensor stored on the module (get_attr)"
    )


# ---------------------------------------------------------------------------- producers
@dataclass(frozen=True)
class Producer:
    """A node that computes a convolution or linear layer: its rule key and parameters."""

    node: Node
    key: Any  # the module's class, or the function
    layer: Layer


def read_producer(node: Node, gm: GraphModule, keys: set[Any]) -> Producer | None:
    """``node`` as a layer whose rule key is in ``keys``; ``None`` if it is no such layer."""
    if node.op == "call_module":
        module = attr_path.get(gm, node.target)
        if type(module) not in keys:
            return None
        _refuse_hooks(node, module)
        weight = module.weight
        if isinstance(weight, torch.nn.parameter.UninitializedParameter):
            raise CannotFold(f"{node.target!r} is a lazy module that has not run yet")
        layer = Layer(weight, module.bias, getattr(module, "groups", 1), known_rank(node))
        return Producer(node, type(module), layer)
    if node.op == "call_function" and node.target in keys:
        bound = bind(node)
        weight = stored_tensor(gm, bound["weight"], node, "weight")
        bias = stored_tensor(gm, bound["bias"], node, "bias")
        groups = bound.get("groups", 1)
        if not isinstance(groups, int):
            raise CannotFold(f"the groups of %{node.name} are computed at run time")
        return Producer(node, node.target, Layer(weight, bias, groups, known_rank(node)))
    return None


def _refuse_hooks(node: Node, module: torch.nn.Module) -> None:
    # A pre-hook may compute the weight on every call (spectral or weight norm), a hook may
    # change or record the output: folding would drop or break what they do.
    if module._forward_pre_hooks or module._forward_hooks:
        raise CannotFold(
            f"{node.target!r} has forward hooks, which may compute its weights or use its output"
        )


# ---------------------------------------------------------------------------- consumers
def consumer_key(node: Node, gm: GraphModule, keys: set[Any]) -> Any | None:
    """The rule key of ``node`` if it is a batch norm named in ``keys``, else ``None``."""
    if node.op == "call_module":
        key = type(attr_path.get(gm, node.target))
        return key if key in keys else None
    if node.op == "call_function" and node.target in keys:
        return node.target
    return None


def normalized_input(node: Node) -> Argument:
    """What the batch-norm node normalizes (its first argument)."""
    if node.op == "call_module":
        return node.args[0] if node.args else node.kwargs.get("input")
    return bind(node)["input"]


def training_mode_culprit(node: Node, gm: GraphModule) -> str | None:
    """Why the batch-norm node computes with batch statistics (training mode), or ``None``."""
    if node.op == "call_module":
        module = attr_path.get(gm, node.target)
        if module.training:
            return f"%{node.name} ({describe_target(node)}) is in training mode"
        return None
    if bind(node)["training"] is True:
        return f"%{node.name} calls {describe_target(node)} with training=True"
    return None


def read_batch_norm(node: Node, gm: GraphModule) -> BatchNormStats:
    """The batch norm's inference statistics; ``CannotFold`` if it does not use running ones."""
    if node.op == "call_module":
        return _module_batch_norm(node, attr_path.get(gm, node.target))
    return _function_batch_norm(node, gm)


def _module_batch_norm(node: Node, bn: torch.nn.Module) -> BatchNormStats:
    _refuse_hooks(node, bn)
    if bn.running_mean is None or bn.running_var is None:
        raise CannotFold(
            f"{node.target!r} keeps no running statistics (track_running_stats=False), so it "
            "normalizes with each batch's own"
        )
    return BatchNormStats(bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)


def _function_batch_norm(node: Node, gm: GraphModule) -> BatchNormStats:
    bound = bind(node)
    if bound["training"] is not False:
        raise CannotFold(f"the training flag of %{node.name} is decided at run time")
    mean = stored_tensor(gm, bound["running_mean"], node, "running_mean")
    var = stored_tensor(gm, bound["running_var"], node, "running_var")
    if mean is None or var is None:
        raise CannotFold(f"%{node.name} is given no running statistics")
    eps = bound["eps"]
    if not isinstance(eps, (int, float)):
        raise CannotFold(f"the eps of %{node.name} is computed at run time")
    weight = stored_tensor(gm, bound["weight"], node, "weight")
    bias = stored_tensor(gm, bound["bias"], node, "bias")
    return BatchNormStats(mean, var, float(eps), weight, bias)
