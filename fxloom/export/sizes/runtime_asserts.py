"""Runtime assertions: what the exported program assumes of sizes, checked when it runs.

Two kinds of assumption become ``aten._assert_scalar`` nodes (as the Export
IR spec shows them) with a message naming the condition, the sizes it is
about and the user's line that made the program rely on it:

* ``torch._check(n > 0)`` on a data-dependent value ``n``: a promise export
  takes as a fact; the assertion follows where the promise was made;
* a guard on the inputs' sizes that neither a range nor an equality of sizes
  states (``x.size(0)`` even, ``s0 != 5``): asserted first thing, before any
  operator runs. Ranges and equal sizes are checked with the inputs instead
  (``input_checks``).

Depends on the IR and ``fxloom.values.symbolic`` (``size_nodes``, ``shape_report``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy
import torch

from fxloom.values.symbolic import Guard, ShapeEnv
from fxloom.values.symbolic.shape_report import describe_guard
from fxloom.values.symbolic.size_nodes import SizeNodes

if TYPE_CHECKING:
    from fxloom.export.capture import Capture

__all__ = ["assert_deferred", "assert_input_guards"]

aten = torch.ops.aten


def _assert(sizes: SizeNodes, env: ShapeEnv, guard: Guard) -> None:
    condition = sizes.node(guard.expr)
    if isinstance(condition, bool):  # decided since: nothing to check
        return
    message = f"the exported program requires {describe_guard(env, guard, where=', from ')}"
    node = sizes.graph.create_node(
        "call_function",
        aten._assert_scalar.default,
        (condition, message),
        {},
        name="_assert_scalar",
    )
    node.meta.update(sizes.stamp())
    node.meta["val"] = None


def _checking_sizes(capture: Capture) -> SizeNodes:
    """Size nodes for assertions: fresh (placed where the assertions go), simplified by
    equal sizes only, so that a checked fact does not simplify its own check away."""
    env = capture.shape_env
    sizes = SizeNodes(
        capture.graph, env, capture.sizes.stamp, lambda expr: expr.xreplace(env.replacements)
    )
    sizes.sources = dict(capture.sizes.sources)
    return sizes


def assert_deferred(capture: Capture) -> None:
    """Assertion nodes, here, for the ``torch._check`` promises made since the last call."""
    env = capture.shape_env
    pending = env.deferred_assertions[capture.asserted :]
    capture.asserted = len(env.deferred_assertions)
    if pending:
        sizes = _checking_sizes(capture)
        for guard in pending:
            _assert(sizes, env, guard)


def assert_input_guards(capture: Capture) -> None:
    """Assertion nodes, before the first operator, for guards on input sizes that ranges and
    equalities do not express."""
    env = capture.shape_env
    guards = [g for g in env.guards if _needs_assertion(env, g.expr)]
    if not guards:
        return
    graph = capture.graph
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    sizes = _checking_sizes(capture)
    with graph.inserting_before(first):
        for guard in guards:
            _assert(sizes, env, guard)


def _needs_assertion(env: ShapeEnv, expr: sympy.Basic) -> bool:
    symbols = expr.free_symbols
    if not symbols or any(env.symbols[s].hint is None for s in symbols):
        return False  # data-dependent ones are deferred assertions, asserted where made
    simplified = expr.xreplace(env.replacements)
    if simplified in (sympy.true, sympy.false):
        return False
    return not env.implied_by_ranges(simplified)
