"""``prepare``: trace, fuse, plan, and insert observers; the result computes what the model does.

Steps, each leaving the user's model untouched:

1. take the module to quantize (``fxloom.passes.captured.module_to_transform``): a plain
   model is traced on the example inputs (parameters left out keep their defaults, as when
   the model is called with them, and control flow on sizes or flags follows the examples
   under run-time guards), a ``GraphModule`` is used as it is, and an exported program as
   ``ep.module()`` with its weighted operators lifted to layers (``quantize.exported``), so
   the prepared module keeps its calling convention and input checks;
2. fold batch norms into the convolutions and linear layers before them
   (``fxloom.passes.fuse.fuse``, which works on a copy);
3. run the example inputs once through ``ShapeProp`` to learn which values are float tensors;
4. plan (``plan.plan_static`` or ``plan_dynamic``);
5. insert an observer module (``<value>_observer``) after every value the plan observes.

Observers return their input, so the prepared model's outputs are exactly the model's (up
to float rounding where batch norms were folded into the layer before them).

node.meta: reads ``nn_module_stack``; writes ``tensor_meta``/``type`` (shape propagation);
observer nodes get no meta. ``prepared.meta["quantize"]`` holds the ``QuantPlan``.

Depends on: the IR, ``passes.captured``, ``passes.fuse``, ``passes.shape_prop``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from fxloom import attr_path
from fxloom.export.program import ExportedProgram
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.ops.runtime_functions import stays_on_host
from fxloom.passes.captured import module_to_transform
from fxloom.passes.fuse import fuse
from fxloom.passes.shape_prop import ShapeProp
from fxloom.quantize.config import QuantConfig
from fxloom.quantize.errors import QuantizeError
from fxloom.quantize.exported import lift_layers
from fxloom.quantize.observers import Observer
from fxloom.quantize.plan import QuantPlan, plan

__all__ = ["prepare"]


def prepare(
    model: torch.nn.Module,
    example_inputs: tuple[Any, ...] | dict[str, Any],
    config: QuantConfig | None = None,
) -> GraphModule:
    """A traced copy of ``model`` with observers, ready to calibrate and ``convert``.

    Args:
        model: an ``nn.Module`` in eval mode (traced here), a ``GraphModule``, or an
            ``fxloom.export`` program (its weighted operators lifted to layers:
            ``quantize.exported``).
        example_inputs: the positional inputs of one forward (a tuple), or inputs by name;
            the prepared model takes exactly these (parameters left out keep their defaults).
        config: what to quantize and how; ``QuantConfig()`` (static, x86) by default.

    Raises:
        QuantizeError: the model is in training mode, does not trace, or does not run on
            ``example_inputs``; the message says which and what to do.

    >>> import torch
    >>> from fxloom.quantize import prepare
    >>> linear = torch.nn.Linear
    >>> model = torch.nn.Sequential(linear(4, 4), torch.nn.ReLU(), linear(4, 2)).eval()
    >>> prepared = prepare(model, (torch.randn(2, 4),))
    >>> print(prepared.code.strip())
    def forward(self, input):
        input_1 = input
        check_tensor_input(input_1, torch.float32, 2, 'input')
        input_1_observer = self.input_1_observer(input_1);  input_1 = None
        _0 = getattr(self, "0")(input_1_observer);  input_1_observer = None
        _1 = getattr(self, "1")(_0);  _0 = None
        _1_observer = self._1_observer(_1);  _1 = None
        _2 = getattr(self, "2")(_1_observer);  _1_observer = None
        _2_observer = self._2_observer(_2);  _2 = None
        return _2_observer
    """
    config = QuantConfig() if config is None else config
    if not isinstance(model, (torch.nn.Module, ExportedProgram)):
        raise TypeError(f"prepare() takes an nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.nn.Module) and model.training:
        raise QuantizeError(
            f"prepare() quantizes for inference, but the model ({type(model).__name__}) is in "
            "training mode; call .eval() on it first"
        )
    inputs = example_inputs if isinstance(example_inputs, dict) else tuple(example_inputs)
    gm = _module_to_quantize(model, inputs)
    gm = fuse(gm)  # a copy: the caller's model and GraphModule stay as they were
    _propagate_shapes(gm, inputs)
    quantization_plan = plan(gm, config)
    _insert_observers(gm, quantization_plan)
    gm.meta["quantize"] = quantization_plan
    return gm


def _module_to_quantize(
    model: torch.nn.Module | ExportedProgram, inputs: tuple | dict
) -> GraphModule:
    """The GraphModule to quantize; an exported program's weighted operators become layers."""
    if isinstance(model, ExportedProgram):  # its operator-level graph
        return lift_layers(module_to_transform(model, consumer="prepare()")).eval()
    try:
        return module_to_transform(model, inputs, consumer="prepare()")
    except Exception as err:
        raise QuantizeError(
            f"prepare() could not trace {type(model).__name__} with fxloom.symbolic_trace: "
            f"{type(err).__name__}: {err}\nQuantization works on the traced graph: trace the "
            "model yourself and pass the GraphModule to prepare(), with "
            "fxloom.symbolic_trace(model, autoleaf=True) (an untraceable submodule stays one "
            "module, run in float), concrete_args for flags, or a Tracer whose "
            "is_leaf_module keeps the culprit a module"
        ) from err


def _propagate_shapes(gm: GraphModule, inputs: tuple | dict) -> None:
    try:
        with torch.no_grad():
            if isinstance(inputs, dict):
                ShapeProp(gm).propagate(**inputs)
            else:
                ShapeProp(gm).propagate(*inputs)
    except Exception as err:
        raise QuantizeError(
            f"prepare() ran the example inputs through the traced model to find its float "
            f"tensors, and that failed: {type(err).__name__}: {err}\nPass example_inputs "
            "that the model's forward accepts (a tuple of positional inputs, or a dict by name)"
        ) from err


def _insert_observers(
    gm: GraphModule, plan: QuantPlan, wrap: Callable[[Observer], torch.nn.Module] | None = None
) -> None:
    """An observer after every observed value (``wrap(observer)`` in its place if given)."""
    graph = gm.graph
    engine, kernels = plan.config.engine, plan.config.kernels
    for node in list(graph.nodes):
        spec = plan.observed.get(node.name)
        if spec is None:
            continue
        name = attr_path.free_name(gm, f"{node.name}_observer")
        observer = spec.activation_observer(engine, kernels)
        gm.add_submodule(name, observer if wrap is None else wrap(observer))
        with graph.inserting_after(_after_its_guards(node)):
            observing = graph.call_module(name, (node,))
        node.replace_all_uses_with(observing, functools.partial(_reads_observed, observing))
        plan.observers[name] = node.name
    gm.recompile()


def _is_guard_node(node: Node) -> bool:
    return node.op == "call_function" and stays_on_host(node.target)


def _after_its_guards(node: Node) -> Node:
    """Where an observer of ``node`` goes: after the inputs and run-time checks that follow
    it (input guards come after every input), so the observed program checks first."""
    while node.next.op == "placeholder" or _is_guard_node(node.next):
        node = node.next
    return node


def _reads_observed(observing: Node, user: Node) -> bool:
    """Whether ``user`` reads the observer's output: guards keep checking the value itself."""
    return user is not observing and not _is_guard_node(user)
