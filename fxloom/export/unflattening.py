"""``unflatten(ep)``: an exported program as a module tree shaped like the model it came from.

An exported graph is flat: the operators of every submodule in one list. Each
node's ``meta["nn_module_stack"]`` names the modules whose forward was running
when it was recorded, so the list splits back into module calls. ``unflatten``
gives each submodule of the source model a ``GraphModule`` at its qualified
name (``layer1.0.conv1``), whose graph holds the operators that ran directly
in it and a ``call_module`` node per call of a child::

    >>> import torch
    >>> from fxloom.export import export, unflatten
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    >>> tree = unflatten(export(model, (torch.randn(2, 4),)))
    >>> [name for name, _ in tree.named_modules()]
    ['', '0', '1']
    >>> print(tree.get_submodule("0").code.strip())
    def forward(self, input_1):
        weight = self.weight
        t = torch.ops.aten.t.default(weight);  weight = None
        bias = self.bias
        addmm = torch.ops.aten.addmm.default(bias, input_1, t);  bias = input_1 = t = None
        return addmm
    >>> x = torch.randn(2, 4)
    >>> torch.allclose(tree(x), model(x))
    True

Parameters, buffers and constants sit at their original paths, read by
``get_attr`` in the module that owns them (or passed in by the nearest caller
that owns them); a value a call needs from outside comes in as a placeholder,
and one used outside goes out as an output. The root takes and returns what
``ep.module()`` takes and returns, with the same input checks. A write to a
buffer (or input) is a ``copy_`` right after the node computing its final
value, in that node's module, so a submodule called on its own updates its
buffers as in eager. Modules that ran no operator (a dropout in eval mode) are
empty ``nn.Module``s at their paths.

How calls are told apart: export makes a new ``(path, class)`` entry each
time a module is entered and shares it with every node recorded until it
returns, its children's included, so ``self.lin(self.lin(x))`` is two calls of
``lin`` and a block's second call is not its first. Where no entry is shared (a
graph built by other means), consecutive nodes with equal entries are one call.
A module called more than once has one graph, so its calls must run the same
operators; otherwise ``unflatten`` raises naming the module (torch.export's
``unflatten`` keeps one graph per call there). A node whose entry names a
call that had returned before it (a capture re-recording a view with the
metadata of an earlier operator) goes to the innermost call still running.

Depends on the IR, ``fxloom.attr_path``, ``fxloom.pytree_codegen`` and ``program``.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from fxloom import attr_path
from fxloom.export.input_checks import add_input_checks
from fxloom.export.program import ExportedProgram
from fxloom.export.signature import STATE_KINDS, InputKind, OutputKind
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node, map_arg
from fxloom.pytree_codegen import PyTreeCodeGen, PyTreeInfo

__all__ = ["UnflattenError", "unflatten"]

aten = torch.ops.aten


class UnflattenError(RuntimeError):
    """The program's module calls cannot be rebuilt as a tree of modules; the message says why."""


def unflatten(ep: ExportedProgram) -> torch.nn.Module:
    """A module tree mirroring the exported model: one ``GraphModule`` per submodule.

    Named as the source model's modules, it computes what ``ep.module()``
    computes, taking and returning the same structures; see the module
    docstring for how calls are found. Raises ``UnflattenError`` naming the
    module where calls cannot be rebuilt as a tree.

        >>> import torch
        >>> from fxloom.export import export, unflatten
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout())
        >>> tree = unflatten(export(model.eval(), (torch.ones(1, 2),)))
        >>> [(name, type(m).__name__) for name, m in tree.named_modules()]
        [('', 'Sequential'), ('0', 'Linear'), ('1', 'Module')]
    """
    root_call, owner = _split(ep.graph)
    context = _Context(ep, owner)
    root = _RootBuilder(root_call, context, ep).build()
    return _assemble(ep, context, root)


# ------------------------------------------------------------------ calls


class _Call:
    """One run of a module's forward: its own operators and the calls it made, in order."""

    __slots__ = ("path", "cls", "entry", "parent", "items")

    def __init__(self, entry: tuple[str, type] | None, parent: _Call | None) -> None:
        self.entry = entry  # its nn_module_stack entry, (path, class)
        self.path, self.cls = entry if entry is not None else ("", None)
        self.parent = parent
        self.items: list[Node | _Call] = []
        if parent is not None:
            parent.items.append(self)

    def encloses(self, call: _Call | None) -> bool:
        while call is not None:
            if call is self:
                return True
            call = call.parent
        return False


