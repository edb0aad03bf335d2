"""Code generation: ``Graph.python_code`` turns a graph into readable, runnable Python."""

from __future__ import annotations

import math
import operator
import re
import typing
from pathlib import Path
from typing import List, Optional

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import fxloom as fx

SEED = Path("/work/shared/seeds/001_12b8f1bf0ca83988.txt")


def body(graph: fx.Graph) -> list[str]:
    """The lines of the generated forward, without indentation (the ``def`` line first)."""
    return [line.strip() for line in graph.python_code("self").src.strip().splitlines()]


def compile_graph(graph: fx.Graph, root: torch.nn.Module | None = None) -> fx.GraphModule:
    return fx.GraphModule(root if root is not None else torch.nn.Module(), graph)


def one_call(fn, *args, n_inputs: int = 1, **kwargs) -> fx.Graph:
    """A graph returning ``fn(x0, ..., *args, **kwargs)`` for ``n_inputs`` placeholders."""
    g = fx.Graph()
    inputs = [g.placeholder(f"x{i}") for i in range(n_inputs)]
    g.output(g.call_function(fn, (*inputs, *args), kwargs))
    return g


# ------------------------------------------------------------------ PythonCode
def test_python_code_returns_source_and_the_globals_it_needs():
    g = one_call(torch.relu)
    code = g.python_code("self")
    assert isinstance(code, fx.PythonCode)
    assert code.src.startswith("def forward(self, x0):")
    assert code.globals["torch"] is torch
    namespace = dict(code.globals)
    exec(compile(code.src, "<generated>", "exec"), namespace)
    assert_close(namespace["forward"](None, torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))


def test_python_code_uses_the_given_root_module_name():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("lin", (x,)))
    src = g.python_code("root").src
    assert src.startswith("def forward(root, x):")
    assert "root.lin(x)" in src


# -------------------------------------------------------------- documented examples
class DocsModule(torch.nn.Module):
    """The torch.fx documentation's MyModule: ``linear(x + param).clamp(0, 1)``."""

    def __init__(self) -> None:
        super().__init__()
        self.param = torch.nn.Parameter(torch.rand(3, 4))
        self.linear = torch.nn.Linear(4, 5)

    def forward(self, x):
        return self.linear(x + self.param).clamp(min=0.0, max=1.0)


def docs_graph() -> fx.Graph:
    g = fx.Graph()
    x = g.placeholder("x")
    param = g.get_attr("param")
    add = g.call_function(operator.add, (x, param))
    linear = g.call_module("linear", (add,))
    g.output(g.call_method("clamp", (linear,), {"min": 0.0, "max": 1.0}))
    return g


def documented_forward() -> str:
    """The generated code shown in the documentation, in our naming and keyword style."""
    text = SEED.read_text()
    start = text.index("def forward(self, x):\n    param = self.param")
    end = text.index("return clamp_1", start) + len("return clamp_1")
    documented = text[start:end]
    documented = re.sub(r"\b(add|linear|clamp)_1\b", r"\1", documented)  # first use: no suffix
    return documented.replace("min = 0.0, max = 1.0", "min=0.0, max=1.0") + "\n"


def test_docs_example_generates_the_documented_code():
    assert docs_graph().python_code("self").src == documented_forward()


def test_docs_example_matches_eager():
    module = DocsModule()
    gm = compile_graph(docs_graph(), module)
    x = torch.randn(3, 4)
    assert_close(gm(x), module(x))


class TopkModule(torch.nn.Module):
    """The torch.fx documentation's Graph example."""

    def __init__(self) -> None:
        super().__init__()
        self.param = torch.nn.Parameter(torch.rand(3, 4))
        self.linear = torch.nn.Linear(4, 5)

    def forward(self, x):
        return torch.topk(torch.sum(self.linear(x + self.linear.weight).relu(), dim=-1), 3)


