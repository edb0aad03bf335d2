"""``split_module``: a traced module cut into ``submod_<id>`` submodules chosen by a callback."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
from torch.testing import assert_close

import fxloom
from fxloom import zoo
from fxloom.passes.split_module import ORDER_FREE_TARGETS, SplitError, split_module


# ------------------------------------------------------------------ helpers
class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def by_name(table: dict[str, object], default: object = 0):
    """A callback: the partition of a node by its name, ``default`` for the others."""
    return lambda node: table.get(node.name, default)


def snapshot(gm: fxloom.GraphModule) -> tuple[str, str, list]:
    """What must not change: the code, the graph text and every node's meta."""
    return gm.code, str(gm.graph), [dict(n.meta) for n in gm.graph.nodes]


def add_mul_sub(x):
    """Two independent branches, ``add`` and ``mul``, joined by ``sub``."""
    a = x + 1
    b = x * 2
    return a - b


def children(module: torch.nn.Module) -> list[str]:
    return [name for name, _ in module.named_children()]


def placeholders(gm: fxloom.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.find_nodes(op="placeholder")]


# ------------------------------------------------------------------- layout
def test_each_partition_becomes_a_submodule_called_in_order() -> None:
    net = TwoLayers()
    gm = fxloom.symbolic_trace(net)
    split = split_module(gm, net, by_name({"a": 0, "relu": 0}, default=1))
    assert children(split) == ["submod_0", "submod_1"]
    assert [n.target for n in split.graph.find_nodes(op="call_module")] == ["submod_0", "submod_1"]
    x = torch.randn(3, 4)
    assert torch.equal(split(x), gm(x))
    split.graph.lint()


def test_a_value_crossing_partitions_becomes_an_input_named_after_it() -> None:
    net = TwoLayers()
    split = split_module(fxloom.symbolic_trace(net), net, by_name({"b": 1}))
    assert placeholders(split.submod_0) == ["x"]
    assert placeholders(split.submod_1) == ["relu"]


def test_several_values_out_of_a_partition_are_unpacked_by_getitems_named_after_them() -> None:
    gm = fxloom.symbolic_trace(add_mul_sub)
    split = split_module(gm, None, by_name({"sub": 1}))
    getitems = split.graph.find_nodes(op="call_function", target=operator.getitem)
    assert [(n.name, n.args[1]) for n in getitems] == [("add", 0), ("mul", 1)]
    assert placeholders(split.submod_1) == ["add", "mul"]
    x = torch.randn(5)
    assert torch.equal(split(x), gm(x))


def test_a_value_used_by_several_partitions_is_returned_once() -> None:
    def f(x):
        shared = torch.relu(x)
        return shared + 1, shared * 2

    gm = fxloom.symbolic_trace(f)
    split = split_module(gm, None, by_name({"add": 1, "mul": 2}))
    assert split.submod_0.graph.find_nodes(op="output")[0].args == (
        split.submod_0.graph.find_nodes(op="call_function")[0],
    )
    assert placeholders(split.submod_1) == placeholders(split.submod_2) == ["relu"]
    x = torch.randn(4)
    assert_close(split(x), gm(x))


def test_the_graph_output_may_use_values_of_several_partitions() -> None:
    def f(x, y):
        return {"sum": x + y, "parts": (torch.relu(x), torch.tanh(y))}

    gm = fxloom.symbolic_trace(f)
    split = split_module(gm, None, by_name({"add": 0, "relu": 0, "tanh": 1}))
    x, y = torch.randn(3), torch.randn(3)
    assert_close(split(x, y), gm(x, y))
    assert "return {'sum': add, 'parts': (relu, submod_1)}" in split.code


