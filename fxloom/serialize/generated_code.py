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
from dataclasses import dataclass
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


def _check_code(code: PythonCode, gm: GraphModule, where: str) -> ast.Module:
    """The parsed ``code``, checked (``recompile`` compiles this very tree)."""
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
    scope = _Scope(nodes | parameters, nodes | parameters | globals_ | READABLE_BUILTINS, code)
    for item in _syntax_nodes(tree):
        check = _CHECKS.get(type(item), _not_written)
        problem = check(item, scope) if check is not None else None
        if problem is not None:
            _refuse(where, f"{problem} (line {getattr(item, 'lineno', '?')})")
    return tree


def _syntax_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every syntax node of ``tree`` but contexts and operators (``Load``, ``Add``: leaves,
    each kind allowed), in one loop over the fields that hold nodes: ``ast.walk``'s generator
    chain costs several times as much, and this runs at every load."""
    found, stack = [], [tree]
    fields_of = _NODE_FIELDS
    while stack:
        item = stack.pop()
        found.append(item)
        kind = type(item)
        fields = fields_of.get(kind)
        if fields is None:
            fields = fields_of[kind] = tuple(f for f in kind._fields if f not in _LEAF_FIELDS)
        for field in fields:
            value = getattr(item, field, None)
            if type(value) is list:
                stack.extend(v for v in value if v is not None)  # a Dict's ** entry is None
            elif isinstance(value, ast.AST):
                stack.append(value)
    return found


# Fields whose values are leaves the grammar fixes to allowed kinds (a context, an operator).
_LEAF_FIELDS = frozenset({"ctx", "op", "ops"})
_NODE_FIELDS: dict[type, tuple[str, ...]] = {}


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


@dataclass(frozen=True)
class _Scope:
    """What the checks of one forward compare names with."""

    locals: frozenset[str]  # node and parameter names: what it may assign
    readable: frozenset[str]  # locals, globals, self and the allowed builtins
    code: PythonCode


def _not_written(item: ast.AST, scope: _Scope) -> str:
    return f"it contains {type(item).__name__}, which code generation never writes"


def _name(item: ast.Name, scope: _Scope) -> str | None:
    # Both sets hold only names validated as plain ASCII: membership checks that too.
    if type(item.ctx) is ast.Store:
        if item.id not in scope.locals:
            return f"it assigns {item.id!r}, which is no node of the graph"
    elif item.id not in scope.readable:
        return f"it reads {item.id!r}, which is neither a node, a global nor an allowed builtin"
    return None


def _attribute(item: ast.Attribute, scope: _Scope) -> str | None:
    attr = item.attr
    if not is_plain_identifier(attr):
        return f"the attribute {attr!r} is not a plain ASCII identifier"
    if attr.startswith("__") and not allowlist.allowed_method(attr):
        return f"it reads the attribute {attr!r}"
    return None


def _named(item: ast.keyword | ast.arg, scope: _Scope) -> str | None:
    if item.arg is None:
        return "it passes ** keywords"
    if not is_plain_identifier(item.arg):
        return f"the name {item.arg!r} is not a plain ASCII identifier"
    return None


def _call(item: ast.Call, scope: _Scope) -> str | None:
    func = item.func
    if type(func) is not ast.Name:
        return None
    if func.id in scope.locals:
        return f"it calls the value {func.id!r}; only functions and modules are called"
    callee = _global_object(func, scope.code.globals)
    refused = call_table.CALLABLE_KEYWORDS.get(callee, frozenset()) if callee else frozenset()
    for keyword in item.keywords:
        if keyword.arg in refused:
            return f"it passes {keyword.arg}= to {callee.__name__}, which would call it"
    return None


# What is checked of each kind of syntax node (None: nothing more than that it is allowed);
# a kind not listed is syntax code generation never writes.
_CHECKS: dict[type, Any] = {
    **dict.fromkeys(ALLOWED_SYNTAX),
    ast.Name: _name,
    ast.Attribute: _attribute,
    ast.keyword: _named,
    ast.arg: _named,
    ast.Call: _call,
}


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
