"""``fxloom.export.export``: operator-level, functional programs, side by side with torch.export.

Each test states one behaviour of the Export IR specification (../shared/seeds/002_*.txt)
and checks it on fxloom's program; where torch.export can run the same module, its answer is
the reference (signatures, outputs, node counts after decomposition).
"""

from __future__ import annotations

import dataclasses
import operator
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.export
from torch import nn
from torch.testing import assert_close

import fxloom
from fxloom.export import (
    DataDependentError,
    ExportedProgram,
    ExportVerifierError,
    InputKind,
    StandIn,
    export,
)
from fxloom.values.symbolic import DataDependentGuardError
from fxloom.zoo import (
    mlp_tiny,
    mlp_tiny_inputs,
    resnet_tiny,
    resnet_tiny_inputs,
    transformer_tiny,
    transformer_tiny_inputs,
)

aten = torch.ops.aten


def operators(ep: ExportedProgram) -> list:
    return [n.target for n in ep.graph.nodes if n.op == "call_function"]


def torch_export(model: nn.Module, args: tuple, kwargs: dict | None = None):
    """torch.export's functional program (its default is a training IR that may mutate)."""
    return torch.export.export(model, args, kwargs).run_decompositions({})


def specs(signature) -> list[tuple]:
    return [(s.kind.name, s.arg.name, s.target) for s in signature.input_specs]


def kinds_and_targets(output_specs) -> list[tuple]:
    return [(s.kind.name, s.target) for s in output_specs]


# ----------------------------------------------------------------------- the spec's examples


class Add(nn.Module):
    def forward(self, x, y):
        return x + y


def test_the_specs_first_example_is_one_aten_add_between_two_placeholders():
    ep = export(Add(), (torch.randn(2), torch.randn(2)))
    assert [n.op for n in ep.graph.nodes] == [
        "placeholder",
        "placeholder",
        "call_function",
        "output",
    ]
    assert operators(ep) == [aten.add.Tensor]
    assert "torch.ops.aten.add.Tensor" in str(ep.graph)


def test_a_placeholder_and_every_operator_carry_val_describing_the_value():
    ep = export(Add(), (torch.randn(2, 3), torch.randn(2, 3)))
    for node in ep.graph.nodes:
        if node.op in ("placeholder", "call_function"):
            val = node.meta["val"]
            assert isinstance(val, StandIn)
            assert (val.shape, val.dtype, val.device) == (
                torch.Size([2, 3]),
                torch.float32,
                torch.device("cpu"),
            )


def test_a_multi_result_operator_has_a_tuple_val_and_getitem_users():
    class TopK(nn.Module):
        def forward(self, x):
            values, indices = x.topk(2)
            return values, indices

    ep = export(TopK(), (torch.randn(3, 5),))
    (topk,) = [n for n in ep.graph.nodes if n.target is aten.topk.default]
    assert isinstance(topk.meta["val"], tuple) and len(topk.meta["val"]) == 2
    assert {user.target for user in topk.users} == {operator.getitem}


# ----------------------------------------------------------------------- lifted state


class LinearBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.register_buffer("scale", torch.tensor(2.0), persistent=False)
        self.offset = torch.tensor([1.0, 2.0, 3.0])  # a plain tensor attribute: a constant

    def forward(self, x):
        return self.bn(self.linear(x)) * self.scale + self.offset


def test_state_is_lifted_to_placeholders_before_the_user_inputs_named_as_torch_export_names_them():
    model = LinearBN().eval()
    x = torch.randn(5, 4)
    ours = export(model, (x,)).graph_signature
    theirs = torch_export(model, (x,)).graph_signature
    assert sorted(specs(ours)) == sorted(specs(theirs))
    assert [s.kind for s in ours.input_specs] == (
        [InputKind.PARAMETER] * 4 + [InputKind.BUFFER] * 4 + [InputKind.CONSTANT_TENSOR]
        + [InputKind.USER_INPUT]
    )  # fmt: skip