def test_topk_sum_relu_example_generates_readable_code_matching_eager():
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("linear.weight")
    add = g.call_function(operator.add, (x, w))
    lin = g.call_module("linear", (add,))
    relu = g.call_method("relu", (lin,))
    total = g.call_function(torch.sum, (relu,), {"dim": -1})
    g.output(g.call_function(torch.topk, (total, 3)))
    assert body(g) == [
        "def forward(self, x):",
        "linear_weight = self.linear.weight",
        "add = x + linear_weight;  x = linear_weight = None",
        "linear = self.linear(add);  add = None",
        "relu = linear.relu();  linear = None",
        "sum_1 = torch.sum(relu, dim=-1);  relu = None",
        "topk = torch.topk(sum_1, 3);  sum_1 = None",
        "return topk",
    ]
    module = TopkModule()
    x = torch.randn(5, 4)
    got, expected = compile_graph(g, module)(x), module(x)
    assert_close(got.values, expected.values)
    assert torch.equal(got.indices, expected.indices)


# ---------------------------------------------------------------- readable code
def test_source_is_valid_python():
    compile(docs_graph().python_code("self").src, "<generated>", "exec")


@pytest.mark.parametrize(
    ("op", "text"),
    [
        (operator.add, "x0 + x1"),
        (operator.sub, "x0 - x1"),
        (operator.mul, "x0 * x1"),
        (operator.truediv, "x0 / x1"),
        (operator.floordiv, "x0 // x1"),
        (operator.mod, "x0 % x1"),
        (operator.pow, "x0 ** x1"),
        (operator.matmul, "x0 @ x1"),
        (operator.and_, "x0 & x1"),
        (operator.or_, "x0 | x1"),
        (operator.xor, "x0 ^ x1"),
        (operator.lshift, "x0 << x1"),
        (operator.eq, "x0 == x1"),
        (operator.ne, "x0 != x1"),
        (operator.lt, "x0 < x1"),
        (operator.le, "x0 <= x1"),
        (operator.gt, "x0 > x1"),
        (operator.ge, "x0 >= x1"),
        (operator.is_, "x0 is x1"),
        (operator.is_not, "x0 is not x1"),
    ],
)
def test_binary_operators_print_infix(op, text):
    lines = body(one_call(op, n_inputs=2))
    assert any(line.endswith(f"= {text};  x0 = x1 = None") for line in lines), lines


def test_binary_operators_compute_like_python():
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    ops = [operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.pow]
    g.output(tuple(g.call_function(op, (a, b)) for op in ops))
    assert compile_graph(g)(7, 3) == tuple(op(7, 3) for op in ops)


def test_an_operator_with_a_parameter_prints_infix():
    g = fx.Graph()
    x = g.placeholder("x")
    p = g.get_attr("param")
    g.output(g.call_function(operator.add, (x, p)))
    assert "add = x + param;  x = param = None" in body(g)


@pytest.mark.parametrize(
    ("op", "text", "value", "expected"),
    [
        (operator.neg, "-x0", 3, -3),
        (operator.pos, "+x0", 3, 3),
        (operator.invert, "~x0", 3, -4),
        (operator.not_, "not x0", 3, False),
    ],
)
def test_unary_operators_print_as_prefix(op, text, value, expected):
    g = one_call(op)
    assert any(line.endswith(f"= {text};  x0 = None") for line in body(g))
    assert compile_graph(g)(value) == expected


def test_contains_prints_as_in():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.contains, ([1, 2, 3], x)))
    assert "contains = x in [1, 2, 3];  x = None" in body(g)
    assert compile_graph(g)(2) is True


