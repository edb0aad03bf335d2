"""Symbolic sizes for every frontend: a shape environment and fxloom's node behind ``torch.SymInt``.

* ``shape_env``: ``ShapeEnv`` owns symbols, ranges, facts learned from guards, simplification.
* ``sym_node``: ``SymNode`` implements torch's symbolic-node protocol over sympy.
* ``meta``: ``compute_symbolic_meta`` runs an operator on meta tensors with symbolic sizes.
* ``interpret``: the one table of sympy classes and the fold the analyses below share.
* ``ranges``: interval bounds of expressions (used by the ShapeEnv to decide guards).
* ``size_trees``: sizes as plain graph arguments, evaluated exactly and printed (the one printer).
* ``size_nodes``: the graph nodes that compute symbolic sizes.
* ``size_checks``: ``check_sizes``, the call-time check of the inputs' symbolic sizes.
* ``shape_report``: the guards on input sizes in the user's words.
* ``dims``: ``Dim``, derived dims and the hints (``Dim.AUTO``...), torch.export's vocabulary
  (re-exported from ``fxloom.export``);
* ``dynamic_shapes``: a ``dynamic_shapes`` argument matched to the inputs;
* ``input_sizes``: one symbol per ``Dim``, the inputs' sizes as ``torch.SymInt``;
* ``data_dependent``: sizes and values read from tensor data (``nonzero``, ``.item()``).

What only export does (runtime assertion nodes) is in ``fxloom.export.sizes``.
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
