"""The second line of defence: the generated ``forward`` of a loaded graph, checked as Python.

Every name from a file is checked before a graph is built (``graphs``: plain ASCII
identifiers, allowlisted targets); what runs, though, is the Python code generated from that
graph. ``check_generated_forward`` regenerates it at load and reads it with ``ast``, so the
guarantee holds on the code itself, whatever a bug in decoding or code generation let by:

* the code is one ``def forward(self, ...)`` built only of the statements and expressions
  code generation writes (``ALLOWED_SYNTAX``: assignments, calls, attribute and subscript
  reads, operators, literals, ``return``) — no ``import``, ``lambda``, comprehension,
  ``global``, loop or nested definition;
* every identifier (variable, attribute, keyword, parameter) is plain ASCII, so Python's
  NFKC folding of identifiers changes nothing;
* every variable it assigns is a node or parameter of the graph, and none is ``self``, a
  global of the generated code or a builtin (nothing is shadowed); every variable it reads
  is one of those locals, ``self``, a global the code generator bound, or one of the
  builtins the allowlist lets a graph call;
* nothing calls a graph value (only globals, builtins and attributes are called), no
  attribute is a private dunder other than an allowed operator method, and no call passes
  a keyword the table refuses for its callee (``max(key=...)``) or ``**`` keywords.

The code checked is the code compiled, and it is checked before any of it runs:
``GraphModule.recompile(check=...)`` hands the generated source to the check, then compiles
exactly that source; a loaded module's forward is not generated again unless its graph
changes afterwards.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from typing import Any

from fxloom._namespace import is_plain_identifier
from fxloom.codegen import PythonCode
from fxloom.graph_module import GraphModule
from fxloom.serialize import allowlist, call_table
from fxloom.serialize.errors import SerializationError

__all__ = ["ALLOWED_SYNTAX", "READABLE_BUILTINS", "check_generated_forward"]

# The syntax code generation writes (operators as their own node classes); nothing else.
ALLOWED_SYNTAX: frozenset[type] = frozenset(
    {
        ast.Module,
        ast.FunctionDef,
        ast.arguments,
        ast.arg,
        ast.Assign,
        ast.AnnAssign,
        ast.AugAssign,
        ast.Expr,
        ast.Return,
        ast.Name,
        ast.Attribute,
        ast.Subscript,
        ast.Slice,
        ast.Call,
        ast.keyword,
        ast.Constant,
        ast.Tuple,
        ast.List,
        ast.Dict,
        ast.BinOp,
        ast.UnaryOp,
        ast.Compare,
        ast.Starred,
        ast.Load,
        ast.Store,
        *ast.operator.__subclasses__(),
        *ast.unaryop.__subclasses__(),
        *ast.cmpop.__subclasses__(),
    }
)
# Builtins generated code may read: those a graph may call, and the types annotations name.
READABLE_BUILTINS: frozenset[str] = call_table.SAFE_BUILTINS | {"complex", "bytes", "Ellipsis"}


def check_generated_forward(gm: GraphModule, where: str) -> None:
    """Regenerate ``gm``'s forward and refuse it, before any of it is compiled or run, unless
    it is code generation's own form over the graph's validated names (see the module
    docstring)."""
    gm.recompile(check=lambda code: _check_code(code, gm, where))


def _check_code(code: PythonCode, gm: GraphModule, where: str) -> None:
    tree = ast.parse(code.src)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        _refuse(where, "it is not a single function definition")
    function = tree.body[0]
    if function.name != "forward" or function.decorator_list:
        _refuse(where, f"it defines {function.name!r}, not a plain forward")
    nodes = frozenset(node.name for node in gm.graph.nodes)
    parameters = _parameters(function, gm, where)
    globals_ = frozenset(code.globals) | {"self"}
    # Node names avoid every builtin (the naming authority reserves them); a parameter keeps
    # the caller's name (``input``), which must not hide a builtin the code reads.
    shadowed = nodes & (globals_ | frozenset(dir(builtins))) | parameters & (
        globals_ | READABLE_BUILTINS
    )
    if shadowed:
        _refuse(where, f"the names {sorted(shadowed)} would shadow globals or builtins")
    locals_ = nodes | parameters
    readable = locals_ | globals_ | READABLE_BUILTINS
    for item in ast.walk(tree):
        problem = _problem(item, locals_, readable, code.globals)
        if problem is not None:
            _refuse(where, f"{problem} (line {getattr(item, 'lineno', '?')})")


def _parameters(function: ast.FunctionDef, gm: GraphModule, where: str) -> frozenset[str]:
    """forward's parameters after ``self``: each must be a name the graph validated (a node's,
    a placeholder's target, or the caller's argument name its code frame keeps)."""
    arguments = function.args
    if arguments.posonlyargs or not arguments.args or arguments.args[0].arg != "self":
        _refuse(where, "its first parameter is not self")
    given = [a.arg for a in (*arguments.args[1:], *arguments.kwonlyargs)]
    given += [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
    info = getattr(gm.graph._codegen, "pytree_info", None)
    known = {node.name for node in gm.graph.nodes}
    known |= {str(n.target).lstrip("*") for n in gm.graph.find_nodes(op="placeholder")}
    known |= set(info.orig_args) if info is not None else set()
    unknown = sorted(set(given) - known)
    if unknown:
        _refuse(where, f"its parameters {unknown} are not the graph's inputs")
    return frozenset(given)


def _problem(item: ast.AST, locals_: frozenset, readable: frozenset, globals_: dict) -> Any:
    """What is wrong with one syntax node, or None."""
    if type(item) not in ALLOWED_SYNTAX:
        return f"it contains {type(item).__name__}, which code generation never writes"
    for name in _identifiers(item):
        if not is_plain_identifier(name) and name != "self":
            return f"the identifier {name!r} is not plain ASCII"
    if isinstance(item, ast.Name):
        if isinstance(item.ctx, ast.Store) and item.id not in locals_:
            return f"it assigns {item.id!r}, which is no node of the graph"
        if isinstance(item.ctx, ast.Load) and item.id not in readable:
            return f"it reads {item.id!r}, which is neither a node, a global nor an allowed builtin"
    if isinstance(item, ast.Attribute) and item.attr.startswith("__"):
        if not allowlist.allowed_method(item.attr):
            return f"it reads the attribute {item.attr!r}"
    if isinstance(item, ast.Call):
        return _call_problem(item, locals_, globals_)
    return None


def _identifiers(item: ast.AST) -> Iterator[str]:
    if isinstance(item, ast.Name):
        yield item.id
    elif isinstance(item, ast.Attribute):
        yield item.attr
    elif isinstance(item, (ast.keyword, ast.arg)):
        yield item.arg
    elif isinstance(item, ast.FunctionDef):
        yield item.name


def _call_problem(call: ast.Call, locals_: frozenset, globals_: dict) -> Any:
    if isinstance(call.func, ast.Name) and call.func.id in locals_:
        return f"it calls the value {call.func.id!r}; only functions and modules are called"
    callee = _global_object(call.func, globals_)
    refused = call_table.CALLABLE_KEYWORDS.get(callee, frozenset()) if callee else frozenset()
    for keyword in call.keywords:
        if keyword.arg is None:
            return "it passes ** keywords"
        if keyword.arg in refused:
            return f"it passes {keyword.arg}= to {callee.__name__}, which would call it"
    return None


def _global_object(func: ast.expr, globals_: dict) -> Any:
    """The object a called name stands for, when it is a global or builtin name."""
    if not isinstance(func, ast.Name):
        return None
    if func.id in globals_:
        return globals_[func.id]
    return getattr(builtins, func.id, None)


def _refuse(where: str, problem: str) -> None:
    raise SerializationError(
        f"{where}: the forward generated from the file's graph is not what fxloom writes: "
        f"{problem}; refused"
    )
