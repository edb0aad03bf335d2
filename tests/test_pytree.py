"""``fxloom.pytree``: which values are containers, the three rebuild modes, flatten/unflatten,
registering user types, and what a registered type can do as a node argument."""

from __future__ import annotations

import collections
import dataclasses
import operator
from typing import Any, NamedTuple

import pytest
import torch
import torch.utils._pytree as torch_pytree
from hypothesis import given, settings
from hypothesis import strategies as st

import fxloom as fx
import fxloom.pytree as pytree
from fxloom.immutable_collections import immutable_dict, immutable_list
from fxloom.pytree import (
    TreeSpec,
    container_type,
    register_dataclass,
    register_pytree_node,
    tree_any,
    tree_flatten,
    tree_leaves,
    tree_map,
    tree_unflatten,
)


class Point(NamedTuple):
    x: Any
    y: Any


class Pair(tuple):
    """A tuple subclass nobody registered: walked, and rebuilt, as a plain tuple."""


class Names(list):
    """A list subclass nobody registered: walked as a list."""


class Text(str):
    """A subclass of a leaf type stays a leaf."""


@register_dataclass
@dataclasses.dataclass
class Span:
    start: Any
    stop: Any
    label: str = dataclasses.field(default="", init=False)  # not set in __init__: not a child


class Bag:
    """A user container registered by hand: its items are its children, its tag the context."""

    def __init__(self, items: list[Any], tag: str = "bag") -> None:
        self.items = list(items)
        self.tag = tag

    def __eq__(self, other: object) -> bool:
        return type(other) is Bag and (self.items, self.tag) == (other.items, other.tag)

    __hash__ = None  # type: ignore[assignment]


def _bag_children(bag: Bag) -> tuple[list[Any], str]:
    return bag.items, bag.tag


def _bag_from(children: list[Any], tag: str) -> Bag:
    return Bag(children, tag)


register_pytree_node(Bag, _bag_children, _bag_from)


def plus_one(leaf: Any) -> Any:
    return leaf + 1 if type(leaf) is int else leaf


# ------------------------------------------------------------ built-in containers
# (value, mode, type of the result, result): every built-in container in each mode.
MODES = [
    ((1, 2), "same", tuple, (2, 3)),
    ((1, 2), "frozen", tuple, (2, 3)),
    ((1, 2), "plain", tuple, (2, 3)),
    ([1, 2], "same", list, [2, 3]),
    ([1, 2], "frozen", immutable_list, [2, 3]),
    ([1, 2], "plain", list, [2, 3]),
    (immutable_list([1]), "same", immutable_list, [2]),
    (immutable_list([1]), "frozen", immutable_list, [2]),
    (immutable_list([1]), "plain", list, [2]),
    ({"a": 1}, "same", dict, {"a": 2}),
    ({"a": 1}, "frozen", immutable_dict, {"a": 2}),
    ({"a": 1}, "plain", dict, {"a": 2}),
    (immutable_dict(a=1), "same", immutable_dict, {"a": 2}),
    (immutable_dict(a=1), "frozen", immutable_dict, {"a": 2}),
    (immutable_dict(a=1), "plain", dict, {"a": 2}),
    (collections.OrderedDict(a=1), "same", collections.OrderedDict, {"a": 2}),
    (collections.OrderedDict(a=1), "frozen", immutable_dict, {"a": 2}),
    (collections.OrderedDict(a=1), "plain", dict, {"a": 2}),
    (Point(1, 2), "same", Point, Point(2, 3)),
    (Point(1, 2), "frozen", Point, Point(2, 3)),
    (Point(1, 2), "plain", Point, Point(2, 3)),
    (Pair((1, 2)), "same", tuple, (2, 3)),
    (Pair((1, 2)), "frozen", tuple, (2, 3)),
    (Names([1]), "same", list, [2]),
    (Names([1]), "frozen", immutable_list, [2]),
    (slice(1, 2, None), "same", slice, slice(2, 3, None)),
    (slice(1, 2, None), "frozen", slice, slice(2, 3, None)),
    (slice(1, 2, None), "plain", slice, slice(2, 3, None)),
]


