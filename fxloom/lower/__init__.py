"""Lowering fxloom graphs to a backend (ONNX Runtime by default): ``lower``, the translator and
``to_onnx``.

``lower(model, example_inputs)`` runs what a backend (``fxloom.backends``) can take in that
backend and the rest in PyTorch (``lowering``). The ``"onnxruntime"`` backend
(``onnxruntime_backend``, declared in ``fxloom.backends``: ``OrtModule`` is the region that runs
a session, ``runtime_saving`` how one is saved).
``translate(gm, example_inputs)`` turns a GraphModule (traced or exported) into an
``onnx.ModelProto``; ``to_onnx(model, example_inputs, path)`` writes one checked ONNX file for a
fully supported graph, or raises ``UnsupportedNodeError`` listing every node it cannot take.
``ONNX_TRANSLATIONS`` is the table of per-operator handlers (extend it to cover more
operators); ``unsupported_reason(node, gm)`` says why a node cannot be translated.

onnx and onnxruntime are optional (``pip install fxloom[onnx]``): importing this package works
without them; the functions that need them raise an ``ImportError`` naming the extra.

Depends on: ``fxloom.passes``, ``fxloom.export``; onnx and onnxruntime, lazily.
"""

from fxloom.lower import (  # noqa: F401 -- importing the families registers their handlers
    onnx_ops_aten,
    onnx_ops_elementwise,
    onnx_ops_modules,
    onnx_ops_nn,
    onnx_ops_quant,
    onnx_ops_shapes,
)
from fxloom.lower.lowering import LoweringError, LoweringWarning, lower
from fxloom.lower.onnx_ops import ONNX_TRANSLATIONS, UnsupportedArgument
from fxloom.lower.onnx_translate import (
    TranslationContext,
    UnsupportedNodeError,
    to_onnx,
    translate,
    unsupported_reason,
)
from fxloom.lower.onnxruntime_backend import OnnxRuntimeBackend
from fxloom.lower.runtime import OrtModule

__all__ = [
    "LoweringError",
    "LoweringWarning",
    "OnnxRuntimeBackend",
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
