"""Call-time checks of symbolic sizes: size trees, ``check_tensor`` and ``check_sizes``.

An exported module whose inputs have symbolic sizes (stand-ins with
``torch.SymInt`` sizes as placeholder ``meta["val"]``) checks, on every call,
that each input's sizes fit what the program assumed: symbols in their ranges,
equal sizes equal, derived sizes derived. The stand-ins are built directly
here, as export's capture makes them.
"""

from __future__ import annotations

import copy
import pickle
from fractions import Fraction

import pytest
import sympy
import torch

from fxloom._notes import message_of
from fxloom.export.input_checks import add_input_check, add_size_check
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.runtime_checks import check_tensor
from fxloom.values.stand_in import StandIn
from fxloom.values.symbolic import ShapeEnv, size_symint
from fxloom.values.symbolic.size_trees import (
    SizeTreeError,
    evaluate_condition,
    evaluate_size,
    exact_value,
    size_text,
    size_tree,
)

s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)

# ----------------------------------------------------------------------- size trees


@pytest.mark.parametrize(
    ("expr", "tree"),
    [
        (s0, "s0"),
        (sympy.Integer(7), 7),
        (2 * s0 + 1, ("add", ("mul", 2, "s0"), 1)),
        (s0 * s1, ("mul", "s0", "s1")),
        (s0 / 2, ("mul", ("frac", 1, 2), "s0")),
        (sympy.floor(s0 / 4), ("floordiv", "s0", 4)),
        (sympy.floor((s0 + 1) / 2), ("floordiv", ("add", "s0", 1), 2)),
        (sympy.ceiling(s0 / 3), ("ceiling", ("mul", ("frac", 1, 3), "s0"))),
        (sympy.Mod(s0, 4), ("mod", "s0", 4)),
        (sympy.Max(s0, s1), ("max", "s0", "s1")),
        (sympy.Min(s0, 3), ("min", 3, "s0")),
        (s0**2, ("pow", "s0", 2)),
    ],
)
def test_sizes_encode_as_nested_tuples_of_ints_and_strings(expr, tree):
    assert size_tree(expr) == tree


@pytest.mark.parametrize(
    "expr",
    [
        2 * s0 + 1,
        s0 * s1 - 3,
        3 * s0 / 2,
        sympy.floor((3 * s0 + s1) / 4),
        sympy.ceiling(s0 / 3),
        sympy.Mod(s0 + s1, 4),
        sympy.Max(s0, 2 * s1),
        sympy.Min(s0, s1 - 1),
        s0**2 * s1,
        s0 / s1,
    ],
)
def test_a_size_tree_evaluates_exactly_as_sympy_does(expr):
    for a, b in [(2, 3), (7, 5), (64, 9)]:
        expected = Fraction(str(expr.subs({s0: a, s1: b})))
        assert exact_value(size_tree(expr), {"s0": a, "s1": b}) == expected


def test_evaluate_size_gives_an_int_and_refuses_a_fraction():
    assert evaluate_size(size_tree(3 * s0 / 2), {"s0": 4}) == 6
    with pytest.raises(ValueError, match="3\\*s0/2 is 9/2, not an integer"):
        evaluate_size(size_tree(3 * s0 / 2), {"s0": 3})


def test_an_expression_no_tree_encodes_is_refused_saying_where_to_add_it():
    with pytest.raises(SizeTreeError, match="uses Piecewise.*size_trees.ENCODERS"):
        size_tree(sympy.Piecewise((s0, s0 > 2), (1, True)))


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        (2 * s0 + 1, "2*batch + 1"),
        (s0 - 1, "batch - 1"),
        (3 * s0 / 2, "3*batch/2"),
        (sympy.floor((s0 + 1) / 2), "(batch + 1)//2"),
        (sympy.Mod(s0, 4), "batch % 4"),
        (sympy.Max(s0, s1), "max(batch, s1)"),
    ],
)
def test_a_size_tree_prints_with_the_users_dim_names(expr, text):
    assert size_text(size_tree(expr), {"s0": "batch"}) == text


