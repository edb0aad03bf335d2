"""Export with dynamic shapes: symbolic sizes, the constraints a program forces, call-time checks.

``export(model, args, dynamic_shapes=...)`` captures one program for every size a ``Dim``
allows: sizes that flow into operators become graph nodes (``sym_size``, arithmetic), never
the example's numbers; what the program requires of the sizes (equal dims, an even dim, a
dim >= 3) is derived and either kept (``Dim.AUTO``), or refused at export time naming the
user's line and the fix (a declared ``Dim``); the exported module checks its inputs.
torch.export runs the same programs side by side where it can.
"""

from __future__ import annotations

import pytest
import torch
import torch.export
from torch import nn

from benchmarks.zoo.methods import fixed_args
from benchmarks.zoo.registry import get
from benchmarks.zoo.worker import tensor_leaves
from fxloom.export import Dim, export
from fxloom.values.symbolic import ConstraintViolationError


def _no_int_sizes(graph, op) -> list:
    """The size arguments of ``op`` nodes (nodes, not the example's ints, when symbolic)."""
    return [n.args[1] for n in graph.nodes if n.target == op]


# ------------------------------------------------------------------ symbolic sizes


class Flatten(nn.Module):
    def forward(self, x):
        return x.view(x.shape[0], -1) * torch.arange(x.shape[1] * x.shape[2])


def test_a_size_flowing_into_an_operator_is_a_graph_node_not_the_examples_value():
    batch = Dim("batch", max=64)
    ep = export(Flatten(), (torch.randn(4, 3, 5),), dynamic_shapes={"x": {0: batch}})
    (view_shape,) = _no_int_sizes(ep.graph, torch.ops.aten.view.default)
    assert view_shape[0].target == torch.ops.aten.sym_size.int and view_shape[1] == -1
    assert (
        str(ep.graph.find_nodes(op="placeholder")[0].meta["val"].shape) == "torch.Size([s0, 3, 5])"
    )
    module = ep.module()
    for size in (2, 7, 64):
        x = torch.randn(size, 3, 5)
        torch.testing.assert_close(module(x), Flatten()(x))


def test_range_constraints_hold_each_symbols_declared_range_as_torch_export_reports_it():
    batch = Dim("batch", min=1, max=64)
    ours = export(Flatten(), (torch.randn(4, 3, 5),), dynamic_shapes={"x": {0: batch}})
    theirs = torch.export.export(
        Flatten(), (torch.randn(4, 3, 5),), dynamic_shapes={"x": {0: batch_t()}}
    )
    ((symbol, ours_range),) = ours.range_constraints.items()
    ((_, theirs_range),) = theirs.range_constraints.items()
    assert str(symbol) == "s0"
    assert (
        (ours_range.lower, ours_range.upper) == (theirs_range.lower, theirs_range.upper) == (1, 64)
    )


def batch_t():
    return torch.export.Dim("batch", min=1, max=64)


class UpsampleToSkip(nn.Module):
    """A decoder step as segmentation models write it: the coarse map resized to the size of
    the fine one, read from the fine one's shape (torch's C++ kernel reads those sizes as
    ints; export runs its Python definition, which keeps the batch symbolic)."""

    def forward(self, coarse, fine):
        resized = nn.functional.interpolate(
            coarse, size=fine.shape[2:], mode="bilinear", align_corners=False
        )
        return resized + fine


def test_interpolate_to_a_size_read_from_another_tensor_exports_with_a_dynamic_batch():
    batch = Dim("batch", max=32)
    example = (torch.randn(2, 4, 4, 4), torch.randn(2, 4, 8, 8))
    ep = export(
        UpsampleToSkip(), example, dynamic_shapes={"coarse": {0: batch}, "fine": {0: batch}}
    )
    module = ep.module()
    for size in (2, 5):
        inputs = (torch.randn(size, 4, 4, 4), torch.randn(size, 4, 8, 8))
        torch.testing.assert_close(module(*inputs), UpsampleToSkip()(*inputs))


# ------------------------------------------------------------------ real models


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_hf_models_export_once_with_dynamic_batch_and_length_and_run_at_every_size(name):
    model, inputs = get(name).build()
    fixed = fixed_args(model, inputs)
    batch, seq = Dim("batch", max=16), Dim("seq", max=64)  # the tiny configs hold 64 positions
    dynamic = {key: {0: batch, 1: seq} for key in inputs}
    ep = export(model, (), {**inputs, **fixed}, dynamic_shapes=dynamic)
    assert len(ep.range_constraints) == 2
    module = ep.module()
    with torch.no_grad():
        for size in [(2, 7), (3, 5), (1, 3), (5, 16), (16, 64)]:
            given = get(name).make_inputs(*size)
            expected = model(**given, **fixed)
            got = module(**given, **fixed)
            for ours, theirs in zip(tensor_leaves(got), tensor_leaves(expected), strict=True):
                torch.testing.assert_close(ours, theirs, msg=f"{name} at {size}")
    too_long = get(name).make_inputs(2, 65)
    with pytest.raises(ValueError, match=r"input 'input_ids': dimension 1 is 65, outside .*'seq'"):
        module(**too_long, **fixed)


