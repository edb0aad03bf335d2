"""What an export learned about its input sizes, in the user's words.

With ``Dim.AUTO`` export decides what stays dynamic: a size the program needs to
be one value becomes static, two sizes it needs equal become one symbol, a size
it needs even or at least 3 keeps that as a condition. ``shape_constraints`` lists
each such decision with the line that forced it, named by the inputs' sizes
(``y.size(0) == x.size(0)``) rather than by symbols, for ``ExportedProgram``'s
report::

    x.size(0) % 2 == 0   # model.py:12: h = x.view(-1, 2, 8)
    y.size(0) == x.size(0)   # model.py:14: return h + y

The guards print through the one printer of sizes
(``size_trees.expr_text``). Frontend-neutral: it reads only the shape
environment, so it lives beside it. Depends on ``shape_env`` and ``size_trees``.
"""

from __future__ import annotations

from fxloom.values.symbolic.shape_env import Guard, ShapeEnv
from fxloom.values.symbolic.size_trees import expr_text

__all__ = ["shape_constraints", "describe_guard"]


def shape_constraints(env: ShapeEnv, made_static: list[str]) -> list[str]:
    """One line per guard on the inputs' sizes (data-dependent ones are runtime assertions),
    then the ``Dim.AUTO`` dimensions left static by their example."""
    lines = []
    for guard in env.guards:
        symbols = guard.expr.free_symbols
        if symbols and all(env.symbols[s].hint is not None for s in symbols):
            lines.append(describe_guard(env, guard) + _index_width_note(env, guard))
    lines.extend(
        f"{entry}: static (Dim.AUTO with an example of size 0 or 1)" for entry in made_static
    )
    return lines


def describe_guard(env: ShapeEnv, guard: Guard, *, where: str = "   # ") -> str:
    """``x.size(0) % 2 == 0   # model.py:12: <line>``: input sizes by name, data-dependent
    values as their symbols with where they come from (``i0 >= 1 (i0 from nonzero)``)."""
    names = {}
    unbacked = []
    for symbol in sorted(guard.expr.free_symbols, key=lambda s: s.name):
        info = env.symbols[symbol]
        if info.hint is not None and info.source:
            names[symbol.name] = info.source
        elif info.hint is None:
            unbacked.append(f"{symbol} from {info.source or 'tensor data'}")
    text = expr_text(guard.expr, names)
    if unbacked:
        text += f" ({', '.join(unbacked)})"
    return text + (f"{where}{guard.location}: {guard.code.strip()}" if guard.location else "")


def _index_width_note(env: ShapeEnv, guard: Guard) -> str:
    """`` (index width int32: x.size(0) <= 2674)`` for a bound that narrowed a size's range."""
    narrowing = env.index_bounds.get(guard.expr)
    if narrowing is None:
        return ""
    if narrowing.symbol is None:
        return f"  (index width {narrowing.bound.width}; checked when it runs)"
    info = env.symbols[narrowing.symbol]
    name = info.source or str(narrowing.symbol)
    return f"  (index width {narrowing.bound.width}: {name} <= {narrowing.upper})"
