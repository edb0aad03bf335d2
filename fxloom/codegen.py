"""Python code generation: a ``Graph`` becomes the source of a ``forward`` function.

``generate(graph)`` returns a ``PythonCode``: the source text and the globals
it must run with. Everything the code refers to — ``torch``, ``operator``,
user functions, classes used in annotations — is bound in those globals by
object, never re-imported by name, so code generated for a function defined in
``__main__`` or inside another function runs just as well.

What the source looks like::

    def forward(self, x: torch.Tensor):
        param = self.param
        add = x + param;  x = param = None
        linear = self.linear(add);  add = None
        clamp = linear.clamp(min=0.0, max=1.0);  linear = None
        return clamp

* operator calls print as operators, ``getattr`` as attribute access,
  ``getitem``/``setitem`` as subscripts with slice syntax;
* a value is released (``x = None``) right after its last use, so memory is
  freed as early as in a hand-written forward; where that is comes from
  ``liveness.last_uses``, which the Interpreter follows too. A call whose
  value nothing reads is not bound at all (``print(x)``);
* a function with a form that may write its result into an argument
  (``runtime_functions``, ``reuses``: the fused residual add of int8
  convolutions) is called in that form where ``liveness.reused_argument`` finds
  the argument dies at the call and nothing else holds its storage: decided on
  the graph the code is generated from, every time it is generated;
* node names never collide with globals: globals get names the graph does not use;
* every identifier in the code is plain ASCII (``_namespace.is_plain_identifier``): an
  attribute path part, method or keyword that is not is written as a string
  (``getattr(self.layers, "0")``, ``**{"clé": v}``), since Python would fold it to NFKC
  and ``self.ſcale`` would read ``self.scale``.

Each node first becomes a ``_Statement`` (what is assigned to what), decided
from facts about the node; ``_line`` alone turns statements into text.

The frame around the body — the ``def`` line, the ``return``, extra globals,
and how callers' inputs and outputs map to the graph's — is the graph's
``CodeGen`` (``Graph.set_codegen``), which users may subclass as in torch.fx;
``fxloom.pytree_codegen`` has the one that takes and returns nested structures.

Depends on the IR's ``node``, ``liveness`` and ``_namespace``.
"""

from __future__ import annotations

import builtins
import contextlib
import enum
import inspect
import keyword
import math
import operator
import types
import typing
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from fxloom import attr_path
from fxloom._namespace import Namespace, is_plain_identifier, sanitize
from fxloom.lint import TORCH_VALUE_TYPES
from fxloom.liveness import last_uses, reused_argument
from fxloom.node import Node
from fxloom.ops.python_operators import PYTHON_OPERATORS
from fxloom.ops.runtime_functions import reusing_functions
from fxloom.pytree import ContainerType, container_type
from fxloom.source_location import source_location

if TYPE_CHECKING:
    from fxloom.graph import Graph

__all__ = ["CodeGen", "PythonCode", "CodegenError", "generate"]


class CodegenError(ValueError):
    """The graph cannot be turned into a Python function; the message names the node."""


@dataclass
class PythonCode:
    """Source of a generated function plus the globals it runs with."""

    src: str
    globals: dict[str, Any]
    # node_of_line[i]: name of the node emitted on line i + 1 of ``src`` (or None).
    node_of_line: list[str | None] = field(default_factory=list)

    def __deepcopy__(self, memo: dict[int, Any]) -> PythonCode:
        # Generated code is never changed after generation, and its globals hold modules and
        # functions deepcopy cannot copy: a deep copy of a module's __dict__ (torchvision's
        # DualGraphModule.__deepcopy__ makes one) shares it.
        return self

    def node_at_line(self, lineno: int) -> str | None:
        """The name of the node whose statement is on 1-based line ``lineno``."""
        if 1 <= lineno <= len(self.node_of_line):
            return self.node_of_line[lineno - 1]
        return None


