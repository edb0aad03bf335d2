"""The structure of values: which types are containers, and how each is taken apart and rebuilt.

Node arguments, the values an ``Interpreter`` computes, the example inputs of a
trace and (next) the inputs and outputs of exported programs are trees: nested
containers whose leaves are everything else. This module is the one description
of that structure; every walk over arguments or values goes through it, and a
user (or ``fxloom.export``) extends it by registering a type::

    >>> import dataclasses, fxloom.pytree as pytree
    >>> @dataclasses.dataclass
    ... class Pair:
    ...     left: object
    ...     right: object
    >>> _ = pytree.register_dataclass(Pair)
    >>> pytree.tree_map(lambda x: x * 10, Pair(1, [2, 3]))
    Pair(left=10, right=[20, 30])
    >>> leaves, spec = pytree.tree_flatten({"a": (1, 2), "b": slice(None, 4)})
    >>> leaves
    [1, 2, None, 4, None]
    >>> pytree.tree_unflatten([5, 6, None, 7, None], spec)
    {'a': (5, 6), 'b': slice(None, 7, None)}

Containers known from the start: ``tuple``, named tuples (each keeps its type),
``list``, ``dict``, ``collections.OrderedDict``, ``slice`` (its start, stop and
step are children) and fxloom's ``immutable_list``/``immutable_dict``. An
unregistered subclass of one of these is walked, and rebuilt, as that base:
register it to keep its type. ``torch.Size``, strings, bytes and ranges (and
their subclasses) are leaves.

Classes the ecosystem registers with torch's pytree (``torch.utils._pytree``) are
containers here too, rebuilt as their own type: Hugging Face's ``ModelOutput``
classes, and any user type registered there. (torch's registrations of its own and
of Python's types — ``torch.Size``, ``torch.return_types``, ``deque`` — leave those
types as described above.) Classes that libraries ship unregistered, which fxloom
knows how to take apart (``transformers``' ``DynamicCache``), are listed in
``fxloom.library_containers`` and registered when first met. A registration
here takes precedence over torch's.

A container is rebuilt in one of three forms, chosen by ``mode``:

* ``"same"``: as the type it was (the default);
* ``"frozen"``: as node arguments store it — lists become ``immutable_list``,
  dicts ``immutable_dict``, tuple subclasses plain tuples (named tuples stay);
* ``"plain"``: as generated code builds it — ``immutable_list`` becomes
  ``list`` and ``immutable_dict`` becomes ``dict``.

Depends on ``fxloom.immutable_collections`` and ``fxloom.library_containers``; reads
torch's pytree registry.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import torch
import torch.utils._pytree as torch_pytree

from fxloom.immutable_collections import immutable_dict, immutable_list
from fxloom.library_containers import LIBRARY_CONTAINERS

__all__ = [
    "ContainerType",
    "SEQUENCE_KINDS",
    "TreeSpec",
    "NONE_SPEC",
    "register_pytree_node",
    "register_dataclass",
    "container_type",
    "registered_container",
    "tree_map",
    "tree_leaves",
    "tensor_leaves",
    "tree_flatten_spec",
    "tree_any",
    "tree_flatten",
    "tree_unflatten",
]

Mode = Literal["same", "frozen", "plain"]
_MODES = ("same", "frozen", "plain")
FlattenFn = Callable[[Any], tuple[Sequence[Any], Any]]
UnflattenFn = Callable[[Sequence[Any], Any], Any]


class ContainerType:
    """How one container type is taken apart (``flatten``) and rebuilt (``unflatten``).

    ``flatten(value)`` returns ``(children, context)``: the values inside, in
    order, and whatever else rebuilding needs (a dict's keys, a dataclass's
    field names). ``unflatten(children, context)`` builds the container back.
    ``frozen`` and ``plain`` are the container types used in those modes
    (``self`` when the form does not change). ``kind`` says which family the
    type belongs to, for code that prints containers or compares them loosely:
    ``"tuple"``, ``"namedtuple"``, ``"list"`` (with ``immutable_list``),
    ``"dict"`` (with ``OrderedDict`` and ``immutable_dict``), ``"slice"``,
    ``"dataclass"``, ``"custom"`` (registered with ``register_pytree_node``, with torch's
    pytree, or listed in ``fxloom.library_containers``) or ``"none"`` (``NONE``).
    """

    __slots__ = ("type", "flatten", "unflatten", "name", "kind", "frozen", "plain")

    def __init__(
        self,
        cls: type,
        flatten: FlattenFn,
        unflatten: UnflattenFn,
        name: str,
        kind: str = "custom",
    ) -> None:
        self.type = cls
        self.flatten = flatten
        self.unflatten = unflatten
        self.name = name  # stable name for persisted specs (``collections.OrderedDict``)
        self.kind = kind
        self.frozen: ContainerType = self
        self.plain: ContainerType = self

    def __repr__(self) -> str:
        return f"ContainerType({self.name})"


# Families of ``ContainerType.kind`` that hold an ordered run of values and nothing else.
SEQUENCE_KINDS = frozenset({"tuple", "namedtuple", "list"})

# Registered types, by exact type. ``_resolved`` caches what every type seen so
# far resolves to (None: a leaf), so a walk pays one dict lookup per value; it is
# emptied when a type is registered here or with torch's pytree (``_sync``).
_REGISTRY: dict[type, ContainerType] = {}
_resolved: dict[type, ContainerType | None] = {}
_torch_registrations = [0]  # the size of torch's registry when ``_resolved`` was last valid
# Never containers, although some subclass registered types (torch.Size is a tuple).
_LEAVES = frozenset({torch.Size, str, bytes, range})
_UNSEEN: Any = object()


def register_pytree_node(
    cls: type,
    flatten_fn: FlattenFn,
    unflatten_fn: UnflattenFn,
    *,
    serialized_type_name: str | None = None,
) -> None:
    """Make ``cls`` a container: ``flatten_fn(x) -> (children, context)``, ``unflatten_fn(children, context) -> x``.

    Its children are then walked by every fxloom traversal (node arguments,
    interpreter values, example inputs). Registering a type twice is an error.
    """
    _register(cls, flatten_fn, unflatten_fn, serialized_type_name, "custom")


def _register(
    cls: type,
    flatten_fn: FlattenFn,
    unflatten_fn: UnflattenFn,
    serialized_type_name: str | None,
    kind: str,
) -> ContainerType:
    if not isinstance(cls, type):
        raise TypeError(f"only classes can be registered as pytree containers, got {cls!r}")
    if cls in _REGISTRY:
        raise ValueError(f"{cls.__qualname__} is already registered as a pytree container")
    if _leaf_base(cls) is not None:
        raise ValueError(f"{cls.__qualname__} is always a leaf and cannot be registered")
    name = serialized_type_name or f"{cls.__module__}.{cls.__qualname__}"
    entry = ContainerType(cls, flatten_fn, unflatten_fn, name, kind)
    _REGISTRY[cls] = entry
    _resolved.clear()  # subclasses resolved to a base before now may resolve to cls
    return entry


def register_dataclass(cls: type) -> type:
    """Register a dataclass: its fields (those set in ``__init__``) are its children, in order.

    The context of a flattened instance is the tuple of field names. Returns
    ``cls``, so it also works as a class decorator.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{getattr(cls, '__qualname__', cls)!r} is not a dataclass (class)")
    names = tuple(f.name for f in dataclasses.fields(cls) if f.init)

    def flatten(value: Any) -> tuple[Sequence[Any], Any]:
        return [getattr(value, name) for name in names], names

    def unflatten(children: Sequence[Any], context: Any) -> Any:
        return cls(**dict(zip(context, children)))

    _register(cls, flatten, unflatten, None, "dataclass")
    return cls


