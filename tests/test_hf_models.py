"""Hugging Face models traced with ``fxloom.symbolic_trace``: a zoo of real architectures.

The models are the Hugging Face rows of the zoo benchmark's registry
(``benchmarks/zoo/registry.py``): tiny configs with random weights (``torch.manual_seed(0)``,
no downloads), inputs as a function of (batch, size). Each is traced with the non-tensor
flags fixed by ``concrete_args`` and example inputs given by name. The traced module must
compute what eager PyTorch computes on the example, and on a second input of another batch
size and length; where tracing specialised on the example (control flow on a size: a causal
mask for one token, ViT's image-size check), the registry names a ``violating`` size, which
must raise the guard's error instead of returning wrong numbers.

A case that fxloom cannot handle yet stays in the zoo, its registry row naming the test and
the reason (the transformers source line and the error); the test is marked
``xfail(strict=True)``, so fixing it shows as an XPASS. (For comparison, not tested here:
``torch.fx.symbolic_trace`` fails on nearly all of these models, and ``transformers.utils.fx``
supports only a listed subset.)
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

import fxloom
from fxloom.zoo.hf_configs import BART_LIKE, VOCAB, hf

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is not installed; import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.zoo.methods import fixed_args  # noqa: E402
from benchmarks.zoo.registry import ONE_TOKEN, SPECS, ModelSpec, seq2seq  # noqa: E402

# Funnel indexes with lists of slices, eagerly and so in the traced code too.
pytestmark = pytest.mark.filterwarnings("ignore:Using a non-tuple sequence:UserWarning")

# Where fxloom's run-time checks live: the guards of tracing and the input checks.
CHECK_FILES = {Path(fxloom.__file__).parent / name for name in ("guards.py", "runtime_checks.py")}
ZOO = [spec for spec in SPECS.values() if spec.source == "transformers"]
# The tests a registry row's ``xfail`` may name.
TESTS = (
    "matches_eager",
    "generalises",
    "padded",
    "guards",
    "one_token",
    "lints",
    "leaves_the_eager_model_unchanged",
    "pickles",
    "loss",
)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Run torch on one thread: these models are tiny, and two threads on a busy two-core
    machine spin against each other (the file takes minutes instead of seconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def cases(
    test: str,
    where: Callable[[ModelSpec], bool] = lambda spec: True,
    among: list[ModelSpec] = ZOO,
) -> list[Any]:
    """The models as pytest params for ``test``, with those known to fail there marked."""
    assert test in TESTS, f"add {test!r} to TESTS"
    params = []
    for spec in among:
        if not where(spec):
            continue
        marks = []
        if spec.trace_fails:
            marks.append(
                pytest.mark.xfail(raises=fxloom.TraceError, strict=True, reason=spec.trace_fails)
            )
        elif test in spec.xfail:
            marks.append(pytest.mark.xfail(strict=True, reason=spec.xfail[test]))
        params.append(pytest.param(spec, id=spec.name, marks=marks))
    return params


# ------------------------------------------------------------------ helpers
def example_inputs(spec: ModelSpec) -> dict[str, torch.Tensor]:
    return spec.make_inputs(*spec.example)


def has_attention_mask(spec: ModelSpec) -> bool:
    return "attention_mask" in example_inputs(spec)


def reads_tokens(spec: ModelSpec) -> bool:
    """Whether ``size`` counts tokens (of the encoder, the decoder or both)."""
    return not {"input_ids", "decoder_input_ids"}.isdisjoint(example_inputs(spec))


def padded(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``inputs`` with the last two positions of the first row masked out (right padding)."""
    mask = inputs["attention_mask"].clone()
    mask[0, -2:] = 0
    return {**inputs, "attention_mask": mask}