class CodeGen:
    """How a graph's generated function is framed; subclass it and ``Graph.set_codegen`` it.

    The body (one line per node) is always fxloom's; a ``CodeGen`` decides the
    ``def`` line (``gen_fn_def``), the ``return`` statement (``generate_output``),
    globals the frame refers to (``additional_globals``), and — for the
    ``Interpreter``, which runs the graph without generated code — how a
    caller's inputs become the placeholders' values (``process_inputs``) and
    the output node's value becomes what the caller gets (``process_outputs``).
    For every input, ``process_outputs(graph run on process_inputs(*inputs))``
    equals the generated function's result.

    A subclass written for torch.fx runs unchanged: the hooks are called with
    the arguments torch.fx passes (the optional keywords below only where the
    override accepts them), and the generated globals hold ``torch`` (and
    ``device``) under those names, as there::

        >>> import fxloom
        >>> class ListInput(fxloom.CodeGen):
        ...     def gen_fn_def(self, free_vars, maybe_return_annotation):
        ...         return (f"def forward(self, args: List[torch.Tensor]){maybe_return_annotation}:"
        ...                 f"\\n    {', '.join(free_vars)} = args")
        ...     def additional_globals(self):
        ...         return [("List", list)]
        ...     def process_inputs(self, *inputs):
        ...         return inputs[0]
        >>> g = fxloom.Graph()
        >>> _ = g.output(g.placeholder("x"))
        >>> g.set_codegen(ListInput())
        >>> print(g.python_code().src.strip())
        def forward(self, args: List[torch.Tensor]):
            x = args
            return x
    """

    def gen_fn_def(
        self, free_vars: list[str], maybe_return_annotation: str, *, root_module: str = "self"
    ) -> str:
        """The ``def`` line, and any lines that must run before the body.

        ``free_vars`` are the parameters as printed (``"x: torch.Tensor = 1"``),
        without the root module's name, which this adds first (as torch.fx's
        ``CodeGen`` adds ``self``); ``maybe_return_annotation`` is ``" -> T"``
        or ``""``. Names the body reads must be bound by the end.
        ``root_module`` is passed only to overrides that accept it.
        """
        if not free_vars or free_vars[0] != root_module:
            free_vars.insert(0, root_module)
        return f"def forward({', '.join(free_vars)}){maybe_return_annotation}:"

    def generate_output(self, output_args: Any, *, repr_fn: Any = None) -> str:
        """The ``return`` statement (not indented) for the output node's argument.

        ``repr_fn`` prints an argument as a Python expression (nodes by name,
        constants as the code reaches them); it is passed only to overrides that
        accept it (torch.fx's own signature has no such parameter).
        """
        return f"return {(repr_fn or repr)(output_args)}"

    def process_inputs(self, *args: Any) -> Any:
        """The placeholders' values, in order, for a call of the generated function with ``args``."""
        return args

    def process_outputs(self, outputs: Any) -> Any:
        """What the generated function returns when the output node's value is ``outputs``."""
        return outputs

    def additional_globals(self) -> list[tuple[str, Any]]:
        """``(name, value)`` pairs the frame's code refers to, bound in the generated globals."""
        return []


# -------------------------------------------------------------------- tables
# How each kind of Python operator (``fxloom.ops.python_operators``) is printed. An augmented
# call ``r = iadd(a, b)`` is emitted as ``r = a;  r += b``: a tensor is mutated in place
# exactly as ``a += b`` would, while an immutable ``a`` is left untouched, as operator.iadd
# leaves it. ``abs`` (kind "call") prints as an ordinary call.
_FORM_OF_KIND = {
    "binary": "infix",  # a + b
    "comparison": "infix",  # a < b
    "unary": "prefix",  # -a
    "augmented": "augmented",  # r = a;  r += b
    "getitem": "getitem",  # a[b], slices as a:b:c
    "setitem": "setitem",  # a[b] = c
    "contains": "contains",  # b in a
    "getattr": "getattr",  # a.name
}

# One lookup per call_function node: target -> (arity, form, token).
OPERATOR_FORMS: dict[Any, tuple[int, str, str]] = {
    fn: (entry.arity, _FORM_OF_KIND[entry.kind], entry.token)
    for fn, entry in PYTHON_OPERATORS.items()
    if entry.kind in _FORM_OF_KIND
}

