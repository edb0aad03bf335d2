"""``run_decompositions``: re-capture an exported program with operators broken into simpler ones.

An exported graph holds the operators the program dispatched, some of them
large (``aten.native_batch_norm``, ``aten.t``). A backend with a small
operator set asks for them in terms of smaller ones: ``run_decompositions``
runs the exported graph again on stand-ins, under a capture that replaces
each operator found in a decomposition table by its definition there, and
records what that definition dispatches. The default table is torch's core
ATen set (``torch._decomp.core_aten_decompositions()``, operator definitions
written in Python); pass your own ``{OpOverload: function}`` to choose::

    >>> import torch
    >>> from fxloom.export import export
    >>> ep = export(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
    >>> sorted({str(n.target) for n in ep.graph.find_nodes(op="call_function")})
    ['aten.addmm.default', 'aten.t.default']
    >>> core = ep.run_decompositions()
    >>> sorted({str(n.target) for n in core.graph.find_nodes(op="call_function")})
    ['aten.addmm.default', 'aten.permute.default']

Every new node keeps the metadata (stack trace, module stack, source
function) of the node it came from. The program's signature is unchanged,
but for the names of the output nodes.

Depends on ``capture``, ``program`` and ``signature``.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from fxloom import attr_path
from fxloom._torch_compat import core_aten_decompositions
from fxloom.export.capture import Capture
from fxloom.export.exporter import place_constants
from fxloom.export.program import ExportedProgram
from fxloom.export.signature import ExportGraphSignature, OutputSpec, TensorArgument
from fxloom.graph_module import GraphModule
from fxloom.node import Node, map_arg
from fxloom.values.provenance import PROVENANCE_KEYS
from fxloom.values.stand_in import StandIn, compute_meta, has_symbolic_sizes

__all__ = ["run_decompositions", "default_decompositions"]

aten = torch.ops.aten

_META_KEYS = (*PROVENANCE_KEYS, "torch_fn")


def default_decompositions() -> dict[Any, Any]:
    """torch's table down to the core ATen operator set (imported on first use: it is large)."""
    return core_aten_decompositions()


class _FromNode:
    """Provenance for a re-capture: every recorded node inherits the metadata of the node
    being re-run."""

    def __init__(self) -> None:
        self.node: Node | None = None

    def stamp(self) -> dict[str, Any]:
        if self.node is None:
            return {}
        return {key: self.node.meta[key] for key in _META_KEYS if key in self.node.meta}

    def stack_trace(self) -> str:
        return self.stamp().get("stack_trace", "")


def run_decompositions(ep: ExportedProgram, table: dict[Any, Any] | None = None) -> ExportedProgram:
    """A new program equal to ``ep``, with the operators in ``table`` replaced by their
    decompositions (default: torch's core ATen table). ``ep`` is left as it was."""
    source = _FromNode()
    capture = Capture(
        source,
        decompositions=default_decompositions() if table is None else table,
        reserved_names=set(ep.constants),
    )
    if ep.shape_env is not None:  # the same symbols: the sizes in meta["val"] are theirs
        capture = Capture(
            source,
            decompositions=capture.decompositions,
            reserved_names=capture.reserved_names,
            shape_env=ep.shape_env,
        )
        capture.asserted = len(ep.shape_env.deferred_assertions)  # already in the graph
    env: dict[Node, Any] = {}
    for node in ep.graph.find_nodes(op="placeholder"):
        new, env[node] = capture.placeholder(node.name, node.meta.get("val"))
        new.meta.update({k: node.meta[k] for k in _META_KEYS if k in node.meta})
    previous = StandIn.active
    StandIn.active = capture.dispatch
    try:
        with capture.mode():
            outputs = _rerun(ep, capture, source, env)
    finally:
        StandIn.active = previous
    graph = capture.graph
    results = [capture.read(v) if isinstance(v, StandIn) else v for v in outputs]
    graph.output(tuple(results))
    graph.eliminate_dead_code()
    input_specs = list(ep.graph_signature.input_specs)
    place_constants(capture, input_specs)  # tensors the decompositions made
    graph.lint()
    specs = [
        OutputSpec(spec.kind, TensorArgument(result.name), spec.target)
        if isinstance(result, Node)
        else spec
        for spec, result in zip(ep.graph_signature.output_specs, results)
    ]
    return ExportedProgram(
        GraphModule(ep.graph_module, graph),
        ExportGraphSignature(input_specs, specs),
        ep.state_dict,
        {**ep.constants, **{c.name: c.tensor for c in capture.constants.values()}},
        in_spec=ep.in_spec,
        out_spec=ep.out_spec,
        arg_names=ep.arg_names,
        example_inputs=ep.example_inputs,
        range_constraints=ep.range_constraints,
        module_hierarchy=ep.module_hierarchy,
        shape_env=ep.shape_env,
        shape_constraints=ep.shape_constraints,
        verifier=ep.verifier,
    )


def _rerun(
    ep: ExportedProgram, capture: Capture, source: _FromNode, env: dict[Node, Any]
) -> list[Any]:
    """Run ``ep``'s operators on stand-ins under ``capture``; the output's values."""
    load = env.__getitem__
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            return [load(v) if isinstance(v, Node) else v for v in node.args[0]]
        if node.op == "get_attr":  # a cond's branch: cond_op re-captures it, decomposed too
            env[node] = attr_path.find(ep.graph_module, node.target)
            continue
        if node.op != "call_function":
            raise ValueError(f"%{node.name}: run_decompositions re-runs call_function nodes only")
        source.node = node
        args, kwargs = map_arg(node.args, load), map_arg(node.kwargs, load)
        target = node.target
        if target is operator.getitem:
            env[node] = args[0][args[1]]
            continue
        if target is aten._assert_scalar.default:  # a check, not an operator to decompose
            check = capture.graph.create_node(
                "call_function", target, (capture.sizes.value(args[0]), args[1]), {}, name=node.name
            )
            check.meta.update(node.meta)
            continue
        if target is aten.view.default and not _viewable(*args):
            # A decomposition laid its result out otherwise than the operator it replaced did;
            # the graph is functional, so a reshape (a copy where needed) computes the same.
            target = aten.reshape.default
        env[node] = target(*args, **kwargs)
    return []


def _viewable(tensor: Any, shape: Any) -> bool:
    """Whether ``tensor`` (a stand-in) can be viewed as ``shape`` with its strides."""
    try:
        compute_meta(aten.view.default, (tensor, shape), {}, symbolic=has_symbolic_sizes((tensor,)))
    except (RuntimeError, ValueError):  # Python definitions raise ValueError
        return False
    return True