def test_negative_constants_are_parenthesised_as_operands():
    # ``-1 ** x`` would be ``-(1 ** x)``; the generated code must keep ``(-1) ** x``.
    g = fx.Graph()
    x = g.placeholder("x")
    left = g.call_function(operator.pow, (-1, x))
    right = g.call_function(operator.pow, (x, -1))
    sub = g.call_function(operator.sub, (x, -3))
    neg = g.call_function(operator.neg, (-2.5,))
    g.output((left, right, sub, neg))
    lines = body(g)
    assert "pow_1 = (-1) ** x" in lines
    assert "pow_2 = x ** (-1)" in lines
    assert "sub = x - (-3);  x = None" in lines
    assert "neg = -(-2.5)" in lines
    assert compile_graph(g)(2) == ((-1) ** 2, 2**-1, 5, 2.5)


def test_getitem_prints_slices_ellipsis_and_none_as_subscripts():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.getitem, (x, (slice(None), slice(0, 2), None, ...))))
    assert "getitem = x[:, 0:2, None, ...];  x = None" in body(g)
    t = torch.randn(3, 4, 5)
    assert_close(compile_graph(g)(t), t[:, 0:2, None, ...])


@pytest.mark.parametrize(
    ("index", "text"),
    [
        (0, "x[0]"),
        (-1, "x[-1]"),
        (slice(1, None), "x[1:]"),
        (slice(None, -1), "x[:-1]"),
        (slice(None, None, 2), "x[::2]"),
        ((0,), "x[0,]"),
        ((), "x[()]"),
        ((slice(None), [0, 2]), "x[:, [0, 2]]"),
        ((1, slice(None, 2)), "x[1, :2]"),
        (Ellipsis, "x[...]"),
    ],
)
def test_getitem_index_forms(index, text):
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.getitem, (x, index)))
    assert f"getitem = {text};  x = None" in body(g)
    t = torch.arange(12).reshape(3, 4)
    assert torch.equal(compile_graph(g)(t), t[index])


def test_getitem_with_a_negative_step():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.getitem, (x, slice(None, None, -2))))
    assert "getitem = x[::-2];  x = None" in body(g)
    assert compile_graph(g)([0, 1, 2, 3]) == [3, 1]


def test_getitem_with_node_bounds_in_a_slice():
    g = fx.Graph()
    x, n = g.placeholder("x"), g.placeholder("n")
    g.output(g.call_function(operator.getitem, (x, slice(n, None))))
    assert "getitem = x[n:];  x = n = None" in body(g)
    assert compile_graph(g)([1, 2, 3, 4], 2) == [3, 4]


def test_getitem_on_a_constant_parenthesises_the_receiver():
    g = fx.Graph()
    i = g.placeholder("i")
    g.output(g.call_function(operator.getitem, ([10, 20, 30], i)))
    assert "getitem = ([10, 20, 30])[i];  i = None" in body(g)
    assert compile_graph(g)(1) == 20


def test_setitem_prints_as_an_assignment_and_mutates():
    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(operator.setitem, (x, (slice(None), 0), 5.0))
    g.output(x)
    assert "x[:, 0] = 5.0" in body(g)  # nothing reads the result: no binding
    t = torch.zeros(2, 2)
    out = compile_graph(g)(t)
    assert out is t
    assert_close(t, torch.tensor([[5.0, 0.0], [5.0, 0.0]]))


def test_inplace_add_mutates_a_tensor_in_place():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.iadd, (x, 1)))
    assert "iadd = x;  iadd += 1;  x = None" in body(g)
    t = torch.zeros(3)
    result = compile_graph(g)(t)
    assert result is t
    assert_close(t, torch.ones(3))


def test_inplace_add_leaves_an_int_untouched_like_operator_iadd():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(operator.iadd, (x, 1)), x))
    assert compile_graph(g)(5) == (operator.iadd(5, 1), 5)


def test_inplace_add_extends_a_list_in_place_like_operator_iadd():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.iadd, (x, [3])))
    values = [1, 2]
    assert compile_graph(g)(values) is values
    assert values == [1, 2, 3]


def test_getattr_prints_as_attribute_access():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(getattr, (x, "shape")))
    assert "getattr_1 = x.shape;  x = None" in body(g)
    assert compile_graph(g)(torch.zeros(2, 3)) == torch.Size([2, 3])


