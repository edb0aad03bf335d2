"""Read the text that ``print(graph)`` writes back into a graph (``parse_graph``).

The text is never evaluated: a small tokenizer and recursive-descent parser
read the argument language (``%node`` references, numbers, strings, tuples,
lists, dicts, ``slice(...)``, dtypes, devices, ``torch.Size([...])``), and
every target is looked up by its qualified name, first in the ``namespace``
the caller gives, then in a fixed allowlist (``torch``, ``torch.nn.functional``,
``operator``, ``math``, a few builtins, ``torch.ops.<ns>.<op>.<overload>``).
Anything else is refused with an error naming it.
"""

from __future__ import annotations

import ast
import builtins
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fxloom import attr_path
from fxloom.graph import Graph
from fxloom.node import Node
from fxloom.serialize import allowlist
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.values import NUMPY_SCALARS, TORCH_ENUMS

__all__ = ["GraphParseError", "parse_graph"]


class GraphParseError(SerializationError):
    """The graph text is malformed or names a target that is not allowed."""


# Constructors a value may be written with, besides those in the namespace.
_VALUE_CALLS: dict[str, Callable[..., Any]] = {
    "slice": slice,
    "device": torch.device,
    "torch.device": torch.device,
    "torch.Size": torch.Size,
}
_VALUE_NAMES: dict[str, Any] = {
    "None": None,
    "True": True,
    "False": False,
    "Ellipsis": Ellipsis,
    "inf": math.inf,
    "nan": math.nan,
}
# torch attributes that may appear as values (``torch.float32``, ``torch.strided``).
_TORCH_VALUE_TYPES = tuple(TORCH_ENUMS.values())

_HEADER = re.compile(
    r"^%(?P<name>\w+) :(?: (?P<type>.+?))? \[num_users=\d+\] = "
    r"(?P<op>\w+)\[target=(?P<target>.*?)\](?P<rest>\(.*\))?$"
)
_TOKEN = re.compile(
    r"""\s*(?:
    (?P<node>%\w+)
  | (?P<number>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|-inf\b|-nan\b)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<ellipsis>\.\.\.)
  | (?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)
  | (?P<punct>[()\[\]{},:=])
)""",
    re.VERBOSE,
)


def parse_graph(text: str, namespace: Mapping[str, Any] | None = None) -> Graph:
    """Read ``str(graph)`` back into a ``Graph`` without evaluating it.

    ``namespace`` maps qualified names (``"mylib.scale"``) or leading names
    (``"mylib"``, then looked up attribute by attribute) to the objects the
    text's targets and values mean; targets outside it must be on the
    allowlist. Module paths of ``call_module``/``get_attr`` stay strings::

        import torch, fxloom
        g = fxloom.parse_graph('''graph():
            %x : [num_users=1] = placeholder[target=x]
            %relu : [num_users=1] = call_function[target=torch.relu](args = (%x,), kwargs = {})
            return relu''')
        assert str(fxloom.parse_graph(str(g))) == str(g)
    """
    resolver = _Resolver(namespace or {})
    graph = Graph()
    nodes: dict[str, Node] = {}
    lines = text.strip("\n").splitlines()
    if not lines or lines[0].strip() != "graph():":
        raise GraphParseError("line 1: graph text must start with 'graph():'")
    for number, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        if not line:
            continue
        try:
            _parse_line(line, graph, nodes, resolver)
        except GraphParseError as e:
            raise GraphParseError(f"line {number}: {e}\n    {line}") from None
    return graph


def _parse_line(line: str, graph: Graph, nodes: dict[str, Node], resolver: _Resolver) -> None:
    if line.startswith("return"):
        value = _ArgParser(line[len("return") :], nodes, resolver, bare_nodes=True).parse_all()
        graph.output(value)
        return
    match = _HEADER.match(line)
    if match is None:
        raise GraphParseError(
            "expected '%name : [num_users=N] = op[target=T](args = (...), kwargs = {...})'"
        )
    name, op, target_text = match["name"], match["op"], match["target"]
    type_expr = resolver.type(match["type"]) if match["type"] else None
    target = resolver.target(op, target_text)
    args, kwargs = _parse_call_rest(op, match["rest"], nodes, resolver)
    try:
        allowlist.check_call(target, args)
    except SerializationError as e:
        raise GraphParseError(str(e)) from None
    node = graph.create_node(op, target, args, kwargs, name=name, type_expr=type_expr)
    if node.name != name:
        raise GraphParseError(f"node name '%{name}' is used twice")
    nodes[name] = node


