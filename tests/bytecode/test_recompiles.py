"""Recompiles: an identical call never compiles again; a real change to the module does.

A compiled module's parameters, buffers and submodules are guarded by one integer, the
module epoch of its own tree (``fxloom.bytecode.guards.ModuleTree``): it counts what the
tree's modules register, not what any module registers. So a second identical call reuses
the entry even when the forward builds modules of its own (a slice of a ``ModuleList``) or
re-registers its buffer, and a module outside the tree registering a parameter (another
model, a backend's lowering) leaves the entry valid; assigning ``model.fc = nn.Linear(...)``
still recompiles. Each model is called as users call it and compared with eager; no test
asserts a timing.
"""

from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fxloom
from fxloom import pytree

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `benchmarks` is not installed; import it from the checkout
    sys.path.insert(0, ROOT)

pytestmark = pytest.mark.usefixtures("one_thread")


def assert_same(got: Any, expected: Any) -> None:
    got, expected = pytree.tensor_leaves(got), pytree.tensor_leaves(expected)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def graphs(compiled: Any) -> int:
    return compiled.explain().graph_count


def call_twice(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Compile ``model``, call it twice with the same arguments (each equal to eager), check
    that the second call compiled nothing, and return the compiled module."""
    compiled = fxloom.compile(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model(*args, **kwargs)
        assert_same(compiled(*args, **kwargs), expected)
        first = graphs(compiled)
        assert_same(compiled(*args, **kwargs), expected)
    report = compiled.explain()
    assert (report.graph_count, report.recompiles) == (first, []), str(report)
    return compiled


# ------------------------------------------------------------------ modules of our own
class SlicesItsLayers(nn.Module):
    """Llama's pattern: ``self.layers[:n]`` builds a new ModuleList on every call, which
    registers each layer into it."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for layer in self.layers[:2]:
            x = torch.relu(layer(x))
        return x


class ReRegistersItsBuffer(nn.Module):
    """A forward that registers its buffer again on every call (the same tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 2.0), persistent=False)

    def forward(self, x):
        self.register_buffer("scale", self.scale, persistent=False)
        return x * self.scale


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


def test_two_identical_calls_compile_once():
    compiled = call_twice(Small(), torch.randn(2, 4))
    assert graphs(compiled) == 1


def test_a_forward_that_slices_a_module_list_compiles_once():
    compiled = call_twice(SlicesItsLayers(), torch.randn(2, 4))
    assert graphs(compiled) == 1
    assert compiled.explain().recompiles == []


def test_a_forward_that_re_registers_its_buffer_compiles_once():
    """Registering is a graph break (the hook receives a tensor); the second call reuses
    both pieces."""
    call_twice(ReRegistersItsBuffer(), torch.randn(2, 4))


def test_a_module_outside_the_tree_registering_a_parameter_does_not_recompile():
    model = Small()
    compiled = call_twice(model, torch.randn(2, 4))
    other = nn.Linear(3, 3)
    other.register_parameter("extra", nn.Parameter(torch.zeros(1)))
    other.extra_layer = nn.Linear(2, 2)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
    assert graphs(compiled) == 1


def test_assigning_a_new_submodule_in_the_tree_recompiles():
    model = Small()
    compiled = call_twice(model, torch.randn(2, 4))
    model.fc = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
    assert graphs(compiled) == 2
    assert "gained or replaced" in compiled.explain().recompiles[0]


def test_a_new_buffer_deep_in_the_tree_recompiles():
    model = SlicesItsLayers()
    compiled = call_twice(model, torch.randn(2, 4))
    model.layers[1].weight = nn.Parameter(torch.randn(4, 4))
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
    assert graphs(compiled) == 2


def test_a_submodule_added_after_a_change_is_part_of_the_tree():
    """After a change the tree's membership is computed again: a module that joined it is
    watched from then on."""
    model = Small()
    compiled = call_twice(model, torch.randn(2, 4))
    new = nn.Linear(4, 4)
    model.fc = new
    x = torch.randn(2, 4)
    with torch.no_grad():
        compiled(x)  # recompiles for the new fc
        new.weight = nn.Parameter(torch.randn(4, 4))
        assert_same(compiled(x), model(x))
    assert graphs(compiled) == 3


class WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.register_buffer("shift", torch.ones(4))

    def forward(self, x):
        return self.act(self.fc(x)) + self.shift


# Changes that register nothing, so the module epoch does not count them: each replaces what
# the entry held (``del``, writes into the module's own dicts, ``_apply`` as ``.to()`` uses
# it). The entry ran the objects it held (silently the old values) until the guard that
# each held object is still registered where it was.
UNREGISTERED_CHANGES = {
    "a buffer written into _buffers": lambda m: m._buffers.__setitem__(
        "shift", torch.full((4,), 4.0)
    ),
    "a parameter written into _parameters": lambda m: m.fc._parameters.__setitem__(
        "weight", nn.Parameter(torch.zeros(4, 4))
    ),
    "a submodule written into _modules": lambda m: m._modules.__setitem__("act", nn.Tanh()),
    "a buffer deleted, an attribute in its place": lambda m: (
        delattr(m, "shift"),
        setattr(m, "shift", 5.0),
    ),
    "_apply changing values": lambda m: m._apply(lambda t: t * 2),
    "a parent replaced through _modules (the child still registered in the old one)": lambda m: (
        m._modules.__setitem__("fc", nn.Linear(4, 4))
    ),
}


def changed_between_calls(model: nn.Module, change: Any) -> Any:
    """Compile ``model`` and call it twice, ``change`` it, then call it twice more: each
    call equal to eager, the change compiled once. Returns the compiled module."""
    compiled = call_twice(model, torch.randn(2, 4))
    change(model)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
        assert_same(compiled(x), model(x))
    assert graphs(compiled) == 2
    return compiled


@pytest.mark.parametrize("change", UNREGISTERED_CHANGES)
def test_a_change_the_epoch_does_not_count_recompiles(change):
    torch.manual_seed(0)
    compiled = changed_between_calls(WithBuffer(), UNREGISTERED_CHANGES[change])
    assert "still registered where they were" in compiled.explain().recompiles[0]


class BranchesOnItsWeight(nn.Module):
    """A forward whose Python reads its own parameter's strides and ``requires_grad``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        scale = 2.0 if self.weight.is_contiguous() else 3.0
        return x @ self.weight * scale if self.weight.requires_grad else x.sum(1, keepdim=True)


# Changes to a held parameter that keep its dtype and shape: the graph took a branch on them.
HELD_PARAMETER_CHANGES = {
    "param.data transposed (its strides)": lambda m: setattr(m.weight, "data", m.weight.data.t()),
    "requires_grad_(False) (a frozen layer)": lambda m: m.weight.requires_grad_(False),
}


@pytest.mark.parametrize("change", HELD_PARAMETER_CHANGES)
def test_a_held_parameter_s_strides_and_requires_grad_are_guarded(change):
    torch.manual_seed(0)
    changed_between_calls(BranchesOnItsWeight(), HELD_PARAMETER_CHANGES[change])


def test_a_deleted_submodule_raises_as_in_eager():
    model = WithBuffer()
    compiled = call_twice(model, torch.randn(2, 4))
    del model.act
    with pytest.raises(AttributeError, match="act"):
        model(torch.randn(2, 4))
    with pytest.raises(AttributeError, match="act"):
        compiled(torch.randn(2, 4))


def test_two_compiled_models_do_not_invalidate_each_other():
    first, second = Small(), Small()
    compiled_first = call_twice(first, torch.randn(2, 4))
    compiled_second = call_twice(second, torch.randn(2, 4))
    second.fc = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert_same(compiled_second(x), second(x))
        assert_same(compiled_first(x), first(x))
    assert (graphs(compiled_first), graphs(compiled_second)) == (1, 2)


def twice_the_output_of(model: nn.Module):
    """A plain function (not a module) that calls ``model``: compiled with no root."""

    def f(x):
        return model(x) * 2

    return f


def test_a_compiled_function_is_not_invalidated_by_module_registrations():
    f = twice_the_output_of(Small())
    compiled = fxloom.compile(f)
    x = torch.randn(2, 4)
    with torch.no_grad():
        compiled(x)
        nn.Linear(2, 2).register_buffer("b", torch.zeros(1))
        assert_same(compiled(x), f(x))
    assert graphs(compiled) == 1


def test_a_compiled_function_still_sees_a_replaced_submodule():
    """Without a root the module's submodules are guarded one by one, by identity."""
    model = Small()
    f = twice_the_output_of(model)
    compiled = fxloom.compile(f)
    x = torch.randn(2, 4)
    with torch.no_grad():
        compiled(x)
        model.fc = nn.Linear(4, 4)
        assert_same(compiled(x), f(x))


# ------------------------------------------------------------------ Hugging Face models
HF_MODELS = ["llama", "mistral", "qwen2", "phi", "gemma", "opt", "bart"]


@pytest.mark.parametrize("name", HF_MODELS)
def test_a_hugging_face_model_called_twice_compiles_once(name):
    pytest.importorskip("transformers")
    from benchmarks.zoo import methods, registry

    model, inputs = registry.get(name).build()
    fixed = methods.fixed_args(model, inputs)
    compiled = call_twice(model, **inputs, **fixed)
    report = compiled.explain()
    assert report.recompiles == [], str(report)
    assert report.runs_as_python is None


def test_phi3_with_its_rope_buffers_compiles_once():
    transformers = pytest.importorskip("transformers")
    config = transformers.Phi3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM(config).eval()
    ids = torch.randint(1, 64, (2, 7))
    compiled = call_twice(model, input_ids=ids, use_cache=False, return_dict=False)
    assert compiled.explain().recompiles == []


@pytest.mark.parametrize("name", ["resnet_tiny", "transformer_tiny", "deeprec_tiny"])
def test_a_zoo_model_called_twice_compiles_once(name):
    import fxloom.zoo as zoo

    model = getattr(zoo, name)().eval()
    inputs = getattr(zoo, f"{name}_inputs")()
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    compiled = call_twice(model, *inputs)
    assert compiled.explain().recompiles == []


# ------------------------------------------------------------------ pieces run as Python
class Slotted:
    """An object with slots: the program's own, but not one fxloom can rebuild after a graph."""

    __slots__ = ("value",)


def breaks_then_holds_a_slotted_object(x):
    n = float(x.sum())
    box = Slotted()
    box.value = x * n
    m = float(box.value.sum())
    return box.value + m


def test_a_piece_that_cannot_be_captured_is_named_by_explain_with_its_line():
    compiled = fxloom.compile(breaks_then_holds_a_slotted_object)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), breaks_then_holds_a_slotted_object(x))
    report = compiled.explain()
    [text] = report.pieces_as_python
    assert "test_recompiles.py:" in text and "Slotted" in text
    assert "runs as Python after a break" in str(report)