def trace(
    spec: ModelSpec, model: torch.nn.Module | None = None, example: dict[str, Any] | None = None
) -> fxloom.GraphModule:
    """``spec``'s model (a fresh one unless given) traced on its example inputs; every other
    parameter of its forward fixed (``fixed_args``: flags such as ``return_dict=False``, the
    rest to their defaults)."""
    model = spec.build_model() if model is None else model
    example = example_inputs(spec) if example is None else example
    return fxloom.symbolic_trace(model, fixed_args(model, example), example_inputs=example)


def eager(spec: ModelSpec, inputs: dict[str, Any], model: torch.nn.Module | None = None) -> list:
    """The tensors ``spec``'s model (a fresh one unless given: never the traced one) returns."""
    model = spec.build_model() if model is None else model
    with torch.no_grad():
        return tensors(model(**inputs, **fixed_args(model, inputs)))


def run(module: torch.nn.Module, inputs: dict[str, Any]) -> list[torch.Tensor]:
    with torch.no_grad():
        return tensors(module(**inputs))


def tensors(output: Any) -> list[torch.Tensor]:
    """Every tensor in a model output (tuples, lists, ``ModelOutput``), in order."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, transformers.utils.ModelOutput):
        output = output.to_tuple()
    if isinstance(output, (tuple, list)):
        return [tensor for item in output for tensor in tensors(item)]
    assert output is None, f"unexpected output {type(output).__name__}"
    return []


def assert_same_outputs(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert expected, "the model returned no tensor"
    assert len(actual) == len(expected), "the traced module returns another number of tensors"
    for traced_tensor, eager_tensor in zip(actual, expected):
        assert_close(traced_tensor, eager_tensor)


def assert_raises_guard_error(call: Callable[[], Any]) -> None:
    """``call`` must fail in one of fxloom's run-time guards, not somewhere in the model."""
    with pytest.raises((RuntimeError, TypeError, ValueError)) as info:
        call()
    assert Path(info.traceback[-1].path) in CHECK_FILES, info.getrepr(style="short")
    assert "traced" in str(info.value)


# ------------------------------------------------------------------ every model
@pytest.mark.parametrize("spec", cases("matches_eager"))
def test_traced_model_matches_eager_on_the_example(spec: ModelSpec) -> None:
    example = example_inputs(spec)
    assert_same_outputs(run(trace(spec), example), eager(spec, example))


@pytest.mark.parametrize("spec", cases("generalises"))
def test_traced_model_matches_eager_on_another_batch_size_and_length(spec: ModelSpec) -> None:
    other = spec.make_inputs(*spec.other)
    assert_same_outputs(run(trace(spec), other), eager(spec, other))


@pytest.mark.parametrize("spec", cases("padded", has_attention_mask))
def test_traced_model_matches_eager_with_a_padded_attention_mask(spec: ModelSpec) -> None:
    other = padded(spec.make_inputs(*spec.other))
    assert_same_outputs(run(trace(spec), other), eager(spec, other))


@pytest.mark.parametrize("spec", cases("padded", has_attention_mask))
def test_traced_model_matches_eager_without_padding_when_traced_on_a_padded_mask(
    spec: ModelSpec,
) -> None:
    traced = trace(spec, example=padded(example_inputs(spec)))
    other = spec.make_inputs(*spec.other)
    assert_same_outputs(run(traced, other), eager(spec, other))


@pytest.mark.parametrize("spec", cases("guards", lambda spec: spec.violating is not None))
def test_traced_model_refuses_an_input_that_takes_another_branch(spec: ModelSpec) -> None:
    traced = trace(spec)
    assert_raises_guard_error(lambda: run(traced, spec.make_inputs(*spec.violating)))


