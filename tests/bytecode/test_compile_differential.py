"""fxloom.compile against plain Python, case by case: the cases test_compile_semantics.py leaves out.

``assert_same(fn, *args, **kwargs)`` runs ``fn`` on deep copies of its arguments plainly and
under ``fxloom.compile`` (twice, so the cached path runs too) and compares the results
(``torch.testing.assert_close`` for tensors, type and structure for the rest), the exception
raised (type and message) and the side effects (the arguments after the call: list appends,
attribute writes; and the printed text, in order). The core cases (arithmetic, containers,
closures, breaks, guards) live in test_compile_semantics.py; this file adds the ones it does
not cover, one behaviour per test.
"""

from __future__ import annotations

import copy
import math
import sys
from typing import Any

import pytest
import torch

import fxloom
from fxloom.bytecode.breaks import CompileError

pytestmark = pytest.mark.usefixtures("one_thread")

x3 = torch.tensor([0.5, -1.0, 2.0])


def _compare(got: Any, want: Any) -> None:
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _compare(a, b)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            _compare(got[key], want[key])
    elif hasattr(want, "__dict__") and not isinstance(want, type):
        _compare(vars(got), vars(want))
    else:
        assert got == want


def _outcome(fn: Any, args: tuple, kwargs: dict, capsys: Any) -> tuple:
    args, kwargs = copy.deepcopy((args, kwargs))
    try:
        result, error = fn(*args, **kwargs), None
    except Exception as raised:  # noqa: BLE001 - compared by the caller
        result, error = None, raised
    return result, (type(error), str(error)), (args, kwargs), capsys.readouterr().out


def assert_same(fn: Any, *args: Any, capsys: Any, **kwargs: Any) -> Any:
    """Plain and compiled runs of ``fn`` agree on result, exception and side effects."""
    want = _outcome(fn, args, kwargs, capsys)
    compiled = fxloom.compile(fn)
    for _ in range(2):
        got = _outcome(compiled, args, kwargs, capsys)
        _compare(got[0], want[0])
        assert got[1] == want[1], "a different exception"
        _compare(got[2], want[2])
        assert got[3] == want[3], "printed text differs"
    return compiled


# ----------------------------------------------------------------------------- side effects
def test_appending_to_a_list_argument_is_kept(capsys):
    def f(x, seen):
        seen.append(x.sum())
        seen.append("done")
        return x * len(seen)

    assert_same(f, x3, [1], capsys=capsys)


def test_several_prints_keep_their_order_around_tensor_code(capsys):
    def f(x):
        print("first")
        y = x.exp()
        print("then", y.shape)
        return y - 1

    compiled = assert_same(f, x3, capsys=capsys)
    assert compiled.explain().break_count == 0


def test_a_torch_error_reaches_the_caller_with_eagers_type_and_message(capsys):
    assert_same(lambda x: x @ torch.ones(4), x3, capsys=capsys)


def test_a_python_error_reaches_the_caller_with_eagers_type_and_message(capsys):
    assert_same(lambda x, table: x * table["missing"], x3, {"present": 1}, capsys=capsys)


# ----------------------------------------------------------------------------- values and calls
def test_keyword_arguments_to_the_compiled_function(capsys):
    def f(x, *, scale, shift=0.0):
        return x * scale + shift

    assert_same(f, x3, scale=2.0, shift=1.0, capsys=capsys)


def test_star_unpacking_into_a_call_and_a_nested_return_structure(capsys):
    def f(x):
        parts = [x, x * 2, x * 3]
        head, *tail = parts
        return {"sum": torch.stack([*tail, head]).sum(0), "pair": (head, tail), "n": len(tail)}

    assert_same(f, x3, capsys=capsys)


def test_math_on_python_floats_and_ints_next_to_tensors(capsys):
    def f(x, n):
        k = math.floor(n / 2) + n % 3 + int(2.7)
        return x * k + math.pi, k, float(n) ** 0.5

    assert_same(f, x3, 7, capsys=capsys)