def _split(graph: Graph) -> tuple[_Call, dict[Node, _Call]]:
    """The tree of module calls of the flat graph, and the call each operator ran in."""
    operators = [node for node in graph.nodes if node.op not in ("placeholder", "output")]
    stacks = [node.meta.get("nn_module_stack") for node in operators]
    by_identity = _entries_shared(stacks)
    root = _Call(None, None)
    running = [root]
    started: set[int] = set()  # ids of the entries of every call so far
    owner: dict[Node, _Call] = {}
    for node, stack in zip(operators, stacks):
        if stack is None:  # made by a pass that kept no record: stays with its neighbours
            call = running[-1]
        else:
            call = _call_of(stack, running, started, by_identity, node)
        call.items.append(node)
        owner[node] = call
    return root, owner


def _entries_shared(stacks: list[dict | None]) -> bool:
    """Whether nodes share stack entries (as export records them), so identity marks a call."""
    seen: set[int] = set()
    for stack in stacks:
        for entry in (stack or {}).values():
            if id(entry) in seen:
                return True
            seen.add(id(entry))
    return False


def _call_of(
    stack: dict, running: list[_Call], started: set[int], by_identity: bool, node: Node
) -> _Call:
    """The call a node ran in: the running calls its stack names, then new calls for the rest."""
    caller = running[0]
    for level, entry in enumerate(stack.values()):
        same = running[level + 1].entry if level + 1 < len(running) else None
        if same is entry or (not by_identity and same == entry):
            caller = running[level + 1]
            continue
        if by_identity and id(entry) in started:
            break  # recorded after this module returned (a view re-read): its caller's
        _resume(running, caller)
        path = entry[0]
        if _below(path, caller.path) is None:
            raise _not_a_child(path, caller.path, node)
        caller = _Call(entry, caller)
        running.append(caller)
        started.add(id(entry))
    return _resume(running, caller)


def _resume(running: list[_Call], call: _Call) -> _Call:
    """Back in ``call``: the calls it made have returned."""
    while running[-1] is not call:
        running.pop()
    return call


def _not_a_child(path: str, caller: str, node: Node) -> UnflattenError:
    trace = node.meta.get("stack_trace", "").rstrip()
    where = f"\n{trace}" if trace else ""
    return UnflattenError(
        f"unflatten: module {path!r} runs inside {caller!r} (at %{node.name}) but is not one of "
        f"its submodules, and a module's graph can only call its own children; register it "
        f"under {caller!r}, or run the flat program with ep.module(){where}"
    )


# ------------------------------------------------------------------ graphs


class _Context:
    """What every call's graph needs to know of the program, computed once."""

    def __init__(self, ep: ExportedProgram, owner: dict[Node, _Call]) -> None:
        self.owner = owner
        placeholders = ep.graph.find_nodes(op="placeholder")
        specs = ep.graph_signature.input_specs
        self.state = {n: s.target for n, s in zip(placeholders, specs) if s.kind in STATE_KINDS}
        self.state_by_target = {target: node for node, target in self.state.items()}
        self.placeholders = {node.name: node for node in placeholders}
        self.writes: dict[Node, list[Node]] = {}  # new value -> the placeholders it is written to
        self.late_writes: list[tuple[Node, Node]] = []  # (target, value) written at the end
        self.user_outputs: list[Any] = []  # what the program returns: nodes and constants
        self.returned: set[Node] = set()  # the nodes among them
        self.graphs: dict[str, _Builder] = {}  # path -> its first call's builder
        self._structures: dict[str, list[tuple]] = {}
        self.calls: dict[str, int] = {}
        self._read_outputs(ep)

    def _read_outputs(self, ep: ExportedProgram) -> None:
        output = ep.graph.find_nodes(op="output")
        results = list(output[0].args[0]) if output else []
        for spec, value in zip(ep.graph_signature.output_specs, results):
            if spec.kind is OutputKind.USER_OUTPUT:
                self.user_outputs.append(value)
                if isinstance(value, Node):
                    self.returned.add(value)
                continue
            target = self._written(spec)
            if value.op == "placeholder":
                self.late_writes.append((target, value))
            else:
                self.writes.setdefault(value, []).append(target)

    def _written(self, spec: Any) -> Node:
        if spec.kind is OutputKind.USER_INPUT_MUTATION:
            return self.placeholders[spec.target]
        return self.state_by_target[spec.target]

    def used_outside(self, node: Node, call: _Call) -> bool:
        for user in node.users:
            if user.op == "output":
                if node in self.returned:
                    return True
            elif not call.encloses(self.owner.get(user)):
                return True
        return False

    def record(self, call: _Call, builder: _Builder) -> None:
        """Keep a module's first call's graph; check a later call runs the same operators."""
        path = call.path
        self.calls[path] = self.calls.get(path, 0) + 1
        first = self.graphs.get(path)
        if first is None:
            self.graphs[path] = builder
            return
        if path not in self._structures:
            self._structures[path] = _structure(first.graph)
        if _structure(builder.graph) != self._structures[path]:
            raise _calls_differ(path, self.calls[path], first.graph, builder.graph)


