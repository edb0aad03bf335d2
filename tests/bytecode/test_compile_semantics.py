"""fxloom.compile runs programs as Python does: each case run plainly and compiled, compared.

``same(fn, *args)`` runs ``fn`` on deep copies of its arguments twice — plainly and under
``fxloom.compile`` — and compares the results (tensors closely, everything else by value),
the exception raised (type and message) and the side effects (the arguments after the call,
what was printed). A case runs twice compiled, so the cached path is compared too. The
graph breaks the case is expected to have are checked against ``explain()``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import fxloom
from fxloom.bytecode.breaks import CompileError

pytestmark = pytest.mark.usefixtures("one_thread")


def _equal(got, want) -> bool:
    if isinstance(want, torch.Tensor):
        return (
            isinstance(got, torch.Tensor)
            and got.shape == want.shape
            and torch.allclose(got, want, atol=1e-6)
        )
    if isinstance(want, (list, tuple)):
        return type(got) is type(want) and len(got) == len(want) and all(map(_equal, got, want))
    if isinstance(want, dict):
        return (
            type(got) is type(want)
            and got.keys() == want.keys()
            and all(_equal(got[k], want[k]) for k in want)
        )
    if hasattr(want, "__dict__") and not isinstance(want, type):  # objects: by their state
        return type(got) is type(want) and _equal(vars(got), vars(want))
    return got == want


def _run(fn, args, capsys):
    args = copy.deepcopy(args)
    try:
        result, error = fn(*args), None
    except Exception as raised:  # noqa: BLE001 - compared below
        result, error = None, raised
    return result, error, args, capsys.readouterr().out


def same(fn, *args, capsys, breaks: int = 0, calls: int = 2):
    """Run ``fn`` plainly and compiled ``calls`` times on ``args``; assert all agree."""
    expected = _run(fn, args, capsys)
    compiled = fxloom.compile(fn)
    for _ in range(calls):
        got = _run(compiled, args, capsys)
        assert _equal(got[0], expected[0]), (got[0], expected[0])
        assert type(got[1]) is type(expected[1]) and str(got[1]) == str(expected[1])
        assert _equal(got[2], expected[2]), "the arguments after the call differ"
        assert got[3] == expected[3], "printed output differs"
    assert compiled.explain().break_count == breaks, compiled.explain()
    return compiled


x3 = torch.tensor([0.5, -1.0, 2.0])


# ----------------------------------------------------------------------------- values
def test_tensor_and_python_arithmetic(capsys):
    same(lambda x, n: (x * n + 1) / 2 - x**2 @ x, x3, 3, capsys=capsys)


def test_containers_build_unpack_and_slice(capsys):
    def f(x):
        a, *rest = [x, x + 1, x + 2]
        pair = {"a": a, "rest": rest[::-1]}
        return pair["rest"][0], len(rest), pair.get("missing", 7), (a, *rest)[1:]

    same(f, x3, capsys=capsys)


def test_comprehensions_of_each_kind(capsys):
    def f(x):
        squares = [x * i for i in range(3)]
        named = {f"k{i}": t.sum() for i, t in enumerate(squares)}
        return squares, named, sum(t.mean() for t in squares), {len(squares)}

    same(f, x3, capsys=capsys)


def test_closures_and_nonlocal(capsys):
    def f(x):
        count = 0

        def bump(t):
            nonlocal count
            count += 1
            return t * count

        return bump(x) + bump(x), count

    same(f, x3, capsys=capsys)


def test_star_args_and_keyword_arguments(capsys):
    def inner(a, b=2, *rest, scale=1.0, **options):
        return (a + b + sum(rest)) * scale + options.get("shift", 0)

    def f(x, *args, **kwargs):
        return inner(x, *args, **kwargs), inner(x, scale=3.0)

    same(lambda x: f(x, 1, 2, 3, scale=0.5, shift=x), x3, capsys=capsys)


def test_default_and_keyword_only_arguments_bind_as_python_binds(capsys):
    def f(x, y=None, *, mode="add"):
        other = x if y is None else y
        return x + other if mode == "add" else x * other

    compiled = fxloom.compile(f)
    for call in ((x3,), (x3, x3 * 2), (x3,)):
        assert torch.equal(compiled(*call), f(*call))
    assert torch.equal(compiled(x3, mode="mul"), f(x3, mode="mul"))


@dataclasses.dataclass
class Output:
    value: torch.Tensor
    count: int


def test_a_dataclass_return(capsys):
    same(lambda x: Output(x.relu(), 2), x3, capsys=capsys)


def test_a_hugging_face_model_output_return(capsys):
    from transformers.modeling_outputs import BaseModelOutput

    got = fxloom.compile(lambda x: BaseModelOutput(last_hidden_state=x * 2))(x3)
    assert type(got) is BaseModelOutput and torch.equal(got.last_hidden_state, x3 * 2)


def test_isinstance_and_string_formatting_of_shapes(capsys):
    def f(x):
        kind = "tensor" if isinstance(x, torch.Tensor) else "other"
        return f"{kind} {tuple(x.shape)!r:>12} {x.dim():03d}", x.float()

    same(f, x3, capsys=capsys)


class Scaler:
    def __init__(self, factor):
        self.factor = factor

    @property
    def doubled(self):
        return self.factor * 2

    def apply(self, x):
        return x * self.doubled


def test_methods_and_properties_of_a_user_class(capsys):
    same(lambda x, s: s.apply(x) + s.factor, x3, Scaler(3), capsys=capsys)


def test_an_attribute_assigned_on_an_argument_is_replayed(capsys):
    def f(x, s):
        s.factor = s.factor + 1
        s.last = x * 2
        return x + s.factor

    same(f, x3, Scaler(1), capsys=capsys)


def test_library_code_is_followed(capsys):
    def f(x):
        return F.gelu(x) + math.sqrt(4.0) + torch.nn.functional.softmax(x, dim=0)

    same(f, x3, capsys=capsys)


class Base(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x)


class Child(Base):
    def forward(self, x):
        return super().forward(x).relu()


def test_super_in_a_module_forward():
    model = Child().eval()
    with torch.no_grad():
        assert torch.allclose(fxloom.compile(model)(x3), model(x3))


def test_with_no_grad_inside_the_function():
    lin = torch.nn.Linear(3, 3)

    def f(x):
        with torch.no_grad():
            frozen = lin(x)
        return frozen, lin(x)

    got, want = fxloom.compile(f)(x3), f(x3)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want] == [False, True]
    assert torch.is_grad_enabled()


# ----------------------------------------------------------------------------- graph breaks
def test_a_branch_on_data_is_split_and_runs_both_ways(capsys):
    def f(x):
        y = x * 2
        if y.sum() > 0:
            return y.exp()
        return -y

    compiled = same(f, x3, capsys=capsys, breaks=1)
    assert torch.equal(compiled(-x3.abs()), f(-x3.abs()))
    stop = compiled.explain().breaks[0]
    assert stop.where.startswith("test_compile_semantics.py:") and "if y.sum() > 0" in stop.code


def test_float_reads_data_between_graphs(capsys):
    same(lambda x: x / (float(x.abs().max()) + 1), x3, capsys=capsys, breaks=1)


def test_item_only_computed_with_stays_in_the_graph(capsys):
    same(lambda x: x / (x.abs().max().item() + 1), x3, capsys=capsys, breaks=0)


def test_print_runs_after_the_graph_without_a_break(capsys):
    def f(x):
        y = x.relu()
        print("shape", tuple(y.shape), y.sum())
        return y + 1

    same(f, x3, capsys=capsys, breaks=0)


def test_logging_and_warnings_run_without_a_break(caplog):
    log = logging.getLogger("fxloom.test")

    def f(x):
        log.warning("scaling %s", tuple(x.shape))
        warnings.warn("deprecated path", UserWarning, stacklevel=2)
        return x * 2

    compiled = fxloom.compile(f)
    with pytest.warns(UserWarning, match="deprecated path"):
        assert torch.equal(compiled(x3), x3 * 2)
    assert "scaling (3,)" in caplog.text
    assert compiled.explain().break_count == 0


def test_a_break_inside_a_for_loop_does_not_run_the_function_as_python(capsys):
    def f(x):
        for _ in range(3):
            x = torch.tanh(x * 2)
            if x.sum() > 0:
                x = x - 0.5
        return x

    compiled = same(f, x3, capsys=capsys, breaks=2)
    assert compiled.explain().runs_as_python is None


def test_try_except_around_tensor_code(capsys):
    def f(x, table):
        try:
            value = table["scale"]
        except KeyError as error:
            print("missing", error)
            value = 1.0
        return x * value

    same(f, x3, {}, capsys=capsys, breaks=1)
    same(f, x3, {"scale": 3.0}, capsys=capsys)


def test_an_exception_reaches_the_caller_with_the_users_line(capsys):
    def f(x):
        if x.sum() > 0:
            raise ValueError("positive input")
        return x

    compiled = same(f, x3, capsys=capsys, breaks=2)  # the branch, and the raise
    with pytest.raises(ValueError) as raised:
        compiled(x3)
    # Interpreted, fxloom adds the line as a note; once the function runs as Python (no piece
    # after the raise can be captured), the traceback has the user's own frame.
    notes = getattr(raised.value, "__notes__", [])
    assert any("test_compile_semantics.py" in note for note in notes) or any(
        entry.frame.code.name == "f" for entry in raised.traceback
    )


def test_fullgraph_refuses_a_break_naming_the_line():
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(CompileError, match=r"test_compile_semantics.py:\d+.*tensor's value"):
        fxloom.compile(f, fullgraph=True)(x3)


def test_random_numbers_are_not_frozen():
    import random

    compiled = fxloom.compile(lambda x: x * random.random())
    assert not torch.equal(compiled(x3), compiled(x3))


# ----------------------------------------------------------------------------- guards
@pytest.mark.parametrize(
    "change",
    [
        lambda x: x.double(),
        lambda x: torch.cat([x, x]),
        lambda x: x.clone().requires_grad_(),
    ],
    ids=["dtype", "shape", "requires_grad"],
)
def test_a_changed_tensor_compiles_a_new_entry(change):
    compiled = fxloom.compile(lambda x: x * 2 + 1)
    compiled(x3)
    other = change(x3)
    assert torch.allclose(compiled(other), other * 2 + 1)
    assert len(compiled.cache) == 2


def test_an_int_argument_is_guarded_by_value():
    compiled = fxloom.compile(lambda x, n: x * n)
    assert torch.equal(compiled(x3, 2), x3 * 2)
    assert torch.equal(compiled(x3, 3), x3 * 3)
    assert len(compiled.cache) == 2


GLOBAL_SCALE = 2.0


def test_a_changed_global_recompiles():
    global GLOBAL_SCALE

    def f(x):
        return x * GLOBAL_SCALE

    compiled = fxloom.compile(f)
    compiled(x3)
    GLOBAL_SCALE = 5.0
    try:
        assert torch.equal(compiled(x3), x3 * 5.0)
    finally:
        GLOBAL_SCALE = 2.0


def test_grad_mode_is_part_of_the_guard():
    weight = torch.randn(3, requires_grad=True)
    compiled = fxloom.compile(lambda x: x * weight)
    assert compiled(x3).requires_grad
    with torch.no_grad():
        assert not compiled(x3).requires_grad


def test_a_parameter_updated_in_place_is_seen_without_recompiling():
    model = torch.nn.Linear(3, 3)
    compiled = fxloom.compile(model)
    with torch.no_grad():
        compiled(x3)
        model.weight.add_(1.0)
        assert torch.allclose(compiled(x3), model(x3))
    assert len(compiled.cache) == 1


def test_a_replaced_submodule_recompiles():
    model = Child()
    compiled = fxloom.compile(model)
    compiled(x3)
    model.lin = torch.nn.Linear(3, 3)
    with torch.no_grad():
        assert torch.allclose(compiled(x3), model(x3))
    assert len(compiled.cache) == 2


def test_past_the_recompile_limit_it_runs_as_python_with_one_warning():
    # dynamic=False: the int stays static (it would become a symbol once it changed)
    compiled = fxloom.compile(lambda x, n: x + n, recompile_limit=2, dynamic=False)
    compiled(x3, 0)
    compiled(x3, 1)
    with pytest.warns(UserWarning, match="recompile_limit.*n == 1"):
        assert torch.equal(compiled(x3, 2), x3 + 2)
    assert torch.equal(compiled(x3, 3), x3 + 3)


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Base()

    def forward(self, x):
        return self.inner(x) + 1


def test_a_modules_forward_hooks_are_inlined_into_the_graph():
    model = Outer().eval()
    model.inner.register_forward_pre_hook(lambda module, inputs: (inputs[0] * 3,))
    model.inner.register_forward_hook(lambda module, inputs, output: output * 10)
    compiled = fxloom.compile(model)
    with torch.no_grad():
        assert torch.allclose(compiled(x3), model(x3))
    assert compiled.explain().graph_count == 1 and compiled.explain().break_count == 0


def test_a_hook_added_later_recompiles():
    model = Outer().eval()
    compiled = fxloom.compile(model)
    with torch.no_grad():
        compiled(x3)
        model.inner.register_forward_hook(lambda module, inputs, output: output * 10)
        assert torch.allclose(compiled(x3), model(x3))
    assert len(compiled.cache) == 2


# ------------------------------------------------------------------ class attributes
class _Configured:
    scale = 2.0


class _ConfiguredModule(torch.nn.Module):
    scale = 2.0

    def forward(self, x):
        return x * type(self).scale


def _scaled_by_its_class(obj, x):
    return x * type(obj).scale


@pytest.mark.parametrize(
    "make",
    [
        lambda: (
            fxloom.compile(_scaled_by_its_class),
            _scaled_by_its_class,
            _Configured,
            (_Configured(),),
        ),
        lambda: (fxloom.compile(_ConfiguredModule()), _ConfiguredModule(), _ConfiguredModule, ()),
    ],
    ids=["an object passed in", "the compiled module itself"],
)
def test_a_class_attribute_read_through_type_of_is_guarded(make):
    """``type(obj).scale`` reads the class the call's argument has: a class attribute changed
    between calls is what the next call multiplies by (it was folded into the entry)."""
    compiled, eager, cls, leading = make()
    x = torch.ones(3)
    try:
        assert torch.equal(compiled(*leading, x), eager(*leading, x))
        cls.scale = 5.0
        assert torch.equal(compiled(*leading, x), torch.full((3,), 5.0))
        assert torch.equal(compiled(*leading, x), eager(*leading, x))
    finally:
        cls.scale = 2.0
