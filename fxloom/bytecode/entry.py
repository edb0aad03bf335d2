"""One cache entry: the guard, the graph and the generated function that runs them.

Compiling a call (``compile_entry``) interprets the function on the call's arguments,
then generates the entry's Python: the guard (``fxloom.bytecode.guards``) and a ``run``
function that reads the graph's inputs by their sources, calls the backend's compiled
graph and rebuilds the value the function returns::

    def run(L_x, L_self):
        out = GRAPH(L_x, L_self.fc.weight, L_self.fc.bias)
        return (out[0], {"hidden": out[1], "n": 3})

The program's changes to outside objects and its output run after the graph. Where there are
any, an op of the graph that raises makes the entry do those that eager did before that op
(``RAISED``, with a ``replay`` function generated from ``Changes.steps``), then re-raise.

Depends on ``fxloom.bytecode`` (interpreter, calls, recording, handlers), the IR and pytree.
"""

from __future__ import annotations

import re
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fxloom import pytree
from fxloom.bytecode import handlers  # noqa: F401 - registers the instruction handlers
from fxloom.bytecode.breaks import Break
from fxloom.bytecode.dynamic import grew_state
from fxloom.bytecode.guards import Guard, GuardSet, global_state
from fxloom.bytecode.handlers.calling import REMADE_MANAGERS, pending_exit
from fxloom.bytecode.handlers.control import ListIterator
from fxloom.bytecode.handlers.generators import is_lazy, rebuilt
from fxloom.bytecode.interpreter import NULL, Frame, Interpreter, Stopped
from fxloom.bytecode.recording import CONSTANT_TYPES, Recording
from fxloom.bytecode.side_effects import describe, each_statements, statements
from fxloom.bytecode.sources import Attr, Item, Local, local_name
from fxloom.graph_module import GraphModule, _note_failing_node
from fxloom.ops import state_effects
from fxloom.values.capturing import capturing
from fxloom.values.signature import code_variadic_names
from fxloom.values.stand_in import StandIn
from fxloom.values.symbolic_scalars import SYMBOLIC_TYPES

__all__ = ["CacheEntry", "Next", "Start", "compile_entry"]


@dataclass
class CacheEntry:
    """A compiled version of the function, valid while ``guard`` holds."""

    guard: Callable[..., bool]
    run: Callable[..., Any]
    graph_module: GraphModule
    guards: GuardSet
    guard_source: str
    run_source: str
    seconds: float
    hits: int = 0
    parameters: tuple[str, ...] = field(default=())
    held: dict[str, Any] = field(default_factory=dict)  # ``R``: the root's submodules by path


CELLS = ".cells"  # the parameter of a piece that holds the frame's cells (``Next.cells``)


@dataclass(frozen=True)
class Start:
    """Where an entry starts: the function's first instruction (a call), or, after a graph
    break, instruction ``index`` with ``stack_depth`` values on the stack (the last
    ``stack_depth`` of the entry's parameters before ``CELLS``); ``cells``: the last
    parameter is the frame's cells, made by the first piece (``Next.cells``)."""

    index: int = 0
    stack_depth: int = 0
    cells: bool = False


class Next:
    """What a piece that ends at a graph break returns: continue at instruction ``index``
    (the break's own, which the driver runs as Python) with these locals and stack, and the
    frame's own cells (``types.CellType``, one per ``co_cellvars`` name, in that order): made
    once per call by the first piece and handed on, so that every piece, the instructions
    run as Python between them and the closures the call makes share them, as in eager.
    ``data``: the numbers among them that the piece read from tensor data (``.item()`` kept
    in its graph), which the next piece takes as symbols (``driver._promote``)."""

    __slots__ = ("index", "locals", "stack", "cells", "data")

    def __init__(
        self,
        index: int,
        local_values: dict[str, Any],
        stack: list[Any],
        cells: tuple = (),
        data: tuple = (),
    ) -> None:
        self.index = index
        self.locals = local_values
        self.stack = stack
        self.cells = cells
        self.data = data