class _Builder:
    """Builds the graph of one call from its operators and the calls it made."""

    def __init__(self, call: _Call, context: _Context) -> None:
        self.call = call
        self.context = context
        self.graph = Graph()
        self.values: dict[Node, Node] = {}  # flat node -> its value in this graph
        self.inputs: list[Node] = []  # flat nodes passed in, in placeholder order
        self.defined: list[Node] = []  # flat nodes computed here or by a child, in order
        self.exports: list[Node] = []  # the defined nodes used outside this call
        self._last_input: Node | None = None

    def build(self) -> _Builder:
        self.run_items()
        self.exports = [n for n in self.defined if self.context.used_outside(n, self.call)]
        values = [self.values[n] for n in self.exports]
        if len(values) == 1:
            self.graph.output(values[0])
        else:  # None for a call that only writes state, as its forward returns
            self.graph.output(tuple(values) if values else None)
        return self

    def run_items(self) -> None:
        for item in self.call.items:
            if isinstance(item, _Call):
                self.call_child(item)
            else:
                self.copy(item)

    def read(self, node: Node) -> Node:
        """``node``'s value here: computed here, state this module owns, or a new input."""
        found = self.values.get(node)
        if found is not None:
            return found
        target = self.context.state.get(node)
        owned = _below(target, self.call.path) if target is not None else None
        if owned is not None:
            value = self.graph.get_attr(owned)
            value.meta = dict(node.meta)
        else:
            value = self._input(node)
        self.values[node] = value
        return value

    def _input(self, node: Node) -> Node:
        point = (
            self.graph.inserting_after(self._last_input)
            if self._last_input is not None
            else self.graph.inserting_before(None)
        )
        with point:
            value = self._last_input = self.graph.placeholder(node.name)
        value.meta = dict(node.meta)
        self.inputs.append(node)
        return value

    def copy(self, node: Node) -> None:
        value = self.values[node] = self.graph.node_copy(node, self.read)
        if node.op == "get_attr" and node.target in node.graph.constants:
            # A branch of fxloom.cond: the module running it holds it.
            self.graph.constants[node.target] = node.graph.constants[node.target]
        self.defined.append(node)
        for target in self.context.writes.get(node, ()):
            self.graph.call_function(aten.copy_.default, (self.read(target), value))

    def call_child(self, call: _Call) -> None:
        child = _Builder(call, self.context).build()
        self.context.record(call, child)
        target = _below(call.path, self.call.path)
        result = self.graph.call_module(target, tuple(self.read(n) for n in child.inputs))
        if len(child.exports) == 1:
            self.values[child.exports[0]] = result
            result.meta["val"] = child.exports[0].meta.get("val")
        else:
            for index, node in enumerate(child.exports):
                item = self.graph.create_node(
                    "call_function", operator.getitem, (result, index), {}, name=node.name
                )
                item.meta["val"] = node.meta.get("val")
                self.values[node] = item
        self.defined.extend(child.exports)


