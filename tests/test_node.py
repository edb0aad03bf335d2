"""``Node``: the six opcodes, node fields, argument bookkeeping, purity and error messages."""

from __future__ import annotations

import operator

import pytest
import torch

import fxloom as fx
from fxloom.immutable_collections import immutable_dict, immutable_list


def build_add_relu() -> tuple[fx.Graph, fx.Node, fx.Node, fx.Node, fx.Node]:
    """``relu(x + 1)``: returns the graph and its four nodes."""
    g = fx.Graph()
    x = g.placeholder("x")
    add = g.call_function(operator.add, (x, 1))
    relu = g.call_function(torch.relu, (add,))
    out = g.output(relu)
    return g, x, add, relu, out


# ---------------------------------------------------------------- the six opcodes
def test_placeholder_node_targets_its_parameter_name_and_has_no_args():
    g = fx.Graph()
    x = g.placeholder("x")
    assert (x.op, x.target, x.args, dict(x.kwargs)) == ("placeholder", "x", (), {})


def test_placeholder_with_default_stores_it_as_the_only_arg():
    g = fx.Graph()
    y = g.placeholder("y", default_value=3)
    assert y.args == (3,)


def test_get_attr_node_targets_a_qualified_attribute_name():
    g = fx.Graph()
    w = g.get_attr("linear.weight")
    assert (w.op, w.target, w.args, dict(w.kwargs)) == ("get_attr", "linear.weight", (), {})


def test_call_function_node_targets_the_callable_itself():
    g = fx.Graph()
    x = g.placeholder("x")
    s = g.call_function(torch.sum, (x,), {"dim": -1})
    assert s.op == "call_function"
    assert s.target is torch.sum
    assert s.args == (x,)
    assert s.kwargs == {"dim": -1}


def test_call_method_node_has_self_as_first_arg():
    g = fx.Graph()
    x = g.placeholder("x")
    c = g.call_method("clamp", (x,), {"min": 0.0})
    assert (c.op, c.target, c.args, dict(c.kwargs)) == ("call_method", "clamp", (x,), {"min": 0.0})


def test_call_module_node_args_exclude_the_module():
    g = fx.Graph()
    x = g.placeholder("x")
    m = g.call_module("layer1.0", (x,))
    assert (m.op, m.target, m.args) == ("call_module", "layer1.0", (x,))


def test_output_node_holds_the_returned_value_as_its_only_arg():
    g = fx.Graph()
    x = g.placeholder("x")
    out = g.output((x, [x]))
    assert out.op == "output"
    assert out.target == "output"
    assert out.args == ((x, [x]),)


def test_call_method_target_must_be_a_string():
    g = fx.Graph()
    x = g.placeholder("x")
    with pytest.raises(TypeError, match="call_method"):
        g.create_node("call_method", torch.relu, (x,))


def test_call_function_target_must_be_callable():
    g = fx.Graph()
    with pytest.raises(TypeError, match="callable"):
        g.create_node("call_function", "relu", ())


# ------------------------------------------------------------------- node fields
def test_node_fields_name_op_target_type_and_meta():
    g = fx.Graph()
    x = g.placeholder("x", type_expr=torch.Tensor)
    assert x.name == "x"
    assert x.type is torch.Tensor
    assert x.meta == {} and isinstance(x.meta, dict)
    x.meta["val"] = 1
    assert x.meta["val"] == 1


def test_users_are_ordered_by_when_they_started_using_the_node():
    g = fx.Graph()
    x = g.placeholder("x")
    second = g.call_function(torch.tanh, (x,))
    first = g.call_function(torch.relu, (x,))
    assert list(x.users) == [second, first]
    with g.inserting_before(second):
        third = g.call_function(torch.neg, (x,))
    assert list(x.users) == [second, first, third]


def test_prev_and_next_link_nodes_with_the_root_sentinel_at_both_ends():
    g, x, add, relu, out = build_add_relu()
    assert x.next is add and add.next is relu and relu.next is out
    assert out.prev is relu and add.prev is x
    assert x.prev.op == "root" and out.next.op == "root"
    assert x.prev is out.next


def test_all_input_nodes_lists_distinct_inputs_args_then_kwargs():
    g = fx.Graph()
    a, b, c = g.placeholder("a"), g.placeholder("b"), g.placeholder("c")
    n = g.call_function(torch.where, (b, [a, b]), {"other": c, "again": a})
    assert n.all_input_nodes == [b, a, c]