def compile_entry(
    fn: types.FunctionType,
    parameters: Sequence[str],
    values: Sequence[Any],
    backend: Callable[[GraphModule, list], Callable[..., Any]],
    root: torch.nn.Module | None,
    start: Start = Start(),
) -> tuple[CacheEntry, Break | None]:
    """Interpret ``fn`` from ``start`` on the real ``values`` of ``parameters`` and build a
    cache entry, with the graph break it stops at (None: it runs to the return). Raises
    ``Break`` where no piece can be captured (the function runs as Python from there)."""
    started = time.perf_counter()
    effects = _runs_graph_as_is(backend)
    recording, outcome, cell_sources, stop = _capture(fn, parameters, values, root, start, effects)
    if grew_state(recording):  # a cache it grows: again, with that length symbolic
        recording, outcome, cell_sources, stop = _capture(
            fn, parameters, values, root, start, effects
        )
    namespace = _namespace(fn, recording)
    emitter = _Emitter(recording, namespace, fn, cell_sources)
    run_source, read_inputs = _run_source(recording, parameters, emitter, outcome)
    ordinals = _ordinals(recording.graph.graph)  # before dead code goes
    graph_module = recording.graph.finish(emitter.outputs, f"Compiled_{fn.__name__}")
    if _handles_raise(recording, read_inputs, emitter):
        replay_source = _replay_source(recording, parameters, namespace)
        exec(compile(replay_source, f"<fxloom replay {fn.__qualname__}>", "exec"), namespace)  # noqa: S102
        namespace["RAISED"] = Raised(
            graph_module, ordinals, namespace["replay"], recording.changes.steps
        )
    # the graph's own flag as the program ran (inference passes read it); not .train(): its
    # submodules are the program's own modules, each in the mode its owner left it in
    graph_module.training = root.training if root is not None else False
    recording.guard_identities(_writes(graph_module))
    arguments = dict(zip(map(local_name, parameters), values))
    example_inputs = eval(f"[{read_inputs}]", {**namespace, **arguments})  # noqa: S307
    namespace["GRAPH"] = backend(graph_module, example_inputs)
    exec(compile(run_source, f"<fxloom run {fn.__qualname__}>", "exec"), namespace)  # noqa: S102
    guards = recording.guards
    entry = CacheEntry(
        guard=guards.compile(parameters, fn.__globals__, fn.__closure__, recording.held),
        run=namespace["run"],
        graph_module=graph_module,
        guards=guards,
        guard_source=guards.source_code(parameters),
        run_source=run_source,
        seconds=time.perf_counter() - started,
        parameters=tuple(parameters),
        held=recording.held,
    )
    return entry, stop


def _runs_graph_as_is(backend: Any) -> bool:
    """Whether ``backend`` runs the GraphModule's own code, effects and all (the eager one):
    then a ``with torch.autocast`` is recorded in the graph (``state_effects``). A backend
    that translates the ops (onnxruntime) would run them in its own dtypes, deaf to the
    switch, and an unknown one might: for those autocast stays at piece boundaries."""
    from fxloom.bytecode.compiled import eager_backend

    # a named backend arrives as its bound ``compile_program``; the backend says whether it runs
    # the graph's own code (``Backend.runs_graph_code``), so this layer need not import it
    owner = getattr(backend, "__self__", None)
    return backend is eager_backend or getattr(owner, "runs_graph_code", False) is True


def _capture(fn, parameters, values, root, start: Start, effects: bool, keep_data: bool = True):
    """Interpret to the end, or to the graph break where no piece can be captured; then the
    recording, its outcome, the cells' sources and the break (None: it ran to the return).
    ``effects``: autocast is recorded in the graph (``_runs_graph_as_is``). ``keep_data``:
    ``.item()`` stays in the graph (``calls._data_number``); where the program's sizes came to
    depend on such a number (``torch.zeros(n)``: the ShapeEnv took ``n >= 0``), which no guard
    can check before the call, the capture runs again with every ``.item()`` a break."""
    stop: Break | None = None
    try:
        try:
            recording, outcome, cell_sources = _interpret(
                fn, parameters, values, root, start, None, effects, keep_data
            )
        except Break as error:
            if error.top_index is None:
                raise
            stop = error
            recording, outcome, cell_sources = _interpret(
                fn, parameters, values, root, start, error.top_index, effects, keep_data
            )
    finally:
        # Inside an autocast region the program entered (a piece starting within one), the
        # casts capture made of stand-ins sit in autocast's weight cache, keyed by the
        # weights: the real run would find them there. Capture leaves the cache empty.
        torch.clear_autocast_cache()
    if keep_data and _assumes_on_data(recording):
        return _capture(fn, parameters, values, root, start, effects, keep_data=False)
    return recording, outcome, cell_sources, stop


def _assumes_on_data(recording: Recording) -> bool:
    """Whether the ShapeEnv took a fact about a number the graph reads from data."""
    graph, sizes = recording.graph, recording.guards.sizes
    if not graph.data_symbols or sizes is None or sizes.env is None:
        return False
    env = sizes.env
    return any(
        not graph.data_symbols.isdisjoint(guard.expr.free_symbols)
        for guard in (*env.guards, *env.deferred_assertions)
    )