def _parse_call_rest(
    op: str, rest: str | None, nodes: dict[str, Node], resolver: _Resolver
) -> tuple[tuple, dict]:
    if rest is None:
        return (), {}
    parser = _ArgParser(rest, nodes, resolver)
    if op == "placeholder":
        parser.expect("(")
        parser.expect_name("default")
        parser.expect("=")
        default = parser.value()
        parser.expect(")")
        parser.end()
        return (default,), {}
    parser.expect("(")
    parser.expect_name("args")
    parser.expect("=")
    args = parser.value()
    parser.expect(",")
    parser.expect_name("kwargs")
    parser.expect("=")
    kwargs = parser.value()
    parser.expect(")")
    parser.end()
    if not isinstance(args, tuple) or not isinstance(kwargs, dict):
        raise GraphParseError("args must be a tuple and kwargs a dict")
    return args, kwargs


class _Resolver:
    """Looks qualified names up in the caller's namespace, then in the allowlist."""

    def __init__(self, namespace: Mapping[str, Any]) -> None:
        self.namespace = namespace

    def target(self, op: str, text: str) -> Any:
        if op in ("placeholder", "call_module", "get_attr"):
            return text
        if op == "call_method":
            if text in self.namespace or allowlist.allowed_method(text):
                return text
            raise GraphParseError(
                f"call_method target '{text}' is not a Tensor method; "
                f"pass it in namespace (namespace={{'{text}': ...}}) to allow it"
            )
        if op == "call_function":
            return self.callable(text)
        raise GraphParseError(f"unknown opcode '{op}'")

    def callable(self, text: str) -> Any:
        found = self._from_namespace(text)
        if found is not _MISSING:
            return found
        found = allowlist.find_callable(text)
        if found is _MISSING:
            raise GraphParseError(
                f"target '{text}' is not allowed; pass it in namespace "
                f"(parse_graph(text, namespace={{'{text}': ...}}))"
            )
        return found

    def value_name(self, text: str) -> Any:
        found = self._from_namespace(text)
        if found is not _MISSING:
            return found
        if text.startswith("torch."):
            value = _walk(torch, text.split(".")[1:])
            if isinstance(value, _TORCH_VALUE_TYPES):
                return value
        return self.callable(text)  # a function passed as an argument

    def type(self, text: str) -> Any:
        text = text.strip()
        if " | " in text:  # ``torch.Tensor | None``
            members = [self.type(part) for part in text.split(" | ")]
            if any(isinstance(m, _AnnotationText) for m in members):
                return _AnnotationText(text)
            union = members[0]
            for member in members[1:]:
                union = union | member
            return union
        if text == "None":
            return None
        generic = re.fullmatch(r"(\w+)\[(.*)\]", text)
        if generic and generic[1] in ("list", "tuple", "dict", "set"):  # ``list[int]``
            params = tuple(self.type(p) for p in _split_top_level(generic[2]))
            return getattr(builtins, generic[1])[params if len(params) > 1 else params[0]]
        if hasattr(builtins, text) and isinstance(getattr(builtins, text), type):
            return getattr(builtins, text)
        found = self._from_namespace(text)
        if found is not _MISSING:
            return found
        if text.startswith("torch."):
            value = _walk(torch, text.split(".")[1:])
            if isinstance(value, type):
                return value
        # An annotation is informational: one naming a type the caller did not pass in
        # stays text that prints as it was read (it is never called or imported).
        return _AnnotationText(text)

    def _from_namespace(self, text: str) -> Any:
        if text in self.namespace:
            return self.namespace[text]
        head, *rest = text.split(".")
        if rest and head in self.namespace:
            return _walk(self.namespace[head], rest)
        return _MISSING


_MISSING = attr_path.MISSING


