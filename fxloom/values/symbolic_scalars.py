"""The one answer to "is this size symbolic?", for every frontend, pass and file format.

A capture with dynamic shapes hands out ``torch.SymInt`` (``SymFloat``,
``SymBool``) values whose node holds a sympy expression over the shape
environment's symbols. Such a value may still stand for one number (``s0 - s0``
is a ``SymInt`` of ``0``), so two questions are asked, each here once:

* ``SYMBOLIC_TYPES``: is this object a symbolic scalar at all (what needs a
  symbolic path to be encoded, run on meta tensors or turned into nodes)?
* ``is_symbolic``: does it stand for more than one value (its expression has
  free symbols)? ``symbolic_expr`` gives that expression, or None::

    >>> is_symbolic(3), symbolic_expr(3)
    (False, None)

Lives outside ``fxloom.values.symbolic`` so that asking costs no sympy import
(traced modules, their files and shape propagation never need one). Depends on
torch only.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SYMBOLIC_TYPES", "has_symbolic_size", "is_symbolic", "symbolic_expr"]

SYMBOLIC_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic(value: Any) -> bool:
    """Whether ``value`` is a symbolic scalar whose value is not one known constant."""
    return isinstance(value, SYMBOLIC_TYPES) and bool(value.node.expr.free_symbols)


def symbolic_expr(value: Any) -> Any:
    """The sympy expression of a symbolic ``value``; None for a constant (an int, a bool,
    or a ``SymInt`` fixed to one number)."""
    return value.node.expr if is_symbolic(value) else None


def has_symbolic_size(tensor: torch.Tensor) -> bool:
    """Whether some dimension of ``tensor`` is symbolic."""
    return any(is_symbolic(size) for size in tensor.shape)