def _interpret(
    fn, parameters, values, root, start: Start, stop_at: int | None, effects: bool,
    keep_data: bool = True,
):  # fmt: skip
    recording = Recording(root, _self_name(fn) if root is not None else None)
    recording.state_in_graph = effects  # ``calls.records_autocast``
    recording.keeps_data = keep_data  # ``calls._data_number``
    interp = Interpreter(recording)
    interp.read_handed_on = lambda value, source: _read_local(fn, interp, value, source)
    frame = _start_frame(fn, interp, parameters, values, start)
    state = global_state()
    autocast = state_effects.saved_autocast()
    try:
        with capturing("bytecode"):
            return recording, interp.run(frame, stop_at), interp.cell_sources
    finally:
        # the program may have switched them while recorded (``with no_grad()``, autocast)
        torch.set_grad_enabled(state[0])
        state_effects.restore_autocast(autocast)
        recording.close_changes()  # outside objects back as the call found them


def _writes(graph_module: GraphModule) -> bool:
    """Whether the graph may write to a tensor (an in-place op, ``out=``, a side effect: the
    IR's own impurity rule, ``Node.is_impure``)."""
    return any(
        node.op not in ("placeholder", "output") and node.is_impure()
        for node in graph_module.graph.nodes
    )


def _self_name(fn: types.FunctionType) -> str | None:
    """The parameter that holds the compiled module (None: it arrives inside ``*args``)."""
    return fn.__code__.co_varnames[0] if fn.__code__.co_argcount else None


def _start_frame(
    fn: types.FunctionType,
    interp: Interpreter,
    parameters: Sequence[str],
    values: Sequence[Any],
    start: Start,
) -> Frame:
    recording = interp.recording
    if start.cells:  # the frame's cells, from the piece before: outside the piece
        *parameters, _ = parameters
        *values, held_cells = values
        for index, cell in enumerate(held_cells):
            interp.cell_sources[id(cell)] = Item(Local(CELLS), index)  # before the locals
    local_count = len(parameters) - start.stack_depth
    local_values = {}
    variadic = code_variadic_names(fn) if start.index == 0 else ()
    root_name = recording.root_name
    for name, value in zip(parameters[:local_count], values):
        if name == root_name:
            recording.guards.identity(Local(name), value)
            local_values[name] = value
        elif name in variadic:  # made by Python for this call: the program's own container
            local_values[name] = recording.built(recording.read_variadic(value, Local(name)))
        else:
            local_values[name] = _read_local(fn, interp, value, Local(name))
    cells: dict[str, Any] = {}
    if start.cells:
        cells.update(zip(fn.__code__.co_cellvars, held_cells))
    else:
        for name in fn.__code__.co_cellvars:
            cell = types.CellType()
            if name in local_values:
                cell.cell_contents = local_values.pop(name)
            cells[name] = recording.built(cell)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        cells[name] = cell
    frame = Frame(fn, local_values, cells)
    frame.ip = start.index
    for name, value in zip(parameters[local_count:], values[local_count:]):
        frame.stack.append(value if value is NULL else _read_local(fn, interp, value, Local(name)))
        if pending_exit(value):
            interp.pending_exits.add(id(value))
    return frame


def _read_local(fn: types.FunctionType, interp: Interpreter, value: Any, source: Any) -> Any:
    """A value handed on by the piece before (a local, a stack value, the contents of one of
    the call's cells): read as usual, except a function the call made of one of ``fn``'s
    nested code objects (``lambda t: t * scale``), new at every call, which is read by what it
    is made of (``_read_made_function``)."""
    if type(value) is types.FunctionType and value.__code__ in _nested_codes(fn.__code__):
        made = _read_made_function(interp, value, source)
        if made is not None:
            return made
    return interp.recording.read(value, source)


def _nested_codes(code: types.CodeType) -> frozenset:
    """The code objects of the functions ``code`` defines, at any depth."""
    found = _NESTED.get(code)
    if found is None:
        inner = [const for const in code.co_consts if type(const) is types.CodeType]
        found = frozenset(inner).union(*map(_nested_codes, inner))
        _NESTED[code] = found
    return found


_NESTED: dict[types.CodeType, frozenset] = {}


def _read_made_function(interp: Interpreter, fn: types.FunctionType, source: Any) -> Any:
    """``fn``, a function the call made before the graph break, guarded by what it is made of
    instead of its identity (a recompile per call): its code and globals, its defaults (plain
    constants), and each cell of its closure, either one of the frame's own cells (the same
    cell, guarded so) or read through the function (``names._cell_source``). None where it
    carries more (attributes, defaults that are no constants): read as usual."""
    plain = all(
        type(item) in CONSTANT_TYPES
        for item in (*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values())
    )
    if vars(fn) or not plain:
        return None
    recording, guards = interp.recording, interp.recording.guards
    guards.exact_type(source, fn)
    guards.identity(Attr(source, "__code__"), fn.__code__)
    guards.identity(Attr(source, "__globals__"), fn.__globals__)
    guards.equals(Attr(source, "__defaults__"), fn.__defaults__)
    guards.equals(Attr(source, "__kwdefaults__"), fn.__kwdefaults__)
    for index, cell in enumerate(fn.__closure__ or ()):
        own = interp.cell_sources.get(id(cell))
        if own is not None:
            check = f"{source.expr}.__closure__[{index}] is {own.expr}"
            text = f"{source.text} closes over the call's cell {fn.__code__.co_freevars[index]}"
            guards.add(check, Guard(0, check, text))  # an identity guard (tier 0)
    recording._remember(fn, source)  # noqa: SLF001 - ``source_of(fn)``: its cells' reads
    return fn


