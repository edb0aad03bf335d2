"""Symbolic sizes for export: a shape environment and fxloom's node behind ``torch.SymInt``.

* ``shape_env``: ``ShapeEnv`` owns symbols, ranges, facts learned from guards, simplification.
* ``sym_node``: ``SymNode`` implements torch's symbolic-node protocol over sympy.
* ``meta``: ``compute_symbolic_meta`` runs an operator on meta tensors with symbolic sizes.
* ``ranges``: interval bounds of expressions (used by the ShapeEnv to decide guards).

Not yet wired into ``fxloom.export.export`` (issue 12).
"""

from fxloom.values.symbolic.errors import ConstraintViolationError, DataDependentGuardError
from fxloom.values.symbolic.shape_env import Guard, ShapeEnv, SymbolInfo
from fxloom.values.symbolic.sym_node import SymNode, size_symint, unbacked_symint, wrap_expr

__all__ = [
    "ConstraintViolationError",
    "DataDependentGuardError",
    "Guard",
    "ShapeEnv",
    "SymbolInfo",
    "SymNode",
    "size_symint",
    "unbacked_symint",
    "wrap_expr",
]
