"""``fxloom.cond`` under ``fxloom.export.export``, side by side with ``torch.cond`` under torch.export.

The same module is written twice, once calling ``torch.cond`` and once ``fxloom.cond``; both
programs must give the same results for inputs taking either branch, and have the same shape:
a cond node reading two subgraph modules, with lifted parameters as extra operands.
"""

from __future__ import annotations

import operator
import re

import pytest
import torch
import torch.export
from torch import nn

import fxloom
from fxloom.export import Dim, ExportedProgram, ExportError, export

POSITIVE = torch.ones(2, 3)
NEGATIVE = -torch.ones(2, 3)


class Gate(nn.Module):
    """A tensor predicate; a parameter used in one branch, a buffer in the other."""

    def __init__(self, cond=fxloom.cond) -> None:
        super().__init__()
        self.cond = cond
        self.lin = nn.Linear(3, 3)
        self.register_buffer("offset", torch.full((3,), 0.5))

    def forward(self, x):
        return self.cond(x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: x - self.offset, (x,))


def twins(cls, *args) -> tuple[nn.Module, nn.Module]:
    """The module with fxloom.cond and the same module (same weights) with torch.cond."""
    ours = cls(fxloom.cond, *args)
    theirs = cls(torch.cond, *args)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def cond_nodes(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and "cond" in str(n.target)]


def shape_of(gm) -> list[tuple]:
    """The graph's structure around cond: (op, target kind) of every node but placeholders."""
    return [
        (n.op, "cond" if "cond" in str(n.target) else re.sub(r"_\d+$", "", str(n.target)))
        for n in gm.graph.nodes
        if n.op != "placeholder"
    ]


# ------------------------------------------------------------------ the graph
def test_export_records_a_cond_node_reading_two_subgraph_modules_like_torch():
    ours, theirs = twins(Gate)
    ep = export(ours, (POSITIVE,))
    reference = torch.export.export(theirs, (POSITIVE,))
    assert shape_of(ep.graph_module) == shape_of(reference.graph_module)
    (node,) = cond_nodes(ep.graph_module)
    assert node.target is fxloom.cond_op
    assert [a.target for a in node.args[1:3]] == ["true_graph_0", "false_graph_0"]


def test_lifted_state_reaches_both_branches_in_the_same_order():
    ep = export(Gate(), (POSITIVE,))
    (node,) = cond_nodes(ep.graph_module)
    assert [n.name for n in node.args[3]] == ["x", "p_lin_weight", "p_lin_bias", "b_offset"]
    for branch in (ep.graph_module.true_graph_0, ep.graph_module.false_graph_0):
        names = [n.name for n in branch.graph.find_nodes(op="placeholder")]
        assert names == ["x", "p_lin_weight", "p_lin_bias", "b_offset"]


def test_branches_are_captured_at_the_operator_level():
    ep = export(Gate(), (POSITIVE,))
    targets = [n.target for n in ep.graph_module.false_graph_0.graph.find_nodes(op="call_function")]
    assert targets == [torch.ops.aten.sub.Tensor]


def test_cond_node_val_is_the_true_branch_output():
    ep = export(Gate(), (POSITIVE,))
    (node,) = cond_nodes(ep.graph_module)
    (val,) = node.meta["val"]
    assert (tuple(val.shape), val.dtype) == ((2, 3), torch.float32)
    assert "self.cond(x.sum() > 0" in node.meta["stack_trace"]  # the user's line


# ------------------------------------------------------------------ running it
@pytest.mark.parametrize("x", [POSITIVE, NEGATIVE], ids=["true", "false"])
def test_module_of_the_program_matches_eager_and_torch_on_either_branch(x):
    ours, theirs = twins(Gate)
    ep = export(ours, (POSITIVE,))
    reference = torch.export.export(theirs, (POSITIVE,))
    torch.testing.assert_close(ep.module()(x), ours(x))
    torch.testing.assert_close(ep.module()(x), reference.module()(x))


@pytest.mark.parametrize("x", [POSITIVE, NEGATIVE], ids=["true", "false"])
def test_unflatten_keeps_the_branches_in_the_module_calling_cond(x):
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = Gate()
            self.post = nn.Linear(3, 2)

        def forward(self, x):
            return self.post(self.gate(x))

    from fxloom.export.unflattening import unflatten

    model = Outer()
    tree = unflatten(export(model, (POSITIVE,)))
    assert isinstance(tree.gate.true_graph_0, torch.nn.Module)
    torch.testing.assert_close(tree(x), model(x))


def test_printing_the_program_shows_the_branches_code():
    text = str(export(Gate(), (POSITIVE,)))
    assert "class true_graph_0(torch.nn.Module):" in text
    assert "class false_graph_0(torch.nn.Module):" in text and "aten.sub.Tensor" in text


