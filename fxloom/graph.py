"""``Graph``: the IR container — a doubly linked list of ``Node``s in program order.

Invariants (checked by ``Graph.lint``):

* nodes form a doubly linked list around a sentinel (``op == "root"``), in
  topological order; insert and erase are O(1);
* every node argument belongs to this graph; ``node.users`` always equals the
  set of nodes mentioning ``node`` (kept on every mutation, never rescanned);
* names are unique identifiers handed out by one ``Namespace``;
* every graph-level operation is linear (or better) in the number of nodes.

``graph.constants`` maps names to the tensors that ``get_attr`` nodes of this
graph may name when the root module does not hold them. A frontend that meets
a tensor in the program (a global, a closure; a Proxy built by hand times a
tensor) records ``get_attr _tensor_constant0`` and keeps the tensor here, so
the user's module is never modified. The branches of ``fxloom.cond`` live
here too, as ``GraphModule``s (``true_graph_0``). Filled by frontends only;
carried by ``deepcopy`` and pickling; a ``GraphModule`` built from the graph
registers each tensor as a buffer, each module as a submodule.

Example — build ``relu(x + 1)`` by hand::

    >>> import operator, torch, fxloom
    >>> g = fxloom.Graph()
    >>> x = g.placeholder("x")
    >>> y = g.call_function(operator.add, (x, 1))
    >>> z = g.call_function(torch.relu, (y,))
    >>> _ = g.output(z)
    >>> print(g)
    graph():
        %x : [num_users=1] = placeholder[target=x]
        %add : [num_users=1] = call_function[target=operator.add](args = (%x, 1), kwargs = {})
        %relu : [num_users=1] = call_function[target=torch.relu](args = (%add,), kwargs = {})
        return relu
"""

from __future__ import annotations

import copy
import inspect
import operator
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fxloom import attr_path
from fxloom._namespace import Namespace, sanitize
from fxloom.codegen import CodeGen, PythonCode
from fxloom.lint import ForeignNodeError
from fxloom.node import OPCODES, Argument, Node, Target, map_arg

# torch.fx.graph's private names for the pytree codegen, for code that imports them from there.
from fxloom.pytree_codegen import PyTreeCodeGen as _PyTreeCodeGen  # noqa: F401
from fxloom.pytree_codegen import PyTreeInfo as _PyTreeInfo  # noqa: F401

__all__ = ["CodeGen", "Graph", "PythonCode"]

_by_sort_key = operator.attrgetter("_sort_key")


def _to_none(node: Node) -> None:
    # An erased node forgets its inputs, so nothing keeps them alive through it.
    return None


class _NodeList:
    """A live view of a graph's nodes; safe to iterate while nodes are erased or inserted.

    An erased node keeps its own ``next`` pointer, so an iteration standing on
    it moves on to what followed it; erased nodes are never yielded.
    """

    __slots__ = ("_graph", "_reverse")

    def __init__(self, graph: Graph, reverse: bool = False) -> None:
        self._graph = graph
        self._reverse = reverse

    def __len__(self) -> int:
        return self._graph._len

    def __iter__(self) -> Iterator[Node]:
        root = self._graph._root
        if self._reverse:
            node = root._prev
            while node is not root:
                if not node._erased:
                    yield node
                node = node._prev
        else:
            node = root._next
            while node is not root:
                if not node._erased:
                    yield node
                node = node._next

    def __reversed__(self) -> _NodeList:
        return _NodeList(self._graph, not self._reverse)

    def __contains__(self, node: object) -> bool:
        return isinstance(node, Node) and node.graph is self._graph and not node._erased

    def __repr__(self) -> str:
        return f"<{len(self)} nodes of graph {id(self._graph):#x}>"


class _InsertPoint:
    """Sets the graph's insert point now; restores the previous one when used in ``with``."""

    __slots__ = ("_graph", "_saved")

    def __init__(self, graph: Graph, anchor: Node, after: bool) -> None:
        self._graph = graph
        self._saved = (graph._insert_anchor, graph._insert_after)
        graph._insert_anchor = anchor
        graph._insert_after = after

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: Any) -> None:
        self._graph._insert_anchor, self._graph._insert_after = self._saved


def _key_between(prev_key: tuple[int, ...] | None, next_key: tuple[int, ...] | None):
    """A sort key strictly between two neighbours' keys (``None`` is the sentinel)."""
    if next_key is None:
        return (0,) if prev_key is None else (prev_key[0] + 1,)
    if prev_key is None:
        return (next_key[0] - 1,)
    bumped = prev_key[:-1] + (prev_key[-1] + 1,)
    if bumped < next_key:
        return bumped
    depth = len(prev_key)
    if len(next_key) > depth and next_key[:depth] == prev_key:
        return prev_key + (next_key[depth] - 1,)
    return prev_key + (0,)