def container_type(cls: type) -> ContainerType | None:
    """What ``cls`` is walked as: its ``ContainerType``, or None for a leaf."""
    _sync()
    try:
        return _resolved[cls]
    except KeyError:
        pass
    entry = _resolve(cls)
    _resolved[cls] = entry
    return entry


def registered_container(cls: type) -> ContainerType | None:
    """``cls``'s own registration (fxloom's, a library table's, or torch's pytree), else None.

    Unlike ``container_type``, a subclass of a registered type, a named tuple and the
    built-in containers count only if registered themselves; this is what loading a
    file checks before it rebuilds a container class it names.
    """
    if not isinstance(cls, type) or _leaf_base(cls) is not None:
        return None
    return _REGISTRY.get(cls) or _from_library(cls) or _from_torch(cls)


def _sync() -> None:
    """Forget resolved types when torch's registry changed (a class registered there after
    fxloom walked it as a leaf)."""
    registrations = len(torch_pytree.SUPPORTED_NODES)
    if registrations != _torch_registrations[0]:
        _resolved.clear()
        _torch_registrations[0] = registrations


def _resolve(cls: type) -> ContainerType | None:
    if _leaf_base(cls) is not None:
        return None
    entry = _REGISTRY.get(cls) or _from_library(cls)
    if entry is not None:
        return entry
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return _named_tuple(cls)
    entry = _from_torch(cls)
    if entry is not None:
        return entry
    for base in cls.__mro__:  # an unregistered subclass walks as its nearest registered base
        entry = _REGISTRY.get(base)
        if entry is not None:
            return entry
    return None


