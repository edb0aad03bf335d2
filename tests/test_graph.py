"""``Graph``: building, naming, iterating, inserting, erasing, copying, linting and printing."""

from __future__ import annotations

import copy
import io
import keyword
import operator
import pickle

import pytest
import torch

import fxloom as fx


def names(graph: fx.Graph) -> list[str]:
    return [n.name for n in graph.nodes]


def build_chain() -> fx.Graph:
    """``x -> add -> relu -> neg -> output``."""
    g = fx.Graph()
    x = g.placeholder("x")
    add = g.call_function(operator.add, (x, 1))
    relu = g.call_function(torch.relu, (add,))
    neg = g.call_function(torch.neg, (relu,))
    g.output(neg)
    return g


def node(graph: fx.Graph, name: str) -> fx.Node:
    return next(n for n in graph.nodes if n.name == name)


# ------------------------------------------------------------------- creation
def test_create_node_appends_at_the_end_by_default():
    g = build_chain()
    assert names(g) == ["x", "add", "relu", "neg", "output"]
    assert len(g.nodes) == 5


def test_create_node_with_every_opcode():
    g = fx.Graph()
    x = g.create_node("placeholder", "x")
    w = g.create_node("get_attr", "weight")
    m = g.create_node("call_function", torch.mul, (x, w))
    c = g.create_node("call_method", "sum", (m,), {"dim": 0})
    lin = g.create_node("call_module", "lin", (c,))
    out = g.create_node("output", "output", (lin,))
    assert [n.op for n in g.nodes] == [
        "placeholder",
        "get_attr",
        "call_function",
        "call_method",
        "call_module",
        "output",
    ]
    assert out.args == (lin,)


def test_create_node_records_the_type_expression():
    g = fx.Graph()
    x = g.create_node("placeholder", "x", type_expr=torch.Tensor)
    assert x.type is torch.Tensor


def test_placeholder_default_value_becomes_its_arg():
    g = fx.Graph()
    assert g.placeholder("a").args == ()
    assert g.placeholder("b", default_value=None).args == (None,)
    assert g.placeholder("c", default_value=(1, 2)).args == ((1, 2),)


def test_helpers_create_nodes_of_their_opcode():
    g = fx.Graph()
    x = g.placeholder("x")
    assert g.get_attr("lin.weight").op == "get_attr"
    assert g.call_function(torch.relu, (x,)).op == "call_function"
    assert g.call_method("relu", (x,)).op == "call_method"
    assert g.call_module("lin", (x,)).op == "call_module"
    assert g.output(x).op == "output"


def test_output_of_none_returns_none():
    g = fx.Graph()
    out = g.output(None)
    assert out.args == (None,)
    g.lint()


# --------------------------------------------------------------------- naming
def test_repeated_names_get_numeric_suffixes():
    g = fx.Graph()
    x = g.placeholder("x")
    adds = [g.call_function(operator.add, (x, i)) for i in range(3)]
    assert [a.name for a in adds] == ["add", "add_1", "add_2"]


def test_names_of_builtins_get_a_suffix():
    g = fx.Graph()
    assert g.placeholder("input").name == "input_1"
    x = g.placeholder("x")
    assert g.call_function(sum, (x,)).name == "sum_1"
    assert g.call_function(torch.sum, (x,)).name == "sum_2"
    assert g.call_function(getattr, (x, "shape")).name == "getattr_1"


def test_keywords_and_reserved_names_get_a_suffix():
    g = fx.Graph()
    assert g.placeholder("if").name == "if_1"
    assert g.placeholder("class").name == "class_1"
    assert g.placeholder("self").name == "self_1"
    assert g.placeholder("torch").name == "torch_1"


def test_invalid_characters_are_sanitised():
    g = fx.Graph()
    assert g.placeholder("my-var").name == "my_var"
    assert g.placeholder("9lives").name == "_9lives"
    assert g.placeholder("a b").name == "a_b"
    assert g.placeholder("x").name.isidentifier()


