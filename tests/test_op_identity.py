"""One identity per operator (``fxloom.ops.identity``): every spelling of an operation maps to
one key, and every table of operator facts answers the same for each spelling.

Symbolic tracing records torch-level calls (``torch.relu``, ``F.relu``, ``"relu"``, ``nn.ReLU``),
export records ATen overloads (``aten.relu.default``): both must hit the same rows.
"""

from __future__ import annotations

import gc
import operator
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxloom.lower  # noqa: F401 - registers the ONNX handlers
from fxloom.lower.onnx_ops import handler_for
from fxloom.ops.effects import FRESH_RESULT_FUNCTIONS, view_kind
from fxloom.ops.flops import find_flop_formula
from fxloom.ops.identity import (
    OpKey,
    OpSet,
    OpTable,
    functional_overload,
    node_op_key,
    op_key,
    op_name,
)
from fxloom.quantize.table import KEPT_FLOAT, RELU, SHARES_QPARAMS, STATIC_OPS

aten = torch.ops.aten

# operator key -> its out-of-place spellings (module class, torch, F, method, Tensor, ATen)
SPELLINGS: dict[str, list] = {
    "relu": [nn.ReLU, torch.relu, F.relu, "relu", torch.Tensor.relu, aten.relu, aten.relu.default],
    "add": [
        torch.add,
        operator.add,
        "add",
        "__add__",
        "__radd__",
        torch.Tensor.add,
        aten.add.Tensor,
    ],
    "mul": [torch.mul, torch.multiply, operator.mul, "mul", "multiply", aten.mul.Tensor],
    "sub": [torch.sub, torch.subtract, operator.sub, "sub", aten.sub.Tensor],
    "div": [torch.div, torch.true_divide, operator.truediv, "div", "__truediv__", aten.div.Tensor],
    "matmul": [torch.matmul, operator.matmul, "matmul", aten.matmul.default],
    "linear": [nn.Linear, F.linear, aten.linear.default],
    "conv2d": [nn.Conv2d, F.conv2d, torch.conv2d, aten.conv2d.default],
    "softmax": [nn.Softmax, F.softmax, torch.softmax, "softmax", aten.softmax.int],
    "view": ["view", torch.Tensor.view, aten.view.default],
    "reshape": [torch.reshape, "reshape", aten.reshape.default],
    "flatten": [nn.Flatten, torch.flatten, "flatten", aten.flatten.using_ints],
    "transpose": [torch.transpose, torch.swapaxes, "transpose", "swapdims", aten.transpose.int],
    "layer_norm": [nn.LayerNorm, F.layer_norm, torch.layer_norm, aten.layer_norm.default],
    "batch_norm": [nn.BatchNorm2d, F.batch_norm, torch.batch_norm, aten.batch_norm.default],
    "gelu": [nn.GELU, F.gelu, aten.gelu.default],
    "sigmoid": [nn.Sigmoid, torch.sigmoid, F.sigmoid, "sigmoid", aten.sigmoid.default],
    "cat": [torch.cat, torch.concat, torch.concatenate, aten.cat.default],
    "max_pool2d": [nn.MaxPool2d, F.max_pool2d, torch.max_pool2d, aten.max_pool2d.default],
    "embedding": [nn.Embedding, F.embedding, torch.embedding, aten.embedding.default],
    "clamp": [torch.clamp, torch.clip, "clamp", "clip", aten.clamp.default],
    "mm": [torch.mm, torch.spmm, "mm", aten.mm.default],
    "scaled_dot_product_attention": [
        F.scaled_dot_product_attention,
        aten.scaled_dot_product_attention.default,
    ],
}
# operator key -> its in-place twins
IN_PLACE: dict[str, list] = {
    "relu": [torch.relu_, F.relu_, "relu_", aten.relu_.default],
    "add": [operator.iadd, "add_", "__iadd__", torch.Tensor.add_, aten.add_.Tensor],
    "mul": [operator.imul, "mul_", aten.mul_.Tensor],
    "div": [operator.itruediv, "div_", aten.div_.Tensor],
    "transpose": ["transpose_", "swapaxes_", aten.transpose_.default],
    "clamp": [torch.clamp_, "clip_", aten.clamp_.default],
    "sigmoid": [torch.sigmoid_, "sigmoid_", aten.sigmoid_.default],
}
# Spellings whose arguments are laid out unlike their operator's other spellings: a table
# that reads arguments gives them rows of their own (``OpTable.pin``).
PINNED_FOR_ONNX = {F.batch_norm, F.embedding}