@pytest.mark.parametrize(("value", "mode", "kind", "expected"), MODES)
def test_each_builtin_container_is_rebuilt_in_the_form_its_mode_asks_for(
    value, mode, kind, expected
):
    mapped = tree_map(plus_one, value, mode=mode)
    assert type(mapped) is kind
    assert mapped == expected


@pytest.mark.parametrize(
    "leaf", [torch.Size([2, 3]), Text("t"), "abc", b"xy", range(3), 7, None, torch.float32]
)
def test_sizes_strings_bytes_ranges_and_scalars_are_leaves(leaf):
    assert container_type(type(leaf)) is None
    assert tree_leaves(leaf) == [leaf]
    assert tree_map(lambda v: "seen", leaf) == "seen"  # fn gets the whole value


def test_each_container_type_says_its_kind():
    kinds = {
        tuple: "tuple",
        Point: "namedtuple",
        list: "list",
        immutable_list: "list",
        dict: "dict",
        collections.OrderedDict: "dict",
        immutable_dict: "dict",
        slice: "slice",
        Span: "dataclass",
        Bag: "custom",
        Pair: "tuple",  # an unregistered subclass: its base's entry
    }
    assert {cls: container_type(cls).kind for cls in kinds} == kinds
    assert pytree.SEQUENCE_KINDS == {"tuple", "namedtuple", "list"}


def test_nesting_is_walked_to_the_leaves_in_order():
    tree = {"a": [1, (2, 3)], "b": slice(4, None), "c": Point(5, {"d": 6})}
    assert tree_leaves(tree) == [1, 2, 3, 4, None, None, 5, 6]
    mapped = tree_map(plus_one, tree, mode="frozen")
    assert mapped == {"a": [2, (3, 4)], "b": slice(5, None), "c": Point(6, {"d": 7})}
    assert type(mapped["a"]) is immutable_list and type(mapped["c"].y) is immutable_dict


def test_is_leaf_stops_the_walk_at_a_container():
    tree = ([1, 2], (3, 4))
    assert tree_leaves(tree, is_leaf=lambda v: type(v) is list) == [[1, 2], 3, 4]
    assert tree_map(len, tree, is_leaf=lambda v: type(v) is tuple and len(v) == 2) == 2
    assert tree_any(lambda v: v == [1, 2], tree, is_leaf=lambda v: type(v) is list)


def test_tree_any_stops_at_the_first_leaf_that_holds():
    seen = []

    def is_two(leaf: Any) -> bool:
        seen.append(leaf)
        return leaf == 2

    assert tree_any(is_two, [1, (2, 3), {"k": 4}])
    assert seen == [1, 2]
    assert not tree_any(is_two, [])


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode is one of 'same', 'frozen', 'plain'"):
        tree_map(plus_one, [1], mode="copy")  # type: ignore[arg-type]


# ------------------------------------------------------------ flatten / unflatten
def test_flatten_then_unflatten_gives_the_tree_back():
    tree = {"a": (1, [2, 3]), "b": Point(4, slice(5, None)), "c": collections.OrderedDict(d=6)}
    leaves, spec = tree_flatten(tree)
    assert leaves == [1, 2, 3, 4, 5, None, None, 6]
    rebuilt = tree_unflatten(leaves, spec)
    assert rebuilt == tree
    assert type(rebuilt["b"]) is Point and type(rebuilt["c"]) is collections.OrderedDict
    assert tree_unflatten([10, 20, 30, 40, 50, None, None, 60], spec)["a"] == (10, [20, 30])


def test_a_leaf_flattens_to_itself_with_the_leaf_spec():
    leaves, spec = tree_flatten(torch.Size([2]))
    assert leaves == [torch.Size([2])] and spec.is_leaf() and spec.num_leaves == 1
    assert tree_unflatten(["new"], spec) == "new"