def test_module_targets_become_snake_case_names():
    g = fx.Graph()
    x = g.placeholder("x")
    assert g.call_module("layer1.0.Conv", (x,)).name == "layer1_0_conv"
    assert g.call_module("BatchNorm2d", (x,)).name == "batch_norm2d"
    assert g.get_attr("linear.weight").name == "linear_weight"


def test_explicit_names_are_kept_and_made_unique():
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.create_node("call_function", torch.relu, (x,), name="act")
    b = g.create_node("call_function", torch.relu, (x,), name="act")
    assert (a.name, b.name) == ("act", "act_1")


def test_a_name_that_already_carries_a_suffix_shares_its_base_counter():
    g = fx.Graph()
    x = g.placeholder("x")
    explicit = g.create_node("call_function", operator.add, (x, 1), name="add_1")
    first = g.call_function(operator.add, (x, 2))
    second = g.call_function(operator.add, (x, 3))
    assert (explicit.name, first.name, second.name) == ("add_1", "add", "add_2")


def test_renaming_a_node_keeps_names_unique():
    g = build_chain()
    node(g, "neg").name = "relu"
    assert names(g) == ["x", "add", "relu", "relu_1", "output"]


def test_all_names_are_unique_identifiers():
    g = fx.Graph()
    x = g.placeholder("x")
    for target in ["a.b", "A.B", "a_b", "a.B", "0", "0", "__init__", "if", "layers.0.Attn"]:
        g.call_module(target, (x,))
    got = names(g)
    assert len(got) == len(set(got))
    assert all(name.isidentifier() and not keyword.iskeyword(name) for name in got)


# ------------------------------------------------------------------ iteration
def test_iteration_survives_erasing_the_current_node():
    g = build_chain()
    visited = []
    for n in g.nodes:
        visited.append(n.name)
        if n.name == "relu":
            neg = node(g, "neg")
            n.replace_all_uses_with(node(g, "add"))
            g.erase_node(n)
            assert neg.args[0].name == "add"
    assert visited == ["x", "add", "relu", "neg", "output"]
    assert names(g) == ["x", "add", "neg", "output"]


def test_iteration_sees_nodes_inserted_after_the_current_node():
    g = build_chain()
    visited = []
    for n in g.nodes:
        visited.append(n.name)
        if n.name == "add":
            with g.inserting_after(n):
                g.call_function(torch.tanh, (n,))
    assert visited == ["x", "add", "tanh", "relu", "neg", "output"]


def test_iteration_does_not_revisit_nodes_inserted_before_the_current_node():
    g = build_chain()
    visited = []
    for n in g.nodes:
        visited.append(n.name)
        if n.op == "call_function":
            with g.inserting_before(n):
                g.call_function(torch.tanh, (node(g, "x"),))
    assert visited == ["x", "add", "relu", "neg", "output"]
    assert len(g.nodes) == 8


def test_reversed_nodes_walks_backwards():
    g = build_chain()
    assert [n.name for n in reversed(g.nodes)] == ["output", "neg", "relu", "add", "x"]


def test_reversed_iteration_survives_erasing_the_current_node():
    g = build_chain()
    out = node(g, "output")
    out.args = (node(g, "x"),)
    for n in reversed(g.nodes):
        if not n.users and not n.is_impure():
            g.erase_node(n)
    assert names(g) == ["x", "output"]


def test_len_counts_live_nodes():
    g = build_chain()
    assert len(g.nodes) == 5
    node(g, "output").args = (node(g, "relu"),)
    g.erase_node(node(g, "neg"))
    assert len(g.nodes) == 4


def test_membership_of_nodes():
    g = build_chain()
    neg = node(g, "neg")
    assert neg in g.nodes
    node(g, "output").args = (node(g, "relu"),)
    g.erase_node(neg)
    assert neg not in g.nodes
    assert fx.Graph().placeholder("x") not in g.nodes