def test_state_dict_holds_parameters_and_persistent_buffers_constants_the_rest():
    model = LinearBN().eval()
    ep = export(model, (torch.randn(5, 4),))
    assert set(ep.state_dict) == set(model.state_dict())
    assert ep.state_dict["linear.weight"] is model.linear.weight
    assert set(ep.constants) == {"scale", "offset"}
    assert ep.graph_signature.non_persistent_buffers == ["scale"]


def test_a_tied_parameter_is_one_placeholder():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    model = Tied()
    ep = export(model, (torch.randn(2, 3),))
    assert ep.graph_signature.parameters == ["a.weight", "a.bias", "b.bias"]
    x = torch.randn(2, 3)
    assert_close(ep.module()(x), model(x))


def test_export_leaves_the_module_exactly_as_it_was():
    model = LinearBN().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    parameters = [id(p) for p in model.parameters()]
    export(model, (torch.randn(5, 4),))
    assert [id(p) for p in model.parameters()] == parameters
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


# ----------------------------------------------------------------------- functional graphs


def test_batch_norm_in_training_mode_returns_its_running_statistics_as_buffer_mutations():
    model = LinearBN().train()
    x = torch.randn(5, 4)
    ep = export(model, (x,))
    theirs = torch_export(model, (x,)).graph_signature
    assert kinds_and_targets(ep.graph_signature.output_specs) == kinds_and_targets(
        theirs.output_specs
    )
    assert set(ep.graph_signature.buffers_to_mutate.values()) == {
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
    }
    assert not any(t._schema.is_mutable for t in operators(ep) if hasattr(t, "_schema"))


def test_the_module_applies_the_buffer_mutations_like_eager():
    model = LinearBN().train()
    twin = LinearBN().train()
    twin.load_state_dict(model.state_dict())
    twin.offset = model.offset
    module = export(model, (torch.randn(5, 4),)).module()
    x = torch.randn(5, 4)
    assert_close(module(x), twin(x))
    assert_close(module.bn.running_mean, twin.bn.running_mean)
    assert_close(module.bn.running_var, twin.bn.running_var)
    assert int(module.bn.num_batches_tracked) == int(twin.bn.num_batches_tracked) == 1


def test_batch_norm_in_eval_mode_writes_nothing():
    ep = export(LinearBN().eval(), (torch.randn(5, 4),))
    assert ep.graph_signature.buffers_to_mutate == {}
    assert aten._native_batch_norm_legit_no_training.default in operators(ep)


class InPlace(nn.Module):
    def forward(self, x):
        y = x * 2
        y.add_(1)
        y.relu_()
        torch.mul(y, 3, out=y)
        return y


def test_in_place_and_out_operators_become_their_functional_forms():
    ep = export(InPlace(), (torch.randn(4),))
    assert operators(ep) == [aten.mul.Tensor, aten.add.Tensor, aten.relu.default, aten.mul.Tensor]
    x = torch.randn(4)
    assert_close(ep.module()(x), InPlace()(x))


class WriteThroughSlices(nn.Module):
    def forward(self, x):
        y = x.clone()
        rows = y[1:3]  # a view of y
        first = y[0]  # another view, read after the write
        rows.mul_(10)
        y[:, 0] = -1.0
        return y, first + 0, rows + 0


def test_writes_through_views_update_the_base_and_its_other_views():
    x = torch.randn(4, 3)
    ep = export(WriteThroughSlices(), (x,))
    assert not any(getattr(t, "_schema", None) and t._schema.is_mutable for t in operators(ep))
    assert aten.slice_scatter.default in operators(ep)
    for got, expected in zip(ep.module()(x), WriteThroughSlices()(x)):
        assert_close(got, expected)


def test_a_view_written_through_a_transpose_and_a_reshape():
    class Reordered(nn.Module):
        def forward(self, x):
            y = x.clone()
            y.t()[0].add_(1)  # column 0 of y
            y.view(-1)[:2].zero_()
            return y

    x = torch.randn(3, 4)
    assert_close(export(Reordered(), (x,)).module()(x), Reordered()(x))


