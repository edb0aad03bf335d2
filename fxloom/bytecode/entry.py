"""One cache entry: the guard, the graph and the generated function that runs them.

Compiling a call (``compile_entry``) interprets the function on the call's arguments,
then generates the entry's Python: the guard (``fxloom.bytecode.guards``) and a ``run``
function that reads the graph's inputs by their sources, calls the backend's compiled
graph and rebuilds the value the function returns::

    def run(L_x, L_self):
        out = GRAPH(L_x, L_self.fc.weight, L_self.fc.bias)
        return (out[0], {"hidden": out[1], "n": 3})

Depends on ``fxloom.bytecode`` (interpreter, calls, recording, handlers), the IR and pytree.
"""

from __future__ import annotations

import inspect
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
from fxloom.bytecode.guards import GuardSet, global_state
from fxloom.bytecode.interpreter import Frame, Interpreter
from fxloom.bytecode.recording import CONSTANT_TYPES, Recording
from fxloom.bytecode.sources import Local, local_name
from fxloom.graph_module import GraphModule
from fxloom.values.capturing import capturing
from fxloom.values.stand_in import StandIn

__all__ = ["CacheEntry", "compile_entry"]


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


def compile_entry(
    fn: types.FunctionType,
    parameters: Sequence[str],
    values: Sequence[Any],
    backend: Callable[[GraphModule, list], Callable[..., Any]],
    root: torch.nn.Module | None,
) -> CacheEntry:
    """Interpret ``fn`` on the call's argument ``values`` (in ``parameters`` order) and build
    its cache entry. Raises ``Break`` where it cannot capture the whole function."""
    started = time.perf_counter()
    recording = Recording(root, parameters[0] if root is not None else None)
    interp = Interpreter(recording)
    frame = _entry_frame(fn, recording, parameters, values)
    state = global_state()
    try:
        with capturing("bytecode"):
            result = interp.run(frame)
    finally:
        torch.set_grad_enabled(state[0])  # the program may have switched it while recorded
    outputs, rebuild = _returned(recording, result)
    namespace = _namespace(fn, recording)
    replay = _replayed_writes(recording, outputs, namespace)
    graph_module = recording.graph.finish(outputs, f"Compiled_{fn.__name__}")
    run_source, read_inputs = _run_source(recording, parameters, rebuild, replay)
    example_inputs = eval(
        f"({read_inputs},)", {**namespace, **dict(zip(map(local_name, parameters), values))}
    )  # noqa: S307
    namespace["GRAPH"] = backend(graph_module, list(example_inputs))
    namespace["RETURNED"] = rebuild
    exec(compile(run_source, f"<fxloom run {fn.__qualname__}>", "exec"), namespace)  # noqa: S102
    guards = recording.guards
    return CacheEntry(
        guard=guards.compile(parameters, fn.__globals__, fn.__closure__),
        run=namespace["run"],
        graph_module=graph_module,
        guards=guards,
        guard_source=guards.source_code(parameters),
        run_source=run_source,
        seconds=time.perf_counter() - started,
        parameters=tuple(parameters),
    )


def _entry_frame(
    fn: types.FunctionType, recording: Recording, parameters: Sequence[str], values: Sequence[Any]
) -> Frame:
    local_values = {}
    variadic = _variadic(fn)
    for name, value in zip(parameters, values):
        if recording.root is not None and name == parameters[0]:
            recording.guards.identity(Local(name), value)
            local_values[name] = value
        elif name in variadic:  # made by Python for this call: the program's own container
            local_values[name] = recording.built(recording.read_variadic(value, Local(name)))
        else:
            local_values[name] = recording.read(value, Local(name))
    cells: dict[str, Any] = {}
    for name in fn.__code__.co_cellvars:
        cell = types.CellType()
        if name in local_values:
            cell.cell_contents = local_values.pop(name)
        cells[name] = recording.built(cell)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        cells[name] = cell
    return Frame(fn, local_values, cells)


def _variadic(fn: types.FunctionType) -> set[str]:
    """The names of ``fn``'s ``*args`` and ``**kwargs`` parameters."""
    code = fn.__code__
    index = code.co_argcount + code.co_kwonlyargcount
    names = set()
    if code.co_flags & inspect.CO_VARARGS:
        names.add(code.co_varnames[index])
        index += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        names.add(code.co_varnames[index])
    return names