# ------------------------------------------------------------------ values after the graph
_BOUND_BUILTIN = (types.BuiltinMethodType, types.MethodWrapperType)
# The containers a program makes that ``run`` makes again as one named object each, and the
# method that fills one (``_Emitter.container``).
_FILL = {list: "extend", set: "update", dict: "update"}
_NOT_IDENTIFIER = re.compile(r"\W")


class _Emitter:
    """Python expressions, over the graph's outputs ``out`` and the entry's arguments, for the
    values the program holds after the graph: what it returns, the attributes it assigned,
    and (at a graph break) its locals and stack. Stand-ins become graph outputs (each once);
    plain containers are built inline, registered pytree containers (model outputs, caches)
    rebuilt from their leaves; values read from outside are read again by their source."""

    def __init__(
        self,
        recording: Recording,
        namespace: dict[str, Any],
        fn: types.FunctionType | None = None,
        cell_sources: dict[int, Any] | None = None,
    ) -> None:
        self.recording = recording
        self.namespace = namespace
        self.fn = fn
        self.cell_sources = cell_sources or {}
        self._cells: dict[int, tuple[str, Any]] = {}  # id(cell the program made) -> its name
        self.outputs: list[Any] = []  # stand-ins and symbolic sizes
        self.data: list[str] = []  # the outputs computed from tensor data (``Next.data``)
        self._position: dict[int, int] = {}
        # With changes to replay, every value read again from outside is read once, before
        # them (``before``: expression -> name), as the program read it: ``return old`` after
        # ``obj.child = new`` is the old child, an item moved by ``insert`` the same item.
        self._changes = bool(recording.changes)
        self.before: dict[str, str] = {}
        self._made: dict[int, str] = {}  # id(function the program made) -> its name (operand)
        # id(list, set or dict the program made) -> (its name, it): ``container``
        self._containers: dict[int, tuple[str, Any]] = {}

    def _again(self, expr: str) -> str:
        """``expr``, a read from outside, as the value it has before the changes replay."""
        if not self._changes:
            return expr
        name = self.before.get(expr)
        if name is None:
            name = self.before[expr] = f"BEFORE_{len(self.before)}"
        return name

    def _has_source(self, value: Any) -> bool:
        recording = self.recording
        return id(value) not in recording.created and recording.source_of(value) is not None

    def expr(self, value: Any) -> str:
        if isinstance(value, StandIn):
            source = self.recording.graph.source_of_input.get(id(value))
            if source is not None:  # an input passed through: read it again, no graph output
                return self._again(source.expr)
            index = self._position.setdefault(id(value), len(self.outputs))
            if index == len(self.outputs):
                self.outputs.append(value)
            return f"out[{index}]"
        kind = type(value)
        if value is None or kind is bool or kind is int or kind is str:
            return repr(value)
        if kind in SYMBOLIC_TYPES:  # a symbolic size: computed by the graph from its inputs
            index = self._position.setdefault(id(value), len(self.outputs))
            if index == len(self.outputs):
                self.outputs.append(value)
                if self.recording.graph.is_data(value):
                    self.data.append(f"out[{index}]")
            return f"out[{index}]"
        if kind is torch.Size and any(type(item) in SYMBOLIC_TYPES for item in value):
            items = "".join(f"{self.expr(item)}, " for item in value)
            return f"{self.constant(torch.Size)}(({items}))"
        source = self.recording.source_of(value)
        if source is not None and id(value) not in self.recording.created:
            return self._again(source.expr)
        if kind in _BOUND_BUILTIN and isinstance(value.__self__, StandIn):  # x.item, x.size
            return f"{self.expr(value.__self__)}.{value.__name__}"
        if kind in _BOUND_BUILTIN and self._made_container(value.__self__):  # items.append
            return f"{self.container(value.__self__)}.{value.__name__}"
        if kind in _BOUND_BUILTIN and self._has_source(value.__self__):
            # ``seen.add`` of an object read from outside (handed on at a break, waiting on
            # the stack for its argument): bound again to this call's object, not capture's
            return f"{self.expr(value.__self__)}.{value.__name__}"
        if self._made_container(value):
            return self.container(value)
        if kind is ListIterator:
            items = ", ".join(self.expr(item) for item in value.items)
            return f"LIST_ITER([{items}], {value.position})"
        if kind is types.MethodType:
            return f"METHOD({self.expr(value.__func__)}, {self.expr(value.__self__)})"
        if kind is types.CellType:
            return self.cell(value)
        if kind is types.FunctionType and self._own_function(value):
            made = self.made_function(value)
            if made is not None:
                return made
        if kind is tuple or kind is list:
            items = [self.expr(item) for item in value]
            if kind is list:
                return "[" + ", ".join(items) + "]"
            return "(" + "".join(f"{item}, " for item in items) + ")"
        if kind is set or kind is frozenset:
            items = ", ".join(self.expr(item) for item in value)
            return f"{kind.__name__}([{items}])"
        if kind is dict:
            pairs = (f"{self.constant(key)}: {self.expr(item)}" for key, item in value.items())
            return "{" + ", ".join(pairs) + "}"
        container = pytree.container_type(kind)
        if container is not None:  # one level: its children may be outside objects themselves
            children, context = container.flatten(value)
            items = ", ".join(self.expr(child) for child in children)
            return f"{self.constant(container.unflatten)}([{items}], {self.constant(context)})"
        if id(value) in self.recording.created and (
            _plain_object(value) or isinstance(value, REMADE_MANAGERS)
        ):
            # An object the program made (a dataclass, a small class of its own): made again
            # with the same attributes, without running its __init__ a second time.
            state = ", ".join(f"{name!r}: {self.expr(item)}" for name, item in vars(value).items())
            return f"MAKE_OBJECT({self.constant(kind)}, {{{state}}})"
        if is_lazy(value):  # its frame lives in this compilation's interpreter only
            return rebuilt(value, self)
        if id(value) in self.recording.created and kind not in CONSTANT_TYPES:
            raise Break(
                "return-object",
                f"a {kind.__qualname__} the program made is live after the graph",
            )
        return self.constant(value)

    def _made_container(self, value: Any) -> bool:
        return type(value) in _FILL and id(value) in self.recording.created

    def operand(self, value: Any) -> str:
        """``value``, an operand the break's own instruction consumes (the driver runs it as
        Python, so no later piece reads it): a function the program made (``lambda t: t + 1``
        given to ``fxloom.cond``) is made again from its code, globals and defaults, once
        however often it is given. Elsewhere such a function stays a ``return-object`` break:
        a later piece would guard its identity, new at every call (a recompile each)."""
        if type(value) is not types.FunctionType or id(value) not in self.recording.created:
            return self.expr(value)
        made = self.made_function(value)
        return self.expr(value) if made is None else made

    def _own_function(self, value: types.FunctionType) -> bool:
        """Whether ``value`` is a function the call made of one of its own nested code objects
        (a later piece reads it by what it is made of: ``_read_made_function``)."""
        return (
            self.fn is not None
            and id(value) in self.recording.created
            and value.__code__ in _nested_codes(self.fn.__code__)
        )

    def made_function(self, fn: types.FunctionType) -> str | None:
        """A name for ``fn``, a function the program made, made again from its code, globals,
        defaults and closure (its cells: ``cell``), once however often it is given; None
        where it carries more (attributes, annotations)."""
        name = self._made.get(id(fn))
        if name is not None:
            return name
        if vars(fn) or fn.__annotations__:
            return None
        defaults = self.expr(fn.__defaults__) if fn.__defaults__ else "None"
        keyword_defaults = self.expr(fn.__kwdefaults__) if fn.__kwdefaults__ else "None"
        closure = (
            "(" + "".join(f"{self.cell(cell)}, " for cell in fn.__closure__) + ")"
            if fn.__closure__
            else "None"
        )
        code, namespace = self.constant(fn.__code__), self.constant(fn.__globals__)
        made = (
            f"{self.constant(_made_again)}({code}, {namespace}, {defaults}, {keyword_defaults}, "
            f"{closure})"
        )
        name = self._made[id(fn)] = f"MADE_{len(self._made)}"
        self.before[made] = name  # made before the changes replay, as the program made it
        return name

    def cell(self, cell: types.CellType) -> str:
        """An expression for ``cell``: one of the frame's cells handed on by the piece before
        (``Next.cells``), one of the compiled function's closure (``C``), or a cell the
        program made (``CELL_<k>``, made anew by ``run`` and filled by ``fill_cells``)."""
        own = self.cell_sources.get(id(cell))
        if own is not None:
            return own.expr
        closure = self.fn.__closure__ or () if self.fn is not None else ()
        for index, outer in enumerate(closure):
            if outer is cell:
                return f"C[{index}]"
        if id(cell) not in self.recording.created:
            raise Break("return-object", "a closure cell from outside reached by no source is live "
                        "after the graph")  # fmt: skip
        made = self._cells.get(id(cell))
        if made is None:
            made = self._cells[id(cell)] = (f"CELL_{len(self._cells)}", cell)
        return made[0]

    def made_cells(self) -> tuple[list[str], list[str]]:
        """The statements that make the cells ``cell`` named and the containers
        ``container`` named (run first: the functions made again close over the cells, and
        every reference to one container names the same object), and those that fill them
        with what the program left in them (run once those functions are made: a cell may
        hold one)."""
        filled: list[str] = []
        cells_done = containers_done = 0
        # Filling one may name more (a function in a cell, a list in a list).
        while cells_done < len(self._cells) or containers_done < len(self._containers):
            if cells_done < len(self._cells):
                name, cell = list(self._cells.values())[cells_done]
                cells_done += 1
                try:
                    contents = cell.cell_contents
                except ValueError:  # an empty cell stays empty
                    continue
                filled.append(f"{name}.cell_contents = {self.expr(contents)}")
                continue
            name, container = list(self._containers.values())[containers_done]
            containers_done += 1
            if container:
                filled.append(f"{name}.{_FILL[type(container)]}({self._contents(container)})")
        made = [f"{name} = CELL()" for name, _ in self._cells.values()]
        made += [f"{name} = {type(value).__name__}()" for name, value in self._containers.values()]
        return made, filled

    def container(self, value: list | set | dict) -> str:
        """A name for ``value``, a list, set or dict the program made: made empty once, then
        filled (``made_cells``), so that two locals, a stack slot and a bound method
        (``items.append``) left at a break all hold the one object, as in eager."""
        found = self._containers.get(id(value))
        if found is None:
            found = self._containers[id(value)] = (f"MADE_{type(value).__name__.upper()}_"
                                                   f"{len(self._containers)}", value)  # fmt: skip
        return found[0]

    def _contents(self, container: list | set | dict) -> str:
        if type(container) is dict:
            pairs = (f"{self.constant(key)}: {self.expr(item)}" for key, item in container.items())
            return "{" + ", ".join(pairs) + "}"
        return "[" + ", ".join(self.expr(item) for item in container) + "]"

    def constant(self, value: Any) -> str:
        if value is None or type(value) in (bool, int, str):
            return repr(value)
        label = getattr(value, "__name__", None) or type(value).__name__
        name = f"{_NOT_IDENTIFIER.sub('_', label)}_{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def effects(self) -> list[str]:
        """Statements run after the graph, in program order: the program's changes to
        outside objects and its deferred Python output (``fxloom.bytecode.side_effects``)."""
        return statements(self.recording.changes.log, self.expr, self.constant)

    def reads_before(self) -> list[str]:
        """The statements that read the values ``_again`` named, before any change."""
        return [f"{name} = {expr}" for expr, name in self.before.items()]


