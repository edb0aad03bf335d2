"""Tracing with ``example_inputs``: what the examples decide, when they are run, what they leave.

With example inputs, control flow on traced values follows the examples under a run-time
guard, and static tensor facts (dtype, rank) come from them. The recorded operations run on
the examples only when the program asks about a value, in recording order: on stand-ins
(metadata, no compute) for questions about shapes, dtypes and devices, for real only for a
question on data. The caller's tensors and the module's state are left as they were.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import fxloom as fx
from fxloom.values.stand_in import StandIn

CALLS: list[str] = []


@fx.wrap
def counted(x):
    """Records each time it runs: on stand-ins (metadata only) or real tensors."""
    CALLS.append("stand-in" if isinstance(x, StandIn) else "run")
    return x * 2


@pytest.fixture(autouse=True)
def no_calls_yet():
    CALLS.clear()


class Gate(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent: needs the example's value
            return x.relu()
        return -x


def test_a_branch_on_a_value_follows_the_example_and_is_guarded():
    positive = torch.ones(3)
    gm = fx.symbolic_trace(Gate(), example_inputs=(positive,))
    assert_close(gm(positive * 2), (positive * 2).relu())
    with pytest.raises(RuntimeError, match="traced with example inputs for which bool"):
        gm(-positive)  # would take the other branch: refused, not computed wrongly


def test_static_facts_come_from_the_examples_without_recording_them():
    def fn(x):
        return x.float() if x.dtype == torch.int64 and x.dim() == 2 else x

    gm = fx.symbolic_trace(fn, example_inputs=(torch.ones(2, 3, dtype=torch.int64),))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_method"]
    assert targets == ["float"]  # dtype and dim() were answered, not recorded


def test_a_program_that_asks_nothing_runs_nothing_on_the_examples():
    def fn(x):
        return counted(x) + 1

    gm = fx.symbolic_trace(fn, example_inputs=(torch.ones(3),))
    assert CALLS == []  # tracing ran no example values
    assert_close(gm(torch.ones(3)), torch.full((3,), 3.0))
    assert CALLS == ["run"]


def test_the_examples_run_up_to_the_value_asked_for_and_no_further():
    def fn(x):
        y = counted(x)
        if y.sum() > 0:  # asks: everything recorded so far runs, once
            y = y + 1
        return counted(y)

    fx.symbolic_trace(fn, example_inputs=(torch.ones(3),))
    # The first counted() runs on stand-ins, which cannot answer a question on data, then for
    # real; the second is never needed while tracing.
    assert CALLS == ["stand-in", "run"]


def test_unpacking_a_shape_needs_no_example_values():
    def fn(x):
        y = counted(x)
        rows, columns = y.shape
        return y.reshape(columns, rows)

    gm = fx.symbolic_trace(fn, example_inputs=(torch.ones(2, 3),))
    assert CALLS == []  # the arity came from the unpacking itself
    assert gm(torch.ones(4, 5)).shape == (5, 4)  # sizes stay symbolic


def test_in_place_operations_run_in_program_order_on_copies_of_the_examples():
    def fn(x):
        x.add_(1)
        return x * 2 if x.min() > 0 else x  # x is 1 after the add_, so min() > 0

    example = torch.zeros(3)
    gm = fx.symbolic_trace(fn, example_inputs=(example,))
    assert torch.equal(example, torch.zeros(3))  # the caller's tensor is untouched
    assert_close(gm(torch.zeros(3)), torch.full((3,), 2.0))


def test_running_the_examples_leaves_the_module_state_as_it_was():
    class Normalised(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(3)  # training mode: calls update running stats

        def forward(self, x):
            y = self.bn(x)
            return y if y.mean() > -1 else -y  # asks for a value after the batch norm

    model = Normalised()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fx.symbolic_trace(model, example_inputs=(torch.randn(4, 3) + 5,))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_examples_the_model_cannot_run_give_an_error_naming_the_node():
    class Projection(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, x):
            y = self.linear(x)
            return y if y.sum() > 0 else -y

    model = Projection()
    weight = model.linear.weight.detach().clone()
    with pytest.raises(fx.TraceError) as info:
        fx.symbolic_trace(model, example_inputs=(torch.ones(3, 5),))  # 5 features, not 4
    message = str(info.value)
    assert "%linear" in message and "on the example inputs failed" in message
    assert "must be valid inputs of the model" in message
    assert torch.equal(model.linear.weight, weight)


# ------------------------------------------------------- what is computed for real, and when
class RealCalls(TorchDispatchMode):
    """Counts the operators that run on real tensors (stand-ins run theirs on the meta device)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(not t.is_meta for t in tensors):
            self.names.append(func.__name__.split(".")[0])  # "sum.default" -> "sum"
        return func(*args, **(kwargs or {}))


