"""Cost analysis (torch.fx paper, section 6.3): FLOPs, bytes, parameters and memory per node.

``analyze_cost(gm, *inputs)`` propagates shapes (``ShapeProp``, on the meta device when it can:
no data, no compute) and returns a ``CostReport``: for every node its FLOPs and MACs (a
multiply-add is 1 MAC and 2 FLOPs), the bytes it reads and writes, the parameter bytes it uses
and the activation memory it allocates; totals per module path at any depth; and a peak-memory
estimate. Print the report for a summary, ``report.table(by="module", depth=1)`` for a rich
table::

    >>> import torch, fxloom
    >>> from fxloom.passes.cost import analyze_cost
    >>> gm = fxloom.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU()))
    >>> report = analyze_cost(gm, torch.Size([8, 64]))
    >>> report.macs == 8 * 64 * 32, report.flops == 2 * 8 * 64 * 32 + 8 * 32 + 8 * 32
    (True, True)
    >>> [(row.path, row.module_type, row.flops) for row in report.by_module()]
    [('(root)', '', 0), ('0', 'Linear', 33024), ('1', 'ReLU', 256)]

**FLOPs** come from ``FLOP_FORMULAS``, a table keyed by target (a function, a method name, a
module class) that ``register_flop_formula`` extends; conventions in ``fxloom.ops.flops``. A node
whose operator has no formula counts 0 FLOPs and is listed in ``report.not_counted`` (and in the
summary), never dropped silently. A node whose value holds no tensor (a size, a guard) costs
nothing.

**Memory.** Nodes run in graph order; a value is live from the node that makes it to its last
user (the graph's output keeps its values to the end); views (``VIEW_OPS``) and in-place
operations share their input's memory and extend its life instead of allocating. The peak is
the most activation memory live at once; the graph's inputs and the weights (parameters and
buffers) are accounted separately, and ``report.peak_memory_bytes`` adds them up. This is an
estimate of a forward pass: allocator rounding, workspace memory and autograd's saved tensors
are not included.

**Exported programs.** ``analyze_cost(ep)`` takes an ``ExportedProgram`` (``fxloom.export``) and
costs its ATen graph (formulas in ``fxloom.ops.aten_flops``). Its inputs are the user's only
(the lifted parameters, buffers and constants are the program's own; see ``ShapeProp``); without
inputs, the shapes export recorded (``node.meta["val"]``) are used. The placeholders lifting state
count as weights, under the module that owns them (``conv1`` for ``conv1.weight``), not as
inputs; operators whose result shares its input's memory (by their schema, ``aten.view``,
``aten.t``) are views. A model costs the same FLOPs traced or exported where the two graphs
compute the same things (export decomposes ``F.linear`` into ``t`` and ``addmm``, which count
what ``Linear`` does).

**Module paths** come from ``node.meta["nn_module_stack"]`` (the innermost module a traced node
ran in) and, for ``call_module`` nodes, the target; nodes of the root itself are ``(root)``.

What it does to the module: like ``ShapeProp``, it writes ``node.meta["tensor_meta"]`` and
``node.meta["type"]`` (unless ``mode="recorded"``); every other key, node names, the graph and
the module are unchanged.

Depends on: ``fxloom.passes.shape_prop``; ``fxloom.export``'s program (through ``passes.captured``);
rich for tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from fxloom import attr_path
from fxloom._format import describe_target
from fxloom.export.program import ExportedProgram
from fxloom.node import Node
from fxloom.ops.effects import VIEW_IF_CONTIGUOUS, VIEW_OPS, view_kind
from fxloom.ops.flops import (
    FLOP_FORMULAS,
    FlopCount,
    OpShapes,
    find_flop_formula,
    numel,
    register_flop_formula,
    tensor_metas,
)
from fxloom.ops.identity import is_inplace_name
from fxloom.ops.mutation import is_inplace_function, module_is_inplace
from fxloom.passes._cost_report import CostReport, ModuleCost, NodeCost, format_bytes, format_count
from fxloom.passes._meta_device import is_shape_spec
from fxloom.passes.captured import graph_module_of, lifted_state
from fxloom.passes.shape_prop import (
    ShapeProp,
    ShapePropError,
    TensorMetadata,
    record_captured_shapes,
)
from fxloom.pytree import tree_any, tree_map

__all__ = [
    "FLOP_FORMULAS",
    "VIEW_IF_CONTIGUOUS",
    "VIEW_OPS",
    "CostReport",
    "FlopCount",
    "ModuleCost",
    "NodeCost",
    "OpShapes",
    "analyze_cost",
    "format_bytes",
    "format_count",
    "register_flop_formula",
]

MODES = ("auto", "meta", "real", "recorded")


def analyze_cost(
    module: torch.nn.Module | ExportedProgram, *args: Any, mode: str = "auto", **kwargs: Any
) -> CostReport:
    """The cost of running ``module``'s graph on ``args``/``kwargs`` (see the module docstring).

    Inputs are given as to ``ShapeProp.propagate_meta``: tensors, ``(shape, dtype)`` pairs or
    ``torch.Size`` values, by position or by name. ``mode``:

    * ``"auto"`` (default): the meta device; if an operator fails there and the inputs are real
      tensors, real mode (``report.notes`` says so). Without inputs, the ``tensor_meta`` already
      on the nodes (from an earlier ``ShapeProp`` run) if there is any, else the shapes export
      recorded (``node.meta["val"]``, all of them fixed), else a meta run.
    * ``"meta"``, ``"real"``: that mode only (real mode needs real tensors).
    * ``"recorded"``: use the ``tensor_meta`` on the nodes; raises if they have none.

    >>> import torch, fxloom
    >>> from fxloom.passes.cost import analyze_cost
    >>> gm = fxloom.symbolic_trace(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()))
    >>> report = analyze_cost(gm, torch.Size([1, 3, 10, 10]))
    >>> report.macs  # 8 x 8 x 8 outputs, each a sum of 3 x 3 x 3 products
    13824
    >>> print(report)
    Sequential: cost from meta shapes; inputs input_1: Tensor[1, 3, 10, 10] float32
      FLOPs 28.67 K  MACs 13.82 K  (a multiply-add is 1 MAC = 2 FLOPs)
      parameters 224  weights 896 B (parameters and buffers)
      inputs 1.17 KiB  activations 4.00 KiB in all, peak 4.00 KiB at %_1
      peak memory estimate 6.05 KiB (weights + inputs + peak activations)
    """
    if mode not in MODES:
        raise ValueError(f"analyze_cost: mode must be one of {', '.join(MODES)}; got {mode!r}")
    graph = getattr(module, "graph", None)
    if graph is None:
        raise TypeError(
            f"analyze_cost needs a GraphModule, got a {type(module).__name__}; trace it first: "
            "analyze_cost(fxloom.symbolic_trace(model), *inputs)"
        )
    notes: list[str] = []
    used_mode = _propagate_shapes(module, args, kwargs, mode, notes)
    return _CostCounter(module, used_mode, notes).report()


def _propagate_shapes(
    module: torch.nn.Module, args: tuple, kwargs: dict, mode: str, notes: list[str]
) -> str:
    """Make sure every node has ``tensor_meta``/``type``; return the mode that provided them."""
    given = bool(args or kwargs)
    if mode == "recorded" or (mode == "auto" and not given and _has_recorded_shapes(module)):
        _check_recorded(module)
        return "recorded"
    if mode == "auto" and not given and record_captured_shapes(module.graph):
        return "meta"  # what export's meta kernels recorded (node.meta["val"]): no second run
    if mode == "real":
        ShapeProp(module).propagate(*args, **kwargs)
        return "real"
    try:
        ShapeProp(module).propagate_meta(*args, **kwargs)
        return "meta"
    except ShapePropError as error:
        # A TypeError (a guard rejecting an input, a wrong argument) fails for real too.
        if mode == "meta" or not _all_real(args, kwargs) or isinstance(error.__cause__, TypeError):
            raise
        notes.append(f"shapes from a real run: on the meta device, {error}")
    ShapeProp(module).propagate(*args, **kwargs)
    return "real"


def _has_recorded_shapes(module: torch.nn.Module) -> bool:
    return any("type" in node.meta for node in module.graph.nodes)


def _check_recorded(module: torch.nn.Module) -> None:
    for node in module.graph.nodes:
        if node.op != "output" and "type" not in node.meta and "tensor_meta" not in node.meta:
            raise ValueError(
                f"analyze_cost: %{node.name} has no recorded shapes (node.meta['tensor_meta']); "
                "run ShapeProp(gm).propagate(...) first, or pass inputs to analyze_cost"
            )


def _all_real(args: tuple, kwargs: dict) -> bool:
    """Whether the inputs can run for real: no shape specs, no meta tensors."""
    return not tree_any(_stands_in, (args, kwargs), is_leaf=is_shape_spec)


def _stands_in(value: Any) -> bool:
    """Whether ``value`` only describes a tensor: a shape spec or a meta tensor."""
    return is_shape_spec(value) or (isinstance(value, torch.Tensor) and value.is_meta)


class _CostCounter:
    """Walks the graph once, costing each node, then sums up memory (two linear passes)."""

    def __init__(
        self, module: torch.nn.Module | ExportedProgram, mode: str, notes: list[str]
    ) -> None:
        self.model_name = type(module).__name__
        self.lifted = lifted_state(module)  # an exported program's state, by placeholder name
        self.root = graph_module_of(module)
        self.mode = mode
        self.notes = notes
        self.modules = dict(self.root.named_modules())
        self.weight_names = _canonical_weight_names(self.root)
        self.parameter_names = {
            lifted.target for lifted in self.lifted.values() if lifted.is_parameter
        }
        self.weight_sizes: dict[str, tuple[int, int]] = {}
        self.not_counted: dict[str, list[str]] = {}
        self.shares_memory_with: dict[Node, Node] = {}  # view / in-place node -> its input

    def report(self) -> CostReport:
        graph = self.root.graph
        costs = [self.node_cost(node) for node in graph.nodes]
        peak, peak_node = _peak_activation(graph, costs, self.shares_memory_with)
        weights = {name for cost in costs for name in cost.weights}
        placeholders = [
            node for node in graph.find_nodes(op="placeholder") if node.name not in self.lifted
        ]
        return CostReport(
            model=self.model_name,
            mode=self.mode,
            nodes=costs,
            inputs=[_describe_input(node) for node in placeholders if "tensor_meta" in node.meta],
            input_bytes=sum(_nbytes(node.meta.get("tensor_meta")) for node in placeholders),
            params=sum(self.weight_sizes[name][0] for name in weights),
            param_bytes=sum(self.weight_sizes[name][1] for name in weights),
            activation_bytes=sum(cost.allocated for cost in costs),
            peak_activation_bytes=peak,
            peak_node=peak_node,
            not_counted=self.not_counted,
            notes=self.notes,
            module_types=_module_types(graph, self.modules),
            weight_sizes=self.weight_sizes,
        )

    # -------------------------------------------------------------------- one node
    def node_cost(self, node: Node) -> NodeCost:
        base = {
            "name": node.name,
            "op": node.op,
            "target": describe_target(node, "label"),
            "module_path": _module_path(node),
        }
        out = node.meta.get("tensor_meta")
        lifted = self.lifted.get(node.name) if node.op == "placeholder" else None
        if lifted is not None:  # an exported program's weight, owned by its module
            base["module_path"] = lifted.target.rpartition(".")[0]
            return NodeCost(**base, **self.weight_figures(iter([(lifted.target, lifted.tensor)])))
        if node.op == "placeholder":  # counted in report.input_bytes, not as a node's work
            return NodeCost(**base)
        if node.op == "get_attr":
            return NodeCost(**base, **self.weight_figures(self._tensors_at(node)))
        if node.op == "output" or out is None:  # no tensor made: a size, a guard
            return NodeCost(**base)
        module = self.modules.get(str(node.target)) if node.op == "call_module" else None
        weights = self.weight_figures(self._module_tensors(node, module))
        flops, counted = self.count_flops(node, out, module, base["target"])
        work = {**base, **weights, "flops": flops.flops, "macs": flops.macs, "counted": counted}
        if self._is_view(node, module):  # metadata only: nothing read, written or allocated
            self.shares_memory_with[node] = _first_input(node)
            return NodeCost(**work)
        written = _nbytes(out)
        in_place = _is_in_place(node, module)
        if in_place:  # writes into its input's memory
            self.shares_memory_with[node] = _first_input(node)
        return NodeCost(
            **work,
            bytes_read=_argument_bytes(node) + weights["param_bytes"],
            bytes_written=written,
            allocated=0 if in_place else written,
        )

    def count_flops(
        self, node: Node, out: Any, module: torch.nn.Module | None, target: str
    ) -> tuple[FlopCount, bool]:
        """The node's FLOPs and whether a formula counted them (else listed as not counted)."""
        formula = find_flop_formula(node.op, node.target, module)
        if formula is None:
            self.not_counted.setdefault(target, []).append(node.name)
            return FlopCount(0), False
        op = OpShapes(node, _shapes_of(node.args), _shapes_of(node.kwargs), out, module)
        try:
            result = formula(op)
        except Exception as error:  # a formula that does not fit this call: say so, count 0
            why = f"{target} (its FLOP formula failed: {type(error).__name__}: {error})"
            self.not_counted.setdefault(why, []).append(node.name)
            return FlopCount(0), False
        return (FlopCount(result) if isinstance(result, int) else result), True

    def weight_figures(self, tensors: Iterator[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """``params``, ``param_bytes`` and ``weights`` (names) of the named tensors."""
        names, params, nbytes = [], 0, 0
        for path, tensor in tensors:
            name = self.weight_names.get(id(tensor), path)
            is_parameter = isinstance(tensor, torch.nn.Parameter) or name in self.parameter_names
            size = tensor.numel() if is_parameter else 0
            self.weight_sizes[name] = (size, tensor.numel() * tensor.element_size())
            names.append(name)
            params += size
            nbytes += self.weight_sizes[name][1]
        return {"params": params, "param_bytes": nbytes, "weights": tuple(names)}

    def _tensors_at(self, node: Node) -> Iterator[tuple[str, torch.Tensor]]:
        value = attr_path.find(self.root, str(node.target))
        if isinstance(value, torch.Tensor):
            yield str(node.target), value

    @staticmethod
    def _module_tensors(
        node: Node, module: torch.nn.Module | None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        if module is None:
            return
        prefix = f"{node.target}."
        for name, tensor in (*module.named_parameters(), *module.named_buffers()):
            yield prefix + name, tensor

    @staticmethod
    def _is_view(node: Node, module: torch.nn.Module | None) -> bool:
        kind = view_kind(node.op, node.target, module)
        if kind == "if_contiguous":
            first = _first_input(node)
            meta = first.meta.get("tensor_meta") if first is not None else None
            return isinstance(meta, TensorMetadata) and meta.memory_format is not None
        return kind == "view"


def _is_in_place(node: Node, module: torch.nn.Module | None) -> bool:
    if node.op == "call_module":
        return module is not None and module_is_inplace(module)
    if node.op == "call_method":
        return is_inplace_name(str(node.target))
    return is_inplace_function(node.target) or node.kwargs.get("inplace") is True


def _first_input(node: Node) -> Node | None:
    for arg in node.args:
        if isinstance(arg, Node):
            return arg
    return None


def _peak_activation(
    graph: Any, costs: list[NodeCost], shares_memory_with: dict[Node, Node]
) -> tuple[int, str | None]:
    """The most activation memory live at once, and the node at which it is reached.

    A value's memory is freed after the last user of the value or of any view of it.
    """
    index: dict[Node, int] = {}
    owner: dict[Node, Node] = {}  # node -> the node whose memory its value lives in
    last_use: dict[Node, int] = {}
    for position, node in enumerate(graph.nodes):
        index[node] = position
        source = shares_memory_with.get(node)
        owner[node] = owner.get(source, source) if source is not None else node
        for used in node.all_input_nodes:
            last_use[owner[used]] = position
    frees: dict[int, list[int]] = {}
    for node, cost in zip(graph.nodes, costs):
        if cost.allocated:
            frees.setdefault(last_use.get(node, index[node]), []).append(cost.allocated)
    live = peak = 0
    peak_node = None
    for position, (node, cost) in enumerate(zip(graph.nodes, costs)):
        live += cost.allocated
        if live > peak:
            peak, peak_node = live, node.name
        live -= sum(frees.get(position, ()))
    return peak, peak_node


# ------------------------------------------------------------------------------ helpers
def _canonical_weight_names(module: torch.nn.Module) -> dict[int, str]:
    """``id(tensor) -> its first qualified name``, so tied weights are counted once."""
    names: dict[int, str] = {}
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        names.setdefault(id(tensor), name)
    return names


def _module_types(graph: Any, modules: dict[str, torch.nn.Module]) -> dict[str, str]:
    """Class names by module path: as traced (a GraphModule keeps only leaves' classes)."""
    types = {path: type(module).__name__ for path, module in modules.items() if path}
    for node in graph.nodes:
        for key, value in node.meta.get("nn_module_stack", {}).items():
            if isinstance(value, tuple) and isinstance(value[1], type):
                types[value[0]] = value[1].__name__
            elif isinstance(value, type):
                types[str(key)] = value.__name__
    return types


def _shapes_of(value: Any) -> Any:
    """``value`` with every node replaced by its ``tensor_meta`` (kept as a node without one).

    Containers come back in ``fxloom.pytree``'s ``"plain"`` form (plain lists and dicts).
    """
    return tree_map(_shape_of, value, mode="plain")


def _shape_of(value: Any) -> Any:
    return value.meta.get("tensor_meta", value) if isinstance(value, Node) else value


def _argument_bytes(node: Node) -> int:
    return sum(_nbytes(used.meta.get("tensor_meta")) for used in node.all_input_nodes)


def _nbytes(meta: Any) -> int:
    """Bytes of the tensor(s) ``meta`` describes (logical size: numel x element size)."""
    return sum(numel(tensor) * tensor.dtype.itemsize for tensor in tensor_metas(meta))


def _module_path(node: Node) -> str:
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack")
    if stack:
        key, value = next(reversed(stack.items()))
        return value[0] if isinstance(value, tuple) else str(key)
    if node.op == "get_attr":
        return str(node.target).rpartition(".")[0]
    return ""


def _describe_input(node: Node) -> str:
    meta = node.meta["tensor_meta"]
    if isinstance(meta, TensorMetadata):
        shape = ", ".join(map(str, meta.shape))
        return f"{node.name}: Tensor[{shape}] {str(meta.dtype).removeprefix('torch.')}"
    return f"{node.name}: {getattr(node.meta.get('type'), '__name__', '?')} of tensors"