def test_nodes_nested_in_containers_and_slices_are_inputs():
    g = fx.Graph()
    a, b, c = g.placeholder("a"), g.placeholder("b"), g.placeholder("c")
    n = g.call_function(operator.getitem, (a, (slice(b, None), {"k": [c]})))
    assert n.all_input_nodes == [a, b, c]
    assert set(b.users) == {n} and set(c.users) == {n}


# ------------------------------------------------------------ immutable arguments
def test_lists_and_dicts_in_args_are_frozen():
    g = fx.Graph()
    x = g.placeholder("x")
    n = g.call_function(torch.cat, ([x, x],), {"opts": {"a": [1, 2]}})
    assert type(n.args[0]) is immutable_list
    assert type(n.kwargs) is immutable_dict
    assert type(n.kwargs["opts"]) is immutable_dict
    assert type(n.kwargs["opts"]["a"]) is immutable_list
    assert n.args[0] == [x, x]


def test_mutating_an_args_list_in_place_raises_with_the_fix():
    g = fx.Graph()
    x = g.placeholder("x")
    n = g.call_function(torch.cat, ([x],))
    for mutate in (
        lambda: n.args[0].append(x),
        lambda: n.args[0].__setitem__(0, 1),
        lambda: n.args[0].extend([1]),
        lambda: n.args[0].pop(),
    ):
        with pytest.raises(TypeError, match=r"read-only.*node\.args = \.\.\."):
            mutate()
    assert n.args[0] == [x]


def test_mutating_kwargs_in_place_raises_with_the_fix():
    g = fx.Graph()
    x = g.placeholder("x")
    n = g.call_function(torch.sum, (x,), {"dim": 0})
    for mutate in (
        lambda: n.kwargs.__setitem__("dim", 1),
        lambda: n.kwargs.update(dim=1),
        lambda: n.kwargs.pop("dim"),
        lambda: n.kwargs.clear(),
    ):
        with pytest.raises(TypeError, match=r"read-only.*update_kwarg"):
            mutate()
    assert n.kwargs == {"dim": 0}


def test_args_given_as_a_list_become_a_tuple():
    g = fx.Graph()
    x = g.placeholder("x")
    n = g.call_function(torch.relu, [x])
    assert n.args == (x,) and type(n.args) is tuple


# ----------------------------------------------------------- users bookkeeping
def test_assigning_args_moves_the_node_between_users_of_old_and_new_inputs():
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    n = g.call_function(torch.relu, (a,))
    n.args = (b,)
    assert n not in a.users
    assert list(b.users) == [n]
    assert n.all_input_nodes == [b]


def test_assigning_kwargs_updates_users():
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    n = g.call_function(torch.add, (a,), {"other": a})
    n.kwargs = {"other": b}
    assert list(a.users) == [n]  # still used through args
    assert list(b.users) == [n]
    n.args = (b,)
    assert n not in a.users


def test_update_arg_replaces_one_positional_argument():
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    n = g.call_function(torch.add, (a, a))
    n.update_arg(1, b)
    assert n.args == (a, b)
    assert n in a.users and n in b.users


def test_update_kwarg_sets_one_keyword_argument():
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    n = g.call_function(torch.add, (a,), {"alpha": 2})
    n.update_kwarg("other", b)
    assert n.kwargs == {"alpha": 2, "other": b}
    assert n in b.users


def test_replace_input_with_swaps_every_occurrence_of_the_old_input():
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    n = g.call_function(torch.stack, ([a, a],), {"out_of": a})
    n.replace_input_with(a, b)
    assert n.args == ([b, b],)
    assert n.kwargs == {"out_of": b}
    assert not a.users and list(b.users) == [n]


def test_replace_all_uses_with_returns_the_changed_users():
    g, x, add, relu, out = build_add_relu()
    with g.inserting_after(x):
        neg = g.call_function(torch.neg, (x,))
    changed = x.replace_all_uses_with(neg, delete_user_cb=lambda user: user is not neg)
    assert changed == [add]
    assert add.args == (neg, 1)
    assert list(x.users) == [neg]
    g.lint()