def test_a_declared_range_the_model_cannot_hold_is_refused_naming_the_line_and_the_fix():
    model, inputs = get("bert").build()
    fixed = fixed_args(model, inputs)
    seq = Dim("seq", max=128)  # the tiny BERT has 64 positions
    with pytest.raises(ConstraintViolationError) as error:
        export(
            model,
            (),
            {**inputs, **fixed},
            dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}},
        )
    message = str(error.value)
    assert "Dim 'seq'" in message and "<= 64" in message
    assert "modeling_bert.py" in message and "position_ids" in message
    assert "Dim('seq', min=0, max=64)" in message


# ------------------------------------------------------------------ constraints the program forces


class Add(nn.Module):
    def forward(self, x, y):
        return x + y


class Doubled(nn.Module):
    def forward(self, x, y):
        return torch.cat([x, x]) * y


class Pairs(nn.Module):
    def forward(self, x):
        return x.view(-1, 2, x.shape[1]).sum(1)


class FirstThree(nn.Module):
    def forward(self, x):
        return x.narrow(0, 0, 3) * 2


def test_two_dims_the_program_makes_equal_are_refused_with_the_advice_to_share_one_dim():
    with pytest.raises(ConstraintViolationError, match=r"(?s)Eq\(s1, s0\).*x \+ y.*use one Dim"):
        export(
            Add(),
            (torch.randn(4), torch.randn(4)),
            dynamic_shapes={"x": {0: Dim("a")}, "y": {0: Dim("b")}},
        )


def test_one_dim_shared_by_two_inputs_means_equal_sizes_checked_at_call_time():
    n = Dim("n")
    ep = export(Add(), (torch.randn(4), torch.randn(4)), dynamic_shapes={"x": {0: n}, "y": {0: n}})
    assert len(ep.range_constraints) == 1
    module = ep.module()
    torch.testing.assert_close(module(torch.ones(6), torch.ones(6)), torch.full((6,), 2.0))
    with pytest.raises(ValueError, match=r"input 'y'.*dimension 0.*5"):
        module(torch.ones(6), torch.ones(5))


def test_a_size_the_program_requires_to_be_twice_another_suggests_the_derived_dim():
    with pytest.raises(ConstraintViolationError, match=r"derived Dim b = 2\*a"):
        export(
            Doubled(),
            (torch.randn(3), torch.randn(6)),
            dynamic_shapes={"x": {0: Dim("a")}, "y": {0: Dim("b")}},
        )


def test_a_derived_dim_exports_what_the_program_requires():
    a = Dim("a", max=32)
    ep = export(
        Doubled(), (torch.randn(3), torch.randn(6)), dynamic_shapes={"x": {0: a}, "y": {0: 2 * a}}
    )
    module = ep.module()
    x, y = torch.randn(5), torch.randn(10)
    torch.testing.assert_close(module(x, y), Doubled()(x, y))
    with pytest.raises(ValueError, match=r"input 'y'.*dimension 0.*9"):
        module(x, torch.randn(9))


def test_a_declared_dim_the_program_needs_even_is_refused_with_the_derived_dim_fix():
    with pytest.raises(ConstraintViolationError, match=r"(?s)Mod\(s0, 2\).*x.view.*derived Dim"):
        export(Pairs(), (torch.randn(6, 3),), dynamic_shapes={"x": {0: Dim("rows")}})


def test_auto_keeps_divisibility_as_a_runtime_assertion_with_the_users_line():
    ep = export(Pairs(), (torch.randn(6, 3),), dynamic_shapes={"x": {0: Dim.AUTO}})
    asserts = ep.graph.find_nodes(op="call_function", target=torch.ops.aten._assert_scalar.default)
    assert len(asserts) == 1 and "x.view(-1, 2, x.shape[1])" in asserts[0].args[1]
    module = ep.module()
    torch.testing.assert_close(module(torch.ones(8, 3)), torch.full((4, 3), 2.0))
    with pytest.raises(RuntimeError, match=r"requires x.size\(0\) % 2 == 0, from .*x.view"):
        module(torch.ones(7, 3))


def test_a_dim_the_program_needs_at_least_three_is_refused_with_the_range_to_declare():
    with pytest.raises(ConstraintViolationError, match=r"Dim\('n', min=3\)"):
        export(FirstThree(), (torch.randn(5),), dynamic_shapes={"x": {0: Dim("n")}})