def test_after_a_piece_cannot_be_captured_the_function_runs_as_python(monkeypatch):
    """Natively: interpreting the rest of every call would be slower than Python itself."""
    from fxloom.bytecode import driver

    compiled = fxloom.compile(breaks_then_holds_a_slotted_object)
    x = torch.randn(3)
    compiled(x)
    assert "runs as Python from the next call" in compiled.explain().runs_as_python
    interpreted = []
    run = driver._AS_PYTHON.run
    monkeypatch.setattr(driver._AS_PYTHON, "run", lambda *a: interpreted.append(a) or run(*a))
    torch.testing.assert_close(compiled(x), breaks_then_holds_a_slotted_object(x))
    assert interpreted == []
    assert compiled.explain().graph_count == 1


# ------------------------------------------------------------------ fewer graphs than breaks
GELU_TANH = functools.partial(torch.nn.functional.gelu, approximate="tanh")


def test_a_partial_of_a_torch_function_is_recorded_without_a_break():
    """Gemma's activation: ``partial(F.gelu, approximate="tanh")``."""

    def f(x):
        return GELU_TANH(x) * 2

    compiled = fxloom.compile(f)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))
    report = compiled.explain()
    assert (report.graph_count, report.break_count) == (1, 0)


class EmbeddingWithOffset(nn.Embedding):
    """OPT's and BART's pattern: a subclass of a torch.nn module calling ``super().forward``."""

    def forward(self, ids):
        return super().forward(ids + 1) * 2


