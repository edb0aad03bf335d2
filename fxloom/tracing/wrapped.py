"""``fxloom.wrap``: the registry of global functions that tracing records as calls instead of running.

Depends on nothing of fxloom; ``patches`` reads ``wrapped_names`` when a trace starts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["wrap", "wrapped_names"]

# (globals dict, name) of every function registered with ``wrap``.
wrapped_names: dict[tuple[int, str], tuple[dict[str, Any], str]] = {}


def wrap(fn_or_name: str | Callable[..., Any]) -> Any:
    """Make a global function a leaf of symbolic tracing: calls become ``call_function`` nodes.

    Call at module scope, with the function's name or the function itself, or
    use as a decorator::

        fxloom.wrap("len")            # len(proxy) is recorded, not refused

        @fxloom.wrap
        def my_kernel(x, k): ...      # traced code calls it; the graph shows the call
    """
    frame = sys._getframe(1)
    if frame.f_code.co_name != "<module>":
        raise NotImplementedError(  # torch.fx's type (a RuntimeError)
            "fxloom.wrap must be called at the top level of a module, where the "
            f"function's global name is visible (called from {frame.f_code.co_name!r})"
        )
    name = fn_or_name if isinstance(fn_or_name, str) else getattr(fn_or_name, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"fxloom.wrap needs a named global function, got {fn_or_name!r}")
    globals_dict = frame.f_globals
    wrapped_names[(id(globals_dict), name)] = (globals_dict, name)
    return fn_or_name