def test_auto_narrows_the_range_the_program_needs_and_checks_it_at_call_time():
    ep = export(FirstThree(), (torch.randn(5),), dynamic_shapes={"x": {0: Dim.AUTO}})
    ((_, narrowed),) = ep.range_constraints.items()
    assert (narrowed.lower, narrowed.upper) == (3, float("inf"))
    module = ep.module()
    torch.testing.assert_close(module(torch.ones(9)), torch.full((3,), 2.0))
    with pytest.raises(ValueError, match=r"input 'x'.*dimension 0.*2"):
        module(torch.ones(2))


def test_auto_with_an_example_of_size_one_stays_static():
    ep = export(Add(), (torch.randn(1), torch.randn(1)), dynamic_shapes={"x": {0: Dim.AUTO}})
    assert ep.range_constraints == {}


# ------------------------------------------------------------------ data-dependent sizes


class Positive(nn.Module):
    def forward(self, x):
        rows = x.nonzero()
        count = rows.shape[0]
        torch._check(count >= 1)
        return rows.float().sum(0) / count, torch.zeros(count - 1), x[x > 0]


def test_unbacked_sizes_from_nonzero_flow_into_later_operators():
    ep = export(Positive(), (torch.tensor([1.0, -2.0, 3.0, 0.0]),))
    unbacked = [str(s) for s in ep.range_constraints]
    assert unbacked and all(name.startswith("i") for name in unbacked)
    module = ep.module()
    for x in (torch.tensor([0.0, 5.0, -1.0, 2.0]), torch.tensor([4.0, 0.0, 0.0, 0.0])):
        for ours, theirs in zip(module(x), Positive()(x)):
            torch.testing.assert_close(ours, theirs)


def test_torch_check_is_a_fact_at_export_and_a_runtime_assertion_in_the_graph():
    ep = export(Positive(), (torch.tensor([1.0, -2.0, 3.0, 0.0]),))
    asserts = ep.graph.find_nodes(op="call_function", target=torch.ops.aten._assert_scalar.default)
    assert any("torch._check(count >= 1)" in node.args[1] for node in asserts)
    with pytest.raises(
        RuntimeError, match=r"i\d+ >= 1 \(i\d+ from nonzero\).*torch._check\(count >= 1\)"
    ):
        ep.module()(torch.zeros(4))


def test_an_item_value_flows_into_operators():
    class Scale(nn.Module):
        def forward(self, x):
            return x * x.max().item()

    module = export(Scale(), (torch.randn(3),)).module()
    x = torch.tensor([1.0, 4.0, 2.0])
    torch.testing.assert_close(module(x), x * 4)


def test_unique_and_masked_select_have_data_dependent_sizes():
    class Distinct(nn.Module):
        def forward(self, x):
            return torch.unique(x), torch.masked_select(x, x > 1)

    module = export(Distinct(), (torch.tensor([1, 2, 2, 3]),)).module()
    x = torch.tensor([5, 1, 5, 9])
    for ours, theirs in zip(module(x), Distinct()(x)):
        torch.testing.assert_close(ours, theirs)


def test_branching_on_a_data_dependent_value_points_to_torch_check_and_cond():
    class Branch(nn.Module):
        def forward(self, x):
            if x.nonzero().shape[0] > 2:
                return x
            return -x

    with pytest.raises(
        RuntimeError, match=r"(?s)depends on tensor data.*nonzero.*torch._check.*fxloom.cond"
    ):
        export(Branch(), (torch.randn(4),))


def test_tolist_values_are_data_dependent_and_may_bound_a_slice():
    class Head(nn.Module):
        def forward(self, x, lengths):
            n = lengths.tolist()[0]
            torch._check(n >= 0)
            torch._check(n <= x.shape[0])
            return x[:n]

    module = export(Head(), (torch.randn(8, 2), torch.tensor([3, 1]))).module()
    x = torch.randn(8, 2)
    torch.testing.assert_close(module(x, torch.tensor([5, 0])), x[:5])


def test_auto_reports_what_the_program_derived_with_the_line():
    class Mixed(nn.Module):
        def forward(self, x, y):
            return x.view(-1, 2, 3).sum(1) + y

    ep = export(
        Mixed(),
        (torch.randn(8, 3), torch.randn(4, 3)),
        dynamic_shapes={"x": {0: Dim.AUTO}, "y": {0: Dim.AUTO}},
    )
    report = "\n".join(ep.shape_constraints)
    assert "x.size(0) % 2 == 0" in report and "x.view(-1, 2, 3)" in report
    assert "y.size(0) == x.size(0)/2" in report or "x.size(0)/2 == y.size(0)" in report
    assert len(ep.range_constraints) == 1  # y's size is x's over two: one symbol left
    assert "Shape constraint: x.size(0) % 2 == 0" in str(ep)


def test_dim_dynamic_that_the_program_specialises_is_refused():
    class Fixed(nn.Module):
        def forward(self, x):
            return x + torch.ones(4)

    with pytest.raises(ConstraintViolationError, match=r"x.size\(0\).*make that dimension static"):
        export(Fixed(), (torch.randn(4),), dynamic_shapes={"x": {0: Dim.DYNAMIC}})
