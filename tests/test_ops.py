"""Operator facts (``fxloom.ops``): one table per fact, read by codegen, the tracer and passes."""

from __future__ import annotations

import builtins
import operator

import pytest
import torch

import fxloom as fx
from fxloom.ops import mutation
from fxloom.ops.identity import OpKey, is_inplace_name, op_key
from fxloom.ops.mutation import (
    IN_PLACE_OPERATORS,
    has_side_effect,
    is_inplace_function,
    schema_aliased_arguments,
    schema_is_mutable,
    schema_written_arguments,
)
from fxloom.ops.python_operators import KINDS, PYTHON_OPERATORS

aten = torch.ops.aten
ENTRIES = list(PYTHON_OPERATORS.values())
AUGMENTED = [entry for entry in ENTRIES if entry.kind == "augmented"]


def _id(entry) -> str:
    return entry.function.__name__


# ------------------------------------------------------------ Python operators
_ARITY_OF_KIND = {"unary": 1, "call": 1, "setitem": 3}  # the others take two operands


def test_every_entry_has_a_known_kind_and_its_arity():
    for entry in ENTRIES:
        assert entry.kind in KINDS, entry
        assert entry.arity == _ARITY_OF_KIND.get(entry.kind, 2), entry


@pytest.mark.parametrize("entry", AUGMENTED, ids=_id)
def test_every_in_place_operator_updates_with_a_binary_operator_of_the_same_token(entry):
    binary = PYTHON_OPERATORS[entry.in_place_of]
    assert binary.kind == "binary"
    assert entry.token == binary.token + "="
    assert entry.hook == "__i" + binary.hook[2:]  # __add__ -> __iadd__


def test_every_binary_operator_has_an_in_place_form():
    binaries = {entry.function for entry in ENTRIES if entry.kind == "binary"}
    assert {entry.in_place_of for entry in AUGMENTED} == binaries
    assert IN_PLACE_OPERATORS == {entry.function for entry in AUGMENTED}


def test_binary_operators_have_reflected_hooks_and_comparisons_do_not():
    assert PYTHON_OPERATORS[operator.sub].reflected_hook == "__rsub__"
    assert PYTHON_OPERATORS[operator.and_].reflected_hook == "__rand__"
    assert PYTHON_OPERATORS[operator.lt].reflected_hook is None  # 1 < x asks x.__gt__(1)


# ---------------------------------------------------- codegen and Proxy agree
def _single_operator_graph(entry) -> tuple[fx.Graph, fx.Node]:
    g = fx.Graph()
    inputs = [g.placeholder(name) for name in ("a", "b", "c")[: entry.arity]]
    if entry.kind in ("getitem", "setitem"):
        inputs[1] = 0
    elif entry.kind == "getattr":
        inputs[1] = "shape"
    node = g.call_function(entry.function, tuple(inputs))
    g.output(node if entry.kind != "setitem" else inputs[0])
    return g, node


_SPELLING = {
    "binary": "{name} = a {token} b",
    "comparison": "{name} = a {token} b",
    "unary": "{name} = {token}a",
    "augmented": "{name} = a;  {name} {token} b",
    "getitem": "{name} = a[0]",
    "setitem": "a[0] = c",
    "contains": "{name} = b in a",
    "getattr": "{name} = a.shape",
    "call": "{name} = operator.abs(a)",
}


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_codegen_writes_every_operator_in_its_syntax(entry):
    g, node = _single_operator_graph(entry)
    expected = _SPELLING[entry.kind].format(name=node.name, token=entry.token)
    assert expected in g.python_code("self").src


def _values(entry) -> list:
    if entry.kind == "contains":
        return [[1, 2], 2]
    if entry.function in (operator.is_, operator.is_not, operator.not_):
        return [1, 1][: entry.arity]
    return [torch.tensor([6, 7]), torch.tensor([2, 3]), torch.tensor(9)][: entry.arity]


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_generated_code_computes_what_the_operator_function_does(entry):
    g, _ = _single_operator_graph(entry)
    gm = fx.GraphModule(torch.nn.Module(), g)
    expected_inputs, inputs = _values(entry), _values(entry)
    args = list(expected_inputs)
    if entry.kind in ("getitem", "setitem"):
        args[1] = 0
    elif entry.kind == "getattr":
        args[1] = "shape"
    try:
        expected = entry.function(*args)
    except Exception as error:  # int tensors refuse some in-place updates: so must the code
        with pytest.raises(type(error)):
            gm(*inputs)
        return
    if entry.kind == "setitem":
        expected = args[0]
    result = gm(*inputs)
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(result, expected)
    else:
        assert result == expected


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.hook and e.kind != "contains"], ids=_id)
def test_proxy_records_every_operator_with_a_hook_as_its_function(entry):
    g = fx.Graph()
    proxies = [fx.Proxy(g.placeholder(name)) for name in ("a", "b", "c")[: entry.arity]]
    if entry.kind in ("getitem", "setitem"):
        proxies[1] = 0
    entry.function(*proxies)  # operator.add(a, b) asks a.__add__(b), as a + b does
    recorded = list(g.nodes)[-1]
    assert (recorded.op, recorded.target) == ("call_function", entry.function)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.reflected_hook], ids=_id)