def test_keyword_arguments_may_cross_partitions() -> None:
    def f(x):
        scale = x.abs() + 1
        return torch.div(x, other=scale, rounding_mode=None).softmax(dim=-1)

    gm = fxloom.symbolic_trace(f)
    split = split_module(gm, None, lambda n: 0 if n.name in ("abs_1", "add") else 1)
    div = next(n for n in split.submod_1.graph.nodes if n.name == "div")
    assert div.kwargs["other"].op == "placeholder"
    x = torch.randn(2, 3)
    assert torch.equal(split(x), gm(x))


def test_the_root_module_is_not_needed() -> None:
    net = TwoLayers()
    gm = fxloom.symbolic_trace(net)
    x = torch.randn(2, 4)
    assert torch.equal(split_module(gm, None, lambda n: n.name)(x), gm(x))


def test_a_module_with_no_calls_keeps_just_its_inputs_and_output() -> None:
    gm = fxloom.symbolic_trace(lambda x, y: (y, x))
    split = split_module(gm, None, lambda n: 0)
    assert children(split) == []
    assert split.code == gm.code


def test_results_match_torch_fx_split_module_on_its_documented_example() -> None:
    torch_fx = pytest.importorskip("torch.fx")
    from torch.fx.passes.split_module import split_module as torch_split_module

    class MyModule(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.param = torch.nn.Parameter(torch.rand(3, 4))
            self.linear = torch.nn.Linear(4, 5)

        def forward(self, x, y):
            z = self.linear(x + self.param).clamp(min=0.0, max=1.0)
            w = self.linear(y).clamp(min=0.0, max=1.0)
            return z + w

    def round_robin():
        counter = iter(range(100))
        return lambda node: next(counter) % 3

    module = MyModule()
    ours = split_module(fxloom.symbolic_trace(module), module, round_robin())
    theirs = torch_split_module(torch_fx.symbolic_trace(module), module, round_robin())
    assert children(ours) == sorted(n for n, _ in theirs.named_children())
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    assert torch.equal(ours(x, y), theirs(x, y))


# --------------------------------------------------------------- attributes
class Attributes(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("offset", torch.randn(4))
        self.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

    def forward(self, x):
        y = self.block(x * self.scale)
        return y * self.scale + self.offset


def test_an_attribute_is_read_by_each_partition_that_uses_it_sharing_the_tensor() -> None:
    module = Attributes()
    gm = fxloom.symbolic_trace(module)
    split = split_module(gm, module, lambda n: 0 if n.name in ("mul", "block_0") else 1)
    assert split.submod_0.scale is module.scale
    assert split.submod_1.scale is module.scale
    assert isinstance(split.submod_1.scale, torch.nn.Parameter)
    assert split.submod_1.offset is module.offset
    assert "scale" not in placeholders(split.submod_1)
    x = torch.randn(2, 4)
    assert torch.equal(split(x), gm(x))


def test_call_module_targets_are_flattened_and_listed_in_qualname_map() -> None:
    module = Attributes()
    qualname_map: dict[str, str] = {}
    split = split_module(fxloom.symbolic_trace(module), module, lambda n: 0, qualname_map)
    assert split.submod_0.block_0 is module.block[0]
    assert qualname_map == {
        "submod_0.scale": "scale",
        "submod_0.block_0": "block.0",
        "submod_0.block_1": "block.1",
        "submod_0.offset": "offset",
    }


def test_flattened_names_that_collide_are_made_unique() -> None:
    root = torch.nn.Module()
    root.a = torch.nn.Module()
    root.a.b_c = torch.nn.Linear(2, 2)
    root.a_b = torch.nn.Module()
    root.a_b.c = torch.nn.Linear(2, 2)
    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("a_b.c", (g.call_module("a.b_c", (x,)),)))
    gm = fxloom.GraphModule(root, g)
    qualname_map: dict[str, str] = {}
    split = split_module(gm, root, lambda n: 0, qualname_map)
    assert qualname_map == {"submod_0.a_b_c": "a.b_c", "submod_0.a_b_c_1": "a_b.c"}
    t = torch.randn(2)
    assert torch.equal(split(t), gm(t))


def test_inputs_and_attributes_returned_directly_stay_in_the_parent() -> None:
    module = Attributes()
    g = fxloom.Graph()
    x = g.placeholder("x")
    scale = g.get_attr("scale")
    g.output((x, scale, g.call_function(torch.neg, (x,))))
    gm = fxloom.GraphModule(module, g)
    split = split_module(gm, module, lambda n: 0)
    assert [n.op for n in split.graph.nodes] == ["placeholder", "call_module", "get_attr", "output"]
    assert split.scale is module.scale


def test_a_submodule_name_taken_by_an_attribute_of_the_parent_gets_a_suffix() -> None:
    root = torch.nn.Module()
    root.submod_0 = torch.nn.Parameter(torch.ones(2))
    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(torch.neg, (x,)), g.get_attr("submod_0")))
    gm = fxloom.GraphModule(root, g)
    split = split_module(gm, root, lambda n: 0)
    assert children(split) == ["submod_0_1"]
    assert split.submod_0 is root.submod_0
    t = torch.randn(2)
    assert_close(split(t), gm(t))