# Modules whose functions print with their dotted path (``torch.relu``);
# functions from anywhere else are bound by their own name (``my_helper``).
DOTTED_ROOTS: dict[str, types.ModuleType] = {
    "torch": torch,
    "math": math,
    "operator": operator,
    "typing": typing,
}

# Names torch.fx's generated code always has in its globals that a custom CodeGen's frame
# names (``List[torch.Tensor]`` in a ``def`` line): custom frames get them too (each unless
# a node already has that name). Importable objects only, so ``to_folder`` can write them.
FX_FRAME_GLOBALS: dict[str, Any] = {"torch": torch, "device": torch.device}

# torch values printed as the torch attribute they are (``torch.float32``).
_TORCH_VALUE_TYPES = tuple(TORCH_VALUE_TYPES.values())
# "forward" is the function being defined: a global of that name would be rebound by it.
_GLOBAL_RESERVED = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {"forward"}


def generate(graph: Graph, root_module: str = "self", *, verbose: bool = False) -> PythonCode:
    """Generate ``forward`` for ``graph``; see the module docstring."""
    return _Emitter(graph, root_module, verbose).emit()


class _Emitter:
    """One code generation: walks the nodes once and writes one line per node."""

    def __init__(self, graph: Graph, root_module: str, verbose: bool) -> None:
        self.graph = graph
        self.root_module = root_module
        self.verbose = verbose
        self.globals: dict[str, Any] = {}
        # Globals are named in a namespace that already holds every node and
        # parameter name, so a global can never shadow a value (and vice versa).
        self.global_names = Namespace(
            reserved=_GLOBAL_RESERVED | {root_module}, taken_elsewhere=graph._namespace
        )
        self.bound: dict[int, str] = {}  # id(object) -> global name
        self.param_names: set[str] = set()
        self.codegen: CodeGen = graph._codegen

    # ------------------------------------------------------------ top level
    def emit(self) -> PythonCode:
        graph = self.graph
        output = self._find_output()
        self._bind_additional_globals()
        params, rebinds = self._signature(graph.find_nodes(op="placeholder"))
        dead_after = last_uses(graph)
        # the calls that may run in a reusing form (found by the graph's target index: most
        # graphs have none, and then no node is asked)
        reusing = reusing_functions()
        reusable = {
            node
            for target in reusing
            for node in graph.find_nodes(op="call_function", target=target)
        }
        body = [_line(rebind, None) for rebind in rebinds]
        # node_of_line[i] names the node emitted on line i + 1 (the header's lines come first).
        node_of_line: list[str | None] = [None] * len(body)
        # Bound once: this loop runs once per node.
        statement_of, append, dead_after_node = self._statement, body.append, dead_after.get
        verbose = self.verbose
        root = graph._root
        node = root._next
        while node is not root:
            op = node._op
            if op == "placeholder":
                node = node._next
                continue
            if verbose and node.stack_trace:
                body.append(_stack_comment(node))
                node_of_line.append(None)
            if op == "output":  # what dies here is not released: the function returns
                output_args = node._args[0] if node._args else None
                body.append(
                    _call_hook(self.codegen.generate_output, output_args, repr_fn=self._expr)
                )
            else:
                dead = dead_after_node(node)
                if dead is None:
                    append(_line(statement_of(node, True), None))
                elif (
                    reusable
                    and node in reusable
                    and (instead := reused_argument(node, dead, reusing))
                ):
                    used = dead[0] is not node
                    append(_line(statement_of(node, used, instead), dead if used else dead[1:]))
                elif dead[0] is node:  # nothing reads this value
                    append(_line(statement_of(node, False), dead[1:]))
                else:
                    append(_line(statement_of(node, True), dead))
            node_of_line.append(node._name)
            node = node._next
        returns = f" -> {self._annotation(output.type)}" if output.type is not None else ""
        header = _call_hook(self.codegen.gen_fn_def, params, returns, root_module=self.root_module)
        src = header + "\n    " + "\n    ".join(body) + "\n"
        return PythonCode(src, self.globals, [None] * (header.count("\n") + 1) + node_of_line)

    def _bind_additional_globals(self) -> None:
        if type(self.codegen) is not CodeGen:
            # A frame written for torch.fx may name what torch.fx's generated globals hold.
            for name, value in FX_FRAME_GLOBALS.items():
                if name not in self.global_names:
                    self.global_names.reserve(name)
                    self.globals[name] = value
                    self.bound[id(value)] = name
        for name, value in self.codegen.additional_globals():
            if name in self.graph._namespace:
                raise CodegenError(
                    f"{type(self.codegen).__name__}.additional_globals() binds {name!r}, "
                    f"which is a node's name (%{name}); rename the node or the global"
                )
            self.global_names.reserve(name)
            self.globals[name] = value

    def _find_output(self) -> Node:
        graph = self.graph
        outputs = graph.find_nodes(op="output")
        if not outputs:
            raise CodegenError(
                "the graph has no output node, so there is nothing to return; "
                "add one with graph.output(value) (graph.output(None) returns None)"
            )
        if len(outputs) > 1:
            names = ", ".join(f"%{n.name}" for n in outputs)
            raise CodegenError(f"the graph has {len(outputs)} output nodes ({names}); keep one")
        last = graph._root._prev
        if outputs[0] is not last:
            raise CodegenError(
                f"%{last.name} comes after the output %{outputs[0].name}; "
                "the output must be the last node (graph.lint() explains more)"
            )
        if self.root_module in graph._namespace:
            raise CodegenError(f"a node is named {self.root_module!r}, the root module's name")
        return outputs[0]

    # ------------------------------------------------------------ signature
    def _signature(self, placeholders: list[Node]) -> tuple[list[str], list[_Statement]]:
        # Names first, for all parameters: an annotation printed earlier must not
        # take a name (``torch``) that a later parameter needs.
        names = [self._parameter_name(node) for node in placeholders]
        params: list[str] = []
        rebinds = [
            (node.name, param, None)
            for node, param in zip(placeholders, names)
            if param != node.name
        ]
        seen_default: Node | None = None
        seen_star = seen_double_star = None
        for node, param in zip(placeholders, names):
            stars = _stars(node)
            if seen_double_star is not None:
                raise CodegenError(
                    f"placeholder %{node.name} comes after **{seen_double_star.name}, and nothing "
                    "may follow **kwargs; move it before that placeholder"
                )
            if stars == "*" and seen_star is not None:
                raise CodegenError(
                    f"placeholders %{seen_star.name} and %{node.name} are both *args"
                )
            text = stars + param
            if node.type is not None and not stars:
                text += f": {self._annotation(node.type)}"
            if node.args and not stars:
                text += f" = {self._expr(node.args[0])}"
                seen_default = node
            elif seen_default is not None and not stars and seen_star is None:
                raise CodegenError(
                    f"placeholder %{node.name} has no default but follows %{seen_default.name}, "
                    "which has one; give it a default or move it before the defaulted inputs"
                )
            if stars == "*":
                seen_star = node
            elif stars == "**":
                seen_double_star = node
            params.append(text)
        return params, rebinds

    def _parameter_name(self, node: Node) -> str:
        """The target when it can be a parameter name (so callers may pass it by keyword)."""
        wanted = str(node.target).lstrip("*")
        usable = (
            is_plain_identifier(wanted)
            and wanted not in self.param_names
            and (wanted == node.name or wanted not in self.global_names)
            and wanted != self.root_module
        )
        param = wanted if usable else node.name
        self.param_names.add(param)
        self.global_names.reserve(param)
        return param

    # ------------------------------------------------------------ statements
    def _statement(self, node: Node, used: bool, instead: Any = None) -> _Statement:
        """What ``node``'s line says; ``used``: whether a later node reads its value;
        ``instead``: the function to call in place of a call_function's target."""
        op = node._op
        # The annotation is printed first, so the globals it needs are named first.
        annotation = node._type
        binding = (
            node._name if annotation is None else f"{node._name}: {self._annotation(annotation)}"
        )
        if op == "call_function":
            # The OPERATOR_FORMS entry when the call can print as an operator (inlined: once
            # per node).
            form = None
            if not node._kwargs:
                try:
                    form = OPERATOR_FORMS.get(node._target)
                except TypeError:  # an unhashable callable
                    pass
                if form is not None and len(node._args) != form[0]:
                    form = None
            if form is not None:
                kind = form[1]
                if kind == "augmented":  # the second clause reads the binding: always bound
                    left, right = node._args
                    value = self._expr(left)
                    return (binding, value, f"{node._name} {form[2]} {self._operand(right)}")
                if kind == "setitem":  # a store; the node's own value is None
                    return self._setitem(node, used)
            value = self._call_function(node, form, instead)
        elif op == "get_attr":  # bound even when unused: a bare ``self.p`` would do nothing
            return (binding, self._attr_path(node._target), None)
        elif op == "call_method":
            value = self._call_method(node)
        else:
            value = self._attr_path(node._target)
            value = f"{value}({self._call_args(node._args, node._kwargs)})"
        # A value nothing reads is not bound: the call runs for its effect. An
        # annotated one keeps its name and annotation, which say what it is.
        return (binding if used or annotation is not None else None, value, None)

    def _setitem(self, node: Node, used: bool) -> _Statement:
        receiver, index, value = node._args
        store = f"{self._receiver(receiver)}[{self._index(index)}]"
        return (store, self._expr(value), f"{node._name} = None" if used else None)

    def _call_method(self, node: Node) -> str:
        target, args = node._target, node._args
        if not args:
            raise CodegenError(f"call_method %{node.name} ({target}) has no self argument")
        receiver = self._receiver(args[0])
        if is_plain_identifier(target):
            method = f"{receiver}.{target}"
        else:
            method = f"{self._builtin('getattr')}({receiver}, {target!r})"
        return f"{method}({self._call_args(args[1:], node._kwargs)})"

    def _call_function(
        self, node: Node, form: tuple[int, str, str] | None, instead: Any = None
    ) -> str:
        """The expression calling ``node``'s function (or ``instead``), as an operator where
        ``form`` gives one."""
        fn, args = node._target, node._args
        if form is not None:
            kind, token = form[1], form[2]
            if kind == "infix":
                return f"{self._operand(args[0])} {token} {self._operand(args[1])}"
            if kind == "prefix":
                return f"{token}{self._operand(args[0])}"
            if kind == "getitem":
                return f"{self._receiver(args[0])}[{self._index(args[1])}]"
            if kind == "contains":
                return f"{self._operand(args[1])} in {self._operand(args[0])}"
            if kind == "getattr" and _is_attr_name(args[1]):
                return f"{self._receiver(args[0])}.{args[1]}"
        return f"{self._global(instead or fn)}({self._call_args(args, node._kwargs)})"

    def _attr_path(self, qualified_name: str) -> str:
        return _attr_path(self.root_module, qualified_name, self._builtin("getattr"))

    def _call_args(self, args: tuple, kwargs: dict) -> str:
        parts = [self._expr(a) for a in args]
        odd: dict[str, Any] = {}
        for key, value in kwargs.items():
            if is_plain_identifier(key):
                parts.append(f"{key}={self._expr(value)}")
            else:
                odd[key] = value
        if odd:
            parts.append(f"**{self._expr(odd)}")
        return ", ".join(parts)

    # ----------------------------------------------------------- expressions
    def _expr(self, a: Any) -> str:
        """A Python expression evaluating to the argument value ``a``."""
        t = type(a)
        if t is Node:
            return a._name
        if t is int or t is bool or t is str or a is None or t is bytes:
            return repr(a)
        if t is float:
            return repr(a) if math.isfinite(a) else f"{self._builtin('float')}({str(a)!r})"
        if isinstance(a, torch.Size):
            return f"{self._global(torch.Size)}({[int(d) for d in a]!r})"
        entry = container_type(t)
        if entry is not None:
            return self._container(a, entry)
        if a is Ellipsis:
            return "..."
        if t is complex:
            return f"{self._builtin('complex')}({self._expr(a.real)}, {self._expr(a.imag)})"
        if isinstance(a, _TORCH_VALUE_TYPES):
            return self._torch_attribute(a)
        if isinstance(a, torch.device):
            return f"{self._global(torch.device)}({str(a)!r})"
        if isinstance(a, enum.Enum):
            return f"{self._global(type(a))}.{a.name}"
        for plain in (bool, int, float, str):  # subclasses of the plain types
            if isinstance(a, plain):
                return self._expr(plain(a))
        if t is range:
            return f"{self._builtin('range')}({a.start}, {a.stop}, {a.step})"
        return self._global(a)

    def _container(self, a: Any, entry: ContainerType) -> str:
        """A container argument (``fxloom.pytree``), built the way its kind is written in Python."""
        kind = entry.kind
        if kind == "tuple":
            items = [self._expr(x) for x in a]
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        if kind == "list":
            return f"[{', '.join(self._expr(x) for x in a)}]"
        if kind == "dict":
            return "{" + ", ".join(f"{self._expr(k)}: {self._expr(v)}" for k, v in a.items()) + "}"
        if kind == "slice":
            parts = (self._expr(a.start), self._expr(a.stop), self._expr(a.step))
            return f"{self._builtin('slice')}({', '.join(parts)})"
        children, context = entry.flatten(a)
        if kind == "namedtuple":
            return f"{self._global(type(a))}({', '.join(self._expr(x) for x in children)})"
        if kind == "dataclass":  # the context holds the field names
            fields = ", ".join(f"{n}={self._expr(x)}" for n, x in zip(context, children))
            return f"{self._global(type(a))}({fields})"
        # A user-registered container is rebuilt by the function it was registered with.
        items = ", ".join(self._expr(x) for x in children)
        return f"{self._global(entry.unflatten)}([{items}], {self._expr(context)})"

    def _operand(self, a: Any) -> str:
        """``_expr`` made safe as the operand of an infix or unary operator."""
        if type(a) is Node:
            return a._name
        text = self._expr(a)
        if text.startswith("-") or " " in text and not _is_bracketed(text):
            return f"({text})"
        return text

    def _receiver(self, a: Any) -> str:
        """``_expr`` made safe before ``.attr`` or ``[index]`` (``(1).real``, not ``1.real``)."""
        if type(a) is Node:
            return a._name
        return f"({self._expr(a)})"

    def _index(self, index: Any) -> str:
        """The inside of ``x[...]``: slices as ``a:b:c``, tuples without parentheses."""
        entry = container_type(type(index))
        if entry is not None and entry.kind == "tuple":
            if not index:
                return "()"
            parts = [self._index_item(i) for i in index]
            return parts[0] + "," if len(parts) == 1 else ", ".join(parts)
        return self._index_item(index)

    def _index_item(self, item: Any) -> str:
        if type(item) is slice:
            start = "" if item.start is None else self._expr(item.start)
            stop = "" if item.stop is None else self._expr(item.stop)
            text = f"{start}:{stop}"
            return text if item.step is None else f"{text}:{self._expr(item.step)}"
        return self._expr(item)

    def _torch_attribute(self, value: Any) -> str:
        text = str(value)  # e.g. "torch.float32", "torch.contiguous_format"
        attr = text.split(".", 1)[1] if text.startswith("torch.") else None
        if attr is not None and getattr(torch, attr, None) is value:
            return f"{self._module_global('torch', torch)}.{attr}"
        return self._global(value)

    # --------------------------------------------------------------- globals
    def _builtin(self, name: str) -> str:
        """The name to reach builtin ``name`` by; rebinding it if a parameter shadows it."""
        if name not in self.param_names:
            return name
        return self._global(getattr(builtins, name))

    def _module_global(self, preferred: str, module: types.ModuleType) -> str:
        key = id(module)
        bound = self.bound.get(key)
        if bound is None:
            bound = self.global_names.create_name(preferred)
            self.bound[key] = bound
            self.globals[bound] = module
        return bound

    def _global(self, obj: Any) -> str:
        """An expression reaching ``obj`` through the generated globals."""
        bound = self.bound.get(id(obj))
        if bound is not None:
            return bound
        expr = self._dotted(obj)
        if expr is None:
            name = getattr(obj, "__name__", None)
            candidate = name if isinstance(name, str) else type(obj).__name__
            if not is_plain_identifier(candidate):
                candidate = sanitize(candidate)
            expr = self.global_names.create_name(candidate)
            self.globals[expr] = obj
        self.bound[id(obj)] = expr
        return expr

    def _dotted(self, obj: Any) -> str | None:
        if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            path = f"ops.{obj}"  # str() is "aten.add.Tensor" or "aten.add"
            if attr_path.find(torch, path) is obj:
                return f"{self._module_global('torch', torch)}.{path}"
        name = getattr(obj, "__name__", None)
        if not isinstance(name, str):
            return None
        if getattr(builtins, name, None) is obj and name not in self.param_names:
            return name
        qualname = getattr(obj, "__qualname__", name)
        module = getattr(obj, "__module__", None) or ""
        for root_name, root in DOTTED_ROOTS.items():
            for path in _candidate_paths(root_name, module, qualname, name):
                if attr_path.find(root, path) is obj:
                    root_expr = self._module_global(root_name, root)
                    return f"{root_expr}.{path}" if path else root_expr
        return None

    def _annotation(self, t: Any) -> str:
        """A Python expression for the type annotation ``t``."""
        if t is None or t is type(None):
            return "None"
        if t is Ellipsis:
            return "..."
        if isinstance(t, str):
            return repr(t)
        if isinstance(t, types.UnionType):
            return " | ".join(self._annotation(a) for a in t.__args__)
        origin = typing.get_origin(t)
        if origin is None:
            return self._global(t)
        if origin is typing.Union and type(None) in typing.get_args(t):
            return self._optional_annotation(t)
        args = [self._annotation(a) for a in typing.get_args(t)]
        if origin is typing.Union:
            head = f"{self._module_global('typing', typing)}.Union"
        elif isinstance(t, types.GenericAlias):
            head = self._global(origin)
        else:
            special = getattr(t, "_name", None) or getattr(origin, "_name", None)
            if not special or getattr(typing, special, None) is None:
                return self._global(t)
            head = f"{self._module_global('typing', typing)}.{special}"
        if not args:
            return f"{head}[()]" if origin is tuple and getattr(t, "__args__", None) == () else head
        return f"{head}[{', '.join(args)}]"

    def _optional_annotation(self, t: Any) -> str:
        """``typing.Optional[T]`` for ``Union[T, None]``: TorchScript parses ``typing.Union``
        with a None member as no type, and ``Optional`` reads better."""
        rest = tuple(a for a in typing.get_args(t) if a is not type(None))
        inner = rest[0] if len(rest) == 1 else typing.Union[rest]  # noqa: UP007 - built, not written
        return f"{self._module_global('typing', typing)}.Optional[{self._annotation(inner)}]"