# ------------------------------------------------------------------ the value returned
@dataclass(frozen=True)
class _Returned:
    """How ``run`` rebuilds the return value: pytree leaves, each an output index or a constant."""

    leaves: list[Any]  # int i: graph output i; _Constant(v): v itself
    spec: Any
    inline: str | None  # the same, as one Python expression over ``out``, where plain


@dataclass(frozen=True)
class _Constant:
    value: Any


def _returned(recording: Recording, result: Any) -> tuple[list[Any], _Returned]:
    """The graph's outputs (stand-ins, each once) and how to rebuild the return value."""
    outputs: list[Any] = []
    position: dict[int, int] = {}

    def output_index(value: StandIn) -> int:
        index = position.setdefault(id(value), len(outputs))
        if index == len(outputs):
            outputs.append(value)
        return index

    leaves, spec = pytree.tree_flatten(result)
    marked: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, StandIn):
            marked.append(output_index(leaf))
        elif id(leaf) in recording.created and type(leaf) not in CONSTANT_TYPES:
            raise Break(
                "return-object", f"the function returns a {type(leaf).__qualname__} it made"
            )
        else:
            marked.append(_Constant(leaf))
    return outputs, _Returned(marked, spec, _inline(result, position))


def _inline(value: Any, position: dict[int, int]) -> str | None:
    """``value`` as a Python expression over ``out``, or None where it is not plain."""
    if isinstance(value, StandIn):
        return f"out[{position[id(value)]}]"
    kind = type(value)
    if kind is tuple or kind is list:
        items = [_inline(item, position) for item in value]
        if None in items:
            return None
        text = ", ".join(items)  # type: ignore[arg-type]
        if kind is list:
            return f"[{text}]"
        return f"({text},)" if len(items) == 1 else f"({text})"
    if kind is dict and all(type(key) is str for key in value):
        items = {key: _inline(item, position) for key, item in value.items()}
        if None in items.values():
            return None
        return "{" + ", ".join(f"{key!r}: {text}" for key, text in items.items()) + "}"
    if value is None or kind in (bool, int, str):
        return repr(value)
    return None


def _replayed_writes(
    recording: Recording, outputs: list[Any], namespace: dict[str, Any]
) -> list[str]:
    """Statements that assign, after the graph, the attributes the program assigned on
    objects from outside (their final values; tensors become graph outputs)."""
    statements = []
    for owner, name, value in recording.writes.values():
        target = recording.source_of(owner)
        if isinstance(value, StandIn):
            outputs.append(value)
            expr = f"out[{len(outputs) - 1}]"
        elif type(value) in CONSTANT_TYPES and (value is None or type(value) in (bool, int, str)):
            expr = repr(value)
        elif recording.source_of(value) is not None:
            expr = recording.source_of(value).expr
        elif id(value) in recording.created:
            raise Break(
                "outside-mutation",
                f"{target.text}.{name} is assigned a {type(value).__name__} the program made",
            )
        else:
            expr = f"W{len(namespace)}"
            namespace[expr] = value
        statements.append(f"setattr({target.expr}, {name!r}, {expr})")
    return statements


def _run_source(
    recording: Recording, parameters: Sequence[str], returned: _Returned, replay: list[str]
) -> tuple[str, str]:
    arguments = ", ".join(local_name(name) for name in parameters)
    read_inputs = ", ".join(source.expr for source in recording.graph.inputs)
    body = returned.inline if returned.inline is not None else "_rebuild(out, RETURNED)"
    writes = "".join(f"    {statement}\n" for statement in replay)
    source = f"def run({arguments}):\n    out = GRAPH({read_inputs})\n{writes}    return {body}\n"
    return source, read_inputs


def _rebuild(out: Sequence[Any], returned: _Returned) -> Any:
    values = [leaf.value if type(leaf) is _Constant else out[leaf] for leaf in returned.leaves]
    return pytree.tree_unflatten(values, returned.spec)


def _namespace(fn: types.FunctionType, recording: Recording) -> dict[str, Any]:
    return {
        "G": fn.__globals__,
        "C": fn.__closure__ or (),
        "MODULES": sys.modules,
        "_rebuild": _rebuild,
    }
