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

# Subpackages used as `fxloom.export.export(...)` and `fxloom.passes....` after `import fxloom`.
from fxloom import export as export
from fxloom import passes as passes
from fxloom._version import __version__ as __version__
from fxloom.bytecode.compiled import compile
from fxloom.bytecode.explain import explain
from fxloom.codegen import CodeGen, CodegenError, PythonCode
from fxloom.cond import cond, cond_op
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.interpreter import Interpreter, Transformer
from fxloom.lint import GraphLintError
from fxloom.node import Argument, Node, Target, has_side_effect, map_aggregate, map_arg
from fxloom.proxy import Attribute, Proxy, ProxyableClassMeta, TraceError
from fxloom.serialize import (
    DisallowedNameError,
    SerializationError,
    load,
    register_serializable,
    save,
)
from fxloom.serialize.graph_text import GraphParseError, parse_graph
from fxloom.subgraph_rewriter import replace_pattern
from fxloom.tracer import PH, Tracer, symbolic_trace, wrap

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
]
