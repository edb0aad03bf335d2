"""The graph a compiled function records: inputs by source, torch calls as nodes, outputs.

The bytecode interpreter works on real Python values, with each tensor replaced by a
``StandIn`` (shape, dtype, device; no data). ``GraphBuilder`` keeps, for every stand-in
that belongs to the graph, the node that computes it, and records torch-level calls in the
same IR ``symbolic_trace`` produces (``call_function``, ``call_method``, ``call_module``),
with ``meta["val"]`` the stand-in and the user's file:line stamped on each node::

    graph input 0  <- x               (placeholder x)
    graph input 1  <- self.fc.weight  (placeholder self_fc_weight: read at call time)
    torch.relu(x)  -> relu            (call_function, meta["val"] = StandIn(...))

An input whose sizes the size policy makes symbolic (``fxloom.bytecode.dynamic``) gets a
stand-in with ``torch.SymInt`` sizes; a symbolic size the program passes to an operator (``x.view(
x.shape[0], -1)``) or returns becomes nodes that compute it from the inputs when the graph
runs (``aten.sym_size.int(x, 0)``: ``SizeNodes``), so the graph runs at every size the entry's
guard admits.

A tensor met with no source (made by a library's Python code, held by an object the program
built) becomes a constant of the graph module (``get_attr``), held by reference.

Unused nodes are removed when the graph is finished, except those that write (the IR's
``Node.is_impure``) and those whose eager kernel may raise on its inputs' data (an index out
of range, a singular matrix: ``RAISES_ON_DATA``, marked ``meta["raises_on_data"]``): eager
raises there at every call, so the compiled call must too. What eager refuses on metadata
alone (shapes, dtypes) already raises while recording (``fxloom.values.eager_checks``).

Depends on the IR, ``fxloom.values`` (stand-ins, metadata mode, module stack),
``fxloom.source_location`` and ``fxloom.bytecode.sources``.
"""

from __future__ import annotations

import operator
import re
import types
from typing import Any

import torch

from fxloom._torch_compat import python_dispatcher
from fxloom.bytecode.sources import Source
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.source_location import SourceLocation, format_stack_trace
from fxloom.values.metadata_mode import MetadataMode
from fxloom.values.module_stack import ModuleStack
from fxloom.values.provenance import WHERE_KEYS, location_of, stamp_node
from fxloom.values.stand_in import StandIn
from fxloom.values.symbolic_scalars import SYMBOLIC_TYPES

__all__ = ["GraphBuilder", "RAISES_ON_DATA"]

# Torch functions (by ``__name__``) and Tensor methods whose eager kernels raise depending on
# their inputs' data, not only on metadata: kept in the graph even when their result is unused.
RAISES_ON_DATA = frozenset({
    "index_select", "gather", "take", "take_along_dim", "embedding", "embedding_bag",
    "one_hot", "index_add", "index_copy", "index_fill", "index_reduce", "scatter",
    "scatter_add", "scatter_reduce", "index_put", "nll_loss", "cross_entropy",
    "linalg_inv", "inverse", "linalg_cholesky", "cholesky", "linalg_solve", "solve",
})  # fmt: skip
# Modules (called as leaves) whose forward is one of the above.
_MODULES_RAISING_ON_DATA = (
    torch.nn.Embedding,
    torch.nn.EmbeddingBag,
    torch.nn.NLLLoss,
    torch.nn.CrossEntropyLoss,
)

_NOT_IDENTIFIER = re.compile(r"\W|^(?=\d)")
_OPERATIONS = frozenset({"call_function", "call_method", "call_module"})
_ITEM_META = WHERE_KEYS  # an item of a result: its op's


