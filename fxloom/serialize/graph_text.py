"""Read the text that ``print(graph)`` writes back into a graph (``parse_graph``).

The text is never evaluated: a small tokenizer and recursive-descent parser
read the argument language (``%node`` references, numbers, strings, tuples,
lists, dicts, ``slice(...)``, dtypes, devices, ``torch.Size([...])``), and
every target is looked up by its qualified name, first in the ``namespace``
the caller gives, then in a fixed allowlist (``torch``, ``torch.nn.functional``,
``operator``, ``math``, a few builtins, ``torch.ops.<ns>.<op>.<overload>``).
Anything else is refused with an error naming it.

The text may be hostile, so reading it is bounded (``limits``): its size and
node count are limited, the node header and the tokens are read by hand in one
pass (no regular expression that can backtrack), and values nest at most
``limits.MAX_ARGUMENT_DEPTH`` deep, the limit files have. Every failure is a
``GraphParseError``.
"""

from __future__ import annotations

import ast
import builtins
import math
import re
import string
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fxloom import attr_path
from fxloom.graph import Graph
from fxloom.lint import TORCH_VALUE_TYPES
from fxloom.node import Node
from fxloom.serialize import allowlist, limits
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.graphs import check_identifier, check_path
from fxloom.serialize.values import NUMPY_SCALARS

__all__ = ["GraphParseError", "parse_graph"]


class GraphParseError(SerializationError):
    """The graph text is malformed or names a target that is not allowed (its message escapes
    control characters, as ``SerializationError``'s does; each argument is one line)."""


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
_TORCH_VALUE_TYPES = tuple(TORCH_VALUE_TYPES.values())


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
    _check_size(text)
    try:
        return _parse_lines(text, _Resolver(namespace or {}))
    except (RecursionError, MemoryError) as e:  # a last defence: the limits should come first
        raise GraphParseError(
            f"the graph text is too large or deep to read ({type(e).__name__})"
        ) from None


def _check_size(text: str) -> None:
    if len(text) > limits.MAX_GRAPH_TEXT_BYTES:
        size = f"{len(text):,} characters"
        raise limits.exceeded("the graph text", limits.MAX_GRAPH_TEXT_BYTES, size, GraphParseError)


def _parse_lines(text: str, resolver: _Resolver) -> Graph:
    graph = Graph()
    nodes: dict[str, Node] = {}
    lines = text.strip("\n").splitlines()
    if not lines or lines[0].strip() != "graph():":
        raise GraphParseError("line 1: graph text must start with 'graph():'")
    for number, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        if not line:
            continue
        if len(nodes) >= limits.MAX_GRAPH_NODES:
            raise limits.exceeded(
                "the nodes of the graph text", limits.MAX_GRAPH_NODES, "more", GraphParseError
            )
        try:
            _parse_line(line, graph, nodes, resolver)
        except GraphParseError as e:
            raise GraphParseError(f"line {number}: {e}", f"    {line[:200]}") from None
    return graph


def _parse_line(line: str, graph: Graph, nodes: dict[str, Node], resolver: _Resolver) -> None:
    if line.startswith("return"):
        parser = _ArgParser(line[len("return") :], nodes, resolver, bare_nodes=True)
        graph.output(parser.parse_all(depth=1))  # the output's value is its argument
        return
    name, type_text, op, target_text, rest = _split_header(line)
    type_expr = resolver.type(type_text) if type_text else None
    target = resolver.target(op, target_text)
    args, kwargs = _parse_call_rest(op, rest, nodes, resolver)
    for key in kwargs:
        _checked(check_identifier, key, "keyword")
    try:
        allowlist.check_call(target, args, kwargs)
    except SerializationError as e:
        raise GraphParseError(str(e)) from None
    node = graph.create_node(op, target, args, kwargs, name=name, type_expr=type_expr)
    if node.name != name:
        raise GraphParseError(f"node name '%{name}' is used twice")
    nodes[name] = node


def _checked(check: Any, name: Any, what: str) -> Any:
    """``check(name, what)`` (``graphs.check_identifier``/``check_path``: the rules files keep)
    with its refusal as a ``GraphParseError``."""
    try:
        return check(name, what)
    except SerializationError as e:
        raise GraphParseError(str(e)) from None


_HEADER_FORM = "expected '%name : [num_users=N] = op[target=T](args = (...), kwargs = {...})'"


