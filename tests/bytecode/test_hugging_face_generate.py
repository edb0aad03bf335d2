"""Hugging Face generation with a compiled forward: ``model.forward = fxloom.compile(model.forward)``
then greedy ``model.generate`` with the default ``DynamicCache`` gives eager's tokens and
compiles twice with the default options: one prefill for every prompt length, one decode for
every cache length.

The sequence (issue 35's): a 5-token prompt and 8 new tokens, 16 more tokens from that output,
then a 9-token prompt. Dynamo (``torch.compile`` with a counting backend) compiles 4 graphs on
it (benchmarks/bench_generate_compiles.py): prefill, decode, decode again for the cache length,
prefill again for the second prompt length. fxloom compiles:

1. the prefill, with the prompt length symbolic from the start: the call fills the empty cache
   (``layer.keys`` held None and is assigned a tensor), so the next prompt would bring another
   length; the arguments' sizes the filled tensor took are made symbolic and the call captured
   again (``fxloom.bytecode.dynamic.grew_state``); the 13- and 9-token prompts run it;
2. the first decode, with the cache length symbolic from the start: the program reads
   ``layer.keys`` and assigns ``layer.keys`` a longer tensor (``torch.cat``), so the next
   call would bring another length.

``dynamic=True`` compiles the same two.

Tiny configs, random weights, nothing downloaded.
"""

from __future__ import annotations

import pytest
import torch

import fxloom

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.bytecode


def gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100)
    return _ready(transformers.GPT2LMHeadModel(config))


def llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
    )
    return _ready(transformers.LlamaForCausalLM(config))


MODELS = {"gpt2": gpt2, "llama": llama}


def _ready(model: torch.nn.Module) -> torch.nn.Module:
    model.eval()
    model.generation_config.pad_token_id = 0  # no warning about it on every generate
    return model


def prompt(length: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + length)
    return torch.randint(1, 100, (batch, length), generator=generator)


def sequence(model: torch.nn.Module, batch: int = 1) -> list[torch.Tensor]:
    """Prompt 5 + 8 tokens, 16 more from that output, a 9-token prompt + 8: the outputs."""
    with torch.no_grad():
        first = model.generate(prompt(5, batch), max_new_tokens=8, do_sample=False)
        longer = model.generate(first, max_new_tokens=16, do_sample=False)
        other = model.generate(prompt(9, batch), max_new_tokens=8, do_sample=False)
    return [first, longer, other]