def test_replace_all_uses_with_honours_the_filter_callback():
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    keep = g.call_function(torch.relu, (x,))
    move = g.call_function(torch.tanh, (x,))
    g.output((keep, move))
    changed = x.replace_all_uses_with(y, delete_user_cb=lambda user: user is move)
    assert changed == [move]
    assert keep.args == (x,) and move.args == (y,)


def test_replace_all_uses_with_propagate_meta_copies_missing_entries_only():
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    g.output(x)
    x.meta.update(val="from x", stack_trace="here")
    y.meta["val"] = "mine"
    x.replace_all_uses_with(y, propagate_meta=True)
    assert y.meta == {"val": "mine", "stack_trace": "here"}


def test_replace_all_uses_with_leaves_meta_alone_by_default():
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    g.output(x)
    x.meta["val"] = 1
    x.replace_all_uses_with(y)
    assert y.meta == {}


# ------------------------------------------------------------------- list moves
def test_prepend_moves_a_node_immediately_before_this_one():
    g, x, add, relu, out = build_add_relu()
    b = g.placeholder("b")  # created at the end, after the output
    x.prepend(b)
    assert [n.name for n in g.nodes] == ["b", "x", "add", "relu", "output"]
    assert len(g.nodes) == 5


def test_append_moves_a_node_immediately_after_this_one():
    g, x, add, relu, out = build_add_relu()
    other = g.placeholder("y")
    x.append(other)
    assert [n.name for n in g.nodes] == ["x", "y", "add", "relu", "output"]
    g.lint()


def test_prepend_and_append_of_the_node_itself_do_nothing():
    g, x, add, relu, out = build_add_relu()
    add.prepend(add)
    add.append(add)
    assert [n.name for n in g.nodes] == ["x", "add", "relu", "output"]


def test_prepend_refuses_a_node_of_another_graph():
    g, x, *_ = build_add_relu()
    other = fx.Graph().placeholder("z")
    with pytest.raises(ValueError, match="different graphs"):
        x.prepend(other)


def test_node_comparison_follows_graph_order_after_moves():
    g, x, add, relu, out = build_add_relu()
    y = g.placeholder("y")
    x.prepend(y)
    assert y < x < add < relu < out
    assert out > y


# ----------------------------------------------------------------- text form
def test_format_node_text_form():
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("linear.weight")
    add = g.call_function(operator.add, (x, w))
    c = g.call_method("clamp", (add,), {"min": 0.0, "max": 1.0})
    m = g.call_module("linear", (c,))
    out = g.output(m)
    assert x.format_node() == "%x : [num_users=1] = placeholder[target=x]"
    assert w.format_node() == "%linear_weight : [num_users=1] = get_attr[target=linear.weight]"
    assert add.format_node() == (
        "%add : [num_users=1] = call_function[target=operator.add]"
        "(args = (%x, %linear_weight), kwargs = {})"
    )
    assert c.format_node() == (
        "%clamp : [num_users=1] = call_method[target=clamp]"
        "(args = (%add,), kwargs = {min: 0.0, max: 1.0})"
    )
    assert m.format_node() == (
        "%linear : [num_users=1] = call_module[target=linear](args = (%clamp,), kwargs = {})"
    )
    assert out.format_node() == "return linear"


def test_format_node_counts_users_and_shows_the_type():
    g = fx.Graph()
    x = g.placeholder("x", type_expr=torch.Tensor)
    g.call_function(torch.relu, (x,))
    g.call_function(torch.relu, (x,))
    assert x.format_node() == "%x : torch.Tensor [num_users=2] = placeholder[target=x]"


def test_format_node_names_aten_operators_by_their_torch_ops_path():
    g = fx.Graph()
    x = g.placeholder("x")
    add = g.call_function(torch.ops.aten.add.Tensor, (x, x))
    mul = g.call_function(torch.ops.aten.mul, (add, 2))
    assert "call_function[target=torch.ops.aten.add.Tensor](args = (%x, %x)" in add.format_node()
    assert "call_function[target=torch.ops.aten.mul](args = (%add_tensor, 2)" in mul.format_node()


def test_format_node_shows_a_placeholder_default():
    g = fx.Graph()
    y = g.placeholder("y", default_value=3)
    assert y.format_node() == "%y : [num_users=0] = placeholder[target=y](default=3)"


