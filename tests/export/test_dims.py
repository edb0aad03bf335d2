"""``Dim`` and ``dynamic_shapes``: how users declare dynamic dimensions, and how export reads them.

``Dim`` arithmetic and hints are compared with torch.export's side by side;
``resolve_dynamic_shapes`` turns the argument into one ``{dimension: Dim}`` per
input leaf and refuses every mistake with a message naming the input.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
import torch.export

from fxloom import pytree
from fxloom.export import DerivedDim, Dim, DimHint, DynamicShapesError, dims
from fxloom.values.symbolic.dynamic_shapes import resolve_dynamic_shapes, symbol_range

# ----------------------------------------------------------------------- Dim


def test_a_dim_has_a_name_and_an_inclusive_range():
    batch = Dim("batch", min=2, max=1024)
    assert (batch.__name__, batch.min, batch.max) == ("batch", 2, 1024)
    assert repr(batch) == "Dim('batch', min=2, max=1024)"


def test_a_dim_without_bounds_ranges_from_zero_without_an_upper_bound():
    seq = Dim("seq")
    assert (seq.min, seq.max) == (0, None)
    assert repr(seq) == "Dim('seq')"


def test_a_dim_name_must_be_an_identifier_and_its_range_not_empty():
    with pytest.raises(ValueError, match="identifier"):
        Dim("two words")
    with pytest.raises(ValueError, match=r"the range \[8, 4\] is empty"):
        Dim("n", min=8, max=4)
    with pytest.raises(ValueError, match="non-negative"):
        Dim("n", min=-1)


def test_dims_makes_one_dim_per_name_with_a_shared_range():
    batch, seq = dims("batch", "seq", min=2, max=64)
    theirs = torch.export.dims("batch", "seq", min=2, max=64)
    assert [(d.__name__, d.min, d.max) for d in (batch, seq)] == [
        (d.__name__, d.min, d.max) for d in theirs
    ]


def test_dims_are_equal_by_identity():
    assert Dim("n") != Dim("n")
    n = Dim("n")
    assert n == n and len({n, n}) == 1


# ----------------------------------------------------------------------- derived dims


@pytest.mark.parametrize(
    "make",
    [
        lambda d: 2 * d,
        lambda d: d * 2,
        lambda d: d + 1,
        lambda d: 1 + d,
        lambda d: d - 1,
        lambda d: 2 * d + 1,
        lambda d: 3 * (d + 1),
        lambda d: (d * 2) * 3 - 4,
    ],
)
def test_derived_dims_are_named_and_ranged_as_torch_export_does(make):
    ours, theirs = make(Dim("seq", min=5, max=100)), make(torch.export.Dim("seq", min=5, max=100))
    assert (ours.__name__, ours.min, ours.max) == (theirs.__name__, theirs.min, theirs.max)
    assert repr(ours) == repr(theirs)


def test_a_derived_dim_is_a_linear_function_of_one_root_dim():
    seq = Dim("seq", min=2, max=10)
    derived = 2 * (seq + 1) - 3
    assert isinstance(derived, DerivedDim) and isinstance(derived, Dim)
    assert (derived.root, derived.coefficient, derived.offset) == (seq, 2, -1)
    assert (derived.__name__, derived.min, derived.max) == ("2*seq - 1", 3, 19)


def test_a_derived_dim_of_an_unbounded_root_is_unbounded():
    assert (Dim("seq") + 1).max is None


def test_a_derived_dim_tells_the_root_value_of_a_size():
    twice_plus_one = 2 * Dim("seq") + 1
    assert twice_plus_one.of(4) == 9
    assert twice_plus_one.root_value(9) == 4
    assert twice_plus_one.root_value(8) is None


def test_a_derived_dim_below_zero_says_which_min_to_declare():
    with pytest.raises(ValueError, match=r"declare Dim\('seq', min=1\)"):
        _ = (Dim("seq") - 1).min


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d * d, "got a Dim"),
        (lambda d: d * 1.5, "got a float"),
        (lambda d: d + True, "got a bool"),
        (lambda d: d * 0, "the factor must be >= 1"),
        (lambda d: d * -2, "the factor must be >= 1"),
        (lambda d: 4 - d, "decreases as seq grows"),
        (lambda d: d / 2, r"seq / 2: only Dim \* positive int"),
        (lambda d: d // 2, r"seq // 2: only Dim \* positive int"),
    ],
)
def test_arithmetic_that_is_not_increasing_and_linear_is_a_type_error(make, message):
    with pytest.raises(TypeError, match=message):
        make(Dim("seq"))


# ----------------------------------------------------------------------- hints


def test_the_hints_exist_as_in_torch_export():
    for name in ("AUTO", "STATIC", "DYNAMIC"):
        assert hasattr(torch.export.Dim, name)
        hint = getattr(Dim, name)
        assert isinstance(hint, DimHint) and hint.kind == name
        assert repr(hint) == f"Dim.{name}"


def test_a_hint_takes_a_range_when_called():
    hint = Dim.DYNAMIC(min=4, max=64)
    assert (hint.kind, hint.min, hint.max) == ("DYNAMIC", 4, 64)
    assert repr(hint) == "Dim.DYNAMIC(min=4, max=64)"
    assert Dim.AUTO() == Dim.AUTO


# ----------------------------------------------------------------------- resolution


def resolve(inputs: dict, dynamic_shapes):
    return resolve_dynamic_shapes(list(inputs), list(inputs.values()), dynamic_shapes)


def test_no_dynamic_shapes_gives_every_leaf_an_empty_dict():
    assert resolve({"x": torch.ones(2), "n": 3}, None) == [{}, {}]


def test_a_dict_keyed_by_parameter_names_may_leave_inputs_out():
    batch = Dim("batch")
    inputs = {"x": torch.ones(4, 3), "y": torch.ones(4)}
    assert resolve(inputs, {"x": {0: batch}}) == [{0: batch}, {}]


def test_a_tuple_gives_one_entry_per_parameter_in_order():
    batch = Dim("batch")
    inputs = {"x": torch.ones(4, 3), "y": torch.ones(4)}
    assert resolve(inputs, (None, (batch,))) == [{}, {0: batch}]


def test_a_list_per_tensor_gives_one_entry_per_dimension():
    batch, seq = Dim("batch"), Dim("seq")
    assert resolve({"x": torch.ones(4, 5, 6)}, {"x": [batch, None, seq]}) == [{0: batch, 2: seq}]


def test_negative_dimensions_count_from_the_end():
    seq = Dim("seq")
    assert resolve({"x": torch.ones(4, 5)}, {"x": {-1: seq}}) == [{1: seq}]


def test_static_entries_are_left_out():
    inputs = {"x": torch.ones(4, 5, 6)}
    assert resolve(inputs, {"x": {0: None, 1: Dim.STATIC, 2: 6}}) == [{}]


def test_nested_inputs_are_matched_leaf_by_leaf_in_export_order():
    batch = Dim("batch")
    inputs = {"inputs": {"mask": torch.ones(4, 2), "ids": torch.ones(4, 2)}, "scale": 2.0}
    resolved = resolve(inputs, {"inputs": {"ids": {0: batch}}})
    leaves, _ = pytree.tree_flatten(inputs["inputs"])
    assert leaves[1] is inputs["inputs"]["ids"]
    assert resolved == [{}, {0: batch}, {}]


Pair = collections.namedtuple("Pair", ["left", "right"])


@pytree.register_dataclass
@dataclasses.dataclass
class Batch:
    tokens: torch.Tensor
    lengths: torch.Tensor


def test_named_tuples_and_dataclasses_take_a_tuple_or_their_own_type():
    batch = Dim("batch")
    pair = Pair(torch.ones(4), torch.ones(4))
    assert resolve({"p": pair}, {"p": (None, {0: batch})}) == [{}, {0: batch}]
    data = Batch(torch.ones(4, 7), torch.ones(4))
    assert resolve({"b": data}, {"b": Batch({0: batch}, None)}) == [{0: batch}, {}]
    assert resolve({"b": data}, {"b": [None, {0: batch}]}) == [{}, {0: batch}]


def test_star_args_and_kwargs_are_nested_like_their_values():
    batch = Dim("batch")
    inputs = {"args": (torch.ones(4), torch.ones(4)), "kwargs": {"mask": torch.ones(4)}}
    shapes = {"args": (None, {0: batch}), "kwargs": {"mask": {0: batch}}}
    assert resolve(inputs, shapes) == [{}, {0: batch}, {0: batch}]


def test_hints_are_kept_for_export_to_decide():
    inputs = {"x": torch.ones(4, 5)}
    assert resolve(inputs, {"x": (Dim.AUTO, Dim.DYNAMIC)}) == [{0: Dim.AUTO, 1: Dim.DYNAMIC}]


def test_auto_leaves_an_example_size_of_one_static():
    assert resolve({"x": torch.ones(1, 5)}, {"x": (Dim.AUTO, Dim.AUTO)}) == [{1: Dim.AUTO}]


def test_a_dim_of_the_same_name_and_range_is_the_first_one_as_in_torch_export():
    first, second = Dim("batch"), Dim("batch")
    inputs = {"x": torch.ones(4), "y": torch.ones(4)}
    resolved = resolve(inputs, {"x": {0: first}, "y": {0: 2 * second - 4}})
    assert resolved[0][0] is first and resolved[1][0].root is first


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (Dim("batch"), (2, None)),
        (Dim("batch", min=0, max=64), (2, 64)),
        (Dim("batch", min=8, max=64), (8, 64)),
        (2 * Dim("seq", min=3, max=9) + 1, (3, 9)),
        (Dim.AUTO, (2, None)),
        (Dim.DYNAMIC(max=16), (2, 16)),
    ],
)
def test_a_dynamic_dimension_symbol_ranges_from_two_or_the_declared_min(spec, expected):
    assert symbol_range(spec) == expected


# ----------------------------------------------------------------------- mistakes


def test_an_unknown_name_is_refused_with_the_inputs_listed():
    with pytest.raises(DynamicShapesError) as error:
        resolve({"x": torch.ones(2), "y": torch.ones(2)}, {"z": {0: Dim("n")}})
    assert str(error.value) == (
        "dynamic_shapes names 'z', which forward does not take (its inputs are 'x', 'y'); "
        "key dynamic_shapes by forward's parameter names"
    )


def test_too_many_entries_are_refused():
    with pytest.raises(DynamicShapesError, match="has 2 entries, but forward takes 1 inputs"):
        resolve({"x": torch.ones(2)}, (None, None))


def test_a_structure_unlike_the_input_names_where_they_part():
    with pytest.raises(DynamicShapesError) as error:
        resolve({"pair": (torch.ones(2), torch.ones(2))}, {"pair": {0: Dim("n")}})
    assert str(error.value) == (
        "input 'pair' is a tuple of 2, but its dynamic_shapes entry is {0: Dim('n')}; nest the "
        "entry like the input: a tuple or list of 2 entries (None for a static part)"
    )


def test_a_dict_input_names_the_key_the_entry_lacks():
    with pytest.raises(DynamicShapesError, match=r"input 'inputs' has no key 'idz'"):
        resolve({"inputs": {"ids": torch.ones(2)}}, {"inputs": {"idz": {0: Dim("n")}}})


def test_a_mistake_inside_a_dict_input_names_the_key():
    with pytest.raises(
        DynamicShapesError, match=r"""input 'inputs\["ids"\]': dynamic_shapes names dimension 2"""
    ):
        resolve({"inputs": {"ids": torch.ones(4, 2)}}, {"inputs": {"ids": {2: Dim("n")}}})


def test_a_dimension_the_tensor_lacks_is_refused():
    with pytest.raises(DynamicShapesError) as error:
        resolve({"x": torch.ones(4, 2)}, {"x": {2: Dim("n")}})
    assert str(error.value) == (
        "input 'x': dynamic_shapes names dimension 2, but the example has 2 dimensions "
        "(shape [4, 2]); use an index in [-2, 1]"
    )


def test_a_list_of_the_wrong_length_is_refused():
    with pytest.raises(DynamicShapesError, match="gives 1 entries, but the example has 2"):
        resolve({"x": torch.ones(4, 2)}, {"x": [Dim("n")]})


def test_a_bare_dim_for_a_tensor_says_to_give_a_dict():
    with pytest.raises(DynamicShapesError, match=r"give a dict \{dimension: Dim\}"):
        resolve({"x": torch.ones(4)}, {"x": Dim("n")})


def test_a_spec_on_a_value_that_is_not_a_tensor_is_refused():
    with pytest.raises(DynamicShapesError) as error:
        resolve({"n": 4}, {"n": Dim("n")})
    assert str(error.value) == (
        "input 'n': dynamic_shapes gives Dim('n') for a int, but only tensor dimensions can be "
        "dynamic (export fixes other inputs to the example's value); give None here"
    )


def test_a_spec_of_an_unknown_kind_is_refused():
    with pytest.raises(DynamicShapesError, match="gives 'batch' for dimension 0; each"):
        resolve({"x": torch.ones(4)}, {"x": {0: "batch"}})


def test_an_int_spec_must_be_the_example_size():
    with pytest.raises(DynamicShapesError, match="fixes dimension 0 to 3, but it is 4"):
        resolve({"x": torch.ones(4)}, {"x": {0: 3}})


def test_an_example_outside_the_dim_range_is_refused():
    with pytest.raises(DynamicShapesError) as error:
        resolve({"x": torch.ones(4)}, {"x": {0: Dim("batch", min=5)}})
    assert str(error.value) == (
        "input 'x': dimension 0 is 4 in the example, outside the range [5, inf] of Dim "
        "'batch'; pass an example inside the range, or declare the Dim's range to include it"
    )


@pytest.mark.parametrize("spec", [Dim("batch"), Dim.DYNAMIC])
def test_an_example_size_of_one_cannot_stand_for_a_dynamic_dimension(spec):
    with pytest.raises(DynamicShapesError) as error:
        resolve({"x": torch.ones(1, 3)}, {"x": {0: spec}})
    what = "Dim 'batch'" if isinstance(spec, Dim) else "Dim.DYNAMIC"
    assert str(error.value) == (
        f"input 'x': dimension 0 is 1 in the example, but {what} makes it dynamic: sizes 0 and "
        "1 are special-cased by operators (broadcasting, empty tensors), so an example of that "
        "size cannot stand for the others; pass an example with this dimension of size 2 or "
        "more, or use Dim.AUTO to let export keep it static"
    )


def test_an_example_outside_a_hint_range_is_refused():
    with pytest.raises(DynamicShapesError, match=r"outside the range \[8, inf\] of Dim.AUTO"):
        resolve({"x": torch.ones(4)}, {"x": {0: Dim.AUTO(min=8)}})


def test_one_dim_with_two_example_sizes_names_both_inputs():
    batch = Dim("batch")
    with pytest.raises(DynamicShapesError) as error:
        resolve({"x": torch.ones(4), "y": torch.ones(3)}, {"x": {0: batch}, "y": {0: batch}})
    assert str(error.value) == (
        "Dim 'batch' is dimension 0 of input 'x' (4 in the example) and dimension 0 of input "
        "'y' (3 in the example); one Dim is one size, so the examples must agree: pass examples "
        "where these dimensions are equal, or use two Dims"
    )


def test_a_derived_dim_needs_an_example_of_its_form():
    seq = Dim("seq")
    with pytest.raises(DynamicShapesError) as error:
        resolve({"y": torch.ones(7)}, {"y": {0: 2 * seq}})
    assert str(error.value) == (
        "input 'y': dimension 0 is 7 in the example, declared 2*seq, which no integer seq "
        "gives; pass an example of that form"
    )


def test_a_derived_dim_must_agree_with_its_root_example_wherever_it_comes():
    seq = Dim("seq")
    inputs = {"y": torch.ones(8), "x": torch.ones(2, 4)}
    with pytest.raises(DynamicShapesError) as error:
        resolve(inputs, {"y": {0: 2 * seq + 1}, "x": {1: seq}})
    assert str(error.value) == (
        "input 'y': dimension 0 is 8 in the example, declared 2*seq + 1, but seq is 4 "
        "(dimension 1 of input 'x'), which makes it 9; pass examples that keep this relation"
    )


def test_a_derived_dim_whose_root_value_leaves_the_root_range_is_refused():
    seq = Dim("seq", min=8, max=64)
    with pytest.raises(
        DynamicShapesError, match=r"which makes seq = 4, but Dim 'seq' has the range \[8, 64\]"
    ):
        resolve({"y": torch.ones(9)}, {"y": {0: 2 * seq + 1}})


def test_two_different_dims_of_one_name_are_refused():
    inputs = {"x": torch.ones(4), "y": torch.ones(4)}
    with pytest.raises(DynamicShapesError) as error:
        resolve(inputs, {"x": {0: Dim("n", max=8)}, "y": {0: Dim("n", max=16)}})
    assert str(error.value) == (
        "two different Dims are named 'n': Dim('n', max=8) and Dim('n', max=16); use one Dim "
        "object for dimensions that are equal, or give them different names"
    )


def test_dynamic_shapes_of_another_type_is_refused():
    with pytest.raises(DynamicShapesError, match="got a str"):
        resolve({"x": torch.ones(4)}, "x")


class TwoInputs(torch.nn.Module):
    def forward(self, x, y):
        return x.sum() + y.sum()


@pytest.mark.parametrize(
    ("shapes", "make_spec"),
    [
        (((4,), (3,)), lambda D: (lambda b: {"x": {0: b}, "y": {0: b}})(D("b"))),
        (((4,), (8,)), lambda D: (lambda b: {"x": {0: b}, "y": {0: 2 * b + 1}})(D("b"))),
        (((4,), (3,)), lambda D: {"x": {0: D("b", min=5)}, "y": None}),
        (((1,), (3,)), lambda D: {"x": {0: D.DYNAMIC}, "y": None}),
        (((4,), (3,)), lambda D: {"z": {0: D("b")}}),
    ],
    ids=["one-dim-two-sizes", "derived-off-its-root", "outside-range", "dynamic-size-one", "name"],
)
def test_mistakes_torch_export_refuses_are_refused_before_capture(shapes, make_spec):
    inputs = {"x": torch.ones(shapes[0]), "y": torch.ones(shapes[1])}
    with pytest.raises(Exception):  # noqa: B017 (torch raises several types)
        torch.export.export(
            TwoInputs(), tuple(inputs.values()), dynamic_shapes=make_spec(torch.export.Dim)
        )
    with pytest.raises(DynamicShapesError):
        resolve(inputs, make_spec(Dim))
