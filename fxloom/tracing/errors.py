"""``TraceError``s written for the user: what went wrong, at which line, in which module, and a fix.

Depends on ``fxloom.values.frames`` (locating the user's line) and ``fxloom.proxy`` (``TraceError``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxloom.proxy import TraceError
from fxloom.values.frames import describe_frame, innermost_user_frame, user_frame

if TYPE_CHECKING:
    from fxloom.graph import Graph

__all__ = ["trace_error", "failure"]

_DEFAULT_HINT = (
    "make the module doing this a leaf (Tracer.is_leaf_module), wrap the function "
    "(fxloom.wrap), or fix the value it depends on with concrete_args"
)


def trace_error(
    message: str,
    hint: str | None,
    graph: Graph,
    module_path: str,
    kind: type[Exception] | None = None,
) -> TraceError:
    """A ``TraceError`` raised at the user's current line, inside the module at ``module_path``.

    ``kind``: the exception type torch.fx (or Python) raises for the same
    mistake; the error is also an instance of it (``TraceError.like``).
    """
    location, source = describe_frame(user_frame())
    module = "the root module" if not module_path else f"module {module_path!r}"
    where = f"\n  at {location}{source}" if location else ""
    return TraceError.like(kind or TraceError)(
        f"{message}{where}\n  while tracing {module}\n  hint: {hint or _DEFAULT_HINT}",
        partial_graph=graph,
        location=location,
        module_path=module_path,
    )


def failure(err: Exception, graph: Graph, module_path: str) -> TraceError:
    """``err``, raised by the traced program, as a ``TraceError`` naming where it happened.

    The module is the innermost one the exception passed through (noted by
    ``Tracer.call_module``), else ``module_path``. torch.fx lets ``err`` through
    unchanged; the ``TraceError`` is also an instance of ``type(err)``, so
    handlers written for that (``except KeyError``) keep working.
    """
    location, source = describe_frame(innermost_user_frame(err.__traceback__))
    path = getattr(err, "_fxloom_module_path", module_path)
    where = f" at {location}{source}" if location else ""
    module = f" while tracing {'the root module' if not path else repr(path)}"
    return TraceError.like(type(err))(
        f"{type(err).__name__}: {err}\n{module}{where}\n"
        "hint: if this code cannot run on traced values, make its module a leaf "
        "(Tracer.is_leaf_module), wrap the function (fxloom.wrap), fix the offending "
        "arguments with concrete_args",
        partial_graph=graph,
        location=location,
        module_path=path,
    )