# --------------------------------------------------------------- names, meta
def test_nodes_copied_into_partitions_keep_their_names_and_meta() -> None:
    net = TwoLayers()
    gm = fxloom.symbolic_trace(net)
    for node in gm.graph.nodes:
        node.meta["tag"] = node.name
    split = split_module(gm, net, by_name({"b": 1}))
    for submodule in (split.submod_0, split.submod_1):
        for node in submodule.graph.nodes:
            if node.op != "output":
                assert node.meta["tag"] == node.name


def test_the_parent_node_carrying_a_value_is_named_after_it_and_gets_its_meta() -> None:
    def f(x):
        return x + 1, x * 2

    gm = fxloom.symbolic_trace(f)
    for node in gm.graph.nodes:
        node.meta["val"] = f"value of {node.name}"
    split = split_module(gm, None, lambda n: 0)
    carried = {n.name: n.meta["val"] for n in split.graph.find_nodes(op="call_function")}
    assert carried == {"add": "value of add", "mul": "value of mul"}
    assert split.graph.find_nodes(op="call_module")[0].meta == {}


def test_submodule_calls_are_named_after_the_submodules() -> None:
    net = TwoLayers()
    split = split_module(fxloom.symbolic_trace(net), net, lambda n: f"stage{n.name}")
    calls = split.graph.find_nodes(op="call_module")
    assert (
        [n.name for n in calls]
        == [n.target for n in calls]
        == [
            "submod_stagea",
            "submod_stagerelu",
            "submod_stageb",
        ]
    )


def test_partition_ids_that_are_not_identifiers_are_turned_into_names() -> None:
    net = TwoLayers()
    split = split_module(
        fxloom.symbolic_trace(net), net, lambda n: "layers.0" if n.name == "a" else (1, 2)
    )
    assert children(split) == ["submod_layers_0", "submod__1__2_"]


def test_the_result_keeps_the_training_mode_without_changing_the_original() -> None:
    net = TwoLayers().eval()
    split = split_module(fxloom.symbolic_trace(net), net, lambda n: 0)
    assert not split.training and not split.submod_0.training and not net.training
    net.a.train()
    split_module(fxloom.symbolic_trace(net), net, lambda n: 0)
    assert net.a.training and not net.b.training


# -------------------------------------------------------------------- order
def test_partitions_run_in_order_of_first_appearance_when_possible() -> None:
    def f(x):
        a = x + 1
        b = a * 2
        return b - 3

    split = split_module(
        fxloom.symbolic_trace(f), None, by_name({"add": "z", "mul": "a", "sub": "m"})
    )
    assert [n.target for n in split.graph.find_nodes(op="call_module")] == [
        "submod_z",
        "submod_a",
        "submod_m",
    ]