# --------------------------------------------------------------- insert point
def test_inserting_before_as_context_manager_restores_the_insert_point():
    g = build_chain()
    relu = node(g, "relu")
    with g.inserting_before(relu):
        g.call_function(torch.tanh, (node(g, "add"),))
        g.call_function(torch.sigmoid, (node(g, "add"),))
    g.placeholder("late")
    assert names(g) == ["x", "add", "tanh", "sigmoid", "relu", "neg", "output", "late"]


def test_inserting_after_as_context_manager_restores_the_insert_point():
    g = build_chain()
    with g.inserting_after(node(g, "add")):
        g.call_function(torch.tanh, (node(g, "add"),))
    g.placeholder("late")
    assert names(g) == ["x", "add", "tanh", "relu", "neg", "output", "late"]


def test_inserting_after_keeps_creation_order_for_several_nodes():
    g = build_chain()
    add = node(g, "add")
    with g.inserting_after(add):
        first = g.call_function(torch.tanh, (add,))
        second = g.call_function(torch.sigmoid, (first,))
        g.call_function(torch.exp, (second,))
    assert names(g) == ["x", "add", "tanh", "sigmoid", "exp", "relu", "neg", "output"]
    g.lint()


def test_inserting_before_as_a_plain_call_sets_the_insert_point_permanently():
    g = build_chain()
    g.inserting_before(node(g, "relu"))
    g.call_function(torch.tanh, (node(g, "add"),))
    g.call_function(torch.exp, (node(g, "add"),))
    assert names(g) == ["x", "add", "tanh", "exp", "relu", "neg", "output"]


def test_inserting_after_as_a_plain_call_sets_the_insert_point_permanently():
    g = build_chain()
    g.inserting_after(node(g, "x"))
    g.placeholder("y")
    g.placeholder("z")
    assert names(g) == ["x", "y", "z", "add", "relu", "neg", "output"]


def test_nested_insert_points_restore_in_order():
    g = build_chain()
    with g.inserting_before(node(g, "neg")):
        with g.inserting_after(node(g, "x")):
            g.placeholder("y")
        g.call_function(torch.tanh, (node(g, "relu"),))
    g.placeholder("late")
    assert names(g) == ["x", "y", "add", "relu", "tanh", "neg", "output", "late"]


def test_inserting_before_none_inserts_at_the_start_in_creation_order():
    g = build_chain()
    with g.inserting_before(None):
        g.placeholder("a")
        g.placeholder("b")
    assert names(g)[:3] == ["a", "b", "x"]


def test_inserting_after_none_inserts_at_the_end():
    # As in torch.fx: ``inserting_after(None)`` is ``inserting_before(<root>)``, the end.
    g = build_chain()
    with g.inserting_before(node(g, "add")):
        with g.inserting_after(None):
            g.placeholder("last")
    assert names(g)[-1] == "last"


def test_inserting_near_a_node_of_another_graph_is_refused():
    g = build_chain()
    stranger = fx.Graph().placeholder("s")
    with pytest.raises(ValueError, match="another graph"):
        g.inserting_before(stranger)
    with pytest.raises(ValueError, match="another graph"):
        g.inserting_after(stranger)


def test_insert_point_survives_erasing_its_anchor():
    g = build_chain()
    add = node(g, "add")
    with g.inserting_after(add):
        tanh = g.call_function(torch.tanh, (add,))
        g.erase_node(tanh)  # the insert point was "after %tanh"
        g.call_function(torch.sin, (add,))
    with g.inserting_before(node(g, "neg")):
        spare = g.call_function(torch.exp, (add,))
    with g.inserting_before(spare):
        g.erase_node(spare)  # the insert point was "before %exp"
        g.call_function(torch.cos, (add,))
    assert names(g) == ["x", "add", "sin", "relu", "cos", "neg", "output"]
    g.lint()


# ------------------------------------------------------------------- erasing
def test_erase_node_removes_it_and_its_uses():
    g = build_chain()
    relu, neg = node(g, "relu"), node(g, "neg")
    node(g, "output").args = (relu,)
    g.erase_node(neg)
    assert names(g) == ["x", "add", "relu", "output"]
    assert neg not in relu.users
    g.lint()