def test_the_verifier_checks_the_branch_graphs_too():
    from fxloom.export.verifier import ExportVerifierError

    ep = export(Gate(), (POSITIVE,))
    branch = ep.graph_module.false_graph_0
    add = next(n for n in branch.graph.nodes if n.op == "call_function")
    add.target = torch.ops.aten.sub_.Tensor  # a write, which an exported graph may not hold
    with pytest.raises(ExportVerifierError, match=r"mutates its inputs"):
        ep.validate()


def test_run_decompositions_decomposes_inside_the_branches():
    class Linear(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return fxloom.cond(x.sum() > 0, lambda x: self.lin(x), lambda x: x.cos(), (x,))

    model = Linear()
    core = export(model, (POSITIVE,)).run_decompositions()
    inner = {n.target for n in core.graph_module.true_graph_0.graph.find_nodes(op="call_function")}
    assert torch.ops.aten.t.default not in inner and torch.ops.aten.permute.default in inner
    for x in (POSITIVE, NEGATIVE):
        torch.testing.assert_close(core.module()(x), model(x))


class Pair(nn.Module):
    """Branches returning tuples."""

    def __init__(self, cond=fxloom.cond) -> None:
        super().__init__()
        self.cond = cond

    def forward(self, x, y):
        return self.cond(
            x.sum() > y.sum(), lambda x, y: (x + y, x * y), lambda x, y: (x - y, x / y), (x, y)
        )


@pytest.mark.parametrize("x", [POSITIVE, NEGATIVE], ids=["true", "false"])
def test_branches_returning_tuples_give_tuples_back_like_torch(x):
    ours, theirs = twins(Pair)
    ep = export(ours, (POSITIVE, POSITIVE * 2))
    reference = torch.export.export(theirs, (POSITIVE, POSITIVE * 2))
    y = POSITIVE * 0.5
    for got, want in zip(ep.module()(x, y), reference.module()(x, y)):
        torch.testing.assert_close(got, want)
    (node,) = cond_nodes(ep.graph_module)
    assert [(user.target.__name__, user.args[1]) for user in node.users] == [
        ("getitem", 0),
        ("getitem", 1),
    ]


class Nested(nn.Module):
    def __init__(self, cond=fxloom.cond) -> None:
        super().__init__()
        self.cond = cond
        self.weight = nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x, y):
        def inner(x, y):
            return self.cond(y.sum() > 0, lambda x, y: x * self.weight, lambda x, y: x - y, (x, y))

        return self.cond(x.sum() > 0, inner, lambda x, y: x + y, (x, y))


def test_nested_cond_puts_its_subgraphs_in_the_branch_like_torch():
    ours, theirs = twins(Nested)
    ep = export(ours, (POSITIVE, POSITIVE))
    reference = torch.export.export(theirs, (POSITIVE, POSITIVE))
    assert shape_of(ep.graph_module.true_graph_0) == shape_of(reference.graph_module.true_graph_0)
    assert len(cond_nodes(ep.graph_module.true_graph_0)) == 1


@pytest.mark.parametrize("x", [POSITIVE, NEGATIVE], ids=["outer-true", "outer-false"])
@pytest.mark.parametrize("y", [POSITIVE, NEGATIVE], ids=["inner-true", "inner-false"])
def test_nested_cond_matches_eager_on_every_path(x, y):
    model = Nested()
    ep = export(model, (POSITIVE, POSITIVE))
    torch.testing.assert_close(ep.module()(x, y), model(x, y))


def test_bool_pred_records_only_the_branch_taken():
    class Static(nn.Module):
        def forward(self, x):
            return fxloom.cond(x.shape[0] > 1, lambda x: x + 1, lambda x: x - 1, (x,))

    ep = export(Static(), (POSITIVE,))
    assert cond_nodes(ep.graph_module) == []
    assert isinstance(ep, ExportedProgram)


# ------------------------------------------------------------------ refusals
def branches(true_fn, false_fn) -> nn.Module:
    class Branches(nn.Module):
        def forward(self, x):
            return fxloom.cond(x.sum() > 0, true_fn, false_fn, (x,))

    return Branches()


def test_branches_returning_different_structures_are_refused():
    model = branches(lambda x: (x, x), lambda x: x)
    with pytest.raises(
        ExportError,
        match=r"same structure: true_fn returns tuple\(\*, \*\), false_fn returns one tensor",
    ):
        export(model, (POSITIVE,))


def test_branches_returning_different_shapes_are_refused_naming_the_output():
    model = branches(lambda x: (x, x), lambda x: (x, x.sum(0)))
    with pytest.raises(
        ExportError, match=r"output \[1\] has shape \(2, 3\) in true_fn but \(3,\) in false_fn"
    ):
        export(model, (POSITIVE,))