def test_partitions_run_in_dependency_order_when_first_appearance_is_impossible() -> None:
    # add starts partition 0, mul alone is partition 1, and sub (partition 0) needs mul
    gm = fxloom.symbolic_trace(add_mul_sub)
    split = split_module(gm, None, by_name({"mul": 1}))
    assert [n.target for n in split.graph.find_nodes(op="call_module")] == ["submod_1", "submod_0"]
    x = torch.randn(3)
    assert torch.equal(split(x), gm(x))


def test_keep_original_order_refuses_an_impossible_order() -> None:
    gm = fxloom.symbolic_trace(add_mul_sub)
    with pytest.raises(
        SplitError,
        match=r"partition 0 starts before partition 1.*%mul \(in partition 1\) is used by %sub",
    ):
        split_module(gm, None, by_name({"mul": 1}), keep_original_order=True)
    in_order = split_module(
        gm, None, by_name({"add": 0, "mul": 1, "sub": 2}), keep_original_order=True
    )
    assert children(in_order) == ["submod_0", "submod_1", "submod_2"]


def test_a_cycle_between_partitions_is_refused_naming_the_nodes() -> None:
    net = TwoLayers()
    gm = fxloom.symbolic_trace(net)
    before = snapshot(gm)
    qualname_map: dict[str, str] = {}
    with pytest.raises(SplitError) as caught:
        split_module(gm, net, by_name({"relu": 1}), qualname_map)
    message = str(caught.value)
    assert (
        "partition 0 -> partition 1: %a (in partition 0) is used by %relu (in partition 1)"
        in message
    )
    assert (
        "partition 1 -> partition 0: %relu (in partition 1) is used by %b (in partition 0)"
        in message
    )
    assert snapshot(gm) == before
    assert qualname_map == {}


# ------------------------------------------------------------- side effects
EVENTS: list[str] = []


@fxloom.has_side_effect
def record(tag: str, value=None):
    EVENTS.append(tag)
    return value


def effects_graph() -> fxloom.GraphModule:
    """x -> a = x + 1; record("first"); b = a * 2; record("second"); return b."""
    g = fxloom.Graph()
    x = g.placeholder("x")
    a = g.call_function(operator.add, (x, 1))
    g.call_function(record, ("first",))
    b = g.call_function(operator.mul, (a, 2))
    g.call_function(record, ("second",))
    g.output(b)
    return fxloom.GraphModule(torch.nn.Module(), g)


def test_impure_nodes_keep_their_relative_order() -> None:
    gm = effects_graph()
    # By first appearance partition 0 (add, record_1) would run before partition 1 (record).
    split = split_module(gm, None, by_name({"record": 1}))
    assert [n.target for n in split.graph.find_nodes(op="call_module")] == ["submod_1", "submod_0"]
    EVENTS.clear()
    split(torch.ones(1))
    assert EVENTS == ["first", "second"]


def test_impure_nodes_interleaved_across_partitions_are_refused() -> None:
    g = fxloom.Graph()
    for tag in ("first", "second", "third"):
        g.call_function(record, (tag,))
    g.output(None)
    gm = fxloom.GraphModule(torch.nn.Module(), g)
    with pytest.raises(
        SplitError,
        match=r"%record_1 \(in partition 1\) has side effects that must stay before %record_2",
    ):
        split_module(gm, None, by_name({"record_1": 1}))


def test_an_in_place_update_keeps_earlier_readers_before_it() -> None:
    def f(x):
        y = x * 2
        z = y + 1  # reads y before the update
        y.add_(1)
        return z, y

    gm = fxloom.symbolic_trace(f)
    x = torch.ones(2)
    assert_close(split_module(gm, None, by_name({"add": 1, "add_": 2}))(x), gm(x))
    with pytest.raises(SplitError, match="%add .* has side effects that must stay before %add_"):
        split_module(gm, None, by_name({"add": 1}))  # add_ with mul would overtake add


