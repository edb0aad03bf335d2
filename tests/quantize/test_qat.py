"""prepare_qat: fake quantization, a few training steps, then the same convert.

Each model trains for ``STEPS`` Adam steps on a fixed batch: cnn_small to classify it
(cross-entropy against fixed labels), deeprec_tiny to reconstruct its input ratings (the
paper's autoencoder task). Bounds, converted model against
the QAT model in eval mode on held-out data:

    model          relative error   cosine similarity
    deeprec_tiny   < 0.12           > 0.99
    cnn_small      < 0.12           > 0.99

torch.ao's ``prepare_qat_fx``/``convert_fx`` (default x86 QAT config) trains the same way
as the comparison: fxloom's converted-vs-QAT error must be at most 1.5x torch's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from quantize_helpers import batches, cosine, relative_error
from torch import nn
from torch.ao.quantization import get_default_qat_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_qat_fx

from fxloom import zoo
from fxloom.quantize import QuantConfig, QuantizeError, QuantSpec, convert, prepare_qat, report
from fxloom.quantize.convert import quantized_engine
from fxloom.quantize.fake_quantize import FakeQuantize
from fxloom.quantize.qat_modules import QATConv2d, QATLinear
from fxloom.zoo.deeprec import ratings

STEPS = 10
BOUNDS = {"deeprec_tiny": (0.12, 0.99), "cnn_small": (0.12, 0.99)}


def images(seed: int, batch: int = 8) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def recommender_batch(seed: int) -> torch.Tensor:
    return ratings(16, 256, seed)


DATA = {"deeprec_tiny": recommender_batch, "cnn_small": images}


def loss_fn(name: str):
    x = DATA[name](1)
    if name == "deeprec_tiny":
        return lambda trained: (trained(x) - x).pow(2).mean()
    labels = torch.arange(len(x)) % 10
    return lambda trained: nn.functional.cross_entropy(trained(x), labels)


def train(name: str, trained: nn.Module) -> list[float]:
    """``STEPS`` Adam steps of ``trained`` on the task of ``name``; the losses."""
    torch.manual_seed(0)  # dropout
    loss_of = loss_fn(name)
    optimizer = torch.optim.Adam(trained.parameters(), lr=1e-3)
    losses = []
    for _ in range(STEPS):
        loss = loss_of(trained)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return losses


def trained_qat(name: str):
    model, inputs = zoo.build(name)
    qat = prepare_qat(model, inputs)
    losses = train(name, qat)
    return model, inputs, qat.eval(), losses


def held_out(name: str) -> torch.Tensor:
    return torch.cat(batches(DATA[name], 2, first=100))


def test_prepare_qat_returns_a_training_copy_with_fake_quantize_and_qat_layers() -> None:
    model, inputs = zoo.build("cnn_small")
    qat = prepare_qat(model, inputs)
    kinds = {type(m) for m in qat.modules()}
    assert qat.training and not model.training  # the user's model is not touched
    assert {FakeQuantize, QATConv2d, QATLinear} <= kinds
    assert not any(isinstance(m, nn.BatchNorm2d) for m in qat.modules())  # folded first
    assert all(type(m) is not QATLinear for m in model.modules())


def test_the_qat_model_trains_on_its_own_copy_of_the_weights() -> None:
    model, inputs = zoo.build("deeprec_tiny")
    before = copy.deepcopy(model.state_dict())
    qat = prepare_qat(model, inputs)
    train("deeprec_tiny", qat)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def _converted_weight(converted: nn.Module, kernels: str) -> torch.Tensor:
    """The float weight of ``converted``'s one int8 layer, as its kernels compute with it."""
    if kernels == "torch.ao":
        (packed,) = [m for n, m in converted.named_modules() if n.endswith("_packed_params")]
        return packed._weight_bias()[0].dequantize()
    (codes,) = [b for b in converted.buffers() if b.dtype == torch.int8]
    (scale,) = [b for n, b in converted.named_buffers() if n.startswith("scale")]
    return codes.float() * scale[:, None]


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("kernels", ["plain", "torch.ao"])
def test_training_sees_the_weights_convert_computes_with(kernels: str, narrow: bool) -> None:
    # each convert rounds its own way (they differ on a few ties); QAT rounds as it will
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(512, 256)), torch.randn(4, 512)
    config = QuantConfig(
        scheme="qat", kernels=kernels, global_spec=QuantSpec(narrow_weights=narrow)
    )
    qat = prepare_qat(model, (x,), config)
    qat(x)
    (twin,) = [m for m in qat.modules() if isinstance(m, QATLinear)]
    with torch.no_grad():
        trained = twin.fake_quantized_weight()
    converted = convert(qat.eval())
    assert torch.equal(_converted_weight(converted, kernels), trained)


