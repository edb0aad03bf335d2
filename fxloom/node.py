"""``Node``: one operation of a ``Graph``, and the helpers that walk node arguments.

A node is one of six opcodes. For each, ``name``, ``target``, ``args`` and
``kwargs`` mean:

============== ======================= =========================== ===========================
op             target                  args                        kwargs
============== ======================= =========================== ===========================
placeholder    the parameter's name    ``()`` or ``(default,)``    unused
get_attr       qualified attribute     unused                      unused
               name (``"lin.weight"``)
call_function  a callable              positional arguments        keyword arguments
call_method    a method name           ``(self, *positional)``     keyword arguments
call_module    qualified submodule     positional arguments        keyword arguments
               name (``"layer1.0"``)   (without the module)
output         ``"output"``            ``(returned_value,)``       unused
============== ======================= =========================== ===========================

``name`` is the variable the value is bound to in generated code. A tiny graph::

    >>> import operator, fxloom
    >>> g = fxloom.Graph()
    >>> x = g.placeholder("x")
    >>> y = g.call_function(operator.mul, (x, 2))
    >>> out = g.output(y)
    >>> print(y.format_node())
    %mul : [num_users=1] = call_function[target=operator.mul](args = (%x, 2), kwargs = {})

Arguments are immutable values (see ``fxloom.immutable_collections``): nodes,
Python scalars and strings, ``None``, slices, ``...``, torch dtypes, devices,
layouts, memory formats and ``torch.Size``, and tuples/lists/dicts of these.
Which values are containers is ``fxloom.pytree``'s to say: named tuples, and
dataclasses or other types registered there, are containers too, their nodes
used like any other (treat such a container as immutable once it is an
argument: assign ``node.args`` to change it). Assigning ``node.args``/
``node.kwargs`` keeps ``users`` of every node involved up to date; nothing
ever rescans the graph to recompute them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from fxloom import attr_path
from fxloom.immutable_collections import immutable_dict
from fxloom.lint import (
    LEAF_ARGUMENT_TYPES,
    ForeignNodeError,
    InvalidNodeError,
    check_argument_value,
)
from fxloom.ops.identity import is_inplace_name
from fxloom.ops.mutation import (
    function_has_side_effect,
    has_side_effect,
    module_has_side_effect,
    writes_through_keywords,
)
from fxloom.pytree import container_type, tree_map

if TYPE_CHECKING:
    from fxloom.graph import Graph

__all__ = [
    "Node",
    "Argument",
    "Target",
    "BaseArgumentTypes",
    "map_arg",
    "map_aggregate",
    "has_side_effect",
    "OPCODES",
]

OPCODES = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")
_OPCODE_SET = frozenset(OPCODES)

Target = Union[Callable[..., Any], str]  # noqa: UP007 - a runtime alias, as documented

BaseArgumentTypes = Union[  # noqa: UP007
    str,
    int,
    float,
    bool,
    complex,
    torch.dtype,
    torch.Tensor,
    torch.device,
    torch.memory_format,
    torch.layout,
    torch.SymInt,
    torch.SymFloat,
    torch.SymBool,
]

Argument = Optional[  # noqa: UP045 - "Node" is a forward reference
    Union[
        tuple[Any, ...],
        list[Any],
        dict[str, Any],
        slice,
        range,
        "Node",
        BaseArgumentTypes,
    ]
]

_NO_KWARGS = immutable_dict()


def _node_at(graph: Graph, position: int) -> Node:
    """The node at ``position`` in ``graph``: how a pickled node is found again."""
    for i, node in enumerate(graph.nodes):
        if i == position:
            return node
    raise IndexError(f"unpickling a node: its graph has no node at position {position}")


def _every_user(user: Node) -> bool:
    return True


class Node:
    """One operation in a ``Graph``; see the module docstring for the opcodes.

    Fields: ``name``, ``op``, ``target``, ``args``, ``kwargs``, ``type`` (an
    optional annotation of the value), ``meta`` (a plain dict for analyses),
    ``users`` (the nodes that use this one, in insertion order), ``prev`` and
    ``next`` (neighbours in the graph's list).

    Passes may set attributes of their own (``node.tag = "quantize"``). As in
    torch.fx, copies (``node_copy``, ``graph_copy``, deep copies of a graph)
    leave them behind and pickling a graph keeps them; ``meta`` travels with
    every copy.
    """

    __slots__ = (
        "graph",
        "_name",
        "_op",
        "_target",
        "_args",
        "_kwargs",
        "_input_nodes",
        "users",
        "_type",
        "meta",
        "_prev",
        "_next",
        "_sort_key",
        "_erased",
        "_flat",
        "_repr_fn",
        "__weakref__",
        "__dict__",  # user attributes (``node.tag = ...``), as passes written for torch.fx set
    )

    def __init__(
        self,
        graph: Graph,
        name: str,
        op: str,
        target: Target,
        args: tuple[Argument, ...],
        kwargs: dict[str, Argument],
        return_type: Any | None = None,
    ) -> None:
        if op not in _OPCODE_SET and op != "root":
            raise InvalidNodeError(
                f"unknown opcode {op!r} for node {name!r}; "
                f"a node's op is one of: {', '.join(OPCODES)}"
            )
        if op in ("call_method", "call_module", "get_attr") and not isinstance(target, str):
            raise InvalidNodeError(
                f"node {name!r}: the target of a {op} node is a string "
                f"(a method or qualified attribute name), got {target!r}"
            )
        if op == "call_function" and not callable(target):
            raise InvalidNodeError(
                f"node {name!r}: the target of a call_function node must be callable, "
                f"got {target!r} of type {type(target).__name__}"
            )
        self.graph = graph
        self._name = name
        self._op = op
        self._target = target
        self._input_nodes: dict[Node, None] = {}
        self.users: dict[Node, None] = {}
        self._type = return_type
        self.meta: dict[str, Any] = {}
        self._prev = self
        self._next = self
        self._sort_key: tuple[int, ...] = (0,)
        self._erased = False
        self._flat = True  # args is a flat tuple of nodes/scalars and kwargs is empty
        self._repr_fn: Callable[[Node], str] | None = None
        self._args: tuple[Argument, ...] = ()
        self._kwargs: dict[str, Argument] = _NO_KWARGS
        self._set_args_kwargs(args, kwargs)

    # ----------------------------------------------------------------- fields
    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, candidate: str) -> None:
        """Rename; the graph's namespace keeps names unique (a taken name gets a suffix)."""
        if candidate == self._name:
            return
        self._name = self.graph._namespace.create_name(candidate)
        self.graph._changed()

    @property
    def op(self) -> str:
        return self._op

    @op.setter
    def op(self, op: str) -> None:
        if op not in _OPCODE_SET:
            raise InvalidNodeError(
                f"unknown opcode {op!r}; a node's op is one of: {', '.join(OPCODES)}"
            )
        self.graph._reindex(self, op, self._target)

    @property
    def target(self) -> Target:
        return self._target

    @target.setter
    def target(self, target: Target) -> None:
        self.graph._reindex(self, self._op, target)

    @property
    def type(self) -> Any:
        """The value's type annotation, printed in generated code (``None``: none)."""
        return self._type

    @type.setter
    def type(self, annotation: Any) -> None:
        self._type = annotation
        self.graph._changed()  # annotations are part of the generated code

    @property
    def args(self) -> tuple[Argument, ...]:
        """Positional arguments (a tuple). Assigning updates ``users`` of all nodes involved."""
        return self._args

    @args.setter
    def args(self, args: tuple[Argument, ...]) -> None:
        self._set_args_kwargs(args, self._kwargs)

    @property
    def kwargs(self) -> dict[str, Argument]:
        """Keyword arguments (a read-only dict). Assigning updates ``users`` bookkeeping."""
        return self._kwargs

    @kwargs.setter
    def kwargs(self, kwargs: dict[str, Argument]) -> None:
        self._set_args_kwargs(self._args, kwargs)

    @property
    def all_input_nodes(self) -> list[Node]:
        """The distinct nodes in ``args`` then ``kwargs``, in order of first appearance."""
        return list(self._input_nodes)

    @property
    def next(self) -> Node:
        """The following node (the graph's sentinel, op ``"root"``, after the last one)."""
        return self._next

    @property
    def prev(self) -> Node:
        """The preceding node (the graph's sentinel, op ``"root"``, before the first one)."""
        return self._prev

    @property
    def stack_trace(self) -> str | None:
        """Where in user code this node came from; stored in ``meta["stack_trace"]``."""
        return self.meta.get("stack_trace")

    @stack_trace.setter
    def stack_trace(self, trace: str | None) -> None:
        self.meta["stack_trace"] = trace
        # The stamped innermost frame described the old trace; ``source_location`` reads the new.
        self.meta.pop("source_location", None)

    # ------------------------------------------------------- args bookkeeping
    def _set_args_kwargs(self, args: Any, kwargs: Any) -> None:
        if self._erased:
            raise RuntimeError(f"%{self._name} was erased from its graph; its arguments are final")
        if type(args) is not tuple:
            if isinstance(args, (list, tuple)):
                args = tuple(args)
            else:
                raise TypeError(
                    f"args of %{self._name} must be a tuple, got {type(args).__name__}: {args!r}"
                )
        if not isinstance(kwargs, dict):
            raise TypeError(
                f"kwargs of %{self._name} must be a dict, got {type(kwargs).__name__}: {kwargs!r}"
            )
        inputs: dict[Node, None] = {}
        frozen = _freeze_tuple(args, inputs, self)
        self._flat = frozen is args and not kwargs
        kwargs = _freeze_kwargs(kwargs, inputs, self) if kwargs else _NO_KWARGS
        graph = self.graph
        for node in inputs:  # validate everything before touching any users
            if node.graph is not graph or node._erased:
                self._refuse_input(node)
        old_inputs = self._input_nodes
        for node in old_inputs:
            if node not in inputs:
                del node.users[self]
        for node in inputs:
            if node not in old_inputs:
                node.users[self] = None
        self._args = frozen
        self._kwargs = kwargs
        self._input_nodes = inputs
        graph._version += 1  # the code depends on arguments: regenerate on next use

    def _refuse_input(self, node: Node) -> None:
        if node._erased:
            raise ForeignNodeError(
                f"%{self._name} uses %{node._name}, which was erased from the graph"
            )
        raise ForeignNodeError(
            f"%{self._name} uses %{node._name}, which belongs to another graph; "
            "copy nodes between graphs with Graph.node_copy or Graph.graph_copy"
        )

    def update_arg(self, idx: int, arg: Argument) -> None:
        """Replace positional argument ``idx`` with ``arg``."""
        args = list(self._args)
        args[idx] = arg
        self.args = tuple(args)

    def insert_arg(self, idx: int, arg: Argument) -> None:
        """Insert ``arg`` before positional argument ``idx`` (``len(args)`` appends).

        >>> import fxloom
        >>> g = fxloom.Graph()
        >>> x = g.placeholder("x")
        >>> call = g.call_function(max, (x,))
        >>> call.insert_arg(0, 2)
        >>> call.args
        (2, x)
        """
        if not 0 <= idx <= len(self._args):
            raise IndexError(
                f"insert_arg index {idx} out of range for %{self._name}, which has "
                f"{len(self._args)} positional arguments (0 to {len(self._args)} allowed)"
            )
        self.args = (*self._args[:idx], arg, *self._args[idx:])

    def update_kwarg(self, key: str, arg: Argument) -> None:
        """Set keyword argument ``key`` to ``arg``."""
        kwargs = dict(self._kwargs)
        kwargs[key] = arg
        self.kwargs = kwargs

    def replace_input_with(self, old_input: Node, new_input: Node) -> None:
        """Use ``new_input`` wherever this node used ``old_input``."""
        if old_input not in self._input_nodes:
            return
        if self._flat and type(new_input) is Node:
            if new_input.graph is not self.graph or new_input._erased:
                self._refuse_input(new_input)
            self._swap_flat_input(old_input, new_input)
            return

        def swap(n: Node) -> Node:
            return new_input if n is old_input else n

        self._set_args_kwargs(map_arg(self._args, swap), map_arg(self._kwargs, swap))

    def _swap_flat_input(self, old_input: Node, new_input: Node) -> None:
        """``replace_input_with`` for flat args whose new input is a valid node of this graph.

        The inner loop of most rewrites: only the two nodes' bookkeeping
        changes, the other arguments are not re-validated, and plain loops
        avoid the per-call frames of comprehensions.
        """
        args = list(self._args)
        inputs: dict[Node, None] = {}
        for i, a in enumerate(args):
            if a is old_input:
                args[i] = a = new_input
            if type(a) is Node:
                inputs[a] = None
        del old_input.users[self]
        new_input.users[self] = None
        self._input_nodes = inputs
        self._args = tuple(args)
        self.graph._version += 1

    def replace_all_uses_with(
        self,
        replace_with: Node,
        delete_user_cb: Callable[[Node], bool] = _every_user,
        *,
        propagate_meta: bool = False,
    ) -> list[Node]:
        """Make users of this node use ``replace_with`` instead; return the users changed.

        ``delete_user_cb(user)`` selects which users to change (all by default).
        With ``propagate_meta``, ``meta`` entries of this node missing from
        ``replace_with`` are copied over.
        """
        if propagate_meta:
            for key, value in self.meta.items():
                replace_with.meta.setdefault(key, value)
        if delete_user_cb is _every_user:
            changed = list(self.users)
        else:
            changed = [user for user in self.users if delete_user_cb(user)]
        fast = type(replace_with) is Node
        if fast and changed and (replace_with.graph is not self.graph or replace_with._erased):
            changed[0]._refuse_input(replace_with)  # raises, naming both nodes
        for user in changed:
            if fast and user._flat:
                user._swap_flat_input(self, replace_with)
            else:
                user.replace_input_with(self, replace_with)
        return changed

    # ------------------------------------------------------------ list moves
    def prepend(self, x: Node) -> None:
        """Move (or insert) ``x`` so that it sits immediately before this node."""
        if x is self:
            return
        if x.graph is not self.graph:
            raise ForeignNodeError(
                f"cannot move %{x._name} next to %{self._name}: different graphs"
            )
        self.graph._link_before(self, x)

    def append(self, x: Node) -> None:
        """Move (or insert) ``x`` so that it sits immediately after this node."""
        if x is self:
            return
        self._next.prepend(x)

    def __deepcopy__(self, memo: dict[int, Any]) -> Node:
        # Reached only for a node outside a graph copy (one held in an unrelated
        # structure): as in torch.fx, its whole graph is copied along.
        copy.deepcopy(self.graph, memo)  # registers each copied node in memo
        copied = memo.get(id(self))
        if copied is None:  # erased: no longer in the graph it names
            raise TypeError(f"cannot deep-copy node %{self._name}: it was erased from its graph")
        return copied

    def __reduce__(self) -> Any:
        # As in torch.fx, a node pickles with its graph and unpickles as the
        # corresponding node of the loaded graph. (torch.fx drags the owning
        # GraphModule along too; a graph here holds its module weakly, so the
        # loaded one would be dropped at once: only the graph comes.)
        if self._erased:
            raise TypeError(f"cannot pickle node %{self._name}: it was erased from its graph")
        position = next(i for i, n in enumerate(self.graph.nodes) if n is self)
        return (_node_at, (self.graph, position))

    def __lt__(self, other: Node) -> bool:
        return self._sort_key < other._sort_key

    def __gt__(self, other: Node) -> bool:
        return self._sort_key > other._sort_key

    # ----------------------------------------------------------------- purity
    def is_impure(self) -> bool:
        """Whether dead-code elimination must keep this node even when unused.

        Impure: placeholders and outputs; calls to functions registered with
        ``has_side_effect`` (in-place operators, ``setitem``, ``print``, ...);
        in-place methods (``add_``) and functions (``torch.relu_``); calls
        writing into ``out=`` or passing ``inplace=True``; modules with a true
        ``_is_impure`` attribute; and any node with ``meta["is_impure"]`` set.
        """
        op = self._op
        if op in ("placeholder", "output") or self.meta.get("is_impure"):
            return True
        kwargs = self._kwargs
        if kwargs and writes_through_keywords(kwargs):
            return True
        if op == "call_function":
            return function_has_side_effect(self._target)
        if op == "call_method":
            return is_inplace_name(self._target)
        if op == "call_module":
            root = self.graph.owning_module
            if root is None:
                return False
            module = attr_path.find(root, self._target)
            if not isinstance(module, torch.nn.Module):
                return False
            return module_has_side_effect(module)
        return False

    # --------------------------------------------------------------- printing
    def __repr__(self) -> str:
        if self._repr_fn is not None:
            return self._repr_fn(self)
        return self._name

    def format_node(
        self,
        placeholder_names: list[str] | None = None,
        maybe_return_typename: list[str] | None = None,
    ) -> str | None:
        """The node in the graph's text form::

            %name : [num_users=N] = op[target=T](args = (...), kwargs = {...})

        An output node prints as ``return <value>``. If ``placeholder_names``
        is given, placeholders are appended to it and ``None`` is returned (used
        to print ``graph(x, y):`` headers); ``maybe_return_typename`` receives
        the output's type annotation.
        """
        from fxloom._format import format_node

        return format_node(self, placeholder_names, maybe_return_typename)


# ---------------------------------------------------------------- arguments
# The structure of arguments (which values are containers, how they are rebuilt)
# is ``fxloom.pytree``'s; this module adds what nodes need on top: recording the
# nodes used, refusing values that cannot be arguments, and flat fast paths.
def _freeze_tuple(args: tuple, inputs: dict[Node, None], owner: Node | None) -> tuple:
    """Record the nodes in ``args``; return ``args`` with lists/dicts frozen.

    The common case — a flat tuple of nodes and scalars — returns the tuple
    itself without rebuilding it.
    """
    for a in args:
        t = type(a)
        if t is Node:
            inputs[a] = None
        elif t not in LEAF_ARGUMENT_TYPES:
            return tuple([_freeze(item, inputs, owner) for item in args])
    return args


def _freeze_kwargs(kwargs: dict, inputs: dict[Node, None], owner: Node | None) -> immutable_dict:
    """Record the nodes in ``kwargs``; return them as an ``immutable_dict`` of frozen values.

    The common case — values that are nodes and scalars — copies the dict
    without walking it.
    """
    for value in kwargs.values():
        t = type(value)
        if t is Node:
            inputs[value] = None
        elif t not in LEAF_ARGUMENT_TYPES:
            return immutable_dict((k, _freeze(v, inputs, owner)) for k, v in kwargs.items())
    return immutable_dict(kwargs)


def _freeze(a: Any, inputs: dict[Node, None], owner: Node | None) -> Any:
    """``a`` in its stored form, its nodes recorded in ``inputs``.

    Every other leaf is checked: values that cannot be arguments (tensors,
    modules, arbitrary objects) raise a ``TypeError`` naming ``owner``. This is
    ``_map_nodes`` written out for node creation, which it would slow by about a
    tenth for arguments holding a list (``torch.cat([a, b])``) through the two
    closures it would need per call.
    """
    t = type(a)
    if t is Node:
        inputs[a] = None
        return a
    if t in LEAF_ARGUMENT_TYPES:
        return a
    entry = container_type(t)
    if entry is None:
        if not isinstance(a, (int, float, str)):  # subclasses such as IntEnum are fine
            check_argument_value(a, owner)
        return a
    children, context = entry.flatten(a)
    return entry.frozen.unflatten([_freeze(c, inputs, owner) for c in children], context)


def _map_nodes(a: Any, on_node: Callable[[Node], Any]) -> Any:
    """``a`` as node arguments store it, each node replaced by ``on_node(node)``.

    ``tree_map(fn, a, mode="frozen")`` with nodes and ``LEAF_ARGUMENT_TYPES`` values
    tested inline (``map_arg`` runs it on every argument that is not a flat
    tuple, e.g. in each rewrite); other leaves come back as they are.
    """
    t = type(a)
    if t is Node:
        return on_node(a)
    if t in LEAF_ARGUMENT_TYPES:
        return a
    entry = container_type(t)
    if entry is None:
        return a
    children, context = entry.flatten(a)
    return entry.frozen.unflatten([_map_nodes(c, on_node) for c in children], context)


def map_aggregate(a: Argument, fn: Callable[[Argument], Argument]) -> Argument:
    """Apply ``fn`` to every leaf of ``a`` (a nested tuple/list/dict/slice), keeping its shape.

    Lists and dicts come back as ``immutable_list``/``immutable_dict``;
    named tuples keep their type. Containers are those of ``fxloom.pytree``
    (types registered there are walked too); a ``torch.Size``, a leaf there,
    is mapped element by element and stays a ``torch.Size``.

    >>> map_aggregate((1, [2, {"a": 3}]), lambda v: v * 10)
    (10, [20, {'a': 30}])
    """

    def leaf(x: Any) -> Any:
        if isinstance(x, torch.Size):
            return torch.Size([fn(d) for d in x])
        return fn(x)

    return tree_map(leaf, a, mode="frozen")


def map_arg(a: Argument, fn: Callable[[Node], Argument]) -> Argument:
    """Apply ``fn`` to every ``Node`` inside ``a``, keeping the structure around them.

    Containers come back as ``map_aggregate`` returns them.

    >>> map_arg((1, [2, 3]), lambda n: n)  # no nodes: same values back
    (1, [2, 3])
    """
    if not callable(fn):
        raise TypeError("map_arg(a, fn): fn must be callable")
    t = type(a)
    if t is tuple:  # fast path: the usual flat tuple of nodes and scalars
        mapped = []
        for x in a:
            tx = type(x)
            if tx is Node:
                mapped.append(fn(x))
            elif tx in LEAF_ARGUMENT_TYPES:
                mapped.append(x)
            else:
                break
        else:
            return tuple(mapped)
    elif t is immutable_dict and not a:
        return a
    return _map_nodes(a, fn)
