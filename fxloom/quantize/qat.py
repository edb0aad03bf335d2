"""``prepare_qat``: a model to fine-tune with int8 rounding in the loop, then ``convert``.

The same steps as ``prepare`` (trace, fold batch norms, plan), with two differences:

* where ``prepare`` puts an observer, ``prepare_qat`` puts a ``FakeQuantize`` around it: in
  training mode it observes and rounds activations to int8 and back, the gradient passing
  straight through (within the representable range);
* every layer the plan makes int8 (Linear, Conv) becomes its ``qat_modules.QAT_MODULES``
  twin, which rounds its weight the way ``convert`` will.

Scales and zero points are observer-driven, not learned: activations use a moving-average
min/max observer by default (``QuantSpec(activation="moving_average")``), as a histogram
per training step would be slow. Batch norms are folded into the layer before them first
(with their running statistics), so training updates the folded weights and biases; they
no longer normalise per batch. The user's model is copied, never trained in place.

Train as usual (``model.train()``, ``loss.backward()``, ``optimizer.step()``), call
``.eval()`` (activation parameters freeze), and ``convert``: the converted model computes
what the QAT model computes in eval mode, with fxloom's int8 operators::

    >>> import torch
    >>> from fxloom.quantize import prepare_qat, convert
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    >>> qat = prepare_qat(model, (torch.randn(4, 8),))
    >>> optimizer = torch.optim.SGD(qat.parameters(), lr=0.01)
    >>> for step in range(5):
    ...     x = torch.randn(32, 8)
    ...     loss = (qat(x) - x.sum(1, keepdim=True)).pow(2).mean()
    ...     optimizer.zero_grad(); loss.backward(); optimizer.step()
    >>> quantized = convert(qat.eval())
    >>> x = torch.randn(8, 8)
    >>> bool(((quantized(x) - qat(x)).norm() / qat(x).norm()) < 0.05)
    True

node.meta and ``meta["quantize"]``: as ``prepare``.

Depends on: ``prepare``, ``plan``, ``fake_quantize``, ``qat_modules``.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from fxloom.export.program import ExportedProgram
from fxloom.graph_module import GraphModule
from fxloom.passes.fuse import fuse
from fxloom.quantize.config import QuantConfig, QuantSpec
from fxloom.quantize.errors import QuantizeError
from fxloom.quantize.fake_quantize import FakeQuantize
from fxloom.quantize.plan import QuantPlan, plan_static, table_key
from fxloom.quantize.prepare import _insert_observers, _module_to_quantize, _propagate_shapes
from fxloom.quantize.qat_modules import QAT_MODULES
from fxloom.quantize.schemes import Kind
from fxloom.quantize.table import STATIC_OPS, QuantizedModule

__all__ = ["QAT_CONFIG", "prepare_qat"]

# The default of prepare_qat: static x86, activations by moving-average min/max.
QAT_CONFIG = QuantConfig(global_spec=QuantSpec(activation="moving_average"), scheme="qat")


def prepare_qat(
    model: torch.nn.Module,
    example_inputs: tuple[Any, ...] | dict[str, Any],
    config: QuantConfig | None = None,
) -> GraphModule:
    """A traced copy of ``model`` with fake quantization, in training mode, ready to train.

    Args:
        model: an ``nn.Module`` (in either mode; it is copied, not changed), a
            ``GraphModule``, or an ``fxloom.export`` program (as ``prepare`` takes it).
        example_inputs: the positional inputs of one forward (a tuple), or inputs by name;
            the prepared model takes exactly these (parameters left out keep their defaults).
        config: what to quantize and how (static mode only); ``QAT_CONFIG`` by default.

    Raises:
        QuantizeError: a dynamic-mode config, a model that does not trace, or one that does
            not run on ``example_inputs``; the message says which and what to do.
    """
    config = QAT_CONFIG if config is None else config
    if not isinstance(model, (torch.nn.Module, ExportedProgram)):
        raise TypeError(f"prepare_qat() takes an nn.Module, got {type(model).__name__}")
    if not config.scheme.calibrates:
        raise QuantizeError(
            "prepare_qat() trains with int8 rounding of weights and activations, which is "
            f"static quantization, but the config's mode is {config.mode!r}; use "
            "QuantConfig(mode='static') here, or prepare(model, inputs, config) for dynamic"
        )
    inputs = example_inputs if isinstance(example_inputs, dict) else tuple(example_inputs)
    # eval: batch norms fold with their running statistics (a program's module is new already)
    own = model if isinstance(model, ExportedProgram) else copy.deepcopy(model).eval()
    gm = _module_to_quantize(own, inputs)
    gm = fuse(gm)
    _propagate_shapes(gm, inputs)
    plan = plan_static(gm, config)
    _insert_observers(gm, plan, wrap=FakeQuantize)
    _swap_in_qat_layers(gm, plan)
    gm.meta["quantize"] = plan
    return gm.train()


def _swap_in_qat_layers(gm: GraphModule, plan: QuantPlan) -> None:
    """Each int8 layer with a QAT twin gets it (its weight fake-quantized as convert will)."""
    engine = plan.config.engine
    for node in gm.graph.find_nodes(op="call_module"):
        decision = plan.decisions.get(node.name)
        if decision is None or decision.kind != Kind.INT8:
            continue
        module = gm.get_submodule(node.target)
        entry = STATIC_OPS.get(table_key(node, gm))
        twin = QAT_MODULES.get(type(module))
        if twin is None or not isinstance(entry, QuantizedModule):
            continue
        kernels = plan.config.kernels
        weight_observer = functools.partial(
            decision.spec.weight_observer, engine, entry.weight_axis, kernels
        )
        gm.add_submodule(node.target, twin.from_float(module, weight_observer, kernels))