def _split_header(line: str) -> tuple[str, str | None, str, str, str | None]:
    """``%name : type [num_users=N] = op[target=T](rest)`` as (name, type, op, target, rest),
    read left to right in one pass."""
    name_end = _word_end(line, 1)
    if line[name_end : name_end + 1].isidentifier():  # a letter past ASCII's
        name = line[1 : line.find(" ", 1) if " " in line else len(line)]
        _checked(check_identifier, name, "node name")
    users = line.find(" [num_users=", name_end)
    if not line.startswith("%") or name_end == 1 or users < 0:
        raise GraphParseError(_HEADER_FORM)
    if not line.startswith(" :", name_end):
        raise GraphParseError(_HEADER_FORM)
    type_text = None
    if users > name_end + 2:
        if line[name_end + 2] != " ":
            raise GraphParseError(_HEADER_FORM)
        type_text = line[name_end + 3 : users]
    digits_end = _digits_end(line, users + len(" [num_users="))
    op_start = digits_end + len("] = ")
    op_end = _word_end(line, op_start)
    close = line.find("]", op_end)
    if (
        digits_end == users + len(" [num_users=")
        or not line.startswith("] = ", digits_end)
        or op_end == op_start
        or not line.startswith("[target=", op_end)
        or close < 0
    ):
        raise GraphParseError(_HEADER_FORM)
    rest = line[close + 1 :] or None
    if rest is not None and not (rest.startswith("(") and rest.endswith(")")):
        raise GraphParseError(_HEADER_FORM)
    return line[1:name_end], type_text, line[op_start:op_end], line[op_end + 8 : close], rest


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
        default = parser.value(depth=1)  # the default is the placeholder's argument
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
        if op in ("call_module", "get_attr"):
            return _checked(check_path, text, f"{op} target")
        if op == "placeholder":
            _checked(check_identifier, text.lstrip("*"), "parameter name")
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

    def type(self, text: str, depth: int = 0) -> Any:
        _check_depth(depth, "a type annotation")
        text = text.strip()
        if " | " in text:  # ``torch.Tensor | None``
            members = [self.type(part, depth + 1) for part in text.split(" | ")]
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
            params = tuple(self.type(p, depth + 1) for p in _split_top_level(generic[2]))
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

    def parse_all(self, depth: int = 0) -> Any:
        value = self.value(depth)
        self.end()
        return value

    def value(self, depth: int = 0) -> Any:
        """The next value; a container found here is the ``depth``-th level of nesting
        (the ``args`` tuple and ``kwargs`` dict themselves are level 0, as in files)."""
        kind, text = self.take()
        if kind == "node":
            return self.node(text[1:])
        if kind == "number":
            return _number(text)
        if kind == "string":
            return _string(text)
        if kind == "ellipsis":
            return Ellipsis
        if kind == "name":
            return self.named(text, depth)
        if kind == "punct" and text in "([{":
            _check_depth(depth)
        if text == "(":
            items = self.sequence(")", depth)
            return tuple(items)
        if text == "[":
            return self.sequence("]", depth)
        if text == "{":
            return self.mapping(depth)
        raise GraphParseError(f"unexpected '{text}'")

    def node(self, name: str) -> Node:
        if name not in self.nodes:
            raise GraphParseError(f"'%{name}' is used before it is defined")
        return self.nodes[name]

    def named(self, text: str, depth: int) -> Any:
        if self.at("("):
            self.take()
            _check_depth(depth)
            return self.call(text, depth)
        if text in _VALUE_NAMES:
            return _VALUE_NAMES[text]
        if self.bare_nodes and text in self.nodes:
            return self.nodes[text]
        if self.bare_nodes and "." not in text:
            raise GraphParseError(f"'{text}' is used before it is defined")
        return self.resolver.value_name(text)

    def call(self, text: str, depth: int) -> Any:
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
                kwargs[token[1]] = self.value(depth + 1)
            else:
                args.append(self.value(depth + 1))
            if not self.at(")"):
                self.expect(",")
        self.take()
        try:
            return constructor(*args, **kwargs)
        except (TypeError, ValueError, RuntimeError, OverflowError) as e:
            raise GraphParseError(f"cannot build {text}(...): {e}") from None

    def sequence(self, close: str, depth: int) -> list:
        items = []
        while not self.at(close):
            items.append(self.value(depth + 1))
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
            return _string(text)
        if kind == "name":
            return text
        raise GraphParseError(f"unexpected dict key '{text}'")

    def mapping(self, depth: int) -> dict:
        result = {}
        while not self.at("}"):
            key = self.key()
            self.expect(":")
            result[key] = self.value(depth + 1)
            if not self.at("}"):
                self.expect(",")
        self.take()
        return result


