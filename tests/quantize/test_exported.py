"""The quantizer on exported programs (``fxloom.export``): ``prepare(ep, example_inputs)``.

The operator-level graph's weighted operators (``aten.addmm`` with ``aten.t``,
``aten.convolution`` with an inference batch norm after it) become layers again, and the
same plan, observers and convert follow. Bound: the exported flow's error against fp32 on
held-out data equals the traced flow's (within 1e-6), on deeprec_tiny and cnn_small.
Batches have the example's shape, as exported programs check it.
"""

from __future__ import annotations

import pytest
import torch
from quantize_helpers import batches, relative_error

from fxloom import zoo
from fxloom.export import export
from fxloom.quantize import calibrate, convert, ops, prepare, report
from fxloom.quantize.exported import lift_layers
from fxloom.zoo.deeprec import ratings

aten = torch.ops.aten


def images(seed: int) -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


DATA = {"deeprec_tiny": lambda seed: ratings(8, 256, seed), "cnn_small": images}


def int8_of(name: str, exported: bool):
    model, inputs = zoo.build(name)
    source = export(model, inputs) if exported else model
    prepared = prepare(source, inputs)
    calibrate(prepared, batches(DATA[name], 8), progress=False)
    return model, convert(prepared)


@pytest.mark.parametrize("name", sorted(DATA))
def test_an_exported_program_quantizes_with_the_traced_model_s_error(name: str) -> None:
    model, from_program = int8_of(name, exported=True)
    _, from_module = int8_of(name, exported=False)
    x = DATA[name](100)
    with torch.no_grad():
        ref = model(x)
        error = relative_error(from_program(x), ref)
        assert error == pytest.approx(relative_error(from_module(x), ref), abs=1e-6)
    assert error < 0.05


def test_addmm_of_a_transposed_weight_becomes_the_linear_layer_it_was() -> None:
    _, int8 = int8_of("deeprec_tiny", exported=True)
    rows = report(int8).rows
    assert [row.calls for row in report(int8).quantized][:2] == [
        "encoder.0, a Linear",
        "encoder.2, a Linear",
    ]
    assert {row.calls for row in rows if row.kind == "float"} == {"torch.ops.aten.elu.default"}


def test_convolution_and_batch_norm_become_one_int8_conv() -> None:
    _, int8 = int8_of("cnn_small", exported=True)
    targets = {node.target for node in int8.graph.nodes if node.op == "call_function"}
    assert aten._native_batch_norm_legit_no_training.default not in targets
    assert aten.convolution.default not in targets
    # the residual add and its ReLU fused into the convolution before it (its only user)
    sums = [node for node in int8.graph.nodes if node.target is ops.conv2d_add_int8]
    assert len(sums) == 1 and sums[0].args[-1] is True
    # max pooling too, without its unused indices; the global average is float (KEPT_FLOAT),
    # and so the view of it
    in_float = [row.calls for row in report(int8).in_float]
    assert in_float == ["torch.ops.aten.mean.dim", "torch.ops.aten.view.default"]
    convs = [node.args[-1] for node in int8.graph.nodes if node.target is ops.conv2d_int8]
    assert sorted(convs) == [True, True, True]  # each with its ReLU fused


def test_lifting_layers_computes_what_the_program_does_and_leaves_it_alone() -> None:
    model, inputs = zoo.build("cnn_small")
    program = export(model, inputs).module()
    code = program.code
    lifted = lift_layers(program)
    with torch.no_grad():
        assert torch.allclose(lifted(*inputs), program(*inputs), atol=1e-5)
    assert program.code == code
    assert {n.op for n in lifted.graph.nodes if "stem" in str(n.target)} == {"call_module"}