def test_a_transformers_helper_is_followed(capsys):
    from transformers.activations import ACT2FN

    assert_same(lambda x: ACT2FN["gelu_new"](x) + ACT2FN["silu"](x), x3, capsys=capsys)


def test_a_module_forward_with_super_matches_eager_on_several_inputs(capsys):
    class Base(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))

        def forward(self, x):
            return x * self.scale

    class Child(Base):
        def forward(self, x):
            return super().forward(x) + 1

    model = Child()
    compiled = fxloom.compile(model)
    with torch.no_grad():
        for x in (x3, -x3, x3 * 10):
            torch.testing.assert_close(compiled(x), model(x))
    assert len(compiled.cache) == 1


# ----------------------------------------------------------------------------- graph breaks
def test_a_data_dependent_branch_matches_eager_over_several_inputs(capsys):
    def f(x):
        if x.sum() > 0:
            return x.exp()
        return x.abs() - 1

    compiled = fxloom.compile(f)
    for x in (x3, -x3.abs(), x3 * 0 + 1, -x3 * 4):
        torch.testing.assert_close(compiled(x), f(x))
    [stop] = compiled.explain().breaks
    assert stop.where.startswith("test_compile_differential.py:")
    assert "if x.sum() > 0" in stop.code


def test_fxloom_explain_reports_one_break_for_a_data_dependent_branch():
    def f(x):
        y = x + 1
        if y.sum() > 0:
            return y
        return -y

    report = fxloom.explain(f, x3)
    assert report.break_count == 1 and report.graph_count >= 1
    assert report.breaks[0].where.split(":")[1].isdigit()


def test_fullgraph_refuses_item_naming_the_line():
    with pytest.raises(CompileError, match=r"test_compile_differential.py:\d+"):
        fxloom.compile(lambda x: x * x.sum().item(), fullgraph=True)(x3)


# ----------------------------------------------------------------------------- guards
def test_two_shapes_give_two_cache_entries_both_equal_to_eager():
    def f(x):
        return torch.softmax(x * 2, dim=-1)

    compiled = fxloom.compile(f)
    small, big = torch.randn(2, 3), torch.randn(4, 5)
    torch.testing.assert_close(compiled(small), f(small))
    torch.testing.assert_close(compiled(big), f(big))
    torch.testing.assert_close(compiled(small), f(small))
    assert len(compiled.cache) == 2


class Config:
    def __init__(self, scale: float) -> None:
        self.scale = scale


def test_a_changed_attribute_of_an_argument_recompiles():
    compiled = fxloom.compile(lambda x, config: x * config.scale)
    config = Config(2.0)
    torch.testing.assert_close(compiled(x3, config), x3 * 2.0)
    config.scale = 3.0
    torch.testing.assert_close(compiled(x3, config), x3 * 3.0)
    assert len(compiled.cache) == 2


def test_the_recompile_limit_warning_names_the_failing_guard_then_runs_eagerly():
    compiled = fxloom.compile(lambda x: x.sum(0), recompile_limit=1)
    compiled(torch.ones(2, 3))
    with pytest.warns(UserWarning, match="recompile_limit") as caught:
        torch.testing.assert_close(compiled(torch.ones(5, 3)), torch.full((3,), 5.0))
    assert "shape" in str(caught[0].message) or "size" in str(caught[0].message)
    torch.testing.assert_close(compiled(torch.ones(7, 3)), torch.full((3,), 7.0))
    assert len(compiled.cache) == 1


@pytest.mark.skipif(sys.version_info < (3, 11), reason="fxloom.compile reads 3.11+ bytecode")
def test_a_generator_argument_is_consumed_as_eager_consumes_it(capsys):
    def f(x, values):
        return x * sum(values)

    want = f(x3, (v for v in range(4)))
    got = fxloom.compile(f)(x3, (v for v in range(4)))
    torch.testing.assert_close(got, want)
