"""One GraphModule per pipeline stage, cut from a legalised program.

Stage ``s`` takes, in order, the tensors ``crossings`` lists for it (stage 0: the program's
own inputs, with its calling convention), runs its nodes, and returns a tuple of the tensors
stage ``s + 1`` receives — its own values and those it passes through. The last stage returns
what the program returns when that is a tensor or a tuple of tensors, and otherwise (a
``ModelOutput``, a dict) its tensors as a tuple (``fxloom.distributed.outputs``).

Each stage module is built over the program as its root, so it holds the submodules,
parameters and buffers its nodes use **at their original qualified names**
(``transformer.h.3.attn.c_attn.weight``): its ``state_dict`` keys are the model's, and
checkpoints, optimizers and FSDP wrapping see the names users know. Attributes are the same
objects as in the program, not copies.

Depends on: the IR, ``fxloom.pytree_codegen``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from fxloom import pytree
from fxloom.distributed.wire import WIRE
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node, map_arg
from fxloom.pytree_codegen import PyTreeCodeGen, PyTreeInfo

__all__ = ["build_stage_modules"]


def build_stage_modules(
    root: GraphModule,
    stage_of: dict[Node, int],
    received: list[list[Node]],
    flatten_output: bool = False,
    dtypes: dict[Node, torch.dtype] | None = None,
) -> list[GraphModule]:
    """The stage modules of ``root``'s graph cut by ``stage_of`` (see the module docstring).

    ``dtypes`` gives each received tensor's dtype: one that is not floating crosses as a
    floating-point tensor (``fxloom.distributed.wire``)."""
    graph, stages = root.graph, len(received)
    return [
        _stage_module(root, graph, stage_of, received, stage, stages, flatten_output, dtypes or {})
        for stage in range(stages)
    ]


def _stage_module(
    root: GraphModule,
    graph: Graph,
    stage_of: dict[Node, int],
    received: list[list[Node]],
    stage: int,
    stages: int,
    flatten_output: bool,
    dtypes: dict[Node, torch.dtype],
) -> GraphModule:
    new = Graph()
    env: dict[Node, Node] = {}

    def read(node: Node) -> Node:
        if node not in env:  # an attribute, read where it is first used
            env[node] = new.node_copy(node)
        return env[node]

    if stage == 0:
        for node in graph.nodes:
            if node.op == "placeholder":
                env[node] = new.node_copy(node)
    else:
        for node in received[stage]:
            env[node] = new.placeholder(node.name)
            env[node].meta = dict(node.meta)
        for node in received[stage]:
            env[node] = _from_wire(new, env[node], dtypes.get(node))
    for node in graph.nodes:
        if stage_of.get(node) == stage and node.op not in ("placeholder", "output"):
            env[node] = new.node_copy(node, read)
    if stage == stages - 1:
        output = next(node for node in reversed(graph.nodes) if node.op == "output")
        result = map_arg(output.args[0], read)
        if flatten_output:  # see fxloom.distributed.outputs
            info: Any = getattr(graph._codegen, "pytree_info", None)
            if info is not None and info.out_spec is not None:  # already flat leaves
                result = tuple(result)
            result = new.call_function(pytree.tensor_leaves, (result,))
        new.output(result)
    else:  # what crosses a cut is what the stage declares: contiguous tensors
        sent = (_to_wire(new, read(node), dtypes.get(node)) for node in received[stage + 1])
        new.output(tuple(sent))
    _keep_calling_convention(graph, new, stage, stages, flatten_output)
    module = GraphModule(root, new, class_name=f"{type(root).__name__}Stage{stage}")
    module.meta["pipeline_stage"] = stage
    return module


def _to_wire(graph: Graph, value: Node, dtype: torch.dtype | None) -> Node:
    """``value`` as it crosses: contiguous, and floating-point (``fxloom.distributed.wire``)."""
    value = _contiguous(graph, value)
    row = WIRE.get(dtype)
    return value if row is None else graph.call_method(row[1], (value, row[0]))


def _from_wire(graph: Graph, received: Node, dtype: torch.dtype | None) -> Node:
    """What ``_to_wire`` sent, back in its own dtype."""
    row = WIRE.get(dtype)
    if row is None:
        return received
    value = graph.call_method(row[1], (received, dtype))
    value.meta = dict(received.meta)
    return value


def _contiguous(graph: Graph, value: Node) -> Node:
    """``value`` (a tensor: ``boundaries.legalise`` makes everything that crosses one) laid
    out as stage metadata declares it: ``TensorSpec`` holds shape and dtype, so contiguous.
    An expanded or transposed activation would otherwise cross with its own strides, which
    torch.distributed.pipelining rejects (always on torch 2.11; under
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` on 2.13). ``contiguous()`` of a contiguous tensor is
    the tensor itself, so this costs nothing where the layout already matches."""
    return graph.call_method("contiguous", (value,))


def _keep_calling_convention(
    graph: Graph, new: Graph, stage: int, stages: int, flatten_output: bool
) -> None:
    """A program that takes or returns nested values keeps doing so at its ends.

    Stage 0 keeps the program's code generator (its input checks and flattening) but returns
    a flat tuple; the last stage takes flat tensors and rebuilds the program's output.
    """
    info: Any = getattr(graph._codegen, "pytree_info", None)
    if info is None or stages == 1:
        if info is not None:
            codegen = copy.copy(graph._codegen)
            if flatten_output:
                codegen.pytree_info = info._replace(out_spec=None)
            new.set_codegen(codegen)
        return
    if stage == 0:
        codegen = copy.copy(graph._codegen)
        codegen.pytree_info = info._replace(out_spec=None)
        new.set_codegen(codegen)
    elif stage == stages - 1 and info.out_spec is not None and not flatten_output:
        names = [node.name for node in new.nodes if node.op == "placeholder"]
        _, flat_spec = pytree.tree_flatten(tuple(range(len(names))))
        new.set_codegen(PyTreeCodeGen(PyTreeInfo(names, flat_spec, info.out_spec)))