def test_fake_quantize_passes_the_gradient_straight_through_inside_the_range() -> None:
    from fxloom.quantize.observers import MinMaxObserver

    fake = FakeQuantize(MinMaxObserver())
    _ = fake(torch.tensor([-1.0, 1.0]))  # range [-1, 1]
    fake.eval()  # frozen: 2.0 is outside the range
    x = torch.tensor([0.3, 0.5, 2.0], requires_grad=True)
    fake(x).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 0.0]


def test_fake_quantize_in_eval_mode_no_longer_observes() -> None:
    from fxloom.quantize.observers import MinMaxObserver

    fake = FakeQuantize(MinMaxObserver())
    _ = fake(torch.tensor([-1.0, 1.0]))
    fake.eval()
    out = fake(torch.tensor([5.0]))
    assert fake.observer.max_val.item() == 1.0 and out.item() == pytest.approx(1.0, abs=0.01)


def test_a_layer_read_in_float_has_no_fake_quantize_on_its_output() -> None:
    # convert gives each Linear of deeprec_tiny float input and output (table.FLOAT_IO), so
    # training rounds only what the int8 model rounds: the values the Linears read
    model, inputs = zoo.build("deeprec_tiny")
    qat = prepare_qat(model, inputs)
    fakes = {name for name, m in qat.named_modules() if isinstance(m, FakeQuantize)}
    selus = {"encoder_1", "encoder_3", "decoder_1", "decoder_3"}
    assert fakes == {f"{value}_observer" for value in {"x", "drop"} | selus}


@pytest.mark.parametrize("name", sorted(DATA))
def test_a_few_training_steps_reduce_the_loss(name: str) -> None:
    *_, losses = trained_qat(name)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("name", sorted(DATA))
def test_converted_model_computes_what_the_qat_model_does_in_eval(name: str) -> None:
    _, _, qat, _ = trained_qat(name)
    int8 = convert(qat)
    x = held_out(name)
    with torch.no_grad():
        ref, out = qat(x), int8(x)
    max_error, min_cosine = BOUNDS[name]
    assert relative_error(out, ref) < max_error
    assert cosine(out, ref) > min_cosine


@pytest.mark.parametrize("name", sorted(DATA))
def test_convert_after_qat_uses_torch_s_int8_modules(name: str) -> None:
    _, _, qat, _ = trained_qat(name)
    int8 = convert(qat)
    assert not any(isinstance(m, (FakeQuantize, QATLinear, QATConv2d)) for m in int8.modules())
    assert report(int8).quantized and qat.training is False


@pytest.mark.parametrize("name", sorted(DATA))
def test_converted_error_is_close_to_torch_ao_qat(name: str) -> None:
    model, inputs, qat, _ = trained_qat(name)
    int8 = convert(qat)
    with quantized_engine("x86"):
        theirs = prepare_qat_fx(
            copy.deepcopy(model).train(), get_default_qat_qconfig_mapping("x86"), inputs
        )
        train(name, theirs)
        theirs.eval()
        theirs_int8 = convert_fx(copy.deepcopy(theirs))
        x = held_out(name)
        with torch.no_grad():
            ours_error = relative_error(int8(x), qat(x))
            theirs_error = relative_error(theirs_int8(x), theirs(x))
    assert ours_error <= 1.5 * theirs_error


def test_prepare_qat_refuses_dynamic_mode() -> None:
    model, inputs = zoo.build("deeprec_tiny")
    with pytest.raises(QuantizeError, match="mode is 'dynamic'"):
        prepare_qat(model, inputs, QuantConfig(mode="dynamic"))


def test_convert_before_any_training_step_is_refused() -> None:
    model, inputs = zoo.build("deeprec_tiny")
    with pytest.raises(QuantizeError, match="have seen no data"):
        convert(prepare_qat(model, inputs).eval())