# --------------------------------------------------------------------- helpers
# One line of the body before it is printed (``_line`` prints it): a plain
# ``(target, value, then)`` tuple, made once per node (a NamedTuple's Python-level
# constructor costs a tenth of code generation). ``target = value``, or ``value``
# alone when ``target`` is None (a call kept for its effect); then ``then``, a
# second clause on the same line, or None: the augmented assignment of an
# in-place operator (``iadd += 1``) or the ``None`` a subscript store evaluates
# to (``setitem = None``). ``target`` is ``name``, ``name: T`` or a subscript ``x[i]``.
_Statement = tuple[str | None, str, str | None]


def _line(statement: _Statement, released: list[Node] | None) -> str:
    """The one printer of statements: ``statement``, then ``released`` set to None."""
    target, value, then = statement
    if target is not None:
        value = f"{target} = {value}"
    if then is not None:
        value = f"{value};  {then}"
    if not released:
        return value
    # One or two released values in almost every line: spelled out, without a list of names.
    count = len(released)
    if count == 1:
        return f"{value};  {released[0]._name} = None"
    if count == 2:
        return f"{value};  {released[0]._name} = {released[1]._name} = None"
    return f"{value};  {' = '.join([node._name for node in released])} = None"


# Hook function -> the keywords it takes (None: any); read once per function.
_ACCEPTED_KEYWORDS: weakref.WeakKeyDictionary[Any, frozenset[str] | None] = (
    weakref.WeakKeyDictionary()
)
_NOT_READ = object()


