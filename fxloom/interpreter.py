"""Run a graph node by node (``Interpreter``) or rebuild it symbolically (``Transformer``).

``Interpreter`` executes a ``GraphModule``'s graph one node at a time, with one
overridable method per opcode, so most analyses and rewrites are a small
subclass. ``Transformer`` is an interpreter whose values are ``Proxy`` objects:
running it records a new graph, and ``transform()`` returns it as a new
``GraphModule``.

Depends on the IR (``node``, ``graph``, ``graph_module``) and, for
``Transformer`` only, on ``Proxy`` and ``GraphAppendingTracer`` to record nodes.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import torch

from fxloom import attr_path
from fxloom._notes import add_note
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.immutable_collections import immutable_dict, immutable_list
from fxloom.lint import LEAF_ARGUMENT_TYPES
from fxloom.liveness import last_uses
from fxloom.node import OPCODES, Argument, Node, Target
from fxloom.proxy import Proxy
from fxloom.pytree import container_type
from fxloom.tracer import GraphAppendingTracer
from fxloom.values.provenance import PROVENANCE_KEYS

__all__ = ["Interpreter", "Transformer", "CARRIED_META"]

_NO_INPUT = object()


class Interpreter:
    """Execute ``module.graph`` node by node; override methods to change what a node does.

    The overridable methods, by who calls whom::

        run(*args, initial_env=None)        (boxed_run(args_list): run on a list it empties)
          +-- run_node(n)                   once per node, in graph order
                +-- fetch_args_kwargs_from_env(n)
                |     +-- map_nodes_to_values(args, n)
                +-- placeholder(target, args, kwargs)     next positional input
                +-- get_attr(target, args, kwargs)        +-- fetch_attr(target)
                +-- call_function(target, args, kwargs)
                +-- call_method(target, args, kwargs)
                +-- call_module(target, args, kwargs)     +-- fetch_attr(target)
                +-- output(target, args, kwargs)          the returned value

    Values live in ``self.env`` (a dict from node to value) while they are
    needed: with ``garbage_collect_values`` (the default) each value is
    dropped right after the last node that uses it has run, and a value no
    node uses right after it is computed, so a long chain holds as few
    tensors at once as eager execution does. The order of nodes and which
    values to drop after each are worked out once per graph, and again when
    the graph has been edited since; edit the graph between runs, not while
    it runs.

    An exception raised while running a node keeps its type and gains a note
    (Python 3.11+) naming the node and, if recorded, the user code it came from.

    Args:
        module: the module to run; ``get_attr``/``call_module`` targets are
            looked up in it.
        garbage_collect_values: release values after their last use.
        graph: the graph to run (default: ``module.graph``).

    Example — swap ``torch.sigmoid`` and ``neg``::

        >>> import torch, fxloom
        >>> class Swap(fxloom.Interpreter):
        ...     def call_function(self, target, args, kwargs):
        ...         if target is torch.sigmoid:
        ...             return torch.neg(*args, **kwargs)
        ...         return super().call_function(target, args, kwargs)
        >>> gm = fxloom.symbolic_trace(lambda x: torch.sigmoid(x) + 1)
        >>> Swap(gm).run(torch.tensor([2.0]))
        tensor([-1.])
    """

    def __init__(
        self,
        module: torch.nn.Module,
        garbage_collect_values: bool = True,
        graph: Graph | None = None,
    ) -> None:
        if graph is None:
            graph = getattr(module, "graph", None)
            if not isinstance(graph, Graph):
                raise TypeError(
                    f"{type(self).__name__} runs an fxloom graph: pass a GraphModule, or the "
                    f"graph to run as graph=... (got a {type(module).__name__} without one)"
                )
        self.module = module
        self.graph: Graph = graph
        self.garbage_collect_values = garbage_collect_values
        self.submodules = dict(module.named_modules())
        self.env: dict[Node, Any] = {}
        self.args_iter: Iterator[Any] = iter(())
        self._dispatch = self._bind_opcode_methods()
        self._planned_graph: Graph | None = None
        self._planned_version = -1
        self._steps: list[tuple[Node, tuple[Node, ...] | None]] = []
        self._output_node: Node | None = None
        # node -> the values released after it runs (torch.fx's name for it);
        # see liveness.last_uses for the rules.
        self.user_to_last_uses: dict[Node, list[Node]] = {}
        self._plan()

    # ------------------------------------------------------------------ run
    def run(
        self,
        *args: Any,
        initial_env: dict[Node, Any] | None = None,
        enable_io_processing: bool = True,
    ) -> Any:
        """Run the graph on ``args`` (one per placeholder, in order) and return its output.

        ``initial_env`` maps nodes to values to use instead of running those
        nodes (partial evaluation); it is copied, not modified.
        With ``enable_io_processing`` the graph's ``CodeGen`` maps ``args`` to
        the placeholders' values and the output's value to the result, as the
        generated code does (a graph taking nested inputs flattens them).
        """
        if enable_io_processing:
            args = self.graph.process_inputs(*args)
        steps = self._plan()
        self._dispatch = self._bind_opcode_methods()
        env = self.env = _own_env(initial_env)
        initial_env = None  # env alone holds the values: released ones can be freed
        skip_seeded = bool(env)
        self.args_iter = iter(args)
        run_node = self.run_node
        release = self.garbage_collect_values
        for node, dead in steps:
            if skip_seeded and node in env:
                continue
            try:
                env[node] = run_node(node)
            except Exception as err:
                _note_node(err, node, type(self).__name__)
                raise
            if release and dead is not None:
                for used in dead:
                    del env[used]
        output = self._output_node
        result = env[output] if output is not None else None
        return self.graph.process_outputs(result) if enable_io_processing else result

    def boxed_run(self, args_list: list[Any]) -> Any:
        """Run the graph on the values in ``args_list``, which is emptied first.

        The "boxed" convention: once the caller's list is cleared, the
        interpreter holds the only references to the inputs, so each is freed
        after its last use instead of living until the call returns.

        >>> import torch, fxloom
        >>> gm = fxloom.symbolic_trace(lambda x, y: x + y)
        >>> inputs = [torch.ones(2), torch.ones(2)]
        >>> fxloom.Interpreter(gm).boxed_run(inputs)
        tensor([2., 2.])
        >>> inputs
        []
        """
        placeholders = [node for node, _ in self._plan() if node.op == "placeholder"]
        if len(args_list) != len(placeholders):
            raise RuntimeError(
                f"Interpreter.boxed_run: the graph has {len(placeholders)} placeholders "
                f"({', '.join(n.name for n in placeholders)}) but {len(args_list)} arguments "
                "were given"
            )
        # The list holds the placeholders' own values: nothing to process on the way in. (No
        # local name for the inputs: run must hold the only reference to free them early.)
        result = self.run(
            initial_env=_take_inputs(placeholders, args_list), enable_io_processing=False
        )
        return self.graph.process_outputs(result)

    def _bind_opcode_methods(self) -> dict[str, Any]:
        # Bound once per run, so run_node pays one dict lookup per node and
        # still sees methods that subclasses (or instances) override.
        return {op: getattr(self, op) for op in OPCODES}

    def _plan(self) -> list[tuple[Node, tuple[Node, ...] | None]]:
        """``(node, nodes to release after it)`` for each node up to the output, cached per graph version.

        Which values die where is ``liveness.last_uses``, the rule generated
        code follows too; its result is kept as ``user_to_last_uses``.
        """
        graph = self.graph
        if graph is self._planned_graph and graph._version == self._planned_version:
            return self._steps
        dead_after = last_uses(graph)
        steps = []
        output = None
        for node in graph.nodes:
            dead = dead_after.get(node)
            steps.append((node, tuple(dead) if dead else None))
            if node.op == "output":
                output = node
                break
        self.user_to_last_uses = dead_after
        self._steps = steps
        self._output_node = output
        self._planned_graph = graph
        self._planned_version = graph._version
        return steps

    def run_node(self, n: Node) -> Any:
        """Run node ``n``: fetch its argument values, then call the method for its opcode."""
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        return self._dispatch[n._op](n._target, args, kwargs)

    # ------------------------------------------------------- opcode methods
    def placeholder(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The next positional input; ``*name`` takes all the rest, ``**name`` an empty dict.

        When inputs run out, the placeholder's default (``args[0]``) is used.
        """
        name = str(target)
        if name.startswith("**"):
            return {}
        if name.startswith("*"):
            return tuple(self.args_iter)
        value = next(self.args_iter, _NO_INPUT)
        if value is not _NO_INPUT:
            return value
        if args:
            return args[0]
        raise RuntimeError(
            f"{type(self).__name__}.run: no value for input {name!r}: run() was given fewer "
            "positional arguments than the graph has inputs without defaults; pass a value "
            f"for {name!r}, or seed its placeholder through initial_env"
        )

    def get_attr(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The module attribute named by ``target`` (``"lin.weight"``)."""
        return self.fetch_attr(target)

    def call_function(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``target(*args, **kwargs)``."""
        return target(*args, **kwargs)

    def call_method(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``args[0].<target>(*args[1:], **kwargs)``."""
        return getattr(args[0], target)(*args[1:], **kwargs)

    def call_module(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call the submodule at qualified name ``target`` with ``args``/``kwargs``."""
        return self.fetch_attr(target)(*args, **kwargs)

    def output(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The value the graph returns (``args[0]``)."""
        return args[0]

    # -------------------------------------------------------------- helpers
    def fetch_attr(self, target: str) -> Any:
        """The attribute at qualified name ``target`` of ``self.module``, looked up now."""
        value = attr_path.find(self.module, target)
        if value is attr_path.MISSING:
            raise attr_path.MissingAttributeError(
                self.module,
                target,
                context=type(self).__name__,
                fix="add it to the module or fix the node's target",
            )
        return value

    def fetch_args_kwargs_from_env(self, n: Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The values of ``n``'s args and kwargs, with each node replaced by its value in ``env``."""
        env = self.env
        args = n._args
        try:
            if n._flat:  # a flat tuple of nodes and scalars, no kwargs: the usual case
                # Unrolled for one and two arguments (most nodes): this runs once
                # per node, and a loop or comprehension costs more than the lookups.
                if len(args) == 1:
                    a = args[0]
                    return (env[a] if type(a) is Node else a,), {}
                if len(args) == 2:
                    a, b = args
                    return (env[a] if type(a) is Node else a, env[b] if type(b) is Node else b), {}
                return _load(args, env), {}
            kwargs = n._kwargs
            return _load(args, env), _load(kwargs, env) if kwargs else {}
        except KeyError as err:
            raise self._missing_value(err, n) from None

    def map_nodes_to_values(self, args: Argument, n: Node) -> Any:
        """``args`` with every node replaced by its value in ``env`` (``n`` is named in errors).

        Containers come back as plain tuples, lists and dicts, as the code
        generated for the graph would build them.
        """
        try:
            return _load(args, self.env)
        except KeyError as err:
            raise self._missing_value(err, n) from None

    def _missing_value(self, err: KeyError, user: Node) -> Exception:
        used = err.args[0] if err.args else None
        if type(used) is not Node:  # not a lookup in env: pass it on unchanged
            return err
        return RuntimeError(
            f"%{user.name} needs the value of %{used.name}, which {type(self).__name__}.env "
            "does not hold: it was never computed or was released after what the interpreter "
            "took for its last use. Check that the graph is in topological order "
            "(graph.lint()), and that overrides do not read values of other nodes from env"
        )


def _load(a: Any, env: dict[Node, Any]) -> Any:
    """``a`` with every node replaced by ``env[node]``; containers rebuilt as plain ones.

    Plain means ``fxloom.pytree``'s mode ``"plain"`` (what generated code
    builds): ``tree_map(..., mode="plain")`` written out, as this runs for
    every node. Tuples, lists and dicts, the containers of nearly every
    argument, are unrolled.
    """
    t = type(a)
    if t is Node:
        return env[a]
    if t is tuple or t is immutable_list or t is list:
        values = []
        for x in a:  # nodes and scalars inline; only nested containers recurse
            tx = type(x)
            if tx is Node:
                values.append(env[x])
            elif tx in LEAF_ARGUMENT_TYPES:
                values.append(x)
            else:
                values.append(_load(x, env))
        return tuple(values) if t is tuple else values
    if t is immutable_dict or t is dict:
        loaded = {}
        for key, x in a.items():
            tx = type(x)
            if tx is Node:
                loaded[key] = env[x]
            elif tx in LEAF_ARGUMENT_TYPES:
                loaded[key] = x
            else:
                loaded[key] = _load(x, env)
        return loaded
    entry = container_type(t)
    if entry is None:  # a constant: a function, an enum member, ...
        return a
    children, context = entry.flatten(a)  # a slice, a named tuple, a registered container
    loaded = [c if type(c) in LEAF_ARGUMENT_TYPES else _load(c, env) for c in children]
    return entry.plain.unflatten(loaded, context)


def _note_node(err: BaseException, node: Node, interpreter: str) -> None:
    """Add a note naming the node that raised ``err`` and where it came from."""
    note = f"fxloom: raised while {interpreter} ran %{node.name}:\n    {node.format_node()}"
    trace = node.stack_trace
    if trace:
        note += f"\n  captured from:\n{textwrap.indent(trace.rstrip(), '    ')}"
    add_note(err, note)


# ================================================================ Transformer
# Provenance kept from each node on the nodes that replace it. Analysis
# results (``val``, ``tensor_meta``, ...) are dropped: the rewrite may change
# the values, so passes recompute them.
CARRIED_META = (*PROVENANCE_KEYS, "custom")


class _RebuildingTracer(GraphAppendingTracer):
    """Records a Transformer's calls into its new graph, carrying provenance from the old node.

    A new node with the old node's op and target keeps the old name (made
    unique), so names stay stable through a transform. Tensors handed to it
    become ``get_attr`` nodes: of the root's own parameter or buffer when it
    is one, else of a constant kept with the new graph.
    """

    def __init__(self, graph: Graph, root: torch.nn.Module) -> None:
        super().__init__(graph, root)
        self.current: Node | None = None  # the old node being transformed

    def create_node(
        self,
        kind: str,
        target: Target,
        args: tuple[Argument, ...],
        kwargs: dict[str, Argument],
        name: str | None = None,
        type_expr: Any | None = None,
    ) -> Node:
        old = self.current
        if old is not None and name is None and old.op == kind and _same_target(old.target, target):
            name = old.name
            if type_expr is None:
                type_expr = old.type
        node = self.graph.create_node(kind, target, args, kwargs, name, type_expr)
        if old is not None:
            old_meta = old.meta
            for key in CARRIED_META:
                if key in old_meta:
                    node.meta[key] = old_meta[key]
        return node


def _same_target(a: Target, b: Target) -> bool:
    return a is b or (type(a) is str and a == b)


class Transformer(Interpreter):
    """An ``Interpreter`` whose values are ``Proxy`` objects: running it builds a new graph.

    Each ``placeholder`` becomes a placeholder of the new graph (same name,
    default and annotation), each ``get_attr`` a ``get_attr``, and each
    ``call_function``/``call_method``/``call_module`` one node of the same
    kind (submodules are called, never traced into). An override returns
    whatever it computes from the proxies it is given — ``torch.neg(*args)``
    records a ``torch.neg`` node — so a rewrite reads like an interpreter.
    ``transform()`` runs it without inputs and returns a new ``GraphModule``
    over the original module's attributes; the original is not modified.

    ``node.meta``: the keys in ``CARRIED_META`` (``stack_trace``, ``source_location``,
    ``nn_module_stack``, ``source_fn_stack``, ``custom``) are copied from each
    old node to every node recorded while running it; other keys are dropped.

    Example — the sigmoid/neg swap as a rewrite::

        >>> import torch, fxloom
        >>> class Swap(fxloom.Transformer):
        ...     def call_function(self, target, args, kwargs):
        ...         if target is torch.sigmoid:
        ...             return torch.neg(*args, **kwargs)
        ...         return super().call_function(target, args, kwargs)
        >>> gm = fxloom.symbolic_trace(lambda x: torch.sigmoid(x) + 1)
        >>> new = Swap(gm).transform()
        >>> print(new.code.strip())
        def forward(self, x):
            neg = torch.neg(x);  x = None
            add = neg + 1;  neg = None
            return add
    """

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__(module)
        self.new_graph = self._fresh_graph()
        self.tracer = _RebuildingTracer(self.new_graph, module)

    def _fresh_graph(self) -> Graph:
        """An empty graph framed like the one transformed (same ``CodeGen``)."""
        graph = Graph()
        graph.set_codegen(self.graph._codegen)
        return graph

    def run_node(self, n: Node) -> Any:
        tracer = self.tracer
        tracer.current = n
        try:
            return super().run_node(n)
        finally:
            tracer.current = None

    def placeholder(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Proxy:
        """A placeholder of the new graph, keeping the old one's default (``args``) and annotation."""
        return self.tracer.create_proxy("placeholder", target, args, {})

    def get_attr(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Proxy:
        """A ``get_attr`` of the new graph (the attribute itself is not read)."""
        return self.tracer.create_proxy("get_attr", target, args, kwargs)

    def call_function(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A ``call_function`` of the new graph."""
        return self.tracer.create_proxy("call_function", target, args, kwargs)

    def call_method(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A ``call_method`` of the new graph."""
        return self.tracer.create_proxy("call_method", target, args, kwargs)

    def call_module(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A ``call_module`` of the new graph; the submodule is not traced into."""
        return self.tracer.create_proxy("call_module", target, args, kwargs)

    def transform(self) -> GraphModule:
        """Build the new graph and return it as a ``GraphModule`` named like the original."""
        if len(self.new_graph.nodes):  # a second call starts over instead of appending
            self.new_graph = self._fresh_graph()
            self.tracer = _RebuildingTracer(self.new_graph, self.module)
        # The new graph's placeholders stand for the old one's, so no io processing.
        result = self.run(enable_io_processing=False)
        output = self._output_node
        if output is not None:
            tracer = self.tracer
            tracer.current = output
            try:
                tracer.create_node("output", "output", (tracer.create_arg(result),), {})
            finally:
                tracer.current = None
        name = type(self.module).__name__ if isinstance(self.module, GraphModule) else None
        return GraphModule(self.module, self.new_graph, name or "GraphModule")


class _HandedOver(dict):
    """``boxed_run``'s inputs, which ``run`` takes over rather than copies.

    Python 3.10 keeps a call's arguments on the caller's stack until the call returns, so a copy
    would leave the caller's dict holding every input to the end; releasing from this very dict
    frees each input after its last use on every Python.
    """


def _own_env(initial_env: dict[Node, Any] | None) -> dict[Node, Any]:
    """The environment ``run`` fills: a copy of the caller's values, or boxed_run's own dict."""
    if isinstance(initial_env, _HandedOver):
        return initial_env
    return {} if initial_env is None else dict(initial_env)


def _take_inputs(placeholders: list[Node], args_list: list[Any]) -> dict[Node, Any]:
    """Placeholder -> value, emptying ``args_list`` (``boxed_run``'s hand-over)."""
    env = _HandedOver(zip(placeholders, args_list))
    args_list.clear()
    return env