class _AnnotationText:
    """A type annotation that could not be resolved safely, kept as the text it printed as."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _walk(obj: Any, parts: list[str]) -> Any:
    """The object at the dotted ``parts`` under ``obj`` (``_MISSING`` where there is none)."""
    return attr_path.find(obj, ".".join(parts)) if parts else obj


class _ArgParser:
    """Recursive descent over one line's argument text."""

    def __init__(
        self, text: str, nodes: dict[str, Node], resolver: _Resolver, bare_nodes: bool = False
    ) -> None:
        self.tokens = _tokenize(text)
        self.pos = 0
        self.nodes = nodes
        self.resolver = resolver
        self.bare_nodes = bare_nodes  # ``return x``: the output prints node names without '%'

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise GraphParseError("unexpected end of line")
        self.pos += 1
        return token

    def expect(self, punct: str) -> None:
        kind, text = self.take()
        if text != punct or kind != "punct":
            raise GraphParseError(f"expected '{punct}', found '{text}'")

    def expect_name(self, name: str) -> None:
        kind, text = self.take()
        if text != name:
            raise GraphParseError(f"expected '{name}', found '{text}'")

    def at(self, punct: str) -> bool:
        token = self.peek()
        return token is not None and token == ("punct", punct)

    def end(self) -> None:
        if self.peek() is not None:
            raise GraphParseError(f"unexpected '{self.peek()[1]}' after the value")

    def parse_all(self) -> Any:
        value = self.value()
        self.end()
        return value

    def value(self) -> Any:
        kind, text = self.take()
        if kind == "node":
            return self.node(text[1:])
        if kind == "number":
            return _number(text)
        if kind == "string":
            return ast.literal_eval(text)  # a single string literal, not an expression
        if kind == "ellipsis":
            return Ellipsis
        if kind == "name":
            return self.named(text)
        if text == "(":
            items = self.sequence(")")
            return tuple(items)
        if text == "[":
            return self.sequence("]")
        if text == "{":
            return self.mapping()
        raise GraphParseError(f"unexpected '{text}'")

    def node(self, name: str) -> Node:
        if name not in self.nodes:
            raise GraphParseError(f"'%{name}' is used before it is defined")
        return self.nodes[name]

    def named(self, text: str) -> Any:
        if self.at("("):
            self.take()
            return self.call(text)
        if text in _VALUE_NAMES:
            return _VALUE_NAMES[text]
        if self.bare_nodes and text in self.nodes:
            return self.nodes[text]
        if self.bare_nodes and "." not in text:
            raise GraphParseError(f"'{text}' is used before it is defined")
        return self.resolver.value_name(text)

    def call(self, text: str) -> Any:
        constructor = self.resolver._from_namespace(text)
        if constructor is _MISSING:
            constructor = _VALUE_CALLS.get(text, _MISSING)
        # numpy scalars print as ``np.float64(5.65)`` (numpy 2); constructed only when read.
        if constructor is _MISSING and text.startswith("np.") and text[3:] in NUMPY_SCALARS:
            import numpy  # only reached for text that printed numpy scalars

            constructor = getattr(numpy, text[len("np.") :])
        if constructor is _MISSING:
            raise GraphParseError(f"value constructor '{text}' is unknown; pass it in namespace")
        args, kwargs = [], {}
        while not self.at(")"):
            token = self.peek()
            follows = self.tokens[self.pos + 1] if self.pos + 1 < len(self.tokens) else None
            if token and token[0] == "name" and follows == ("punct", "="):
                self.pos += 2
                kwargs[token[1]] = self.value()
            else:
                args.append(self.value())
            if not self.at(")"):
                self.expect(",")
        self.take()
        return constructor(*args, **kwargs)

    def sequence(self, close: str) -> list:
        items = []
        while not self.at(close):
            items.append(self.value())
            if not self.at(close):
                self.expect(",")
        self.take()
        return items

    def key(self) -> Any:
        # Keys print by ``str`` (``{dim: 0}``): a bare name is a string key.
        kind, text = self.take()
        if kind == "number":
            return _number(text)
        if kind == "string":
            return ast.literal_eval(text)
        if kind == "name":
            return text
        raise GraphParseError(f"unexpected dict key '{text}'")

    def mapping(self) -> dict:
        result = {}
        while not self.at("}"):
            key = self.key()
            self.expect(":")
            result[key] = self.value()
            if not self.at("}"):
                self.expect(",")
        self.take()
        return result


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise GraphParseError(f"cannot read '{text[pos:].strip()[:30]}'")
        tokens.append((match.lastgroup, match[match.lastgroup]))
        pos = match.end()
    return tokens


def _split_top_level(text: str) -> list[str]:
    """``"int, dict[str, int]"`` -> ``["int", "dict[str, int]"]``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _number(text: str) -> int | float:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return float(text)