def _from_library(cls: type) -> ContainerType | None:
    """The row of ``LIBRARY_CONTAINERS`` for ``cls``, registered the first time it is met."""
    row = LIBRARY_CONTAINERS.get(f"{cls.__module__}.{cls.__qualname__}")
    if row is None:
        return None
    return _register(cls, *row, None, "custom")


# torch's registrations of its own types and Python's: fxloom has its own rules for these.
_TORCH_OWN_MODULES = ("builtins", "collections", "torch", "fxloom")


def _from_torch(cls: type) -> ContainerType | None:
    """A class a library or user registered with ``torch.utils._pytree``, walked by the
    functions registered there."""
    node = torch_pytree.SUPPORTED_NODES.get(cls)
    if node is None or cls.__module__.partition(".")[0] in _TORCH_OWN_MODULES:
        return None
    # One ContainerType per registration, so specs made before ``_resolved`` was emptied
    # still match values walked after (``tree_flatten_spec`` compares entries by identity).
    entry = _from_torch_entries.get(cls)
    if entry is None or entry.flatten is not node.flatten_fn:
        name = f"{cls.__module__}.{cls.__qualname__}"
        entry = ContainerType(cls, node.flatten_fn, node.unflatten_fn, name)
        _from_torch_entries[cls] = entry
    return entry


_from_torch_entries: dict[type, ContainerType] = {}


def _leaf_base(cls: type) -> type | None:
    return next((base for base in cls.__mro__ if base in _LEAVES), None)


def _named_tuple(cls: type) -> ContainerType:
    """A named tuple keeps its type in every mode (``cls(*children)``)."""
    return ContainerType(
        cls,
        lambda value: (tuple(value), None),
        lambda children, context: cls(*children),
        f"{cls.__module__}.{cls.__qualname__}",
        "namedtuple",
    )


# ----------------------------------------------------------------- walking
def tree_map(
    fn: Callable[[Any], Any],
    tree: Any,
    *,
    mode: Mode = "same",
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """``tree`` with ``fn`` applied to every leaf, containers rebuilt in ``mode`` (see the module docstring).

    ``is_leaf(value)`` returning True stops the walk at ``value`` (it goes to ``fn`` whole);
    it is asked about containers only.

    >>> tree_map(str, (1, [2], {"k": 3}), mode="frozen")
    ('1', ['2'], {'k': '3'})
    """
    if mode not in _MODES:
        raise ValueError(f"tree_map: mode is one of {', '.join(map(repr, _MODES))}, got {mode!r}")
    same, frozen = mode == "same", mode == "frozen"
    _sync()
    lookup = _resolved.get

    def walk(value: Any) -> Any:
        # Inlined ``container_type``: this runs once per value of every argument walked.
        entry = lookup(type(value), _UNSEEN)
        if entry is _UNSEEN:
            entry = container_type(type(value))
        if entry is None or (is_leaf is not None and is_leaf(value)):
            return fn(value)
        children, context = entry.flatten(value)
        rebuild = entry if same else entry.frozen if frozen else entry.plain
        return rebuild.unflatten([walk(child) for child in children], context)

    return walk(tree)


def tree_leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[Any]:
    """The leaves of ``tree``, in order.

    >>> tree_leaves({"a": [1, 2], "b": (3, slice(4, None))})
    [1, 2, 3, 4, None, None]
    """
    leaves: list[Any] = []
    _collect(tree, leaves, is_leaf)
    return leaves


def tensor_leaves(tree: Any) -> tuple[torch.Tensor, ...]:
    """The tensors among ``tree``'s leaves, in order: a model's output (``ModelOutput``, dicts,
    tuples) and the keys and values of transformers' caches included.

    >>> tensor_leaves({"logits": torch.zeros(1), "loss": None, "sizes": (2, torch.ones(1))})
    (tensor([0.]), tensor([1.]))
    """
    return tuple(leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor))