def test_getattr_with_a_non_identifier_name_stays_a_call():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(getattr, (x, "not an identifier", None)))
    assert "getattr_1 = getattr(x, 'not an identifier', None);  x = None" in body(g)
    assert compile_graph(g)(object()) is None


def test_method_calls_print_on_the_receiver():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_method("view", (x, -1, 2)))
    assert "view = x.view(-1, 2);  x = None" in body(g)
    assert compile_graph(g)(torch.arange(4)).shape == (2, 2)


def test_module_calls_with_numeric_path_parts_use_getattr_as_torch_fx_prints_them():
    root = torch.nn.Module()
    root.seq = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    g = fx.Graph()
    x = g.placeholder("x")
    h = g.call_module("seq.0", (x,))
    g.output(g.call_module("seq.1", (h,)))
    lines = body(g)
    assert 'seq_0 = getattr(self.seq, "0")(x);  x = None' in lines
    assert 'seq_1 = getattr(self.seq, "1")(seq_0);  seq_0 = None' in lines
    t = torch.randn(2, 3)
    assert_close(compile_graph(g, root)(t), root.seq(t))


def test_get_attr_with_a_keyword_path_part_goes_through_getattr():
    root = torch.nn.Module()
    inner = torch.nn.Module()
    inner.register_buffer("b", torch.ones(2))
    root.add_module("class", inner)
    g = fx.Graph()
    g.output(g.get_attr("class.b"))
    assert 'class_b = getattr(self, "class").b' in body(g)
    assert_close(compile_graph(g, root)(), torch.ones(2))


def test_kwargs_print_as_keyword_arguments():
    g = one_call(torch.sum, dim=-1, keepdim=True)
    assert "sum_1 = torch.sum(x0, dim=-1, keepdim=True);  x0 = None" in body(g)
    t = torch.randn(2, 3)
    assert_close(compile_graph(g)(t), t.sum(dim=-1, keepdim=True))


def test_values_are_released_after_their_last_use():
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    b = g.call_function(operator.add, (a, x))
    c = g.call_function(operator.mul, (b, a))
    g.output(c)
    assert body(g)[1:] == [
        "relu = torch.relu(x)",
        "add = relu + x;  x = None",
        "mul = add * relu;  add = relu = None",
        "return mul",
    ]


def test_values_returned_are_not_released():
    g = fx.Graph()
    x = g.placeholder("x")
    r = g.call_function(torch.relu, (x,))
    g.output((r, x))
    assert body(g)[1:] == ["relu = torch.relu(x)", "return (relu, x)"]


def test_node_type_annotations_appear_on_assignments():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.relu, (x,), type_expr=torch.Tensor))
    assert "relu: torch.Tensor = torch.relu(x);  x = None" in body(g)


# ----------------------------------------------------------------- signature
def signature(graph: fx.Graph) -> str:
    return body(graph)[0]


def test_placeholder_and_return_annotations():
    g = fx.Graph()
    a = g.placeholder("a", type_expr=torch.Tensor)
    b = g.placeholder("b", type_expr=int)
    c = g.placeholder("c", type_expr=List[int])
    d = g.placeholder("d", type_expr=list[int])
    e = g.placeholder("e", type_expr=int | None)
    g.output((a, b, c, d, e), type_expr=tuple)
    assert signature(g) == (
        "def forward(self, a: torch.Tensor, b: int, c: typing.List[int], d: list[int], "
        "e: int | None) -> tuple:"
    )
    gm = compile_graph(g)
    t = torch.ones(1)
    assert gm(t, 1, [2], [3], None) == (t, 1, [2], [3], None)
    assert typing.get_type_hints(type(gm).forward)["c"] == List[int]


