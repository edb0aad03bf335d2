"""``fxloom.wrap``: the registry of global functions that tracing records as calls instead of running.

Two kinds of registration: ``wrap`` names a global of the calling module (torch.fx's rule);
``wrap_library_function`` registers a library's function wherever traced code reaches it.
``LIBRARY_LEAVES`` declares the library functions fxloom itself makes leaves (torch's rpc
calls): a table read when a trace starts, not registrations made by importing a module, so a
trace records them whether or not ``fxloom.distributed`` was imported.

Depends on nothing of fxloom; ``patches`` reads ``wrapped_names`` and ``library_functions``
(after ``register_library_leaves``) when a trace starts.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

__all__ = [
    "LIBRARY_LEAVES",
    "library_functions",
    "register_library_leaves",
    "wrap",
    "wrap_library_function",
    "wrapped_names",
]

# (globals dict, name) of every function registered with ``wrap``, and of each module
# attribute registered with ``wrap_library_function``.
wrapped_names: dict[tuple[int, str], tuple[dict[str, Any], str]] = {}
# id -> function of every ``wrap_library_function``: recorded wherever a traced module's
# globals bind it, under any name (``from torch.distributed.rpc import rpc_sync``).
library_functions: dict[int, Callable[..., Any]] = {}


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


def wrap_library_function(fn: Callable[..., Any], *modules: types.ModuleType) -> None:
    """Make a library's function a leaf of symbolic tracing wherever traced code reaches it.

    ``wrap`` covers one global of one module. User code reaches a library's function as
    an attribute of its module (``rpc.rpc_sync(...)``: give that module, or each module
    that exposes it, in ``modules``) or imported into its own globals (``from
    torch.distributed.rpc import rpc_sync``): a trace patches both. Called with a proxy,
    ``fn`` is recorded as a ``call_function`` of ``fn`` itself.
    """
    for module in modules:
        globals_dict = vars(module)
        names = [name for name, value in globals_dict.items() if value is fn]  # aliases too
        if not names:
            raise ValueError(
                f"wrap_library_function: module {module.__name__} has no attribute that is "
                f"{fn!r}; give the modules user code reaches it through"
            )
        for name in names:
            wrapped_names[(id(globals_dict), name)] = (globals_dict, name)
    library_functions[id(fn)] = fn


# The library functions every trace records as one call: (module defining it, its name, the
# modules user code reaches it through as an attribute). Found among imported modules only:
# code that calls one has imported its module (torch imports torch.distributed.rpc itself).
LIBRARY_LEAVES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # A remote call runs elsewhere: tracing into it would send proxies over the wire.
    (
        "torch.distributed.rpc.api",
        "rpc_sync",
        ("torch.distributed.rpc", "torch.distributed.rpc.api"),
    ),
    (
        "torch.distributed.rpc.api",
        "rpc_async",
        ("torch.distributed.rpc", "torch.distributed.rpc.api"),
    ),
    # The wait ``schedule_async`` pairs with rpc_async (a scheduled graph may be traced again).
    ("fxloom.passes.schedule", "rpc_wait", ("fxloom.passes.schedule", "fxloom.distributed.rpc")),
)


def register_library_leaves() -> None:
    """Register the rows of ``LIBRARY_LEAVES`` whose modules are imported (a trace calls this
    as it starts; a row whose library is absent, torch without rpc, is skipped)."""
    for module_name, name, reached_through in LIBRARY_LEAVES:
        fn = getattr(sys.modules.get(module_name), name, None)
        if fn is None:
            continue
        modules = [sys.modules[m] for m in reached_through if m in sys.modules]
        wrap_library_function(fn, *(m for m in modules if vars(m).get(name) is fn))