def test_format_node_collects_placeholder_names_for_the_header():
    g = fx.Graph()
    x = g.placeholder("x")
    names: list[str] = []
    assert x.format_node(placeholder_names=names) is None
    assert names == ["x"]


def test_repr_of_a_node_is_its_name():
    g, x, add, *_ = build_add_relu()
    assert repr(add) == "add"


# ------------------------------------------------------------------ stack trace
def test_stack_trace_is_stored_in_meta():
    g, x, add, *_ = build_add_relu()
    assert add.stack_trace is None
    add.stack_trace = 'File "model.py", line 3, in forward'
    assert add.meta["stack_trace"] == 'File "model.py", line 3, in forward'
    add.meta["stack_trace"] = "elsewhere"
    assert add.stack_trace == "elsewhere"


# ---------------------------------------------------------------------- purity
@fx.has_side_effect
def _log_value(x):
    return x


class _Logger(torch.nn.Module):
    _is_impure = True

    def forward(self, x):
        return x


def _single_call(op, target, args=None, kwargs=None, root=None) -> fx.Node:
    g = fx.Graph(owning_module=root)
    x = g.placeholder("x")
    n = g.create_node(op, target, (x, *(args or ())), kwargs or {})
    g.output(x)
    return n


def test_placeholders_and_outputs_are_impure():
    g, x, add, relu, out = build_add_relu()
    assert x.is_impure() and out.is_impure()
    assert not add.is_impure() and not relu.is_impure()


@pytest.mark.parametrize(
    ("op", "target", "args", "kwargs"),
    [
        ("call_function", operator.setitem, (0, 1.0), {}),
        ("call_function", operator.iadd, (1,), {}),
        ("call_function", torch.relu_, (), {}),
        ("call_function", print, (), {}),
        ("call_method", "add_", (1,), {}),
        ("call_function", torch.add, (1,), {"out": None}),
        ("call_function", torch.nn.functional.relu, (), {"inplace": True}),
        ("call_function", _log_value, (), {}),
    ],
    ids=[
        "setitem",
        "iadd",
        "relu_",
        "print",
        "add_ method",
        "out=",
        "inplace=True",
        "has_side_effect",
    ],
)
def test_calls_with_side_effects_are_impure(op, target, args, kwargs):
    assert _single_call(op, target, args, kwargs).is_impure()


@pytest.mark.parametrize(
    ("op", "target", "kwargs"),
    [
        ("call_function", operator.add, {}),
        ("call_function", torch.nn.functional.relu, {"inplace": False}),
        ("call_method", "add", {}),
        ("call_method", "__add__", {}),
        ("call_method", "_private_", {}),
        # Named with a trailing "_" only because `and`, `or`, `not`, `is` are keywords.
        ("call_function", operator.and_, {}),
        ("call_function", operator.or_, {}),
        ("call_function", operator.not_, {}),
        ("call_function", operator.is_, {}),
    ],
    ids=["add", "inplace=False", "add method", "dunder", "private", "and_", "or_", "not_", "is_"],
)
def test_ordinary_calls_are_pure(op, target, kwargs):
    assert not _single_call(op, target, (), kwargs).is_impure()


@pytest.mark.parametrize(
    ("target", "args"),
    [(torch.ops.aten.add_.Tensor, (1,)), (torch.ops.aten.relu_.default, ())],
    ids=["add_.Tensor", "relu_.default"],
)
def test_mutating_aten_overloads_are_impure(target, args):
    assert _single_call("call_function", target, args).is_impure()


def test_pure_aten_overloads_are_pure():
    assert not _single_call("call_function", torch.ops.aten.add.Tensor, (1,)).is_impure()


def test_meta_is_impure_marks_a_node_impure():
    n = _single_call("call_function", operator.add, (1,))
    n.meta["is_impure"] = True
    assert n.is_impure()


def test_module_with_is_impure_attribute_makes_its_call_impure():
    root = torch.nn.Module()
    root.log = _Logger()
    root.lin = torch.nn.Linear(2, 2)
    assert _single_call("call_module", "log", root=root).is_impure()
    assert not _single_call("call_module", "lin", root=root).is_impure()


def test_has_side_effect_returns_the_function_unchanged():
    def f(x):
        return x

    assert fx.has_side_effect(f) is f


