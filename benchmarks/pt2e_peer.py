"""torch's PT2E post-training quantization (``torchao``), the peer of fxloom's quantizer on
exported programs; used by the tests and ``bench_quantize.py``, never by ``fxloom/``.

``pt2e_int8(model, example, data)`` runs the documented flow: ``torch.export.export(...)
.module()``, ``prepare_pt2e`` with ``X86InductorQuantizer`` and its default config (per-channel
weights, histogram observers, 8-bit activations), calibration on ``data``, ``convert_pt2e``.
``reduce_range=True`` gives its activations 7 bits, as its docstring says to "on earlier CPUs
without VNNI to avoid accuracy issue" (their int8 kernels add pairs of products in 16 bits).
The result is PT2E's *reference* model: quantize/dequantize pairs around float operators, meant
to be lowered by ``torch.compile`` (inductor) into int8 kernels; run eagerly it computes in
float on the rounded values. X86InductorQuantizer quantizes the inputs and weights of
linear/conv layers and leaves their outputs in float where the next operator is not annotated
(SELU in deeprec_tiny; cnn_small's residual add, what follows it, and the classifier's output).

torchao 0.18 is pure Python for this and depends on nothing (``pip install torchao
--no-deps``); its compiled extensions for CUDA kernels fail to load on a CPU-only torch with a
harmless message.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


def pt2e_int8(
    model: nn.Module, example: tuple, data: list, reduce_range: bool = False
) -> nn.Module:
    """PT2E's converted (reference q/dq) module of ``model``, calibrated on ``data``;
    ``reduce_range``: 7-bit activations."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's deprecation notes at import
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config(reduce_range=reduce_range))
    prepared = prepare_pt2e(torch.export.export(model, example).module(), quantizer)
    with torch.no_grad():
        for batch in data:
            prepared(batch)
    return convert_pt2e(prepared)