def _consumed_from(frame: Frame) -> int:
    """The index of the first stack value the break's own instruction (a call) consumes."""
    instruction = frame.instructions[frame.ip]
    if instruction.op != "CALL":
        return len(frame.stack)
    return len(frame.stack) - (instruction.nargs + len(instruction.kwnames) + 2)


def _made_again(
    code: types.CodeType,
    namespace: dict,
    defaults: tuple | None,
    keyword_defaults: dict | None,
    closure: tuple | None = None,
) -> types.FunctionType:
    """The function ``MAKE_FUNCTION`` makes of ``code`` (a new one, as each call makes)."""
    fn = types.FunctionType(code, namespace, code.co_name, defaults, closure)
    fn.__kwdefaults__ = keyword_defaults
    return fn


def _run_source(
    recording: Recording, parameters: Sequence[str], emitter: _Emitter, outcome: Any
) -> tuple[str, str]:
    arguments = ", ".join(local_name(name) for name in parameters)
    effects = emitter.effects()
    if isinstance(outcome, Stopped):
        frame = outcome.frame
        local_values = (
            "{"
            + ", ".join(f"{name!r}: {emitter.expr(value)}" for name, value in frame.locals.items())
            + "}"
        )
        consumed = _consumed_from(frame)
        stack = (
            "["
            + ", ".join(
                (emitter.operand if index >= consumed else emitter.expr)(value)
                for index, value in enumerate(frame.stack)
            )
            + "]"
        )
        cells = "".join(f"{emitter.cell(frame.cells[name])}, " for name in frame.code.co_cellvars)
        data = "".join(f"{item}, " for item in emitter.data)
        result = f"NEXT({frame.ip}, {local_values}, {stack}, ({cells}), ({data}))"
    else:
        result = emitter.expr(outcome)
    make_cells, fill_cells = emitter.made_cells()
    held = recording.graph.held
    read_inputs = ", ".join(
        emitter.constant(held[index]) if index in held else recording.guards.read_code(source)
        for index, source in enumerate(recording.graph.inputs)
    )
    graph_call = f"    out = GRAPH({read_inputs})\n" if emitter.outputs or read_inputs else ""
    if _handles_raise(recording, read_inputs, emitter):  # costs nothing unless it raises
        graph_call = (
            f"    try:\n    {graph_call}    except Exception as error:\n"
            f"        RAISED(error{''.join(', ' + local_name(name) for name in parameters)})\n"
            "        raise\n"
        )
    if graph_call and _switches_grad_mode(recording):
        # A graph op that raises inside a ``with no_grad()`` the graph holds whole would skip
        # the switch back: eager's ``with`` restores grad mode on the way out, so does ``run``.
        body = "".join(f"    {line}\n" for line in graph_call.splitlines())
        graph_call = (
            "    GRAD_MODE = IS_GRAD_ENABLED()\n    try:\n"
            f"{body}    except BaseException:\n        SET_GRAD_ENABLED(GRAD_MODE)\n        raise\n"
        )
    if graph_call and _switches_autocast(recording):  # the same for a ``with torch.autocast``
        body = "".join(f"    {line}\n" for line in graph_call.splitlines())
        graph_call = (
            "    AUTOCAST = SAVED_AUTOCAST()\n    try:\n"
            f"{body}    except BaseException:\n        RESTORE_AUTOCAST(AUTOCAST)\n        raise\n"
        )
    # Values read again from outside are read before the changes replay (see ``_again``).
    # The cells the program made first (functions made again close over them), filled once
    # those functions are made.
    statements = (*make_cells, *emitter.reads_before(), *fill_cells, *effects)
    writes = "".join(f"    {statement}\n" for statement in statements)
    source = f"def run({arguments}):\n{graph_call}{writes}    return {result}\n"
    return source, read_inputs