def test_super_forward_of_a_torch_nn_module_is_one_graph():
    model = EmbeddingWithOffset(10, 4)
    ids = torch.tensor([[1, 2, 3]])
    compiled = call_twice(model, ids)
    report = compiled.explain()
    assert (report.graph_count, report.break_count) == (1, 0), str(report)


class CachesItsBias(nn.Module):
    """LeViT's pattern: a tensor cached in a dict attribute by a first (eager) call, read back
    through the dict on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(4))
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, x):
        key = str(x.device)
        if key not in self.cache:
            self.cache[key] = self.bias * 2
        return x + self.cache[key] + self.cache[key]


def test_a_tensor_read_twice_through_an_outside_dict_compiles_once():
    model = CachesItsBias()
    with torch.no_grad():
        model(torch.randn(2, 4))  # fills the cache
    call_twice(model, torch.randn(2, 4))


class CastsToItsDtype(nn.Module):
    """XLNet's pattern (``PreTrainedModel.dtype``): the dtype of the first parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        dtype = next(p.dtype for p in self.parameters() if p.is_floating_point())
        return self.fc(x.to(dtype))


def test_module_parameters_inside_forward_is_one_graph():
    compiled = call_twice(CastsToItsDtype(), torch.randn(2, 4, dtype=torch.float64))
    report = compiled.explain()
    assert (report.graph_count, report.break_count) == (1, 0), str(report)


class Base(nn.Module):
    def scale(self, x):
        return x * 2


class SuperWithSelfInAClosure(Base):
    """transformers' ModelOutput.__post_init__: ``self`` read by a generator expression (a cell)
    and ``super()`` in the same method."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        shapes = all(self.fc is not None for _ in range(2))
        return super().scale(self.fc(x)) if shapes else x


def test_super_in_a_method_whose_self_is_a_cell_is_one_graph():
    compiled = call_twice(SuperWithSelfInAClosure(), torch.randn(2, 4))
    report = compiled.explain()
    assert (report.graph_count, report.break_count) == (1, 0), str(report)


def test_a_backend_that_builds_modules_compiles_once():
    """A backend's lowering builds modules of its own (the onnxruntime backend does): they are
    outside the compiled module's tree."""

    def wrapping_backend(graph_module, example_inputs):
        holder = nn.Module()
        holder.graph = graph_module  # registers a submodule, outside the compiled tree
        return holder.graph.forward

    model = Small()
    compiled = fxloom.compile(model, backend=wrapping_backend)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            assert_same(compiled(x), model(x))
    assert (graphs(compiled), compiled.explain().recompiles) == (1, [])