def _collect(value: Any, leaves: list[Any], is_leaf: Callable[[Any], bool] | None) -> None:
    entry = container_type(type(value))
    if entry is None or (is_leaf is not None and is_leaf(value)):
        leaves.append(value)
        return
    for child in entry.flatten(value)[0]:
        _collect(child, leaves, is_leaf)


def tree_any(
    pred: Callable[[Any], bool], tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> bool:
    """Whether ``pred`` holds for some leaf of ``tree`` (stops at the first)."""
    entry = container_type(type(tree))
    if entry is None or (is_leaf is not None and is_leaf(tree)):
        return pred(tree)
    return any(tree_any(pred, child, is_leaf) for child in entry.flatten(tree)[0])


# --------------------------------------------------------- flatten / unflatten
class TreeSpec:
    """The shape of a tree without its leaves: ``tree_unflatten(leaves, spec)`` rebuilds it.

    A leaf's spec has ``type`` None. Specs compare equal when the trees have
    the same containers, contexts (dict keys, ...) and nesting.
    """

    __slots__ = ("type", "context", "children", "num_leaves", "_container")

    def __init__(
        self,
        container: ContainerType | None,
        context: Any = None,
        children: tuple[TreeSpec, ...] = (),
    ) -> None:
        self._container = container
        self.type = container.type if container is not None else None
        self.context = context
        self.children = children
        self.num_leaves = 1 if container is None else sum(c.num_leaves for c in children)

    def is_leaf(self) -> bool:
        return self._container is None

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TreeSpec)
            and self.type is other.type
            and self.context == other.context
            and self.children == other.children
        )

    def __hash__(self) -> int:
        return hash((self.type, self.num_leaves))

    def __reduce__(self) -> tuple:
        # By container type, not by ContainerType (whose functions may be lambdas).
        return (_spec_of_type, (self.type, self.context, self.children))

    def __repr__(self) -> str:
        if self._container is None:
            return "*"
        if self._container is NONE:
            return "None"
        inner = ", ".join(repr(c) for c in self.children)
        context = "" if self.context is None else f"; {self.context!r}"
        return f"{self._container.name}({inner}{context})"


LEAF_SPEC = TreeSpec(None)

# ``None`` as a container of nothing: how ``tree_flatten(..., none_is_leaf=False)`` sees it.
# Exported programs' input specs use it, so that an input left None is part of the calling
# convention (the call must pass None there) without being an input of the graph.
NONE = ContainerType(
    type(None), lambda value: ((), None), lambda children, context: None, "None", "none"
)
NONE_SPEC = TreeSpec(NONE)


def _spec_of_type(cls: type | None, context: Any, children: tuple[TreeSpec, ...]) -> TreeSpec:
    if cls is type(None):
        return NONE_SPEC
    return TreeSpec(None if cls is None else container_type(cls), context, children)


def tree_flatten(
    tree: Any, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = True
) -> tuple[list[Any], TreeSpec]:
    """``(leaves, spec)``: the leaves of ``tree`` in order, and its shape.

    With ``none_is_leaf=False``, ``None`` is a container with no leaves (its spec is
    ``NONE_SPEC``): rebuilding gives None back, and ``tree_flatten_spec`` requires None there.

    >>> tree_flatten((1, None), none_is_leaf=False)
    ([1], tuple(*, None))
    """
    leaves: list[Any] = []

    def walk(value: Any) -> TreeSpec:
        if value is None and not none_is_leaf:
            return NONE_SPEC
        entry = container_type(type(value))
        if entry is None or (is_leaf is not None and is_leaf(value)):
            leaves.append(value)
            return LEAF_SPEC
        children, context = entry.flatten(value)
        return TreeSpec(entry, context, tuple(walk(child) for child in children))

    return leaves, walk(tree)


