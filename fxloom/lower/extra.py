"""The optional packages fxloom.lower needs (``pip install fxloom[onnx]``), imported on demand.

    >>> require("onnxruntime").__name__
    'onnxruntime'

Depends on nothing of fxloom.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["ONNX_EXTRA_MESSAGE", "require"]

ONNX_EXTRA_MESSAGE = "fxloom.lower needs onnx and onnxruntime: pip install fxloom[onnx]"


def require(module_name: str) -> ModuleType:
    """Import ``onnx`` or ``onnxruntime``, or raise an ``ImportError`` naming the extra."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"{ONNX_EXTRA_MESSAGE} ({module_name!r} is missing)") from error
    return module