def test_branches_returning_different_dtypes_are_refused_naming_the_output():
    model = branches(lambda x: {"y": x}, lambda x: {"y": x.double()})
    with pytest.raises(
        ExportError, match=r"output \['y'\] has dtype torch.float32 in true_fn but torch.float64"
    ):
        export(model, (POSITIVE,))


def test_a_branch_writing_its_operand_in_place_is_refused():
    model = branches(lambda x: x.add_(1), lambda x: x)
    with pytest.raises(
        ExportError, match=r"true_fn writes in place to %x.*x \+ 1, not x.add_\(1\)"
    ):
        export(model, (POSITIVE,))


def test_a_branch_writing_a_buffer_in_place_is_refused_and_the_module_is_unchanged():
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("count", torch.zeros(3))

        def forward(self, x):
            return fxloom.cond(x.sum() > 0, lambda x: x, lambda x: self.count.add_(1) + x, (x,))

    model = Counter()
    with pytest.raises(ExportError, match="false_fn writes in place to %b_count"):
        export(model, (POSITIVE,))
    assert torch.equal(model.count, torch.zeros(3))


def test_a_branch_may_write_tensors_it_created():
    def true_fn(x):
        y = x.clone()
        y.mul_(2)
        return y

    ep = export(branches(true_fn, lambda x: x * 3), (POSITIVE,))
    torch.testing.assert_close(ep.module()(POSITIVE), POSITIVE * 2)
    torch.testing.assert_close(ep.module()(NEGATIVE), NEGATIVE * 3)


def test_a_pred_with_two_elements_is_refused():
    class Wide(nn.Module):
        def forward(self, x):
            return fxloom.cond(x[0] > 0, lambda x: x, lambda x: x, (x,))

    with pytest.raises(ValueError, match=r"exactly one element.*shape \(3,\)"):
        export(Wide(), (POSITIVE,))


def test_a_string_pred_is_refused():
    class Text(nn.Module):
        def forward(self, x):
            return fxloom.cond("x > 0", lambda x: x, lambda x: x, (x,))

    with pytest.raises(TypeError, match="pred must be a bool.*got str 'x > 0'"):
        export(Text(), (POSITIVE,))


def test_a_mismatch_error_shows_the_line_calling_cond():
    model = branches(lambda x: x, lambda x: x.double())
    with pytest.raises(
        ExportError, match=r"dtype(.|\n)*return fxloom.cond\(x.sum\(\) > 0, true_fn"
    ):
        export(model, (POSITIVE,))


def test_a_branch_writing_a_tensor_from_outside_in_place_is_refused():
    class Outer(nn.Module):
        def forward(self, x):
            y = x * 2
            return fxloom.cond(x.sum() > 0, lambda x: y.mul_(2) + x, lambda x: x, (x,))

    with pytest.raises(ExportError, match="true_fn writes in place to %mul"):
        export(Outer(), (POSITIVE,))


class ShapeTest(nn.Module):
    """A symbolic shape test as the predicate (under dynamic shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x):
        return fxloom.cond(
            x.shape[0] > 4, lambda x: x.view(x.shape[0] * 3), lambda x: (x * self.w).view(-1), (x,)
        )


def test_a_symbolic_shape_test_becomes_the_node_computing_it():
    batch = Dim("batch", min=2, max=64)
    ep = export(ShapeTest(), (torch.ones(5, 3),), dynamic_shapes={"x": {0: batch}})
    (node,) = cond_nodes(ep.graph_module)
    pred = node.args[0]
    assert pred.target is operator.gt and pred.args[0].target is torch.ops.aten.sym_size.int
    model = ShapeTest()
    module = ep.module()
    for rows in (3, 8):  # one input per branch
        x = torch.randn(rows, 3)
        torch.testing.assert_close(ep.graph_module(model.w, x)[0], model(x))
        torch.testing.assert_close(module(x), model(x))


def test_a_data_dependent_size_read_before_cond_is_lifted_into_the_branches():
    class Counts(nn.Module):
        def forward(self, x):
            n = x.nonzero().shape[0]
            k = x.sum().item()
            return fxloom.cond(
                x.sum() > 0, lambda x: torch.zeros(n) + k, lambda x: torch.ones(n), (x,)
            )

    ep = export(Counts(), (torch.tensor([1.0, 0.0, 2.0]),))
    (node,) = cond_nodes(ep.graph_module)
    assert [a.target for a in node.args[3][1:]] == [
        torch.ops.aten.sym_size.int,
        torch.ops.aten._local_scalar_dense.default,
    ]
    module = ep.module()
    for x in (
        torch.tensor([1.0, 0.0, 2.0]),
        torch.tensor([-1.0, 0.0, 0.0]),
        torch.tensor([3.0, 4.0, 0.5]),
    ):
        torch.testing.assert_close(module(x), Counts()(x))