class AsksAboutShapes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        if y.shape[0] > 1 and y.dim() == 2 and y.dtype == torch.float32:
            y = y * 2
        rows, columns = y.size()
        halves = [half.sum(0) for half in y.split(columns // 2, dim=1)]  # a tuple's arity
        total = sum(row for row in y)  # the rows of a tensor: as many as its first size
        if isinstance(total, torch.Tensor) and len(y) == rows and total.device.type == "cpu":
            return torch.cat(halves) + total
        return total


def test_questions_about_shapes_dtypes_and_devices_compute_nothing_real():
    model, example = AsksAboutShapes(), torch.randn(3, 4)
    with RealCalls() as calls:
        gm = fx.symbolic_trace(model, example_inputs=(example,))
    assert calls.names == []  # every answer came from the stand-ins' metadata
    assert_close(gm(example), model(example))


def test_answers_from_stand_ins_are_guarded_like_answers_from_data():
    gm = fx.symbolic_trace(AsksAboutShapes(), example_inputs=(torch.randn(3, 4),))
    with pytest.raises(RuntimeError, match="traced with example inputs"):
        gm(torch.randn(5, 4))  # five rows: the loop over rows was traced for three


def test_a_question_on_data_computes_the_example_for_real_and_follows_its_branch():
    model, positive = Gate(), torch.ones(3)
    with RealCalls() as calls:
        gm = fx.symbolic_trace(model, example_inputs=(positive,))
    assert "sum" in calls.names  # x.sum() > 0 needs the data
    assert_close(gm(positive), positive.relu())
    with pytest.raises(RuntimeError, match="traced with example inputs for which bool"):
        gm(-positive)


def test_an_operation_whose_result_shape_depends_on_data_is_computed_for_real():
    def fn(x):
        hits = x.nonzero()  # how many rows: only the data can tell
        return hits.float().mean() if hits.shape[0] > 2 else x.sum()

    example = torch.tensor([1.0, 0.0, 2.0, 3.0])
    with RealCalls() as calls:
        gm = fx.symbolic_trace(fn, example_inputs=(example,))
    assert "nonzero" in calls.names
    assert_close(gm(example), fn(example))
    with pytest.raises(RuntimeError, match="traced with example inputs"):
        gm(torch.tensor([1.0, 0.0, 0.0, 0.0]))  # one hit: the other branch, refused


class Counter(torch.nn.Module):
    """Replaces its buffer (not an in-place update) each call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls = self.calls + 1
        return x


class CountedBatchNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.counter = Counter()
        self.bn = torch.nn.BatchNorm1d(3)  # training mode: calls update running stats

    def forward(self, x):
        y = self.bn(self.counter(x))
        return y if y.shape[-1] == 3 else -y  # asks about the batch norm's result: its shape


class CounterLeafTracer(fx.Tracer):
    def is_leaf_module(self, m, qualified_name):
        return isinstance(m, Counter) or super().is_leaf_module(m, qualified_name)


def test_the_stand_in_run_changes_no_parameter_or_buffer_of_the_model():
    model, example = CountedBatchNorm(), torch.randn(4, 3) + 5
    before = {name: value.clone() for name, value in model.state_dict().items()}
    with RealCalls() as calls:
        CounterLeafTracer().trace(model, example_inputs=(example,))
    assert calls.names == []  # the leaves ran their forward on stand-ins
    assert type(model.counter.calls) is torch.Tensor  # its own buffer back, not a stand-in
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_a_sparse_example_which_no_stand_in_describes_runs_for_real():
    def fn(x):
        dense = x.to_dense()
        return dense * 2 if dense.dim() == 2 else dense

    sparse = torch.eye(3).to_sparse()
    gm = fx.symbolic_trace(fn, example_inputs=(sparse,))
    assert_close(gm(sparse), torch.eye(3) * 2)


def test_whether_a_tuple_of_tensors_is_empty_needs_no_data():
    def fn(x):
        parts = x.split(2)
        return parts[0] * 2 if parts else x

    example = torch.randn(4)
    with RealCalls() as calls:
        gm = fx.symbolic_trace(fn, example_inputs=(example,))
    assert calls.names == []
    assert_close(gm(example), example[:2] * 2)


class Trim(torch.nn.Module):
    """A leaf that reads data to decide its output's size."""

    def forward(self, x):
        return x[: int(x.sum().item()) % 3 + 1]


class TrimThenProject(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trim = Trim()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(self.trim(x))
        return y.relu() if y.shape[0] == 2 else y  # a size only the data decides


class TrimLeafTracer(fx.Tracer):
    def is_leaf_module(self, m, qualified_name):
        return isinstance(m, Trim) or super().is_leaf_module(m, qualified_name)


def test_only_the_operation_that_needs_data_runs_for_real_and_the_rest_on_stand_ins():
    model, example = TrimThenProject(), torch.ones(4, 4)  # sum 16: two rows kept
    with RealCalls() as calls:
        graph = TrimLeafTracer().trace(model, example_inputs=(example,))
    assert "sum" in calls.names  # the leaf ran for real
    assert "addmm" not in calls.names and "linear" not in calls.names  # the projection did not
    assert [n.target for n in graph.nodes if n.op == "call_method"] == ["relu"]