def test_specs_are_equal_for_trees_of_the_same_shape_whatever_their_leaves():
    assert tree_flatten({"a": (1, 2)})[1] == tree_flatten({"a": ("x", None)})[1]
    assert hash(tree_flatten([1, 2])[1]) == hash(tree_flatten([3, 4])[1])
    assert tree_flatten({"a": 1})[1] != tree_flatten({"b": 1})[1]  # keys are the context
    assert tree_flatten((1, 2))[1] != tree_flatten([1, 2])[1]
    assert tree_flatten((1, 2))[1] != tree_flatten(Point(1, 2))[1]
    assert tree_flatten((1, 2))[1] != tree_flatten((1, (2,)))[1]


def test_a_spec_prints_its_containers_with_stars_for_leaves():
    assert (
        repr(tree_flatten({"a": (1, 2), "b": [3]})[1]) == "dict(tuple(*, *), list(*); ('a', 'b'))"
    )
    assert repr(tree_flatten(slice(1, 2))[1]) == "slice(*, *, *)"
    assert repr(tree_flatten(7)[1]) == "*"
    assert isinstance(tree_flatten(7)[1], TreeSpec)


def test_unflatten_refuses_the_wrong_number_of_leaves():
    _, spec = tree_flatten((1, [2, 3]))
    with pytest.raises(ValueError, match=r"tuple\(\*, list\(\*, \*\)\) has 3 leaves, 2 values"):
        tree_unflatten([1, 2], spec)


# ------------------------------------------------------------ registering types
def test_a_registered_class_is_walked_and_rebuilt_by_its_functions():
    bag = Bag([1, (2, 3)], tag="t")
    assert tree_leaves(bag) == [1, 2, 3]
    assert tree_map(plus_one, bag, mode="frozen") == Bag([2, (3, 4)], tag="t")
    leaves, spec = tree_flatten(bag)
    assert spec.context == "t" and spec.type is Bag
    assert tree_unflatten([7, 8, 9], spec) == Bag([7, (8, 9)], tag="t")


def test_a_registered_dataclass_has_its_init_fields_as_children():
    span = Span(1, [2])
    span.label = "kept out"
    assert tree_leaves(span) == [1, 2]
    leaves, spec = tree_flatten(span)
    assert spec.context == ("start", "stop")
    assert tree_map(plus_one, span) == Span(2, [3])


def test_register_dataclass_refuses_a_class_that_is_not_a_dataclass():
    with pytest.raises(TypeError, match="not a dataclass"):
        register_dataclass(Bag)


def test_a_type_is_registered_once():
    with pytest.raises(ValueError, match="Bag is already registered"):
        register_pytree_node(Bag, _bag_children, _bag_from)
    with pytest.raises(ValueError, match="list is already registered"):
        register_pytree_node(list, _bag_children, _bag_from)
    with pytest.raises(ValueError, match="Span is already registered"):
        register_dataclass(Span)


def test_leaf_types_cannot_be_registered():
    with pytest.raises(ValueError, match="Size is always a leaf"):
        register_pytree_node(torch.Size, _bag_children, _bag_from)
    with pytest.raises(ValueError, match="Text is always a leaf"):
        register_pytree_node(Text, _bag_children, _bag_from)


# ------------------------------------------------------------ as node arguments
def test_nodes_inside_a_registered_container_are_inputs_of_the_node():
    g = fx.Graph()
    x, y, z = g.placeholder("x"), g.placeholder("y"), g.placeholder("z")
    n = g.call_function(operator.add, (Span(x, [y, 1]), Bag([y])))
    assert n.all_input_nodes == [x, y]
    assert set(x.users) == {n} and set(y.users) == {n}
    assert n.args[0] == Span(x, [y, 1]) and type(n.args[0].stop) is immutable_list
    y.replace_all_uses_with(z)
    assert n.args == (Span(x, [z, 1]), Bag([z])) and not y.users and set(z.users) == {n}
    g.output(n)
    g.lint()