class _RootBuilder(_Builder):
    """The root's graph: ``ep.module()``'s inputs, checks and outputs around the calls."""

    def __init__(self, call: _Call, context: _Context, ep: ExportedProgram) -> None:
        super().__init__(call, context)
        self.ep = ep

    def build(self) -> _RootBuilder:
        placeholders = self.ep.graph.find_nodes(op="placeholder")
        inputs = {}
        for node, spec in zip(placeholders, self.ep.graph_signature.input_specs):
            if spec.kind not in STATE_KINDS:
                inputs[node] = self.values[node] = self.graph.placeholder(node.name)
                inputs[node].meta = dict(node.meta)
        add_input_checks(self.graph, inputs, self.ep.size_ranges())
        self.run_items()
        for target, value in self.context.late_writes:
            self.graph.call_function(aten.copy_.default, (self.read(target), self.read(value)))
        outputs = [
            self.read(value) if isinstance(value, Node) else value
            for value in self.context.user_outputs
        ]
        self.graph.output(tuple(outputs))
        info = PyTreeInfo(self.ep.arg_names, self.ep.in_spec, self.ep.out_spec)
        self.graph.set_codegen(PyTreeCodeGen(info))
        return self


def _below(path: str, module: str) -> str | None:
    """``path`` as reached from the module at ``module`` (None: not inside it)."""
    if not module:
        return path
    return path[len(module) + 1 :] if path.startswith(module + ".") else None


def _structure(graph: Graph) -> list[tuple]:
    """A graph as comparable rows: op, target and arguments by position."""
    index: dict[Node, int] = {}
    rows = []
    for position, node in enumerate(graph.nodes):
        index[node] = position
        target = None if node.op == "placeholder" else node.target
        args = map_arg(node.args, index.__getitem__)
        rows.append((node.op, target, args, map_arg(node.kwargs, index.__getitem__)))
    return rows


def _calls_differ(path: str, count: int, first: Graph, later: Graph) -> UnflattenError:
    where = ""
    pairs = zip(first.nodes, later.nodes, _structure(first), _structure(later))
    for old, new, old_row, new_row in pairs:
        if old_row != new_row:
            where = f"; first difference: {old.format_node()} vs {new.format_node()}"
            break
    return UnflattenError(
        f"unflatten: module {path!r} is called more than once and call {count} runs other "
        f"operators than call 1 (different shapes or arguments?){where}. A module here has one "
        "graph for all its calls: call it the same way each time, or run the flat program with "
        "ep.module()"
    )


# ------------------------------------------------------------------ modules


def _assemble(ep: ExportedProgram, context: _Context, root: _RootBuilder) -> GraphModule:
    """The module tree in the source model's order, state at its paths, then the graphs."""
    hierarchy = ep.module_hierarchy
    root_class = hierarchy.get("")
    tree = GraphModule(torch.nn.Module(), Graph(), class_name=_class_name(root_class))
    modules: dict[str, torch.nn.Module] = {}
    for path, builder in context.graphs.items():
        cls = builder.call.cls or hierarchy.get(path)
        modules[path] = GraphModule(torch.nn.Module(), Graph(), class_name=_class_name(cls))
    paths = [path for path in hierarchy if path] + [p for p in modules if p not in hierarchy]
    for path in paths:
        module = modules[path] if path in modules else torch.nn.Module()  # ran no operator
        attr_path.install(tree, path, module)
    for spec in ep.graph_signature.input_specs:
        if spec.kind in STATE_KINDS:
            attr_path.install(
                tree,
                spec.target,
                ep.tensor_of(spec.target, spec.kind),
                as_buffer=spec.kind is InputKind.BUFFER,
                persistent=spec.persistent is not False,
            )
    graphs = [(modules[path], builder.graph) for path, builder in context.graphs.items()]
    for module, graph in [*graphs, (tree, root.graph)]:
        module.graph = graph
        for name, branch in graph.constants.items():  # branches of fxloom.cond
            attr_path.install(module, name, branch)
    tree._in_spec, tree._out_spec = ep.in_spec, ep.out_spec
    return tree


def _class_name(cls: type | None) -> str:
    return cls.__name__ if cls is not None else "UnflattenedModule"
