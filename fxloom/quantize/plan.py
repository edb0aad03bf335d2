"""The quantization plan: for every node, int8 or float and why; where observers go.

``plan_static(gm, config)`` reads the graph (with ``meta["tensor_meta"]`` from a shape
propagation) and decides, node by node in graph order:

    int8      an operator of ``STATIC_OPS`` (config permitting): its tensor inputs are
              quantized, its output observed
    fused     a ReLU folded into the int8 operator before it (its only user)
    shared    an operator of ``SHARES_QPARAMS`` whose input is int8: it computes on int8
              (one whose input is float is planned float)
    float     no int8 kernel, one better in float (``KEPT_FLOAT``: averages), or the config
              leaves it in float
    identity  dropout and ``nn.Identity``: nothing in eval mode; convert erases them

and where an observer must watch a value: after every int8 operator (or its fused ReLU),
and on every float value an int8 operator reads (to quantize it there). An int8 layer with a
``FLOAT_IO`` twin whose input is float and whose users all read float returns float from one
kernel (``float_io``): its output is never rounded to int8, so it gets no observer.
``plan_dynamic`` picks the Linear/LSTM/GRU modules of ``DYNAMIC_MODULES`` instead, and needs
no observers.

Only nodes whose value is a float tensor get a decision (sizes, flags, masks do not).

Depends on: the IR, ``config``, ``table``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fxloom._format import describe_target
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.quantize.config import QuantConfig, QuantSpec
from fxloom.quantize.schemes import Kind
from fxloom.quantize.table import (
    DYNAMIC_MODULES,
    FLOAT_IO,
    FLOAT_IO_ENGINES,
    IDENTITY_IN_EVAL,
    KEPT_FLOAT,
    NOT_ON_PLAIN_INTEGERS,
    PLAIN_SHARES,
    RELU,
    SHARES_QPARAMS,
    STATIC_OPS,
    QuantizedFunction,
    QuantizedModule,
    is_table_key,
)

__all__ = ["Decision", "Kind", "QuantPlan", "plan", "plan_layers", "plan_static", "table_key"]

NO_PLAIN_OPERATOR = (
    "its table row names no fxloom operator (``plain``) for the plain kernels; "
    "QuantConfig(kernels='torch.ao') uses its torch.ao module"
)
PADS_OTHERWISE = (
    "it pads other than with zeros by numbers, which fxloom_q.conv2d_int8 does not "
    "(QuantConfig(kernels='torch.ao') pads reflect)"
)
NO_KERNEL = (
    "no int8 kernel for it in fxloom.quantize.table (add a row to STATIC_OPS or SHARES_QPARAMS)"
)


@dataclass
class Decision:
    """What happens to one node: ``kind``, a ``schemes.Kind``."""

    node: str
    calls: str  # what the node calls, for people: "encoder.0, a Linear", "torch.add"
    kind: Kind
    reason: str
    spec: QuantSpec | None = None


@dataclass
class QuantPlan:
    """The decisions of ``prepare``, kept in ``prepared.meta["quantize"]`` for ``convert``."""

    config: QuantConfig
    decisions: dict[str, Decision] = field(default_factory=dict)  # node name -> decision
    fused_relu: dict[str, str] = field(default_factory=dict)  # int8 op -> its ReLU
    observed: dict[str, QuantSpec] = field(default_factory=dict)  # value node -> spec
    observers: dict[str, str] = field(default_factory=dict)  # observer module -> value node
    float_io: set[str] = field(default_factory=set)  # int8 layers with float input and output


def table_key(node: Node, gm: GraphModule) -> Any:
    """What the tables are looked up with: a module's class, the function, or the method name
    (the tables find an operator's row from any of its spellings: ``fxloom.ops.identity``).

    A layer for quantization-aware training stands for the float class it was made from
    (its ``float_class``: ``qat_modules``).
    """
    if node.op == "call_module":
        cls = type(gm.get_submodule(node.target))
        return getattr(cls, "float_class", cls)
    return node.target


def plan_static(gm: GraphModule, config: QuantConfig) -> QuantPlan:
    plan = QuantPlan(config)
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_function", "call_method") and _float_tensor(node):
            plan.decisions[node.name] = _decide_static(node, gm, config)
    _fuse_relus(gm, plan)
    _place_observers(gm, plan)
    return plan


def plan(gm: GraphModule, config: QuantConfig) -> QuantPlan:
    """The plan of ``config.scheme``: every operator decided (``plans="graph"``), or only its
    layers (``plans="layers"``: dynamic and weight-only)."""
    return PLANNERS[config.scheme.plans](gm, config)


# A layer class -> why the plain kernels leave it in float for a layer-by-layer scheme (their
# one layer is the linear one; kernels="torch.ao" has dynamic LSTM/GRU modules).
_NO_PLAIN_LAYER = "no plain-tensor kernel for it (QuantConfig(kernels='torch.ao') has one)"


def plan_layers(gm: GraphModule, config: QuantConfig) -> QuantPlan:
    scheme = config.scheme
    plan = QuantPlan(config)
    for node in gm.graph.find_nodes(op="call_module"):
        key = table_key(node, gm)
        if key not in scheme.layers:
            continue
        spec, source = _choose(node, gm, config)
        calls = describe_target(node)
        why_not = _layer_refusal(gm.get_submodule(node.target), config)
        if spec is None:
            decision = Decision(node.name, calls, Kind.FLOAT, _float_by(source))
        elif why_not:
            decision = Decision(node.name, calls, Kind.FLOAT, why_not)
        else:
            decision = Decision(node.name, calls, scheme.layer_kind, scheme.why, spec)
        plan.decisions[node.name] = decision
    return plan


def _layer_refusal(module: torch.nn.Module, config: QuantConfig) -> str:
    """Why a layer of the scheme stays float with these kernels ("" if it does not)."""
    if config.kernels == "torch.ao":
        return (
            ""
            if type(module) in DYNAMIC_MODULES and config.scheme.layer_kind == Kind.DYNAMIC
            else (
                "kernels='torch.ao' has dynamic int8 layers only (weight-only needs the plain kernels)"
            )
        )
    if not isinstance(module, torch.nn.Linear):
        return _NO_PLAIN_LAYER
    group = config.scheme.group_size
    if group is not None and module.in_features % group:
        return f"its {module.in_features} inputs are not a multiple of the group size {group}"
    return ""


plan_dynamic = plan_layers  # the earlier name


def _decide_static(node: Node, gm: GraphModule, config: QuantConfig) -> Decision:
    key = table_key(node, gm)
    calls = describe_target(node)
    if isinstance(key, type) and key in IDENTITY_IN_EVAL:
        return Decision(node.name, calls, Kind.IDENTITY, "returns its input in eval mode")
    spec, source = _choose(node, gm, config)
    entry = STATIC_OPS.get(key) if is_table_key(key) else None
    if spec is None:
        return Decision(node.name, calls, Kind.FLOAT, _float_by(source))
    ao = config.kernels == "torch.ao"
    if entry is not None and not ao and not entry.plain:
        return Decision(node.name, calls, Kind.FLOAT, NO_PLAIN_OPERATOR)
    if isinstance(entry, QuantizedModule) and not ao and _pads_otherwise(node, gm):
        return Decision(node.name, calls, Kind.FLOAT, PADS_OTHERWISE)
    if isinstance(entry, QuantizedModule):
        kernel = entry.kernel if ao else f"fxloom_q.{entry.plain}"
        return Decision(node.name, calls, Kind.INT8, kernel, spec)
    if isinstance(entry, QuantizedFunction) and node.op == "call_function":
        # (a method call, ``x.add(y)``, would need its node rewritten into a function call)
        if len(_tensor_inputs(node)) == 2 and not node.kwargs:
            kernel = _kernel_name(entry.kernel) if ao else f"fxloom_q.{entry.plain}"
            return Decision(node.name, calls, Kind.INT8, kernel, spec)
        return Decision(
            node.name, calls, Kind.FLOAT, "its int8 kernel takes two tensors, no scalar"
        )
    if is_table_key(key) and key in KEPT_FLOAT:
        return Decision(node.name, calls, Kind.FLOAT, KEPT_FLOAT[key])
    if not ao and is_table_key(key) and key in SHARES_QPARAMS and key not in PLAIN_SHARES:
        return Decision(node.name, calls, Kind.FLOAT, NOT_ON_PLAIN_INTEGERS)
    if is_table_key(key) and key in SHARES_QPARAMS:
        return Decision(
            node.name, calls, Kind.SHARED, "computes on int8 with its input's scale", spec
        )
    return Decision(node.name, calls, Kind.FLOAT, NO_KERNEL)


def _pads_otherwise(node: Node, gm: GraphModule) -> bool:
    """A convolution whose padding the plain int8 convolution cannot do (``padding_mode``
    other than zeros, or ``padding="same"``)."""
    module = gm.get_submodule(node.target) if node.op == "call_module" else None
    mode = getattr(module, "padding_mode", "zeros")
    return mode != "zeros" or isinstance(getattr(module, "padding", 0), str)


def _fuse_relus(gm: GraphModule, plan: QuantPlan) -> None:
    """An int8 operator whose only user is a ReLU computes both (``LinearReLU``, ``add_relu``)."""
    for node in gm.graph.nodes:
        decision = plan.decisions.get(node.name)
        if decision is None or decision.kind != Kind.INT8 or len(node.users) != 1:
            continue
        if not STATIC_OPS[table_key(node, gm)].fuses_relu:
            continue
        (user,) = node.users
        user_decision = plan.decisions.get(user.name)
        if user_decision is None or user_decision.kind != Kind.SHARED:
            continue
        if table_key(user, gm) in RELU and user.args[:1] == (node,) and not _inplace(user):
            plan.fused_relu[node.name] = user.name
            user_decision.kind = Kind.FUSED
            user_decision.reason = f"fused into %{node.name}"


def _place_observers(gm: GraphModule, plan: QuantPlan) -> None:
    """Walk the graph tracking which values will be int8; note the values to observe."""
    int8: set[str] = set()
    for node in gm.graph.nodes:
        decision = plan.decisions.get(node.name)
        if decision is None or decision.kind == Kind.FUSED:
            continue
        if decision.kind == Kind.INT8:
            for value in _tensor_inputs(node):
                if value.name not in int8:
                    plan.observed.setdefault(value.name, decision.spec)
            if _float_in_and_out(node, gm, plan, int8):
                plan.float_io.add(node.name)
                decision.reason += ", float in/out (one int8 kernel)"
                continue
            produced = plan.fused_relu.get(node.name, node.name)
            int8.update({node.name, produced})
            plan.observed[produced] = decision.spec
        elif decision.kind in (Kind.SHARED, Kind.IDENTITY):
            first = node.args[0] if node.args else None
            if isinstance(first, Node) and first.name in int8:
                int8.add(node.name)
            elif decision.kind == Kind.SHARED:
                decision.kind = Kind.FLOAT
                decision.reason = "its input is float (on int8 it would keep its input's scale)"


def _float_in_and_out(node: Node, gm: GraphModule, plan: QuantPlan, int8: set[str]) -> bool:
    """A ``FLOAT_IO`` layer reading a float value, whose output (or fused ReLU's) is read in
    float only: by float operators or as the graph's output."""
    io = FLOAT_IO.get(table_key(node, gm)) if node.op == "call_module" else None
    if (
        io is None
        or (plan.config.kernels == "torch.ao" and plan.config.engine not in FLOAT_IO_ENGINES)
        or not io.fits(gm.get_submodule(node.target))
    ):
        return False
    if len(node.args) != 1 or node.kwargs:
        return False
    (value,) = node.args
    if not isinstance(value, Node) or value.name in int8:
        return False
    output = next(iter(node.users)) if node.name in plan.fused_relu else node
    readers = [plan.decisions.get(user.name) for user in output.users]
    return all(reader is None or reader.kind == Kind.FLOAT for reader in readers)


def _choose(node: Node, gm: GraphModule, config: QuantConfig) -> tuple[QuantSpec | None, str]:
    stack = node.meta.get("nn_module_stack") or {}
    paths = [path for path, _ in stack.values()]
    types = [cls for _, cls in stack.values() if isinstance(cls, type)]
    if node.op == "call_module" and node.target not in paths:
        paths.append(node.target)
        types.append(type(gm.get_submodule(node.target)))
    operator = None if node.op == "call_module" else node.target
    return config.choose(paths, types, operator)


def _float_by(source: str) -> str:
    return f"the config leaves it in float ({source})"


def _float_tensor(node: Node) -> bool:
    meta = node.meta.get("tensor_meta")
    dtype = getattr(meta, "dtype", None)
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point


def _tensor_inputs(node: Node) -> list[Node]:
    return [arg for arg in node.args if isinstance(arg, Node) and _float_tensor(arg)]


def _inplace(node: Node) -> bool:
    return bool(node.kwargs.get("inplace")) or (len(node.args) > 1 and node.args[1] is True)


def _kernel_name(kernel: Any) -> str:
    return getattr(kernel, "_qualified_op_name", getattr(kernel, "__name__", repr(kernel)))


PLANNERS = {"graph": plan_static, "layers": plan_layers}  # QuantScheme.plans -> its planner
