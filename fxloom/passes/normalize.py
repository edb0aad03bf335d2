"""Argument normalization: calls rewritten to pass arguments by keyword, from signatures.

After it, a pass reads ``node.kwargs["stride"]`` instead of working out whether the stride
was the fourth positional argument or a keyword, or left to its default::

    >>> import torch, fxloom
    >>> from fxloom.passes.normalize import normalize_args
    >>> def f(x, w):
    ...     y = torch.nn.functional.conv2d(x, w, None, 1, 1)
    ...     return torch.add(y, y, alpha=2).transpose(1, 2).view(2, -1)
    >>> gm = normalize_args(fxloom.symbolic_trace(f))
    >>> print(gm.code.strip())
    def forward(self, x, w):
        conv2d = torch.conv2d(input=x, weight=w, bias=None, stride=1, padding=1);  x = w = None
        add = torch.add(input=conv2d, other=conv2d, alpha=2);  conv2d = None
        transpose = add.transpose(dim0=1, dim1=2);  add = None
        view = transpose.view(2, -1);  transpose = None
        return view

``x.view(2, -1)`` stays as it is: its sizes are a ``*args`` list (and ``view`` also has
a ``dtype`` overload), so no keyword form is certain to mean the same call.

Depends on: the IR, ``fxloom.interpreter`` (``NormalizeArgs``) and ``fxloom.ops.signatures``.
"""

from __future__ import annotations

import inspect
import itertools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from fxloom import attr_path
from fxloom.graph_module import GraphModule
from fxloom.interpreter import Transformer
from fxloom.node import Node
from fxloom.ops.runtime_functions import runtime_function
from fxloom.ops.signatures import (
    SIGNATURES,
    UNKNOWN,
    Candidate,
    Probe,
    dummy_for,
    dummy_tensor,
    element_type,
    function_candidates,
    is_tensor_type,
    method_candidates,
    module_signature,
)
from fxloom.passes._effects import check_graph_module, is_literal
from fxloom.passes.cse import literal_key
from fxloom.proxy import Proxy
from fxloom.pytree import SEQUENCE_KINDS, container_type, tree_any

__all__ = [
    "SIGNATURES",
    "ArgsKwargsPair",
    "NormalizeArgs",
    "normalize_args",
    "normalized_arguments",
]

Arguments = tuple[tuple[Any, ...], dict[str, Any]]


def normalize_args(gm: GraphModule, *, fill_defaults: bool = False) -> GraphModule:
    """Pass the arguments of calls by keyword where the signature is certain; return ``gm``.

    Each ``call_function``, ``call_method`` and ``call_module`` node whose target's
    signature is known gets its positional arguments as keywords (``torch.add(x, y)``
    becomes ``torch.add(input=x, other=y)``; a method keeps its receiver, ``x.transpose(
    dim0=1, dim1=2)``). Positional-only parameters stay positional. With ``fill_defaults``,
    parameters left out get their default value written in (public, literal defaults only).

    A node is left exactly as it is when the call could mean something else in keyword
    form, never guessed:

    * no signature is known (``operator.add``, ``getattr``, a C function outside torch);
    * a ``*args`` parameter takes arguments (``x.view(2, -1)``, ``torch.einsum``);
    * torch overloads disagree on the names (``torch.max(x, 1)``: ``dim``, but
      ``torch.max(x, y)``: ``other``), or an argument computed by the graph moves to a
      parameter that overloads choose by the argument's type (its type is unknown here);
    * a method whose receiver may not be a tensor: ``meta["type"]`` (from ``ShapeProp``)
      says it is not, or the name is also found on ``str``, ``tuple``, ``dict``... and
      nothing (``meta["val"]``, ``meta["tensor_meta"]``, an annotation) says it is one;
    * a module with forward hooks (hooks see positional arguments) or its own ``__call__``;
    * fxloom's guards (``check_bool``...), kept readable.

    Where signatures come from, and how the C++ ones are checked against torch's Python
    binding without running anything: see ``fxloom.ops.signatures``. Register more in
    ``SIGNATURES`` (target -> ``inspect.Signature``, or a function with the same one).

    ``gm`` is edited in place; ``node.meta`` and names are unchanged.
    """
    check_graph_module(gm, "normalize_args")
    normalizer = _ArgumentNormalizer(gm, fill_defaults=fill_defaults)
    changes = {}
    for node in gm.graph.nodes:  # all decided before any edit
        normalized = normalizer.normalize(node, node.args, node.kwargs)
        if normalized is not None:
            changes[node] = normalized
    for node, (args, kwargs) in changes.items():
        node.args, node.kwargs = args, kwargs
    return gm


