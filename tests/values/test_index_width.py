"""Bounds from an index width narrow a dynamic size's range instead of refusing the export.

A kernel that indexes with 32-bit integers guards ``N*C*H*W <= 2**31 - 1`` (a CUDA
convolution does; ResNet-50 on CUDA with a dynamic batch was refused with "batch at most
880,801"). Such a guard on a ``Dim`` becomes the upper end of its range, reported in
``range_constraints`` and ``shape_constraints`` with the line that made it and checked when
the program runs. The CPU suite makes the same guard from the program itself (a comparison
of an element count with ``2**31``), which goes through the same rule; any other guard that
narrows a ``Dim`` is still refused.
"""

from __future__ import annotations

import pytest
import sympy
import torch

from fxloom.export import Dim, export
from fxloom.values.symbolic import ConstraintViolationError, ShapeEnv
from fxloom.values.symbolic.index_width import upper_bound

ROW = 2**23  # elements per batch row of the wide view below: the batch fits up to 255


class ChecksIndexWidth(torch.nn.Module):
    """Guards like a 32-bit kernel: on the element count of a (memory-free) wide view."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x[:, None, :].expand(-1, 2**20, -1)
        if wide.numel() < 2**31:
            return x * 2
        return x


class NeedsSmallBatch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(0) <= 255:  # the same bound, not an index width
            return x * 2
        return x


def export_batch(model: torch.nn.Module, *more_dims: int):
    x = torch.randn(4, 8, *more_dims)
    return export(model, (x,), dynamic_shapes={"x": {0: Dim("batch")}})


# ------------------------------------------------------------------ the shape environment
def test_an_int32_element_count_bound_narrows_a_declared_dim():
    env = ShapeEnv()
    s0 = env.create_symbol(4, dim_name="batch")
    assert env.evaluate(sympy.Le(802816 * s0, 2**31 - 1), hint=True) is True
    assert env.range_of(s0) == (2, 2674)
    (narrowing,) = env.index_bounds.values()
    assert narrowing.symbol == s0 and narrowing.bound.width == "int32"


def test_a_bound_on_a_product_of_dims_stays_a_fact_without_narrowing():
    env = ShapeEnv()
    s0 = env.create_symbol(4, dim_name="batch")
    s1 = env.create_symbol(8, dim_name="seq")
    env.evaluate(sympy.Lt(4096 * s0 * s1, 2**31), hint=True)
    assert env.range_of(s0)[1] == sympy.oo and env.range_of(s1)[1] == sympy.oo
    (narrowing,) = env.index_bounds.values()
    assert narrowing.symbol is None


def test_another_upper_bound_on_a_declared_dim_is_still_refused():
    env = ShapeEnv()
    s0 = env.create_symbol(4, dim_name="batch")
    with pytest.raises(ConstraintViolationError, match="Dim 'batch'"):
        env.evaluate(sympy.Le(802816 * s0, 10**9), hint=True)


@pytest.mark.parametrize(
    "fact",
    [
        sympy.Ge(sympy.Symbol("s0", positive=True, integer=True), 2**31 - 1),  # a lower bound
        sympy.Le(sympy.Symbol("s0", integer=True) - sympy.Symbol("s1", integer=True), 2**31 - 1),
        sympy.Le(sympy.Integer(5), 2**31 - 1),
    ],
    ids=["lower bound", "difference of sizes", "no size"],
)
def test_only_a_count_of_elements_at_most_a_width_is_an_index_bound(fact):
    assert upper_bound(fact) is None


@pytest.mark.parametrize("limit", [2**31 - 1, 2**32 - 1, 2**63 - 1])
def test_each_index_width_is_recognised(limit):
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    assert upper_bound(sympy.Le(64 * s0, limit)).limit == limit


def test_a_largest_offset_bound_with_a_constant_is_an_index_bound():
    env = ShapeEnv()
    s0 = env.create_symbol(4, dim_name="batch")
    # the largest offset of a contiguous (N, 3, 224, 224) input, at most INT_MAX
    env.evaluate(sympy.Le((s0 - 1) * 150528 + 150527, 2**31 - 1), hint=True)
    assert env.range_of(s0) == (2, 14266)


# ------------------------------------------------------------------ export
def test_export_reports_the_narrowed_range_instead_of_refusing():
    ep = export_batch(ChecksIndexWidth())
    ((symbol, value_range),) = ep.range_constraints.items()
    assert (int(value_range.lower), int(value_range.upper)) == (0, (2**31 - 1) // ROW)


def test_the_shape_report_names_the_bound_its_line_and_the_width():
    (line,) = export_batch(ChecksIndexWidth()).shape_constraints
    assert "8388608*x.size(0) < 2147483648" in line
    assert "if wide.numel() < 2**31:" in line
    assert "index width int32: x.size(0) <= 255" in line


def test_the_exported_module_runs_within_the_bound_and_refuses_past_it():
    model = ChecksIndexWidth()
    module = export_batch(model).module()
    for batch in (3, 255):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(module(x), model(x))
    with pytest.raises(ValueError, match=r"dimension 0 is 256, outside the range .*\[0, 255\]"):
        module(torch.randn(256, 8))


def test_a_program_bound_that_is_no_index_width_is_still_a_violation():
    with pytest.raises(ConstraintViolationError, match="max=255"):
        export_batch(NeedsSmallBatch())


class ChecksTwoDims(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x[:, :, None].expand(-1, -1, 2**20)
        if wide.numel() <= 2**31 - 1:
            return x + 1
        return x


def test_a_bound_on_two_dims_is_asserted_when_the_program_runs():
    model = ChecksTwoDims()
    x = torch.randn(4, 8)
    ep = export(model, (x,), dynamic_shapes={"x": {0: Dim("batch"), 1: Dim("seq")}})
    assert "index width int32; checked when it runs" in ep.shape_constraints[0]
    module = ep.module()
    for shape in ((4, 8), (16, 64)):
        x = torch.randn(*shape)
        torch.testing.assert_close(module(x), model(x))
    with pytest.raises(RuntimeError, match="requires"):
        module(torch.randn(64, 64))  # 64 * 64 * 2**20 = 2**32 elements in the wide view