# ------------------------------------------------------------------ when the graph raises
class _StepEmitter(_Emitter):
    """Expressions for ``replay``: a value the graph computed is read from the generated
    forward's frame as it stood when an op raised (``V``, by node name), not from graph
    outputs; ``needed`` collects the names a statement reads."""

    def __init__(self, recording: Recording, namespace: dict[str, Any]) -> None:
        super().__init__(recording, namespace)
        self.needed: set[str] = set()

    def cell(self, cell: types.CellType) -> str:
        raise _NotReplayable  # ``replay`` makes no cells

    def _made_container(self, value: Any) -> bool:
        return False  # built inline: ``replay`` makes no named containers

    def expr(self, value: Any) -> str:
        if isinstance(value, StandIn) and id(value) not in self.recording.graph.source_of_input:
            node = self.recording.graph.node_of(value)
            if node is None:
                raise _NotReplayable
            self.needed.add(node.name)
            return f"V[{node.name!r}]"
        if type(value) in SYMBOLIC_TYPES:  # no graph output: computed from the inputs read
            symbols = self.recording.guards.sizes
            code = None if symbols is None else symbols.value_code(value, self._again)
            if code is None:
                raise _NotReplayable
            self.namespace.update(symbols.namespace())
            return code
        return super().expr(value)


