"""``fxloom.values.signature``: a call's arguments bound to parameters, unbound, flattened by spec.

Every frontend and consumer binds through it (export, symbolic tracing's parameters, pipeline
examples, the command line, ``fxloom.compile``'s per-call binder), so these tests pin what they
all rely on: Python's binding rules, defaults, and errors that name the parameter.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from fxloom.values.signature import (
    BindError,
    bind,
    call_of,
    code_bind,
    code_parameter_names,
    code_unbind,
    code_variadic_names,
    flatten,
    parameters_of,
    unbind,
    unflatten,
)


def f(x, scale=2.0, *rest, bias=None, **options):
    return (x, scale, rest, bias, options)


def plain(a, b=1, /, c=2, *, d, e=5):
    return (a, b, c, d, e)


def takes_two(x, y):
    return (x, y)


class Net(torch.nn.Module):
    def forward(self, x, mask=None):
        return x


# ------------------------------------------------------------------ bind
def test_bind_gives_each_parameter_its_value_in_parameter_order_with_defaults():
    assert bind(f, (1,), {"bias": 3}) == {
        "x": 1,
        "scale": 2.0,
        "rest": (),
        "bias": 3,
        "options": {},
    }


def test_bind_collects_extra_positionals_and_keywords_into_the_variadics():
    bound = bind(f, (1, 3.0, 4, 5), {"mode": "fast"})
    assert bound["rest"] == (4, 5) and bound["options"] == {"mode": "fast"}


def test_bind_without_defaults_holds_only_what_was_passed():
    assert bind(f, (1,), {"bias": 3}, defaults=False) == {"x": 1, "bias": 3}


def test_partial_bind_allows_required_parameters_left_out():
    assert bind(takes_two, (), {"y": 2}, partial=True, defaults=False) == {"y": 2}


def test_bind_reads_a_bound_method_without_self():
    assert bind(Net().forward, (torch.ones(1),)).keys() == {"x", "mask"}


def test_bind_takes_a_signature_too():
    assert bind(inspect.signature(takes_two), (1, 2)) == {"x": 1, "y": 2}


def test_bind_leaves_the_callers_kwargs_alone():
    kwargs = {"y": 2}
    bind(takes_two, (1,), kwargs)
    assert kwargs == {"y": 2}


# ------------------------------------------------------------------ errors
def test_a_missing_argument_names_the_parameter_and_the_callable():
    with pytest.raises(BindError, match=r"takes_two\(x, y\): missing a required argument: 'y'"):
        bind(takes_two, (1,))


def test_an_unknown_keyword_is_named():
    with pytest.raises(BindError, match="unexpected keyword argument 'z'"):
        bind(takes_two, (1, 2), {"z": 3})


def test_a_value_given_twice_names_the_parameter():
    with pytest.raises(BindError, match="multiple values for argument 'x'"):
        bind(takes_two, (1,), {"x": 2})


def test_too_many_positionals_names_the_parameters_that_take_them():
    with pytest.raises(BindError, match=r"3 given, but only 2 parameters take them \(x, y\)"):
        bind(takes_two, (1, 2, 3))


def test_the_error_starts_with_what_the_caller_was_doing():
    with pytest.raises(BindError, match=r"^export: the inputs do not fit: takes_two"):
        bind(takes_two, (), what="export: the inputs do not fit")


def test_a_binding_error_is_a_type_error_as_pythons_own():
    with pytest.raises(TypeError):
        bind(takes_two, ())


def test_a_callable_without_a_signature_is_a_binding_error_naming_it():
    class NoSignature:
        __signature__ = "not a signature"

        def __call__(self):
            pass

    with pytest.raises(BindError, match="has no signature to bind arguments to"):
        bind(NoSignature(), ())


# ------------------------------------------------------------------ parameters_of
def test_parameters_of_an_unbound_forward_can_skip_self():
    assert [p.name for p in parameters_of(Net.forward, skip_first=True)] == ["x", "mask"]


def test_parameters_of_a_builtin_without_a_signature_raises_as_inspect_does():
    with pytest.raises(ValueError):
        parameters_of(max)


# ------------------------------------------------------------------ unbind
@pytest.mark.parametrize(
    "args, kwargs",
    [((1,), {}), ((1, 3.0, 4, 5), {"bias": 0, "mode": "m"}), ((1,), {"scale": 4.0})],
)
def test_unbind_calls_the_function_as_the_original_call_did(args, kwargs):
    again_args, again_kwargs = unbind(f, bind(f, args, kwargs))
    assert f(*again_args, **again_kwargs) == f(*args, **kwargs)


def test_unbind_passes_keyword_only_parameters_by_keyword():
    assert unbind(plain, {"a": 0, "b": 1, "c": 2, "d": 3, "e": 5}) == ((0, 1, 2), {"d": 3, "e": 5})


def test_unbind_passes_by_keyword_what_follows_the_positional_count():
    assert unbind(takes_two, {"x": 1, "y": 2}, positional=1) == ((1,), {"y": 2})


def test_unbind_leaves_out_parameters_not_bound():
    assert unbind(takes_two, {"y": 2}) == ((2,), {})


# ------------------------------------------------------------------ flatten
def test_flatten_lists_the_leaves_of_every_bound_value_and_unflatten_rebuilds_them():
    bound = bind(f, (torch.ones(2), 3.0, [torch.zeros(1)]), {"bias": {"b": 1}})
    leaves, spec = flatten(bound.values())
    assert len(leaves) == 4  # x, scale, rest's tensor, bias's 1; options is an empty dict
    rebuilt = unflatten(leaves, spec)
    assert [type(v) for v in rebuilt] == [type(v) for v in bound.values()]
    assert rebuilt[3] == {"b": 1}


def test_a_none_is_no_leaf_as_export_lifts_inputs():
    leaves, spec = flatten([1, None])
    assert leaves == [1]
    assert unflatten(leaves, spec) == (1, None)


# ------------------------------------------------------------------ by code object
@pytest.mark.parametrize(
    "fn, args, kwargs",
    [
        (f, (1,), {}),
        (f, (1, 2, 3, 4), {"bias": 0, "mode": 1}),
        (plain, (0,), {"d": 3}),
        (plain, (0, 1), {"c": 9, "d": 3, "e": 4}),
        (takes_two, (), {"x": 1, "y": 2}),
    ],
)
def test_code_bind_binds_as_bind_does(fn, args, kwargs):
    by_code = code_bind(fn, args, kwargs)
    assert by_code == bind(fn, args, kwargs)
    assert set(by_code) == set(code_parameter_names(fn))


@pytest.mark.parametrize(
    "fn, args, kwargs, words",
    [
        (takes_two, (1, 2, 3), {}, "takes 2 positional arguments but 3 were given"),
        (takes_two, (1,), {"x": 1}, "got multiple values for argument 'x'"),
        (takes_two, (1, 2), {"z": 1}, "got an unexpected keyword argument 'z'"),
        (takes_two, (1,), {}, "missing required argument 'y'"),
        (plain, (0,), {}, "missing keyword-only argument 'd'"),
        (plain, (0,), {"a": 1, "d": 1}, "unexpected keyword argument 'a'"),  # positional-only
    ],
)
def test_code_bind_refuses_in_pythons_words_naming_the_parameter(fn, args, kwargs, words):
    with pytest.raises(TypeError, match=words):
        code_bind(fn, args, kwargs)


def test_code_unbind_calls_the_function_as_the_original_call_did():
    args, kwargs = (1, 3.0, 4), {"bias": 2, "mode": "m"}
    names = code_parameter_names(f)
    bound = code_bind(f, args, kwargs)
    values = tuple(bound[name] for name in names)  # as fxloom.compile's dispatch passes them
    again_args, again_kwargs = code_unbind(f, names, values)
    assert f(*again_args, **again_kwargs) == f(*args, **kwargs)


def test_code_variadic_names_are_the_star_parameters():
    assert code_variadic_names(f) == ("rest", "options")
    assert code_variadic_names(takes_two) == ()


# ------------------------------------------------------------------ inputs as a call
@pytest.mark.parametrize(
    "inputs, call",
    [
        ({"x": 1}, ((), {"x": 1})),
        ((1, 2), ((1, 2), {})),
        ([1, 2], ((1, 2), {})),
        (7, ((7,), {})),
    ],
)
def test_call_of_reads_inputs_as_users_write_them(inputs, call):
    assert call_of(inputs) == call