def test_typing_union_annotations_round_trip():
    g = fx.Graph()
    x = g.placeholder("x", type_expr=typing.Union[int, str])
    g.output(x, type_expr=typing.Dict[str, typing.Tuple[int, ...]])
    gm = compile_graph(g)
    assert gm("s") == "s"
    hints = typing.get_type_hints(type(gm).forward)
    assert hints["x"] == typing.Union[int, str]
    assert hints["return"] == typing.Dict[str, typing.Tuple[int, ...]]


def test_optional_annotations_round_trip():
    g = fx.Graph()
    x = g.placeholder("x", type_expr=Optional[torch.Tensor])
    g.output(x)
    code = g.python_code("self")
    namespace = dict(code.globals)
    exec(code.src, namespace)  # evaluates the annotations, as importing a to_folder package does
    assert namespace["forward"](None, None) is None
    gm = compile_graph(g)
    assert typing.get_type_hints(type(gm).forward)["x"] == Optional[torch.Tensor]


def test_placeholder_defaults():
    g = fx.Graph()
    x = g.placeholder("x")
    lo = g.placeholder("lo", default_value=float("-inf"))
    hi = g.placeholder("hi", default_value=float("inf"))
    extra = g.placeholder("extra", default_value=None)
    dims = g.placeholder("dims", default_value=(0, 1))
    g.output((x, lo, hi, extra, dims))
    assert signature(g) == (
        "def forward(self, x, lo = float('-inf'), hi = float('inf'), extra = None, dims = (0, 1)):"
    )
    gm = compile_graph(g)
    assert gm(1) == (1, -math.inf, math.inf, None, (0, 1))
    assert gm(1, hi=5) == (1, -math.inf, 5, None, (0, 1))


def test_variadic_placeholders():
    g = fx.Graph()
    x = g.placeholder("x")
    args = g.placeholder("*args")
    kwargs = g.placeholder("**kwargs")
    g.output((x, args, kwargs))
    assert signature(g) == "def forward(self, x, *args, **kwargs):"
    assert (args.name, kwargs.name) == ("args", "kwargs")
    assert compile_graph(g)(1, 2, 3, k=4) == (1, (2, 3), {"k": 4})


def test_keyword_only_placeholder_after_star_args_may_lack_a_default():
    g = fx.Graph()
    args = g.placeholder("*args")
    flag = g.placeholder("flag")
    g.output((args, flag))
    assert signature(g) == "def forward(self, *args, flag):"
    assert compile_graph(g)(1, 2, flag=True) == ((1, 2), True)


def test_a_placeholder_named_like_a_builtin_is_still_callable_by_keyword():
    g = fx.Graph()
    inp = g.placeholder("input")
    assert inp.name == "input_1"
    g.output(g.call_function(len, (inp,)))
    src = g.python_code("self").src
    assert src.startswith("def forward(self, input):")
    gm = compile_graph(g)
    assert gm(input=[1, 2, 3]) == 3
    assert gm([1]) == 1


def test_a_placeholder_named_like_a_module_global_is_callable_by_keyword():
    g = fx.Graph()
    t = g.placeholder("torch")
    g.output(g.call_function(torch.relu, (t,)))
    assert signature(g) == "def forward(self, torch):"
    assert_close(compile_graph(g)(torch=torch.tensor([-1.0, 1.0])), torch.tensor([0.0, 1.0]))


def test_a_placeholder_named_like_a_module_global_is_callable_by_keyword_after_annotations():
    g = fx.Graph()
    x = g.placeholder("x", type_expr=torch.Tensor)
    t = g.placeholder("torch")
    g.output(g.call_function(operator.add, (x, t)))
    assert compile_graph(g)(x=1, torch=2) == 3


def test_a_placeholder_shadowing_a_builtin_the_code_needs_gets_the_builtin_rebound():
    g = fx.Graph()
    length = g.placeholder("len")
    values = g.placeholder("values")
    g.output((g.call_function(len, (values,)), length))
    assert compile_graph(g)(len=7, values=[1, 2]) == (2, 7)


# ----------------------------------------------------------------- globals
def helper(x):
    return x * 3


