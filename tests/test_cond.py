"""``fxloom.cond``: eager semantics, argument checks, and capture under ``fxloom.symbolic_trace``.

Export's capture of cond is tested in ``tests/export/test_cond_export.py``.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import fxloom
from fxloom import Interpreter, TraceError, cond, cond_op, symbolic_trace

POSITIVE = torch.ones(2, 3)
NEGATIVE = -torch.ones(2, 3)


def sin_or_cos(x):
    return cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))


class Gate(nn.Module):
    """Parameters in one branch, a closed-over intermediate value in both."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x):
        y = x * 3
        return cond(x.sum() > 0, lambda x: self.lin(x) * self.scale + y, lambda x: x - y, (x,))


def cond_nodes(gm) -> list:
    return [n for n in gm.graph.nodes if n.target is cond_op]


# ------------------------------------------------------------------ eager
def test_eager_tensor_pred_runs_the_true_branch_when_it_holds():
    assert torch.equal(sin_or_cos(POSITIVE), POSITIVE.sin())


def test_eager_tensor_pred_runs_the_false_branch_otherwise():
    assert torch.equal(sin_or_cos(NEGATIVE), NEGATIVE.cos())


def test_eager_bool_pred_runs_the_chosen_branch():
    x = torch.ones(2)
    assert torch.equal(cond(True, lambda x: x + 1, lambda x: x - 1, (x,)), x + 1)
    assert torch.equal(cond(False, lambda x: x + 1, lambda x: x - 1, (x,)), x - 1)


def test_eager_keeps_the_branch_output_structure():
    x = torch.ones(2)
    out = cond(x.sum() > 0, lambda x: {"a": x, "b": (x + 1,)}, lambda x: {"a": x, "b": (x,)}, [x])
    assert torch.equal(out["b"][0], x + 1)


# ------------------------------------------------------------------ argument checks
def test_pred_with_two_elements_is_refused_naming_its_shape():
    x = torch.ones(2)
    with pytest.raises(ValueError, match=r"exactly one element.*shape \(2,\)"):
        cond(x > 0, lambda x: x, lambda x: x, (x,))


def test_pred_of_another_kind_is_refused_naming_it():
    x = torch.ones(2)
    with pytest.raises(TypeError, match="pred must be a bool.*got str 'yes'"):
        cond("yes", lambda x: x, lambda x: x, (x,))


def test_operands_must_be_a_tuple_or_list():
    x = torch.ones(2)
    with pytest.raises(TypeError, match=r"tuple or list.*write \(x,\)"):
        cond(True, lambda x: x, lambda x: x, x)


def test_a_non_tensor_operand_is_refused():
    x = torch.ones(2)
    with pytest.raises(TypeError, match="operands must be tensors or sizes.*str 'a' at position 1"):
        cond(True, lambda x, n: x, lambda x, n: x, (x, "a"))


def test_a_size_may_be_an_operand():
    x = torch.ones(2)
    assert cond(False, lambda x, n: x * n, lambda x, n: x + n, (x, 3)).tolist() == [4.0, 4.0]


# ------------------------------------------------------------------ symbolic_trace
def test_trace_records_one_cond_node_and_two_submodules():
    gm = symbolic_trace(sin_or_cos)
    (node,) = cond_nodes(gm)
    pred, true_gm, false_gm, operands = node.args
    assert (true_gm.op, true_gm.target, false_gm.target) == (
        "get_attr",
        "true_graph_0",
        "false_graph_0",
    )
    assert [n.name for n in operands] == ["x"]
    assert isinstance(gm.true_graph_0, fxloom.GraphModule)
    assert isinstance(gm.false_graph_0, fxloom.GraphModule)


def test_traced_module_runs_both_branches_like_eager():
    gm = symbolic_trace(sin_or_cos)
    for x in (POSITIVE, NEGATIVE):
        assert torch.equal(gm(x), sin_or_cos(x))


def test_traced_code_reads_as_a_call_of_cond_op():
    code = symbolic_trace(sin_or_cos).code
    assert "cond = cond_op(gt, true_graph_0, false_graph_0, (x,))" in code
    assert "getitem = cond[0]" in code


def test_trace_lifts_parameters_and_outer_values_into_both_branches():
    gm = symbolic_trace(Gate())
    (node,) = cond_nodes(gm)
    assert [n.name for n in node.args[3]] == ["x", "mul", "scale"]
    for branch in (gm.true_graph_0, gm.false_graph_0):
        inputs = [n.target for n in branch.graph.find_nodes(op="placeholder")]
        assert inputs == ["x", "mul", "scale"]


