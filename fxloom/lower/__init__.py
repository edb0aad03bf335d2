"""Lowering fxloom graphs to a backend (ONNX Runtime by default): ``lower``, the translator and
``to_onnx``.

``lower(model, example_inputs)`` runs what a backend can take in that backend and the rest
in PyTorch (``lowering``). A backend (``backend``: ``Backend``, the registry ``BACKENDS``,
``get_backend``, ``register_backend``) says what it supports, how it compiles a region,
whether its regions can run backward and how its modules are saved; ``"eager"`` and
``"onnxruntime"`` are registered (``onnxruntime_backend``: ``OrtModule`` is the region that
runs a session, ``runtime_saving`` how one is saved).
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
    onnx_ops_shapes,
)
from fxloom.lower.backend import (
    BACKENDS,
    Backend,
    EagerBackend,
    RegionExamples,
    SavedModule,
    SavedStateError,
    get_backend,
    register_backend,
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
from fxloom.lower.onnxruntime_backend import OnnxRuntimeBackend  # registers "onnxruntime"
from fxloom.lower.runtime import OrtModule

__all__ = [
    "BACKENDS",
    "Backend",
    "EagerBackend",
    "LoweringError",
    "OnnxRuntimeBackend",
    "ONNX_TRANSLATIONS",
    "OrtModule",
    "RegionExamples",
    "SavedModule",
    "SavedStateError",
    "TranslationContext",
    "UnsupportedArgument",
    "UnsupportedNodeError",
    "get_backend",
    "lower",
    "register_backend",
    "to_onnx",
    "translate",
    "unsupported_reason",
]