def _call_hook(method: Any, *args: Any, **optional: Any) -> Any:
    """Call a ``CodeGen`` hook with ``optional`` keywords only where its signature takes them.

    Hooks written for torch.fx have torch.fx's signatures (``generate_output(self,
    output_args)``); fxloom's extra keywords must not break them.
    """
    function = getattr(method, "__func__", method)
    try:
        accepted = _ACCEPTED_KEYWORDS.get(function, _NOT_READ)
    except TypeError:  # not weakly referenceable: read every time
        accepted = _NOT_READ
    if accepted is _NOT_READ:
        accepted = _keywords_of(method)
        with contextlib.suppress(TypeError):
            _ACCEPTED_KEYWORDS[function] = accepted
    if accepted is not None:
        optional = {k: v for k, v in optional.items() if k in accepted}
    return method(*args, **optional)


def _keywords_of(method: Any) -> frozenset[str] | None:
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature to read: pass only what torch.fx passes
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_ONLY)


def _stars(placeholder: Node) -> str:
    target = str(placeholder.target)
    return "**" if target.startswith("**") else "*" if target.startswith("*") else ""


def _candidate_paths(root_name: str, module: str, qualname: str, name: str) -> list[str]:
    """Dotted paths under ``root_name`` at which an object may live, most specific first."""
    if module == "_operator":  # the C implementation behind ``operator``
        module = "operator"
    paths = []
    if module == root_name:
        paths.append(qualname)
    elif module.startswith(root_name + "."):
        paths.append(f"{module[len(root_name) + 1 :]}.{qualname}")
    if root_name == "torch":  # torch.sum & co. report odd modules
        paths.append(name)
    return paths