def test_proxy_records_reflected_operators_with_the_arguments_swapped(entry):
    g = fx.Graph()
    b = fx.Proxy(g.placeholder("b"))
    getattr(b, entry.reflected_hook)(2)  # what Python calls for `2 + b`
    recorded = list(g.nodes)[-1]
    assert recorded.target is entry.function
    assert recorded.args == (2, b.node)


# ------------------------------------------------------------------- in place
def test_the_in_place_naming_rule():
    assert is_inplace_name("add_") and is_inplace_name("relu_")
    assert not is_inplace_name("add")
    assert not is_inplace_name("__add__")  # a dunder
    assert not is_inplace_name("_private_")  # a private helper
    assert op_key("add_") == OpKey("add", in_place=True) and op_key("add") == OpKey("add")


def test_python_operators_named_for_a_keyword_are_not_in_place():
    assert is_inplace_name(operator.and_.__name__)  # the name alone would say so
    for function in (operator.and_, operator.or_, operator.not_, operator.is_):
        assert not is_inplace_function(function)
        assert not fx.Graph().call_function(function, (1, 1)).is_impure()


def test_in_place_functions_update_their_first_argument():
    assert is_inplace_function(torch.relu_) and is_inplace_function(operator.iadd)
    assert not is_inplace_function(torch.relu)
    # Tensors have no in-place matmul: x @= y makes a new tensor (but is still kept by DCE).
    assert not hasattr(torch.Tensor, "__imatmul__")
    assert not is_inplace_function(operator.imatmul)
    assert operator.imatmul in mutation.WRITES_FIRST_ARGUMENT


def test_a_mutating_overload_is_recognised_by_its_schema():
    assert schema_is_mutable(aten.add_.Tensor) and schema_is_mutable(aten.add.out)
    assert not schema_is_mutable(aten.add.Tensor) and not schema_is_mutable(torch.add)
    assert schema_written_arguments(aten.add_.Tensor) == ("self",)
    assert schema_written_arguments(aten.add.out) == ("out",)
    assert schema_written_arguments(aten.add.Tensor) == ()
    g = fx.Graph()
    x = g.placeholder("x")
    assert g.call_function(aten.add_.Tensor, (x, x)).is_impure()
    assert not g.call_function(aten.add.Tensor, (x, x)).is_impure()


def test_views_alias_their_input_by_schema():
    assert schema_aliased_arguments(aten.view.default) == ("self",)
    assert schema_aliased_arguments(aten.add_.Tensor) == ("self",)  # returns its input
    assert schema_aliased_arguments(aten.add.Tensor) == ()


def test_out_and_inplace_keywords_write():
    assert mutation.writes_through_keywords({"out": None})
    assert mutation.writes_through_keywords({"inplace": True})
    assert not mutation.writes_through_keywords({"inplace": False})


# --------------------------------------------------------------- side effects
@has_side_effect
def _write_log(x):
    return x


def _drop_log(x):
    return x


def test_a_user_registered_side_effect_function_is_kept_by_dce():
    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(_write_log, (x,))
    g.call_function(_drop_log, (x,))
    g.output(x)
    g.eliminate_dead_code()
    assert [n.target for n in g.nodes if n.op == "call_function"] == [_write_log]


def test_has_side_effect_is_one_registry_under_every_name():
    from fxloom import node

    assert fx.has_side_effect is node.has_side_effect is has_side_effect
    assert builtins.print in mutation.SIDE_EFFECT_FUNCTIONS
    assert mutation.READ_ONLY_EFFECTS <= mutation.SIDE_EFFECT_FUNCTIONS
    assert mutation.WRITES_FIRST_ARGUMENT <= mutation.SIDE_EFFECT_FUNCTIONS


# Layering (ops imports only the foundation layer: pytree, immutable collections) is checked
# with the other layers in tests/test_layers.py.