class GraphBuilder:
    """Records one graph; see the module docstring."""

    # Whether a number read while recording may become a graph input (``number_input``); a
    # ``fxloom.cond`` branch's graph lifts tensors only, so a number it reads stays static.
    takes_numbers = True

    def __init__(self) -> None:
        self.graph = Graph()
        self.inputs: list[Source] = []  # graph input i is read from inputs[i] at call time
        self.source_of_input: dict[int, Source] = {}  # id(stand-in of an input) -> its source
        # Every source a tensor input was read from (not the held ones), with the tensor: two
        # sources of one tensor share its graph input, which the entry's guards must justify
        # (``Recording.guard_identities``).
        self.reads: dict[Source, torch.Tensor] = {}
        self.held: dict[int, torch.Tensor] = {}  # input index -> the parameter or buffer itself
        # id(stand-in of an input) -> the input's own class (Parameter, a tensor subclass)
        self.real_types: dict[int, type] = {}
        self.modules: dict[str, torch.nn.Module] = {}  # call_module targets, held by reference
        self.constants: dict[str, torch.Tensor] = {}  # get_attr targets, held by reference
        self.where: tuple[tuple[types.CodeType, int], ...] = ()  # the interpreter's frames
        self._node_of: dict[int, Node] = {}
        self._stand_in_of: dict[int, StandIn] = {}  # id(real tensor) -> its stand-in
        self._alive: list[Any] = []  # keeps ids above from being reused while recording
        self._traces: dict[tuple, tuple[str, SourceLocation | None]] = {}
        self.metadata = MetadataMode()
        self.module_stack = ModuleStack()  # the modules whose forward is being interpreted
        self.size_nodes: Any = None  # ``SizeNodes``, made with the first symbolic input
        # symbols of numbers the graph reads from tensor data (``data_number``): no example
        self.data_symbols: set[Any] = set()

    # ------------------------------------------------------------ values
    def node_of(self, value: Any) -> Node | None:
        return self._node_of.get(id(value))

    def real_type(self, stand_in: StandIn) -> type:
        """The class the value a stand-in stands for has when the graph runs."""
        return self.real_types.get(id(stand_in), torch.Tensor)

    def input(
        self, source: Source, tensor: torch.Tensor, held: bool = False, sizes: list | None = None
    ) -> StandIn:
        """The stand-in of a tensor read from ``source`` (one graph input per tensor object,
        however many sources hold it: the entry guards which do, ``y is x``).
        ``held``: a parameter or buffer of the root, which the module epoch guard keeps the
        same object, so the entry passes the object itself instead of reading the source.
        ``sizes``: its sizes with ``torch.SymInt`` for the symbolic ones (None: as it is)."""
        if not held:
            self.reads.setdefault(source, tensor)
        stand_in = self._stand_in_of.get(id(tensor))
        if stand_in is None:
            name = _NOT_IDENTIFIER.sub("_", source.text)
            node = self.graph.placeholder(name)
            if sizes is None:
                stand_in = self._register(StandIn.like(tensor), node)
            else:
                stand_in = self._register(StandIn.with_sizes(tensor, sizes), node)
                self._symbolic_sizes(sizes).bind_sizes(node, sizes)
            self.real_types[id(stand_in)] = type(tensor)
            if held:
                self.held[len(self.inputs)] = tensor
            self.inputs.append(source)
            self.source_of_input[id(stand_in)] = source
            self._remember(tensor, stand_in)
        return stand_in

    def number_input(self, source: Source, value: Any) -> Any:
        """``value``, the ``torch.SymInt`` or ``SymFloat`` of a number read from ``source``
        (``fxloom.bytecode.dynamic``), as a graph input: the nodes computing sizes and
        scalars from it read that input."""
        size_nodes = self._symbolic_sizes([value])
        symbol = value.node.expr
        if symbol not in size_nodes.sources:
            node = self.graph.placeholder(_NOT_IDENTIFIER.sub("_", source.text))
            node.meta["val"] = value
            size_nodes.bind_scalar(symbol, node)
            self.inputs.append(source)
        return value

    def data_number(self, tensor: StandIn, env: Any, what: str) -> Any:
        """The number ``tensor.item()`` reads, kept in the graph: a ``call_method item`` node
        whose value is a new symbol of ``env`` with no example (``torch.SymFloat`` for a
        floating tensor, ``torch.SymInt`` for an integer one). The program may compute with
        it and pass it to operators; where its Python needs the number itself (a branch,
        ``int()``, a native function), the ShapeEnv cannot decide and capture breaks there,
        with the number a graph output (``is_data``)."""
        from fxloom.values.symbolic.data_dependent import unbacked_scalar

        value = unbacked_scalar(env, tensor.dtype, what)
        node = self._stamped(self.graph.call_method("item", (self.argument(tensor),)))
        node.meta["val"] = value
        if self.size_nodes is None:
            from fxloom.values.symbolic.size_nodes import SizeNodes

            self.size_nodes = SizeNodes(self.graph, env, self._size_stamp)
        self.size_nodes.bind_scalar(value.node.expr, node)
        self.data_symbols.add(value.node.expr)
        return value

    def is_data(self, value: Any) -> bool:
        """Whether the symbolic number ``value`` is computed from numbers read from data."""
        return bool(self.data_symbols) and not self.data_symbols.isdisjoint(
            value.node.expr.free_symbols
        )

    def constant(self, tensor: torch.Tensor) -> StandIn:
        """The stand-in of a tensor the graph holds as a constant (``get_attr``)."""
        stand_in = self._stand_in_of.get(id(tensor))
        if stand_in is None:
            name = f"_constant_{len(self.constants)}"
            self.constants[name] = tensor
            stand_in = self._register(
                StandIn.like(tensor), self._stamped(self.graph.get_attr(name))
            )
            self._remember(tensor, stand_in)
        return stand_in

    def adopt(self, value: Any) -> Any:
        """``value`` as the program may hold it: a real tensor becomes a graph constant."""
        if isinstance(value, torch.Tensor) and id(value) not in self._node_of:
            return self.constant(value)
        return value

    # ------------------------------------------------------------ recording
    def call(self, op: str, target: Any, args: tuple, kwargs: dict) -> Any:
        """Record ``target(*args, **kwargs)`` (as ``op``) and return its stand-in result."""
        if op == "call_function" and type(target) is types.BuiltinFunctionType:
            args, kwargs = _decided_bools(args), _decided_bools(kwargs)
        if self.size_nodes is None:
            with self.metadata:
                result = _run(op, target, args, kwargs, self.modules)
        else:
            result = self._run_symbolic(op, target, args, kwargs)
        node = self._stamped(
            self.graph.create_node(op, target, self.argument(args), self.argument(kwargs))
        )
        if _raises_on_data(op, target, args, self.modules):
            node.meta["raises_on_data"] = True
        return self._result(node, result)

    def raises_on_data(self, op: str, target: Any, args: tuple) -> bool:
        """Whether the eager kernel of this call may raise on its inputs' data."""
        return _raises_on_data(op, target, args, self.modules)

    def record_known(self, target: Any, args: tuple, result: Any, name: str, **meta: Any) -> Any:
        """Record ``target(*args)`` as a node called ``name``, whose stand-in ``result`` is
        already known, without running it (``fxloom.cond``: its branches were interpreted
        instead); ``meta`` joins the node's."""
        node = self.graph.create_node("call_function", target, self.argument(args), name=name)
        self._stamped(node)
        node.meta.update(meta)
        return self._result(node, result)

    def hold(self, name: str, value: Any) -> Node:
        """A ``get_attr`` node reading ``value`` (a branch of ``fxloom.cond``, a
        ``GraphModule``), which the graph module holds as ``name``."""
        self.constants[name] = value
        return self._stamped(self.graph.get_attr(name))

    def record_effect(self, target: Any, args: tuple) -> None:
        """Record a call the graph makes for its effect on global state (no value)."""
        self._stamped(self.graph.call_function(target, self.argument(args)))

    def argument(self, value: Any) -> Any:
        """``value`` as a node argument: stand-ins and real tensors become nodes."""
        kind = type(value)
        if kind is StandIn or isinstance(value, torch.Tensor):
            node = self._node_of.get(id(value))
            return node if node is not None else self._node_of[id(self.constant(value))]
        if kind is tuple or kind is list:
            return kind(self.argument(item) for item in value)
        if kind is dict:
            return {key: self.argument(item) for key, item in value.items()}
        if kind is slice:
            return slice(*(self.argument(part) for part in (value.start, value.stop, value.step)))
        if kind in SYMBOLIC_TYPES:  # a symbolic size: the nodes computing it from the inputs
            return self.size_nodes.value(value)
        if kind is torch.Size and self.size_nodes is not None:
            return tuple(self.argument(item) for item in value)
        return value

    def module_path(self, module: torch.nn.Module, path: str) -> str:
        """The ``call_module`` target of ``module`` (``path``: its place under the root)."""
        target = path or "self"
        held = self.modules.setdefault(target, module)
        if held is not module:  # two modules at one spelling: keep both
            target = f"{target}_{len(self.modules)}"
            self.modules[target] = module
        return target

    def finish(self, outputs: list[Any], class_name: str) -> GraphModule:
        self.graph.output(tuple(self.argument(value) for value in outputs))
        self.graph.eliminate_dead_code(_kept)
        root: dict[str, Any] = {**self.modules, **self.constants}
        return GraphModule(root, self.graph, class_name)

    # ------------------------------------------------------------ helpers
    def _run_symbolic(self, op: str, target: Any, args: tuple, kwargs: dict) -> Any:
        """``_run`` on symbolic sizes, with torch's Python kernels (C++ composites read sizes
        as ints). A size whose being 1 the kernel could not decide is taken as not 1 (torch's
        size-oblivious broadcasting); where that contradicts the example (a real broadcast of
        a size-1 input), the operator runs again deciding by the example, under a guard."""
        env = self.size_nodes.env
        try:
            with env.rollback_on_error(), self.metadata, python_dispatcher():
                return _run(op, target, args, kwargs, self.modules)
        except Exception:
            if not env.backed_size_oblivious:
                raise
        with env.by_example(), self.metadata, python_dispatcher():
            return _run(op, target, args, kwargs, self.modules)

    def _symbolic_sizes(self, sizes: list) -> Any:
        if self.size_nodes is None:
            from fxloom.values.symbolic.size_nodes import SizeNodes

            env = next(size for size in sizes if isinstance(size, SYMBOLIC_TYPES)).node.env
            self.size_nodes = SizeNodes(self.graph, env, self._size_stamp)
        return self.size_nodes

    def _size_stamp(self) -> dict:
        """The metadata of a size node: where and inside which modules it was needed."""
        node_meta: dict = {}
        where = self._traces.get(self.where)
        stamp_node(node_meta, modules=self.module_stack.entries, source=where)
        return node_meta

    def _register(self, stand_in: StandIn, node: Node) -> StandIn:
        node.meta["val"] = stand_in
        self._node_of[id(stand_in)] = node
        self._alive.append(stand_in)
        return stand_in

    def _remember(self, tensor: torch.Tensor, stand_in: StandIn) -> None:
        self._stand_in_of[id(tensor)] = stand_in
        self._alive.append(tensor)

    def _result(self, node: Node, result: Any) -> Any:
        if isinstance(result, StandIn):
            return self._register(result, node)
        if isinstance(result, tuple | list) and any(isinstance(item, StandIn) for item in result):
            node.meta["val"] = result
            for index, item in enumerate(result):
                if isinstance(item, StandIn):
                    item_node = self.graph.call_function(operator.getitem, (node, index))
                    item_node.meta.update(
                        {key: node.meta[key] for key in _ITEM_META if key in node.meta}
                    )
                    self._register(item, item_node)
            return result
        node.meta["val"] = result
        return result

    def _stamped(self, node: Node) -> Node:
        """``node`` with the metadata every frontend gives an operation: where it came from,
        the modules it is inside, and what made it (``source_fn_stack``)."""
        made_by = None
        if node.op in _OPERATIONS:
            made_by = self._module_class(node.target) if node.op == "call_module" else node.target
            made_by = (node.name, made_by)
        found = self._traces.get(self.where)
        if found is None:
            locations = [
                location_of(code, line or code.co_firstlineno) for code, line in self.where
            ]
            found = (format_stack_trace(locations), locations[-1] if locations else None)
            self._traces[self.where] = found
        # ``entries`` is a dict no later call changes (``ModuleStack.enter`` makes a new one).
        stamp_node(node.meta, modules=self.module_stack.entries, made_by=made_by, source=found)
        return node

    def _module_class(self, target: str) -> type:
        module = self.modules.get(target)
        return type(module) if module is not None else torch.nn.Module