class _NotReplayable(Exception):
    """A step whose statements cannot be written (``replay`` stops before it)."""


def _replay_source(recording: Recording, parameters: Sequence[str], namespace: dict) -> str:
    """``replay(P, V, *arguments)``: the steps (``Changes.steps``) at positions ``<= P``, in
    order, with ``V`` the forward's locals; returns the index of the first step it could not
    do (a value it needs was released, or never computed), or None."""
    emitter = _StepEmitter(recording, namespace)
    steps = recording.changes.steps
    entries = [entry for _, entry in steps]
    each = each_statements(entries, emitter.expr, emitter.constant, steps=True)
    body: list[str] = []
    checked = 0
    for index, (position, _) in enumerate(steps):
        if position > checked:
            body.append(f"if P < {position}: return None")
            checked = position
        emitter.needed = set()
        try:
            lines = next(each)
        except (Break, _NotReplayable):
            body.append(f"return {index}")
            break
        if emitter.needed:
            body.append(f"if MISSING(V, {tuple(sorted(emitter.needed))!r}): return {index}")
        body.extend(lines)
    else:
        body.append("return None")
    arguments = "".join(f", {local_name(name)}" for name in parameters)
    lines = [*emitter.reads_before(), *body]
    return f"def replay(P, V{arguments}):\n" + "".join(f"    {line}\n" for line in lines)


