"""Export's dynamic shapes: what the user declares and what export makes of it.

* ``dims``: ``Dim``, derived dims and the hints (``Dim.AUTO``...), torch.export's
  vocabulary (re-exported from ``fxloom.export``);
* ``dynamic_shapes``: the ``dynamic_shapes`` argument matched to the inputs;
* ``input_sizes``: one symbol per ``Dim``, the inputs' sizes as ``torch.SymInt``;
* ``data_dependent``: sizes and values read from tensor data (``nonzero``, ``.item()``);
* ``runtime_asserts``: ``aten._assert_scalar`` nodes for what the program assumes.

These know export's API or its capture. What any frontend with symbolic sizes needs
(size trees and the size check graphs call, the nodes that compute sizes, the report
of guards in the user's words) lives with the shape environment in
``fxloom.values.symbolic``, under every frontend.
"""
