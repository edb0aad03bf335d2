"""``FxGraphDrawer``: draw a ``GraphModule``'s graph with Graphviz (torch.fx paper, 6.3).

One box per node, filled with its opcode's colour (``NODE_COLORS``), labelled with its name,
opcode and target, a summary of its constant arguments, and for ``call_module`` the module's
type and settings. Edges carry the tensor shapes and dtypes flowing along them when shape
propagation has run (``fxloom.passes.shape_prop``). Nodes traced inside a submodule's
``forward`` are grouped in a box per module (a Graphviz cluster), nested as the modules are.
Leaf modules also show their parameters and buffers as small boxes feeding them.

    >>> import torch, fxloom
    >>> from fxloom.passes.graph_drawer import FxGraphDrawer
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.linear = torch.nn.Linear(4, 5)
    ...     def forward(self, x):
    ...         return self.linear(x).clamp(min=0.0, max=1.0)
    >>> drawer = FxGraphDrawer(fxloom.symbolic_trace(Net()), "net")
    >>> dot = drawer.get_dot_graph()
    >>> print(dot.source.splitlines()[0])
    digraph "net" {
    >>> "kwargs: {min: 0.0, max: 1.0}" in dot.source
    True

An exported program (``fxloom.export``) draws too: ``FxGraphDrawer(ep, "net")`` draws its ATen
graph, its operators by their short names (``aten.convolution.default``), and the placeholders
that lift parameters, buffers and constants as parameter and buffer boxes inside the box of
the module owning them (``ignore_parameters_and_buffers`` leaves them out).

``dot.write("net.svg")`` (or ``drawer.write("net.svg")``) renders it with Graphviz's ``dot``
program, which must be installed for any format but DOT source itself (``.dot``); see
``fxloom.passes._dot`` for rendering and escaping. From the shell: ``fxloom draw MODEL -o
out.svg``.

``node.meta``: read only — ``tensor_meta`` (else ``val``) for edge labels,
``nn_module_stack`` for module boxes, ``stack_trace`` with ``parse_stack_trace``. Nothing is
written; the graph, its node names and the module are left as they were.

Depends on: the IR, ``torch.nn``, ``fxloom.export``'s program (through ``passes.captured``);
rendering needs the ``dot`` program, never a Python package.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fxloom import attr_path
from fxloom.export.program import ExportedProgram
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.passes import _drawing_labels as labels
from fxloom.passes._dot import (
    DotGraph,
    GraphvizError,
    GraphvizNotFoundError,
    GraphvizWarning,
    html_text,
    quote_id,
)
from fxloom.passes._drawing_labels import DTYPE_ABBREVIATIONS, format_tensor_meta
from fxloom.passes.captured import LiftedTensor, graph_module_of, lifted_state

__all__ = [
    "DTYPE_ABBREVIATIONS",
    "DotGraph",
    "FxGraphDrawer",
    "GraphvizError",
    "GraphvizNotFoundError",
    "GraphvizWarning",
    "NODE_COLORS",
    "format_tensor_meta",
]

# Fill colour of each kind of box: the six opcodes, then the parameter and buffer boxes drawn
# beside leaf modules. Change an entry here, or pass colors={...} to one drawer.
NODE_COLORS: dict[str, str] = {
    "placeholder": "#d6eaf8",
    "get_attr": "#e5e8e8",
    "call_function": "#d5f5e3",
    "call_method": "#fdebd0",
    "call_module": "#fcf3cf",
    "output": "#d1f2eb",
    "parameter": "#f5b7b1",
    "buffer": "#f9e79f",
}

_GRAPH_HEADER = (
    'fontname="Helvetica"',
    'node [shape={shape}, style="rounded,filled", fontname="Helvetica", fontsize=10, '
    'fillcolor="#ffffff"]',
    'edge [fontname="Helvetica", fontsize=9, fontcolor="#555555"]',
)
_CLUSTER_STYLE = 'style="rounded,dashed"; color="#7f8c8d"; fontsize=10; labeljust="l"'


@dataclass(frozen=True)
class _Options:
    ignore_getattr: bool
    ignore_parameters_and_buffers: bool
    skip_node_names_in_args: bool
    parse_stack_trace: bool
    shape: str
    show_shapes: bool
    clusters: bool
    colors: Mapping[str, str]
    rankdir: str
    max_label_width: int


class FxGraphDrawer:
    """Draw a ``GraphModule`` (and the ``GraphModule`` submodules it calls) with Graphviz.

    Args:
        graph_module: the module whose graph to draw, or an ``ExportedProgram``.
        name: the name of the drawing; submodule drawings are named ``{name}_{target}``.
        ignore_getattr: leave out ``get_attr`` nodes and their edges.
        ignore_parameters_and_buffers: leave out the parameter and buffer boxes drawn beside
            each leaf ``call_module`` (and an exported program's lifted state).
        skip_node_names_in_args: show nodes in argument summaries as a dot (the edges say
            which), and leave out a summary that holds only nodes.
        parse_stack_trace: add the user's ``file:line code`` recorded in
            ``node.meta["stack_trace"]`` (``Tracer(record_stack_traces=True)``).
        dot_graph_shape: the Graphviz shape of the boxes (default ``"box"``, rounded).
        show_shapes: label edges with shapes and dtypes from ``node.meta["tensor_meta"]``
            (or ``["val"]``) when present (keyword-only, beyond torch.fx).
        clusters: group nodes by the module whose ``forward`` produced them, from
            ``node.meta["nn_module_stack"]`` (or, without it, a ``call_module`` target's path).
        colors: fill colours overriding ``NODE_COLORS`` entries (by opcode, "parameter",
            "buffer").
        rankdir: Graphviz layout direction: "TB" (top to bottom), "LR", ...
        max_label_width: characters after which a label row is cut with "...".

    The drawings are made once, here; ``get_dot_graph()`` returns them as ``DotGraph``
    objects (DOT source, ``write(path)``, ``pipe(format)``, pydot-style ``write_svg``).
    Nothing in the module or its graph is changed.

    >>> import torch, fxloom
    >>> gm = fxloom.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    >>> drawer = FxGraphDrawer(gm, "seq", ignore_parameters_and_buffers=True)
    >>> sorted(drawer.get_all_dot_graphs())
    ['seq']
    >>> '"_0" -> "_1"' in drawer.get_main_dot_graph().source
    True
    """

    def __init__(
        self,
        graph_module: GraphModule | ExportedProgram,
        name: str,
        ignore_getattr: bool = False,
        ignore_parameters_and_buffers: bool = False,
        skip_node_names_in_args: bool = True,
        parse_stack_trace: bool = False,
        dot_graph_shape: str | None = None,
        *,
        show_shapes: bool = True,
        clusters: bool = True,
        colors: Mapping[str, str] | None = None,
        rankdir: str = "TB",
        max_label_width: int = 72,
    ) -> None:
        lifted = lifted_state(graph_module)  # an ExportedProgram's lifted state, else empty
        graph_module = graph_module_of(graph_module)
        if not isinstance(getattr(graph_module, "graph", None), Graph):
            raise TypeError(
                f"FxGraphDrawer draws an fxloom GraphModule, got a {type(graph_module).__name__}; "
                "trace it first: FxGraphDrawer(fxloom.symbolic_trace(model), name)"
            )
        self._name = name
        options = _Options(
            ignore_getattr=ignore_getattr,
            ignore_parameters_and_buffers=ignore_parameters_and_buffers,
            skip_node_names_in_args=skip_node_names_in_args,
            parse_stack_trace=parse_stack_trace,
            shape=dot_graph_shape or "box",
            show_shapes=show_shapes,
            clusters=clusters,
            colors={**NODE_COLORS, **(colors or {})},
            rankdir=rankdir,
            max_label_width=max_label_width,
        )
        self._dot_graphs: dict[str, DotGraph] = {}
        pending = deque([(name, graph_module, lifted)])
        while pending:  # a work-list: GraphModule submodules get drawings of their own
            drawing_name, module, lifted_here = pending.popleft()
            self._dot_graphs[drawing_name] = _draw(module, drawing_name, options, lifted_here)
            for target, submodule in _called_graph_modules(module):
                pending.append((f"{drawing_name}_{target}", submodule, {}))

    def get_dot_graph(self, submod_name: str | None = None) -> DotGraph:
        """The main drawing, or with ``submod_name`` the drawing of that called submodule."""
        if submod_name is None:
            return self.get_main_dot_graph()
        return self.get_submod_dot_graph(submod_name)

    def get_main_dot_graph(self) -> DotGraph:
        """The drawing of the module given to the drawer."""
        return self._dot_graphs[self._name]

    def get_submod_dot_graph(self, submod_name: str) -> DotGraph:
        """The drawing of the ``GraphModule`` submodule called as ``submod_name``."""
        key = f"{self._name}_{submod_name}"
        if key not in self._dot_graphs:
            drawn = [k.removeprefix(f"{self._name}_") for k in self._dot_graphs if k != self._name]
            raise KeyError(
                f"no drawing of a submodule {submod_name!r}: only GraphModule submodules "
                f"called by the graph are drawn, and these were: {drawn or 'none'}"
            )
        return self._dot_graphs[key]

    def get_all_dot_graphs(self) -> dict[str, DotGraph]:
        """Every drawing by name: ``name``, then ``{name}_{target}`` for called GraphModules."""
        return dict(self._dot_graphs)

    def write(
        self, path: str | Path, format: str | None = None, submod_name: str | None = None
    ) -> Path:
        """Save a drawing to ``path`` in ``format``, else the format its suffix names
        (``.svg``, ``.png``, ``.pdf``: rendered by Graphviz's ``dot``; ``.dot``: DOT source)."""
        return self.get_dot_graph(submod_name).write(path, format)


def _called_graph_modules(module: torch.nn.Module) -> list[tuple[str, GraphModule]]:
    called = {}
    for node in module.graph.nodes:
        if node.op == "call_module" and node.target not in called:
            submodule = _submodule(module, node.target)
            if isinstance(submodule, GraphModule):
                called[node.target] = submodule
    return list(called.items())


def _submodule(root: torch.nn.Module, target: Any) -> torch.nn.Module | None:
    module = attr_path.find(root, str(target))
    return module if isinstance(module, torch.nn.Module) else None


# ---------------------------------------------------------------- one drawing
@dataclass
class _Cluster:
    """A module's box: its DOT id and label, and what it holds, in order of appearance."""

    dot_id: str
    label: str
    items: list[str | _Cluster] = field(default_factory=list)
    children: dict[str, _Cluster] = field(default_factory=dict)


def _draw(
    module: torch.nn.Module, name: str, options: _Options, lifted: Mapping[str, LiftedTensor]
) -> DotGraph:
    root = _Cluster("", "")
    cluster_count = [0]
    hidden = frozenset(lifted) if options.ignore_parameters_and_buffers else frozenset()
    owner_types = _module_type_names(module.graph) if lifted and options.clusters else {}
    for node in module.graph.nodes:
        if (options.ignore_getattr and node.op == "get_attr") or node.name in hidden:
            continue
        state = lifted.get(node.name) if node.op == "placeholder" else None
        if state is not None:  # inside the box of the module owning it
            scopes = _owner_scopes(state.target, owner_types) if options.clusters else ()
            _cluster_for(root, scopes, cluster_count).items.append(
                _lifted_statement(node, state, options)
            )
            continue
        scopes = _module_scopes(node, module) if options.clusters else ()
        cluster = _cluster_for(root, scopes, cluster_count)
        cluster.items.append(_node_statement(node, module, options))
        if node.op == "call_module" and not options.ignore_parameters_and_buffers:
            submodule = _submodule(module, node.target)
            if submodule is not None and not isinstance(submodule, GraphModule):
                cluster.items.extend(_weight_statements(node, submodule, options))
    lines = [f"digraph {quote_id(name)} {{", f"  rankdir={quote_id(options.rankdir)}"]
    header = [line.format(shape=quote_id(options.shape)) for line in _GRAPH_HEADER]
    lines += [f"  {line}" for line in header]
    _emit_items(root.items, lines, indent="  ")
    lines += _edge_statements(module.graph, options, hidden)
    lines.append("}")
    return DotGraph(name, "\n".join(lines) + "\n")


def _module_scopes(node: Node, root: torch.nn.Module) -> tuple[tuple[str, str], ...]:
    """``(module path, type name)`` of each module around ``node``, outermost first.

    From ``meta["nn_module_stack"]`` (path -> (path, type)); without it, a ``call_module``'s
    target names its parents (``layers.0.conv1`` is inside ``layers`` and ``layers.0``). A
    ``call_module`` is never boxed inside its own module.
    """
    stack = node.meta.get("nn_module_stack")
    if stack:
        scopes = [_scope_entry(key, value) for key, value in stack.items()]
    elif node.op == "call_module":
        paths = attr_path.prefixes(str(node.target))[:-1]
        scopes = [(path, type(_submodule(root, path)).__name__) for path in paths]
    else:
        return ()
    if node.op == "call_module":
        scopes = [scope for scope in scopes if scope[0] != node.target]
    return tuple(scopes)


def _module_type_names(graph: Graph) -> dict[str, str]:
    """Type names of the modules the nodes ran in, by path (from ``nn_module_stack``)."""
    names: dict[str, str] = {}
    for node in graph.nodes:
        for key, value in node.meta.get("nn_module_stack", {}).items():
            path, type_name = _scope_entry(key, value)
            names.setdefault(path, type_name)
    return names


def _owner_scopes(target: str, type_names: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The scopes of the module owning the state at ``target`` (``layers.0.conv1.weight``)."""
    paths = attr_path.prefixes(target)[:-1]
    return tuple((path, type_names.get(path, "")) for path in paths)


def _scope_entry(key: str, value: Any) -> tuple[str, str]:
    path, module_type = value if isinstance(value, tuple) and len(value) == 2 else (key, "")
    if isinstance(module_type, type):
        return str(path), module_type.__name__
    return str(path), str(module_type).rsplit(".", 1)[-1]  # torch.export stores type names


def _cluster_for(root: _Cluster, scopes: tuple[tuple[str, str], ...], count: list[int]) -> _Cluster:
    cluster = root
    for path, type_name in scopes:
        child = cluster.children.get(path)
        if child is None:
            label = f"{path} ({type_name})" if type_name else path
            child = _Cluster(f"cluster_{count[0]}", label)
            count[0] += 1
            cluster.children[path] = child
            cluster.items.append(child)
        cluster = child
    return cluster


def _emit_items(items: list[str | _Cluster], lines: list[str], indent: str) -> None:
    for item in items:
        if isinstance(item, str):
            lines.append(indent + item)
            continue
        lines.append(f"{indent}subgraph {quote_id(item.dot_id)} {{")
        lines.append(f"{indent}  label=<{html_text(item.label)}>; {_CLUSTER_STYLE}")
        _emit_items(item.items, lines, indent + "  ")  # nested as deep as the modules are
        lines.append(f"{indent}}}")


def _node_statement(node: Node, root: torch.nn.Module, options: _Options) -> str:
    rows = [node.name, labels.target_row(node)]
    if node.op == "call_module":
        rows.append(labels.module_row(_submodule(root, node.target)))
    rows += labels.argument_rows(node, options.skip_node_names_in_args)
    if options.parse_stack_trace:
        frame = labels.stack_trace_row(node)
        rows += [frame] if frame else []
    label = labels.html_table(rows, options.max_label_width)
    color = options.colors.get(node.op, "#ffffff")
    return f"{quote_id(node.name)} [label=<{label}>, fillcolor={quote_id(color)}]"


def _weight_statements(node: Node, module: torch.nn.Module, options: _Options) -> list[str]:
    statements = []
    for kind, named in (
        ("parameter", module.named_parameters()),
        ("buffer", module.named_buffers()),
    ):
        for weight_name, tensor in named:
            dot_id = quote_id(f"{node.name}.{weight_name}")
            rows = [weight_name, f"{kind} {format_tensor_meta(tensor)}"]
            label = labels.html_table(rows, options.max_label_width)
            color = quote_id(options.colors.get(kind, "#ffffff"))
            statements.append(f"{dot_id} [label=<{label}>, fillcolor={color}, fontsize=8]")
            statements.append(f"{dot_id} -> {quote_id(node.name)}")
    return statements


def _lifted_statement(node: Node, state: LiftedTensor, options: _Options) -> str:
    kind = "parameter" if state.is_parameter else "buffer"  # constants are drawn as buffers
    rows = [node.name, f"{state.kind.name.lower()} {state.target}"]
    label = labels.html_table(rows, options.max_label_width)
    color = quote_id(options.colors.get(kind, "#ffffff"))
    return f"{quote_id(node.name)} [label=<{label}>, fillcolor={color}, fontsize=8]"


def _edge_statements(graph: Graph, options: _Options, hidden: frozenset[str]) -> list[str]:
    statements = []
    for user in graph.nodes:
        if options.ignore_getattr and user.op == "get_attr":
            continue
        for source in user.all_input_nodes:
            if (options.ignore_getattr and source.op == "get_attr") or source.name in hidden:
                continue
            edge = f"  {quote_id(source.name)} -> {quote_id(user.name)}"
            shape = labels.edge_label(source, user) if options.show_shapes else None
            statements.append(edge + (f" [label=<{html_text(shape)}>]" if shape else ""))
    return statements
