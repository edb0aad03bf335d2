"""fxloom.compile(backend="onnxruntime"): each captured graph lowered once per input signature.

The backend lowers every graph ``fxloom.compile`` captures (``fxloom.lower``: its supported
regions run in ONNX Runtime). Lowering builds modules of its own; none of that may count as a
change to the user's modules, or the entry's module-epoch guard would fail on the next call
and every call would compile again. ONNX Runtime computes into memory of its own, so what a
graph writes into its caller's tensors (inputs, views of them, parameters and buffers) runs
in PyTorch, and lowering, which runs the graph several times, runs it on copies.

Every call is compared with eager PyTorch: the results and, where the program writes, the
arguments and the module state after the call.
"""

from __future__ import annotations

import pytest
import torch

import fxloom
from fxloom import zoo
from fxloom.bytecode.guards import module_epoch
from fxloom.zoo.hf_configs import BERT_LIKE, hf

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.usefixtures("one_thread")

RTOL, ATOL = 1e-4, 1e-5  # as the lowering tests: ONNX Runtime rounds differently


def assert_close(got, want):
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got) == len(want)
    for value, reference in zip(got, want):
        torch.testing.assert_close(value, reference, rtol=RTOL, atol=ATOL)


def compile_counts(compiled):
    """Entries compiled, and why each one after the first was."""
    return len(compiled.cache), compiled.explain().recompiles


# ----------------------------------------------------------------------------- models
def bert_4_layers():
    torch.manual_seed(0)
    model = hf("BertModel", "BertConfig", **dict(BERT_LIKE, num_hidden_layers=4))().eval()
    return model, lambda batch: {
        "input_ids": torch.randint(0, BERT_LIKE["vocab_size"], (batch, 16)),
        "attention_mask": torch.ones(batch, 16, dtype=torch.long),
    }


def resnet_tiny():
    model, (example,) = zoo.build("resnet_tiny")
    return model, lambda batch: {"x": torch.randn(batch, *example.shape[1:])}


MODELS = {"bert_4_layers": bert_4_layers, "resnet_tiny": resnet_tiny}


def eager_outputs(model, inputs):
    with torch.no_grad():
        output = model(**inputs)
    return output.to_tuple() if hasattr(output, "to_tuple") else output


# ----------------------------------------------------------------------------- compile counts
@pytest.mark.parametrize("name", MODELS)
def test_ten_identical_calls_compile_once(name):
    model, inputs_at = MODELS[name]()
    compiled = fxloom.compile(model, backend="onnxruntime")
    inputs = inputs_at(2)
    with torch.no_grad():
        for _ in range(10):
            compiled(**inputs)
    assert compile_counts(compiled) == (1, [])


@pytest.mark.parametrize("name", MODELS)
def test_another_batch_size_compiles_at_most_once_more(name):
    model, inputs_at = MODELS[name]()
    compiled = fxloom.compile(model, backend="onnxruntime")
    with torch.no_grad():
        for batch in (2, 3, 2, 3, 2, 3):
            compiled(**inputs_at(batch))
    assert len(compiled.cache) <= 2
    assert compiled.compiled_forward.eager_reason is None  # still compiled, not Python


@pytest.mark.parametrize("name", MODELS)
def test_results_equal_eager_at_each_batch_size(name):
    model, inputs_at = MODELS[name]()
    compiled = fxloom.compile(model, backend="onnxruntime")
    for batch in (2, 3, 2):
        inputs = inputs_at(batch)
        assert_close(eager_outputs(compiled, inputs), eager_outputs(model, inputs))


def test_the_graphs_run_in_onnx_runtime():
    model, inputs_at = MODELS["resnet_tiny"]()
    compiled = fxloom.compile(model, backend="onnxruntime")
    with torch.no_grad():
        compiled(**inputs_at(2))
    lowered = compiled.cache[0].run.__globals__["GRAPH"]
    assert lowered.lowering_report.summary().startswith(
        "Compiled_forward: 1 of 1 region in onnxruntime"
    )


def test_resnet_50_runs_wholly_in_onnx_runtime():
    """Its ``nn.ReLU(inplace=True)`` writes a tensor the graph made, not the caller's."""
    model, (x,) = zoo.build("resnet50")
    compiled = fxloom.compile(model, backend="onnxruntime")
    with torch.no_grad():
        assert_close(compiled(x), model(x))
    lowered = compiled.cache[0].run.__globals__["GRAPH"]
    assert lowered.lowering_report.summary().endswith("0 left in PyTorch")


def test_lowering_changes_no_module_epoch():
    """The modules lowering builds are its own: the guard on the user's modules still holds."""
    model, inputs_at = MODELS["resnet_tiny"]()
    compiled = fxloom.compile(model, backend="onnxruntime")
    before = module_epoch(model)
    with torch.no_grad():
        compiled(**inputs_at(2))
    assert module_epoch(model) == before


# ----------------------------------------------------------------------------- aliasing
def add_scaled(x, y):
    return x + y * 2


def scale_then_add(x, y):
    x.mul_(2)
    return x + y