@pytest.mark.parametrize(
    ("condition", "tree", "text"),
    [
        (sympy.Eq(sympy.Mod(s0, 2), 0), ("eq", ("mod", "s0", 2), 0), "s0 % 2 == 0"),
        (sympy.Ne(s0, 1), ("ne", "s0", 1), "s0 != 1"),
        (s0 < s1, ("lt", "s0", "s1"), "s0 < s1"),
        (
            sympy.And(s0 >= 3, s1 <= 10),
            ("and", ("ge", "s0", 3), ("le", "s1", 10)),
            "s0 >= 3 and s1 <= 10",
        ),
    ],
)
def test_conditions_on_sizes_encode_evaluate_and_print_too(condition, tree, text):
    assert size_tree(condition) == tree
    assert size_text(tree) == text
    for a, b in [(2, 3), (3, 11), (8, 5)]:
        assert evaluate_condition(tree, {"s0": a, "s1": b}) == bool(condition.subs({s0: a, s1: b}))


# ----------------------------------------------------------------------- check_tensor


def test_check_tensor_lets_a_symbolic_dimension_take_any_size():
    check_tensor(torch.ones(9, 3), ("s0", 3), torch.float32, "x")


def test_check_tensor_names_a_static_dimension_that_differs_and_how_to_make_it_dynamic():
    with pytest.raises(ValueError) as error:
        check_tensor(torch.ones(9, 4), ("s0", 3), torch.float32, "x")
    assert message_of(error.value) == (
        "input 'x': the program was exported for shape [s0, 3], got [9, 4] (dimension 1: 4 "
        "instead of 3); export again with an example of this shape, or declare this dimension "
        "dynamic with dynamic_shapes"
    )


def test_check_tensor_refuses_another_rank():
    with pytest.raises(ValueError) as error:
        check_tensor(torch.ones(9), ("s0", 3), torch.float32, "x")
    assert message_of(error.value) == (
        "input 'x': the program was exported for shape [s0, 3], got [9]; export again with an "
        "example of this shape"
    )


# ----------------------------------------------------------------------- check_sizes


def stand_in(*sizes) -> StandIn:
    """A stand-in of ``sizes`` (ints or SymInts), contiguous, as export's capture makes them."""
    strides, step = [], 1
    for size in reversed(sizes):
        strides.insert(0, step)
        step = step * size
    meta = torch.empty_strided(sizes, strides, device="meta")
    return StandIn(meta, torch.device("cpu"))


def checked_module(env: ShapeEnv, **vals) -> GraphModule:
    """A module taking ``vals``' inputs, running the input checks export's module() runs."""
    graph = Graph()
    placeholders = [graph.placeholder(name) for name in vals]
    for placeholder, val in zip(placeholders, vals.values()):
        placeholder.meta["val"] = val
        add_input_check(graph, placeholder, val)
    ranges = {s: (info.lower, info.upper, info.dim_name) for s, info in env.symbols.items()}
    add_size_check(graph, placeholders, list(vals.values()), ranges)
    graph.output(tuple(placeholders))
    return GraphModule(torch.nn.Module(), graph)


@pytest.fixture
def batch_and_seq():
    """x: [batch, seq], y: [batch, 2*seq + 1], with batch in [2, 64] and seq unbounded."""
    env = ShapeEnv()
    batch = size_symint(env, 4, dim_name="batch", min=2, max=64)
    seq = size_symint(env, 3, dim_name="seq")
    return checked_module(env, x=stand_in(batch, seq), y=stand_in(batch, 2 * seq + 1))


def test_inputs_whose_sizes_fit_the_program_pass(batch_and_seq):
    batch_and_seq(torch.ones(4, 3), torch.ones(4, 7))
    batch_and_seq(torch.ones(64, 10), torch.ones(64, 21))


def test_a_size_the_program_ties_to_another_must_equal_it(batch_and_seq):
    with pytest.raises(ValueError) as error:
        batch_and_seq(torch.ones(4, 3), torch.ones(5, 7))
    assert message_of(error.value) == (
        "input 'y': dimension 0 is 5, but the program needs it equal to dimension 0 of input "
        "'x' (batch = 4)"
    )


def test_a_derived_size_must_be_what_the_program_computes(batch_and_seq):
    with pytest.raises(ValueError) as error:
        batch_and_seq(torch.ones(4, 3), torch.ones(4, 8))
    assert message_of(error.value) == (
        "input 'y': dimension 1 is 8, but the program needs 2*seq + 1 = 7 (seq from input 'x' "
        "dimension 1)"
    )


def test_a_size_outside_its_dims_range_is_refused(batch_and_seq):
    with pytest.raises(ValueError) as error:
        batch_and_seq(torch.ones(1, 3), torch.ones(1, 7))
    assert (
        message_of(error.value)
        == "input 'x': dimension 0 is 1, outside the range of Dim 'batch' [2, 64]"
    )
    with pytest.raises(ValueError, match=r"dimension 0 is 65, outside the range of Dim 'batch'"):
        batch_and_seq(torch.ones(65, 3), torch.ones(65, 7))


