"""``fxloom.cond`` under ``fxloom.compile``: both branches in the graph, one ``cond_op`` node.

Each case compares the compiled call with eager on both predicate values. A tensor predicate
is recorded (one entry serves both outcomes); a Python bool runs the chosen branch inline; a
branch that cannot be captured is a ``cond-branch`` graph break naming it, and the whole cond
then runs as Python, still equal to eager.
"""

from __future__ import annotations

import pytest
import torch
from differential.harness import Call, Case, run_case
from differential.variations import sequence, tensor
from torch import nn

import fxloom
from fxloom.bytecode.breaks import CompileError

pytestmark = pytest.mark.usefixtures("one_thread")

x3 = torch.tensor([0.5, -1.0, 2.0])  # sum > 0: the true branch; -x3 takes the false one


def both_outcomes(compiled, fn, *args):
    """The compiled call equals eager on ``args`` and on their negation."""
    for sign in (1, -1):
        inputs = [sign * arg for arg in args]
        got, want = compiled(*inputs), fn(*inputs)
        torch.testing.assert_close(got, want)


def cond_nodes(compiled) -> list:
    graphs = [entry.graph_module for entry in compiled.cache]
    return [n for g in graphs for n in g.graph.nodes if n.target is fxloom.cond_op]


def break_details(compiled) -> list[str]:
    return [stop.detail for stop in compiled.explain().breaks]


# ----------------------------------------------------------------------------- captured
def test_a_tensor_predicate_is_one_graph_that_serves_both_outcomes():
    def f(x):
        return fxloom.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))

    compiled = fxloom.compile(f)
    both_outcomes(compiled, f, x3)
    report = compiled.explain()
    assert report.graph_count == 1 and report.break_count == 0 and not report.recompiles
    assert len(cond_nodes(compiled)) == 1


def test_the_compiled_graph_reads_as_a_call_of_cond_op():
    def f(x):
        return fxloom.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    compiled = fxloom.compile(f)
    compiled(x3)
    code = compiled.code
    assert "cond = cond_op(gt, true_graph_0, false_graph_0, (x,))" in code
    graph_module = compiled.cache[0].graph_module
    assert "sin" in graph_module.true_graph_0.code and "cos" in graph_module.false_graph_0.code


def test_cond_op_called_directly_returns_the_branch_leaves():
    def f(x):
        return fxloom.cond_op(x.sum() > 0, lambda t: (t * 2,), lambda t: (t / 2,), (x,))

    compiled = fxloom.compile(f)
    both_outcomes(compiled, f, x3)
    assert compiled.explain().break_count == 0 and len(cond_nodes(compiled)) == 1


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return fxloom.cond(
            x.sum() > 0, lambda t: self.linear(t).relu(), lambda t: t * self.scale, (x,)
        )


def test_branches_closing_over_a_modules_parameters_and_submodules():
    model = Gate()
    compiled = fxloom.compile(model)
    both_outcomes(compiled, model, x3)
    assert compiled.explain().graph_count == 1
    graph_module = compiled.cache[0].graph_module
    # ``self.scale``, read inside the false branch only, is an input of both branches
    assert all(
        len(branch.graph.find_nodes(op="placeholder")) == 2
        for branch in (graph_module.true_graph_0, graph_module.false_graph_0)
    )


def test_gradients_flow_through_the_branch_taken():
    model = Gate()
    compiled = fxloom.compile(model)
    for sign in (1, -1):
        x = (sign * x3).requires_grad_()
        compiled(x).sum().backward()
        want = x.grad.clone()
        x.grad = None
        model(x).sum().backward()
        torch.testing.assert_close(x.grad, want)


def test_branches_read_tensors_computed_before_the_cond_and_globals():
    def f(x):
        shift = x.mean()
        return fxloom.cond(x.sum() > 0, lambda t: t - shift, lambda t: t * WEIGHT, (x,))

    compiled = fxloom.compile(f)
    both_outcomes(compiled, f, x3)
    assert compiled.explain().graph_count == 1


WEIGHT = torch.tensor([1.0, 2.0, 3.0])
SCALE = 2.0


def test_what_a_branch_reads_from_outside_is_guarded():
    global SCALE

    def f(x):
        return fxloom.cond(x.sum() > 0, lambda t: t + 1, lambda t: t * SCALE, (x,))

    compiled = fxloom.compile(f)
    compiled(x3)  # the true branch runs; the false branch read SCALE all the same
    try:
        SCALE = 5.0
        torch.testing.assert_close(compiled(-x3), f(-x3))
    finally:
        SCALE = 2.0
    assert any("SCALE" in guard for guards in compiled.explain().guards for guard in guards)


def test_nested_conds_put_the_inner_branches_in_the_outer_branch():
    def f(x, y):
        def outer_true(t):
            return fxloom.cond(y.sum() > 0, lambda u: u + y, lambda u: u - y, (t,))

        return fxloom.cond(x.sum() > 0, outer_true, lambda t: t * 3, (x,))

    compiled = fxloom.compile(f)
    y = torch.tensor([1.0, 1.0, -3.0])
    for a in (x3, -x3):
        for b in (y, -y):
            torch.testing.assert_close(compiled(a, b), f(a, b))
    report = compiled.explain()
    assert report.graph_count == 1 and report.break_count == 0
    outer = compiled.cache[0].graph_module
    assert len(cond_nodes(compiled)) == 1
    inner = [n for n in outer.true_graph_0.graph.nodes if n.target is fxloom.cond_op]
    assert len(inner) == 1