def _attr_path(base: str, qualified_name: str, getattr_name: str = "getattr") -> str:
    """``self.layer1.conv1``; a part that is no identifier as ``getattr(self.layers, "0")``.

    The form torch.fx prints, so generated code reads like the hand-written
    forward and code comparing code text with torch.fx's matches. A
    GraphModule keeps its submodules in its instance ``__dict__`` too
    (``fxloom._mirrored_modules``), so these paths cost dict lookups, not
    ``nn.Module.__getattr__`` calls.
    """
    expr = base
    for part in qualified_name.split("."):
        if is_plain_identifier(part):
            expr = f"{expr}.{part}"
        else:
            expr = f"{getattr_name}({expr}, {_string_literal(part)})"
    return expr


def _string_literal(text: str) -> str:
    """``text`` as a double-quoted literal, as torch.fx prints path parts (repr when it must escape)."""
    if '"' in text or "\\" in text or not text.isprintable():
        return repr(text)
    return f'"{text}"'


def _is_bracketed(text: str) -> bool:
    return text[:1] in "([{" and text[-1:] in ")]}"


def _is_attr_name(value: Any) -> bool:
    return is_plain_identifier(value)


def _stack_comment(node: Node) -> str:
    """``# File "model.py", line 12, in forward | return torch.relu(x)``: the innermost frame."""
    location = source_location(node)
    if location is None:  # a trace set by hand, in no traceback's form: its last lines
        lines = [line.strip() for line in node.stack_trace.strip().splitlines() if line.strip()]
        return "# " + " | ".join(lines[-2:])
    return "# " + " | ".join(line.strip() for line in location.frame_text().splitlines())
