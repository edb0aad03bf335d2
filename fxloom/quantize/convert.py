"""``convert``: the calibrated model with integer weights and int8 kernels.

Two sets of kernels (``QuantConfig(kernels=...)``):

* ``"plain"`` (the default): fxloom's operators on plain tensors (``quantize.ops``,
  ``torch.ops.fxloom_q``): weights become ``int8`` buffers with float32 scales per output
  channel (int4 weights packed two per byte, with a scale and integer zero point per group),
  activations ``uint8`` with a scale and zero point given as numbers; the graph and the file
  hold no quantized dtype and no packed object, and ``kernels`` picks the fast kernel per
  call on the CPU that runs it;
* ``"torch.ao"``: torch's quantized tensors and modules (``torch.ao.nn.quantized``,
  deprecated), kept for one release so both paths can be measured side by side.

Static schemes (``QuantScheme.calibrates``), node by node in graph order (on a copy of the
prepared model):

* an observer of a float value becomes a quantize (``ops.quantize``; torch.ao:
  ``torch.quantize_per_tensor(value, scale, zero_point, torch.quint8)``), the border into an
  int8 region; an observer of an int8 operator's output goes, its scale and zero point given
  to the operator;
* an int8 layer becomes its operator (``linear_int8``, ``conv2d_int8``) reading its integer
  weight, or (torch.ao) is swapped for the quantized module of ``table.STATIC_OPS``; a
  function becomes its int8 kernel (``add_int8``) with the output scale and zero point; a
  fused ReLU is erased;
* an operator that reads an int8 value but has no int8 kernel gets a dequantize (one per
  value, shared by its float users), as does the output;
* dropout and ``nn.Identity`` are erased (nothing in eval mode); a ReLU left on int8 clamps
  at the zero point;
* a layer the plan gives float input and output (``plan.float_io``) reads the float value
  itself and returns float: one kernel quantizing its input;
* (plain kernels) an int8 operator whose only user is an int8 sum of its shape is fused
  with it into the operator of ``table.FUSED_SUMS`` (``conv2d_int8`` -> ``add_int8``:
  ``conv2d_add_int8``, the sum rounded once); the report says so on both nodes.

An int8 operator whose input or output held inf or nan during calibration (an attention
mask), and an int8 sum (``table.SUMS``) with a varying operand that spans less than one int8
step of the sum (scores plus a finite mask of -1e9 or float32's lowest value: the sum would
lose the scores), are converted in float instead, and the report says why.

No ``dequantize -> quantize`` pair is ever left: an int8 value flows as it is from one int8
operator to the next (through dropout, pooling, reshapes, ReLU), and a float user of a value
that was quantized from float reads the float value itself, never a dequantized copy.

Layer schemes (dynamic, w8, w4) swap each planned Linear for ``linear_int8`` (activations
quantized at run time, per tensor or per token as the scheme's ``activations`` says),
``linear_w8`` or ``linear_w4``; torch.ao: for its ``table.DYNAMIC_MODULES`` twin (Linear,
LSTM, GRU).

node.meta: swapped nodes keep theirs (``tensor_meta`` still describes the float value);
new quantize/dequantize nodes have none. ``converted.meta["quantize_report"]`` holds the
``QuantReport``, each quantized layer's reason naming its kernel on this CPU. torch.ao
weights are packed for the config's engine, which is made current
(``torch.backends.quantized.engine``) while converting and left as the user set it after.

Depends on: the IR, ``plan``, ``table``, ``report``, ``ops``, ``weights``, ``kernels``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from collections.abc import Iterator

import torch

from fxloom import attr_path
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.quantize import kernels, layouts, ops, weights
from fxloom.quantize.errors import QuantizeError
from fxloom.quantize.plan import QuantPlan, table_key
from fxloom.quantize.report import QuantReport
from fxloom.quantize.schemes import Kind
from fxloom.quantize.table import (
    DYNAMIC_MODULES,
    FLOAT_IO,
    FUSED_SUMS,
    RELU,
    STATIC_OPS,
    SUMS,
    FusedSum,
    QuantizedModule,
    is_table_key,
    quantize_weight,
)

__all__ = ["convert", "quantized_engine"]

QParams = tuple[float, int]


def convert(prepared: GraphModule) -> GraphModule:
    """The int8 model of a prepared (and, in static mode, calibrated) model.

    ``prepared`` is left as it was. See the module docstring for what changes.

    Raises:
        QuantizeError: ``prepared`` does not come from ``prepare()``, or an observer has seen
            no data (calibrate first); nothing is converted.

    >>> import torch
    >>> from fxloom.quantize import prepare, convert
    >>> linear = torch.nn.Linear
    >>> model = torch.nn.Sequential(linear(4, 4), torch.nn.ReLU(), linear(4, 2)).eval()
    >>> prepared = prepare(model, (torch.randn(2, 4),))
    >>> _ = prepared(torch.randn(8, 4))                      # calibration
    >>> print(convert(prepared).code.strip())
    def forward(self, input):
        input_1 = input
        check_tensor_input(input_1, torch.float32, 2, 'input')
        input_1_q = quantize(input_1, 0.0..., ..., 0, 255, torch.uint8);  input_1 = None
        weight_0 = self.weight_0
        scale_0 = self.scale_0
        bias_0 = self.bias_0
        _0 = linear_int8(input_1_q, 0.0..., ..., weight_0, scale_0, bias_0, 0.0..., 0, True, False);  input_1_q = weight_0 = scale_0 = bias_0 = None
        weight_2 = self.weight_2
        scale_2 = self.scale_2
        bias_2 = self.bias_2
        _2 = linear_int8(_0, 0.0..., 0, weight_2, scale_2, bias_2, 0.0..., ..., False, False);  _0 = weight_2 = scale_2 = bias_2 = None
        _2_float = dequantize(_2, 0.0..., ..., 0, 255, torch.uint8);  _2 = None
        return _2_float

    (``_0`` computes the ReLU too, the ``True`` before its last argument; a layer between float
    neighbours would read ``input_1`` and return float itself, with neither quantize nor
    dequantize around it. ``QuantConfig(kernels="torch.ao")`` gives torch's ``LinearReLU``.)
    """
    # The int8 weights and scales are made as ordinary tensors even inside
    # torch.inference_mode(): the kernel table keys their packed forms on tensor versions,
    # which inference tensors do not have (running the result inside the mode is fine).
    with torch.inference_mode(False):
        return _converted(prepared)


def _converted(prepared: GraphModule) -> GraphModule:
    plan = _plan_of(prepared)
    config = plan.config
    if config.scheme.calibrates:
        _check_calibrated(prepared, plan)
        plan = _without_lossy_int8(prepared, plan)
    gm = _copy_for_conversion(prepared, plan)
    del gm.meta["quantize"]
    ao = config.kernels == "torch.ao"
    fused: dict[str, str] = {}
    with quantized_engine(config.engine) if ao else contextlib.nullcontext():
        if config.scheme.calibrates:
            conversion = (_StaticConversion if ao else _PlainStaticConversion)(gm, plan)
            conversion.run()
            if not ao:
                fused = _fuse_sums(gm)
                # int8 convolutions return channels-last: contiguous where it matters
                layouts.keep_channels_last(gm)
        else:
            (_convert_dynamic if ao else _convert_layers)(gm, plan)
    notes = {} if ao else _kernel_notes(gm, plan, fused)
    gm.graph.lint()
    gm.delete_all_unused_submodules()  # the observers, and the float layers swapped out
    gm.recompile()
    gm.meta["quantize_report"] = QuantReport.of(plan, notes)
    return gm


def _copy_for_conversion(prepared: GraphModule, plan: QuantPlan) -> GraphModule:
    """A copy of ``prepared`` that shares the modules convert replaces or removes.

    Those are only read (their weights quantized) and never installed in the copy, whose
    containers are new objects: copying their float weights would be wasted time and memory.
    """
    memo: dict[int, object] = {}
    replaced = [name for name, row in plan.decisions.items() if Kind(row.kind).quantized]
    targets = {node.name: node.target for node in prepared.graph.find_nodes(op="call_module")}
    for name in [*plan.observers, *(targets[n] for n in replaced if n in targets)]:
        module = prepared.get_submodule(name)
        memo[id(module)] = module
    return copy.deepcopy(prepared, memo)


@contextlib.contextmanager
def quantized_engine(engine: str) -> Iterator[None]:
    """Make ``engine`` torch's current quantized engine inside the block."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


def _plan_of(prepared: GraphModule) -> QuantPlan:
    plan = getattr(prepared, "meta", {}).get("quantize")
    if not isinstance(plan, QuantPlan):
        raise QuantizeError(
            f"convert() takes the model fxloom.quantize.prepare() returned, but this "
            f"{type(prepared).__name__} has no quantization plan (meta['quantize']); "
            "call prepare(model, example_inputs) first"
        )
    return plan


def _check_calibrated(prepared: GraphModule, plan: QuantPlan) -> None:
    idle = [name for name in plan.observers if not prepared.get_submodule(name).seen]
    if not idle:
        return
    culprits = [_observed_value(plan, name) for name in idle[:3]]
    more = f" (and {len(idle) - 3} more)" if len(idle) > 3 else ""
    raise QuantizeError(
        f"convert() needs the scale and zero point of every observed value, but the "
        f"observers of {', '.join(culprits)}{more} have seen no data. Calibrate first: "
        "fxloom.quantize.calibrate(prepared, batches), or call prepared(...) on "
        "representative inputs (every branch you will run); nothing was converted"
    )


def _without_lossy_int8(prepared: GraphModule, plan: QuantPlan) -> QuantPlan:
    """The plan with the int8 operators calibration shows int8 would ruin moved to float:
    those that read or make inf/nan, and sums that would lose an operand (``table.SUMS``)."""
    demoted = {**_nonfinite(prepared, plan), **_lost_operands(prepared, plan)}
    if not demoted:
        return plan
    decisions = dict(plan.decisions)
    fused_relu = dict(plan.fused_relu)
    for name, why in demoted.items():
        decisions[name] = dataclasses.replace(decisions[name], kind=Kind.FLOAT, reason=why)
        relu = fused_relu.pop(name, None)
        if relu is not None:
            why_float = f"its input %{name} is float"
            decisions[relu] = dataclasses.replace(
                decisions[relu], kind=Kind.FLOAT, reason=why_float
            )
    return dataclasses.replace(plan, decisions=decisions, fused_relu=fused_relu)


def _nonfinite(prepared: GraphModule, plan: QuantPlan) -> dict[str, str]:
    """int8 operator -> why: those that read or make inf or nan in calibration."""
    demoted: dict[str, str] = {}
    for node in prepared.graph.find_nodes(op="call_module"):
        if node.target not in plan.observers or not prepared.get_submodule(node.target).nonfinite:
            continue
        value = node.args[0]
        why = f"%{value.name} holds inf or nan in calibration, which int8 cannot represent"
        producer = _int8_producer(plan, value.name)
        for name in [user.name for user in node.users] + [producer]:
            decision = plan.decisions.get(name)
            if decision is not None and decision.kind == Kind.INT8:
                demoted.setdefault(name, why)
    return demoted


def _lost_operands(prepared: GraphModule, plan: QuantPlan) -> dict[str, str]:
    """int8 sum -> why: those with an operand spanning less than one int8 step of the sum."""
    observer_of = {value: name for name, value in plan.observers.items()}
    demoted: dict[str, str] = {}
    for node in prepared.graph.nodes:
        decision = plan.decisions.get(node.name)
        if decision is None or decision.kind != Kind.INT8:
            continue
        key = table_key(node, prepared)
        if not (is_table_key(key) and key in SUMS):
            continue
        output = observer_of.get(plan.fused_relu.get(node.name, node.name))
        if output is None:
            continue
        step = float(_watcher(prepared, output).qparams()[0].max())
        for operand in node.all_input_nodes:
            # In the prepared graph an operand is read through its observer's call.
            watched = operand.op == "call_module" and operand.target in plan.observers
            observer = operand.target if watched else observer_of.get(operand.name)
            if observer is None:
                continue
            watcher = _watcher(prepared, observer)
            low, high = watcher.value_range()
            span = float((high - low).max())
            # A constant operand (span 0) loses nothing: the sum's range holds its offset.
            if watcher.eps < span < step:
                demoted[node.name] = (
                    f"%{plan.observers[observer]} spans {span:.3g}, less than one int8 step "
                    f"({step:.3g}) of the sum, which would lose it (a mask-sized other operand)"
                )
                break
    return demoted


def _watcher(prepared: GraphModule, name: str) -> torch.nn.Module:
    """The observer called ``name``, or the one a fake quantizer (QAT) keeps."""
    module = prepared.get_submodule(name)
    return getattr(module, "observer", module)


def _int8_producer(plan: QuantPlan, value: str) -> str:
    """The int8 operator whose output ``value`` is (its fused ReLU's output counts), or ``value``."""
    for op, relu in plan.fused_relu.items():
        if relu == value:
            return op
    return value


def _observed_value(plan: QuantPlan, observer: str) -> str:
    value = plan.observers[observer]
    decision = plan.decisions.get(value)
    return f"%{value} ({decision.calls})" if decision else f"%{value}"


class _StaticConversion:
    """One static conversion of ``gm`` (a copy of the prepared model), in graph order, to
    torch's quantized tensors and modules (``kernels="torch.ao"``)."""

    quantize = torch.quantize_per_tensor  # what quantizes a float value at an int8 border

    def __init__(self, gm: GraphModule, plan: QuantPlan) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.plan = plan
        self.engine = plan.config.engine
        self.qparams: dict[Node, QParams] = {}  # int8 values -> (scale, zero_point)
        self.dequantized: dict[Node, Node] = {}
        self.erased: set[Node] = set()
        self.observer_of = {value: name for name, value in plan.observers.items()}
        self.by_name = {node.name: node for node in self.graph.nodes}

    def run(self) -> None:
        for node in list(self.graph.nodes):
            if node in self.erased:
                continue
            if node.op == "call_module" and node.target in self.plan.observers:
                self._observer(node)
                continue
            decision = self.plan.decisions.get(node.name)
            kind = decision.kind if decision else None
            if kind == Kind.IDENTITY and node.args and isinstance(node.args[0], Node):
                self._erase(node, node.args[0])
            elif kind == Kind.INT8:
                self._int8(node)
            elif not self._stays_int8(node, kind):
                self._dequantize_inputs(node)
        for quantize in self.graph.find_nodes(op="call_function", target=self.quantize):
            if not quantize.users:  # its float users read the float value itself
                self.graph.erase_node(quantize)

    def _observer(self, node: Node) -> None:
        value = node.args[0]
        if value in self.qparams:  # the operator before emits int8 with these parameters
            self._erase(node, value)
            return
        scale, zero_point = self._params(node.target)
        with self.graph.inserting_before(node):
            quantize = self.graph.call_function(
                torch.quantize_per_tensor, (value, scale, zero_point, torch.quint8)
            )
        self._erase(node, quantize)
        self.qparams[quantize] = (scale, zero_point)

    def _int8(self, node: Node) -> None:
        relu_name = self.plan.fused_relu.get(node.name)
        relu = self.by_name[relu_name] if relu_name else None
        entry = STATIC_OPS[table_key(node, self.gm)]
        if node.name in self.plan.float_io:
            self._swap_float_io(node, entry, relu is not None)
        elif isinstance(entry, QuantizedModule):
            params = self._params(self.observer_of[(relu or node).name])
            int8 = self._int8_module(node, entry, relu is not None)
            int8.scale, int8.zero_point = params
            self.gm.add_submodule(node.target, int8)
            self.qparams[node] = params
        else:
            params = self._params(self.observer_of[(relu or node).name])
            node.target = entry.relu_kernel if relu is not None else entry.kernel
            node.args = (*node.args[:2], *params)
            self.qparams[node] = params
        if relu is not None:
            self._erase(relu, node)

    def _int8_module(self, node: Node, entry: QuantizedModule, relu: bool) -> torch.nn.Module:
        module = self.gm.get_submodule(node.target)
        spec = self.plan.decisions[node.name].spec
        observer = spec.weight_observer(self.engine, entry.weight_axis, kernels="torch.ao")
        return entry.make(module, quantize_weight(module.weight, observer), relu)

    def _swap_float_io(self, node: Node, entry: QuantizedModule, relu: bool) -> None:
        """The layer's float-in/out twin, reading the value its input was quantized from."""
        (source,) = node.args  # quantize_per_tensor(x, scale, zero_point, quint8)
        x, scale, zero_point, _ = source.args
        io = FLOAT_IO[table_key(node, self.gm)]
        twin = (io.relu if relu else io.plain)(
            self._int8_module(node, entry, relu), scale, zero_point
        )
        self.gm.add_submodule(node.target, twin)
        node.args = (x,)  # the quantize goes at the end of run() if nothing else reads it

    def _stays_int8(self, node: Node, kind: str | None) -> bool:
        """A node that computes on its int8 input as it is (and passes the parameters on)."""
        if kind not in (Kind.SHARED, None) or node.op in ("placeholder", "get_attr", "output"):
            return False
        first = node.args[0] if node.args else None
        if kind is None:  # not a float tensor: sizes and shapes may be read off int8 values
            return node.op == "call_method" and node.target in ("size", "dim")
        if first in self.qparams:
            self.qparams[node] = self.qparams[first]
            return True
        return False

    def _dequantize_inputs(self, node: Node) -> None:
        for value in node.all_input_nodes:
            if value in self.qparams:
                node.replace_input_with(value, self._dequantized(value))

    def _dequantized(self, value: Node) -> Node:
        if value.target is torch.quantize_per_tensor:  # the float value itself is at hand
            return value.args[0]
        if value not in self.dequantized:
            with self.graph.inserting_after(value):
                self.dequantized[value] = self.graph.call_method("dequantize", (value,))
        return self.dequantized[value]

    def _params(self, observer_name: str) -> QParams:
        scale, zero_point = self.gm.get_submodule(observer_name).qparams()
        return float(scale), int(zero_point)

    def _erase(self, node: Node, replacement: Node) -> None:
        node.replace_all_uses_with(replacement)
        self.graph.erase_node(node)
        self.erased.add(node)


def _convert_dynamic(gm: GraphModule, plan: QuantPlan) -> None:
    engine = plan.config.engine
    for node in gm.graph.find_nodes(op="call_module"):
        decision = plan.decisions.get(node.name)
        if decision is None or decision.kind != Kind.DYNAMIC:
            continue
        module = gm.get_submodule(node.target)
        make = DYNAMIC_MODULES[type(module)]
        weight_observer = functools.partial(
            decision.spec.weight_observer, engine, kernels=plan.config.kernels
        )
        gm.add_submodule(node.target, make(module, weight_observer))


# ---------------------------------------------------------------- plain tensors
class _PlainStaticConversion(_StaticConversion):
    """The static conversion to fxloom's operators on plain tensors (``quantize.ops``): uint8
    activations, int8 weights with a scale per output channel, held as buffers of ``gm``."""

    quantize = staticmethod(ops.quantize)

    def _observer(self, node: Node) -> None:
        value = node.args[0]
        if value in self.qparams:
            self._erase(node, value)
            return
        scale, zero_point = self._params(node.target)
        args = (value, scale, zero_point, *ops.ACTIVATION_RANGE, torch.uint8)
        with self.graph.inserting_before(node):
            # named for the value, never "quantize": the function's name in the generated
            # code must not depend on which nodes were made and erased (a loaded copy has not)
            quantize = self.graph.create_node(
                "call_function", ops.quantize, args, name=f"{value.name}_q"
            )
        self._erase(node, quantize)
        self.qparams[quantize] = (scale, zero_point)

    def _int8(self, node: Node) -> None:
        relu_name = self.plan.fused_relu.get(node.name)
        relu = self.by_name[relu_name] if relu_name else None
        entry = STATIC_OPS[table_key(node, self.gm)]
        float_out = node.name in self.plan.float_io
        out = (0.0, 0) if float_out else self._params(self.observer_of[(relu or node).name])
        if isinstance(entry, QuantizedModule):
            self._layer(node, entry, out, relu is not None, float_out)
        else:
            (a, b), params = node.args[:2], [self.qparams[value] for value in node.args[:2]]
            node.target = getattr(ops, entry.plain)
            node.args = (a, *params[0], b, *params[1], *out, relu is not None)
        if not float_out:
            self.qparams[node] = out
        if relu is not None:
            self._erase(relu, node)

    def _layer(self, node, entry, out, relu: bool, float_out: bool) -> None:
        module = self.gm.get_submodule(node.target)
        spec = self.plan.decisions[node.name].spec
        observer = spec.weight_observer(self.engine, entry.weight_axis)
        weight, scale = weights.int8_per_channel(module.weight, observer)
        (value,) = node.args
        x_params = self.qparams[value]
        if float_out:  # reads the float value its input's quantize was made from
            value = value.args[0]  # (the quantize goes at the end of run() if unread)
        with self.graph.inserting_before(node):
            held = _hold(self.gm, node.target, weight=weight, scale=scale, bias=_bias(module))
        args = (value, *x_params, held["weight"], held["scale"], held["bias"])
        if entry.plain == "conv2d_int8":
            args = (*args, *_conv_geometry(module))
            node.args = (*args, *out, relu)
        else:
            node.args = (*args, *out, relu, False)
        node.op, node.target = "call_function", getattr(ops, entry.plain)

    def _stays_int8(self, node: Node, kind: Kind | None) -> bool:
        stays = super()._stays_int8(node, kind)
        if stays and kind == Kind.SHARED and table_key(node, self.gm) in RELU:
            self._relu_on_integers(node)
        return stays

    def _relu_on_integers(self, node: Node) -> None:
        """ReLU of an affine uint8 value: the integers below its zero point become it."""
        first = node.args[0]
        _, zero_point = self.qparams[first]
        with self.graph.inserting_before(node):
            clamped = self.graph.call_function(torch.clamp_min, (first, zero_point))
        self.qparams[clamped] = self.qparams.pop(node)
        self._erase(node, clamped)

    def _dequantized(self, value: Node) -> Node:
        if value.target is ops.quantize:  # the float value itself is at hand
            return value.args[0]
        if value not in self.dequantized:
            scale, zero_point = self.qparams[value]
            args = (value, scale, zero_point, *ops.ACTIVATION_RANGE, torch.uint8)
            with self.graph.inserting_after(value):
                self.dequantized[value] = self.graph.create_node(
                    "call_function", ops.dequantize, args, name=f"{value.name}_float"
                )
        return self.dequantized[value]


def _bias(module: torch.nn.Module) -> torch.Tensor | None:
    return None if module.bias is None else module.bias.detach().float().clone()


def _conv_geometry(module: torch.nn.Module) -> tuple:
    if module.padding_mode != "zeros" or isinstance(module.padding, str):
        raise QuantizeError(
            f"{type(module).__name__}(padding={module.padding!r}, padding_mode="
            f"{module.padding_mode!r}): the plain int8 convolution pads with zeros by numbers; "
            "use QuantConfig(kernels='torch.ao') or leave this layer in float "
            "(config.set_module_type(type, None))"
        )
    return (list(module.stride), list(module.padding), list(module.dilation), module.groups)


def _hold(gm: GraphModule, target: str, **tensors: torch.Tensor | None) -> dict[str, Node | None]:
    """``tensors`` as buffers of ``gm`` named after the layer they replace, read by get_attr."""
    held: dict[str, Node | None] = {}
    stem = target.replace(".", "_")
    for role, tensor in tensors.items():
        if tensor is None:
            held[role] = None
            continue
        name = attr_path.free_name(gm, f"{role}_{stem}")  # an identifier ("weight_0")
        gm.register_buffer(name, tensor)
        held[role] = gm.graph.get_attr(name)
    return held


def _convert_layers(gm: GraphModule, plan: QuantPlan) -> None:
    """Dynamic and weight-only schemes: each planned Linear becomes its fxloom operator."""
    scheme = plan.config.scheme
    for node in list(gm.graph.find_nodes(op="call_module")):
        decision = plan.decisions.get(node.name)
        if decision is None or not Kind(decision.kind).quantized:
            continue
        module = gm.get_submodule(node.target)
        observer = decision.spec.weight_observer(
            plan.config.engine, int8_activations=scheme.activations is not None
        )
        with gm.graph.inserting_before(node):
            target, args = LAYER_OPERATORS[scheme.weight_bits](gm, node, module, scheme, observer)
        node.op, node.target, node.args, node.kwargs = "call_function", target, args, {}


def _int8_layer(gm, node, module, scheme, observer):
    weight, scale = weights.int8_per_channel(module.weight, observer)
    held = _hold(gm, node.target, weight=weight, scale=scale, bias=_bias(module))
    (x,) = node.args
    if scheme.activations is None:  # weight-only
        return ops.linear_w8, (x, held["weight"], held["scale"], held["bias"])
    args = (x, 0.0, 0, held["weight"], held["scale"], held["bias"], 0.0, 0, False, True)
    return ops.linear_int8, (*args, scheme.activations)


def _int4_layer(gm, node, module, scheme, observer):
    packed, scale, zero_point = weights.int4_grouped(module.weight, scheme.group_size)
    held = _hold(
        gm, node.target, weight=packed, scale=scale, zero_point=zero_point, bias=_bias(module)
    )
    (x,) = node.args
    args = (x, held["weight"], held["scale"], held["zero_point"], scheme.group_size, held["bias"])
    return ops.linear_w4, args


LAYER_OPERATORS = {8: _int8_layer, 4: _int4_layer}  # QuantScheme.weight_bits -> its layer


def _fuse_sums(gm: GraphModule) -> dict[str, str]:
    """Each int8 sum whose operand is a ``table.FUSED_SUMS`` operator read by nothing else
    becomes the fused operator (in the sum's place: both operands exist there); node name ->
    what the report says of the fusion, for the sum and the operator it swallowed."""
    notes: dict[str, str] = {}
    for node in list(gm.graph.nodes):
        found = _fusable_operand(node)
        if found is None:
            continue
        producer, position, row = found
        other = 3 - position  # the sum's other operand, with its scale and zero point
        node.target = getattr(ops, row.fused)
        node.args = (
            *producer.args[: row.inputs], *node.args[other : other + 3], *node.args[6:9]
        )  # fmt: skip
        gm.graph.erase_node(producer)
        notes[node.name] = f"fused with %{producer.name} into fxloom_q.{row.fused} ({row.why})"
        notes[producer.name] = f"fused into %{node.name} (fxloom_q.{row.fused})"
    return notes


def _fusable_operand(node: Node) -> tuple[Node, int, FusedSum] | None:
    """(the operand, its position, the FUSED_SUMS row) that ``node``, an int8 sum, swallows."""
    if node.op != "call_function" or len(node.args) != 9:
        return None
    for position in (0, 3):
        producer = node.args[position]
        if not isinstance(producer, Node) or producer.op != "call_function":
            continue
        row = FUSED_SUMS.get(getattr(producer.target, "__name__", None))
        if row is None or node.target is not getattr(ops, row.sum):
            continue
        other = node.args[3 - position]
        alone = len(producer.users) == 1 and other is not producer
        if alone and not producer.args[row.relu_at] and _same_shapes(producer, node):
            return producer, position, row
    return None


def _same_shapes(*nodes: Node) -> bool:
    """Whether shape propagation gave every node one shape (unknown: not fused). The
    operator's output has the sum's shape: the other operand broadcasts to it, if at all
    (the fused operator broadcasts it as the sum does; its fast kernel wants one shape)."""
    shapes = {getattr(node.meta.get("tensor_meta"), "shape", None) for node in nodes}
    return len(shapes) == 1 and None not in shapes


def _kernel_notes(gm: GraphModule, plan: QuantPlan, fused: dict[str, str]) -> dict[str, str]:
    """Each quantized node's reason, with the kernel the table gives it on this CPU and why
    (and, for a fused pair, the fusion)."""
    notes = {
        name: f"{plan.decisions[name].reason}; {why}"
        for name, why in fused.items()
        if name in plan.decisions
    }
    for node in gm.graph.nodes:
        decision = plan.decisions.get(node.name)
        name = getattr(node.target, "__name__", None)
        if decision is None or node.op != "call_function" or name not in ops.OPERATORS:
            continue
        explained = kernels.explain(name, **_call_shape(gm, node, name))
        notes[node.name] = f"{notes.get(node.name, decision.reason)}; kernel: {explained}"
    return notes


def _call_shape(gm: GraphModule, node: Node, name: str) -> dict:
    """What the kernel table decides by, as the converted graph knows it (not the batch)."""
    if name == "linear_int8":
        w = gm.get_buffer(node.args[3].target)
        form = {"activations": node.args[10]} if len(node.args) > 10 else {}
        shape = {"n": w.shape[0], "k": w.shape[1], "reach": kernels.reach(w)}
        return {"dynamic": node.args[9], **shape, **form}
    if name in ("conv2d_int8", "conv2d_add_int8"):
        return {"reach": kernels.reach(gm.get_buffer(node.args[3].target))}
    if name in ("linear_w8", "linear_w4"):
        w = gm.get_buffer(node.args[1].target)
        k = w.shape[1] * (2 if name == "linear_w4" else 1)
        group = {"group": node.args[4]} if name == "linear_w4" else {}
        return {"n": w.shape[0], "k": k, **group}
    return {}
