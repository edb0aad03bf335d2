"""Automatic leaves: trace what can be traced, keep the rest as module calls.

``symbolic_trace(model, autoleaf=True)`` traces; when tracing fails inside a
submodule (data-dependent control flow, a Python construct on traced values,
...), the innermost user-defined module around the failure becomes a leaf — a
single ``call_module`` node that runs that module eagerly — and tracing starts
again. The result is the largest graph tracing can give, and a report saying
which modules were kept as calls and why::

    gm = fxloom.symbolic_trace(model, autoleaf=True)
    for decision in gm.meta["autoleaf"]:
        print(decision)        # block.gate (Gate): symbolically traced variables ... at net.py:41

Modules from ``torch.nn`` are not chosen (they are leaves already, or
containers whose children are the real culprits); a failure in the root
module's own ``forward`` cannot be fixed this way and is raised as usual.
A module whose inputs cannot be passed to a call (a custom object, not a
container registered with ``fxloom.pytree``) is not kept: the user module
around it is, or, if there is none, the error names the object and says to
register its class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxloom import attr_path
from fxloom._notes import add_note
from fxloom.graph import Graph
from fxloom.proxy import TraceError

__all__ = ["LeafDecision", "trace_with_autoleaf"]


@dataclass(frozen=True)
class LeafDecision:
    """One module kept as a ``call_module`` by autoleaf, and the failure that made it so."""

    path: str
    module_class: str
    reason: str
    location: str | None

    def __str__(self) -> str:
        where = f" at {self.location}" if self.location else ""
        return f"{self.path} ({self.module_class}): {self.reason}{where}"


def trace_with_autoleaf(
    make_tracer: Callable[[], Any],
    root: torch.nn.Module,
    trace: Callable[[Any], Graph],
    max_rounds: int = 64,
) -> tuple[Any, Graph, list[LeafDecision]]:
    """Trace ``root`` with fresh tracers, adding a forced leaf after each failure.

    ``trace(tracer)`` runs one attempt. Returns the successful tracer, its
    graph and the decisions taken (in order).
    """
    decisions: list[LeafDecision] = []
    forced: set[str] = set()
    for _ in range(max_rounds):
        tracer = make_tracer()
        tracer.forced_leaves = set(forced)
        try:
            return tracer, trace(tracer), decisions
        except TraceError as err:
            path = _innermost_user_module(root, err.module_path or "")
            reason = str(err).splitlines()[0]
            if path is not None and path in forced:
                # Its own call failed to record: its inputs are no graph arguments
                # (a custom object). The module that made them is kept instead.
                forced.discard(path)
                decisions = [d for d in decisions if d.path != path]
                path, reason = (
                    _caller_of_unpassable_leaf(root, path, err),
                    (f"its submodule {path!r} takes inputs a call cannot pass: {reason}"),
                )
            if path is None:
                _explain(err)
                raise
            forced.add(path)
            decisions.append(
                LeafDecision(
                    path=path,
                    module_class=type(attr_path.get(root, path)).__qualname__,
                    reason=reason,
                    location=err.location,
                )
            )
    raise TraceError(f"autoleaf gave up after {max_rounds} rounds of retracing")


def _innermost_user_module(root: torch.nn.Module, path: str) -> str | None:
    """``path`` or its nearest enclosing module whose class is not from torch."""
    for candidate in reversed(attr_path.prefixes(path) if path else []):
        module = attr_path.get(root, candidate)
        if not (type(module).__module__ or "").startswith("torch."):
            return candidate
    return None


def _caller_of_unpassable_leaf(root: torch.nn.Module, path: str, err: TraceError) -> str:
    """The user module around leaf ``path``, whose inputs could not be passed to a call.

    Raises a ``TraceError`` that names the culprit when no module but the root is around it.
    """
    caller = _innermost_user_module(root, path.rpartition(".")[0])
    if caller is not None:
        return caller
    raise TraceError(
        f"autoleaf cannot keep {path!r} ({type(attr_path.get(root, path)).__qualname__}) as a "
        f"call: {str(err).splitlines()[0]}\n"
        "hint: register the class of that argument with fxloom.pytree.register_pytree_node "
        "(fxloom.pytree.register_dataclass for a dataclass) so its fields are passed as "
        "graph arguments",
        partial_graph=err.partial_graph,
        location=err.location,
        module_path=path,
    ) from err


def _explain(err: TraceError) -> None:
    note = "autoleaf: the failure is in the root module's own forward, which cannot become a leaf"
    add_note(err, note)