def assert_same_tokens(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_and_tokens(request):
    torch.manual_seed(0)
    model = MODELS[request.param]()
    return model, sequence(model)


def compiled_forward(model: torch.nn.Module, **options) -> object:
    """``model.forward = fxloom.compile(model.forward)``, undone by ``del model.forward``."""
    model.forward = fxloom.compile(model.forward, **options)
    return model.forward


def test_generate_with_a_compiled_forward_gives_eager_tokens_with_2_compiles(model_and_tokens):
    model, expected = model_and_tokens
    compiled = compiled_forward(model)
    try:
        assert_same_tokens(sequence(model), expected)
    finally:
        del model.forward
    report = compiled.explain()
    assert report.graph_count <= 2  # prefill (any prompt length), decode (any cache length)
    assert report.graph_break_count == 0
    assert not report.runs_as_python


def test_the_cache_length_is_symbolic_from_the_first_decode(model_and_tokens):
    model, expected = model_and_tokens
    compiled = compiled_forward(model)
    try:
        with torch.no_grad():  # prefill, then 7 decodes
            first = model.generate(prompt(5), max_new_tokens=8, do_sample=False)
    finally:
        del model.forward
    assert torch.equal(first, expected[0])
    report = compiled.explain()
    assert report.graph_count == 2
    grown = [line for line in report.dynamic_sizes if "the program grows it" in line]
    assert grown and all(".layers[" in line and ".shape[2]" in line for line in grown)


def test_the_prompt_length_is_symbolic_from_the_first_prefill(model_and_tokens):
    model, expected = model_and_tokens
    compiled = compiled_forward(model)
    try:
        with torch.no_grad():  # the prefill fills the empty DynamicCache
            first = model.generate(prompt(5), max_new_tokens=2, do_sample=False)
    finally:
        del model.forward
    assert torch.equal(first, expected[0][:, :7])
    filled = [line for line in compiled.explain().dynamic_sizes if "fills" in line]
    assert (
        "kwargs['input_ids'].shape[1]: 5 -> any (now symbolic: state the program fills takes it)"
        in filled
    )


def test_dynamic_true_compiles_prefill_and_decode_once_each(model_and_tokens):
    model, expected = model_and_tokens
    compiled = compiled_forward(model, dynamic=True)
    try:
        assert_same_tokens(sequence(model), expected)
    finally:
        del model.forward
    assert compiled.explain().graph_count == 2


def test_another_batch_size_gives_eager_tokens_within_the_budget():
    torch.manual_seed(0)
    model = gpt2()
    prompts = [prompt(5, batch=1), prompt(5, batch=2), prompt(9, batch=2)]

    def generate_each() -> list[torch.Tensor]:
        with torch.no_grad():
            return [model.generate(p, max_new_tokens=4, do_sample=False) for p in prompts]

    expected = generate_each()
    compiled = compiled_forward(model)
    try:
        assert_same_tokens(generate_each(), expected)
    finally:
        del model.forward
    report = compiled.explain()
    assert not report.runs_as_python
    assert report.graph_count <= 4  # batch 1: prefill, decode; batch 2: both again


def test_the_compiled_module_passes_generate_through_to_the_model():
    torch.manual_seed(0)
    model = gpt2()
    expected = sequence(model)
    compiled = fxloom.compile(model)
    # ``generate`` is the model's and calls the model's own forward, as torch.compile's
    # wrapper does: eager's tokens, nothing compiled.
    assert_same_tokens(sequence(compiled), expected)
    assert compiled.explain().graph_count == 0


# ---------------------------------------------------------------- the mechanisms, without HF
class _Layer:
    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None


def _append(layer: _Layer, new: torch.Tensor) -> torch.Tensor:
    if layer.keys is None:
        layer.keys = new
    else:
        layer.keys = torch.cat([layer.keys, new], dim=1)
    return layer.keys.sum(1)


def test_a_tensor_the_program_grows_is_read_symbolic_at_the_next_compile():
    compiled = fxloom.compile(_append)
    layer, eager_layer = _Layer(), _Layer()
    for step in range(6):
        new = torch.full((1, 1, 4), float(step))
        torch.testing.assert_close(compiled(layer, new), _append(eager_layer, new))
    torch.testing.assert_close(layer.keys, eager_layer.keys)
    report = compiled.explain()
    assert report.graph_count == 2  # empty, then one for every length
    assert report.dynamic_sizes[-1] == (
        "layer.keys.shape[1]: 1 -> 2 (now symbolic: the program grows it)"
    )


def test_a_tensor_grown_by_a_symbolic_length_is_read_symbolic_too():
    compiled = fxloom.compile(_append)
    layer, eager_layer = _Layer(), _Layer()
    for length in (3, 2, 1, 1, 4, 2):
        new = torch.randn(1, length, 4)
        torch.testing.assert_close(compiled(layer, new), _append(eager_layer, new))
    torch.testing.assert_close(layer.keys, eager_layer.keys)
    report = compiled.explain()
    assert report.graph_count == 2
    assert report.dynamic_sizes == [  # the first call fills the empty layer with ``new``
        "new.shape[0]: 1 -> any (now symbolic: state the program fills takes it)",
        "new.shape[1]: 3 -> any (now symbolic: state the program fills takes it)",
        "new.shape[2]: 4 -> any (now symbolic: state the program fills takes it)",
        "layer.keys.shape[1]: 3 -> 5 (now symbolic: the program grows it)",
    ]


def test_the_sizes_an_empty_state_is_filled_with_are_symbolic_from_the_first_compile():
    # A new empty layer each call, as each ``generate`` makes a new cache: every call is a
    # prefill, and the first one's entry takes every length (the batch and width the program
    # needs fixed are guarded: ``why_static``).
    compiled = fxloom.compile(_append)
    for length in (3, 5, 2):
        layer, eager_layer = _Layer(), _Layer()
        new = torch.randn(1, length, 4)
        torch.testing.assert_close(compiled(layer, new), _append(eager_layer, new))
        torch.testing.assert_close(layer.keys, eager_layer.keys)
    report = compiled.explain()
    assert report.graph_count == 1
    assert "new.shape[1]: 3 -> any (now symbolic: state the program fills takes it)" in (
        report.dynamic_sizes
    )


def test_a_filled_state_leaves_the_sizes_static_with_dynamic_false():
    compiled = fxloom.compile(_append, dynamic=False)
    for length in (3, 5, 2):
        compiled(_Layer(), torch.randn(1, length, 4))
    assert compiled.explain().graph_count == 3


def _fill_once(layer: _Layer, new: torch.Tensor) -> torch.Tensor:
    layer.keys = torch.zeros(2, 3)  # a constant shape: no size of ``new`` fills it
    return new + 1


def test_a_filled_state_whose_sizes_no_argument_has_promotes_nothing():
    compiled = fxloom.compile(_fill_once)
    compiled(_Layer(), torch.randn(4))
    assert compiled.explain().dynamic_sizes == []


def test_a_grown_tensor_stays_static_with_dynamic_false():
    compiled = fxloom.compile(_append, dynamic=False)
    layer = _Layer()
    for step in range(4):
        compiled(layer, torch.full((1, 1, 4), float(step)))
    assert compiled.explain().graph_count == 4


def _attention(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # as transformers' sdpa_attention: ``and`` hands on the SymBool it tested
    is_causal = q.shape[2] > 1 and True
    return torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=is_causal)


def test_a_symbolic_bool_given_to_a_torch_function_is_its_value_under_a_guard():
    compiled = fxloom.compile(_attention)
    for length in (5, 1, 1, 3):
        q, k = torch.randn(1, 2, length, 8), torch.randn(1, 2, 4, 8)
        torch.testing.assert_close(compiled(q, k), _attention(q, k))
    report = compiled.explain()
    assert report.graph_break_count == 0
    assert report.graph_count == 3  # 5 (static), 1 (not causal), 3 (causal: the guard missed)


def _attend(x: torch.Tensor, cache: torch.Tensor | None) -> torch.Tensor:
    if cache is None:  # the prefill
        return x * 2
    return torch.cat([cache, x]).sum(0)  # a decode step over a cache it does not grow itself


def test_a_size_that_changes_behind_the_front_entry_is_promoted():
    # The static first entry (cache None) stays in front; the decode entry behind it is the one
    # the growing cache misses, and its size is compared too.
    calls = [(torch.randn(5, 4), None)]
    calls += [(torch.randn(1, 4), torch.randn(length, 4)) for length in (5, 6, 7, 8)]
    compiled = fxloom.compile(_attend)
    for args in calls:
        torch.testing.assert_close(compiled(*args), _attend(*args))
    assert compiled.explain().graph_count == 3  # prefill; decode at 5; decode, any length


def _takes_mask(fn: object, x: torch.Tensor) -> torch.Tensor:
    # as generate's ``"attention_mask" in set(inspect.signature(self.forward).parameters.keys())``
    import inspect

    accepts = "mask" in set(inspect.signature(fn).parameters.keys())
    return x + 1 if accepts else x - 1


def test_reading_a_signatures_parameters_is_no_break():
    compiled = fxloom.compile(_takes_mask)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(_attend, x), _takes_mask(_attend, x))
    assert compiled.explain().graph_break_count == 0


class _Averaged(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mean = x.mean(0)  # a buffer replaced, not filled: it held a tensor
        return x - self.mean


def test_a_buffer_assigned_again_is_not_a_filled_state():
    compiled = fxloom.compile(_Averaged())
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), x - x.mean(0))
    assert compiled.explain().dynamic_sizes == []