class MutatesInput(nn.Module):
    def forward(self, x, y):
        x.add_(y)
        return x * 2


def test_a_mutated_user_input_is_an_output_and_the_module_writes_it_back():
    x, y = torch.randn(3), torch.randn(3)
    ep = export(MutatesInput(), (x.clone(), y))
    assert kinds_and_targets(ep.graph_signature.output_specs) == [
        ("USER_INPUT_MUTATION", "x"),
        ("USER_OUTPUT", None),
    ]
    theirs = torch_export(MutatesInput(), (x.clone(), y)).graph_signature
    assert [s.kind.name for s in theirs.output_specs] == ["USER_INPUT_MUTATION", "USER_OUTPUT"]
    ours, eager = x.clone(), x.clone()
    assert_close(ep.module()(ours, y), MutatesInput()(eager, y))
    assert_close(ours, eager)


def test_changing_a_tensors_shape_in_place_becomes_the_view():
    class Unsqueezes(nn.Module):
        def forward(self, x):
            y = x * 1
            y.unsqueeze_(0)
            return y.shape[0], y + 1

    ep = export(Unsqueezes(), (torch.randn(3),))
    assert aten.unsqueeze.default in operators(ep)
    x = torch.randn(3)
    assert ep.module()(x)[0] == 1
    assert_close(ep.module()(x)[1], x.unsqueeze(0) + 1)


# ----------------------------------------------------------------------- metadata


def test_every_operator_node_says_where_it_came_from():
    model = resnet_tiny().eval()
    ep = export(model, tuple(resnet_tiny_inputs()))
    for node in ep.graph.find_nodes(op="call_function"):
        assert {"val", "stack_trace", "nn_module_stack"} <= set(node.meta), node.name
    conv = next(n for n in ep.graph.nodes if n.target is aten.convolution.default)
    assert "resnet.py" in conv.meta["stack_trace"]
    assert conv.meta["nn_module_stack"] == {"conv1": ("conv1", nn.Conv2d)}
    assert conv.meta["source_fn_stack"] == [("conv1", nn.Conv2d)]
    assert conv.meta["torch_fn"][1].endswith("conv2d")


def test_a_nested_modules_nodes_list_every_enclosing_module():
    model = resnet_tiny().eval()
    ep = export(model, tuple(resnet_tiny_inputs()))
    paths = [tuple(n.meta["nn_module_stack"]) for n in ep.graph.find_nodes(op="call_function")]
    assert ("layers", "layers.0", "layers.0.conv1") in paths


# ----------------------------------------------------------------------- pytrees


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


@dataclasses.dataclass
class Batch:
    tokens: torch.Tensor
    scale: float


fxloom.pytree.register_dataclass(Batch)


class Structured(nn.Module):
    def forward(self, pair: Pair, batch: Batch, *, extra=None):
        total = pair.a + pair.b * batch.scale
        return {"sum": total, "parts": [pair.a, batch.tokens * 2], "extra": extra}


def structured_inputs(n: int = 3):
    pair = Pair(torch.randn(n), torch.randn(n))
    return (pair, Batch(torch.randn(2), 0.5)), {"extra": None}


def test_namedtuple_dataclass_and_keyword_inputs_keep_their_structure_through_module():
    args, kwargs = structured_inputs()
    ep = export(Structured(), args, kwargs)
    got, expected = ep.module()(*args, **kwargs), Structured()(*args, **kwargs)
    assert set(got) == {"sum", "parts", "extra"} and got["extra"] is None
    assert_close(got["sum"], expected["sum"])
    assert_close(got["parts"][1], expected["parts"][1])
    assert [s.arg.name for s in ep.graph_signature.input_specs] == [
        "pair_0",
        "pair_1",
        "batch_0",
        "batch_1",
    ]  # extra=None is fixed, not an input (as torch.export does with what it is not given)


