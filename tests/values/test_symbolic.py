"""fxloom's symbolic sizes: the shape environment, the node behind ``torch.SymInt``, symbolic meta.

The foundation of issue 12 (dynamic shapes), standalone: symbols and their ranges,
arithmetic and simplification, guards decided from ranges or recorded with the
example's answer and the user's line, facts learned from guards, errors for
programs that contradict a declared ``Dim``, and torch operators computing symbolic
sizes and strides on meta tensors, checked against the concrete sizes for the
example's values.
"""

from __future__ import annotations

import math

import pytest
import sympy
import torch

from fxloom.values.symbolic import (
    ConstraintViolationError,
    DataDependentGuardError,
    ShapeEnv,
    SymNode,
    size_symint,
    unbacked_symint,
    wrap_expr,
)
from fxloom.values.symbolic.meta import (
    SYMBOLIC_META_FALLBACKS,
    compute_symbolic_meta,
    python_definition,
)

aten = torch.ops.aten
THIS_FILE = __file__


def expr(value: torch.SymInt | torch.SymBool | torch.SymFloat) -> sympy.Basic:
    return value.node.expr


def line_of(text: str) -> int:
    """The line of this file that contains ``text`` (guards name the user's line)."""
    with open(THIS_FILE) as source:
        return next(number for number, line in enumerate(source, 1) if text in line)


# ---- symbols and ranges


def test_input_sizes_are_symbols_s0_s1_with_the_default_range_two_to_infinity():
    env = ShapeEnv()
    s0, s1 = size_symint(env, 4), size_symint(env, 6)
    assert (str(s0), str(s1)) == ("s0", "s1")
    assert env.range_of(expr(s0)) == (2, sympy.oo)
    assert (s0.node.hint(), s1.node.hint()) == (4, 6)


def test_a_declared_dim_gives_its_range_to_the_symbol():
    env = ShapeEnv()
    batch = size_symint(env, 4, min=1, max=64, dim_name="batch")
    assert env.range_of(expr(batch)) == (1, 64)
    assert env.symbols[expr(batch)].dim_name == "batch"


def test_an_example_value_outside_its_range_is_refused():
    with pytest.raises(
        ValueError, match=r"example's value 100 of batch lies outside its range \[2, 64\]"
    ):
        size_symint(ShapeEnv(), 100, max=64, dim_name="batch")


def test_data_dependent_values_are_symbols_i0_without_an_example_value():
    env = ShapeEnv()
    i0 = unbacked_symint(env)
    assert str(i0) == "i0"
    assert not i0.node.has_hint()
    assert env.range_of(expr(i0)) == (0, sympy.oo)


# ---- arithmetic and simplification


def test_arithmetic_builds_expressions_and_computes_the_examples_value():
    env = ShapeEnv()
    s0 = size_symint(env, 4)
    result = (s0 + 1) * 2 - s0
    assert isinstance(result, torch.SymInt)
    assert expr(result) == expr(s0) + 2
    assert result.node.hint() == 6