def test_erase_node_refuses_a_node_with_users_and_names_them():
    g = build_chain()
    with pytest.raises(
        RuntimeError, match=r"cannot erase %relu.*1 user\(s\): %neg.*replace_all_uses_with"
    ):
        g.erase_node(node(g, "relu"))
    assert names(g) == ["x", "add", "relu", "neg", "output"]


def test_erase_node_message_lists_at_most_five_users():
    g = fx.Graph()
    x = g.placeholder("x")
    for _ in range(7):
        g.call_function(torch.relu, (x,))
    with pytest.raises(
        RuntimeError, match=r"7 user\(s\): %relu, %relu_1, %relu_2, %relu_3, %relu_4 and 2 more"
    ):
        g.erase_node(x)


def test_erase_node_of_another_graph_is_refused():
    g = build_chain()
    other = build_chain()
    with pytest.raises(ValueError, match="belongs to another graph"):
        g.erase_node(node(other, "output"))
    assert len(other.nodes) == 5


def test_erasing_twice_is_refused():
    g = build_chain()
    out = node(g, "output")
    g.erase_node(out)
    with pytest.raises(ValueError, match="already erased"):
        g.erase_node(out)


# --------------------------------------------------------------------- copies
def test_node_copy_transforms_args_and_copies_meta():
    src = build_chain()
    dst = fx.Graph()
    y = dst.placeholder("y")
    add = node(src, "add")
    add.meta["val"] = "v"
    copied = dst.node_copy(add, lambda n: y)
    assert copied.graph is dst
    assert (copied.op, copied.target, copied.args) == ("call_function", operator.add, (y, 1))
    assert copied.name == "add"
    assert copied.meta == {"val": "v"} and copied.meta is not add.meta
    assert list(y.users) == [copied]


def test_node_copy_keeps_the_type():
    src = fx.Graph()
    x = src.placeholder("x", type_expr=torch.Tensor)
    assert fx.Graph().node_copy(x).type is torch.Tensor


def test_graph_copy_copies_all_but_the_output_and_returns_the_output_value():
    src = build_chain()
    dst = fx.Graph()
    val_map: dict[fx.Node, fx.Node] = {}
    result = dst.graph_copy(src, val_map)
    assert names(dst) == ["x", "add", "relu", "neg"]
    assert result is val_map[node(src, "neg")]
    assert all(new.graph is dst for new in val_map.values())
    dst.output(result)
    dst.lint()


def test_graph_copy_preseeded_val_map_entries_override_copying():
    src = build_chain()
    dst = fx.Graph()
    z = dst.placeholder("z")
    doubled = dst.call_function(operator.mul, (z, 2))
    val_map = {node(src, "x"): doubled}
    result = dst.graph_copy(src, val_map)
    assert names(dst) == ["z", "mul", "add", "relu", "neg"]
    assert val_map[node(src, "add")].args == (doubled, 1)
    assert result.name == "neg"


def test_graph_copy_returns_structured_output_values():
    src = fx.Graph()
    a = src.placeholder("a")
    src.output({"out": [a, (a, 1)]})
    dst = fx.Graph()
    val_map: dict[fx.Node, fx.Node] = {}
    result = dst.graph_copy(src, val_map)
    new_a = val_map[a]
    assert result == {"out": [new_a, (new_a, 1)]}


def test_graph_copy_without_output_returns_none():
    src = fx.Graph()
    src.placeholder("a")
    assert fx.Graph().graph_copy(src, {}) is None


def test_graph_copy_return_output_node():
    src = build_chain()
    result = fx.Graph().graph_copy(src, {}, return_output_node=True)
    assert result is node(src, "output")


