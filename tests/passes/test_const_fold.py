"""Constant folding (``fxloom.passes.const_fold``): what depends on no input is computed once."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import fxloom
from fxloom import zoo
from fxloom.passes import const_fold as const_fold_module
from fxloom.passes.const_fold import const_fold
from fxloom.passes.dce import eliminate_dead_code


def code_lines(gm: fxloom.GraphModule) -> list[str]:
    return [line.strip() for line in gm.code.strip().splitlines()[1:]]


class Transposed(nn.Module):
    """``x @ weight.t()``: the transpose depends on a parameter only."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        return x @ self.weight.t()


class Positions(nn.Module):
    """``x * (arange(n) * scale)``: a factory call and a buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        return x * (torch.arange(4) * self.scale)


# ------------------------------------------------------------------ folding
def test_a_transposed_parameter_becomes_a_buffer_read_by_get_attr():
    model = Transposed().eval()
    gm = const_fold(fxloom.symbolic_trace(model))
    assert code_lines(gm) == [
        "_folded_t = self._folded_t",
        "matmul = x @ _folded_t;  x = _folded_t = None",
        "return matmul",
    ]
    assert_close(gm._folded_t, model.weight.t())
    assert not gm._folded_t.requires_grad
    x = torch.randn(2, 4)
    assert_close(gm(x), model(x))


def test_a_factory_call_and_a_buffer_fold_into_one_buffer():
    model = Positions()
    gm = const_fold(fxloom.symbolic_trace(model))
    assert len(gm.graph.find_nodes(op="get_attr")) == 1
    assert gm.graph.find_nodes(op="call_function", target=torch.arange) == []
    assert_close(gm._folded_mul, torch.tensor([0.0, 0.5, 1.0, 1.5]))
    x = torch.randn(4)
    assert_close(gm(x), model(x))


def test_returns_the_module_it_edited_in_place():
    gm = fxloom.symbolic_trace(Positions())
    assert const_fold(gm) is gm


def test_folded_buffers_are_saved_in_the_state_dict():
    gm = const_fold(fxloom.symbolic_trace(Positions()))
    assert "_folded_mul" in gm.state_dict()


def test_a_literal_result_is_written_into_its_users():
    class Reshape(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(2, 3))

        def forward(self, x):
            return x.view(self.weight.shape)

    gm = const_fold(fxloom.symbolic_trace(Reshape().eval()))
    assert code_lines(gm) == [
        "view = x.view(torch.Size([2, 3]));  x = None",
        "return view",
    ]


def test_a_constant_the_graph_returns_is_folded_too():
    model = Transposed().eval()
    gm = fxloom.symbolic_trace(lambda x: (x, model.weight.t() * 2))
    gm = const_fold(fxloom.GraphModule(model, gm.graph))
    assert gm.graph.find_nodes(op="call_method") == []
    assert_close(gm(torch.ones(1))[1], model.weight.t() * 2)


def test_a_tuple_of_tensors_is_not_an_attribute_so_it_stays_computed():
    class Chunks(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.arange(4.0))

        def forward(self, x):
            return torch.cat(self.table.chunk(2) + (x,))

    model = Chunks()
    gm = const_fold(fxloom.symbolic_trace(model))
    assert len(gm.graph.find_nodes(op="call_method", target="chunk")) == 1
    assert_close(gm(torch.ones(1)), model(torch.ones(1)))


def test_only_the_parts_of_a_tuple_that_are_used_become_buffers():
    class Halves(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.arange(4.0))

        def forward(self, x):
            return x + self.table.chunk(2)[0]  # (unpacking would add a guard reading all)

    gm = const_fold(fxloom.symbolic_trace(Halves()))
    assert gm.graph.find_nodes(op="call_method", target="chunk") == []
    assert_close(gm(torch.zeros(2)), torch.tensor([0.0, 1.0]))


def test_a_view_of_part_of_a_big_intermediate_is_copied_to_free_the_rest():
    class Corner(nn.Module):
        def forward(self, x):
            return x + torch.ones(100, 100)[:2, :2]

    gm = const_fold(fxloom.symbolic_trace(Corner()))
    (buffer,) = [value for name, value in gm.named_buffers() if name.startswith("_folded")]
    assert buffer.untyped_storage().nbytes() == 4 * buffer.element_size()


def test_constants_nothing_uses_are_left_for_dead_code_elimination():
    def f(x):
        torch.arange(3) * 2
        return x

    gm = fxloom.symbolic_trace(f)
    const_fold(gm)
    assert len(gm.graph.find_nodes(op="call_function", target=torch.arange)) == 1
    assert not [name for name, _ in gm.named_buffers()]


# ------------------------------------------------------------------ not folded
def test_calls_reading_no_value_fold_only_if_they_are_known_factories():
    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.add, (x, g.call_function(torch.is_grad_enabled))))
    gm = const_fold(fxloom.GraphModule(nn.Module(), g))
    assert len(gm.graph.find_nodes(op="call_function", target=torch.is_grad_enabled)) == 1


def table() -> torch.Tensor:
    return torch.ones(2)


def test_the_factory_table_can_be_extended(monkeypatch):
    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.add, (x, g.call_function(table))))
    gm = const_fold(fxloom.GraphModule(nn.Module(), g))
    assert len(gm.graph.find_nodes(op="call_function", target=table)) == 1
    monkeypatch.setattr(const_fold_module, "FACTORY_FUNCTIONS", {table})
    const_fold(gm)
    assert gm.graph.find_nodes(op="call_function", target=table) == []
    assert_close(gm(torch.zeros(2)), torch.ones(2))


def test_a_factory_making_a_new_leaf_for_autograd_is_not_folded():
    g = fxloom.Graph()
    x = g.placeholder("x")
    ones = g.call_function(torch.ones, (2,), {"requires_grad": True})
    g.output(g.call_function(operator.mul, (x, ones)))
    gm = const_fold(fxloom.GraphModule(nn.Module(), g))
    assert len(gm.graph.find_nodes(op="call_function", target=torch.ones)) == 1


def test_random_calls_are_not_folded():
    gm = const_fold(fxloom.symbolic_trace(lambda x: x + torch.rand(3) * 2))
    assert len(gm.graph.find_nodes(op="call_function", target=torch.rand)) == 1


def test_values_computed_from_inputs_are_not_folded():
    gm = fxloom.symbolic_trace(Transposed().eval())
    before = len(gm.graph.nodes)
    const_fold(gm)
    assert len(gm.graph.nodes) == before - 1  # only get_attr + t became one get_attr


def test_a_buffer_the_graph_writes_to_is_not_folded():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            self.count.add_(1)
            return x + self.count * 2

    model = Counter()
    gm = const_fold(fxloom.symbolic_trace(model))
    assert gm.graph.find_nodes(op="call_function", target=operator.mul)
    assert_close(gm(torch.zeros(1)), torch.full((1,), 2.0))
    assert_close(gm(torch.zeros(1)), torch.full((1,), 4.0))


def test_a_constant_written_to_later_is_not_folded():
    def f(x):
        acc = torch.zeros(2)
        acc.add_(x)
        return acc

    gm = const_fold(fxloom.symbolic_trace(f))
    assert_close(gm(torch.ones(2)), torch.ones(2))
    assert_close(gm(torch.ones(2)), torch.ones(2))  # not accumulating into a shared buffer


# ------------------------------------------------------------------ parameters
def test_parameters_are_folded_through_in_eval_mode_only_by_default():
    training = const_fold(fxloom.symbolic_trace(Transposed().train()))
    assert training.graph.find_nodes(op="call_method", target="t")
    evaluating = const_fold(fxloom.symbolic_trace(Transposed().eval()))
    assert evaluating.graph.find_nodes(op="call_method", target="t") == []


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_fold_parameters_overrides_the_mode(mode):
    model = getattr(Transposed(), mode)()
    folded = const_fold(fxloom.symbolic_trace(model), fold_parameters=True)
    assert folded.graph.find_nodes(op="call_method", target="t") == []
    kept = const_fold(fxloom.symbolic_trace(model), fold_parameters=False)
    assert kept.graph.find_nodes(op="call_method", target="t")


def test_parameters_that_need_no_grad_are_folded_even_in_training():
    model = Transposed().train().requires_grad_(False)
    gm = const_fold(fxloom.symbolic_trace(model))
    assert gm.graph.find_nodes(op="call_method", target="t") == []


# ------------------------------------------------------------------ meta and names
def test_the_new_get_attr_takes_the_replaced_nodes_meta_and_type():
    gm = fxloom.symbolic_trace(Transposed().eval())
    t = gm.graph.find_nodes(op="call_method", target="t")[0]
    t.meta["tensor_meta"] = "shape of t"
    t.type = torch.Tensor
    const_fold(gm)
    (reader,) = gm.graph.find_nodes(op="get_attr")
    assert reader.meta["tensor_meta"] == "shape of t"
    assert reader.meta["nn_module_stack"] == t.meta["nn_module_stack"]
    assert reader.type is torch.Tensor


def test_other_nodes_keep_their_names_and_meta():
    gm = fxloom.symbolic_trace(Transposed().eval())
    matmul = gm.graph.find_nodes(op="call_function", target=operator.matmul)[0]
    matmul.meta["tensor_meta"] = "kept"
    const_fold(gm)
    assert matmul in gm.graph.nodes and matmul.name == "matmul"
    assert matmul.meta["tensor_meta"] == "kept"


def test_buffer_names_avoid_existing_attributes():
    gm = fxloom.symbolic_trace(Transposed().eval())
    gm.register_buffer("_folded_t", torch.zeros(1))
    const_fold(gm)
    assert gm.graph.find_nodes(op="get_attr")[0].target == "_folded_t_1"


# ------------------------------------------------------------------ real models
@pytest.mark.parametrize("name", ["mlp_tiny", "resnet_tiny", "transformer_tiny"])
def test_zoo_models_compute_what_eager_does(name):
    model, inputs = zoo.build(name)
    gm = const_fold(fxloom.symbolic_trace(model))
    gm.graph.lint()
    with torch.no_grad():
        assert_close(gm(*inputs), model(*inputs))


def test_falcon_folds_its_transposed_weights_and_matches_eager(traced_hf):
    falcon = traced_hf("falcon")
    gm = falcon.gm
    before = len(gm.graph.nodes)
    const_fold(gm)
    eliminate_dead_code(gm)
    gm.graph.lint()
    assert len(gm.graph.nodes) < before
    assert any(name.startswith("_folded") for name, _ in gm.named_buffers())
    with torch.no_grad():
        assert_close(gm(**falcon.inputs)[0], falcon.eager()[0])


# ------------------------------------------------------------------ bad input
def test_refuses_what_is_not_a_graph_module():
    with pytest.raises(TypeError, match="const_fold works on an fxloom.GraphModule"):
        const_fold(Transposed())


def test_a_constant_that_fails_to_evaluate_leaves_the_module_unchanged():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.zeros(6))

        def forward(self, x):
            return x + self.table.view(7)

    gm = fxloom.symbolic_trace(Broken())
    before = gm.code
    with pytest.raises(RuntimeError, match=r"evaluating the constant node %view failed"):
        const_fold(gm)
    assert gm.code == before
    assert [name for name, _ in gm.named_buffers()] == ["table"]
