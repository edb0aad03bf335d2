"""Which nodes a backend that computes into its own memory must leave to PyTorch.

A backend such as ONNX Runtime reads its inputs and returns new tensors: it never writes into
a tensor it was given, and what it returns shares no storage with its inputs. That is right
for values the graph makes and reads itself, and wrong for storage the caller holds (the
graph's inputs, its parameters and buffers, views of them):

* a write into it (``x.add_(1)``, ``x[0] = y``, ``torch.add(a, b, out=x)``) would land in a
  copy and leave the caller's tensor unchanged: the write stays in PyTorch;
* a write through a *view* of it (``x[1:].add_(1)``) in PyTorch must also keep its order
  against the graph's other reads of ``x``, which the split does not track through views
  (``fxloom.passes._ordering``): the whole graph stays in PyTorch;
* a view of it that the graph returns would come back a copy: the view (and the views it is
  made from) stays in PyTorch, where it costs nothing.

``held_storage_reasons(gm)`` answers once per graph (the aliasing is a whole-graph question,
answered by ``fxloom.passes._effects``, which assumes the cautious answer for calls it does
not know: they may write to their inputs and return views of them; a torch.nn module with
``inplace=True`` writes its input only, and a number shares no storage);
``OnnxRuntimeBackend.unsupported_reason`` asks it after the translator. Returned views are
followed through the operators known to return views (``fxloom.ops.effects.view_kind``).
``writes_held_storage`` and ``written_state`` tell ``fxloom.backends.LoweredProgram`` whether
to lower on copies, and which parameters and buffers change by the graph's own writes.

Not seen: a write into a module's parameter through a placeholder (``self.w.add_(1)``, the
parameter passed as an input) while a module call in a lowered region reads the same
parameter from its own state; writes through ``param.data``.

Depends on: the IR, ``fxloom.ops`` and ``fxloom.passes._effects``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from fxloom import attr_path
from fxloom.graph import Graph
from fxloom.node import Node
from fxloom.ops.effects import view_kind
from fxloom.ops.mutation import module_has_side_effect, module_is_inplace
from fxloom.passes._effects import Effects

__all__ = ["held_storage_reasons", "written_state", "writes_held_storage"]

_CALLS = ("call_function", "call_method", "call_module")
_HELD = ("placeholder", "get_attr")
# graph -> (graph version, reasons); a lowering asks for every node of one graph.
_ANSWERS: weakref.WeakKeyDictionary[Graph, tuple[int, dict[Node, str]]] = (
    weakref.WeakKeyDictionary()
)


def held_storage_reasons(module: Any) -> dict[Node, str]:
    """The nodes of ``module``'s graph (a GraphModule) that must run in PyTorch, each with why."""
    graph = module.graph
    known = _ANSWERS.get(graph)
    if known is not None and known[0] == graph._version:
        return known[1]
    reasons = _reasons(module, _Aliases(module))
    _ANSWERS[graph] = (graph._version, reasons)
    return reasons


def writes_held_storage(module: Any) -> bool:
    """Whether ``module``'s graph writes into storage its caller holds (inputs, parameters,
    buffers or views of them): running it on the caller's tensors changes them."""
    return bool(_Aliases(module).held_writers())


def written_state(module: Any) -> set[int]:
    """The ids of ``module``'s parameters and buffers that its graph may write: those of a
    module whose call writes its state, and those read by ``get_attr`` that a write reaches."""
    aliases = _Aliases(module)
    written: set[int] = set()
    roots = set()
    for items in aliases.held_writers().values():
        for item in items:
            roots.add(aliases.find(item))
            if isinstance(item, tuple):  # ("attr", path): everything under the path
                written.update(map(id, _tensors_at(module, item[1])))
    for node in aliases.graph.find_nodes(op="get_attr"):
        if aliases.find(node) in roots:
            written.update(map(id, _tensors_at(module, node.target)))
    return written


def _tensors_at(module: Any, path: str) -> list[torch.Tensor]:
    found = attr_path.find(module, path)
    if isinstance(found, torch.nn.Module):
        return [*found.parameters(), *found.buffers()]
    return [found] if isinstance(found, torch.Tensor) else []