def bump_then_double(x):
    x.add_(1)
    return x * 2


def set_first(x, y):
    x[0] = y[0]
    return x.sum()


def add_into(x, y):
    torch.add(x, 1, out=y)
    return y * 2


def bump_a_view_then_read_the_base(x, y):
    z = torch.tanh(y) * 3
    x[1:].add_(z[1:])
    return x.sum() + z.sum()


def views_of_input(x):
    return x.view(-1), x.t()


def run_both(fn, compiled, make_args):
    """One call of ``fn`` and of ``compiled`` on fresh arguments made alike; both results and
    both argument lists after the call."""
    want_args, got_args = make_args(), make_args()
    return fn(*want_args), compiled(*got_args), want_args, got_args


def same_base(make):
    return lambda: (lambda t: (t, t))(make())


def two(make_x, make_y):
    return lambda: (make_x(), make_y())


CALLS = {
    "one tensor twice": (add_scaled, same_base(lambda: torch.arange(4.0))),
    "a view and its base": (add_scaled, lambda: (lambda t: (t[1:], t[:3]))(torch.arange(4.0))),
    "write into an input passed twice": (scale_then_add, same_base(lambda: torch.arange(4.0))),
    "write into an input": (bump_then_double, lambda: (torch.arange(4.0),)),
    "item assignment into an input": (
        set_first,
        two(lambda: torch.arange(4.0), lambda: torch.full((4,), 7.0)),
    ),
    "out= an input": (add_into, two(lambda: torch.arange(4.0), lambda: torch.zeros(4))),
    "write through a view of an input": (
        bump_a_view_then_read_the_base,
        two(lambda: torch.arange(4.0), lambda: torch.ones(4)),
    ),
}


@pytest.mark.parametrize("case", CALLS)
def test_aliased_and_written_inputs_give_the_eager_results(case):
    fn, make_args = CALLS[case]
    compiled = fxloom.compile(fn, backend="onnxruntime")
    for _ in range(3):  # the call that compiles, and two that reuse the entry
        want, got, want_args, got_args = run_both(fn, compiled, make_args)
        assert_close(got, want)
        assert_close(got_args, want_args)  # what the call wrote, written once
    assert len(compiled.cache) == 1


def test_calls_that_swap_aliasing_give_the_eager_results():
    compiled = fxloom.compile(scale_then_add, backend="onnxruntime")
    alike = same_base(lambda: torch.arange(4.0))
    apart = two(lambda: torch.arange(4.0), lambda: torch.ones(4))
    for make_args in (alike, apart, alike, apart):
        want, got, want_args, got_args = run_both(scale_then_add, compiled, make_args)
        assert_close(got, want)
        assert_close(got_args, want_args)
    assert len(compiled.cache) == 2


def test_a_returned_view_of_an_input_stays_a_view():
    compiled = fxloom.compile(views_of_input, backend="onnxruntime")
    for _ in range(2):
        x = torch.arange(6.0).reshape(2, 3)
        flat, transposed = compiled(x)
        assert flat.data_ptr() == transposed.data_ptr() == x.data_ptr()
        flat.add_(1)  # written through the view, as eager would
        assert torch.equal(x, torch.arange(1.0, 7.0).reshape(2, 3))


def test_a_write_into_an_input_is_left_to_pytorch_and_says_why():
    from fxloom.lower.lowering import lower

    lowered = lower(set_first, (torch.arange(4.0), torch.ones(4)))
    (left,) = lowered.lowering_report.left
    assert left.op == "operator.setitem" and "writes into %x, which the caller holds" in left.reason


class RunningCount(torch.nn.Module):
    """Batch norm in training mode and a counter buffer: module state the graph writes."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.norm(x) * 2


def test_module_state_the_graph_writes_changes_once_per_call():
    torch.manual_seed(0)
    plain, compiled_model = RunningCount().train(), RunningCount().train()
    compiled = fxloom.compile(compiled_model, backend="onnxruntime")
    for _ in range(3):
        x = torch.randn(8, 4)
        assert_close(compiled(x), plain(x))
        assert_close(compiled_model.state_dict(), plain.state_dict())


# ----------------------------------------------------------------------------- parameters
def linear_relu():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()


def test_a_parameter_changed_in_place_is_read_by_the_next_call():
    """ONNX Runtime keeps the weights in its session: a weight changed in place (an optimizer
    step) makes the graph be lowered again, not a stale result."""
    model = linear_relu()
    compiled = fxloom.compile(model, backend="onnxruntime")
    x = torch.randn(2, 4)
    with torch.no_grad():
        compiled(x)
        model[0].weight.mul_(-2)
        assert_close(compiled(x), model(x))


def test_a_loaded_state_dict_is_read_by_the_next_call():
    model = linear_relu()
    compiled = fxloom.compile(model, backend="onnxruntime")
    x = torch.randn(2, 4)
    with torch.no_grad():
        compiled(x)
        model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})
        assert_close(compiled(x), model(x))
    assert len(compiled.cache) == 1  # lowered again inside the entry, not compiled again
