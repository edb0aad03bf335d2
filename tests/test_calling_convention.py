"""What lowering, splitting and quantizing return is called as the program given to them is.

An exported program's module (``ep.module()``) takes the user's inputs by name or position,
checks them (``ValueError`` naming the input for a shape or structure it was not exported
for) and returns the model's own output: a Hugging Face ``ModelOutput``, a tensor. ``lower``,
``split_module`` and ``quantize.prepare`` take the program (or its module) through
``fxloom.passes.captured`` and keep that calling convention: the same output class and
structure, the same input checks, run in PyTorch before any ONNX region or partition, and the
same numbers as eager, at the example's size and at another one the program allows.
``translate`` returns an ONNX model whose inputs are the program's and whose outputs, in order,
rebuild the program's output class with its output tree spec.

Models: BERT from a tiny config (random weights, no downloads), the embedded
``transformer_tiny`` (a tensor out), and the embedded ``mlp_tiny`` under a head returning a
dict, all exported with a dynamic batch (and BERT a dynamic sequence).
Each result is built once per module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from fxloom import pytree, zoo
from fxloom._notes import message_of
from fxloom.export import Dim, export
from fxloom.ops.runtime_functions import stays_on_host
from fxloom.passes.split_module import split_module
from fxloom.zoo.hf_configs import BERT_LIKE, VOCAB, hf

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

# Tiny models on a busy two-core machine: one thread (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")

BATCH, SEQ = Dim("batch", max=16), Dim("seq", max=32)
CALLS = ("call_function", "call_method", "call_module")


class Program:
    """A model, its exported program, and inputs at the example's size and another."""

    def __init__(self, model: torch.nn.Module, inputs: Callable[..., Any], dynamic: Any) -> None:
        self.model = model
        self.inputs = inputs  # inputs(batch, seed) -> a dict by name or a tuple
        self.dynamic = dynamic
        self.ep = export(model, *self._args_kwargs(inputs(2, 0)), dynamic_shapes=dynamic)

    @staticmethod
    def _args_kwargs(inputs: Any) -> tuple[tuple, dict]:
        return ((), inputs) if isinstance(inputs, dict) else (inputs, {})

    def call(self, module: Callable[..., Any], inputs: Any) -> Any:
        args, kwargs = self._args_kwargs(inputs)
        with torch.no_grad():
            return module(*args, **kwargs)


def bert_inputs(batch: int, seed: int, length: int | None = None) -> dict[str, torch.Tensor]:
    length = length or (8 if batch == 2 else 5)
    ids = torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, -2:] = 0  # right padding in the first row
    return {"input_ids": ids, "attention_mask": mask}


def zoo_inputs(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    _, mask = zoo.MODELS["transformer_tiny"].example_inputs(seed)  # causal, 16 tokens
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 100, (batch, mask.shape[-1]), generator=generator), mask


