"""The private torch entry points fxloom relies on, each behind one guarded accessor.

torch's private names (``torch._C._...``, ``torch.utils._python_dispatch._...``,
``torch._decomp``) move or change between releases without notice. fxloom reads them only
here, so a release that changes one breaks one function, with a message that names it, rather
than an import of fxloom. Each accessor says what it needs, what it falls back to, and the
releases checked (docs/compatibility.md has the matrix: torch 2.11 to 2.14).

    >>> import torch
    >>> has_composite_implicit_kernel(torch.ops.aten.reshape.default)
    True
    >>> has_composite_implicit_kernel(torch.ops.aten.size.default)  # a schema with no kernel
    False

Depends on torch only (the foundation layer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

# The one base class for dispatch modes (DESIGN.md allows them); torch has kept it here since 1.12.
from torch.utils._python_dispatch import TorchDispatchMode as _TorchDispatchMode


class TorchDispatchMode(_TorchDispatchMode):
    """torch's dispatch mode base, minus its Dynamo wrapper: since torch 2.6 a subclass's
    ``__torch_dispatch__`` is wrapped in ``torch._disable_dynamo``, whose first call imports
    ``torch._dynamo`` (with sympy, about 1 s) and whose every call adds a Python frame. fxloom's
    modes run outside Dynamo (nothing under fxloom/ imports it), so they keep their own method:
    the first ``fxloom.compile`` or export then costs what fxloom does, not Dynamo's import."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


__all__ = [
    "TorchDispatchMode",
    "MissingTorchFeature",
    "has_composite_implicit_kernel",
    "exclude_dispatch_keys",
    "current_dispatch_mode",
    "dispatch_mode_set_aside",
    "meta_functions",
    "decompositions",
    "core_aten_decompositions",
    "python_dispatcher",
    "compiler_reports",
]


class MissingTorchFeature(RuntimeError):
    """This torch lacks a private entry point fxloom needs for the operation asked."""


def _missing(what: str, needed_for: str) -> MissingTorchFeature:
    return MissingTorchFeature(
        f"torch {torch.__version__} has no {what}, which fxloom needs for {needed_for}; "
        "use a torch release listed in docs/compatibility.md (2.11 to 2.14 are tested)"
    )


def has_composite_implicit_kernel(op: Any) -> bool:
    """Whether the operator ``op`` (an OpOverload) is defined in terms of other operators.

    An operator whose schema is registered but which has no kernel at all (``aten.size.default``,
    which torch answers "operator aten::size does not exist") has no definition to decompose
    into: False. ``OpOverload.has_kernel_for_dispatch_key`` is the public spelling; older
    releases only had the ``torch._C`` function it wraps.
    """
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    try:
        if hasattr(op, "has_kernel_for_dispatch_key"):
            return bool(op.has_kernel_for_dispatch_key(key))
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key))
    except RuntimeError:  # no kernel registered under that name at all
        return False


def exclude_dispatch_keys(keys: Any) -> contextlib.AbstractContextManager:
    """A context in which the dispatcher skips ``keys`` (a ``torch._C.DispatchKeySet``)."""
    guard = getattr(torch._C, "_ExcludeDispatchKeyGuard", None)
    if guard is None:
        raise _missing("torch._C._ExcludeDispatchKeyGuard", "export's in-place shape changes")
    return guard(keys)


def current_dispatch_mode() -> Any:
    """The innermost active TorchDispatchMode, or None."""
    from torch.utils import _python_dispatch

    getter = getattr(_python_dispatch, "_get_current_dispatch_mode", None)
    if getter is None:
        raise _missing("torch.utils._python_dispatch._get_current_dispatch_mode", "fxloom.cond")
    return getter()


@contextlib.contextmanager
def dispatch_mode_set_aside() -> Iterator[Any]:
    """Deactivates the innermost dispatch mode inside the block (and yields it)."""
    from torch.utils import _python_dispatch

    pop = getattr(_python_dispatch, "_pop_mode_temporarily", None)
    if pop is None:
        raise _missing("torch.utils._python_dispatch._pop_mode_temporarily", "fxloom.cond")
    with pop() as mode:
        yield mode


def python_dispatcher() -> contextlib.AbstractContextManager:
    """A context in which operators run the Python kernels torch registers for them
    (``OpOverload.py_kernels``) instead of their C++ ones.

    Symbolic sizes need it: a C++ composite kernel such as ``upsample_bilinear2d.vec`` reads a
    tensor's sizes as plain ints (``aten::size``, which no symbolic size can answer), where its
    Python definition keeps them symbolic. Without the switch (a torch that lacks it), C++
    kernels run and such operators refuse symbolic sizes.
    """
    switch = getattr(torch._C, "_EnablePythonDispatcher", None)
    return contextlib.nullcontext() if switch is None else switch()


@contextlib.contextmanager
def compiler_reports(*, compiling: bool, exporting: bool) -> Iterator[None]:
    """``torch.compiler.is_compiling()`` and/or ``is_exporting()`` answer True inside the block.

    Libraries ask them to skip shortcuts that read data (transformers' mask helpers). The
    answers come from two private flags of ``torch.compiler``; a question not asked for keeps
    its answer (a trace inside an export is still exporting), and a flag this torch lacks is
    left out (its question then answers False, as outside a capture).
    """
    compiler = torch.compiler
    wanted = {"_is_compiling_flag": compiling, "_is_exporting_flag": exporting}
    names = [name for name, asked in wanted.items() if asked and hasattr(compiler, name)]
    saved = [getattr(compiler, name) for name in names]
    for name in names:
        setattr(compiler, name, True)
    try:
        yield
    finally:
        for name, value in zip(names, saved):
            setattr(compiler, name, value)


def meta_functions() -> dict[Any, Any]:
    """torch's Python meta functions by OpOverload (``torch._decomp.meta_table``); empty if
    this torch has none (symbolic shapes then rely on C++ kernels and decompositions)."""
    return getattr(_decomp(), "meta_table", None) or {}


def decompositions() -> dict[Any, Any]:
    """torch's operator definitions by OpOverload (``torch._decomp.decomposition_table``)."""
    return getattr(_decomp(), "decomposition_table", None) or {}


def core_aten_decompositions() -> dict[Any, Any]:
    """torch's table down to the core ATen operator set, as a plain dict."""
    table = getattr(_decomp(), "core_aten_decompositions", None)
    if table is None:
        raise _missing("torch._decomp.core_aten_decompositions", "run_decompositions()")
    return dict(table())


def _decomp() -> Any:
    import torch._decomp  # large: imported on first use

    return torch._decomp
