"""fxloom: capture PyTorch programs into a small graph IR, transform them in Python, emit code.

The public API follows the documented torch.fx API, so code written for it runs
with ``import fxloom as fx``::

    import operator, torch, fxloom as fx

    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.relu, (g.call_function(operator.add, (x, 1)),)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    gm(torch.randn(3))

Passes (shape propagation, cost, fusion, rewriting, splitting, scheduling, drawing) live in
``fxloom.passes``; ``replace_pattern`` is also here, as in torch.fx.
"""

import importlib as _importlib
from typing import Any

from fxloom import _renamed_modules
from fxloom import passes as passes
from fxloom._version import __version__ as __version__
from fxloom.codegen import CodeGen, CodegenError, PythonCode
from fxloom.cond import cond, cond_op
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.interpreter import Interpreter, Transformer
from fxloom.lint import GraphLintError
from fxloom.node import Argument, Node, Target, has_side_effect, map_aggregate, map_arg
from fxloom.proxy import Attribute, Proxy, ProxyableClassMeta, TraceError
from fxloom.tracer import PH, Tracer, symbolic_trace, wrap

# A pickle made before a module moved names its old path: found under it (RENAMED_MODULES).
_renamed_modules.install()

# `import fxloom` loads the core only (the IR, symbolic tracing, the interpreter); the rest
# loads when first used (PEP 562), so starting costs what the core costs: export and the
# distributed package bring sympy and torch.distributed, saving brings its tables, the
# bytecode frontend its interpreter. tests/test_import_cost.py pins what `import fxloom` loads.
# Public name -> the module defining it.
_LAZY_NAMES = {
    "save": "fxloom.serialize",
    "load": "fxloom.serialize",
    "register_serializable": "fxloom.serialize",
    "SerializationError": "fxloom.serialize",
    "DisallowedNameError": "fxloom.serialize",
    "GraphParseError": "fxloom.serialize.graph_text",
    "parse_graph": "fxloom.serialize.graph_text",
    "replace_pattern": "fxloom.subgraph_rewriter",
    "explain": "fxloom.bytecode.explain",
    "mark_dynamic": "fxloom.bytecode.marks",
    "mark_static": "fxloom.bytecode.marks",
    "maybe_mark_dynamic": "fxloom.bytecode.marks",
    "RecompileLimitError": "fxloom.bytecode.breaks",
}
# Subpackages (and modules) read as `fxloom.export.export(...)` after a bare `import fxloom`;
# `subgraph_rewriter` as torch.fx users reach it (`fx.subgraph_rewriter.replace_pattern_with_filters`).
_LAZY_SUBPACKAGES = frozenset(
    {
        "backends",
        "bytecode",
        "distributed",
        "export",
        "lower",
        "quantize",
        "serialize",
        "subgraph_rewriter",
        "zoo",
    }
)


def __getattr__(name: str) -> Any:
    if name in _LAZY_NAMES:
        value = getattr(_importlib.import_module(_LAZY_NAMES[name]), name)
    elif name in _LAZY_SUBPACKAGES:
        value = _importlib.import_module(f"fxloom.{name}")
    else:
        raise AttributeError(f"module 'fxloom' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_NAMES, *_LAZY_SUBPACKAGES})


__all__ = [
    "PH",
    "Argument",
    "Attribute",
    "Proxy",
    "ProxyableClassMeta",
    "TraceError",
    "Tracer",
    "symbolic_trace",
    "wrap",
    "cond",
    "cond_op",
    "CodeGen",
    "CodegenError",
    "Graph",
    "GraphLintError",
    "GraphModule",
    "GraphParseError",
    "Interpreter",
    "Transformer",
    "Node",
    "PythonCode",
    "Target",
    "has_side_effect",
    "map_aggregate",
    "map_arg",
    "parse_graph",
    "save",
    "load",
    "register_serializable",
    "SerializationError",
    "DisallowedNameError",
    "replace_pattern",
    "compile",
    "explain",
    "mark_dynamic",
    "mark_static",
    "maybe_mark_dynamic",
    "RecompileLimitError",
]


def compile(  # noqa: A001 - the documented name, as torch.compile
    fn_or_module: Any,
    *,
    backend: Any = "eager",
    fullgraph: bool = False,
    recompile_limit: int = 8,
    dynamic: Any = None,
    on_limit: str = "eager",
) -> Any:
    """Compile a function or module at the bytecode level on its first call, with guards, a
    cache and graph breaks (``fxloom.bytecode.compiled``; docs/compile.md).

    ``backend``: a backend's name in ``fxloom.backends.BACKENDS`` (``"eager"`` runs fxloom's
    GraphModule, ``"onnxruntime"`` lowers each captured graph, or one registered with
    ``fxloom.backends.register_backend``: ``Backend.compile_program`` says what runs), a
    ``fxloom.backends.Backend``, or ``backend(graph_module, example_inputs) -> callable``.
    ``fullgraph=True`` raises ``CompileError`` at the first graph break, naming the line.
    ``dynamic``: None (default) makes a tensor size symbolic once it changes between calls,
    True every tensor size from the first call, False none (docs/compile.md, "Sizes");
    with a backend that lowers graphs at fixed sizes (``"onnxruntime"``), None means False;
    or a ``dynamic_shapes`` spec as ``fxloom.export`` takes it (``{"x": {0: Dim("b")}}``).
    Marks (``fxloom.mark_dynamic``/``mark_static``/``maybe_mark_dynamic``) are honoured.
    ``recompile_limit`` counts compiles by reason; at the limit ``on_limit="eager"`` runs as
    Python (one warning), ``"raise"`` raises ``RecompileLimitError`` (docs/compile.md,
    "Recompiles: the budget and what it says").
    """
    from fxloom.backends import Backend, get_backend
    from fxloom.bytecode import compiled as _bytecode

    if isinstance(backend, (str, Backend)):
        try:
            chosen = get_backend(backend)
        except ValueError as error:
            raise ValueError(
                f"fxloom.compile: {error}; or pass a callable "
                "backend(graph_module, example_inputs) -> callable"
            ) from None
        if dynamic is None and chosen is not get_backend("eager"):
            # A backend that lowers a graph lowers it at the example's sizes (onnxruntime):
            # sizes stay static, one entry per shape, unless dynamic=True asks otherwise.
            dynamic = False
        backend = chosen.compile_program
    return _bytecode.compile(
        fn_or_module,
        backend=backend,
        fullgraph=fullgraph,
        recompile_limit=recompile_limit,
        dynamic=dynamic,
        on_limit=on_limit,
    )