def test_node_names_never_shadow_user_functions():
    g = fx.Graph()
    x = g.placeholder("x")
    first = g.create_node("call_function", helper, (x,), name="helper")
    g.output(g.call_function(helper, (first,)))
    code = g.python_code("self")
    assert first.name == "helper"
    assert all(code.globals[name] is helper for name in code.globals if name.startswith("helper"))
    assert "helper" not in code.globals
    assert compile_graph(g)(2) == 18


def test_a_user_function_named_forward_is_still_called():
    def forward(x):
        return x + 100

    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.create_node("call_function", forward, (x,), name="out"))
    assert compile_graph(g)(1) == 101


def test_a_user_function_named_like_the_root_module_is_still_called():
    namespace: dict = {}
    exec("def self(x):\n    return x + 1000\n", namespace)
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.create_node("call_function", namespace["self"], (x,), name="out"))
    assert compile_graph(g)(1) == 1001


def test_functions_from_common_modules_resolve_through_globals():
    g = fx.Graph()
    x = g.placeholder("x")
    relu = g.call_function(F.relu, (x,))
    tanh = g.call_function(torch.tanh, (relu,))
    total = g.call_function(torch.sum, (tanh,))
    item = g.call_method("item", (total,))
    root = g.call_function(math.sqrt, (item,))
    getter = g.call_function(operator.itemgetter, (0,))
    count = g.call_function(len, (x,))
    shape = g.call_function(getattr, (x, "shape", None))
    g.output((root, count, shape, getter))
    code = g.python_code("self")
    src = code.src
    assert "torch.nn.functional.relu(x)" in src
    assert "torch.tanh(relu)" in src
    assert "math.sqrt(item)" in src
    assert "operator.itemgetter(0)" in src
    assert "len(x)" in src
    assert code.globals["torch"] is torch and code.globals["math"] is math
    assert code.globals["operator"] is operator
    t = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    got_root, got_count, got_shape, got_getter = compile_graph(g)(t)
    assert got_root == pytest.approx(math.sqrt(torch.tanh(F.relu(t)).sum().item()))
    assert (got_count, got_shape) == (2, torch.Size([2, 2]))
    assert got_getter([5, 6]) == 5


def test_a_local_function_resolves_through_globals():
    scale = 4

    def local_scale(x):  # defined here: not importable by any name
        return x * scale

    g = one_call(local_scale)
    code = g.python_code("self")
    assert code.globals["local_scale_1"] is local_scale  # the node took the plain name
    assert "local_scale = local_scale_1(x0);  x0 = None" in code.src
    assert compile_graph(g)(2) == 8


def test_a_lambda_resolves_through_globals():
    g = one_call(lambda x: x - 1)
    assert compile_graph(g)(5) == 4


def test_functions_passed_as_arguments_resolve_through_globals():
    def double(v):
        return 2 * v

    g = fx.Graph()
    xs = g.placeholder("xs")
    g.output(g.call_function(map, (double, xs)))
    assert list(compile_graph(g)([1, 2])) == [2, 4]


# ------------------------------------------------------------ constant values
@pytest.mark.parametrize(
    "value",
    [
        float("inf"),
        float("-inf"),
        -0.0,
        -7,
        1e300,
        1 + 2j,
        complex(0, -1.5),
        "text with 'quotes'",
        b"bytes",
        None,
        True,
        Ellipsis,
        slice(1, None, 2),
        range(2, 8, 3),
        (1, (2, [3, {"k": -1}])),
        torch.float16,
        torch.int64,
        torch.device("cpu"),
        torch.channels_last,
        torch.contiguous_format,
        torch.strided,
        torch.sparse_coo,
        torch.Size([2, 3]),
    ],
    ids=repr,
)
def test_constant_values_round_trip(value):
    g = fx.Graph()
    g.output((value,))
    (got,) = compile_graph(g)()
    assert got == value
    assert type(got) is type(value) or isinstance(value, list)