def test_a_size_without_a_dim_name_is_refused_by_its_range():
    env = ShapeEnv()
    module = checked_module(env, x=stand_in(size_symint(env, 4), 3))
    with pytest.raises(ValueError) as error:
        module(torch.ones(1, 3))
    assert message_of(error.value) == (
        "input 'x': dimension 0 is 1, outside the range [2, inf] the program was exported for"
    )


def test_the_per_input_check_comes_first_for_static_dimensions(batch_and_seq):
    with pytest.raises(ValueError, match="exported for shape \\[s0, s1\\], got \\[4, 3, 1\\]"):
        batch_and_seq(torch.ones(4, 3, 1), torch.ones(4, 7))


def test_a_symbol_met_only_in_a_derived_size_is_solved_from_it():
    env = ShapeEnv()
    half = size_symint(env, 3, dim_name="half", min=2, max=8)
    module = checked_module(env, y=stand_in(2 * half))
    module(torch.ones(16))
    with pytest.raises(ValueError) as error:
        module(torch.ones(7))
    assert message_of(error.value) == (
        "input 'y': dimension 0 is 7, but the program needs it to be 2*half for an integer "
        "half >= 0"
    )
    with pytest.raises(ValueError) as error:
        module(torch.ones(18))
    assert message_of(error.value) == (
        "input 'y': dimension 0 is 18, which makes half = 9, outside the range of Dim 'half' [2, 8]"
    )


def test_a_derived_size_met_before_its_root_is_checked_after_it():
    env = ShapeEnv()
    seq = size_symint(env, 3, dim_name="seq")
    module = checked_module(env, y=stand_in(seq + 1), x=stand_in(seq))
    with pytest.raises(ValueError) as error:
        module(torch.ones(5), torch.ones(3))
    assert message_of(error.value) == (
        "input 'y': dimension 0 is 5, but the program needs seq + 1 = 4 (seq from input 'x' "
        "dimension 0)"
    )


def test_a_program_without_symbolic_sizes_gets_no_size_check():
    graph = Graph()
    x = graph.placeholder("x")
    assert add_size_check(graph, [x], [stand_in(4, 3)], {}) is None
    assert len(graph.nodes) == 1


def test_non_tensor_inputs_are_skipped():
    env = ShapeEnv()
    module = checked_module(env, x=stand_in(size_symint(env, 4)), n=3)
    module(torch.ones(5), 3)
    assert "check_sizes((x,), ('x',)" in module.code


def test_a_size_no_input_determines_is_refused_when_the_check_is_built():
    env = ShapeEnv()
    a, b = size_symint(env, 2), size_symint(env, 3)
    with pytest.raises(
        ValueError, match="dimension 0 has the size s0\\*s1, whose symbols no input"
    ):
        checked_module(env, x=stand_in(a * b))


def test_the_generated_code_shows_the_checks_readably(batch_and_seq):
    lines = [line.strip() for line in batch_and_seq.code.splitlines()]
    assert "check_tensor(x, ('s0', 's1'), torch.float32, 'x')" in lines
    assert "check_tensor(y, ('s0', '2*s1 + 1'), torch.float32, 'y')" in lines
    (sizes,) = [line for line in lines if line.startswith("check_sizes(")]
    assert sizes.startswith(
        "check_sizes((x, y), ('x', 'y'), ((0, 0, 's0'), (0, 1, 's1'), (1, 0, 's0'), "
        "(1, 1, ('add', ('mul', 2, 's1'), 1))), (('s0', 2, 64, 'batch'), ('s1', 2, None, 'seq')))"
    )


def test_the_size_check_survives_dead_code_elimination(batch_and_seq):
    batch_and_seq.graph.eliminate_dead_code()
    batch_and_seq.recompile()
    with pytest.raises(ValueError, match="equal to dimension 0 of input 'x'"):
        batch_and_seq(torch.ones(4, 3), torch.ones(5, 7))


@pytest.mark.parametrize(
    "clone", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))], ids=["deepcopy", "pickle"]
)
def test_the_size_check_survives_copying_the_module(batch_and_seq, clone):
    copied = clone(batch_and_seq)
    copied(torch.ones(4, 3), torch.ones(4, 7))
    with pytest.raises(ValueError, match="2\\*seq \\+ 1 = 7"):
        copied(torch.ones(4, 3), torch.ones(4, 8))