def test_leaves_of_a_registered_container_are_checked_like_any_argument():
    g = fx.Graph()
    with pytest.raises(TypeError, match="tensor of shape"):
        g.call_function(torch.neg, (Span(torch.ones(2), 1),))


def test_map_arg_and_map_aggregate_walk_registered_containers():
    g = fx.Graph()
    x = g.placeholder("x")
    assert fx.map_arg(Span(x, 2), lambda n: n.name) == Span("x", 2)
    assert fx.map_aggregate(Bag([1, 2]), lambda v: v * 10) == Bag([10, 20])


def test_registered_containers_print_with_their_nodes_in_the_text_form():
    g = fx.Graph()
    x = g.placeholder("x")
    n = g.call_function(operator.add, (Span(x, 1), Bag([x, 2])))
    assert "args = (Span(start=%x, stop=1), Bag(%x, 2))" in n.format_node()


def _span_sum(span: Span, bag: Bag) -> Any:
    return span.start * span.stop + bag.items[0]


def _graph_using_registered_containers() -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    relu = g.call_function(torch.relu, (x,))
    g.output(g.call_function(_span_sum, (Span(x, relu), Bag([relu]))))
    return fx.GraphModule(torch.nn.Module(), g)


def test_the_interpreter_builds_registered_containers_of_values():
    gm = _graph_using_registered_containers()
    t = torch.randn(4)
    assert torch.equal(fx.Interpreter(gm).run(t), t * t.relu() + t.relu())


def test_generated_code_builds_registered_containers_of_values():
    gm = _graph_using_registered_containers()
    t = torch.randn(4)
    assert "Span(start=x, stop=relu)" in gm.code
    assert torch.equal(gm(t), t * t.relu() + t.relu())


# ------------------------------------------------------------ properties
_LEAVES = st.one_of(st.integers(), st.text(max_size=3), st.none(), st.booleans())


def _containers(children: st.SearchStrategy) -> st.SearchStrategy:
    keys = st.text(max_size=2)
    return st.one_of(
        st.lists(children, max_size=3).map(tuple),
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(immutable_list),
        st.dictionaries(keys, children, max_size=3),
        st.dictionaries(keys, children, max_size=3).map(collections.OrderedDict),
        st.dictionaries(keys, children, max_size=3).map(immutable_dict),
        st.builds(Point, children, children),
        st.builds(slice, children, children, children),
        st.builds(Span, children, children),
        st.lists(children, max_size=3).map(Bag),
    )


TREES = st.recursive(_LEAVES, _containers, max_leaves=12)