# ------------------------------------------------------------------ bad input
def test_unknown_opcode_is_a_value_error_listing_the_valid_ones():
    g = fx.Graph()
    with pytest.raises(ValueError) as info:
        g.create_node("call_fn", torch.relu, ())
    message = str(info.value)
    assert "'call_fn'" in message
    for op in ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output"):
        assert op in message


def test_setting_an_unknown_opcode_is_a_value_error():
    g, x, add, *_ = build_add_relu()
    with pytest.raises(ValueError, match="unknown opcode 'bogus'"):
        add.op = "bogus"
    assert add.op == "call_function"


def test_a_tensor_argument_is_a_type_error_naming_the_node_and_the_fix():
    g = fx.Graph()
    x = g.placeholder("x")
    with pytest.raises(TypeError, match=r"%add .*tensor of shape \(2,\).*get_attr"):
        g.call_function(torch.add, (x, torch.ones(2)))


def test_a_module_argument_is_a_type_error_naming_the_node_and_the_fix():
    g = fx.Graph()
    x = g.placeholder("x")
    with pytest.raises(TypeError, match=r"%apply .*module Linear.*call_module"):
        g.create_node(
            "call_function", torch.func.functional_call, (torch.nn.Linear(2, 2), x), name="apply"
        )


def test_assigning_a_tensor_argument_leaves_the_node_unchanged():
    g, x, add, *_ = build_add_relu()
    with pytest.raises(TypeError, match="%add"):
        add.args = (x, torch.zeros(3))
    assert add.args == (x, 1)
    assert list(x.users) == [add]


def test_a_node_from_another_graph_is_a_value_error_naming_both():
    g1, g2 = fx.Graph(), fx.Graph()
    x = g1.placeholder("x")
    y = g2.placeholder("y")
    with pytest.raises(
        ValueError, match=r"%neg uses %y, which belongs to another graph.*node_copy"
    ):
        g1.create_node("call_function", torch.neg, (y,), name="neg")
    n = g1.call_function(torch.neg, (x,))
    with pytest.raises(ValueError, match="another graph"):
        n.args = (y,)
    assert n.args == (x,)


def test_an_erased_node_cannot_be_used_as_an_argument():
    g, x, add, relu, out = build_add_relu()
    spare = g.call_function(torch.neg, (x,))
    g.erase_node(spare)
    with pytest.raises(ValueError, match="erased"):
        relu.args = (spare,)


def test_an_arbitrary_object_argument_is_a_type_error():
    g = fx.Graph()
    x = g.placeholder("x")
    with pytest.raises(TypeError, match="as an argument"):
        g.call_function(torch.add, (x, object()))


def test_functions_and_classes_are_allowed_as_arguments():
    g = fx.Graph()
    x = g.placeholder("x")
    n = g.call_function(map, (torch.relu, x))
    assert n.args == (torch.relu, x)


# ---------------------------------------------------------- map_arg/map_aggregate
def test_map_arg_applies_fn_to_nodes_only_and_keeps_structure():
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    value = (a, [1, b], {"k": (b, "s")}, slice(a, 3))
    mapped = fx.map_arg(value, lambda n: n.name.upper())
    assert mapped == ("A", [1, "B"], {"k": ("B", "s")}, slice("A", 3, None))
    assert type(mapped[1]) is immutable_list
    assert type(mapped[2]) is immutable_dict


def test_map_arg_without_nodes_returns_equal_values():
    assert fx.map_arg((1, [2, 3]), lambda n: n) == (1, [2, 3])


def test_map_arg_requires_a_callable():
    with pytest.raises(TypeError, match="callable"):
        fx.map_arg((1,), None)


def test_map_aggregate_applies_fn_to_every_leaf():
    assert fx.map_aggregate((1, [2, {"a": 3}]), lambda v: v * 10) == (10, [20, {"a": 30}])


def test_map_aggregate_keeps_named_tuples_and_torch_size():
    from collections import namedtuple

    Pair = namedtuple("Pair", "first second")
    mapped = fx.map_aggregate(Pair(1, 2), lambda v: v + 1)
    assert mapped == Pair(2, 3) and type(mapped) is Pair
    size = fx.map_aggregate(torch.Size([2, 3]), lambda v: v * 2)
    assert size == torch.Size([4, 6]) and type(size) is torch.Size