def test_nan_round_trips():
    g = fx.Graph()
    g.output(float("nan"))
    assert math.isnan(compile_graph(g)())
    assert "float('nan')" in g.python_code("self").src


def test_torch_values_as_call_arguments():
    g = fx.Graph()
    x = g.placeholder("x")
    moved = g.call_method(
        "to",
        (x,),
        {
            "dtype": torch.float64,
            "device": torch.device("cpu"),
            "memory_format": torch.channels_last,
        },
    )
    zeros = g.call_function(
        torch.zeros, (torch.Size([2, 3]),), {"layout": torch.strided, "dtype": torch.int32}
    )
    g.output((moved, zeros))
    src = g.python_code("self").src
    assert (
        "dtype=torch.float64, device=torch.device('cpu'), memory_format=torch.channels_last" in src
    )
    assert "torch.zeros(torch.Size([2, 3]), layout=torch.strided, dtype=torch.int32)" in src
    t = torch.randn(1, 3, 2, 2)
    got_moved, got_zeros = compile_graph(g)(t)
    assert got_moved.dtype == torch.float64
    assert got_moved.is_contiguous(memory_format=torch.channels_last)
    assert_close(got_moved, t.double())
    assert got_zeros.dtype == torch.int32 and got_zeros.shape == (2, 3)


def test_non_identifier_kwargs_are_passed_through_a_dict():
    def collect(**kwargs):
        return kwargs

    g = fx.Graph()
    g.output(g.call_function(collect, (), {"not valid": 1, "class": 2, "ok": 3}))
    assert compile_graph(g)() == {"not valid": 1, "class": 2, "ok": 3}


# ------------------------------------------------------------------- errors
def test_a_graph_without_output_is_a_codegen_error():
    g = fx.Graph()
    g.placeholder("x")
    with pytest.raises(fx.CodegenError, match=r"no output node.*graph\.output"):
        g.python_code("self")


def test_a_graph_with_two_outputs_is_a_codegen_error():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(x)
    g.output(x)
    with pytest.raises(fx.CodegenError, match=r"2 output nodes \(%output, %output_1\)"):
        g.python_code("self")


def test_a_node_after_the_output_is_a_codegen_error():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(x)
    g.call_function(torch.relu, (x,))
    with pytest.raises(fx.CodegenError, match="%relu comes after the output"):
        g.python_code("self")


def test_a_required_placeholder_after_a_defaulted_one_is_a_codegen_error():
    g = fx.Graph()
    g.placeholder("x", default_value=1)
    y = g.placeholder("y")
    g.output(y)
    with pytest.raises(fx.CodegenError, match="placeholder %y has no default but follows %x"):
        g.python_code("self")


def test_a_placeholder_after_var_keyword_is_a_codegen_error():
    g = fx.Graph()
    g.placeholder("**kwargs")
    y = g.placeholder("y")
    g.output(y)
    with pytest.raises(fx.CodegenError, match="%y"):
        g.python_code("self")


def test_codegen_error_is_a_value_error():
    assert issubclass(fx.CodegenError, ValueError)


def test_verbose_mode_adds_the_stack_trace_as_a_comment():
    g = fx.Graph()
    x = g.placeholder("x")
    r = g.call_function(torch.relu, (x,))
    r.stack_trace = '  File "model.py", line 12, in forward\n    return torch.relu(x)\n'
    g.output(r)
    src = g.python_code("self", verbose=True).src
    assert '# File "model.py", line 12, in forward | return torch.relu(x)' in src
    compile(src, "<generated>", "exec")


def test_an_unused_call_result_is_not_bound():
    # An impure call kept for its effect (print) becomes a bare expression
    # statement, so its result is dropped at once instead of living to the return.
    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(print, (x,))
    g.output(x)
    body = g.python_code("self").src.splitlines()[1:]
    assert body == ["    print(x)", "    return x"]