class NormalizeArgs(Transformer):
    """``normalize_args`` as a ``Transformer``, as in torch.fx: ``NormalizeArgs(gm).transform()``.

    Returns a new GraphModule; the original is unchanged. As in torch.fx, defaults are
    written in (``fill_defaults=True``), and ``normalize_to_only_use_kwargs=False`` keeps
    positional arguments positional (then only defaults are added). ``node.meta``: as for
    any ``Transformer`` (provenance kept, analysis results dropped).

        >>> import torch, fxloom
        >>> from fxloom.passes.normalize import NormalizeArgs
        >>> gm = fxloom.symbolic_trace(lambda x: torch.nn.functional.relu(x))
        >>> print(NormalizeArgs(gm).transform().code.strip())
        def forward(self, x):
            relu = torch.nn.functional.relu(input=x, inplace=False);  x = None
            return relu
    """

    def __init__(
        self,
        module: nn.Module,
        normalize_to_only_use_kwargs: bool = True,
        *,
        fill_defaults: bool = True,
    ) -> None:
        super().__init__(module)
        self._normalizer = _ArgumentNormalizer(
            module, fill_defaults=fill_defaults, to_keywords=normalize_to_only_use_kwargs
        )

    def _normalized(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Arguments:
        node = self.tracer.current
        found = self._normalizer.normalize(node, args, kwargs) if node is not None else None
        return found if found is not None else (args, kwargs)

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return super().call_function(target, *self._normalized(args, kwargs))

    def call_method(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return super().call_method(target, *self._normalized(args, kwargs))

    def call_module(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return super().call_module(target, *self._normalized(args, kwargs))


# ====================================================================== normalizer
class _Slot:
    """Stands for one argument of the call while binding signatures (position or keyword)."""

    __slots__ = ("key",)

    def __init__(self, key: int | str) -> None:
        self.key = key


@dataclass
class _Layout:
    """Where each argument goes in the new call: positional slots, then keyword -> slot.

    ``bound``: the names of the parameters the call gives (positionally or by keyword).
    """

    positional: tuple[_Slot, ...]
    keywords: dict[str, _Slot]
    bound: frozenset[str]


class ArgsKwargsPair(NamedTuple):
    """A call's arguments matched to its target's signature (``Node.normalized_arguments``)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def normalized_arguments(
    node: Node, root: nn.Module, normalize_to_only_use_kwargs: bool = False
) -> ArgsKwargsPair | None:
    """What torch.fx's ``node.normalized_arguments(root, ...)`` gives: the call's arguments
    matched to its target's signature, its defaults filled, as ``ArgsKwargsPair(args,
    kwargs)``; positional arguments stay positional unless ``normalize_to_only_use_kwargs``
    (then all are keywords, in the signature's order). ``call_function`` and
    ``call_module`` nodes (the module found under ``root``); None for other nodes and where
    the signature is not certain (see ``normalize_args``: fxloom decides from the signatures
    alone and returns None where torch overloads disagree). A function of this pass, not a
    method of ``Node``: the IR does not import the passes (tests/test_layers.py)."""
    if node.op not in ("call_function", "call_module"):
        return None
    normalizer = _ArgumentNormalizer(
        root, fill_defaults=True, to_keywords=normalize_to_only_use_kwargs
    )
    bound = normalizer.bind(node, tuple(node.args), dict(node.kwargs))
    return None if bound is None else ArgsKwargsPair(*bound)


class _ArgumentNormalizer:
    """Works out the keyword form of calls of one module's graph; caches signatures by target.

    ``normalize(node, args, kwargs)`` returns the new ``(args, kwargs)``, or ``None`` to
    leave the call alone. ``args``/``kwargs`` are the node's own, or the same with
    ``Proxy`` values (in a ``Transformer``); ``node`` supplies the op, target and receiver.
    """

    def __init__(self, root: nn.Module, *, fill_defaults: bool, to_keywords: bool = True) -> None:
        self.root = root
        self.fill_defaults = fill_defaults
        self.to_keywords = to_keywords
        self._functions: dict[Any, Any] = {}
        self._methods: dict[str, Any] = {}

    def normalize(
        self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Arguments | None:
        """The call's new ``(args, kwargs)``, or None: not certain, or nothing changes."""
        bound = self.bind(node, args, kwargs)
        if bound is None or _same_call(*bound, args, kwargs):
            return None
        return bound

    def bind(self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Arguments | None:
        """The call's arguments matched to its target's signature, as ``normalize`` writes
        them (None: no signature is certain), whether or not that changes anything."""
        receiver: tuple[Any, ...] = ()
        if node.op == "call_function":
            found = self._function_candidates(node.target)
        elif node.op == "call_method":
            if not args or not _receiver_is_tensor(node, self.root):
                return None
            found = self._method_candidates(node.target)
            receiver, args = args[:1], args[1:]
        elif node.op == "call_module":
            found = self._module_candidates(node.target)
        else:
            return None
        if found is None:
            return None
        candidates, probe = found
        new = self._normalize_call(candidates, probe, args, dict(kwargs))
        if new is None:
            return None
        return (*receiver, *new[0]), new[1]

    # ------------------------------------------------------------ candidates
    def _function_candidates(self, target: Any) -> Any:
        if runtime_function(target) is not None:  # fxloom's own: called as recorded
            return None
        try:
            if target not in self._functions:
                self._functions[target] = function_candidates(target)
            return self._functions[target]
        except TypeError:  # an unhashable callable: no caching
            return function_candidates(target)

    def _method_candidates(self, name: str) -> Any:
        if name not in self._methods:
            self._methods[name] = method_candidates(name)
        return self._methods[name]

    def _module_candidates(self, target: str) -> Any:
        module = attr_path.find(self.root, target)
        if not isinstance(module, nn.Module):
            return None
        signature = module_signature(module)
        return ([Candidate(signature)], None) if signature is not None else None

    # ------------------------------------------------------------ binding
    def _normalize_call(
        self,
        candidates: list[Candidate],
        probe: Probe | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Arguments | None:
        layouts = []
        for candidate in candidates:
            layout = self._layout(candidate, args, kwargs)
            if layout is None:
                continue
            if candidate.types is not None and not _accepted(
                probe, candidate, layout, args, kwargs
            ):
                continue  # from a schema torch's Python binding does not follow
            layouts.append((candidate, layout))
        if not layouts or len({_layout_key(layout) for _, layout in layouts}) != 1:
            return None  # no signature fits, or overloads disagree
        if _moves_value_by_type(layouts, args):
            return None  # which overload applies depends on a run-time type
        positional, keywords = _fill(layouts[0][1], args, kwargs)
        if self.fill_defaults:
            keywords = self._with_defaults(layouts, keywords, positional, probe)
        return positional, keywords

    def _layout(
        self, candidate: Candidate, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> _Layout | None:
        """Which argument goes where in keyword form, for one candidate signature."""
        slots = tuple(_Slot(i) for i in range(len(args)))
        keyword_slots = {name: _Slot(name) for name in kwargs}
        # Not values.signature.bind, on purpose: a misfit here is no error, only a candidate
        # overload that does not take these arguments (overload resolution).
        try:
            bound = candidate.signature.bind(*slots, **keyword_slots)
        except TypeError:
            return None
        layout = _Layout((), {}, frozenset(bound.arguments))
        parameters = candidate.signature.parameters
        for name, value in bound.arguments.items():
            kind = parameters[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    return None  # arguments before *args must stay where they are
            elif kind is inspect.Parameter.VAR_KEYWORD:
                layout.keywords.update(value)
            elif kind is inspect.Parameter.POSITIONAL_ONLY or (
                not self.to_keywords and isinstance(value.key, int)
            ):
                layout.positional += (value,)
            else:
                layout.keywords[name] = value
        return layout

    def _with_defaults(
        self,
        layouts: list[tuple[Candidate, _Layout]],
        keywords: dict[str, Any],
        positional: tuple[Any, ...],
        probe: Probe | None,
    ) -> dict[str, Any]:
        """``keywords`` plus the defaults every fitting signature agrees on, in signature order."""
        first = layouts[0][0]
        position = {name: i for i, name in enumerate(first.signature.parameters)}
        filled = {**keywords, **_agreed_defaults(layouts)}
        ranked = sorted(filled, key=lambda name: position.get(name, len(position)))
        result = {name: filled[name] for name in ranked}
        if probe is not None and first.types is not None:
            checks = _probe_values(first, positional, result)
            if not any(probe.accepts(*values) for values in checks):
                return keywords  # the binding refuses a default as written: leave them out
        return result


def _agreed_defaults(layouts: list[tuple[Candidate, _Layout]]) -> dict[str, Any]:
    """The defaults of parameters the call leaves out, equal in every fitting signature."""
    agreed: dict[str, Any] | None = None
    for candidate, layout in layouts:
        found = _public_literal_defaults(candidate.signature, layout.bound)
        if agreed is None:
            agreed = found
        else:
            agreed = {
                name: value
                for name, value in agreed.items()
                if name in found and literal_key(found[name]) == literal_key(value)
            }
    return agreed or {}


# ====================================================================== helpers
def _fill(layout: _Layout, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Arguments:
    """The layout with each slot replaced by the argument it stands for."""

    def value(slot: _Slot) -> Any:
        return args[slot.key] if isinstance(slot.key, int) else kwargs[slot.key]

    positional = tuple(value(slot) for slot in layout.positional)
    return positional, {name: value(slot) for name, slot in layout.keywords.items()}


def _layout_key(layout: _Layout) -> Any:
    return (
        tuple(slot.key for slot in layout.positional),
        frozenset((name, slot.key) for name, slot in layout.keywords.items()),
    )


def _same_call(
    args: tuple[Any, ...], kwargs: dict[str, Any], old_args: tuple[Any, ...], old: dict[str, Any]
) -> bool:
    return (
        len(args) == len(old_args)
        and all(a is b for a, b in zip(args, old_args))
        and list(kwargs) == list(old)
        and all(kwargs[k] is old[k] for k in kwargs)
    )


def _public_literal_defaults(signature: inspect.Signature, given: frozenset[str]) -> dict[str, Any]:
    return {
        name: parameter.default
        for name, parameter in signature.parameters.items()
        if name not in given
        and not name.startswith("_")
        and parameter.default is not inspect.Parameter.empty
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and parameter.kind is not inspect.Parameter.POSITIONAL_ONLY
        and is_literal(parameter.default)
    }


def _is_value(x: Any) -> bool:
    return isinstance(x, (Node, Proxy))


def _contains_value(x: Any) -> bool:
    return tree_any(_is_value, x)


def _moves_value_by_type(layouts: list[tuple[Candidate, _Layout]], args: tuple[Any, ...]) -> bool:
    """Whether a computed value moves from a position to a parameter typed by no overload as a tensor.

    Torch picks an overload by the run-time types of the arguments; the types of computed
    values are unknown here. A value that every fitting overload takes as a tensor, under
    the same name, is safe (``torch.add(x, y)``: ``other``, for a tensor or a number).
    One that only a number parameter takes may be meant for an overload the Python
    binding has and the schemas do not (``torch.add(x, 2, y)`` is the deprecated
    ``add(input, alpha, other)``), so the name it should get is unknown.
    """
    tensor_typed: dict[int, bool] = {}
    for candidate, layout in layouts:
        types = candidate.types
        for name, slot in layout.keywords.items():
            if isinstance(slot.key, int) and _contains_value(args[slot.key]):
                typed = types is None or is_tensor_type(types.get(name, ""))
                tensor_typed[slot.key] = tensor_typed.get(slot.key, False) or typed
    return not all(tensor_typed.values())


def _accepted(
    probe: Probe | None,
    candidate: Candidate,
    layout: _Layout,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> bool:
    """Whether torch's Python binding accepts the call in this candidate's keyword form.

    Computed values are replaced by stand-ins of the parameter's schema type; for a type
    without a known stand-in a few common values are tried, and any acceptance counts.
    """
    if probe is None:
        return True
    positional, keywords = _fill(layout, args, kwargs)
    return any(probe.accepts(*values) for values in _probe_values(candidate, positional, keywords))


_MAX_PROBES = 16


def _probe_values(
    candidate: Candidate, positional: tuple[Any, ...], keywords: dict[str, Any]
) -> list[Arguments]:
    """The call's arguments with computed values replaced by stand-ins, in every combination.

    (At most ``_MAX_PROBES``: beyond that, the combinations tried are cut short.)
    """
    types = candidate.types or {}
    names = list(candidate.signature.parameters)
    slots = [(names[i] if i < len(names) else "", v) for i, v in enumerate(positional)]
    slots += list(keywords.items())
    choices = [_stand_ins(value, types.get(name, "")) for name, value in slots]
    combinations = itertools.islice(itertools.product(*choices), _MAX_PROBES)
    count = len(positional)
    return [(tuple(values[:count]), dict(zip(keywords, values[count:]))) for values in combinations]


def _generic_stand_ins() -> list[Any]:
    return [dummy_tensor(), 1, 1.0, [dummy_tensor()]]


def _stand_ins(value: Any, schema_type: str) -> list[Any]:
    """Values that can stand for ``value`` (an argument of the given schema type) in a probe."""
    if _is_value(value):
        dummy = dummy_for(schema_type) if schema_type else UNKNOWN
        return _generic_stand_ins() if dummy is UNKNOWN else [dummy]
    entry = container_type(type(value))
    if entry is not None and entry.kind in SEQUENCE_KINDS and _contains_value(value):
        item_type = element_type(schema_type) or ""
        options = itertools.product(*(_stand_ins(item, item_type) for item in value))
        containers = [list(items) for items in itertools.islice(options, 4)]
        return containers if entry.kind == "list" else [tuple(c) for c in containers]
    # A literal stands for itself. (So does a dict or slice holding computed values: torch
    # refuses the nodes in it, so such a candidate never counts and the call stays as it is.)
    return [value]


# Method names of common non-tensor values: a call_method with one of these names may have
# a receiver that is not a tensor (``s.split(",")``, ``d.get(k)``, ``size.numel()``...).
_NON_TENSOR_METHOD_NAMES = frozenset().union(
    *(
        dir(kind)
        for kind in (str, bytes, tuple, list, dict, set, frozenset, int, float, complex, bool)
        + (torch.Size, slice, range)
    )
)


def _receiver_is_tensor(node: Node, root: nn.Module) -> bool:
    """Whether ``node``'s receiver is surely a tensor, by its metadata or its method's name.

    ``meta["type"]`` (from ``ShapeProp``) decides; else a ``val`` or ``tensor_meta``, a
    tensor type annotation or a tensor attribute says it is a tensor; else the method's
    name must be one that common non-tensor values lack.
    """
    receiver = node.args[0] if node.args else None
    if not isinstance(receiver, Node):
        return False
    meta = receiver.meta
    recorded_type = meta.get("type")
    if isinstance(recorded_type, type):
        return issubclass(recorded_type, torch.Tensor)
    if node.target not in _NON_TENSOR_METHOD_NAMES:
        return True
    tensor_meta = meta.get("tensor_meta")
    if isinstance(meta.get("val"), torch.Tensor) or (
        hasattr(tensor_meta, "shape") and hasattr(tensor_meta, "dtype")
    ):
        return True
    annotation = receiver.type
    if isinstance(annotation, type) and issubclass(annotation, torch.Tensor):
        return True
    if receiver.op == "get_attr":
        return isinstance(attr_path.find(root, receiver.target), torch.Tensor)
    return False