def test_deepcopy_of_a_graph_is_independent_and_equal_in_text():
    g = build_chain()
    node(g, "add").meta["val"] = [1, 2]
    g2 = copy.deepcopy(g)
    assert str(g2) == str(g)
    assert all(n.graph is g2 for n in g2.nodes)
    assert node(g2, "add").meta == {"val": [1, 2]}
    assert node(g2, "add").meta["val"] is not node(g, "add").meta["val"]
    node(g2, "output").args = (node(g2, "x"),)
    g2.eliminate_dead_code()
    assert len(g.nodes) == 5 and len(g2.nodes) == 2
    g2.lint()


def test_deepcopy_maps_nodes_mentioned_in_meta_to_their_copies():
    g = build_chain()
    relu = node(g, "relu")
    relu.meta["origin"] = {"from": [node(g, "add")], "pair": (node(g, "x"), 1)}
    g2 = copy.deepcopy(g)
    origin = node(g2, "relu").meta["origin"]
    assert origin["from"][0] is node(g2, "add")
    assert origin["pair"] == (node(g2, "x"), 1)


def test_a_lone_node_deep_copies_and_pickles_with_its_graph():
    # As in torch.fx (tests/test_extensibility.py compares): the graph comes along.
    g = build_chain()
    relu = node(g, "relu")
    for copied in (copy.deepcopy(relu), pickle.loads(pickle.dumps(relu))):
        assert copied.graph is not g and node(copied.graph, "relu") is copied


def test_pickle_maps_nodes_mentioned_in_meta_to_the_loaded_nodes():
    g = build_chain()
    node(g, "neg").meta["origin"] = [node(g, "relu"), {"k": (node(g, "x"),)}]
    g2 = pickle.loads(pickle.dumps(g))
    origin = node(g2, "neg").meta["origin"]
    assert origin[0] is node(g2, "relu")
    assert origin[1]["k"][0] is node(g2, "x")


def test_pickle_round_trip_of_a_graph():
    g = fx.Graph()
    x = g.placeholder("x", type_expr=torch.Tensor)
    y = g.placeholder("y", default_value=2)
    cat = g.call_function(torch.cat, ([x, x],), {"dim": 0})
    idx = g.call_function(operator.getitem, (cat, (slice(None, y), ...)))
    g.output({"a": idx, "b": (cat,)})
    idx.meta["note"] = "kept"
    g2 = pickle.loads(pickle.dumps(g))
    assert str(g2) == str(g)
    assert node(g2, "getitem").meta == {"note": "kept"}
    assert node(g2, "x").type is torch.Tensor
    g2.lint()


def test_pickle_round_trip_of_a_20000_node_chain_does_not_recurse():
    g = fx.Graph()
    value = g.placeholder("x")
    for _ in range(20_000):
        value = g.call_function(operator.add, (value, 1))
    g.output(value)
    g2 = pickle.loads(pickle.dumps(g))
    assert len(g2.nodes) == len(g.nodes) == 20_002
    assert [n.name for n in reversed(g2.nodes)][:2] == ["output", "add_19999"]
    g2.lint()


# ----------------------------------------------------------------------- lint
def test_lint_passes_on_a_well_formed_graph():
    build_chain().lint()


def test_lint_passes_with_a_root_holding_the_targets():
    root = torch.nn.Module()
    root.lin = torch.nn.Linear(2, 2)
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("lin.weight")
    g.output((g.call_module("lin", (x,)), w))
    g.lint(root)


def test_lint_reports_a_topological_order_violation_naming_the_nodes():
    g = build_chain()
    relu, neg = node(g, "relu"), node(g, "neg")
    relu.prepend(neg)  # the user now comes before its input
    with pytest.raises(fx.GraphLintError) as info:
        g.lint()
    message = str(info.value)
    assert "%neg uses %relu before it is defined" in message
    assert "topological order" in message
    assert "--> %neg" in message  # the graph is shown around the culprit