@pytest.mark.parametrize("spec", cases("one_token", reads_tokens))
def test_traced_model_is_right_or_refuses_on_a_single_token(spec: ModelSpec) -> None:
    # One token is where text models branch most (causal masks, SDPA's is_causal, packing
    # of grouped-query heads): the traced module either computes what eager computes or
    # fails in a guard, never returns other numbers.
    # Where eager itself fails on one token (Funnel fails in gather), the traced module must
    # fail too: in a guard, or with eager's own error.
    traced, one = trace(spec), spec.make_inputs(*ONE_TOKEN)
    try:
        expected = eager(spec, one)
    except (RuntimeError, TypeError, ValueError) as eager_error:
        with pytest.raises(type(eager_error)) as info:
            run(traced, one)
        if str(info.value) != str(eager_error):
            assert_raises_guard_error(lambda: run(traced, one))
        return
    try:
        actual = run(traced, one)
    except (RuntimeError, TypeError, ValueError):
        assert_raises_guard_error(lambda: run(traced, one))
    else:
        assert_same_outputs(actual, expected)


@pytest.mark.parametrize("spec", cases("lints"))
def test_traced_graph_lints(spec: ModelSpec) -> None:
    traced = trace(spec)
    traced.graph.lint(traced)


@pytest.mark.parametrize("spec", cases("leaves_the_eager_model_unchanged"))
def test_tracing_leaves_the_eager_model_unchanged(spec: ModelSpec) -> None:
    model = spec.build_model()
    traced = trace(spec, model)
    example = example_inputs(spec)
    assert_same_outputs(eager(spec, example, model), eager(spec, example))
    assert_same_outputs(run(traced, example), eager(spec, example))  # still the same graph


PICKLED = {"bert", "gpt2_lm", "llama", "t5", "vit_classifier", "swin"}


@pytest.mark.parametrize("spec", cases("pickles", lambda spec: spec.name in PICKLED))
def test_traced_model_survives_a_pickle_round_trip(spec: ModelSpec) -> None:
    traced = trace(spec)
    loaded = pickle.loads(pickle.dumps(traced))
    assert loaded.code == traced.code
    other = spec.make_inputs(*spec.other)
    assert_same_outputs(run(loaded, other), eager(spec, other))


# ------------------------------------------------------------------ heads with a loss
def labelled(inputs: Callable[[int, int], dict], classes: int | None = None) -> Callable:
    """``inputs`` plus ``labels``: one class per row, or else a target token per position."""

    def make(batch: int, length: int) -> dict[str, torch.Tensor]:
        made = inputs(batch, length)
        generator = torch.Generator().manual_seed(batch * 100 + length + 7)
        if classes is not None:
            shape, high = (batch,), classes
        else:
            shape, high = made.get("decoder_input_ids", made["input_ids"]).shape, VOCAB
        return {**made, "labels": torch.randint(0, high, shape, generator=generator)}

    return make


def with_labels(name: str, classes: int | None = None) -> ModelSpec:
    spec = SPECS[name]
    return dataclasses.replace(spec, make_inputs=labelled(spec.make_inputs, classes))


LOSS_HEADS = [
    with_labels("gpt2_lm"),
    with_labels("llama_lm"),
    with_labels("t5_generator"),
    # Not in the zoo benchmark (BartModel is): the head that computes a loss from labels.
    ModelSpec(
        "bart_generator",
        "text-encoder-decoder",
        hf("BartForConditionalGeneration", "BartConfig", **BART_LIKE),
        labelled(seq2seq),
    ),
    with_labels("bert_classifier", classes=3),
]


@pytest.mark.parametrize("spec", cases("loss", among=LOSS_HEADS))
def test_head_model_traces_its_loss_from_labels(spec: ModelSpec) -> None:
    other = spec.make_inputs(*spec.other)
    outputs = run(trace(spec), other)
    assert outputs[0].dim() == 0  # the loss comes first
    assert_same_outputs(outputs, eager(spec, other))


# ------------------------------------------------------------------ the registry
def test_every_known_failure_in_the_registry_names_a_test_of_this_file() -> None:
    for spec in [*ZOO, *LOSS_HEADS]:
        assert set(spec.xfail) <= set(TESTS), spec.name