def test_floor_division_undoes_a_multiplication():
    s0 = size_symint(ShapeEnv(), 4)
    assert str((s0 * 2) // 2) == "s0"
    assert str(s0 * 6 // 3) == "2*s0"


def test_true_division_of_sizes_is_a_symfloat():
    s0 = size_symint(ShapeEnv(), 4)
    half = s0 / 8
    assert isinstance(half, torch.SymFloat)
    assert half.node.hint() == 0.5


def test_max_min_sum_modulo_power_and_negation():
    env = ShapeEnv()
    s0, s1 = size_symint(env, 4), size_symint(env, 6)
    assert str(torch.sym_max(s0, s1)) == "Max(s0, s1)"
    assert str(torch.sym_min(s0, 3)) == "Min(3, s0)"
    assert str(torch.sym_sum([s0, s1, 3])) == "s0 + s1 + 3"
    assert str(s0 % 3) == "Mod(s0, 3)"
    assert (s0**2).node.hint() == 16
    assert str(-s0) == "-s0"


def test_rounding_a_symfloat_gives_a_symint():
    s0 = size_symint(ShapeEnv(), 5)
    assert str(math.ceil(s0 / 2)) == "ceiling(s0/2)" and math.ceil(s0 / 2).node.hint() == 3
    assert str(torch.sym_int(s0 / 2)) == "floor(s0/2)"


def test_comparisons_are_symbools_until_asked_for_a_bool():
    env = ShapeEnv()
    s0, s1 = size_symint(env, 4), size_symint(env, 6)
    condition = s0 < s1
    assert isinstance(condition, torch.SymBool)
    assert condition.node.hint() is True
    assert env.guards == []


def test_an_expression_can_be_wrapped_with_its_hint_from_the_environment():
    env = ShapeEnv()
    s0 = size_symint(env, 4)
    doubled = wrap_expr(env, 2 * expr(s0))
    assert isinstance(doubled, torch.SymInt) and doubled.node.hint() == 8


# ---- guards


def test_a_guard_the_ranges_decide_is_answered_without_being_recorded():
    env = ShapeEnv()
    s0, s1 = size_symint(env, 4), size_symint(env, 6)
    assert s0 >= 2
    assert s0 != 1
    assert s0 * s1 != s0  # s0*(s1 - 1) >= 2: decided on the factored form
    assert not (s0 * 2 == 3)
    assert env.guards == []


def test_an_undecided_guard_records_the_examples_answer_and_the_users_line():
    env = ShapeEnv()
    s0 = size_symint(env, 4)
    if s0 > 8:  # the example says no
        raise AssertionError("unreachable for the example")
    (guard,) = env.guards
    assert guard.expr == (expr(s0) <= 8)
    assert guard.location == f"{THIS_FILE}:{line_of('if s0 > 8:')}"
    assert guard.code.startswith("if s0 > 8:")


def test_a_guards_answer_becomes_a_fact_that_narrows_the_range():
    env = ShapeEnv()
    s0 = size_symint(env, 4)
    assert s0 <= 8
    assert env.range_of(expr(s0)) == (2, 8)
    assert s0 < 100  # now decided by the range
    assert len(env.guards) == 1


def test_an_equality_guard_makes_two_symbols_one():
    env = ShapeEnv()
    s0, s1 = size_symint(env, 4, max=100), size_symint(env, 4, max=50)
    assert s0 == s1
    assert str(s1) == "s0"
    assert str(s0 + s1) == "2*s0"
    assert env.range_of(expr(s0)) == (2, 50)  # the ranges intersect
    assert {str(k): str(v) for k, v in env.replacements.items()} == {"s1": "s0"}


def test_an_equality_with_a_multiple_replaces_the_derived_size():
    env = ShapeEnv()
    s0, s1 = size_symint(env, 4), size_symint(env, 8)
    assert s1 == 2 * s0
    assert str(s1) == "2*s0"
    assert str(s1 // 2) == "s0"


def test_a_divisibility_guard_lets_floor_division_simplify():
    env = ShapeEnv()
    s0 = size_symint(env, 6)
    assert str((s0 // 2) * 2) == "2*floor(s0/2)"
    assert s0 % 2 == 0
    assert str((s0 // 2) * 2) == "s0"
    assert s0 % 2 == 0 and len(env.guards) == 1  # the fact answers it again


def test_asking_for_an_int_specialises_the_size_to_the_example():
    env = ShapeEnv()
    s0 = size_symint(env, 4)
    symbol = expr(s0)
    assert int(s0) == 4
    assert str(env.guards[0].expr) == "Eq(s0, 4)"
    assert env.range_of(symbol) == (4, 4)
    assert str(s0 + 1) == "5"


def test_a_guard_narrowing_a_declared_dim_names_the_dim_its_range_the_condition_and_the_line():
    env = ShapeEnv()
    batch = size_symint(env, 4, min=2, max=1024, dim_name="batch")
    with pytest.raises(ConstraintViolationError) as caught:
        bool(batch <= 16)  # narrows batch
    message = str(caught.value)
    assert "Dim 'batch' (s0) was declared with range [2, 1024]" in message
    assert "requires s0 <= 16" in message
    assert f"{THIS_FILE}:{line_of('# narrows batch')}" in message
    assert "Dim('batch', min=2, max=16)" in message
    assert caught.value.dim_name == "batch" and caught.value.declared == (2, 1024)


def test_a_failed_guard_leaves_the_environment_unchanged():
    env = ShapeEnv()
    batch = size_symint(env, 4, max=1024, dim_name="batch")
    with pytest.raises(ConstraintViolationError):
        bool(batch <= 16)
    assert env.guards == [] and env.range_of(expr(batch)) == (2, 1024)


def test_specialising_a_declared_dim_says_to_make_it_static():
    env = ShapeEnv()
    batch = size_symint(env, 4, dim_name="batch")
    with pytest.raises(
        ConstraintViolationError, match="specialises batch to 4; make that dimension static"
    ):
        int(batch)


def test_two_declared_dims_forced_equal_suggest_one_dim():
    env = ShapeEnv()
    batch, rows = size_symint(env, 4, dim_name="batch"), size_symint(env, 4, dim_name="rows")
    with pytest.raises(ConstraintViolationError, match="use one Dim for both sizes"):
        bool(batch == rows)


def test_divisibility_of_a_declared_dim_suggests_a_derived_dim():
    env = ShapeEnv()
    seq = size_symint(env, 6, dim_name="seq")
    with pytest.raises(ConstraintViolationError, match="derived Dim"):
        bool(seq % 2 == 0)


def test_branching_on_a_data_dependent_value_points_to_torch_check_and_cond():
    i0 = unbacked_symint(ShapeEnv())
    with pytest.raises(
        DataDependentGuardError, match=r"(?s)branches on i0 > 5.*torch._check.*fxloom.cond"
    ):
        bool(i0 > 5)


def test_torch_check_on_a_data_dependent_value_is_a_fact_and_a_deferred_assertion():
    env = ShapeEnv()
    i0 = unbacked_symint(env)
    torch._check(i0 >= 3)
    assert env.range_of(expr(i0)) == (3, sympy.oo)
    assert [str(a.expr) for a in env.deferred_assertions] == ["i0 >= 3"]
    assert i0 > 2  # decided by the fact


def test_size_oblivious_guards_take_data_dependent_sizes_as_at_least_two():
    env = ShapeEnv()
    i0 = unbacked_symint(env)
    assert (i0 == 1).node.guard_size_oblivious("", 0) is False
    assert env.guards == []


def test_guard_or_false_answers_false_for_an_undecidable_data_dependent_condition():
    env = ShapeEnv()
    i0 = unbacked_symint(env)
    assert (i0 == 7).node.guard_or_false("", 0) is False
    assert (i0 == 7).node.guard_or_true("", 0) is True
    assert env.guards == []


def test_statically_known_true_never_records_a_guard():
    env = ShapeEnv()
    s0 = size_symint(env, 4)
    assert (s0 >= 2).node.statically_known_true("", 0)
    assert not (s0 == 4).node.statically_known_true("", 0)
    assert env.guards == []


def test_rollback_on_error_undoes_guards_and_facts():
    env = ShapeEnv()
    s0 = size_symint(env, 4)
    with pytest.raises(RuntimeError), env.rollback_on_error():
        assert s0 <= 8
        raise RuntimeError("a kernel refused symbolic sizes")
    assert env.guards == [] and env.range_of(expr(s0)) == (2, sympy.oo)
    assert str(s0 * 1) == "s0"


def test_expressions_simplified_inside_a_rolled_back_block_are_simplified_again():
    env = ShapeEnv()
    s0 = size_symint(env, 4)
    with pytest.raises(RuntimeError), env.rollback_on_error():
        int(s0)  # specialises s0 to 4 ...
        assert str(s0) == "4"
        raise RuntimeError("... then the kernel refused")
    assert str(s0) == "s0"


def test_a_protocol_method_fxloom_lacks_is_a_clear_attribute_error():
    node = size_symint(ShapeEnv(), 4).node
    assert isinstance(node, SymNode)
    with pytest.raises(AttributeError, match="does not implement 'sym_log2'.*sym_node.py"):
        node.sym_log2()


# ---- symbolic sizes through torch operators on meta tensors


def meta(*sizes, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(*sizes, dtype=dtype, device="meta")


def test_torch_factory_functions_and_cpp_meta_kernels_accept_symints():
    env = ShapeEnv()
    s0 = size_symint(env, 4)
    x = torch.empty(s0, 3, device="meta")
    assert [str(size) for size in x.shape] == ["s0", "3"]
    y = aten.mm.default(x, meta(3, 5))
    assert [str(size) for size in y.shape] == ["s0", "5"]
    assert env.guards == []


# name -> (operator, arguments from (s0, s1) and a tensor factory): a transformer's operators.
TRANSFORMER_OPS = {
    "view": lambda a, b: (aten.view.default, (meta(a, b, 8), [a * b, 8])),
    "view_minus_one": lambda a, b: (aten.view.default, (meta(a, b, 8), [-1, 8])),
    "reshape_of_transpose": lambda a, b: (
        aten.reshape.default,
        (meta(a, b, 8).transpose(0, 1), [-1]),
    ),
    "permute": lambda a, b: (aten.permute.default, (meta(a, b, 8), [2, 0, 1])),
    "transpose": lambda a, b: (aten.transpose.int, (meta(a, b, 8), 0, 1)),
    "matmul": lambda a, b: (aten.matmul.default, (meta(a, b, 8), meta(8, 3))),
    "bmm": lambda a, b: (aten.bmm.default, (meta(a, b, 8), meta(a, 8, 5))),
    "addmm": lambda a, b: (aten.addmm.default, (meta(5), meta(a, 8), meta(8, 5))),
    "cat": lambda a, b: (aten.cat.default, ([meta(a, b, 8), meta(a, b, 8)], 1)),
    "expand": lambda a, b: (aten.expand.default, (meta(1, b, 8), [a, b, 8])),
    "slice": lambda a, b: (aten.slice.Tensor, (meta(a, b, 8), 1, 0, b - 1)),
    "softmax": lambda a, b: (aten._softmax.default, (meta(a, b, 8), -1, False)),
    "layer_norm": lambda a, b: (
        aten.native_layer_norm.default,
        (meta(a, b, 8), [8], meta(8), meta(8), 1e-5),
    ),
    "embedding": lambda a, b: (aten.embedding.default, (meta(10, 8), meta(a, b, dtype=torch.long))),
    "arange": lambda a, b: (aten.arange.start, (0, b), {"device": "meta"}),
    "add_broadcast": lambda a, b: (aten.add.Tensor, (meta(a, b, 8), meta(1, b, 1))),
    "mul_broadcast": lambda a, b: (aten.mul.Tensor, (meta(a, b, 8), meta(8))),
    "sum": lambda a, b: (aten.sum.dim_IntList, (meta(a, b, 8), [1])),
    "mean_keepdim": lambda a, b: (aten.mean.dim, (meta(a, b, 8), [-1], True)),
    "scaled_dot_product_attention": lambda a, b: (
        aten.scaled_dot_product_attention.default,
        (meta(a, 2, b, 4), meta(a, 2, b, 4), meta(a, 2, b, 4)),
    ),
}


def run(case, a, b):
    func, args, *kwargs = case(a, b)
    return func, args, kwargs[0] if kwargs else {}


def first_tensor(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def at_hints(sizes) -> tuple[int, ...]:
    return tuple(size.node.hint() if isinstance(size, torch.SymInt) else size for size in sizes)


@pytest.mark.parametrize("name", list(TRANSFORMER_OPS))
def test_symbolic_sizes_and_strides_match_the_concrete_ones_at_the_examples_values(name):
    env = ShapeEnv()
    s0, s1 = size_symint(env, 4), size_symint(env, 6)
    symbolic = first_tensor(compute_symbolic_meta(*run(TRANSFORMER_OPS[name], s0, s1)))
    func, args, kwargs = run(TRANSFORMER_OPS[name], 4, 6)
    concrete = first_tensor(func(*args, **kwargs))
    assert at_hints(symbolic.shape) == tuple(concrete.shape)
    assert at_hints(symbolic.stride()) == concrete.stride()
    assert any(isinstance(size, torch.SymInt) for size in symbolic.shape)  # nothing specialised
    assert env.guards == []


@pytest.mark.parametrize(
    ("name", "shape", "stride"),
    [
        ("view_minus_one", "(s0*s1, 8)", "(8, 1)"),
        ("permute", "(8, s0, s1)", "(1, 8*s1, 8)"),
        ("slice", "(s0, s1 - 1, 8)", "(8*s1, 8, 1)"),
        ("cat", "(s0, 2*s1, 8)", "(16*s1, 8, 1)"),
        ("arange", "(s1,)", "(1,)"),
    ],
)
def test_symbolic_output_shapes_are_expressions_of_the_input_symbols(name, shape, stride):
    env = ShapeEnv()
    s0, s1 = size_symint(env, 4), size_symint(env, 6)
    result = first_tensor(compute_symbolic_meta(*run(TRANSFORMER_OPS[name], s0, s1)))
    assert str(tuple(result.shape)) == shape
    assert str(result.stride()) == stride


def test_view_needs_its_python_definition_and_mm_does_not():
    assert python_definition(aten.view.default) is not None
    env = ShapeEnv()
    s0 = size_symint(env, 4)
    # view's C++ kernel calls numel(); the decomposition (torch._refs) computes it symbolically.
    assert str(compute_symbolic_meta(aten.view.default, (meta(s0, 6), [-1]), {}).shape[0]) == "6*s0"


def test_a_user_fallback_is_used_before_the_cpp_kernel(monkeypatch):
    calls = []

    def my_view(tensor, shape):
        calls.append(shape)
        return torch._refs.view(tensor, shape)

    monkeypatch.setitem(SYMBOLIC_META_FALLBACKS, aten.view.default, my_view)
    s0 = size_symint(ShapeEnv(), 4)
    compute_symbolic_meta(aten.view.default, (meta(s0, 6), [-1]), {})
    assert calls == [[-1]]


def evaluated(sizes, values: dict) -> tuple[int, ...]:
    """Sizes (ints or SymInts) with their symbols set to ``values`` (symbol name -> int)."""
    result = []
    for size in sizes:
        if isinstance(size, torch.SymInt):
            expression = size.node.expr
            size = int(expression.subs({s: values[s.name] for s in expression.free_symbols}))
        result.append(size)
    return tuple(result)


@pytest.fixture(scope="module")
def torch_fake_results():
    """torch's own answer for TRANSFORMER_OPS: fake tensors over torch's ShapeEnv (the comparison)."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic
    from torch.fx.experimental.symbolic_shapes import ShapeEnv as TorchShapeEnv

    torch_env = TorchShapeEnv()
    a = torch_env.create_unspecified_symint_and_symbol(4, ConstantSource("a"), DimDynamic.DYNAMIC)
    b = torch_env.create_unspecified_symint_and_symbol(6, ConstantSource("b"), DimDynamic.DYNAMIC)
    names = {str(a): "s0", str(b): "s1"}
    results = {}
    # The cases build their tensors with `meta`; under FakeTensorMode, torch's fake tensors.
    with FakeTensorMode(shape_env=torch_env), pytest.MonkeyPatch.context() as patch:
        patch.setitem(
            globals(), "meta", lambda *sizes, dtype=torch.float32: torch.empty(*sizes, dtype=dtype)
        )
        for name, case in TRANSFORMER_OPS.items():
            func, args, kwargs = run(case, a, b)
            kwargs = {key: "cpu" if value == "meta" else value for key, value in kwargs.items()}
            results[name] = first_tensor(func(*args, **kwargs))
    return results, names


@pytest.mark.parametrize("name", list(TRANSFORMER_OPS))
def test_symbolic_sizes_and_strides_agree_with_torchs_fake_tensors_at_other_sizes(
    name, torch_fake_results
):
    torch_results, torch_names = torch_fake_results
    env = ShapeEnv()
    s0, s1 = size_symint(env, 4), size_symint(env, 6)
    ours = first_tensor(compute_symbolic_meta(*run(TRANSFORMER_OPS[name], s0, s1)))
    theirs = torch_results[name]
    for values in ({"s0": 4, "s1": 6}, {"s0": 3, "s1": 5}, {"s0": 9, "s1": 2}):
        torch_values = {symbol: values[ours_name] for symbol, ours_name in torch_names.items()}
        assert evaluated(ours.shape, values) == evaluated(theirs.shape, torch_values)
        assert evaluated(ours.stride(), values) == evaluated(theirs.stride(), torch_values)