def test_lint_reports_a_dangling_reference_to_an_erased_node():
    g = build_chain()
    x, relu = node(g, "x"), node(g, "relu")
    spare = g.call_function(torch.tanh, (x,))
    g.erase_node(spare)
    # Only reachable by going behind the API's back, e.g. a buggy pass poking at internals.
    del node(g, "add").users[relu]
    relu._args = (spare,)
    relu._input_nodes = {spare: None}
    with pytest.raises(fx.GraphLintError, match="%relu uses %tanh, which was erased"):
        g.lint()


def test_lint_reports_a_reference_to_a_node_of_another_graph():
    g = build_chain()
    relu = node(g, "relu")
    stranger = fx.Graph().placeholder("stranger")
    del node(g, "add").users[relu]
    relu._args = (stranger,)
    relu._input_nodes = {stranger: None}
    with pytest.raises(
        fx.GraphLintError, match="%relu uses %stranger, which belongs to another graph"
    ):
        g.lint()


def test_lint_reports_users_out_of_sync_with_args():
    g = build_chain()
    relu, x = node(g, "relu"), node(g, "x")
    x.users[relu] = None  # relu does not actually use x
    with pytest.raises(fx.GraphLintError, match="%x.users lists %relu, which does not use it"):
        g.lint()


def test_lint_reports_a_missing_output():
    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(torch.relu, (x,))
    with pytest.raises(fx.GraphLintError, match=r"no output node.*graph\.output"):
        g.lint()


def test_lint_reports_a_node_after_the_output():
    g = build_chain()
    g.call_function(torch.tanh, (node(g, "x"),))
    with pytest.raises(fx.GraphLintError, match="%tanh comes after the output %output"):
        g.lint()


def test_lint_accepts_an_output_given_several_arguments_as_torch_fx_lint_does():
    # torch.fx's test_insert_arg: graph surgery inserts arguments into the output node.
    g = fx.Graph()
    x = g.placeholder("x")
    output = g.output(x)
    output.insert_arg(0, x)
    output.insert_arg(2, x)
    g.lint()
    assert output.args == (x, x, x)


@pytest.mark.parametrize(
    "op, args, kwargs",
    [
        ("placeholder", ("x",), {}),  # a default value that is a node
        ("get_attr", (), {"default": 1}),
        ("output", (1, 2), {}),
    ],
)
def test_saving_refuses_arguments_an_opcode_does_not_take_in_a_file(op, args, kwargs, tmp_path):
    g = fx.Graph()
    x = g.placeholder("x")
    args = tuple(x if a == "x" else a for a in args)
    root = torch.nn.Module()
    root.weight = torch.nn.Parameter(torch.ones(1))
    g.create_node(op, "weight" if op == "get_attr" else "y", args, kwargs, name="odd")
    if op != "output":
        g.output(x)
    g.lint()  # lint leaves these to saving, as torch.fx's lint does
    with pytest.raises(fx.serialize.SerializationError, match=f"%odd.*a {op} node takes at most"):
        fx.save(fx.GraphModule(root, g), tmp_path / "odd")


def test_lint_reports_a_get_attr_target_missing_from_the_root_and_suggests_close_names():
    root = torch.nn.Module()
    root.linear = torch.nn.Linear(2, 2)
    g = fx.Graph()
    w = g.get_attr("linear.wieght")
    g.output(w)
    with pytest.raises(fx.GraphLintError) as info:
        g.lint(root)
    message = str(info.value)
    assert "%linear_wieght (get_attr) targets 'linear.wieght'" in message
    assert "did you mean 'weight'" in message


def test_lint_reports_a_call_module_target_missing_from_the_root():
    root = torch.nn.Module()
    root.encoder = torch.nn.Linear(2, 2)
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("encodr", (x,)))
    with pytest.raises(fx.GraphLintError, match=r"%encodr \(call_module\).*did you mean 'encoder'"):
        g.lint(root)


def test_lint_reports_call_module_of_something_that_is_not_a_module():
    root = torch.nn.Module()
    root.lin = torch.nn.Linear(2, 2)
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("lin.weight", (x,)))
    with pytest.raises(
        fx.GraphLintError, match="calls 'lin.weight' as a module, but it is a Parameter"
    ):
        g.lint(root)