class _Aliases:
    """Which tensors of a graph may share storage (``fxloom.passes._effects``' answers, joined
    over tensor values only: a number read from a shape shares nothing), and which of them the
    caller holds."""

    def __init__(self, module: Any) -> None:
        effects = Effects(module)
        self.graph: Graph = module.graph
        self._parent: dict[Any, Any] = {}
        self.writes: dict[Node, tuple[Any, ...]] = {}
        for node in self.graph.nodes:
            written = _inplace_module_writes(module, node)
            if written is None:
                written = effects.mutated_inputs(node)
            if written is not None:
                self.writes[node] = written
                for item in written:
                    self._join(node, item)
            elif node.op in _CALLS and effects.may_alias_input(node) and _may_be_tensor(node):
                for used in node.all_input_nodes:
                    if _may_be_tensor(used):
                        self._join(node, used)
        self.held = {self.find(node) for node in self.graph.nodes if node.op in _HELD}
        for written in self.writes.values():  # module state a call writes: ("attr", path)
            self.held.update(self.find(item) for item in written if isinstance(item, tuple))

    def find(self, item: Any) -> Any:
        while item in self._parent:
            item = self._parent[item]
        return item

    def _join(self, a: Any, b: Any) -> None:
        a, b = self.find(a), self.find(b)
        if a != b:
            self._parent[a] = b

    def held_writers(self) -> dict[Node, tuple[Any, ...]]:
        """The nodes that write into held storage, with what they write."""
        return {
            node: written
            for node, written in self.writes.items()
            if any(self.find(item) in self.held for item in written)
        }


def _inplace_module_writes(module: Any, node: Node) -> tuple[Any, ...] | None:
    """What a call of a torch.nn module with ``inplace=True`` (``nn.ReLU(inplace=True)``)
    writes: its input, not its own state (``Effects`` counts any impure module as writing
    both). None: not such a call."""
    if node.op != "call_module" or not node.args or not isinstance(node.args[0], Node):
        return None
    called = attr_path.find(module, node.target)
    torch_own = type(called).__module__.startswith("torch.nn.")
    if torch_own and module_is_inplace(called) and not module_has_side_effect(called):
        return (node.args[0],)
    return None


def _may_be_tensor(node: Node) -> bool:
    """Whether ``node``'s value may be (or hold) a tensor, as the graph recorded it."""
    value = node.meta.get("val")
    if value is not None:
        return not isinstance(value, (bool, int, float, str, torch.Size, torch.dtype))
    kind = node.meta.get("type")
    return not (isinstance(kind, type) and issubclass(kind, (bool, int, float, str, torch.Size)))


def _reasons(module: Any, aliases: _Aliases) -> dict[Node, str]:
    graph = aliases.graph
    writers = aliases.held_writers()
    written = {aliases.find(item) for items in writers.values() for item in items}
    views = [
        node
        for node in graph.nodes
        if node.op in _CALLS and node not in writers and aliases.find(node) in written
    ]
    if views:
        reason = (
            f"the graph writes into storage its caller holds through a view (%{views[0].name}); "
            "the order of such writes against the graph's other reads is kept only in PyTorch"
        )
        return {node: reason for node in graph.nodes if node.op in _CALLS}
    reasons = {
        node: (
            f"writes into {_named(items)}, which the caller holds (an input, parameter or "
            "buffer); the backend would write into a copy"
        )
        for node, items in writers.items()
    }
    reasons.update(_returned_views(module, graph))
    return reasons


def _returned_views(module: Any, graph: Graph) -> dict[Node, str]:
    """Views of an input, parameter or buffer that the graph returns, with the views they are
    taken from: made by PyTorch, so that they stay views."""
    (output,) = graph.find_nodes(op="output")
    reasons = {}
    for node in output.all_input_nodes:
        chain = []
        while node.op in _CALLS and _is_view(module, node) and isinstance(node.args[0], Node):
            chain.append(node)
            node = node.args[0]
        if node.op in _HELD:
            for view in chain:
                reasons[view] = (
                    f"a view of %{node.name}, which the graph returns (the backend would "
                    "return a copy)"
                )
    return reasons


def _is_view(module: Any, node: Node) -> bool:
    called = attr_path.find(module, node.target) if node.op == "call_module" else None
    return bool(node.args) and view_kind(node.op, node.target, called) is not None


def _named(written: tuple[Any, ...]) -> str:
    names = [f"%{item.name}" if isinstance(item, Node) else item[1] for item in written]
    return ", ".join(names) or "its inputs"
