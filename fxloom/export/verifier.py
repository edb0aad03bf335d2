"""The rules an exported program keeps (the Export IR specification), checked on every export.

* only ``placeholder``, ``call_function``, ``get_attr`` (of submodules) and one
  ``output`` last; placeholders first, as many as the signature's inputs and
  named as it says; the output as long as the signature's outputs;
* every ``call_function`` target is an operator overload that mutates nothing
  (or ``operator.getitem`` picking one result of a multi-result operator, the
  arithmetic of symbolic sizes: ``operator.mul``, ``torch.sym_max``..., a
  higher-order operator (torch's, or fxloom's ``cond_op``: allowed by type), or
  one of fxloom's run-time functions whose row allows it in exported graphs);
* ``get_attr`` reads only a branch of ``cond``: a GraphModule that is a direct
  child of the graph's module, checked by the same rules; no other module
  anywhere in the tree holds a graph (nothing runs unchecked);
* every operator node carries the metadata the spec lists: ``val``,
  ``stack_trace``, ``nn_module_stack``; placeholders carry ``val``.

A broken rule raises ``ExportVerifierError`` naming the node and the rule.

Depends on the IR, ``signature``, ``fxloom.values.symbolic.size_nodes`` and the registry of run-time functions.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch

from fxloom.export.signature import ConstantArgument
from fxloom.graph_module import GraphModule
from fxloom.ops.higher_order import HigherOrderOperator
from fxloom.ops.runtime_functions import exported_graph_may_call
from fxloom.values.symbolic.size_nodes import SIZE_FUNCTIONS

if TYPE_CHECKING:
    from fxloom.export.program import ExportedProgram

__all__ = ["verify", "ExportVerifierError", "ALLOWED_FUNCTIONS"]

# call_function targets allowed besides operator overloads: picking one result of a
# multi-result operator, and the arithmetic of symbolic sizes. Higher-order operators are
# allowed by type and fxloom's run-time functions by their rows, so no import order changes
# the answer.
ALLOWED_FUNCTIONS: frozenset[Any] = frozenset({operator.getitem, *SIZE_FUNCTIONS})
_OPERATOR_METADATA = ("val", "stack_trace", "nn_module_stack")


class ExportVerifierError(RuntimeError):
    """An exported graph breaks a rule of the Export IR; the message names the node and rule."""


def verify(ep: ExportedProgram) -> None:
    """Check every rule of the module docstring on ``ep``; raise ``ExportVerifierError`` if one fails."""
    graph = ep.graph
    nodes = list(graph.nodes)
    signature = ep.graph_signature
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if nodes[: len(placeholders)] != placeholders:
        late = next(n for n in nodes[len(placeholders) :] if n.op == "placeholder")
        _fail(late, "placeholders must come first, before every other node")
    if len(placeholders) != len(signature.input_specs):
        raise ExportVerifierError(
            f"the graph has {len(placeholders)} placeholders but the signature lists "
            f"{len(signature.input_specs)} inputs"
        )
    for node, spec in zip(placeholders, signature.input_specs):
        if node.name != spec.arg.name:
            _fail(node, f"the signature names this input {spec.arg.name!r} (inputs in order)")
        if "val" not in node.meta:
            _fail(node, "a placeholder needs meta['val'] (what the input is)")
    outputs = [n for n in nodes if n.op == "output"]
    if len(outputs) != 1 or nodes[-1] is not outputs[0]:
        raise ExportVerifierError("an exported graph has exactly one output node, and it is last")
    returned = outputs[0].args[0] if outputs[0].args else ()
    if len(returned) != len(signature.output_specs):
        _fail(
            outputs[0],
            f"it returns {len(returned)} values but the signature lists "
            f"{len(signature.output_specs)} outputs",
        )
    for value, spec in zip(returned, signature.output_specs):
        name = getattr(value, "name", None)
        if not isinstance(spec.arg, ConstantArgument) and name != spec.arg.name:
            _fail(outputs[0], f"output {spec} is returned as {value!r}")
    checked = {ep.graph_module}
    for node in nodes:
        _check_node(ep.graph_module, node, checked)
    for path, module in ep.graph_module.named_modules():
        if module not in checked:
            raise ExportVerifierError(
                f"the submodule {path!r} ({type(module).__name__}) is not a branch read by "
                "get_attr; an exported program's modules are only its cond branches"
            )


def _check_node(owner: torch.nn.Module, node: Any, checked: set[torch.nn.Module]) -> None:
    if node.op in ("placeholder", "output"):
        return
    if node.op == "get_attr":
        # A branch of cond: a GraphModule child, whose graph keeps the same rules.
        branch = owner._modules.get(node.target)
        if not isinstance(branch, GraphModule):
            _fail(node, "get_attr may only read a cond branch, a GraphModule child of its module")
        if branch not in checked:
            checked.add(branch)
            for inner in branch.graph.nodes:
                _check_node(branch, inner, checked)
        return
    if node.op != "call_function":
        _fail(node, f"op {node.op!r} is not allowed in an exported graph (call_function only)")
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        if target._schema.is_mutable:
            _fail(node, f"{target} mutates its inputs; exported graphs are functional")
    elif not _allowed_function(target):
        _fail(node, f"target {target!r} is not an operator overload (torch.ops.*.*)")
    for key in _OPERATOR_METADATA:
        if key not in node.meta:
            _fail(node, f"meta[{key!r}] is missing (every operator node carries it)")


def _allowed_function(target: Any) -> bool:
    if isinstance(target, (torch._ops.HigherOrderOperator, HigherOrderOperator)):
        return True
    try:
        if target in ALLOWED_FUNCTIONS:
            return True
    except TypeError:  # an unhashable callable: in no table
        return False
    return exported_graph_may_call(target)


def _fail(node: Any, rule: str) -> None:
    raise ExportVerifierError(f"%{node.name}: {rule}")
