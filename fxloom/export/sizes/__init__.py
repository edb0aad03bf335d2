"""What only export does with symbolic sizes.

* ``runtime_asserts``: ``aten._assert_scalar`` nodes for what the program assumes.

The size vocabulary every frontend shares (``Dim`` and the hints, the ``dynamic_shapes``
argument matched to the inputs, one symbol per ``Dim`` in ``input_sizes``, sizes and values
read from tensor data in ``data_dependent``) lives with the shape environment in
``fxloom.values.symbolic``, so that ``fxloom.compile`` uses it without importing export.
"""