class Heads(torch.nn.Module):
    """A model returning a dict: the embedded MLP's logits and their probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = zoo.MODELS["mlp_tiny"].builder()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.mlp(x)
        return {"logits": logits, "probs": logits.softmax(-1)}


def heads_inputs(batch: int, seed: int) -> tuple[torch.Tensor]:
    (x,) = zoo.MODELS["mlp_tiny"].example_inputs(seed)
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, *x.shape[1:], generator=generator),)


def make_bert() -> Program:
    torch.manual_seed(0)
    model = hf("BertModel", "BertConfig", **BERT_LIKE)().eval()
    dims = {0: BATCH, 1: SEQ}
    return Program(model, bert_inputs, {"input_ids": dims, "attention_mask": dims})


def make_zoo() -> Program:
    model = zoo.MODELS["transformer_tiny"].builder()
    return Program(model, zoo_inputs, ({0: BATCH}, None))


def lower_program(program: Program) -> torch.nn.Module:
    from fxloom.lower import lower

    return lower(program.ep, program.inputs(2, 0), dynamic_shapes=program.dynamic)


def lower_module(program: Program) -> torch.nn.Module:
    from fxloom.lower import lower

    return lower(program.ep.module(), program.inputs(2, 0), dynamic_shapes=program.dynamic)


def split_in_halves(program: Program) -> torch.nn.Module:
    gm = program.ep.module()
    calls = [n.name for n in gm.graph.nodes if n.op in CALLS and not stays_on_host(n.target)]
    first = set(calls[: len(calls) // 2])
    return split_module(gm, program.model, lambda node: 0 if node.name in first else 1)


def prepare_program(program: Program) -> torch.nn.Module:
    from fxloom.quantize import prepare

    return prepare(program.ep, program.inputs(2, 0))


def make_heads() -> Program:
    return Program(Heads().eval(), heads_inputs, ({0: BATCH},))


PROGRAMS = {"bert": make_bert, "transformer_tiny": make_zoo, "dict_of_mlp_tiny": make_heads}
CONSUMERS = {
    "lower(ep)": lower_program,
    "lower(ep.module())": lower_module,
    "split_module(ep.module())": split_in_halves,
    "quantize.prepare(ep)": prepare_program,
}
# ONNX Runtime's kernels and fusions differ from PyTorch's in float32 rounding.
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(scope="module", params=list(PROGRAMS))
def program(request: pytest.FixtureRequest) -> Program:
    return PROGRAMS[request.param]()


@pytest.fixture(scope="module", params=list(CONSUMERS))
def result(request: pytest.FixtureRequest, program: Program) -> torch.nn.Module:
    return CONSUMERS[request.param](program)


def assert_same_output(got: Any, expected: Any) -> None:
    """The same class and tree of values (a ModelOutput's fields, in order), close values."""
    assert type(got) is type(expected)
    got_leaves, got_spec = pytree.tree_flatten(got)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    assert got_spec == expected_spec
    for value, reference in zip(got_leaves, expected_leaves, strict=True):
        assert_close(value, reference, **TOLERANCE)


def error_of(call: Callable[[], Any]) -> tuple[type, str]:
    with pytest.raises(Exception) as raised:
        call()
    return type(raised.value), message_of(raised.value)


def wrong_shape(program: Program) -> Any:
    """Inputs the exported module refuses: BERT's mask one token short of its ids (their
    sequence lengths are one Dim), the zoo model's mask for 15 tokens where it takes 16, the
    MLP's input one feature short."""
    inputs = program.inputs(2, 3)
    if isinstance(inputs, dict):
        return {**inputs, "attention_mask": inputs["attention_mask"][:, :-1]}
    if len(inputs) == 1:
        return (inputs[0][..., :-1],)
    tokens, mask = inputs
    return tokens, mask[:-1, :-1]


def test_the_result_returns_what_the_program_returns(program, result) -> None:
    inputs = program.inputs(2, 7)
    assert_same_output(program.call(result, inputs), program.call(program.model, inputs))


def test_the_result_runs_at_another_size_the_program_takes(program, result) -> None:
    inputs = program.inputs(3, 7)
    assert_same_output(program.call(result, inputs), program.call(program.model, inputs))


def test_the_result_refuses_an_input_with_the_program_s_error(program, result) -> None:
    inputs = wrong_shape(program)
    expected = error_of(lambda: program.call(program.ep.module(), inputs))
    assert expected[0] is ValueError
    assert error_of(lambda: program.call(result, inputs)) == expected


def test_the_result_checks_its_inputs_before_any_region_or_partition(program, result) -> None:
    kinds = [
        "check" if n.op == "call_function" and stays_on_host(n.target) else n.op
        for n in result.graph.nodes
    ]
    assert "check" in kinds
    assert kinds.index("call_module") > max(i for i, kind in enumerate(kinds) if kind == "check")


def test_the_translated_program_takes_its_inputs_and_rebuilds_its_output(program) -> None:
    import onnxruntime

    from fxloom.lower import translate

    # At the example's sizes: BERT's dynamic translation lacks an ONNX handler for
    # aten.new_ones (its mask), which the fixed sizes fold away.
    proto = translate(program.ep, program.inputs(2, 0))
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    assert names == program.ep.graph_signature.user_inputs[: len(names)]
    inputs = program.inputs(2, 5)
    values = inputs.values() if isinstance(inputs, dict) else inputs
    outputs = session.run(None, {n: v.numpy() for n, v in zip(names, values)})
    got = pytree.tree_unflatten([torch.from_numpy(o) for o in outputs], program.ep.out_spec)
    assert_same_output(got, program.call(program.model, inputs))
