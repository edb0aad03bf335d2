"""fxloom.compile and aliased inputs: which arguments are the same object, or share storage.

An entry is compiled for the identity relations of the call that compiled it: two sources of
one tensor share one graph input, and the program's own ``x is y`` is decided on the objects
it saw. So the entry guards them — ``y is x`` where one object came twice, ``x is not y``
where they differed — and, where its graph writes to a tensor, that inputs which shared no
storage still share none (``x and y share no storage``) and that views of one base share it
exactly as they did. A call with other relations misses and compiles its own entry; a call
with the same relations reuses it.

Every call below is compared with plain Python: the result, the exception raised, and the
arguments' values after the call (in-place ops write through aliases).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import fxloom

pytestmark = pytest.mark.usefixtures("one_thread")


def add_scaled(x, y):
    return x + y * 2


def bump_then_read(x, y):
    x.add_(1)
    return y * 2


def scale_then_add(x, y):
    y.mul_(2)
    return x + y


def same_object_test(x, y):
    return x * 2 if x is y else x - y


# ----------------------------------------------------------------------------- helpers
# Each call's arguments are built fresh from a description, once for the plain run and once
# for the compiled one, so both start from the same values and the same aliasing.
def _pool():
    return {"a": torch.arange(1.0, 5.0), "b": torch.full((4,), 3.0)}


VIEWS = {
    "a": lambda pool: pool["a"],
    "b": lambda pool: pool["b"],
    "a.view": lambda pool: pool["a"].view(4),
    "a[:]": lambda pool: pool["a"][:],
    "a.detach": lambda pool: pool["a"].detach(),  # shares a's storage, no _base
    "a[2:]": lambda pool: pool["a"][2:],  # another shape: the ops raise
}


def _call(fn, names):
    pool = _pool()
    args = [VIEWS[name](pool) for name in names]
    try:
        result, error = fn(*args), None
    except RuntimeError as raised:
        result, error = None, raised
    return result, error, pool


def assert_same_as_python(compiled, fn, names):
    """One call of ``compiled`` on the arguments ``names`` agrees with ``fn`` run plainly."""
    want, want_error, want_pool = _call(fn, names)
    got, got_error, got_pool = _call(compiled, names)
    assert type(got_error) is type(want_error), (names, got_error, want_error)
    if want_error is None:
        assert torch.equal(got, want), (names, got, want)
    for key in want_pool:  # what the call wrote through its arguments
        assert torch.equal(got_pool[key], want_pool[key]), (names, key)


def guard_texts(compiled):
    return [text for entry in compiled.explain().guards for text in entry]


# ----------------------------------------------------------------------------- the issue
def test_one_tensor_twice_then_two_tensors_gives_the_plain_result():
    """Issue 33's sequence: c(x, x) compiled one graph input for both; c(a, b) must not
    reuse it."""
    compiled = fxloom.compile(add_scaled)
    x = torch.ones(3)
    assert torch.equal(compiled(x, x), torch.full((3,), 3.0))
    a, b = torch.ones(3), torch.zeros(3)
    assert torch.equal(compiled(a, b), torch.ones(3))


def test_two_tensors_then_one_tensor_twice_gives_the_plain_result():
    compiled = fxloom.compile(same_object_test)
    a, b = torch.ones(3), torch.zeros(3)
    assert torch.equal(compiled(a, b), torch.ones(3))
    x = torch.ones(3)
    assert torch.equal(compiled(x, x), torch.full((3,), 2.0))


def test_the_same_object_twice_is_guarded_by_is():
    compiled = fxloom.compile(add_scaled)
    x = torch.ones(3)
    compiled(x, x)
    assert "y is x" in guard_texts(compiled)


def test_different_objects_are_guarded_by_is_not():
    compiled = fxloom.compile(add_scaled)
    compiled(torch.ones(3), torch.zeros(3))
    assert "x is not y" in guard_texts(compiled)


def test_explain_lists_the_relation_among_the_guards():
    compiled = fxloom.compile(bump_then_read)
    compiled(torch.ones(3), torch.ones(3))
    report = str(compiled.explain())
    assert "x is not y" in report and "x and y share no storage" in report


def test_a_changed_relation_is_named_as_the_reason_to_recompile():
    compiled = fxloom.compile(add_scaled)
    compiled(torch.ones(3), torch.zeros(3))
    x = torch.ones(3)
    compiled(x, x)
    assert compiled.explain().recompiles == ["x is not y"]


def test_identical_calls_never_recompile():
    compiled = fxloom.compile(bump_then_read)
    for names in [("a", "a"), ("a", "a"), ("a", "b"), ("a", "b"), ("a", "a.view"), ("a", "a.view")]:
        assert_same_as_python(compiled, bump_then_read, names)
    assert len(compiled.cache) == 3  # one entry per relation: (x, x), (a, b), (a, a.view)
    assert len(compiled.explain().recompiles) == 2


# ----------------------------------------------------------------------------- in place
@pytest.mark.parametrize(
    "order", list(itertools.permutations([("a", "a"), ("a", "a.view"), ("a", "b")]))
)
def test_writing_through_one_alias_in_any_order_of_calls(order):
    compiled = fxloom.compile(bump_then_read)
    for names in (*order, *order):
        assert_same_as_python(compiled, bump_then_read, names)


def test_a_graph_that_writes_guards_that_distinct_inputs_share_no_storage():
    compiled = fxloom.compile(bump_then_read)
    compiled(torch.ones(3), torch.ones(3))
    assert "x and y share no storage" in guard_texts(compiled)


def test_views_of_one_base_are_guarded_to_share_it_the_same_way():
    compiled = fxloom.compile(bump_then_read)
    base = torch.ones(4)
    compiled(base, base[:])
    texts = guard_texts(compiled)
    assert "y shares x's storage (offsets 0 and 0, strides (1,) and (1,))" in texts


def test_a_view_at_another_offset_misses():
    def bump_row(x, y):
        x.add_(1)
        return y * 2

    compiled = fxloom.compile(bump_row)
    for pick in (0, 1, 0, 1):
        base, plain = torch.zeros(2, 3), torch.zeros(2, 3)
        got = compiled(base, base[pick])
        assert torch.equal(got, bump_row(plain, plain[pick])) and torch.equal(base, plain)
    assert len(compiled.cache) == 2


def test_a_transposed_view_is_a_relation_of_its_own():
    compiled = fxloom.compile(scale_then_add)
    for _ in range(2):
        base, plain = torch.arange(4.0).view(2, 2), torch.arange(4.0).view(2, 2)
        assert torch.equal(compiled(base, base.t()), scale_then_add(plain, plain.t()))
        assert torch.equal(base, plain)
    assert len(compiled.cache) == 1


def test_a_graph_that_only_reads_needs_no_storage_guard():
    """Reading one memory through two tensors gives the same values as through one copy each:
    aliasing is seen only through a write, so ``x + y`` pays for no storage check."""
    compiled = fxloom.compile(add_scaled)
    base = torch.ones(3)
    compiled(base, base[:])
    compiled(torch.ones(3), torch.ones(3))
    assert not any("storage" in text for text in guard_texts(compiled))
    assert len(compiled.cache) == 1


# ----------------------------------------------------------------------------- other sources
def test_tensors_inside_a_container_are_guarded_the_same_way():
    def f(pair):
        return pair[0] + pair[1] * 2

    compiled = fxloom.compile(f)
    x = torch.ones(3)
    compiled([x, x])
    assert torch.equal(compiled([torch.ones(3), torch.zeros(3)]), torch.ones(3))
    assert "pair[1] is pair[0]" in guard_texts(compiled)


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.w + x * 2


WEIGHT = torch.ones(3)


def test_a_global_tensor_passed_as_the_argument_then_another_tensor():
    def f(x):
        return WEIGHT + x * 2

    compiled = fxloom.compile(f)
    assert torch.equal(compiled(WEIGHT), f(WEIGHT))
    zeros = torch.zeros(3)
    assert torch.equal(compiled(zeros), f(zeros))
    assert "WEIGHT is x" in guard_texts(compiled)


@torch.no_grad()
def test_a_parameter_passed_as_the_argument_then_another_tensor():
    model = Scaled()
    compiled = fxloom.compile(model)
    assert torch.equal(compiled(model.w), model(model.w))
    zeros = torch.zeros(3)
    assert torch.equal(compiled(zeros), model(zeros))
    assert "x is self.w" in guard_texts(compiled)


@torch.no_grad()
def test_another_tensor_then_a_parameter_passed_as_the_argument():
    model = Scaled()
    compiled = fxloom.compile(model)
    zeros = torch.zeros(3)
    assert torch.equal(compiled(zeros), model(zeros))
    assert torch.equal(compiled(model.w), model(model.w))
    assert len(compiled.cache) == 2


def test_the_piece_after_a_graph_break_is_guarded_too():
    def f(x, y):
        if x.sum() > 0:  # a branch on data: the rest is a piece of its own
            return x + y * 2
        return x

    compiled = fxloom.compile(f)
    x = torch.ones(3)
    assert torch.equal(compiled(x, x), f(x, x))
    a, b = torch.ones(3), torch.zeros(3)
    assert torch.equal(compiled(a, b), f(a, b))


# ----------------------------------------------------------------------------- generated
PROGRAMS = [add_scaled, bump_then_read, scale_then_add, same_object_test]


@seed(33)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    program=st.sampled_from(PROGRAMS),
    calls=st.lists(
        st.tuples(st.sampled_from(list(VIEWS)), st.sampled_from(list(VIEWS))),
        min_size=1,
        max_size=6,
    ),  # fmt: skip
)
def test_call_sequences_that_swap_aliasing_agree_with_python(program, calls):
    compiled = fxloom.compile(program)
    for names in calls:
        assert_same_as_python(compiled, program, names)


# ----------------------------------------------------------------------------- objects
class Box:
    def __init__(self, value) -> None:
        self.value = value


def double_then_read(p, q):
    p.value = p.value * 2  # replayed after the graph
    return q.value + 1  # the assigned value, where q is p


@pytest.mark.parametrize("one_box_first", [True, False])
def test_an_attribute_assigned_through_one_alias_of_an_object(one_box_first):
    compiled = fxloom.compile(double_then_read)
    calls = ["one box", "two boxes"] if one_box_first else ["two boxes", "one box"]
    for kind in calls * 2:
        results = []
        for fn in (double_then_read, compiled):
            box = Box(torch.ones(3))
            boxes = (box, box) if kind == "one box" else (box, Box(torch.zeros(3)))
            results.append((fn(*boxes), boxes[0].value))
        (got, got_value), (want, want_value) = results[1], results[0]
        assert torch.equal(got, want) and torch.equal(got_value, want_value), kind
    assert len(compiled.cache) == 2


def add_values(p, q):
    return p.value + q.value


def test_one_object_twice_then_two_objects_reads_each_one():
    compiled = fxloom.compile(add_values)
    box = Box(torch.ones(3))
    assert torch.equal(compiled(box, box), torch.full((3,), 2.0))
    assert "q is p" in guard_texts(compiled)
    assert torch.equal(compiled(Box(torch.ones(3)), Box(torch.zeros(3))), torch.ones(3))


def test_different_objects_are_kept_apart_only_where_their_attributes_are_assigned():
    """Reading ``p.value`` and ``q.value`` from two objects guards the two tensors
    (``p.value is not q.value``); the objects themselves need no ``is not``."""
    compiled = fxloom.compile(add_values)
    compiled(Box(torch.ones(3)), Box(torch.zeros(3)))
    texts = guard_texts(compiled)
    assert "p is not q" not in texts and "p.value is not q.value" in texts
    compiled = fxloom.compile(double_then_read)
    compiled(Box(torch.ones(3)), Box(torch.zeros(3)))
    assert "p is not q" in guard_texts(compiled)


@seed(33)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    program=st.sampled_from([double_then_read, add_values]),
    calls=st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("ab")), min_size=1, max_size=6),
)
def test_call_sequences_that_swap_aliased_objects_agree_with_python(program, calls):
    compiled = fxloom.compile(program)
    for names in calls:
        results = []
        for fn in (program, compiled):
            boxes = {"a": Box(torch.ones(3)), "b": Box(torch.zeros(3))}
            result = fn(*(boxes[name] for name in names))
            results.append((result, boxes["a"].value, boxes["b"].value))
        for got, want in zip(results[1], results[0]):
            assert torch.equal(got, want), names
