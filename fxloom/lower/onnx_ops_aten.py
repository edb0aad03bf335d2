"""ONNX translations of the ATen operators in exported programs (``fxloom.export``).

Most ATen operators share a handler with their torch function (registered under the ATen packet
in the other families); this module holds the ones whose signature differs.

Depends on: ``onnx_ops``, ``onnx_ops_nn``.
"""

from __future__ import annotations