def test_the_module_refuses_an_input_of_another_shape_naming_it():
    module = export(Add(), (torch.randn(2, 3), torch.randn(2, 3))).module()
    with pytest.raises(ValueError, match=r"input 'y'.*\[2, 3\].*\[2, 4\].*dimension 1"):
        module(torch.randn(2, 3), torch.randn(2, 4))


def test_the_module_refuses_another_structure_and_another_fixed_value():
    args, kwargs = structured_inputs()
    module = export(Structured(), args, kwargs).module()
    with pytest.raises(ValueError, match=r"input 'batch': .*Batch.* a dict"):
        module(args[0], {"tokens": torch.randn(2)}, **kwargs)
    with pytest.raises(ValueError, match=r"input 'batch_1'.*0.5.*0.25"):
        module(args[0], Batch(torch.randn(2), 0.25), **kwargs)


# ----------------------------------------------------------------------- errors


class BranchesOnData(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def test_a_branch_on_data_is_an_error_naming_the_users_line():
    with pytest.raises(
        DataDependentGuardError,
        match=r"(?s)depends on tensor data.*test_export.py.*if x.sum\(\) > 0",
    ):
        export(BranchesOnData(), (torch.randn(3),))


def test_a_failed_export_leaves_the_module_unchanged():
    model = nn.Sequential(nn.Linear(3, 3), BranchesOnData())
    weight = model[0].weight
    with pytest.raises(DataDependentGuardError):
        export(model, (torch.randn(2, 3),))
    assert model[0].weight is weight and isinstance(model[0].weight, nn.Parameter)
    assert not isinstance(model(torch.randn(2, 3)), StandIn)


def test_bad_arguments_are_refused_with_what_to_do():
    with pytest.raises(TypeError, match="tuple"):
        export(Add(), [torch.randn(2), torch.randn(2)])
    with pytest.raises(TypeError, match="nn.Module"):
        export(lambda x: x, (torch.randn(2),))


def test_an_exported_program_is_not_called_directly():
    ep = export(Add(), (torch.randn(2), torch.randn(2)))
    with pytest.raises(RuntimeError, match="module()"):
        ep(torch.randn(2), torch.randn(2))


def test_stand_ins_have_no_data():
    x = StandIn.like(torch.ones(2, 3))
    assert (x + 1).shape == (2, 3)
    with pytest.raises(DataDependentError):
        x.sum().item()


# ----------------------------------------------------------------------- the verifier


def test_the_verifier_rejects_a_mutating_operator_naming_the_node():
    ep = export(Add(), (torch.randn(2), torch.randn(2)))
    (add,) = ep.graph.find_nodes(op="call_function")
    add.target = aten.add_.Tensor
    with pytest.raises(ExportVerifierError, match=r"%add: .*mutates"):
        ep.validate()


def test_the_verifier_rejects_a_python_function_target():
    ep = export(Add(), (torch.randn(2), torch.randn(2)))
    (add,) = ep.graph.find_nodes(op="call_function")
    add.target = torch.add
    with pytest.raises(ExportVerifierError, match="not an operator overload"):
        ep.validate()


def test_the_verifier_rejects_missing_metadata_and_a_late_placeholder():
    ep = export(Add(), (torch.randn(2), torch.randn(2)))
    (add,) = ep.graph.find_nodes(op="call_function")
    del add.meta["stack_trace"]
    with pytest.raises(ExportVerifierError, match=r"%add: meta\['stack_trace'\]"):
        ep.validate()
    ep = export(Add(), (torch.randn(2), torch.randn(2)))
    (add,) = ep.graph.find_nodes(op="call_function")
    with ep.graph.inserting_after(add):
        ep.graph.placeholder("late")
    with pytest.raises(ExportVerifierError, match="%late: placeholders must come first"):
        ep.validate()


def test_the_verifier_rejects_a_signature_that_does_not_fit():
    ep = export(Add(), (torch.randn(2), torch.randn(2)))
    ep.graph_signature.input_specs.pop()
    with pytest.raises(ExportVerifierError, match="2 placeholders but the signature lists 1"):
        ep.validate()


# ----------------------------------------------------------------------- printing


def test_the_program_prints_its_code_signature_and_range_constraints():
    text = str(export(LinearBN().eval(), (torch.randn(5, 4),)))
    assert text.startswith("ExportedProgram:")
    assert "torch.ops.aten.addmm.default" in text
    assert "p_linear_weight: PARAMETER target='linear.weight'" in text
    assert "Range constraints: {}" in text


# ----------------------------------------------------------------------- real models


ZOO = {
    "mlp_tiny": (mlp_tiny, mlp_tiny_inputs),
    "resnet_tiny": (resnet_tiny, resnet_tiny_inputs),
    "transformer_tiny": (transformer_tiny, transformer_tiny_inputs),
}


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_models_export_and_match_eager_and_torch_export(name, train):
    build, inputs = ZOO[name]
    torch.manual_seed(0)
    model = build().train(train)
    twin = build().train(train)
    twin.load_state_dict(model.state_dict())
    args = tuple(inputs())
    ep = export(model, args)
    theirs = torch_export(model, args)
    assert sorted(specs(ep.graph_signature)) == sorted(specs(theirs.graph_signature))
    assert kinds_and_targets(ep.graph_signature.output_specs) == kinds_and_targets(
        theirs.graph_signature.output_specs
    )
    if train and name == "transformer_tiny":
        return  # dropout: random
    module = ep.module()
    with torch.no_grad():
        assert_close(module(*args), twin(*args))
        # Another input of the same shape: the program is not a recording of one example.
        other = tuple(torch.randn_like(a) if a.is_floating_point() else a for a in args)
        assert_close(module(*other), twin(*other))
    for key, value in twin.state_dict().items():
        assert_close(module.state_dict()[key], value)


@pytest.mark.parametrize("name", ["resnet_tiny", "transformer_tiny"])
def test_decomposed_to_core_aten_the_node_count_is_torch_exports(name):
    build, inputs = ZOO[name]
    model = build().eval()
    args = tuple(inputs())
    core = export(model, args).run_decompositions()
    theirs = torch.export.export(model, args).run_decompositions()
    ours_ops = {str(t) for t in operators(core)}
    theirs_ops = {str(n.target) for n in theirs.graph.nodes if n.op == "call_function"}
    assert ours_ops == theirs_ops
    assert len(core.graph.nodes) == len(theirs.graph.nodes)
    with torch.no_grad():
        assert_close(core.module()(*args), model(*args))


def test_run_decompositions_keeps_metadata_and_takes_a_table():
    ep = export(nn.Linear(3, 2), (torch.randn(4, 3),))
    table = {aten.addmm.default: lambda bias, a, b: torch.mm(a, b) + bias}
    mine = ep.run_decompositions(table)
    assert aten.addmm.default not in operators(mine) and aten.mm.default in operators(mine)
    for node in mine.graph.find_nodes(op="call_function"):
        assert "stack_trace" in node.meta
    assert aten.addmm.default in operators(ep)  # the original is unchanged
    x = torch.randn(4, 3)
    assert_close(mine.module()(x), ep.module()(x))


ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit", "t5", "whisper"])
def test_hugging_face_models_export_and_match_eager(name):
    pytest.importorskip("transformers")
    from benchmarks.zoo.methods import FLAGS, fixed_args, run_eager
    from benchmarks.zoo.registry import get

    model, inputs = get(name).build()
    flags = {k: v for k, v in fixed_args(model, inputs).items() if k in FLAGS}
    with torch.no_grad():
        expected = run_eager(model, inputs)
        ep = export(model, (), {**inputs, **flags})
        got = ep.module()(**inputs, **flags)
    expected = [v for v in (expected.values() if isinstance(expected, dict) else expected)]
    got = [v for v in (got.values() if isinstance(got, dict) else got)]
    assert_close(got[0], expected[0], rtol=1e-4, atol=1e-5)


class MakesATensor(nn.Module):
    def forward(self, x):
        return torch.tensor([1.0, 2.0, 3.0]) * 2 + x


def test_a_tensor_made_in_forward_is_a_constant_placed_among_the_inputs():
    ep = export(MakesATensor(), (torch.randn(3),))
    assert [(s.kind.name, s.target) for s in ep.graph_signature.input_specs] == [
        ("CONSTANT_TENSOR", "lifted_tensor_0"),
        ("USER_INPUT", None),
    ]
    assert_close(ep.constants["lifted_tensor_0"], torch.tensor([1.0, 2.0, 3.0]))
    x = torch.randn(3)
    assert_close(ep.module()(x), MakesATensor()(x))
    assert_close(ep.run_decompositions().module()(x), MakesATensor()(x))


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_batch_norm_without_running_statistics_writes_nothing(train):
    model = nn.BatchNorm2d(4, track_running_stats=False).train(train)
    x = torch.randn(2, 4, 3, 3)
    ep = export(model, (x,))
    assert ep.graph_signature.buffers_to_mutate == {}
    assert_close(ep.module()(x), model(x))


def test_the_module_of_a_program_deep_copies_and_pickles():
    import copy
    import pickle

    model = LinearBN().eval()
    module = export(model, (torch.randn(5, 4),)).module()
    x = torch.randn(5, 4)
    assert_close(copy.deepcopy(module)(x), model(x))
    assert_close(pickle.loads(pickle.dumps(module))(x), model(x))


def test_non_tensor_and_repeated_outputs_keep_their_places():
    class Mixed(nn.Module):
        def forward(self, x, n: int = 3):
            return x, x, x.shape[0] * n, None, x.view(-1)

    x = torch.randn(2, 3)
    ep = export(Mixed(), (x,))
    assert [str(s) for s in ep.graph_signature.output_specs] == [
        "x: USER_OUTPUT",
        "x: USER_OUTPUT",
        "6: USER_OUTPUT",
        "None: USER_OUTPUT",
        "view: USER_OUTPUT",
    ]
    got = ep.module()(x)
    assert got[2] == 6 and got[3] is None and torch.equal(got[4], x.view(-1))


def test_a_buffer_written_twice_is_one_mutation_with_the_final_value():
    class Counts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x):
            self.count += 1
            self.count.add_(x.sum())
            return x * self.count

    model = Counts()
    ep = export(model, (torch.ones(2),))
    assert list(ep.graph_signature.buffers_to_mutate.values()) == ["count"]
    assert model.count == 0  # export ran nothing for real
    module = ep.module()
    assert_close(module(torch.ones(2)), torch.full((2,), 3.0))
    assert module.count == 3


class Span:
    """A user class registered as a container: its tensors are inputs, its label is fixed."""

    def __init__(self, start: torch.Tensor, end: torch.Tensor, label: str) -> None:
        self.start, self.end, self.label = start, end, label


fxloom.pytree.register_pytree_node(
    Span,
    lambda span: ([span.start, span.end], span.label),
    lambda children, label: Span(*children, label),
)


def test_a_user_registered_container_is_flattened_in_and_rebuilt_out():
    class Widen(nn.Module):
        def forward(self, span: Span) -> Span:
            return Span(span.start - 1, span.end + 1, span.label.upper())

    span = Span(torch.zeros(2), torch.ones(2), "a")
    ep = export(Widen(), (span,))
    assert [s.arg.name for s in ep.graph_signature.input_specs] == ["span_0", "span_1"]
    out = ep.module()(Span(torch.ones(2), torch.ones(2), "a"))
    assert isinstance(out, Span) and out.label == "A"
    assert_close(out.start, torch.zeros(2))
    assert_close(out.end, torch.full((2,), 2.0))
