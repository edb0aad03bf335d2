"""``fxloom.values.symbolic_scalars``: the one answer to "is this size symbolic?"."""

from __future__ import annotations

import pytest
import torch

from fxloom.values.stand_in import StandIn
from fxloom.values.symbolic import ShapeEnv, size_symint, wrap_expr
from fxloom.values.symbolic_scalars import has_symbolic_size, is_symbolic, symbolic_expr

ENV = ShapeEnv()
S0 = size_symint(ENV, 4)


def test_an_input_size_is_symbolic_and_gives_its_expression():
    assert is_symbolic(S0)
    assert symbolic_expr(2 * S0) == 2 * S0.node.expr


@pytest.mark.parametrize("value", [3, 2.5, True, None, "s0", torch.ones(2)])
def test_plain_values_are_not_symbolic(value):
    assert not is_symbolic(value)
    assert symbolic_expr(value) is None


def test_a_symbolic_scalar_fixed_to_one_number_is_not_symbolic():
    fixed = wrap_expr(ENV, S0.node.expr - S0.node.expr)
    assert isinstance(fixed, torch.SymInt)
    assert not is_symbolic(fixed)


def test_a_tensor_has_a_symbolic_size_when_one_dimension_is():
    assert has_symbolic_size(StandIn.with_sizes(torch.ones(4, 3), [S0, 3]))
    assert not has_symbolic_size(StandIn.with_sizes(torch.ones(4, 3), [4, 3]))
    assert not has_symbolic_size(torch.ones(2, 3))