def test_a_branch_returning_a_tuple_and_a_dict_gives_them_back():
    def f(x):
        return fxloom.cond(
            x.sum() > 0,
            lambda t: (t + 1, {"norm": t.norm()}),
            lambda t: (t - 1, {"norm": t.abs().sum()}),
            (x,),
        )

    compiled = fxloom.compile(f)
    for x in (x3, -x3):
        got, want = compiled(x), f(x)
        assert type(got) is tuple and type(got[1]) is dict
        torch.testing.assert_close(got, want)
    assert compiled.explain().break_count == 0


def test_operands_may_be_several_tensors_and_sizes():
    def f(x, y):
        return fxloom.cond(
            x.sum() > 0, lambda a, b, n: a * b + n, lambda a, b, n: a - b * n, (x, y, 2)
        )

    compiled = fxloom.compile(f)
    both_outcomes(compiled, f, x3, torch.ones(3))
    assert compiled.explain().break_count == 0


def test_grad_mode_switched_inside_a_branch_is_kept_in_it():
    def f(x):
        def no_grad_branch(t):
            with torch.no_grad():
                return t * 2

        return fxloom.cond(x.sum() > 0, no_grad_branch, lambda t: t * 3, (x,))

    compiled = fxloom.compile(f)
    for sign in (1, -1):
        x = (sign * x3).requires_grad_()
        got, want = compiled(x), f(x)
        torch.testing.assert_close(got, want)
        assert got.requires_grad == want.requires_grad
    assert torch.is_grad_enabled()


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Linear(3, 3)
        self.large = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))

    def forward(self, x):
        return fxloom.cond(x.sum() > 0, self.small, self.large, (x,)) * 2


def test_submodules_as_branches_are_called_inside_their_branch_graphs():
    model = Experts()
    compiled = fxloom.compile(model)
    both_outcomes(compiled, model, x3)
    graph_module = compiled.cache[0].graph_module
    assert "self.small(x)" in graph_module.true_graph_0.code
    assert compiled.explain().break_count == 0


# ----------------------------------------------------------------------------- bool predicate
def test_a_python_bool_predicate_runs_the_chosen_branch_inline():
    def f(x):
        return fxloom.cond(x.shape[0] > 2, lambda t: t.sin(), lambda t: t.cos(), (x,))

    compiled = fxloom.compile(f)
    for x in (x3, x3[:2]):
        torch.testing.assert_close(compiled(x), f(x))
    assert not cond_nodes(compiled)
    assert compiled.explain().break_count == 0


# ----------------------------------------------------------------------------- breaks
def test_branches_with_different_shapes_break_with_conds_own_error():
    def f(x):
        return fxloom.cond(x.sum() > 0, lambda t: t + 1, lambda t: t.sum(0, keepdim=True), (x,))

    compiled = fxloom.compile(f)
    both_outcomes(compiled, f, x3)  # eager runs one branch: the cond runs as Python
    (detail,) = set(break_details(compiled))
    assert "cond's output [0] has shape (3,) in true_fn but (1,) in false_fn" in detail
    with pytest.raises(CompileError, match=r"cond's output \[0\] has shape"):
        fxloom.compile(f, fullgraph=True)(x3)


def test_a_branch_that_would_raise_raises_only_when_it_is_taken():
    def f(x):
        return fxloom.cond(x.sum() > 0, lambda t: t + 1, lambda t: t @ torch.ones(4), (x,))

    compiled = fxloom.compile(f)
    torch.testing.assert_close(compiled(x3), f(x3))
    with pytest.raises(RuntimeError) as eager:
        f(-x3)
    with pytest.raises(RuntimeError) as got:
        compiled(-x3)
    assert str(got.value) == str(eager.value)
    (detail,) = set(break_details(compiled))
    assert "cond's false_fn" in detail


def test_a_branch_that_prints_is_a_break_naming_the_branch_and_output_is_eagers(capsys):
    def loud(t):
        print("taking the loud branch")
        return t + 1

    def f(x):
        return fxloom.cond(x.sum() > 0, loud, lambda t: t - 1, (x,))

    compiled = fxloom.compile(f)
    for x in (x3, -x3, x3):
        want = f(x)
        expected = capsys.readouterr().out
        torch.testing.assert_close(compiled(x), want)
        assert capsys.readouterr().out == expected
    (stop,) = compiled.explain().breaks
    assert stop.reason.startswith("a branch of fxloom.cond cannot be captured")
    assert "cond's true_fn" in stop.detail and "loud (test_compile_cond.py:" in stop.detail
    assert "print" in stop.detail and 'print("taking the loud branch")' in stop.code


