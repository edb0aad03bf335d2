"""``fxloom.compile(module)`` passes everything but ``forward`` through to the module.

As ``torch.compile``'s wrapper: ``compiled.generate``, ``compiled.config``,
``compiled.device`` are the model's; attributes set on the wrapper land on the model;
``train()``/``eval()`` reach it. Unlike torch's, ``state_dict()`` keys carry no
``_orig_mod.`` prefix: they are the model's own. The model here is a tiny Hugging Face GPT-2
with random weights (nothing downloaded).
"""

from __future__ import annotations

import copy

import pytest
import torch

import fxloom
from fxloom.bytecode.compiled import CompiledModule


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture
def prompt() -> torch.Tensor:
    return torch.tensor([[5, 17, 42, 3, 9]])


def test_generate_on_the_compiled_module_gives_eagers_tokens(gpt2, prompt):
    compiled = fxloom.compile(gpt2)
    with torch.no_grad():
        expected = gpt2.generate(prompt, max_new_tokens=4, do_sample=False)
        tokens = compiled.generate(prompt, max_new_tokens=4, do_sample=False)
    assert torch.equal(tokens, expected)


def test_generate_is_the_models_own_method_as_with_torch_compile(gpt2):
    # torch.compile(model).generate is model.generate too: the generation loop calls the
    # model's own forward; compile that (model.forward = fxloom.compile(model.forward)) to
    # compile generation
    compiled = fxloom.compile(gpt2)
    assert compiled.generate.__self__ is gpt2
    assert torch.compile(gpt2).generate.__self__ is gpt2


def test_the_compiled_call_equals_eager_on_the_model(gpt2, prompt):
    compiled = fxloom.compile(gpt2)
    with torch.no_grad():
        assert torch.equal(compiled(prompt).logits, gpt2(prompt).logits)


def test_config_device_and_submodules_are_the_models(gpt2):
    compiled = fxloom.compile(gpt2)
    assert compiled.config is gpt2.config
    assert compiled.device == gpt2.device == torch.device("cpu")
    assert compiled.transformer is gpt2.transformer
    assert compiled.lm_head.weight is gpt2.lm_head.weight


def test_parameters_and_their_names_are_the_models(gpt2):
    compiled = fxloom.compile(gpt2)
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in gpt2.parameters()]
    assert [name for name, _ in compiled.named_parameters()] == [
        name for name, _ in gpt2.named_parameters()
    ]


def test_state_dict_keys_are_the_models_without_torchs_orig_mod_prefix(gpt2):
    compiled = fxloom.compile(gpt2)
    assert list(compiled.state_dict()) == list(gpt2.state_dict())
    assert all(key.startswith("_orig_mod.") for key in torch.compile(gpt2).state_dict())


def test_a_plain_models_checkpoint_loads_into_the_compiled_module():
    plain, model = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    compiled = fxloom.compile(model)
    compiled.load_state_dict(plain.state_dict())
    assert torch.equal(model.weight, plain.weight)
    x = torch.randn(4, 3)
    assert torch.equal(compiled(x), plain(x))


def test_an_attribute_set_on_the_compiled_module_lands_on_the_model():
    model = torch.nn.Linear(3, 2)
    compiled = fxloom.compile(model)
    compiled.note = "set through the wrapper"
    assert model.note == "set through the wrapper"
    compiled.extra = torch.nn.ReLU()  # a submodule registers on the model
    assert "extra" in dict(model.named_children())
    del compiled.note
    assert not hasattr(model, "note")


def test_train_and_eval_reach_the_model(gpt2):
    compiled = fxloom.compile(gpt2)
    compiled.train()
    assert gpt2.training and compiled.training and gpt2.transformer.training
    compiled.eval()
    assert not gpt2.training and not compiled.training and not gpt2.transformer.training


def test_the_repr_shows_the_model():
    model = torch.nn.Linear(3, 2)
    assert repr(fxloom.compile(model)) == f"CompiledModule({model!r})"


def test_the_compiled_module_is_a_module_but_not_an_instance_of_the_models_class(gpt2):
    compiled = fxloom.compile(gpt2)
    assert isinstance(compiled, torch.nn.Module)
    assert not isinstance(compiled, type(gpt2))  # as torch.compile's wrapper
    assert compiled._orig_mod is gpt2  # the model, named as torch names it


def test_len_is_the_models():
    assert len(fxloom.compile(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.ReLU()))) == 2


def test_a_deep_copy_computes_with_its_own_copy_of_the_model():
    model = torch.nn.Linear(3, 2)
    compiled = fxloom.compile(model)
    x = torch.randn(4, 3)
    compiled(x)
    copied = copy.deepcopy(compiled)
    with torch.no_grad():
        copied.weight.zero_()
        copied.bias.zero_()
    assert torch.equal(copied(x), torch.zeros(4, 2))
    assert torch.equal(compiled(x), model(x)) and not torch.equal(model(x), torch.zeros(4, 2))


def test_a_call_never_reaches_getattr(monkeypatch):
    model = torch.nn.Linear(3, 2)
    compiled = fxloom.compile(model)
    looked_up: list[str] = []
    passing_through = CompiledModule.__getattr__

    def counting(self, name):
        looked_up.append(name)
        return passing_through(self, name)

    monkeypatch.setattr(CompiledModule, "__getattr__", counting)
    x = torch.randn(4, 3)
    compiled(x)
    compiled(x)
    assert looked_up == []


def test_the_models_forward_hooks_run_around_the_compiled_forward():
    model = torch.nn.Linear(3, 2)
    model.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
    model.register_forward_hook(lambda module, args, output: output + 1)
    x = torch.randn(4, 3)
    assert torch.equal(fxloom.compile(model)(x), model(x))


def test_the_models_full_backward_hooks_run_in_the_compiled_backward():
    model = torch.nn.Linear(3, 2)
    seen: list[str] = []
    model.register_full_backward_hook(lambda module, grad_in, grad_out: seen.append("hook"))
    fxloom.compile(model)(torch.randn(4, 3, requires_grad=True)).sum().backward()
    assert seen == ["hook"]


def test_modules_and_apply_meet_the_model_itself():
    model = torch.nn.Linear(3, 2)
    compiled = fxloom.compile(model)
    assert list(compiled.modules()) == [model]
    seen: list[torch.nn.Module] = []
    assert compiled.apply(seen.append) is compiled
    assert seen == [model]


def test_a_batch_norms_state_dict_keeps_its_version_through_the_compiled_module():
    # BatchNorm overrides _load_from_state_dict for its version; the model's own runs
    model = torch.nn.BatchNorm1d(3)
    compiled = fxloom.compile(model)
    state = compiled.state_dict()
    assert state._metadata[""]["version"] == type(model)._version
    compiled.load_state_dict(state)


def test_a_compiled_module_inside_a_parent_saves_and_loads_under_its_name():
    parent = torch.nn.Sequential(torch.nn.Linear(3, 3))
    parent.append(fxloom.compile(torch.nn.Linear(3, 2)))
    plain = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    assert list(parent.state_dict()) == list(plain.state_dict())
    parent.load_state_dict(plain.state_dict())
    x = torch.randn(4, 3)
    assert torch.equal(parent(x), plain(x))


def test_a_submodule_replaced_through_the_compiled_module_is_seen_by_the_next_call():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    compiled = fxloom.compile(model)
    x = torch.randn(4, 3)
    compiled(x)
    setattr(compiled, "1", torch.nn.Tanh())
    assert isinstance(model[1], torch.nn.Tanh)
    assert torch.equal(compiled(x), model(x))