def tree_unflatten(leaves: Iterable[Any], spec: TreeSpec) -> Any:
    """Rebuild the tree ``spec`` describes with ``leaves`` in order; the count must match."""
    values = list(leaves)
    if len(values) != spec.num_leaves:
        raise ValueError(
            f"tree_unflatten: the spec {spec!r} has {spec.num_leaves} leaves, "
            f"{len(values)} values were given"
        )
    position = iter(values)

    def build(node: TreeSpec) -> Any:
        if node._container is None:
            return next(position)
        return node._container.unflatten([build(child) for child in node.children], node.context)

    return build(spec)


def tree_flatten_spec(tree: Any, spec: TreeSpec) -> list[Any]:
    """The leaves of ``tree``, which must have the shape ``spec`` describes, in the spec's order.

    A dict is read by the spec's keys (its own order does not matter) and a
    list may stand for a tuple and back; any other difference raises a
    ``ValueError`` naming where the shapes part.

        >>> _, spec = tree_flatten({"a": 1, "b": (2, 3)})
        >>> tree_flatten_spec({"b": [20, 30], "a": 10}, spec)
        [10, 20, 30]
    """
    leaves: list[Any] = []

    def walk(value: Any, node: TreeSpec, where: str) -> None:
        expected = node._container
        if expected is None:
            leaves.append(value)
            return
        if expected is NONE:
            if value is not None:
                raise ValueError(
                    f"{where} is {type(value).__name__}, where the spec has None (an input "
                    "fixed to None, which is not an input of the graph)"
                )
            return
        if expected.kind == "dict" and container_type(type(value)) in _DICT_KINDS:
            missing = [key for key in node.context if key not in value]
            if missing:
                raise ValueError(f"{where} has no key {missing[0]!r}; the spec is {node!r}")
            children: Sequence[Any] = [value[key] for key in node.context]
        else:
            entry = container_type(type(value))
            loose = {entry and entry.kind, expected.kind} <= {"tuple", "list"}
            if entry is not expected and not loose:
                got = "a leaf" if entry is None else entry.name
                raise ValueError(f"{where} is {got}, where the spec has {node!r}")
            children, context = entry.flatten(value)
            if len(children) != len(node.children) or (not loose and context != node.context):
                raise ValueError(f"{where} is {value!r}, which does not fit the spec {node!r}")
        for index, (child, child_spec) in enumerate(zip(children, node.children)):
            walk(child, child_spec, f"{where}[{index}]")

    walk(tree, spec, "the input")
    return leaves


# --------------------------------------------------------------- built-ins
def _sequence(cls: type, kind: str) -> ContainerType:
    return _register(
        cls,
        lambda value: (value, None),
        lambda children, context: cls(children),
        cls.__name__,
        kind,
    )


def _mapping(cls: type) -> ContainerType:
    name = cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return _register(
        cls,
        lambda value: (tuple(value.values()), tuple(value)),
        lambda children, keys: cls(zip(keys, children)),
        name,
        "dict",
    )


_TUPLE = _sequence(tuple, "tuple")
_LIST = _sequence(list, "list")
_IMMUTABLE_LIST = _sequence(immutable_list, "list")
_DICT = _mapping(dict)
_ORDERED_DICT = _mapping(collections.OrderedDict)
_IMMUTABLE_DICT = _mapping(immutable_dict)
_register(
    slice,
    lambda s: ((s.start, s.stop, s.step), None),
    lambda children, context: slice(*children),
    "slice",
    "slice",
)
_DICT_KINDS = frozenset({_DICT, _ORDERED_DICT, _IMMUTABLE_DICT})
_LIST.frozen = _IMMUTABLE_LIST
_DICT.frozen = _ORDERED_DICT.frozen = _IMMUTABLE_DICT
_IMMUTABLE_LIST.plain = _LIST
_IMMUTABLE_DICT.plain = _ORDERED_DICT.plain = _DICT
