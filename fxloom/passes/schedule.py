"""Program scheduling (torch.fx paper, 6.2.3): overlap blocking calls with the work around them.

A model that fetches values from a parameter server usually writes each
blocking call right before the value is needed. Given, for such a function, a
non-blocking ``start`` that launches the call and returns a handle and a
``wait`` that takes the handle and returns the result, ``schedule_async``
rewrites every ``call_function`` of the blocking function into
``handle = start(*args, **kwargs)`` and ``result = wait(handle)``, then

* hoists each ``start`` as early as its inputs allow: right after the last
  node it uses (after the placeholders, if it uses only those);
* sinks each ``wait`` to just before the first node that uses the result,

so the remote work runs while the program does everything in between::

    >>> import concurrent.futures, torch, fxloom
    >>> from fxloom.passes.schedule import schedule_async
    >>> pool = concurrent.futures.ThreadPoolExecutor(2)
    >>> def fetch(key):  # blocking: imagine a network round trip
    ...     return key * 10
    >>> def start_fetch(key):
    ...     return pool.submit(fetch, key)
    >>> def wait_fetch(future):
    ...     return future.result()
    >>> g = fxloom.Graph()
    >>> x = g.placeholder("x")
    >>> h = g.call_function(torch.relu, (x,))
    >>> v = g.call_function(fetch, (x,))
    >>> _ = g.output(g.call_function(torch.add, (h, v)))
    >>> gm = fxloom.GraphModule(torch.nn.Module(), g)
    >>> _ = schedule_async(gm, {fetch: (start_fetch, wait_fetch)})
    >>> print(gm.code.strip())
    def forward(self, x):
        fetch_handle = start_fetch(x)
        relu = torch.relu(x);  x = None
        fetch = wait_fetch(fetch_handle);  fetch_handle = None
        add = torch.add(relu, fetch);  relu = fetch = None
        return add
    >>> gm(torch.ones(2))
    tensor([11., 11.])

Declare pairs for every call with ``register_async(blocking, start, wait)``, or
per call with the ``pairs`` argument (it wins over the registry). ``torch.distributed.rpc``'s
``rpc_sync`` is known already (``LIBRARY_ASYNC_CALLS``: ``rpc_wait(rpc_async(...))``). In a traced
module, a blocking function shows up as a ``call_function`` node when it is a
leaf of tracing: register it with ``fxloom.wrap``.

Side effects (see ``fxloom.passes._ordering``): neither half moves past a side
effect it must stay behind or ahead of. A blocking call that is itself impure
(e.g. registered with ``fxloom.has_side_effect``) keeps its place among the
other impure nodes: its start moves no earlier than the impure node before it,
its wait no later than the impure node (or impure call's start) after it — so
two impure blocking calls never overlap each other — and, as it may update its
arguments, the other readers of those stay on their side of it. A pure one — a
read-only fetch, the usual case — moves freely past impure nodes. Both halves
are also held between in-place updates of the call's arguments: the remote side
may read them until ``wait`` returns. Only ``call_function`` nodes are
rewritten.

Names and ``node.meta``: the blocking node itself becomes the ``wait`` (same
name, all of its ``meta`` kept: the value is the same); the ``start`` is a new
node named ``<blocking node>_handle`` (``fetch_handle``), given the blocking
node's provenance (``stack_trace``, ``source_location``, ``nn_module_stack``, ``source_fn_stack``).
When the blocking call was impure both halves get ``meta["is_impure"] = True``,
so dead-code elimination keeps them. Other nodes are not touched, only the start and wait
nodes move. The pass edits ``gm`` in place and returns it.

Depends on: the IR and ``_ordering``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.passes._ordering import (
    node_positions,
    side_effect_edges,
)
from fxloom.passes.captured import captured_module
from fxloom.values.provenance import PROVENANCE_KEYS

__all__ = [
    "ASYNC_CALLS",
    "LIBRARY_ASYNC_CALLS",
    "AsyncPair",
    "register_async",
    "rpc_wait",
    "schedule_async",
]

# meta keys saying where a node came from; the start half inherits them
_PROVENANCE_KEYS = PROVENANCE_KEYS


@dataclass(frozen=True)
class AsyncPair:
    """The non-blocking form of a blocking call: ``wait(start(*args, **kwargs))``."""

    start: Callable[..., Any]
    wait: Callable[[Any], Any]


# blocking function -> its non-blocking halves; extend with register_async
ASYNC_CALLS: dict[Callable[..., Any], AsyncPair] = {}


def rpc_wait(handle: Any) -> Any:
    """The value of a remote call started by ``rpc_async``: waits for it, raising its error.

    >>> import torch
    >>> done = torch.futures.Future()
    >>> done.set_result(3)
    >>> rpc_wait(done)
    3
    """
    return handle.wait()


# Library calls whose non-blocking form fxloom knows: (module, blocking, start), waited on by
# ``rpc_wait``. A table read by ``schedule_async``, found among imported modules (torch
# imports torch.distributed.rpc itself), so no import of fxloom.distributed is needed for it.
LIBRARY_ASYNC_CALLS: tuple[tuple[str, str, str], ...] = (
    # rpc_sync(to, func, args, kwargs, timeout) is rpc_wait(rpc_async(to, func, args, kwargs, timeout))
    ("torch.distributed.rpc.api", "rpc_sync", "rpc_async"),
)


def _library_pairs() -> dict[Callable[..., Any], AsyncPair]:
    """The rows of ``LIBRARY_ASYNC_CALLS`` whose library is here (torch built with rpc)."""
    pairs = {}
    for module_name, blocking, start in LIBRARY_ASYNC_CALLS:
        module = sys.modules.get(module_name)
        if hasattr(module, blocking) and hasattr(module, start):
            pairs[getattr(module, blocking)] = AsyncPair(getattr(module, start), rpc_wait)
    return pairs


def register_async(
    blocking: Callable[..., Any], start: Callable[..., Any], wait: Callable[[Any], Any]
) -> None:
    """Declare that ``blocking(*a, **k)`` may be run as ``wait(start(*a, **k))``.

    ``start`` takes the same arguments as ``blocking`` and returns a handle at once;
    ``wait`` takes that handle and returns what ``blocking`` would have.

    >>> import time
    >>> def blocking_sleep(seconds): time.sleep(seconds)
    >>> register_async(blocking_sleep, lambda s: time.time() + s,
    ...                lambda deadline: time.sleep(max(0.0, deadline - time.time())))
    >>> blocking_sleep in ASYNC_CALLS
    True
    >>> del ASYNC_CALLS[blocking_sleep]
    """
    ASYNC_CALLS[blocking] = _pair(blocking, (start, wait))


def _pair(blocking: Any, halves: Any) -> AsyncPair:
    if isinstance(halves, AsyncPair):
        return halves
    if not (isinstance(halves, tuple) and len(halves) == 2 and all(map(callable, halves))):
        raise TypeError(
            f"the non-blocking form of {getattr(blocking, '__name__', blocking)!r} must be a "
            f"(start, wait) pair of callables, got {halves!r}"
        )
    return AsyncPair(*halves)


def schedule_async(
    gm: GraphModule,
    pairs: Mapping[Callable[..., Any], tuple[Callable[..., Any], Callable[..., Any]] | AsyncPair]
    | None = None,
) -> GraphModule:
    """Split blocking calls of ``gm`` into start/wait and overlap them; see the module docstring.

    ``pairs`` maps a blocking function to its ``(start, wait)`` pair, on top of
    ``ASYNC_CALLS`` (``register_async``) and ``LIBRARY_ASYNC_CALLS``. Returns ``gm``, edited
    in place.
    """
    gm = captured_module(gm, "schedule_async")
    table = {**_library_pairs(), **ASYNC_CALLS}
    for blocking, halves in (pairs or {}).items():
        table[blocking] = _pair(blocking, halves)  # validated before anything changes
    graph = gm.graph
    blocking_nodes = [node for node in graph.nodes if _lookup(table, node) is not None]
    if not blocking_nodes:
        return gm
    before, after = _effect_neighbours(graph, blocking_nodes)
    starts = [_split_call(graph, node, _lookup(table, node)) for node in blocking_nodes]
    _hoist_starts(graph, starts, before)
    start_of = dict(zip(blocking_nodes, starts))
    for node in blocking_nodes:
        # A blocking call that must follow this one begins at its start, not at its wait.
        _sink_wait(node, [start_of.get(later, later) for later in after.get(node, ())])
    return gm


def _lookup(table: dict[Callable[..., Any], AsyncPair], node: Node) -> AsyncPair | None:
    if node.op != "call_function":
        return None
    try:
        return table.get(node.target)
    except TypeError:  # an unhashable callable cannot be a key
        return None


def _effect_neighbours(
    graph: Graph, blocking_nodes: list[Node]
) -> tuple[dict[Node, list[Node]], dict[Node, list[Node]]]:
    """For each blocking node, the nodes side effects keep it behind / ahead of."""
    wanted = set(blocking_nodes)
    before: dict[Node, list[Node]] = {}
    after: dict[Node, list[Node]] = {}
    for first, second in side_effect_edges(graph, node_positions(graph)):
        if second in wanted:
            before.setdefault(second, []).append(first)
        if first in wanted:
            after.setdefault(first, []).append(second)
    return before, after


def _split_call(graph: Graph, node: Node, pair: AsyncPair) -> Node:
    """Put ``start(*args)`` before ``node`` and turn ``node`` into ``wait(start)``."""
    with graph.inserting_before(node):
        start = graph.create_node(
            "call_function", pair.start, node.args, node.kwargs, name=f"{node.name}_handle"
        )
    for key in _PROVENANCE_KEYS:
        if key in node.meta:
            start.meta[key] = node.meta[key]
    if node.is_impure():
        start.meta["is_impure"] = node.meta["is_impure"] = True
    node.target = pair.wait
    node.kwargs = {}
    node.args = (start,)
    return start


def _hoist_starts(graph: Graph, starts: list[Node], before: dict[Node, list[Node]]) -> None:
    """Move each start right after the last node it must follow, keeping starts in order."""
    placeholders = graph.find_nodes(op="placeholder")
    last_placeholder = placeholders[-1] if placeholders else None
    last_start_at: dict[Node | None, Node] = {}  # anchor -> the start last placed after it
    for start in starts:
        (wait,) = start.users
        must_follow = [*start.all_input_nodes, *before.get(wait, ())]
        if last_placeholder is not None:
            must_follow.append(last_placeholder)
        anchor = max(must_follow) if must_follow else None
        previous = last_start_at.get(anchor, anchor)
        if previous is None:  # no inputs, no placeholders: the very beginning
            next(iter(graph.nodes)).prepend(start)
        else:
            previous.append(start)
        last_start_at[anchor] = start


def _sink_wait(wait: Node, must_precede: list[Node]) -> None:
    """Move ``wait`` to just before the first node that needs its result or must follow it."""
    limits = [*wait.users, *must_precede]
    if limits:
        min(limits).prepend(wait)