def test_an_in_place_update_of_a_returned_value_is_kept() -> None:
    def f(x):
        y = x * 2
        y.add_(1)
        return y

    gm = fxloom.symbolic_trace(f)
    split = split_module(gm, None, lambda n: n.name)
    assert split.submod_add_.code.strip().endswith("return ()")
    assert torch.equal(split(torch.ones(2)), torch.full((2,), 3.0))


def test_checks_inserted_by_tracing_and_export_may_move_freely() -> None:
    import fxloom.guards
    import fxloom.runtime_checks
    from fxloom.passes._ordering import is_ordered_effect
    from fxloom.values.symbolic.size_checks import check_sizes

    graph = fxloom.Graph()
    x = graph.placeholder("x")
    checks = [
        graph.call_function(fxloom.runtime_checks.check_tensor_input, (x, torch.float32, 1, "x")),
        graph.call_function(fxloom.runtime_checks.check_tensor, (x, (2,), torch.float32, "x")),
        graph.call_function(fxloom.guards.check_length, (x, 2, "here")),
        graph.call_function(check_sizes, ((x,), ("x",), (), ())),
        graph.call_function(torch._assert, (x, "message")),
    ]
    assert all(node.is_impure() and not is_ordered_effect(node) for node in checks)
    assert torch._assert in ORDER_FREE_TARGETS


def test_a_partition_whose_values_are_unused_is_still_called() -> None:
    gm = effects_graph()
    split = split_module(gm, None, lambda n: 1 if n.target is record else 0)
    assert split.submod_1.code.strip().endswith("return ()")
    EVENTS.clear()
    assert torch.equal(split(torch.ones(1)), gm(torch.ones(1)))
    assert EVENTS == ["first", "second"] * 2


# ---------------------------------------------------------------- bad input
def test_a_callback_that_raises_is_reported_with_the_node() -> None:
    net = TwoLayers()
    gm = fxloom.symbolic_trace(net)
    before = snapshot(gm)

    def callback(node):
        if node.name == "relu":
            raise KeyError("no stage for relu")
        return 0

    with pytest.raises(
        SplitError, match=r"split_callback raised KeyError for %relu .*no stage for relu"
    ) as caught:
        split_module(gm, net, callback)
    assert isinstance(caught.value.__cause__, KeyError)
    assert snapshot(gm) == before


def test_an_unhashable_partition_id_is_refused() -> None:
    net = TwoLayers()
    gm = fxloom.symbolic_trace(net)
    with pytest.raises(
        SplitError, match=r"returned \[0\] \(list\) for %a; a partition id must be hashable"
    ):
        split_module(gm, net, lambda n: [0])


def test_ids_that_make_the_same_submodule_name_are_refused() -> None:
    net = TwoLayers()
    gm = fxloom.symbolic_trace(net)
    with pytest.raises(
        SplitError, match=r"ids 0 and '0' \(for %relu\), which both make .*'submod_0'"
    ):
        split_module(gm, net, by_name({"a": 0, "relu": "0", "b": 0}))


def test_a_missing_attribute_is_reported_with_the_node() -> None:
    module = Attributes()
    gm = fxloom.symbolic_trace(module)
    del gm.scale
    with pytest.raises(
        SplitError, match=r"%scale \(get_attr\) refers to 'scale', which the module"
    ):
        split_module(gm, module, lambda n: 0)


def test_a_module_that_is_not_traced_is_refused() -> None:
    with pytest.raises(
        TypeError, match=r"split_module works on an fxloom.GraphModule, got TwoLayers"
    ):
        split_module(TwoLayers(), None, lambda n: 0)


def test_the_callback_sees_each_call_node_once_in_graph_order() -> None:
    module = Attributes()
    gm = fxloom.symbolic_trace(module)
    seen: list[str] = []
    split_module(gm, module, lambda n: seen.append(n.name) or 0)
    assert seen == [n.name for n in gm.graph.nodes if n.op.startswith("call_")]