def _same_types(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` have the same containers, type for type, all the way down."""
    if type(a) is not type(b):
        return False
    entry = container_type(type(a))
    if entry is None:
        return True
    children_a, children_b = entry.flatten(a)[0], entry.flatten(b)[0]
    return len(children_a) == len(children_b) and all(map(_same_types, children_a, children_b))


@settings(max_examples=200, deadline=None)
@given(TREES)
def test_unflatten_of_flatten_rebuilds_any_tree_type_for_type(tree):
    leaves, spec = tree_flatten(tree)
    rebuilt = tree_unflatten(leaves, spec)
    assert rebuilt == tree and _same_types(rebuilt, tree)
    assert leaves == tree_leaves(tree) and spec.num_leaves == len(leaves)
    assert tree_flatten(rebuilt)[1] == spec


@settings(max_examples=100, deadline=None)
@given(TREES)
def test_tree_map_in_same_mode_keeps_every_container_type(tree):
    mapped = tree_map(lambda leaf: leaf, tree)
    assert mapped == tree and _same_types(mapped, tree)


# ------------------------------------------------ torch's registry, library tables, None
class Reading:
    """Registered with torch's pytree only (as a library would): fxloom walks it too."""

    def __init__(self, value: Any, unit: str) -> None:
        self.value, self.unit = value, unit


torch_pytree.register_pytree_node(
    Reading, lambda r: ([r.value], r.unit), lambda children, unit: Reading(*children, unit)
)


def test_a_class_registered_with_torch_s_pytree_is_a_container_rebuilt_as_itself():
    leaves, spec = tree_flatten(Reading([1, 2], "mm"))
    assert leaves == [1, 2] and spec.type is Reading and spec.context == "mm"
    rebuilt = tree_map(lambda x: x * 10, Reading((3,), "s"))
    assert (type(rebuilt), rebuilt.value, rebuilt.unit) == (Reading, (30,), "s")


def test_fxloom_s_registration_takes_precedence_over_torch_s():
    class Both:
        def __init__(self, a: Any, b: Any) -> None:
            self.a, self.b = a, b

    torch_pytree.register_pytree_node(Both, lambda v: ([v.a, v.b], None), lambda c, _: Both(*c))
    try:
        register_pytree_node(Both, lambda v: ([v.b], v.a), lambda c, a: Both(a, *c))
        assert tree_leaves(Both(1, 2)) == [2]
    finally:
        torch_pytree._deregister_pytree_node(Both)


@pytest.mark.parametrize(
    "value, leaves",
    [
        (collections.deque([1, 2]), 1),  # torch walks deques; fxloom keeps them leaves
        (torch.Size([2, 3]), 1),
        (torch.return_types.max((torch.ones(1), torch.zeros(1))), 2),  # as a tuple
    ],
    ids=["deque", "Size", "return_types"],
)
def test_torch_s_own_registrations_keep_fxloom_s_rules(value, leaves):
    assert len(tree_leaves(value)) == leaves


def test_library_table_applies_to_a_class_by_its_qualified_name(monkeypatch):
    class Cache:  # stands for a library's class: the table names it, nothing registers it
        def __init__(self, items: list) -> None:
            self.items = items

    name = f"{Cache.__module__}.{Cache.__qualname__}"
    row = (lambda c: (c.items, None), lambda children, _: Cache(list(children)))
    monkeypatch.setitem(pytree.LIBRARY_CONTAINERS, name, row)
    try:
        assert tree_leaves(Cache([1, 2])) == [1, 2]
        assert pytree.registered_container(Cache) is container_type(Cache)
    finally:
        pytree._REGISTRY.pop(Cache, None)
        pytree._resolved.clear()


def test_none_is_a_container_of_nothing_when_asked():
    leaves, spec = tree_flatten({"x": 1, "mask": None}, none_is_leaf=False)
    assert leaves == [1] and spec.num_leaves == 1
    assert tree_unflatten([5], spec) == {"x": 5, "mask": None}
    assert pytree.tree_flatten_spec({"x": 7, "mask": None}, spec) == [7]
    with pytest.raises(ValueError, match=r"input\[1\] is Tensor, where the spec has None"):
        pytree.tree_flatten_spec({"x": 7, "mask": torch.ones(1)}, spec)
    assert tree_flatten({"mask": None})[0] == [None]  # a leaf by default


def test_a_spec_with_none_survives_pickling():
    import pickle

    _, spec = tree_flatten((1, None), none_is_leaf=False)
    assert pickle.loads(pickle.dumps(spec)) == spec and repr(spec) == "tuple(*, None)"


def test_a_spec_of_a_torch_registered_class_still_matches_after_torch_s_registry_changes():
    _, spec = tree_flatten(Reading(1, "mm"))

    class Other:
        pass

    torch_pytree.register_pytree_node(Other, lambda v: ([], None), lambda c, _: Other())
    try:  # a library registering its classes on import empties fxloom's cache of types
        assert pytree.tree_flatten_spec(Reading(2, "mm"), spec) == [2]
    finally:
        torch_pytree._deregister_pytree_node(Other)
