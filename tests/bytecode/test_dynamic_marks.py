"""Marks on tensors and ``dynamic=`` specs: which sizes are symbols from the first compile.

``fxloom.mark_dynamic(t, dim)`` makes a size a symbol from the first compile (and refuses a
program that fixes it to one value, as torch's does); ``maybe_mark_dynamic`` too, without the
refusal; ``mark_static`` keeps a size guarded by value even after it changes. Marks written by
``torch._dynamo.mark_dynamic`` are read as well. ``dynamic=`` takes a ``dynamic_shapes`` spec as
``fxloom.export`` does. Every result is compared with eager.
"""

from __future__ import annotations

import pytest
import torch

import fxloom
from fxloom.bytecode.breaks import DynamicDimError
from fxloom.export import Dim

pytestmark = pytest.mark.usefixtures("one_thread")


def double_rows(x):
    return x.sum(1) * 2


def unrolled(x):
    total = x[0]
    for i in range(1, x.shape[0]):  # needs the size as a plain number: fixes it
        total = total + x[i]
    return total


def marked(n: int, mark, *dims) -> torch.Tensor:
    x = torch.randn(n, 3)
    mark(x, *dims)
    return x


def compiles(compiled) -> int:
    return compiled.explain().graph_count


def test_a_size_marked_dynamic_is_a_symbol_from_the_first_compile():
    compiled = fxloom.compile(double_rows)
    for n in (2, 5, 1, 7):
        x = marked(n, fxloom.mark_dynamic, 0)
        torch.testing.assert_close(compiled(x), double_rows(x))
    assert compiles(compiled) == 1
    assert compiled.explain().recompiles == []


def test_a_program_that_fixes_a_size_marked_dynamic_is_refused():
    compiled = fxloom.compile(unrolled)
    with pytest.raises(DynamicDimError, match=r"x.shape\[0\] == 4.*range") as raised:
        compiled(marked(4, fxloom.mark_dynamic, 0))
    assert "maybe_mark_dynamic" in str(raised.value)  # the fix


def test_a_size_maybe_marked_dynamic_may_be_fixed_by_the_program():
    compiled = fxloom.compile(unrolled)
    for n in (4, 4, 6):
        x = marked(n, fxloom.maybe_mark_dynamic, 0)
        torch.testing.assert_close(compiled(x), unrolled(x))
    assert compiles(compiled) == 2  # the entry guards the fixed value


def test_a_size_marked_static_stays_static_after_it_changes():
    compiled = fxloom.compile(double_rows)
    for n in (2, 5, 7):
        x = marked(n, fxloom.mark_static, 0)
        torch.testing.assert_close(compiled(x), double_rows(x))
    assert compiles(compiled) == 3
    assert compiled.explain().dynamic_sizes == []
    assert [r.outcome for r in compiled.explain().recompiles] == ["compiled", "compiled"]


def test_a_mark_made_by_torch_dynamo_is_honoured():
    import torch._dynamo  # the test marks as a torch user would; fxloom only reads the mark

    compiled = fxloom.compile(double_rows)
    for n in (2, 5, 7):
        x = marked(n, torch._dynamo.mark_dynamic, 0)
        torch.testing.assert_close(compiled(x), double_rows(x))
    assert compiles(compiled) == 1


def test_a_dim_marked_dynamic_with_a_range_recompiles_outside_it():
    compiled = fxloom.compile(double_rows)
    for n in (2, 5, 9):
        x = torch.randn(n, 3)
        fxloom.mark_dynamic(x, 0, max=6)
        torch.testing.assert_close(compiled(x), double_rows(x))
    assert compiles(compiled) == 2  # [0, 6] symbolic, then 9 (outside) static


def test_mark_dynamic_names_a_dimension_the_tensor_lacks():
    with pytest.raises(IndexError, match="dimension 2"):
        fxloom.mark_dynamic(torch.ones(3, 4), 2)


def test_dynamic_takes_a_dynamic_shapes_dict_by_parameter_name():
    compiled = fxloom.compile(double_rows, dynamic={"x": {0: Dim("batch")}})
    for n in (2, 5, 7, 3):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), double_rows(x))
    assert compiles(compiled) == 1
    guards = " ".join(compiled.explain().guards[0])
    assert "x.shape[0] >= 2" in guards  # the Dim's range, guarded


def test_a_dim_s_range_is_guarded():
    compiled = fxloom.compile(double_rows, dynamic={"x": {0: Dim("batch", max=8)}})
    for n in (2, 5, 12):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), double_rows(x))
    assert compiles(compiled) == 2
    assert "x.shape[0] <= 8" in compiled.explain().recompiles[0]


def test_dynamic_takes_a_dynamic_shapes_tuple_by_position():
    def add(x, y):
        return x + y

    batch = Dim("batch")
    compiled = fxloom.compile(add, dynamic=({0: batch}, {0: batch}))
    for n in (2, 4, 6):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        torch.testing.assert_close(compiled(x, y), add(x, y))
    assert compiles(compiled) == 1


def test_a_dynamic_shapes_spec_that_does_not_fit_says_where():
    from fxloom.values.symbolic.dynamic_shapes import DynamicShapesError

    compiled = fxloom.compile(double_rows, dynamic={"y": {0: Dim("batch")}})
    with pytest.raises(DynamicShapesError, match="'y'"):
        compiled(torch.randn(3, 3))


def test_a_program_that_fixes_a_declared_dim_is_refused():
    compiled = fxloom.compile(unrolled, dynamic={"x": {0: Dim("rows")}})
    with pytest.raises(DynamicDimError, match=r"x.shape\[0\] == 3"):
        compiled(torch.randn(3, 2))


def test_a_module_s_forward_takes_a_spec_without_self():
    model = torch.nn.Linear(3, 2)
    compiled = fxloom.compile(model, dynamic={"input": {0: Dim("batch")}})
    with torch.no_grad():
        for n in (2, 5, 7):
            x = torch.randn(n, 3)
            torch.testing.assert_close(compiled(x), model(x))
    assert compiles(compiled) == 1


def test_a_static_mark_made_by_torch_dynamo_is_honoured():
    import torch._dynamo

    compiled = fxloom.compile(double_rows)
    for n in (2, 5, 7):
        x = marked(n, torch._dynamo.mark_static, 0)
        torch.testing.assert_close(compiled(x), double_rows(x))
    assert compiles(compiled) == 3


def test_mark_static_overrides_dynamic_true():
    compiled = fxloom.compile(double_rows, dynamic=True)
    for n in (2, 5):
        x = marked(n, fxloom.mark_static, 0)
        torch.testing.assert_close(compiled(x), double_rows(x))
    assert compiles(compiled) == 2