def _check_depth(depth: int, what: str = "a value") -> None:
    """Refuse a container at nesting level ``depth`` past the limit files have."""
    most = limits.MAX_ARGUMENT_DEPTH
    if depth > most:
        raise limits.exceeded(what, most, f"level {depth}", GraphParseError, "is nested too deeply")


# ------------------------------------------------------------------ tokens
# The tokenizer reads each character once: it picks a token's kind by its first character
# and finds its end with runs of one character class (``_RUNS``), which cannot backtrack.
_RUNS = {
    "space": re.compile(r"\s*"),
    "word": re.compile(r"\w*", re.ASCII),  # names are plain ASCII (no NFKC twins)
    "digits": re.compile(r"[0-9]*"),
    "string_body": re.compile(r"[^'\"\\]*"),
}
_PUNCTUATION = frozenset("()[]{},:=")
_NAME_START = frozenset(string.ascii_letters + "_")
_NUMBER_START = frozenset(string.digits + "-.")


def _tokenize(text: str) -> list[tuple[str, str]]:
    """``text`` as (kind, text) tokens: node, number, string, ellipsis, name, punct."""
    tokens, pos, end = [], 0, len(text)
    while (pos := _RUNS["space"].match(text, pos).end()) < end:
        kind, stop = _token_at(text, pos)
        if stop == pos:
            raise GraphParseError(f"cannot read '{text[pos : pos + 30].strip()}'")
        tokens.append((kind, text[pos:stop]))
        pos = stop
    return tokens


def _token_at(text: str, pos: int) -> tuple[str, int]:
    """The kind of the token at ``pos`` and where it ends (``pos`` if there is none)."""
    char = text[pos]
    if char in _PUNCTUATION:
        return "punct", pos + 1
    if char == "%":
        end = _word_end(text, pos + 1)
        return "node", end if end > pos + 1 else pos
    if char in _NUMBER_START:
        number_end = _number_end(text, pos)
        if number_end > pos:
            return "number", number_end
    if char in _NAME_START:
        return "name", _name_end(text, pos)
    if char in "'\"":
        return "string", _string_end(text, pos)
    if text.startswith("...", pos):
        return "ellipsis", pos + 3
    return "punct", pos


def _word_end(text: str, pos: int) -> int:
    return _RUNS["word"].match(text, pos).end()


def _digits_end(text: str, pos: int) -> int:
    return _RUNS["digits"].match(text, pos).end()


def _number_end(text: str, pos: int) -> int:
    """The end of ``-?(digits[.digits]|.digits)([eE][-+]?digits)?`` or ``-inf``/``-nan``."""
    start = pos + (text[pos] == "-")
    if start > pos and text.startswith(("inf", "nan"), start):
        after = start + 3
        return after if _word_end(text, after) == after else pos
    whole = _digits_end(text, start)
    fraction = whole
    if text.startswith(".", whole) and not text.startswith("...", whole):
        fraction = _digits_end(text, whole + 1)
    if whole == start and fraction <= whole + 1:
        return pos  # no digit: not a number
    exponent = fraction + 1 + (text[fraction + 1 : fraction + 2] in ("-", "+"))
    if text[fraction : fraction + 1] in ("e", "E") and _digits_end(text, exponent) > exponent:
        return _digits_end(text, exponent)
    return fraction


def _string_end(text: str, pos: int) -> int:
    """The end of the quoted string at ``pos`` (backslash escapes), or ``pos`` if unclosed."""
    quote, i = text[pos], pos + 1
    while i < len(text):
        i = _RUNS["string_body"].match(text, i).end()
        if i >= len(text):
            break
        if text[i] == "\\":
            i += 2
        elif text[i] == quote:
            return i + 1
        else:
            i += 1  # the other quote character, inside this string
    return pos


def _name_end(text: str, pos: int) -> int:
    """The end of a dotted name: identifiers joined by dots (``torch.nn.functional.relu``)."""
    end = _word_end(text, pos)
    while text.startswith(".", end) and text[end + 1 : end + 2] in _NAME_START:
        end = _word_end(text, end + 1)
    return end


def _string(text: str) -> str:
    try:
        return ast.literal_eval(text)  # a single string literal token, not an expression
    except (ValueError, SyntaxError, MemoryError) as e:
        raise GraphParseError(f"invalid string {text[:40]}: {e}") from None


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
    try:
        if _digits_end(text, text.startswith("-")) == len(text):
            return int(text)
        return float(text)
    except ValueError as e:  # an integer of more digits than Python converts
        raise GraphParseError(f"invalid number {text[:40]}...: {e}") from None