def _kept(node: Node) -> bool:
    """Whether dead-code elimination keeps ``node`` unused (see the module docstring)."""
    return node.is_impure() or node.meta.get("raises_on_data", False)


def _raises_on_data(op: str, target: Any, args: tuple, modules: dict) -> bool:
    """Whether the eager kernel of this call may raise on its inputs' data."""
    if op == "call_module":
        return isinstance(modules.get(target), _MODULES_RAISING_ON_DATA)
    if target is operator.getitem:  # x[i] with a tensor of indices: one may be out of range
        index = args[1] if len(args) > 1 else None
        items = index if type(index) is tuple else (index,)
        return any(isinstance(item, torch.Tensor) and item.dtype != torch.bool for item in items)
    name = target if op == "call_method" else getattr(target, "__name__", None)
    return name in RAISES_ON_DATA


def _decided_bools(values: Any) -> Any:
    """``values`` (a tuple of arguments or a dict of keywords) with each ``torch.SymBool`` made
    the bool it is, under the ShapeEnv's guard (one it holds already where the program tested
    it): torch's C functions take a plain bool (``is_causal=q_len > 1 and mask is None``,
    where ``and`` hands on the SymBool it tested, gives ``scaled_dot_product_attention``
    one)."""
    if type(values) is dict:
        if not any(type(value) is torch.SymBool for value in values.values()):
            return values
        return {key: _decided_bool(value) for key, value in values.items()}
    if not any(type(value) is torch.SymBool for value in values):
        return values
    return tuple(_decided_bool(value) for value in values)


def _decided_bool(value: Any) -> Any:
    return bool(value) if type(value) is torch.SymBool else value


def _run(op: str, target: Any, args: tuple, kwargs: dict, modules: dict) -> Any:
    if op == "call_function":
        return target(*args, **kwargs)
    if op == "call_method":
        return getattr(args[0], target)(*args[1:], **kwargs)
    # ``forward``, not the call: the module's hooks run when the graph runs, not now.
    return modules[target].forward(*args, **kwargs)