OPS = sorted(SPELLINGS)


def _calls(name: str) -> list:
    """The spellings a call node can have (module classes are read through the module)."""
    return [s for s in SPELLINGS[name] if not isinstance(s, type)]


def _opcode(spelling) -> str:
    return "call_method" if isinstance(spelling, str) else "call_function"


def _id(spelling) -> str:
    return getattr(spelling, "__qualname__", None) or str(spelling)


# ------------------------------------------------------------------------------ the key
@pytest.mark.parametrize("name", OPS)
def test_every_spelling_maps_to_the_operators_key(name):
    keys = {_id(s): op_key(s) for s in SPELLINGS[name]}
    assert set(keys.values()) == {OpKey(name)}, keys


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_in_place_twins_map_to_the_key_flagged_in_place(name):
    keys = {_id(s): op_key(s) for s in IN_PLACE[name]}
    assert set(keys.values()) == {OpKey(name, in_place=True)}, keys


def test_op_name_answers_for_out_of_place_spellings_only():
    assert op_name(torch.relu) == op_name(aten.relu.default) == "relu"
    assert op_name(torch.relu_) is None and op_name(operator.iadd) is None


def test_an_in_place_aten_overload_has_its_functional_overload():
    assert functional_overload(aten.add_.Tensor) is aten.add.Tensor
    assert functional_overload(aten.relu_.default) is aten.relu.default
    assert functional_overload(aten.add.Tensor) is None  # already functional


def test_a_name_that_means_another_operation_in_its_namespace_gets_that_operations_key():
    # F.unfold extracts image patches (ATen's im2col); Tensor.unfold is a view of windows.
    assert op_key(F.unfold) == op_key(nn.Unfold) == OpKey("im2col")
    assert op_key("unfold") == op_key(aten.unfold.default) == OpKey("unfold")


def test_what_torch_does_not_define_has_no_key():
    def relu(x):  # a user's function that happens to share a name
        return x

    class MyReLU(nn.ReLU):  # a user's subclass may compute anything in forward
        pass

    assert op_key(relu) is None and op_key(MyReLU) is None
    assert op_key(print) is None and op_key("to_tuple") is None
    assert op_key([1]) is None  # unhashable: no spelling
    assert op_key(torch.ops.quantized.add) is None  # not an ATen operator


def test_the_python_operators_without_a_tensor_operation_have_no_key():
    assert op_key(operator.not_) is None and op_key(operator.is_) is None


# ------------------------------------------------------------------ tables keyed by it
def test_a_row_given_for_one_spelling_is_found_by_every_spelling():
    table = OpTable()
    table[F.relu] = "row"
    assert all(table.get(s) == "row" for s in _calls("relu"))
    assert table.get(torch.relu_) is None  # in-place twins are kept apart by default
    assert nn.ReLU not in table  # module classes too
    del table[aten.relu.default]
    assert not table


def test_a_pinned_row_is_found_before_the_keys_row():
    table = OpTable({"embedding": "torch's layout"})
    table.pin(F.embedding, "F's layout")
    assert table[F.embedding] == "F's layout"
    assert table[aten.embedding.default] == table[torch.embedding] == "torch's layout"


