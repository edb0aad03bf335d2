"""``compute_symbolic_meta``: an operator's result on meta tensors whose sizes are symbolic.

Many of torch's C++ meta kernels take ``SymInt`` sizes (``mm``, ``empty``, ``cat``,
``bmm``, ``sum``); others read concrete sizes (``numel()``, ``sizes()``, an
``IntArrayRef``) and refuse tensors with symbolic sizes. For those the operator's
Python definition computes the result instead, one operator at a time, with each
operator it calls routed back through here:

1. ``SYMBOLIC_META_FALLBACKS``: an explicit ``OpOverload -> function`` table (users may extend it);
2. torch's Python meta function (``torch._decomp.meta_table``);
3. torch's decomposition (``torch._decomp.decomposition_table``, mostly ``torch._refs``);
4. the operator's ``CompositeImplicitAutograd`` definition (``reshape``, attention).

A first call tries the C++ kernel inside ``ShapeEnv.rollback_on_error`` (a kernel that
guarded on a size before refusing leaves no guard); an operator that refused is
remembered and goes straight to its Python definition next time.

    >>> import torch
    >>> from fxloom.values.symbolic import ShapeEnv, size_symint
    >>> env = ShapeEnv()
    >>> x = torch.empty(size_symint(env, 4), 6, device="meta")
    >>> compute_symbolic_meta(torch.ops.aten.view.default, (x, [-1]), {}).shape
    torch.Size([6*s0])

Depends on torch's decomposition tables (operator definitions) and the ShapeEnv.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fxloom import pytree
from fxloom._torch_compat import (
    TorchDispatchMode,
    decompositions,
    has_composite_implicit_kernel,
    meta_functions,
)
from fxloom.values.symbolic_scalars import SYMBOLIC_TYPES

__all__ = ["compute_symbolic_meta", "SYMBOLIC_META_FALLBACKS", "SymbolicMetaError"]

# OpOverload -> a Python definition used instead of the C++ kernel (checked first).
SYMBOLIC_META_FALLBACKS: dict[Any, Callable[..., Any]] = {}

# What torch says when a C++ kernel needs concrete sizes.
REFUSALS = (
    "symbolic sizes",
    "SymIntArrayRef expected to contain only concrete integers",
    "dispatch_on_subclass called with NO overloaded args",  # TensorImpl::sizes() on symbolic sizes
)
_NEEDS_PYTHON_DEFINITION: set[Any] = set()


class SymbolicMetaError(NotImplementedError):
    """Neither the C++ meta kernel nor any Python definition computes this operator symbolically."""


def compute_symbolic_meta(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` on meta tensors with ``torch.SymInt`` sizes, symbolic results."""
    if func not in _NEEDS_PYTHON_DEFINITION and func not in SYMBOLIC_META_FALLBACKS:
        env = _shape_env(args, kwargs)
        try:
            if env is None:
                return func(*args, **kwargs)
            # A C++ kernel that would fix a size to the example's value (an int read of a
            # SymInt) is stopped, and the Python definition, which may keep it symbolic, runs.
            refuse = python_definition(func) is not None
            with env.rollback_on_error(), env.specialization_refused(refuse):
                return func(*args, **kwargs)
        except RuntimeError as error:
            if not any(refusal in str(error) for refusal in REFUSALS):
                raise
            _NEEDS_PYTHON_DEFINITION.add(func)
    definition = python_definition(func)
    if definition is None:
        raise SymbolicMetaError(
            f"{func} has no meta kernel for symbolic sizes and no Python definition; "
            "add one to fxloom.values.symbolic.meta.SYMBOLIC_META_FALLBACKS"
        )
    with _SymbolicMetaMode():
        return definition(*args, **kwargs)


def python_definition(func: Any) -> Callable[..., Any] | None:
    """The first Python definition of ``func`` in the fallback order (module docstring)."""
    for table in (SYMBOLIC_META_FALLBACKS, meta_functions(), decompositions()):
        if func in table:
            return table[func]
    if has_composite_implicit_kernel(func):
        return func.decompose
    return None


class _SymbolicMetaMode(TorchDispatchMode):
    """Routes every operator a Python definition calls back through ``compute_symbolic_meta``."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return compute_symbolic_meta(func, args, kwargs or {})


def _shape_env(args: tuple, kwargs: dict):
    """The ShapeEnv of the first symbolic size among the arguments, or None."""
    for leaf in pytree.tree_leaves((args, kwargs)):
        node = _sym_node_of(leaf)
        if node is not None:
            return node.env
    return None


def _sym_node_of(value: Any):
    if isinstance(value, torch.Tensor):
        for size in (*value.shape, value.storage_offset()):
            if isinstance(size, SYMBOLIC_TYPES):
                return size.node
    elif isinstance(value, SYMBOLIC_TYPES):
        return value.node
    return None