def _ordinals(graph) -> dict[str, int]:
    """Each node's name -> how many nodes (placeholders aside) were recorded before it: a
    step at position ``p`` came before node ``n`` in the program when ``p <= ordinals[n]``."""
    recorded = (node for node in graph.nodes if node.op != "placeholder")
    return {node.name: index for index, node in enumerate(recorded)}


def _missing(frame_locals: Any, names: tuple[str, ...]) -> bool:
    """Whether a value of the forward is gone (released after its last use: ``None``)."""
    return any(frame_locals.get(name) is None for name in names)


class Raised:
    """``RAISED(error, *arguments)``: the graph raised ``error``. Finds the op that raised
    (the generated forward's line in the traceback), does the steps the program did before
    it (``replay``), and notes on ``error`` those it could not do."""

    __slots__ = ("graph_module", "ordinals", "replay", "steps")

    def __init__(self, graph_module: GraphModule, ordinals: dict[str, int], replay, steps):
        self.graph_module = graph_module
        self.ordinals = ordinals
        self.replay = replay
        self.steps = steps

    def __call__(self, error: BaseException, *arguments: Any) -> None:
        notes = getattr(error, "__notes__", ())
        if not any(note.startswith("fxloom: raised by") for note in notes):
            _note_failing_node(error, self.graph_module)
        located = self._locate(error)
        position, frame_locals = located if located is not None else (0, {})
        stopped = self.replay(position, frame_locals, *arguments)
        if stopped is not None:
            left = [entry for at, entry in self.steps[stopped:] if at <= position]
            error.add_note(
                "fxloom: the graph raised, and these changes or output the program made "
                "before the op that raised were not done (a value they need was not kept): "
                + ", ".join(map(describe, left))
            )
        if located is None:
            unknown = [entry for at, entry in self.steps if at > 0]
            if unknown:
                error.add_note(
                    "fxloom: the graph raised at an op fxloom cannot locate (the backend runs "
                    "its own code), so these changes or output of the program, which follow "
                    "its first op, were not done, though eager may have done some: "
                    + ", ".join(map(describe, unknown))
                )

    def _locate(self, error: BaseException) -> tuple[int, Any] | None:
        """(how many nodes ran before the one that raised, the forward's locals), or None
        where the traceback does not pass through the graph module's generated forward."""
        code, filename = self.graph_module._code, self.graph_module._source_file
        frame = line = None
        traceback = error.__traceback__
        while traceback is not None:
            if traceback.tb_frame.f_code.co_filename == filename:
                frame, line = traceback.tb_frame, traceback.tb_lineno
            traceback = traceback.tb_next
        if frame is None or code is None:
            return None
        ordinal = self.ordinals.get(code.node_at_line(line))
        return None if ordinal is None else (ordinal, frame.f_locals)


def _switches_grad_mode(recording: Recording) -> bool:
    """Whether the graph switches grad mode (a ``with no_grad()`` it holds)."""
    return any(
        node.target is torch._C._set_grad_enabled
        for node in recording.graph.graph.find_nodes(op="call_function")
    )


_AUTOCAST_EFFECTS = (state_effects.autocast_on, state_effects.autocast_back)


def _switches_autocast(recording: Recording) -> bool:
    """Whether the graph enters or leaves an autocast region (``state_effects``)."""
    return any(
        node.target in _AUTOCAST_EFFECTS
        for node in recording.graph.graph.find_nodes(op="call_function")
    )


def _handles_raise(recording: Recording, read_inputs: str, emitter: _Emitter) -> bool:
    """Whether ``run`` calls a graph and has changes or output to replay if it raises."""
    return bool(recording.changes.steps) and bool(emitter.outputs or read_inputs)


def _namespace(fn: types.FunctionType, recording: Recording) -> dict[str, Any]:
    return {"G": fn.__globals__, "C": fn.__closure__ or (), "MODULES": sys.modules, "R": recording.held,
            "NEXT": Next, "CELL": types.CellType, "IS_GRAD_ENABLED": torch.is_grad_enabled,
            "SET_GRAD_ENABLED": torch._C._set_grad_enabled,
            "SAVED_AUTOCAST": state_effects.saved_autocast,
            "RESTORE_AUTOCAST": state_effects.restore_autocast,
            "METHOD": types.MethodType, "LIST_ITER": ListIterator, "MAKE_OBJECT": _make_object,
            "MISSING": _missing}  # fmt: skip


def _plain_object(value: Any) -> bool:
    """Whether ``value`` is an instance whose whole state is its ``__dict__``."""
    cls = type(value)
    return (
        cls.__new__ is object.__new__
        and hasattr(value, "__dict__")
        and "__slots__" not in vars(cls)
        and not isinstance(value, torch.nn.Module | BaseException)
    )


def _make_object(cls: type, state: dict[str, Any]) -> Any:
    made = object.__new__(cls)
    made.__dict__.update(state)
    return made
