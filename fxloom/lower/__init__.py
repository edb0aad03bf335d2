"""Lowering fxloom graphs to ONNX (and ONNX Runtime): the translator and ``to_onnx``.

``lower(model, example_inputs)`` runs what ONNX can take in ONNX Runtime and the rest in
PyTorch (``lowering``; ``OrtModule`` is the region that runs a session).
``translate(gm, example_inputs)`` turns a GraphModule (traced or exported) into an
``onnx.ModelProto``; ``to_onnx(model, example_inputs, path)`` writes one checked ONNX file for a
fully supported graph, or raises ``UnsupportedNodeError`` listing every node it cannot take.
``ONNX_TRANSLATIONS`` is the table of per-operator handlers (extend it to cover more
operators); ``unsupported_reason(node, gm)`` says why a node cannot be translated.

onnx and onnxruntime are optional (``pip install fxloom[onnx]``): importing this package works
without them; the functions that need them raise an ``ImportError`` naming the extra.

Depends on: ``fxloom.passes.shape_prop``, ``fxloom.export``; onnx, lazily.
"""

from fxloom.lower import (  # noqa: F401 -- importing the families registers their handlers
    onnx_ops_aten,
    onnx_ops_elementwise,
    onnx_ops_modules,
    onnx_ops_nn,
    onnx_ops_shapes,
)
from fxloom.lower.lowering import LoweringError, lower
from fxloom.lower.onnx_ops import ONNX_TRANSLATIONS, UnsupportedArgument
from fxloom.lower.onnx_translate import (
    TranslationContext,
    UnsupportedNodeError,
    to_onnx,
    translate,
    unsupported_reason,
)
from fxloom.lower.runtime import OrtModule

__all__ = [
    "LoweringError",
    "ONNX_TRANSLATIONS",
    "OrtModule",
    "TranslationContext",
    "UnsupportedArgument",
    "UnsupportedNodeError",
    "lower",
    "to_onnx",
    "translate",
    "unsupported_reason",
]