def test_traced_module_with_parameters_matches_eager():
    model = Gate()
    gm = symbolic_trace(model)
    for x in (POSITIVE, NEGATIVE):
        torch.testing.assert_close(gm(x), model(x))


def test_trace_of_a_shape_test_records_it_as_the_predicate():
    def f(x):
        return cond(x.shape[0] > 4, lambda x: x + 1, lambda x: x - 1, (x,))

    gm = symbolic_trace(f)
    assert cond_nodes(gm)[0].args[0].target.__name__ == "gt"
    assert torch.equal(gm(torch.ones(5)), torch.ones(5) + 1)
    assert torch.equal(gm(torch.ones(3)), torch.ones(3) - 1)


def test_trace_with_a_bool_pred_records_only_the_branch_taken():
    gm = symbolic_trace(lambda x: cond(True, lambda x: x + 1, lambda x: x - 1, (x,)))
    assert cond_nodes(gm) == []


def test_trace_of_branches_returning_tuples_gives_them_back():
    def f(x):
        return cond(x.sum() > 0, lambda x: (x + 1, x * 2), lambda x: (x - 1, x / 2), (x,))

    gm = symbolic_trace(f)
    for x in (POSITIVE, NEGATIVE):
        got, want = gm(x), f(x)
        assert isinstance(got, tuple) and len(got) == 2
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def nested(x, y):
    def outer_true(x, y):
        return cond(y.sum() > 0, lambda x, y: x + y, lambda x, y: x - y, (x, y))

    return cond(x.sum() > 0, outer_true, lambda x, y: x * y, (x, y))


def test_trace_of_nested_cond_puts_the_inner_branches_in_the_outer_branch():
    gm = symbolic_trace(nested)
    assert len(cond_nodes(gm)) == 1
    assert len(cond_nodes(gm.true_graph_0)) == 1
    assert isinstance(gm.true_graph_0.true_graph_0, fxloom.GraphModule)


def test_traced_nested_cond_matches_eager_on_every_path():
    gm = symbolic_trace(nested)
    for x in (POSITIVE, NEGATIVE):
        for y in (POSITIVE * 2, NEGATIVE * 3):
            assert torch.equal(gm(x, y), nested(x, y))


def test_trace_refuses_branches_returning_different_structures():
    def f(x):
        return cond(x.sum() > 0, lambda x: (x, x), lambda x: x, (x,))

    with pytest.raises(
        TraceError,
        match=r"same structure: true_fn returns tuple\(\*, \*\), false_fn returns one tensor",
    ):
        symbolic_trace(f)


def test_interpreter_runs_the_cond_node():
    gm = symbolic_trace(sin_or_cos)
    assert torch.equal(Interpreter(gm).run(NEGATIVE), NEGATIVE.cos())


def test_traced_module_survives_deepcopy_and_pickle():
    gm = symbolic_trace(Gate())
    for copied in (copy.deepcopy(gm), pickle.loads(pickle.dumps(gm))):
        torch.testing.assert_close(copied(NEGATIVE), gm(NEGATIVE))


# ------------------------------------------------------------------ the tracer's error
class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x.sin()
        return x.cos()


def test_tracer_error_on_data_dependent_control_flow_names_cond_and_dynamic_shapes():
    with pytest.raises(TraceError) as info:
        symbolic_trace(DataDependent())
    message = str(info.value)
    assert "fxloom.cond(pred, true_fn, false_fn, operands)" in message
    assert "dynamic_shapes" in message


def test_trace_with_example_inputs_lets_branches_ask_about_their_operands():
    def f(x):
        return cond(x.sum() > 0, lambda x: x[:1] if x.dim() == 2 else x, lambda x: x[1:], (x,))

    gm = symbolic_trace(f, example_inputs=(POSITIVE,))
    assert torch.equal(gm(POSITIVE), POSITIVE[:1])
    assert torch.equal(gm(NEGATIVE), NEGATIVE[1:])


def test_shape_propagation_on_stand_ins_describes_the_output_without_choosing():
    from fxloom.passes.shape_prop import ShapeProp

    gm = symbolic_trace(Gate())
    ShapeProp(gm).propagate_meta(POSITIVE)
    (node,) = cond_nodes(gm)
    assert node.meta["tensor_meta"][0].shape == (2, 3)
