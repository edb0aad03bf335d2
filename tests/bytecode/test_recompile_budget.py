"""The recompile budget: counted by reason, never silent at its limit.

``recompile_limit`` counts compiles, the first included, one per distinct *reason*: a source
made symbolic (a size that changed) costs once however many values follow; a source that stays
guarded by value costs once per value. At the limit ``on_limit="eager"`` runs the function as
Python with one warning, ``on_limit="raise"`` raises ``RecompileLimitError``; both say the
source, the values seen there, the line and the fix, and ``explain()`` lists every miss. Every
result is compared with eager.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import fxloom
from fxloom.bytecode.breaks import CompileError

pytestmark = pytest.mark.usefixtures("one_thread")


def times(x, n):
    return x * n + 1


def test_an_int_that_keeps_changing_raises_at_the_limit_naming_the_source_and_its_values():
    compiled = fxloom.compile(times, dynamic=False, recompile_limit=4, on_limit="raise")
    x = torch.randn(3)
    for n in range(1, 5):
        torch.testing.assert_close(compiled(x, n), times(x, n))
    with pytest.raises(fxloom.RecompileLimitError) as raised:
        compiled(x, 5)
    message = str(raised.value)
    assert "recompile_limit=4" in message
    assert "source: n (its value)" in message
    assert "values seen at n: 1, 2, 3, 4, 5" in message
    assert "argument 'n' of times" in message  # the line: where n enters
    assert "dynamic=True" in message and "raise recompile_limit" in message  # the fix


def test_the_limit_error_is_a_compile_error():
    assert issubclass(fxloom.RecompileLimitError, CompileError)


def test_after_raising_the_entries_made_still_serve_their_calls():
    compiled = fxloom.compile(times, dynamic=False, recompile_limit=2, on_limit="raise")
    x = torch.randn(3)
    compiled(x, 1), compiled(x, 2)
    with pytest.raises(fxloom.RecompileLimitError):
        compiled(x, 3)
    torch.testing.assert_close(compiled(x, 2), times(x, 2))
    with pytest.raises(fxloom.RecompileLimitError):  # every call that would compile raises
        compiled(x, 4)


def test_on_limit_eager_warns_once_and_every_call_equals_eager():
    compiled = fxloom.compile(times, dynamic=False, recompile_limit=4)
    x = torch.randn(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 21):
            torch.testing.assert_close(compiled(x, n), times(x, n))
    limit = [w for w in caught if "recompile_limit" in str(w.message)]
    assert len(limit) == 1
    assert "values seen at n: 1, 2, 3, 4, 5" in str(limit[0].message)
    assert limit[0].filename == __file__  # points at the user's call
    assert len(compiled.cache) == 4


def test_a_size_that_changes_on_every_call_is_one_reason():
    def f(x):
        return x.sum(0) * 2

    compiled = fxloom.compile(f, recompile_limit=2, on_limit="raise")
    for n in range(2, 12):  # dim 0 changes (promoted), then dim 1 too (the same source again)
        x = torch.randn(n, 3 if n < 6 else n)
        torch.testing.assert_close(compiled(x), f(x))
    report = compiled.explain()
    assert [r.outcome for r in report.recompiles] == ["promoted", "promoted"]
    assert {(r.source, r.kind) for r in report.recompiles} == {("x", "size")}
    assert report.recompiles_counted == 2


def test_distinct_reasons_are_counted_each():
    def f(x, n, flag):
        return x * n if flag else x - n

    compiled = fxloom.compile(f, dynamic=False, recompile_limit=3, on_limit="raise")
    x = torch.randn(3)
    for args in [(x, 1, True), (x, 2, True), (x, 2, False)]:  # n's value, then flag's
        torch.testing.assert_close(compiled(*args), f(*args))
    assert [r.source for r in compiled.explain().recompiles] == ["n", "flag"]
    with pytest.raises(fxloom.RecompileLimitError, match="source: n"):
        compiled(x, 3, False)


def test_explain_lists_each_recompile_with_its_reason_and_value():
    compiled = fxloom.compile(times, dynamic=False, recompile_limit=3)
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (1, 2, 3, 4):
            torch.testing.assert_close(compiled(x, n), times(x, n))
    report = compiled.explain()
    assert report.recompiles == ["n == 1", "n == 2", "n == 3"]  # the guards that failed
    assert [r.value for r in report.recompiles] == ["2", "3", "4"]
    assert [r.outcome for r in report.recompiles] == ["compiled", "compiled", "ran as Python"]
    rendered = str(report)
    assert "recompiles (3 of recompile_limit=3" in rendered
    assert "ran as Python" in rendered


def test_a_type_change_is_named_as_a_type_reason():
    compiled = fxloom.compile(times, recompile_limit=1, on_limit="raise")
    x = torch.randn(3)
    compiled(x, 2)
    with pytest.raises(fxloom.RecompileLimitError, match=r"source: n \(its type\)") as raised:
        compiled(x, 2.5)
    assert "values seen at n: int, float" in str(raised.value)


def test_on_limit_takes_eager_or_raise():
    with pytest.raises(ValueError, match="on_limit"):
        fxloom.compile(times, on_limit="ignore")


def test_a_size_the_program_fixes_counts_per_value_and_names_the_line():
    def unrolled(x):
        total = x[0]
        for i in range(1, x.shape[0]):
            total = total + x[i]
        return total

    compiled = fxloom.compile(unrolled, recompile_limit=4, on_limit="raise")
    with pytest.raises(fxloom.RecompileLimitError) as raised:
        for n in range(2, 20):
            x = torch.randn(n, 3)
            torch.testing.assert_close(compiled(x), unrolled(x))
    message = str(raised.value)
    assert "source: x (its fixed size)" in message
    assert "values seen at x: (2, 3), (3, 3), (4, 3), (5, 3), (6, 3)" in message
    assert "for i in range(1, x.shape[0]):" in message  # the line that fixed it


def test_a_counter_attribute_names_the_module_attribute_and_the_line_that_reads_it():
    class Counts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.step = 0

        def forward(self, x):
            self.step += 1
            return x * self.step

    model, twin = Counts(), Counts()
    compiled = fxloom.compile(model, dynamic=False, recompile_limit=3)
    x = torch.randn(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(6):
            torch.testing.assert_close(compiled(x), twin(x))
    (warning,) = [w for w in caught if "recompile_limit" in str(w.message)]
    assert "source: self.step (its value)" in str(warning.message)
    assert "self.step += 1" in str(warning.message)