def test_a_set_of_operators_holds_keys():
    views = OpSet({torch.transpose}, modules=True)
    assert "swapaxes" in views and aten.transpose.int in views
    assert "transpose_" not in views  # an in-place update is no view


# ------------------------------------------------- every consumer answers alike per spelling
def _same_for_all(answers: dict) -> None:
    assert len(set(answers.values())) == 1, answers


@pytest.mark.parametrize("name", OPS)
def test_flop_formulas_answer_the_same_for_every_spelling(name):
    spellings = _calls(name) + IN_PLACE.get(name, [])  # x += y costs what x + y does
    _same_for_all({_id(s): find_flop_formula(_opcode(s), s) for s in spellings})


@pytest.mark.parametrize("name", OPS)
def test_views_answer_the_same_for_every_spelling(name):
    answers = {_id(s): view_kind(_opcode(s), s) for s in _calls(name)}
    modules = [s for s in SPELLINGS[name] if isinstance(s, type)]
    # (only the module's class is read: an instance left unbuilt will do)
    answers.update({_id(m): view_kind("call_module", m, m.__new__(m)) for m in modules})
    _same_for_all(answers)


@pytest.mark.parametrize("name", OPS)
def test_fresh_results_answer_the_same_for_every_spelling(name):
    _same_for_all({_id(s): FRESH_RESULT_FUNCTIONS.get(s, "absent") for s in _calls(name)})


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_an_in_place_twin_never_returns_a_fresh_tensor(name):
    assert not any(s in FRESH_RESULT_FUNCTIONS for s in IN_PLACE[name])


@pytest.mark.parametrize("name", OPS)
def test_quantization_tables_answer_the_same_for_every_call_spelling(name):
    for table in (STATIC_OPS, KEPT_FLOAT):
        _same_for_all({_id(s): table.get(s) for s in _calls(name)})
    _same_for_all({_id(s): s in RELU for s in SPELLINGS[name]})  # module classes too
    torch_level = [s for s in SPELLINGS[name] if not hasattr(s, "overloadpacket")]
    _same_for_all({_id(s): s in SHARES_QPARAMS for s in torch_level})


def test_exported_programs_share_int8_parameters_only_through_the_pinned_aten_views():
    # An exported graph fixes strides: a transpose on int8 would leave a layout its later
    # aten.view was not recorded for. Views that keep the layout are pinned.
    assert "transpose" in SHARES_QPARAMS and aten.transpose.int not in SHARES_QPARAMS
    assert aten.view.default in SHARES_QPARAMS and aten.relu.default in SHARES_QPARAMS


@pytest.mark.parametrize("name", OPS)
def test_onnx_handlers_answer_the_same_for_every_call_spelling(name):
    spellings = [s for s in _calls(name) if s not in PINNED_FOR_ONNX]
    _same_for_all({_id(s): handler_for(_opcode(s), s) for s in spellings})


@pytest.mark.parametrize("spelling", sorted(PINNED_FOR_ONNX, key=_id), ids=_id)
def test_a_spelling_with_its_own_argument_layout_has_its_own_onnx_handler(spelling):
    others = {handler_for("call_function", s) for s in _calls(op_key(spelling).name)}
    assert handler_for("call_function", spelling) is not None
    assert len(others) == 2  # its own row, and the one the operator's other spellings share


def test_looking_up_a_users_function_does_not_keep_it_alive():
    def scale(x):
        return x * 2

    alive = weakref.ref(scale)
    op_key(scale)
    find_flop_formula("call_function", scale)
    assert scale not in SHARES_QPARAMS
    del scale
    gc.collect()
    assert alive() is None


def test_a_call_node_is_keyed_by_its_opcode_and_target():
    assert node_op_key("call_module", "act", nn.ReLU()) == OpKey("relu")
    assert node_op_key("call_method", "relu_") == OpKey("relu", in_place=True)
    assert node_op_key("get_attr", "relu") is None