def test_lint_uses_the_owning_module_as_root():
    root = torch.nn.Module()
    g = fx.Graph(owning_module=root)
    g.output(g.get_attr("missing"))
    with pytest.raises(fx.GraphLintError, match="'missing'"):
        g.lint()


# -------------------------------------------------------- dead code elimination
def test_eliminate_dead_code_removes_an_unused_chain_in_one_call():
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    b = g.call_function(torch.tanh, (a,))
    g.call_function(torch.neg, (b,))
    g.output(x)
    assert g.eliminate_dead_code() is True
    assert names(g) == ["x", "output"]
    g.lint()


def test_eliminate_dead_code_reports_no_change():
    g = build_chain()
    assert g.eliminate_dead_code() is False
    assert len(g.nodes) == 5


def test_eliminate_dead_code_keeps_unused_placeholders_and_the_output():
    g = fx.Graph()
    g.placeholder("unused")
    g.output(None)
    assert g.eliminate_dead_code() is False
    assert names(g) == ["unused", "output"]


@fx.has_side_effect
def _record(x):
    return x


def test_eliminate_dead_code_keeps_impure_nodes():
    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(operator.setitem, (x, 0, 1.0))
    g.call_method("add_", (x, 1))
    g.call_function(print, (x,))
    g.call_function(_record, (x,))
    g.call_function(torch.relu, (x,))  # the only pure one
    g.output(x)
    assert g.eliminate_dead_code() is True
    assert names(g) == ["x", "setitem", "add_", "print_1", "_record", "output"]


def test_eliminate_dead_code_keeps_the_inputs_of_impure_nodes():
    g = fx.Graph()
    x = g.placeholder("x")
    r = g.call_function(torch.relu, (x,))
    g.call_function(print, (r,))
    g.output(None)
    g.eliminate_dead_code()
    assert names(g) == ["x", "relu", "print_1", "output"]


def test_eliminate_dead_code_accepts_a_custom_impurity_test():
    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(torch.relu, (x,))
    g.call_function(print, (x,))
    g.output(None)
    g.eliminate_dead_code(
        is_impure_node=lambda n: n.op in ("placeholder", "output") or n.name == "relu"
    )
    assert names(g) == ["x", "relu", "output"]


# ----------------------------------------------------------------- find_nodes
def test_find_nodes_by_op_returns_nodes_in_graph_order():
    g = build_chain()
    assert [n.name for n in g.find_nodes(op="call_function")] == ["add", "relu", "neg"]
    assert [n.name for n in g.find_nodes(op="placeholder")] == ["x"]
    assert g.find_nodes(op="get_attr") == []


def test_find_nodes_by_op_and_target():
    g = build_chain()
    assert g.find_nodes(op="call_function", target=torch.relu) == [node(g, "relu")]
    assert g.find_nodes(op="call_function", target=torch.tanh) == []
    assert g.find_nodes(op="call_method", target="relu") == []


def test_find_nodes_keeps_graph_order_after_inserting_in_the_middle():
    g = build_chain()
    x = node(g, "x")
    late = g.call_function(torch.relu, (x,))
    with g.inserting_before(node(g, "add")):
        early = g.call_function(torch.relu, (x,))
    relus = g.find_nodes(op="call_function", target=torch.relu)
    assert relus == [early, node(g, "relu"), late]
    assert [n.name for n in g.find_nodes(op="call_function")] == [
        n.name for n in g.nodes if n.op == "call_function"
    ]


def test_find_nodes_keeps_graph_order_after_moving_a_node_to_the_end():
    g = fx.Graph()
    x = g.placeholder("x")
    first = g.call_function(torch.relu, (x,))
    second = g.call_function(torch.relu, (x,))
    second.append(first)  # graph order is now: x, second, first
    assert g.find_nodes(op="call_function", target=torch.relu) == [second, first]


