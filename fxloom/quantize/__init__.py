"""Post-training quantization on the graph (the torch.fx paper, section 6.2.1).

Three phases, as the paper describes them::

    prepared = prepare(model, example_inputs, config)  # trace, fuse, insert observers
    calibrate(prepared, batches)                       # observers record value ranges
    quantized = convert(prepared)                      # int8 weights, quantized kernels

``prepare`` traces a plain module with ``fxloom.symbolic_trace``, folds batch norms
(``fxloom.passes.fuse``), and puts observers on the values that will be int8. The prepared
model computes exactly what the model does. ``convert`` replaces layers with fxloom's
quantized operators on plain tensors (``quantize.ops``: int8 weights, uint8 activations,
float scales; ``QuantConfig(kernels="torch.ao")`` gives torch's deprecated quantized modules
instead), quantizes at the borders of int8 regions, dequantizes before operators without an
int8 kernel, and removes dequantize/quantize pairs that cancel. A scheme is a record
(``schemes``): ``QuantConfig(scheme="dynamic")`` quantizes Linear weights, and activations per
tensor at run time (no calibration; ``"dynamic_per_token"``: per token), ``"w8"`` and ``"w4"`` (``"w4_g32"``...) quantize weights
only. ``report(quantized)`` says what became int8 and what stayed float, and why, and which
kernel runs each layer on this CPU::

    >>> import torch
    >>> from fxloom.quantize import prepare, calibrate, convert, report
    >>> _ = torch.manual_seed(1)  # 4 small batches calibrate: other draws may clip more
    >>> model = torch.nn.Sequential(
    ...     torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ... ).eval()
    >>> prepared = prepare(model, (torch.randn(8, 16),))
    >>> _ = calibrate(prepared, [torch.randn(8, 16) for _ in range(4)], progress=False)
    >>> quantized = convert(prepared)
    >>> x = torch.randn(8, 16)
    >>> error = (quantized(x) - model(x)).norm() / model(x).norm()
    >>> bool(error < 0.05)
    True
    >>> [row.calls for row in report(quantized).quantized]
    ['0, a Linear', '2, a Linear']

``prepare_qat(model, example_inputs)`` is the same with fake quantization instead of
observers, for fine-tuning with int8 rounding in the loop before the same ``convert``.

``prepare`` also takes an ``fxloom.export`` program: its weighted ATen operators become
layers again (``exported.lift_layers``) and the same flow follows.

Modules: ``observers`` (what observes), ``config`` (what to quantize, how), ``schemes`` (the
schemes as records), ``table`` (which operators have int8 kernels: extend it for your
layers), ``plan`` (decisions per node), ``prepare``, ``calibrate``, ``convert``, ``report``;
``ops`` (fxloom's quantized operators and their references), ``weights`` (integer weights),
``kernels`` (the fast kernel per operator and CPU), ``importer`` (PT2E/torchao
``quantized_decomposed`` graphs into fxloom's operators: ``import_quantized``); for QAT ``fake_quantize``,
``qat_modules``, ``qat``; ``exported``.

Depends on: the IR, the tracer's entry point, ``fxloom.passes`` (fuse, shape_prop), torch
(``torch.library``; torch.ao's quantized modules only with ``kernels="torch.ao"``).
"""

from __future__ import annotations

from fxloom.quantize.calibrate import calibrate
from fxloom.quantize.config import QuantConfig, QuantSpec
from fxloom.quantize.convert import convert
from fxloom.quantize.errors import QuantizeError, SaturationWarning
from fxloom.quantize.importer import import_quantized
from fxloom.quantize.observers import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    Observer,
    PerChannelMinMaxObserver,
)
from fxloom.quantize.prepare import prepare
from fxloom.quantize.qat import prepare_qat
from fxloom.quantize.report import QuantReport, report

__all__ = [
    "HistogramObserver",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "Observer",
    "PerChannelMinMaxObserver",
    "QuantConfig",
    "QuantReport",
    "QuantSpec",
    "QuantizeError",
    "SaturationWarning",
    "calibrate",
    "convert",
    "import_quantized",
    "prepare",
    "prepare_qat",
    "report",
]
