"""What libraries written for torch.fx ask of a tracer: their ``torch.fx.wrap`` registrations and "is torch.fx tracing".

Libraries mark helpers with ``torch.fx.wrap("fn")`` at import time (torchvision's
Swin models do) and consult ``torch.fx._symbolic_trace.is_fx_tracing()`` to
pick trace-friendly code. So that they behave under fxloom as under torch.fx,
a trace also records the functions registered there and sets torch.fx's
tracing flag while it runs. DESIGN.md allows exactly this of torch.fx (its
"interoperability exception": read the wrap registry, set and read the
tracing flag) and nothing more; this module is the one place that touches it,
and ``tests/test_no_forbidden_imports.py`` allows it here only.

torch.fx's module is never imported from here: it is read from ``sys.modules``,
where ``import torch`` has put it (and any library that called
``torch.fx.wrap`` has imported it). Without it there is nothing to honour.
Depends on nothing of fxloom.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["fx_tracing_module", "fx_wrapped_names", "fx_reports_tracing"]

# torch.fx's symbolic tracer module: its wrap registry and tracing flag live there.
_FX_TRACER_MODULE = "torch.fx._symbolic_trace"
# Its (id(globals), name) -> globals dict of every ``torch.fx.wrap`` registration.
_FX_WRAP_REGISTRY = "_wrapped_fns_to_patch"
# Where ``is_fx_tracing()`` reads its answer: up to torch 2.13 a module-level flag; from torch
# 2.14 a per-thread flag behind a getter and a setter.
FX_TRACING_FLAG = "_is_fx_tracing_flag"
_FX_GET_TRACING, _FX_SET_TRACING = "_get_is_fx_tracing", "_set_is_fx_tracing"


def fx_tracing_module() -> types.ModuleType | None:
    """torch.fx's tracer module if loaded and as expected (it holds the tracing flag), else None."""
    module = sys.modules.get(_FX_TRACER_MODULE)
    if module is None:
        return None
    if hasattr(module, FX_TRACING_FLAG) or hasattr(module, _FX_SET_TRACING):
        return module
    return None  # a torch whose torch.fx keeps these elsewhere


def fx_wrapped_names() -> Iterator[tuple[dict[str, Any], str]]:
    """``(globals dict, name)`` of each function libraries registered with ``torch.fx.wrap``."""
    registry = getattr(fx_tracing_module(), _FX_WRAP_REGISTRY, None)
    if not isinstance(registry, dict):
        return
    for key, globals_dict in list(registry.items()):
        if isinstance(key, tuple) and len(key) == 2 and isinstance(globals_dict, dict):
            yield globals_dict, key[1]


@contextlib.contextmanager
def fx_reports_tracing() -> Iterator[None]:
    """torch.fx's ``is_fx_tracing()`` answers True inside the block, as it does while torch.fx
    traces; nothing happens where torch.fx is not loaded."""
    module = fx_tracing_module()
    if module is None:
        yield
        return
    if hasattr(module, _FX_SET_TRACING):  # torch >= 2.14: per thread
        get, set_ = getattr(module, _FX_GET_TRACING), getattr(module, _FX_SET_TRACING)
    else:
        get = lambda: getattr(module, FX_TRACING_FLAG)  # noqa: E731
        set_ = lambda value: setattr(module, FX_TRACING_FLAG, value)  # noqa: E731
    saved = get()
    set_(True)
    try:
        yield
    finally:
        set_(saved)