def test_find_nodes_without_sort_returns_every_match():
    g = build_chain()
    with g.inserting_before(node(g, "add")):
        g.call_function(torch.relu, (node(g, "x"),))
    found = g.find_nodes(op="call_function", target=torch.relu, sort=False)
    assert sorted(n.name for n in found) == ["relu", "relu_1"]


def test_find_nodes_rejects_an_unknown_op():
    with pytest.raises(ValueError, match=r"unknown opcode 'call'.*call_function"):
        build_chain().find_nodes(op="call")


def test_find_nodes_forgets_erased_nodes():
    g = build_chain()
    neg = node(g, "neg")
    node(g, "output").args = (node(g, "relu"),)
    g.erase_node(neg)
    assert g.find_nodes(op="call_function", target=torch.neg) == []


def test_find_nodes_reflects_target_changes():
    g = build_chain()
    relu = node(g, "relu")
    relu.target = torch.tanh
    assert g.find_nodes(op="call_function", target=torch.relu) == []
    assert g.find_nodes(op="call_function", target=torch.tanh) == [relu]


def test_find_nodes_reflects_op_changes():
    g = build_chain()
    relu = node(g, "relu")
    relu.op = "call_method"
    relu.target = "relu"
    assert g.find_nodes(op="call_method", target="relu") == [relu]
    assert relu not in g.find_nodes(op="call_function")


def test_find_nodes_keeps_graph_order_after_a_target_change():
    g = fx.Graph()
    x = g.placeholder("x")
    first = g.call_function(torch.relu, (x,))
    second = g.call_function(torch.relu, (x,))
    first.target = torch.tanh
    first.target = torch.relu
    assert g.find_nodes(op="call_function", target=torch.relu) == [first, second]


# ------------------------------------------------------------------- printing
def test_print_graph_text_form():
    g = fx.Graph()
    x = g.placeholder("x")
    add = g.call_function(operator.add, (x, 1))
    relu = g.call_function(torch.relu, (add,))
    g.output(relu)
    assert str(g) == (
        "graph():\n"
        "    %x : [num_users=1] = placeholder[target=x]\n"
        "    %add : [num_users=1] = call_function[target=operator.add](args = (%x, 1), kwargs = {})\n"
        "    %relu : [num_users=1] = call_function[target=torch.relu](args = (%add,), kwargs = {})\n"
        "    return relu"
    )


def test_print_graph_of_the_documented_topk_example():
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("linear.weight")
    add = g.call_function(operator.add, (x, w))
    lin = g.call_module("linear", (add,))
    relu = g.call_method("relu", (lin,))
    s = g.call_function(torch.sum, (relu,), {"dim": -1})
    g.output(g.call_function(torch.topk, (s, 3)))
    assert str(g).splitlines()[1:] == [
        "    %x : [num_users=1] = placeholder[target=x]",
        "    %linear_weight : [num_users=1] = get_attr[target=linear.weight]",
        "    %add : [num_users=1] = call_function[target=operator.add](args = (%x, %linear_weight), kwargs = {})",
        "    %linear : [num_users=1] = call_module[target=linear](args = (%add,), kwargs = {})",
        "    %relu : [num_users=1] = call_method[target=relu](args = (%linear,), kwargs = {})",
        "    %sum_1 : [num_users=1] = call_function[target=torch.sum](args = (%relu,), kwargs = {dim: -1})",
        "    %topk : [num_users=1] = call_function[target=torch.topk](args = (%sum_1, 3), kwargs = {})",
        "    return topk",
    ]


def test_repr_of_a_graph_is_short():
    assert repr(build_chain()) == "<fxloom.Graph with 5 nodes>"


def test_print_tabular_writes_a_table_of_the_nodes():
    buffer = io.StringIO()
    build_chain().print_tabular(file=buffer)
    table = buffer.getvalue()
    for header in ("opcode", "name", "target", "args", "kwargs"):
        assert header in table
    for cell in (
        "placeholder",
        "call_function",
        "operator.add",
        "torch.relu",
        "(%x, 1)",
        "%neg",
        "output",
    ):
        assert cell in table