class Graph:
    """A program as a list of ``Node``s; see the module docstring for invariants and an example."""

    def __init__(
        self,
        owning_module: torch.nn.Module | None = None,
        tracer_cls: type | None = None,
        tracer_extras: dict[str, Any] | None = None,
    ) -> None:
        self._version = 0
        self._len = 0
        self._namespace = Namespace()
        # op -> target key -> nodes (insertion-ordered) for find_nodes.
        self._index: dict[str, dict[Any, dict[Node, None]]] = {op: {} for op in OPCODES}
        # True while every node was appended at the end, so index buckets are
        # already in graph order and find_nodes need not sort.
        self._in_append_order = True
        self._candidate_names: dict[Any, str] = {}
        self._root = Node(self, "", "root", "", (), {})
        self._root._sort_key = None  # type: ignore[assignment]
        self._insert_anchor: Node = self._root
        self._insert_after = False
        self._owning_module_ref: weakref.ReferenceType | None = None
        self.owning_module = owning_module
        # Accepted and carried for torch.fx compatibility; nothing in fxloom reads them.
        self._tracer_cls = tracer_cls
        self._tracer_extras = tracer_extras
        self.constants: dict[str, torch.Tensor] = {}  # see the module docstring
        self._codegen = CodeGen()  # frames the generated function; see set_codegen

    # ------------------------------------------------------------- properties
    @property
    def nodes(self) -> _NodeList:
        """A live view of the nodes in order; ``reversed(graph.nodes)`` walks backwards."""
        return _NodeList(self)

    @property
    def owning_module(self) -> torch.nn.Module | None:
        """The module whose attributes ``get_attr``/``call_module`` targets name, if any."""
        ref = self._owning_module_ref
        return ref() if ref is not None else None

    @owning_module.setter
    def owning_module(self, module: torch.nn.Module | None) -> None:
        self._owning_module_ref = weakref.ref(module) if module is not None else None

    def _changed(self) -> None:
        # Any edit that can change generated code bumps the version; a
        # GraphModule compares it to decide whether its code is stale.
        self._version += 1

    # --------------------------------------------------------------- creation
    def create_node(
        self,
        op: str,
        target: Target,
        args: tuple[Argument, ...] | None = None,
        kwargs: dict[str, Argument] | None = None,
        name: str | None = None,
        type_expr: Any | None = None,
    ) -> Node:
        """Create a node and insert it at the current insert point (the end by default).

        ``name`` is a wish: it is made unique (``add`` -> ``add_1``) and a valid
        identifier. See ``inserting_before``/``inserting_after`` to move the
        insert point.
        """
        candidate = name if name else self._candidate_name(op, target)
        args = () if args is None else args
        kwargs = {} if kwargs is None else kwargs
        node = Node(self, candidate, op, target, args, kwargs, type_expr)
        # Named only once it is valid: a rejected node must not use up its name.
        node._name = self._namespace.create_name(candidate)
        anchor = self._insert_anchor
        if self._insert_after:
            while anchor._erased:
                anchor = anchor._prev
            self._link_before(anchor._next, node)
            self._insert_anchor = node
        else:
            while anchor._erased:
                anchor = anchor._next
            self._link_before(anchor, node)
        self._len += 1
        self._index_add(node)
        return node

    def _candidate_name(self, op: str, target: Target) -> str:
        if op == "output":
            return "output"
        if op == "placeholder":
            return str(target).lstrip("*")
        key = (op, target) if op != "call_function" else target
        try:
            cached = self._candidate_names.get(key)
        except TypeError:  # an unhashable callable: no caching
            cached = None
        if cached is not None:
            return cached
        if op == "call_function":
            raw = getattr(target, "__name__", None) or type(target).__name__
        else:
            raw = str(target)
        candidate = sanitize(raw)
        try:
            self._candidate_names[key] = candidate
        except TypeError:
            pass
        return candidate

    def placeholder(
        self,
        name: str,
        type_expr: Any | None = None,
        default_value: Any = inspect.Signature.empty,
    ) -> Node:
        """Add a function input called ``name``; ``"*args"``/``"**kwargs"`` make variadic ones.

        ``default_value`` becomes the parameter's default in generated code.
        """
        args = () if default_value is inspect.Signature.empty else (default_value,)
        return self.create_node("placeholder", name, args=args, type_expr=type_expr)

    def get_attr(self, qualified_name: str, type_expr: Any | None = None) -> Node:
        """Read the attribute ``qualified_name`` (e.g. ``"linear.weight"``) of the root module.

        Warns (``UserWarning``, as torch.fx) when the graph's owning module has
        nothing at that path: the code would fail when it runs.
        """
        if self.owning_module is not None and qualified_name not in self.constants:
            self._warn_if_missing("get_attr", qualified_name, object)
        return self.create_node("get_attr", qualified_name, type_expr=type_expr)

    def call_function(
        self,
        the_function: Callable[..., Any],
        args: tuple[Argument, ...] | None = None,
        kwargs: dict[str, Argument] | None = None,
        type_expr: Any | None = None,
    ) -> Node:
        """Call a free function (torch, operator, math, builtins or user code)."""
        return self.create_node("call_function", the_function, args, kwargs, type_expr=type_expr)

    def call_method(
        self,
        method_name: str,
        args: tuple[Argument, ...] | None = None,
        kwargs: dict[str, Argument] | None = None,
        type_expr: Any | None = None,
    ) -> Node:
        """Call method ``method_name`` on ``args[0]`` with the remaining arguments."""
        return self.create_node("call_method", method_name, args, kwargs, type_expr=type_expr)

    def call_module(
        self,
        module_name: str,
        args: tuple[Argument, ...] | None = None,
        kwargs: dict[str, Argument] | None = None,
        type_expr: Any | None = None,
    ) -> Node:
        """Call the submodule at ``module_name`` (qualified, e.g. ``"layer1.0.conv"``).

        Warns (``UserWarning``, as torch.fx) when the graph's owning module has
        no submodule there.
        """
        if self.owning_module is not None:
            self._warn_if_missing("call_module", module_name, torch.nn.Module)
        return self.create_node("call_module", module_name, args, kwargs, type_expr=type_expr)

    def _warn_if_missing(self, op: str, target: str, kind: type) -> None:
        owner = self.owning_module
        value = attr_path.find(owner, target)
        if value is not attr_path.MISSING and isinstance(value, kind):
            return
        what = "submodule" if kind is torch.nn.Module else "attribute"
        warnings.warn(
            f"Attempted to insert a {op} Node with no underlying reference in the owning "
            f"GraphModule! {type(owner).__name__} has no {what} {target!r}; add it first "
            "(GraphModule.add_submodule, register_parameter or register_buffer), or the "
            "generated code fails when it runs",
            UserWarning,
            stacklevel=3,
        )

    def output(self, result: Argument, type_expr: Any | None = None) -> Node:
        """Add the ``return`` of the program: ``result`` is the returned value."""
        return self.create_node("output", "output", (result,), type_expr=type_expr)

    # ------------------------------------------------------------ insert point
    def inserting_before(self, n: Node | None = None) -> _InsertPoint:
        """Insert new nodes before ``n`` (``None``: at the start of the graph).

        Works as a context manager (restoring the previous point on exit) or as
        a plain call that sets the insert point permanently.
        """
        if n is None:
            return self.inserting_after(self._root)
        self._check_owned(n, "insert before")
        return _InsertPoint(self, n, after=False)

    def inserting_after(self, n: Node | None = None) -> _InsertPoint:
        """Insert new nodes after ``n`` (``None``: at the end of the graph).

        Successive nodes keep their creation order: the first goes right after
        ``n``, the next right after the first, and so on.
        """
        if n is None:
            return self.inserting_before(self._root)
        self._check_owned(n, "insert after")
        return _InsertPoint(self, n, after=True)

    def _check_owned(self, n: Node, action: str) -> None:
        if n.graph is not self:
            raise ForeignNodeError(f"cannot {action} %{n.name}: it belongs to another graph")
        if n._erased:
            raise ForeignNodeError(f"cannot {action} %{n.name}: it was erased from the graph")

    # ------------------------------------------------------------ list surgery
    def _link_before(self, anchor: Node, x: Node) -> None:
        """Place ``x`` immediately before ``anchor`` (the sentinel means: at the end)."""
        if x._erased:
            raise ForeignNodeError(f"%{x.name} was erased from the graph and cannot be re-inserted")
        if x._prev is not x:  # a move: unlink first; index order no longer = graph order
            x._prev._next = x._next
            x._next._prev = x._prev
            self._in_append_order = False
        prev = anchor._prev
        root = self._root
        if anchor is not root:
            self._in_append_order = False
        x._sort_key = _key_between(
            None if prev is root else prev._sort_key,
            None if anchor is root else anchor._sort_key,
        )
        x._prev = prev
        x._next = anchor
        prev._next = x
        anchor._prev = x
        self._version += 1

    def erase_node(self, to_erase: Node) -> None:
        """Remove ``to_erase``; it must have no users left (replace its uses first)."""
        if to_erase.graph is not self:
            raise ForeignNodeError(f"cannot erase %{to_erase.name}: it belongs to another graph")
        if to_erase._erased:
            raise ValueError(f"%{to_erase.name} was already erased")
        if to_erase.users:
            users = ", ".join(f"%{u.name}" for u in list(to_erase.users)[:5])
            more = "" if len(to_erase.users) <= 5 else f" and {len(to_erase.users) - 5} more"
            raise RuntimeError(
                f"cannot erase %{to_erase.name}: it still has {len(to_erase.users)} user(s): "
                f"{users}{more}. Replace its uses first "
                f"(%{to_erase.name}.replace_all_uses_with(other)) or erase the users"
            )
        if to_erase._input_nodes:
            for node in to_erase._input_nodes:
                del node.users[to_erase]
            to_erase._input_nodes = {}
            if to_erase._flat:
                to_erase._args = tuple([None if type(a) is Node else a for a in to_erase._args])
            else:
                to_erase._args = map_arg(to_erase._args, _to_none)
                to_erase._kwargs = map_arg(to_erase._kwargs, _to_none)
        prev, nxt = to_erase._prev, to_erase._next
        prev._next = nxt
        nxt._prev = prev
        to_erase._erased = True
        self._index_remove(to_erase)
        self._len -= 1
        self._version += 1

    # ------------------------------------------------------------------ index
    def _reindex(self, node: Node, op: str, target: Target) -> None:
        """Change ``node``'s op/target, keeping the find_nodes index right."""
        self._index_remove(node)
        node._op, node._target = op, target
        self._index_add(node)
        self._in_append_order = False  # the node now sits at its bucket's end
        self._version += 1

    def _index_add(self, node: Node) -> None:
        buckets = self._index[node._op]
        try:
            bucket = buckets.get(node._target)
        except TypeError:
            key = ("<unhashable>", id(node._target))
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = {}
        else:
            if bucket is None:
                bucket = buckets[node._target] = {}
        bucket[node] = None

    def _index_remove(self, node: Node) -> None:
        buckets = self._index[node._op]
        try:
            bucket = buckets[node._target]
        except TypeError:
            bucket = buckets[("<unhashable>", id(node._target))]
        del bucket[node]

    def find_nodes(self, *, op: str, target: Target | None = None, sort: bool = True) -> list[Node]:
        """The nodes with opcode ``op`` (and ``target``, if given), from an index.

        Costs O(matches), not O(graph). With ``sort`` (the default) they come
        in graph order.
        """
        buckets = self._index.get(op)
        if buckets is None:
            raise ValueError(f"unknown opcode {op!r}; a node's op is one of: {', '.join(OPCODES)}")
        if target is None:
            found = [node for bucket in buckets.values() for node in bucket]
            ordered = len(buckets) <= 1
        else:
            try:
                bucket = buckets.get(target)
            except TypeError:
                bucket = buckets.get(("<unhashable>", id(target)))
            found = list(bucket) if bucket else []
            ordered = True
        if sort and not (ordered and self._in_append_order):
            found.sort(key=_by_sort_key)
        return found

    # ------------------------------------------------------------------ copies
    def node_copy(
        self, node: Node, arg_transform: Callable[[Node], Argument] = lambda x: x
    ) -> Node:
        """Copy ``node`` (possibly of another graph) into this graph at the insert point.

        ``arg_transform`` maps each node argument to its counterpart here,
        typically a lookup in a dict from old to new nodes. ``meta`` is copied
        shallowly; the name is kept when free.
        """
        args = map_arg(node._args, arg_transform)
        kwargs = map_arg(node._kwargs, arg_transform)
        copied = self.create_node(node._op, node._target, args, kwargs, node._name, node.type)
        copied.meta = copy.copy(node.meta)
        return copied

    def graph_copy(
        self, g: Graph, val_map: dict[Node, Node], return_output_node: bool = False
    ) -> Argument | None:
        """Copy every node of ``g`` except its output into this graph.

        ``val_map`` is filled with old -> new nodes; entries already present
        override copying (use it to substitute inputs). Returns the copied value
        ``g`` returned (or the output node itself with ``return_output_node``),
        or ``None`` when ``g`` has no output.
        """
        output_value = None
        for node in g.nodes:
            if node in val_map:
                continue
            if node._op == "output":
                output_value = map_arg(node._args[0], val_map.__getitem__)
                return node if return_output_node else output_value
            val_map[node] = self.node_copy(node, val_map.__getitem__)
        return output_value

    def __deepcopy__(self, memo: dict[int, Any]) -> Graph:
        memo = memo if memo is not None else {}
        new = Graph(tracer_cls=self._tracer_cls, tracer_extras=self._tracer_extras)
        memo[id(self)] = new
        val_map: dict[Node, Node] = {}
        for node in self.nodes:
            val_map[node] = memo[id(node)] = new.node_copy(node, val_map.__getitem__)
        # Metadata last: nodes it mentions are already in memo and map to the copies.
        for old, copied in val_map.items():
            copied.meta = copy.deepcopy(old.meta, memo)
        new.constants = copy.deepcopy(self.constants, memo)
        new._codegen = copy.deepcopy(self._codegen, memo)
        return new

    def __reduce__(self) -> tuple:
        # Pickled as a flat list of records: a linked list of nodes would make
        # pickle recurse once per node and overflow the stack on big graphs.
        from fxloom._graph_pickle import graph_from_records, graph_to_records

        return (graph_from_records, (graph_to_records(self),), {"_codegen": self._codegen})

    # ------------------------------------------------------------------ passes
    def eliminate_dead_code(self, is_impure_node: Callable[[Node], bool] | None = None) -> bool:
        """Erase nodes whose values are unused, keeping impure ones; return whether any went.

        With ``is_impure_node``, a node is kept when it says so. Without, as in torch.fx,
        unused calls go, and so do writes nobody reads: an in-place update (``x.add_(y)``,
        ``relu(inplace=True)``) of a value that is no input, parameter or buffer and that no
        kept node reads afterwards, through any alias; and an unpacking check
        (``check_length``) whose unpacked items all went. Other side effects stay
        (``print``, guards, ``out=``). ``fxloom._dead_code`` has the rules, and where they
        keep more than torch.fx does. One backward pass suffices: erasing a node can only
        free nodes before it.
        """
        if is_impure_node is None:
            from fxloom._dead_code import dead_nodes

            dead = dead_nodes(self)
            is_impure = lambda node: node not in dead  # noqa: E731
        else:
            is_impure = is_impure_node
        root = self._root
        node = root._prev
        changed = False
        while node is not root:
            previous = node._prev
            if not node.users and not is_impure(node):
                self.erase_node(node)
                changed = True
            node = previous
        return changed

    def lint(self, root: torch.nn.Module | None = None) -> None:
        """Check the invariants; raise ``GraphLintError`` saying what is wrong and how to fix it.

        Checks: ownership, no erased or foreign nodes used, topological order,
        unique names, users consistent with arguments, exactly one output at
        the end, and — when a root module is given or owns the graph — that
        every ``get_attr``/``call_module`` target exists in it.
        """
        from fxloom.lint import lint_graph

        lint_graph(self, root if root is not None else self.owning_module)

    # --------------------------------------------------------------- printing
    def __str__(self) -> str:
        from fxloom._format import graph_to_str

        return graph_to_str(self)

    def __repr__(self) -> str:
        return f"<fxloom.Graph with {self._len} nodes>"

    def print_tabular(self, file: Any = None) -> None:
        """Print the nodes as a table (opcode, name, target, args, kwargs) using ``rich``."""
        from fxloom._format import print_tabular

        print_tabular(self, file)

    # ----------------------------------------------------------------- codegen
    def python_code(self, root_module: str = "self", *, verbose: bool = False) -> PythonCode:
        """Generate the source of a ``forward`` computing this graph, and the globals it needs.

        ``root_module`` is the name under which ``get_attr``/``call_module``
        targets are looked up (usually ``"self"``). ``verbose`` adds each node's
        user source location as a comment.
        """
        from fxloom.codegen import generate

        return generate(self, root_module, verbose=verbose)

    def set_codegen(self, codegen: CodeGen) -> None:
        """Frame this graph's generated function with ``codegen`` (see ``fxloom.CodeGen``).

        A ``GraphModule`` running the graph regenerates its code on next use.
        """
        self._codegen = codegen
        self._version += 1

    def process_inputs(self, *args: Any) -> Any:
        """The placeholders' values for a call with ``args`` (``CodeGen.process_inputs``)."""
        return self._codegen.process_inputs(*args)

    def process_outputs(self, out: Any) -> Any:
        """The caller's result for the output value ``out`` (``CodeGen.process_outputs``)."""
        return self._codegen.process_outputs(out)
