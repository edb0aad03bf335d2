"""What every frontend computes with, owned by none of them: values without data and where they came from.

Symbolic tracing, export and the coming bytecode frontend all run the user's
program on values that stand for real ones, and all stamp the same metadata on
the nodes they record. Those shared pieces live here, under every frontend:

============== ===============================================================
module         owns
============== ===============================================================
stand_in       ``StandIn``, the tensor without data (``meta["val"]``)
metadata_mode  running operators on stand-ins for their results' metadata only
symbolic/      the shape environment (symbols, ranges, guards over sympy),
               ``SymNode`` behind ``torch.SymInt``, ``compute_symbolic_meta``,
               one interpreter of sympy sizes and its analyses (bounds, size
               trees, graph nodes), the call-time size check, the shape report
symbolic_      whether a value is a symbolic size (``is_symbolic``): the one
scalars        answer, without importing sympy
frames         finding the user's source line among fxloom's and torch's frames
module_stack   which modules a capture is inside (``nn_module_stack``)
provenance     stamping where a node came from (``stack_trace``, module stack,
               torch function) on the nodes a capture records (``stamp_node``)
fx_interop     torch.fx's wrap registry and its "is tracing" flag (the one use of
               torch.fx DESIGN.md allows)
capturing      the one context every frontend captures inside
signature      binding a call's arguments to parameters (defaults, errors
               naming the parameter), unbinding, flattening by spec
============== ===============================================================

This layer imports the IR and the foundation only, never a frontend
(``tests/test_layers.py``). Everything here is internal to fxloom; the public
names (``fxloom.export.StandIn``) are re-exported by the frontends that
document them. This package imports nothing on its own, so each piece loads alone.
"""