def test_the_original_module_is_left_as_it_was() -> None:
    module = Attributes()
    gm = fxloom.symbolic_trace(module)
    before, state = snapshot(gm), copy.deepcopy(gm.state_dict())
    split = split_module(gm, module, lambda n: n.name)
    assert snapshot(gm) == before
    assert all(torch.equal(v, state[k]) for k, v in gm.state_dict().items())
    assert split.graph is not gm.graph


# -------------------------------------------------------------- real models
def contiguous_chunks(gm: fxloom.GraphModule, n: int):
    """A callback putting the call nodes into ``n`` runs of (nearly) equal length."""
    calls = [node for node in gm.graph.nodes if node.op.startswith("call_")]
    chunk_of = {node: i * n // len(calls) for i, node in enumerate(calls)}
    return chunk_of.__getitem__


def by_stage(prefix: str):
    """A callback: 0 before the first ``<prefix><i>`` submodule, i + 1 inside it, the last after."""
    state = {"stage": 0, "after": False}

    def callback(node):
        for path in node.meta.get("nn_module_stack", {}):
            if path.startswith(prefix):
                state["stage"] = int(path[len(prefix) :].split(".")[0]) + 1
                return state["stage"]
        if state["stage"]:
            return "tail"
        return 0

    return callback


@pytest.mark.parametrize("name", ["resnet_tiny", "transformer_tiny"])
@pytest.mark.parametrize("chunks", [1, 3, 8])
def test_zoo_models_split_in_contiguous_chunks_compute_the_same(name: str, chunks: int) -> None:
    model, inputs = zoo.build(name)
    gm = fxloom.symbolic_trace(model)
    split = split_module(gm, model, contiguous_chunks(gm, chunks))
    assert len(children(split)) == chunks
    split.graph.lint()
    with torch.no_grad():
        assert_close(split(*inputs), model(*inputs))


@pytest.mark.parametrize(
    ("name", "prefix", "stages"),
    [("resnet_tiny", "layers.", 3), ("transformer_tiny", "blocks.", 2)],
)
def test_zoo_models_split_by_module_path_compute_the_same(
    name: str, prefix: str, stages: int
) -> None:
    model, inputs = zoo.build(name)
    gm = fxloom.symbolic_trace(model)
    split = split_module(gm, model, by_stage(prefix))
    assert children(split) == [
        "submod_0",
        *(f"submod_{i + 1}" for i in range(stages)),
        "submod_tail",
    ]
    with torch.no_grad():
        assert_close(split(*inputs), model(*inputs))


@pytest.fixture(scope="module")
def bert(traced_hf):
    traced = traced_hf("bert")
    return traced.model, traced.inputs, traced.gm, traced.eager()


@pytest.mark.parametrize("how", ["chunks", "layers"])
def test_bert_split_computes_the_same(bert, how: str) -> None:
    model, inputs, gm, expected = bert
    callback = contiguous_chunks(gm, 5) if how == "chunks" else by_stage("encoder.layer.")
    qualname_map: dict[str, str] = {}
    split = split_module(gm, model, callback, qualname_map)
    assert "encoder.layer.0.attention.self.query" in qualname_map.values()
    split.graph.lint()
    with torch.no_grad():
        assert_close(split(**inputs), expected)


def test_run_time_checks_stay_in_the_parent_and_are_not_given_to_the_callback():
    gm = fxloom.symbolic_trace(torch.nn.Linear(4, 2), example_inputs=(torch.randn(3, 4),))
    asked: list[str] = []
    split = split_module(gm, None, lambda node: asked.append(node.name) or 0)
    checks = [n for n in split.graph.nodes if n.op == "call_function"]
    assert [n.target for n in checks] == [fxloom.runtime_checks.check_tensor_input]
    assert checks[0].name not in asked
    assert "check_tensor_input" not in split.submod_0.code
