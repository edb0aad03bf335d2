"""fxloom.compile against plain Python, case by case: the cases test_compile_semantics.py leaves out.

``assert_same(fn, *args, **kwargs)`` runs ``fn`` on deep copies of its arguments plainly and
under ``fxloom.compile`` (twice, so the cached path runs too) and compares the results
(``differential.compare``: ``torch.testing.assert_close`` for tensors, type and structure for
the rest), the exception
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
from differential.compare import compare

import fxloom
from fxloom.bytecode.breaks import CompileError

pytestmark = pytest.mark.usefixtures("one_thread")

x3 = torch.tensor([0.5, -1.0, 2.0])


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
        compare(got[0], want[0])
        assert got[1] == want[1], "a different exception"
        compare(got[2], want[2], "arguments")
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


def test_fullgraph_refuses_a_data_read_naming_the_line():
    with pytest.raises(CompileError, match=r"test_compile_differential.py:\d+"):
        fxloom.compile(lambda x: x * float(x.sum()), fullgraph=True)(x3)


def test_fullgraph_refuses_a_branch_on_an_item_naming_the_line():
    with pytest.raises(CompileError, match=r"test_compile_differential.py:\d+"):
        fxloom.compile(lambda x: x * 2 if x.sum().item() > 0 else x, fullgraph=True)(x3)


def test_fullgraph_takes_an_item_only_computed_with():
    fn = lambda x: x / (x.abs().max().item() + 1)  # noqa: E731
    torch.testing.assert_close(fxloom.compile(fn, fullgraph=True)(x3), fn(x3))


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


# ----------------------------------------------------------------------------- more Python
def test_an_in_place_update_of_a_tensor_argument_is_seen_by_the_caller(capsys):
    def f(x):
        x.add_(1)
        return x * 2

    assert_same(f, x3.clone(), capsys=capsys)


def test_writing_into_a_dict_argument_is_kept(capsys):
    def f(x, store):
        store["doubled"] = x * 2
        store.setdefault("count", 0)
        store["count"] += 1
        return store["doubled"].sum()

    assert_same(f, x3, {"count": 4}, capsys=capsys)


def test_a_global_statement_writes_the_module_global(capsys):
    global COUNTER
    COUNTER = 0

    def f(x):
        global COUNTER
        COUNTER += 1
        return x + COUNTER

    compiled = fxloom.compile(f)
    torch.testing.assert_close(compiled(x3), x3 + 1)
    assert COUNTER == 1


COUNTER = 0


def test_shape_arithmetic_and_torch_size_unpacking(capsys):
    def f(x):
        rows, cols = x.shape
        return x.reshape(cols, rows) * (rows * cols), x.shape[-1] // 2, x.size(0)

    assert_same(f, torch.randn(2, 6), capsys=capsys)


def test_zip_enumerate_sorted_and_chained_comparisons(capsys):
    def f(x, names):
        order = sorted(names, key=len)
        total = sum(x * i for i, _ in enumerate(order))
        pairs = [(n, i) for n, i in zip(order, range(10)) if 0 <= i < 2]
        return total, pairs, "-".join(n.upper() for n in order)

    assert_same(f, x3, ["ccc", "a", "bb"], capsys=capsys)


def test_a_custom_context_manager_runs_its_enter_and_exit(capsys):
    class Announce:
        def __enter__(self):
            print("enter")
            return self

        def __exit__(self, *exc):
            print("exit")
            return False

    def f(x):
        with Announce():
            y = x * 3
        return y

    assert_same(f, x3, capsys=capsys)


def test_try_finally_runs_the_finally_block(capsys):
    def f(x, log):
        try:
            return x.relu()
        finally:
            log.append("cleaned")

    assert_same(f, x3, [], capsys=capsys)


def test_an_assert_statement_raises_as_eager_does(capsys):
    def f(x, n):
        assert n > 0, f"n must be positive, got {n}"
        return x * n

    assert_same(f, x3, -1, capsys=capsys)


def test_getattr_hasattr_and_type_names(capsys):
    def f(x, obj):
        scale = getattr(obj, "scale", 1.0)
        tag = type(x).__name__ if hasattr(obj, "scale") else "none"
        return x * scale, tag, isinstance(obj, (int, Config))

    assert_same(f, x3, Config(2.5), capsys=capsys)
    assert_same(f, x3, 4, capsys=capsys)


def test_a_while_loop_on_a_python_counter(capsys):
    def f(x):
        steps = 0
        while steps < 4:
            x = x * 0.5 + 1
            steps += 1
        return x, steps

    assert_same(f, x3, capsys=capsys)


def test_a_while_loop_stopping_on_a_tensor_value(capsys):
    def f(x):
        steps = 0
        while x.abs().max() > 0.1:
            x = x / 2
            steps += 1
        return x, steps

    assert_same(f, x3, capsys=capsys)


def test_instantiating_a_user_class_inside_the_function(capsys):
    def f(x):
        config = Config(x.shape[0])
        return x * config.scale, config

    assert_same(f, x3, capsys=capsys)


def test_a_lambda_default_captured_in_a_loop(capsys):
    def f(x):
        scalers = [lambda t, k=k: t * k for k in range(3)]
        return [s(x) for s in scalers]

    assert_same(f, x3, capsys=capsys)


def test_iterating_over_the_rows_of_a_tensor(capsys):
    def f(x):
        return [row.sum() * i for i, row in enumerate(x)]

    assert_same(f, torch.randn(3, 2), capsys=capsys)


def test_a_user_generator_function_inside(capsys):
    def f(x):
        def halves(t):
            for _ in range(3):
                t = t / 2
                yield t

        return list(halves(x)), sum(1 for _ in halves(x))

    assert_same(f, x3, capsys=capsys)


def test_tolist_and_a_python_loop_over_its_values(capsys):
    def f(x):
        values = x.tolist()
        return x * max(values), [round(v, 3) for v in values]

    assert_same(f, x3, capsys=capsys)


def test_sorting_a_list_argument_in_place(capsys):
    def f(x, order):
        order.sort(reverse=True)
        return x * order[0]

    assert_same(f, x3, [1, 3, 2], capsys=capsys)


def test_comparing_shapes_to_torch_size_and_tuples(capsys):
    def f(x):
        return x.shape == (3,), x.shape == torch.Size([3]), x.shape[0] in (1, 3), x.ndim

    assert_same(f, x3, capsys=capsys)


def test_a_print_and_an_item_inside_a_for_loop(capsys):
    def f(x):
        total = 0.0
        for step in range(3):
            x = x * 2
            total += x.max().item()
            print("step", step, round(total, 4))
        return x, total

    compiled = assert_same(f, x3, capsys=capsys)
    assert compiled.explain().runs_as_python is None


def test_kwargs_dict_is_a_fresh_dict_each_call(capsys):
    def f(x, **options):
        options["seen"] = True
        return x * len(options), sorted(options)

    assert_same(f, x3, a=1, b=2, capsys=capsys)