def test_a_branch_kept_in_a_local_across_the_break_never_recompiles(capsys):
    def f(x):
        loud = lambda t: print("loud") or t + 1  # noqa: E731 - live after the break
        return fxloom.cond(x.sum() > 0, loud, lambda t: t - 1, (x,))

    compiled = fxloom.compile(f)
    for x in (x3, -x3, x3, -x3):
        want = f(x)
        expected = capsys.readouterr().out
        torch.testing.assert_close(compiled(x), want)
        assert capsys.readouterr().out == expected
    assert not compiled.explain().recompiles


def test_torch_cond_runs_as_python_with_a_break_that_names_fxloom_cond():
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))

    compiled = fxloom.compile(f)
    both_outcomes(compiled, f, x3)
    (detail,) = set(break_details(compiled))
    assert detail.startswith("torch.cond compiles its branches") and "fxloom.cond(" in detail


def test_a_graph_break_inside_a_branch_runs_the_cond_as_python():
    def f(x):
        return fxloom.cond(x.sum() > 0, lambda t: t * float(t.max()), lambda t: t - 1, (x,))

    compiled = fxloom.compile(f)
    both_outcomes(compiled, f, x3)
    (detail,) = set(break_details(compiled))
    assert "cond's true_fn" in detail and "float" in detail


def test_an_item_inside_a_branch_is_a_break_too():
    def f(x):
        return fxloom.cond(x.sum() > 0, lambda t: t * t.max().item(), lambda t: t - 1, (x,))

    compiled = fxloom.compile(f)
    both_outcomes(compiled, f, x3)
    (detail,) = set(break_details(compiled))
    assert "cond's true_fn" in detail and "item" in detail


def test_a_branch_writing_to_its_operand_in_place_is_a_break():
    def f(x):
        return fxloom.cond(x.sum() > 0, lambda t: t.add_(1), lambda t: t - 1, (x,))

    compiled = fxloom.compile(f)
    for x in (x3, -x3):
        mine, theirs = x.clone(), x.clone()
        torch.testing.assert_close(compiled(mine), f(theirs))
        torch.testing.assert_close(mine, theirs)  # the operand written as eager writes it
    (detail,) = set(break_details(compiled))
    assert "add_ writes in place" in detail


LOG: list = []


def logged(t):
    LOG.append("true")
    return t + 1


def test_a_branch_changing_an_outside_object_is_a_break():
    def f(x):
        return fxloom.cond(x.sum() > 0, logged, lambda t: t - 1, (x,))

    compiled = fxloom.compile(f)
    LOG.clear()
    both_outcomes(compiled, f, x3)
    assert LOG == ["true", "true"]  # once compiled, once eager: only where the branch ran
    assert any("changes a container it did not make" in d for d in break_details(compiled))


def test_a_branch_changing_a_list_the_function_made_is_a_break():
    def f(x):
        seen = []

        def noted(t):
            seen.append(1)
            return t + 1

        out = fxloom.cond(x.sum() > 0, noted, lambda t: t - 1, (x,))
        return out, len(seen)

    compiled = fxloom.compile(f)
    for x in (x3, -x3):
        got, want = compiled(x), f(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1]
    (detail,) = set(break_details(compiled))
    assert (
        "cond's true_fn " in detail
        and "f.<locals>.noted (test_compile_cond.py:" in detail
        and "it did not make" in detail
    )


# ----------------------------------------------------------------------------- varied calls
CONDS = {
    "tensor predicate": """
import fxloom


def f(x, y, n, s):
    return fxloom.cond((x * y).sum() > 0, lambda a: a * n + y, lambda a: a - s * y, (x,))
""",
    "branches closing over values computed before": """
import fxloom


def f(x, y, n, s):
    z = y.relu()
    out = fxloom.cond(x.mean() > y.mean(), lambda a, b: (a + z, b), lambda a, b: (b, a * s), (x, y))
    return out[0] * n, out[1]
""",
    "a cond with a print in a branch": """
import fxloom


def show(a):
    print("shown", a.shape)
    return a + 1


def f(x, y, n, s):
    return fxloom.cond(x.sum() > 0, show, lambda a: a - 1, (x * n,))
""",
}


@pytest.mark.parametrize("name", sorted(CONDS))
def test_conds_agree_with_eager_over_every_variation_of_the_call(name):
    base = Call((tensor((3, 3), 1), tensor((3, 3), 2), 2, 1.5), label="base")
    failure = run_case(Case(CONDS[name], sequence(base)))
    assert failure is None, str(failure)


# ----------------------------------------------------------------------------- saving
def test_a_compiled_cond_graph_saves_and_loads(tmp_path):
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append((graph_module, example_inputs))
        return graph_module.forward

    model = Gate()
    fxloom.compile(model, backend=backend)(x3)
    ((graph_module, example_inputs),) = graphs
    fxloom.save(graph_module, tmp_path / "cond.fxl")
    loaded = fxloom.load(tmp_path / "cond.fxl")
    names = [node.name for node in graph_module.graph.find_nodes(op="placeholder")]
    for x in (x3, -x3):
        inputs = [x if name == "x" else value for name, value in zip(names, example_inputs)]
        torch.testing.assert_close(loaded(*inputs)[0], model(x))
