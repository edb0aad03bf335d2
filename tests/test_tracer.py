"""``Tracer``, ``symbolic_trace`` and ``wrap``: turning modules and functions into graphs.

Organised by the documented behaviour: what ``trace`` returns, which modules are
leaves, the overridable hooks (``is_leaf_module``, ``call_module``, ``create_node``,
``create_proxy``, ``create_arg``, ``create_args_for_root``, ``path_of_module``),
``concrete_args``, autowrapping and ``wrap``, the metadata put on nodes, that tracing
leaves every patched object as it found it, the idioms of real models, the examples
of the torch.fx documentation and paper, and agreement with torch.fx itself.

Every traced module is run against eager PyTorch with ``assert_close``.

As in the documentation's ``normalize`` example, this module calls ``fx.wrap("len")``
at module scope, so ``len(proxy)`` in functions defined here is recorded; see
``tests/test_proxy.py`` for the default refusal.
"""

from __future__ import annotations

import collections
import inspect
import math
import operator
import re
import types
from math import sqrt
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn, zeros
from torch.testing import assert_close

import fxloom as fx
from fxloom.tracing.wrapped import wrap_library_function

fx.wrap("len")


@fx.wrap
def flip_if_negative(x):
    """Data-dependent control flow: cannot be traced through, but wrapped it is one call."""
    if x.sum() < 0:
        return -x
    return x


def double_if_positive(x):
    """Also untraceable; made a leaf with ``Tracer(autowrap_functions=...)``."""
    return x * 2 if x.sum() > 0 else x


SHIFT = torch.tensor([1.0, 2.0, 3.0, 4.0])  # a global tensor the traced code reads


# ------------------------------------------------------------------ helpers
def calls(graph: fx.Graph) -> list[tuple[str, Any]]:
    """``(op, target)`` of every call node, in program order."""
    return [(n.op, n.target) for n in graph.nodes if n.op.startswith("call_")]


def module_calls(graph: fx.Graph) -> list[str]:
    return [n.target for n in graph.nodes if n.op == "call_module"]


def line_of(marker: str) -> int:
    """The line number, in this file, of the source line tagged with ``marker``."""
    for lineno, line in enumerate(Path(__file__).read_text().splitlines(), start=1):
        if marker in line and "line_of(" not in line:
            return lineno
    raise AssertionError(f"no line tagged {marker!r}")


NUMERIC_SUFFIX = re.compile(r"\b([A-Za-z_]\w*?)_\d+\b")  # add_1 -> add


def normalized(code: str) -> list[str]:
    """Code lines without blank lines, whitespace, or numeric name suffixes.

    Names differ between torch.fx versions (``add_1`` in the docs, ``add`` now) and
    so does spacing in keyword arguments (``min = 0.0``); the program does not.
    """
    lines = []
    for line in code.strip().splitlines():
        if line.strip():
            words = "".join(line.split())
            lines.append(NUMERIC_SUFFIX.sub(r"\1", words))
    return lines


# ------------------------------------------------------------------ models
class ConvBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class SmallResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.layer1 = nn.Sequential(ConvBlock(8), ConvBlock(8))
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.layer1(self.stem(x))
        return self.fc(x.mean(dim=(2, 3)))


class Attention(nn.Module):
    """Causal self-attention written the way real models are: sizes read from the input."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (
            t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, dim))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Containers(nn.Module):
    """ModuleList used by index and in a loop, ModuleDict used by key."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.heads = nn.ModuleDict({"tanh": nn.Tanh(), "sigmoid": nn.Sigmoid()})

    def forward(self, x):
        x = self.layers[0](x)
        for layer in self.layers:
            x = layer(x)
        return self.heads["tanh"](x) + self.heads["sigmoid"](x)


class Inner(nn.Module):
    def forward(self, x):
        return torch.relu(x).sum(dim=-1)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.inner = Inner()

    def forward(self, x):
        return self.inner(self.lin(x))


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x) * 2


class Gated(nn.Module):
    def forward(self, x, use_relu: bool = False):
        if use_relu:
            return x.relu()
        return x.neg()


class WithParameter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.rand(4))

    def forward(self, x):
        return self.lin(x) * self.scale + self.scale + self.lin.weight[0]


# ============================================================ trace
def test_trace_of_a_module_returns_its_graph():
    model = SmallResNet().eval()
    graph = fx.Tracer().trace(model)
    assert isinstance(graph, fx.Graph)
    x = torch.randn(2, 3, 8, 8)
    assert_close(fx.GraphModule(model, graph)(x), model(x))


def test_trace_of_a_function_returns_its_graph():
    def fn(x, y):
        return torch.relu(x) + y

    graph = fx.Tracer().trace(fn)
    assert [n.op for n in graph.nodes] == [
        "placeholder",
        "placeholder",
        "call_function",
        "call_function",
        "output",
    ]
    x, y = torch.randn(3), torch.randn(3)
    assert_close(fx.GraphModule(torch.nn.Module(), graph)(x, y), fn(x, y))


def test_trace_of_a_sequential_root_traces_through_it():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    gm = fx.symbolic_trace(model)
    assert module_calls(gm.graph) == ["0", "1"]
    assert type(gm).__name__ == "Sequential"
    x = torch.randn(2, 4)
    assert_close(gm(x), model(x))


def test_trace_of_a_leaf_module_as_the_root_traces_its_forward():
    model = nn.Linear(4, 3)
    gm = fx.symbolic_trace(model)
    assert calls(gm.graph) == [("call_function", F.linear)]
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["weight", "bias"]
    x = torch.randn(2, 4)
    assert_close(gm(x), model(x))


# ============================================================ leaf modules
def test_linear_conv_and_batch_norm_are_leaf_modules():
    graph = fx.Tracer().trace(SmallResNet())
    assert module_calls(graph) == [
        "stem",
        "layer1.0.conv",
        "layer1.0.bn",
        "layer1.1.conv",
        "layer1.1.bn",
        "fc",
    ]


def test_sequential_is_traced_through():
    graph = fx.Tracer().trace(SmallResNet())
    assert "layer1" not in module_calls(graph)
    assert [n.target for n in graph.nodes if n.op == "call_function"].count(torch.relu) == 2


def test_module_list_by_index_and_module_dict_by_key_are_traced_through():
    model = Containers()
    gm = fx.symbolic_trace(model)
    assert module_calls(gm.graph) == [
        "layers.0",
        "layers.0",
        "layers.1",
        "heads.tanh",
        "heads.sigmoid",
    ]
    x = torch.randn(2, 4)
    assert_close(gm(x), model(x))


def test_user_modules_are_traced_through_by_default():
    graph = fx.Tracer().trace(Nested())
    assert module_calls(graph) == ["block.lin"]
    assert ("call_function", torch.relu) in calls(graph)


def test_custom_is_leaf_module_keeps_a_user_module_as_one_call():
    seen: list[str] = []

    class InnerIsLeaf(fx.Tracer):
        def is_leaf_module(self, m, module_qualified_name):
            seen.append(module_qualified_name)
            return isinstance(m, Inner) or super().is_leaf_module(m, module_qualified_name)

    model = Nested()
    graph = InnerIsLeaf().trace(model)
    assert module_calls(graph) == ["block.lin", "block.inner"]
    assert seen == ["block", "block.lin", "block.inner"]
    x = torch.randn(2, 4)
    assert_close(fx.GraphModule(model, graph)(x), model(x))


def test_custom_is_leaf_module_can_trace_through_torch_layers():
    class NothingIsLeaf(fx.Tracer):
        def is_leaf_module(self, m, module_qualified_name):
            return False

    model = Nested()
    graph = NothingIsLeaf().trace(model)
    assert module_calls(graph) == []
    assert ("call_function", F.linear) in calls(graph)
    x = torch.randn(2, 4)
    assert_close(fx.GraphModule(model, graph)(x), model(x))


def test_a_module_made_during_forward_is_traced_through():
    # nn.CrossEntropyLoss()(logits, labels) in Hugging Face heads: the module is no
    # attribute the graph could call, so its forward is recorded instead.
    class MakesModulesInForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x, labels):
            return nn.CrossEntropyLoss()(nn.ReLU()(self.lin(x)), labels)

    model = MakesModulesInForward()
    gm = fx.symbolic_trace(model)
    targets = [n.target for n in gm.graph.nodes if n.op != "placeholder"]
    assert "lin" in targets and F.relu in targets and F.cross_entropy in targets
    x, labels = torch.randn(5, 4), torch.tensor([0, 2, 1, 1, 0])
    assert_close(gm(x, labels), model(x, labels))


def test_path_of_module_names_a_module_outside_the_root():
    tracer = fx.Tracer()
    tracer.trace(nn.Linear(2, 2))
    with pytest.raises(fx.TraceError, match="not a submodule"):
        tracer.path_of_module(nn.ReLU())


# ============================================================ hooks
def test_call_module_override_sees_every_module_call_with_its_forward():
    seen: list[tuple[str, str]] = []

    class Recording(fx.Tracer):
        def call_module(self, m, forward, args, kwargs):
            seen.append((self.path_of_module(m), forward.__qualname__))
            return super().call_module(m, forward, args, kwargs)

    Recording().trace(Nested())
    assert seen == [
        ("block", "Block.forward"),
        ("block.lin", "Linear.forward"),
        ("block.inner", "Inner.forward"),
    ]


def test_call_module_override_can_replace_what_a_call_records():
    class ModulesAsFunctions(fx.Tracer):
        """Record every leaf module as a call of its forward (a nested call_function)."""

        def call_module(self, m, forward, args, kwargs):
            if isinstance(m, nn.Linear):
                return self.create_proxy("call_function", F.linear, (*args, m.weight, m.bias), {})
            return super().call_module(m, forward, args, kwargs)

    model = Nested()
    graph = ModulesAsFunctions().trace(model)
    assert module_calls(graph) == []
    assert [n.target for n in graph.nodes if n.op == "get_attr"] == [
        "block.lin.weight",
        "block.lin.bias",
    ]
    x = torch.randn(2, 4)
    assert_close(fx.GraphModule(model, graph)(x), model(x))


def test_call_module_override_can_record_the_call_itself():
    class EveryModuleIsLeaf(fx.Tracer):
        def call_module(self, m, forward, args, kwargs):
            return self.create_proxy("call_module", self.path_of_module(m), args, kwargs)

    model = Nested()
    graph = EveryModuleIsLeaf().trace(model)
    assert module_calls(graph) == ["block"]
    x = torch.randn(2, 4)
    assert_close(fx.GraphModule(model, graph)(x), model(x))


def test_a_trace_started_inside_another_trace_records_the_original_functions():
    nested: dict[str, fx.GraphModule] = {}

    class NestingTracer(fx.Tracer):
        def call_module(self, m, forward, args, kwargs):
            if isinstance(m, SizeDependent):
                nested[self.path_of_module(m)] = fx.symbolic_trace(m)
            return super().call_module(m, forward, args, kwargs)

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sizes = SizeDependent()

        def forward(self, x):
            return self.sizes(x) / math.sqrt(x.shape[1])

    NestingTracer().trace(Outer())
    targets = [n.target for n in nested["sizes"].graph.nodes if n.op == "call_function"]
    assert torch.zeros in targets
    assert torch.arange in targets


def test_a_tracer_can_be_used_twice():
    tracer = fx.Tracer()
    first = tracer.trace(Nested())
    second = tracer.trace(DocsModule())
    assert module_calls(first) == ["block.lin"]
    assert module_calls(second) == ["linear"]
    assert first is not second


def test_param_shapes_constant_reads_parameter_shapes_instead_of_recording_them():
    class ZerosLikeWeightRows(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 6)

        def forward(self, x):
            return x.new_zeros(self.lin.weight.shape[0]) + self.lin(x)

    model = ZerosLikeWeightRows()
    graph = fx.Tracer(param_shapes_constant=True).trace(model)
    (new_zeros,) = graph.find_nodes(op="call_method", target="new_zeros")
    assert new_zeros.args[1] == 6
    x = torch.randn(2, 4)
    assert_close(fx.GraphModule(model, graph)(x), model(x))


def test_path_of_module_returns_qualified_names():
    model = SmallResNet()
    tracer = fx.Tracer()
    tracer.trace(model)
    assert tracer.path_of_module(model.layer1[0].conv) == "layer1.0.conv"
    assert tracer.path_of_module(model.layer1) == "layer1"
    assert tracer.path_of_module(model.fc) == "fc"


def test_create_node_override_can_attach_meta_to_every_node():
    class Tagging(fx.Tracer):
        def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):
            node = super().create_node(kind, target, args, kwargs, name, type_expr)
            node.meta["created_by"] = "Tagging"
            return node

    graph = Tagging().trace(Nested())
    assert all(n.meta["created_by"] == "Tagging" for n in graph.nodes)


def test_create_proxy_override_sees_every_recorded_operation():
    kinds: list[str] = []

    class Counting(fx.Tracer):
        def create_proxy(
            self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None
        ):
            proxy = super().create_proxy(
                kind, target, args, kwargs, name, type_expr, proxy_factory_fn
            )
            proxy.node.meta["proxy_kind"] = kind
            kinds.append(kind)
            return proxy

    graph = Counting().trace(Nested())
    assert kinds == [n.op for n in graph.nodes if n.op != "output"]
    assert all("proxy_kind" in n.meta for n in graph.nodes if n.op != "output")


def test_to_bool_override_decides_data_dependent_branches():
    class AssumeTrue(fx.Tracer):
        def to_bool(self, obj):
            return True

    def fn(x):
        if x.sum() > 0:
            return x.relu()
        return x.neg()

    graph = AssumeTrue().trace(fn)
    assert ("call_method", "relu") in calls(graph)
    assert ("call_method", "neg") not in calls(graph)


# ============================================================ create_arg
def test_parameters_become_get_attr_nodes():
    graph = fx.Tracer().trace(WithParameter())
    assert [n.target for n in graph.nodes if n.op == "get_attr"] == ["scale", "lin.weight"]


def test_a_parameter_read_twice_is_one_get_attr_node():
    graph = fx.Tracer().trace(WithParameter())
    (scale,) = graph.find_nodes(op="get_attr", target="scale")
    assert len(scale.users) == 2


def test_module_with_parameters_matches_eager():
    model = WithParameter()
    x = torch.randn(2, 4)
    assert_close(fx.symbolic_trace(model)(x), model(x))


def test_global_tensor_constant_becomes_a_tensor_constant_attribute():
    def fn(x):
        return x + SHIFT

    gm = fx.symbolic_trace(fn)
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["_tensor_constant0"]
    assert torch.equal(gm._tensor_constant0, SHIFT)
    x = torch.randn(2, 4)
    assert_close(gm(x), fn(x))


def test_closure_tensor_constant_becomes_a_tensor_constant_attribute():
    scale = torch.tensor([2.0, 3.0])

    def fn(x):
        return x * scale - scale

    gm = fx.symbolic_trace(fn)
    assert {n.target for n in gm.graph.nodes if n.op == "get_attr"} == {"_tensor_constant0"}
    x = torch.randn(2)
    assert_close(gm(x), fn(x))


def test_capturing_a_tensor_constant_does_not_modify_the_users_module():
    class AddsShift(nn.Module):
        def forward(self, x):
            return x + SHIFT

    model = AddsShift()
    attributes_before = set(vars(model))
    gm = fx.symbolic_trace(model)
    assert not hasattr(model, "_tensor_constant0")
    assert set(vars(model)) == attributes_before
    assert list(model.state_dict()) == []
    assert "_tensor_constant0" in dict(gm.named_buffers())


class OwnsTheConstantName(nn.Module):
    """A root that already has an attribute named like the tracer's first constant."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("_tensor_constant0", torch.full((4,), 10.0))

    def forward(self, x):
        return x + self._tensor_constant0 + SHIFT


def test_captured_constant_does_not_shadow_an_attribute_of_the_root():
    model = OwnsTheConstantName()
    x = torch.zeros(4)
    assert_close(fx.symbolic_trace(model)(x), model(x))


def test_parameter_containers_and_buffers_become_get_attr_nodes():
    class Containers2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.plist = nn.ParameterList(
                [nn.Parameter(torch.rand(3)), nn.Parameter(torch.rand(3))]
            )
            self.pdict = nn.ParameterDict({"a": nn.Parameter(torch.rand(3))})
            self.register_buffer("buf", torch.rand(3), persistent=False)

        def forward(self, x):
            for p in self.plist:
                x = x * p
            return x + self.pdict["a"] + self.buf

    model = Containers2()
    gm = fx.symbolic_trace(model)
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == [
        "plist.0",
        "plist.1",
        "pdict.a",
        "buf",
    ]
    assert list(gm.state_dict()) == list(model.state_dict())
    x = torch.randn(3)
    assert_close(gm(x), model(x))


# ============================================================ create_args_for_root
def test_defaults_are_kept_in_the_generated_signature():
    def fn(x, y=3, *, scale=2.0):
        return (x + y) * scale

    gm = fx.symbolic_trace(fn)
    parameters = inspect.signature(gm.forward).parameters
    assert parameters["y"].default == 3
    assert parameters["scale"].default == 2.0
    x = torch.randn(3)
    assert_close(gm(x), fn(x))
    assert_close(gm(x, 5, scale=0.5), fn(x, 5, scale=0.5))


def variadic(x, *args, **kwargs):
    return x + sum(args) + sum(kwargs.values())


def test_star_args_and_kwargs_are_traced_as_one_input_each_by_default():
    # As in torch.fx: the function body gets the traced tuple and dict themselves.
    def indexing(x, *args, **kwargs):
        return x + args[0] * kwargs["scale"]

    gm = fx.symbolic_trace(indexing)
    parameters = inspect.signature(gm.forward).parameters
    assert parameters["args"].kind is inspect.Parameter.VAR_POSITIONAL
    assert parameters["kwargs"].kind is inspect.Parameter.VAR_KEYWORD
    x, a = torch.randn(3), torch.randn(3)
    assert_close(gm(x, a, scale=2.0), indexing(x, a, scale=2.0))


def test_calling_with_more_positional_arguments_than_traced_raises_type_error():
    gm = fx.symbolic_trace(variadic, concrete_args={"args": (), "kwargs": {}})
    with pytest.raises(TypeError, match=r"traced with 0 extra positional argument.*\*args"):
        gm(torch.randn(3), torch.randn(3))


def test_calling_with_keyword_arguments_not_traced_raises_type_error():
    gm = fx.symbolic_trace(variadic, concrete_args={"args": (), "kwargs": {}})
    with pytest.raises(TypeError, match=r"\*\*kwargs"):
        gm(torch.randn(3), bias=torch.randn(3))


def test_concrete_args_can_trace_star_args_with_two_inputs():
    gm = fx.symbolic_trace(variadic, concrete_args={"args": (fx.PH, fx.PH), "kwargs": {}})
    x, a, b = torch.randn(3), torch.randn(3), torch.randn(3)
    assert_close(gm(x, a, b), variadic(x, a, b))
    with pytest.raises(TypeError, match="2 extra positional"):
        gm(x, a)


def test_concrete_args_can_trace_kwargs_with_named_inputs():
    gm = fx.symbolic_trace(variadic, concrete_args={"args": (), "kwargs": {"bias": fx.PH}})
    x, bias = torch.randn(3), torch.randn(3)
    assert_close(gm(x, bias=bias), variadic(x, bias=bias))


def flagged(x, **kwargs):
    # Hugging Face models read their output flags from **kwargs (transformers 5).
    return x.relu() if kwargs.get("use_relu", False) else -x


def test_concrete_args_naming_no_parameter_go_to_the_kwargs_of_a_function_that_takes_them():
    gm = fx.symbolic_trace(flagged, concrete_args={"use_relu": True})
    x = torch.randn(5)
    assert_close(gm(x), x.relu())  # the fixed keyword may be left out
    assert_close(gm(x, use_relu=True), x.relu())  # or passed with the traced value
    with pytest.raises(ValueError, match="'use_relu'"):
        gm(x, use_relu=False)
    with pytest.raises(TypeError, match=r"\*\*kwargs"):
        gm(x, other=1)


def test_fixed_and_input_keywords_of_kwargs_can_be_mixed():
    gm = fx.symbolic_trace(
        variadic, concrete_args={"args": (), "kwargs": {"bias": fx.PH}, "scale": 2.0}
    )
    x, bias = torch.randn(3), torch.randn(3)
    assert_close(gm(x, bias=bias), variadic(x, bias=bias, scale=2.0))
    with pytest.raises(TypeError, match="bias"):
        gm(x)


def test_concrete_args_naming_no_parameter_of_a_function_without_kwargs_is_refused():
    def fn(x, flag=False):
        return x

    with pytest.raises(fx.TraceError, match=r"\['flg'\].*not parameters.*\['x', 'flag'\]"):
        fx.symbolic_trace(fn, concrete_args={"flg": True})


def test_concrete_bool_flag_fixes_the_branch_taken():
    relu_gm = fx.symbolic_trace(Gated(), concrete_args={"use_relu": True})
    neg_gm = fx.symbolic_trace(Gated(), concrete_args={"use_relu": False})
    assert ("call_method", "relu") in calls(relu_gm.graph)
    assert ("call_method", "neg") not in calls(relu_gm.graph)
    assert ("call_method", "neg") in calls(neg_gm.graph)
    x = torch.randn(5)
    assert_close(relu_gm(x, True), x.relu())
    assert_close(neg_gm(x, False), -x)


def test_calling_with_the_fixed_value_or_omitting_it_works():
    gm = fx.symbolic_trace(Gated(), concrete_args={"use_relu": True})
    x = torch.randn(5)
    assert_close(gm(x), x.relu())
    assert_close(gm(x, True), x.relu())
    assert_close(gm(x, use_relu=True), x.relu())


def test_calling_with_another_value_than_the_fixed_one_raises_value_error_naming_it():
    gm = fx.symbolic_trace(Gated(), concrete_args={"use_relu": True})
    with pytest.raises(ValueError, match="'use_relu'"):
        gm(torch.randn(5), False)
    with pytest.raises(ValueError, match="'use_relu'"):
        gm(torch.randn(5), use_relu=False)


def test_fixed_argument_check_survives_dead_code_elimination():
    gm = fx.symbolic_trace(Gated(), concrete_args={"use_relu": True})
    gm.graph.eliminate_dead_code()
    gm.recompile()
    with pytest.raises(ValueError, match="'use_relu'"):
        gm(torch.randn(5), False)


def test_concrete_args_can_fix_a_parameter_before_an_input():
    def fn(flag, x):
        return x.relu() if flag else x

    gm = fx.symbolic_trace(fn, concrete_args={"flag": True})
    x = torch.randn(4)
    assert_close(gm(True, x), x.relu())


def test_concrete_args_naming_an_unknown_parameter_raises_trace_error():
    with pytest.raises(fx.TraceError, match="use_rleu"):
        fx.symbolic_trace(Gated(), concrete_args={"use_rleu": True})


class Config:
    def __init__(self, scale: float) -> None:
        self.scale = scale


def scaled(x, config):
    return x * config.scale


def test_calling_with_another_object_than_a_fixed_non_literal_raises():
    gm = fx.symbolic_trace(scaled, concrete_args={"config": Config(3.0)})
    with pytest.raises(ValueError, match="'config'"):
        gm(torch.ones(2), Config(5.0))


# ============================================================ autowrap
def test_math_function_given_a_proxy_is_recorded():
    def fn(x):
        return x / math.sqrt(x.shape[1])

    gm = fx.symbolic_trace(fn)
    assert ("call_function", math.sqrt) in calls(gm.graph)
    for shape in [(2, 4), (3, 9)]:
        x = torch.randn(shape)
        assert_close(gm(x), fn(x))


def test_math_function_imported_by_name_given_a_proxy_is_recorded():
    def fn(x):
        return x / sqrt(x.shape[1])

    gm = fx.symbolic_trace(fn)
    assert ("call_function", math.sqrt) in calls(gm.graph)
    for shape in [(2, 4), (3, 9)]:
        x = torch.randn(shape)
        assert_close(gm(x), fn(x))


def test_math_function_given_a_constant_is_evaluated_while_tracing():
    def fn(x):
        return x * math.sqrt(4.0)

    gm = fx.symbolic_trace(fn)
    assert calls(gm.graph) == [("call_function", operator.mul)]
    assert gm.graph.find_nodes(op="call_function", target=operator.mul)[0].args[1] == 2.0


def test_autowrap_functions_records_calls_to_a_module_level_function():
    def fn(x):
        return double_if_positive(x) + 1

    with pytest.raises(fx.TraceError):
        fx.Tracer().trace(fn)
    graph = fx.Tracer(autowrap_functions=(double_if_positive,)).trace(fn)
    assert ("call_function", double_if_positive) in calls(graph)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    for x in (torch.ones(3), -torch.ones(3)):
        assert_close(gm(x), fn(x))


# ============================================================ wrap
def normalize(x):
    """The documentation's example: ``len`` is wrapped at the top of this file."""
    return x / sqrt(len(x))


def test_wrapped_len_is_recorded_as_in_the_documented_normalize_example():
    gm = fx.symbolic_trace(normalize)
    assert normalized(gm.code) == normalized(
        """
        def forward(self, x):
            len_1 = len(x)
            sqrt_1 = math.sqrt(len_1);  len_1 = None
            truediv = x / sqrt_1;  x = sqrt_1 = None
            return truediv
        """
    )
    for x in (torch.rand(3, 4), torch.rand(7, 2)):
        assert_close(gm(x), normalize(x))


def test_wrap_decorator_makes_a_function_a_leaf_even_though_its_body_does_not_trace():
    def fn(x):
        return flip_if_negative(x) * 2

    gm = fx.symbolic_trace(fn)
    assert calls(gm.graph) == [("call_function", flip_if_negative), ("call_function", operator.mul)]
    for x in (torch.ones(3), -torch.ones(3)):
        assert_close(gm(x), fn(x))


def test_wrap_decorator_returns_the_function_unchanged():
    assert flip_if_negative.__name__ == "flip_if_negative"
    assert_close(flip_if_negative(-torch.ones(2)), torch.ones(2))


def test_wrap_called_inside_a_function_raises():
    with pytest.raises(RuntimeError, match="top level of a module"):
        fx.wrap("len")


# ============================================================ wrap_library_function
# A library whose function user code reaches as an attribute of its module or imports by name
# (``fxloom.distributed`` registers torch.distributed.rpc.rpc_sync this way).
fake_library = types.ModuleType("fake_library")


def _scale_if_positive(x):
    """Does not trace: a traced value has no truth value."""
    return x * 2 if x.sum() > 0 else x


fake_library.scale_if_positive = _scale_if_positive
wrap_library_function(fake_library.scale_if_positive, fake_library)
scale_from_library = fake_library.scale_if_positive  # `from fake_library import ... as ...`


def test_a_library_function_is_recorded_when_reached_through_its_module():
    def fn(x):
        return fake_library.scale_if_positive(x) + 1

    gm = fx.symbolic_trace(fn)
    assert calls(gm.graph)[0] == ("call_function", _scale_if_positive)
    for x in (torch.ones(3), -torch.ones(3)):
        assert_close(gm(x), fn(x))


def test_a_library_function_is_recorded_when_imported_under_another_name():
    gm = fx.symbolic_trace(lambda x: scale_from_library(x) + 1)
    assert calls(gm.graph)[0] == ("call_function", _scale_if_positive)


def test_a_library_function_given_a_module_without_it_is_refused():
    with pytest.raises(ValueError, match="module empty has no attribute that is"):
        wrap_library_function(_scale_if_positive, types.ModuleType("empty"))


# ============================================================ no trace left behind
def patchable_objects() -> dict[str, Any]:
    """Every object tracing replaces while it runs, as currently bound."""
    return {
        "nn.Module.__call__": nn.Module.__dict__["__call__"],
        "nn.Module.__getattr__": nn.Module.__dict__["__getattr__"],
        # Patched per class of the root's modules (not on nn.Module itself).
        "nn.Linear.__call__": nn.Linear.__dict__.get("__call__", "absent: inherited"),
        "nn.Linear.__getattr__": nn.Linear.__dict__.get("__getattr__", "absent: inherited"),
        "math.sqrt": math.sqrt,
        "torch.zeros": torch.zeros,
        "torch.arange": torch.arange,
        "sqrt imported from math": globals()["sqrt"],
        "wrapped flip_if_negative": globals()["flip_if_negative"],
        "wrapped len": globals().get("len", "absent: the builtin"),
    }


class UsesEverything(nn.Module):
    """Touches every patched object, then optionally fails."""

    def __init__(self, fail: bool) -> None:
        super().__init__()
        self.fail = fail
        self.lin = nn.Linear(4, 4)
        self.during: dict[str, Any] = {}

    def forward(self, x):
        self.during.update(patchable_objects())
        x = self.lin(x) + torch.zeros(x.shape[0], 4) + torch.arange(x.shape[1])
        x = flip_if_negative(x) / math.sqrt(len(x)) + sqrt(x.shape[0])
        if self.fail and x.sum() > 0:  # fails midway, after every patched object was used
            return x
        return x


@pytest.mark.parametrize("fail", [False, True], ids=["successful trace", "failing trace"])
def test_tracing_restores_every_patched_object(fail):
    before = patchable_objects()
    model = UsesEverything(fail)
    if fail:
        with pytest.raises(fx.TraceError):
            fx.symbolic_trace(model)
    else:
        fx.symbolic_trace(model)
    after = patchable_objects()
    assert {name for name in before if after[name] is not before[name]} == set()
    # ... and they really were replaced while tracing ran (nn.Module's own methods are
    # left alone: patching them would cost every module class loaded).
    unpatched = {name for name in before if model.during[name] is before[name]}
    assert unpatched == {"nn.Module.__call__", "nn.Module.__getattr__"}


def test_traced_graph_refers_to_the_original_functions():
    gm = fx.symbolic_trace(UsesEverything(fail=False))
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert {torch.zeros, torch.arange, math.sqrt, len, flip_if_negative} <= targets


def test_tracing_restores_patched_objects_when_creating_the_inputs_fails():
    before = patchable_objects()
    with pytest.raises(fx.TraceError):
        fx.symbolic_trace(Gated(), concrete_args={"no_such_argument": 1})
    after = patchable_objects()
    assert all(after[name] is before[name] for name in before)


def test_tracing_leaves_no_proxy_on_the_users_module():
    class Caching(nn.Module):
        def forward(self, x):
            self.last = x * 2
            return self.last + 1

    model = Caching()
    fx.symbolic_trace(model)
    assert not isinstance(getattr(model, "last", None), fx.Proxy)


# ============================================================ symbolic_trace
def test_symbolic_trace_names_the_graph_module_after_the_root_class():
    gm = fx.symbolic_trace(SmallResNet())
    assert isinstance(gm, fx.GraphModule)
    assert type(gm).__name__ == "SmallResNet"


def test_symbolic_trace_names_the_graph_module_after_the_function():
    gm = fx.symbolic_trace(normalize)
    assert isinstance(gm, fx.GraphModule)
    assert type(gm).__name__ == "normalize"


class Doubler:
    """A callable object that is not a module."""

    def __call__(self, x):
        return x * 2


def test_symbolic_trace_of_a_callable_object_names_it_after_its_class():
    gm = fx.symbolic_trace(Doubler())
    assert type(gm).__name__ == "Doubler"


# ============================================================ metadata
def node_named(graph: fx.Graph, name: str) -> fx.Node:
    return next(n for n in graph.nodes if n.name == name)


def test_nn_module_stack_lists_enclosing_module_paths_and_classes():
    graph = fx.Tracer().trace(Nested())
    relu = graph.find_nodes(op="call_function", target=torch.relu)[0]
    assert list(relu.meta["nn_module_stack"].values()) == [
        ("block", Block),
        ("block.inner", Inner),
    ]


def test_nn_module_stack_of_a_leaf_call_ends_with_the_leaf():
    graph = fx.Tracer().trace(Nested())
    (lin,) = graph.find_nodes(op="call_module", target="block.lin")
    assert list(lin.meta["nn_module_stack"].values()) == [
        ("block", Block),
        ("block.lin", nn.Linear),
    ]


def test_every_call_node_inside_a_submodule_has_an_nn_module_stack():
    graph = fx.Tracer().trace(Nested())
    mul = graph.find_nodes(op="call_function", target=operator.mul)[0]  # in the root's forward
    inside = [n for n in graph.nodes if n.op.startswith("call_") and n is not mul]
    assert inside and all(n.meta["nn_module_stack"] for n in inside)
    assert not mul.meta.get("nn_module_stack")


def test_source_fn_stack_names_each_call_and_what_it_called():
    graph = fx.Tracer().trace(Nested())
    for node in graph.nodes:
        if node.op.startswith("call_"):
            name, source = node.meta["source_fn_stack"][-1]
            assert name == node.name
    assert node_named(graph, "relu").meta["source_fn_stack"][-1][1] is torch.relu
    assert node_named(graph, "block_lin").meta["source_fn_stack"][-1][1] is nn.Linear


def test_record_stack_traces_stores_the_user_file_and_line():
    def fn(x):
        return torch.relu(x)  # <- traced line

    graph = fx.Tracer(record_stack_traces=True).trace(fn)
    relu = graph.find_nodes(op="call_function", target=torch.relu)[0]
    assert f'File "{__file__}", line {line_of("# <- traced line")}' in relu.meta["stack_trace"]
    assert "return torch.relu(x)" in relu.meta["stack_trace"]


def test_a_stack_trace_of_an_operator_overload_names_the_user_line():
    def fn(x):
        return torch.ops.aten.relu.default(x)  # <- an overload call

    graph = fx.Tracer(record_stack_traces=True).trace(fn)
    relu = graph.find_nodes(op="call_function", target=torch.ops.aten.relu.default)[0]
    assert f'File "{__file__}", line {line_of("# <- an overload call")}' in relu.meta["stack_trace"]
    assert "_ops.py" not in relu.meta["stack_trace"]


def test_stack_traces_are_not_recorded_by_default():
    def fn(x):
        return torch.relu(x)

    graph = fx.Tracer().trace(fn)
    assert all("stack_trace" not in n.meta for n in graph.nodes)


# ============================================================ real-model idioms
class SizeDependent(nn.Module):
    """Tensors built from the input's sizes, as real models build masks and positions."""

    def forward(self, x):  # x: (batch, seq)
        state = torch.zeros(x.shape[0], 4)
        positions = torch.arange(x.size(1))
        ones = x.new_ones(x.shape)
        bias = torch.full((x.shape[0],), 1.0)
        return (x + positions) * ones + bias[:, None] + state.sum(dim=1, keepdim=True)


def test_tensors_built_from_input_sizes_are_recorded():
    gm = fx.symbolic_trace(SizeDependent())
    recorded = calls(gm.graph)
    for call in [
        ("call_function", torch.zeros),
        ("call_function", torch.arange),
        ("call_method", "new_ones"),
        ("call_function", torch.full),
    ]:
        assert call in recorded
    assert gm.graph.find_nodes(op="get_attr") == []  # nothing was frozen into a constant


def test_tensor_factory_imported_by_name_is_recorded_too():
    def fn(x):
        return x + zeros(x.shape[0], 1)

    gm = fx.symbolic_trace(fn)
    assert ("call_function", torch.zeros) in calls(gm.graph)


def test_tensors_built_from_input_sizes_follow_the_input_size():
    model = SizeDependent()
    gm = fx.symbolic_trace(model)
    for shape in [(2, 3), (5, 7)]:
        x = torch.randn(shape)
        assert_close(gm(x), model(x))


def test_attention_with_sizes_read_from_the_input_works_for_two_sequence_lengths():
    model = TransformerBlock().eval()
    gm = fx.symbolic_trace(model)
    for shape in [(2, 5, 16), (3, 9, 16)]:
        x = torch.randn(shape)
        assert_close(gm(x), model(x))


def assert_is_matrix(x):
    torch._assert(x.dim() == 2, "expects a matrix")
    return x + 1


def test_torch_assert_is_recorded_and_kept_by_dead_code_elimination():
    gm = fx.symbolic_trace(assert_is_matrix)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert ("call_function", torch._assert) in calls(gm.graph)
    x = torch.randn(2, 3)
    assert_close(gm(x), assert_is_matrix(x))
    with pytest.raises(AssertionError, match="expects a matrix"):
        gm(torch.randn(2, 3, 4))


def test_torchscript_checks_inside_the_model_do_not_break_tracing():
    def fn(x):
        if torch.jit.is_scripting() or torch.jit.is_tracing():
            return x
        return x * 2

    gm = fx.symbolic_trace(fn)
    assert calls(gm.graph) == [("call_function", operator.mul)]
    x = torch.randn(3)
    assert_close(gm(x), fn(x))


def test_a_tensor_created_and_mutated_inside_the_model_is_fresh_on_every_call():
    def fn(x):
        total = torch.zeros(3)
        total += x
        return total

    gm = fx.symbolic_trace(fn)
    first = gm(torch.ones(3))
    second = gm(torch.ones(3))
    assert_close(second, fn(torch.ones(3)))
    assert first is not second


def test_namedtuple_and_dict_outputs_are_rebuilt_by_the_generated_code():
    Pair = collections.namedtuple("Pair", "first second")

    def fn(x):
        return Pair(x + 1, x * 2), {"relu": x.relu()}

    gm = fx.symbolic_trace(fn)
    x = torch.randn(3)
    pair, mapping = gm(x)
    assert isinstance(pair, Pair)
    assert_close((tuple(pair), mapping), (tuple(fn(x)[0]), fn(x)[1]))


# ============================================================ the documentation
class DocsModule(nn.Module):
    """The overview example of the torch.fx documentation."""

    def __init__(self) -> None:
        super().__init__()
        self.param = nn.Parameter(torch.rand(3, 4))
        self.linear = nn.Linear(4, 5)

    def forward(self, x):
        return self.linear(x + self.param).clamp(min=0.0, max=1.0)


def test_docs_overview_module_traces_to_the_documented_code():
    gm = fx.symbolic_trace(DocsModule())
    assert normalized(gm.code) == normalized(
        """
        def forward(self, x):
            param = self.param
            add_1 = x + param;  x = param = None
            linear_1 = self.linear(add_1);  add_1 = None
            clamp_1 = linear_1.clamp(min = 0.0, max = 1.0);  linear_1 = None
            return clamp_1
        """
    )


def test_docs_overview_module_traces_to_the_documented_graph():
    graph = fx.symbolic_trace(DocsModule()).graph
    assert [(n.op, n.target) for n in graph.nodes] == [
        ("placeholder", "x"),
        ("get_attr", "param"),
        ("call_function", operator.add),
        ("call_module", "linear"),
        ("call_method", "clamp"),
        ("output", "output"),
    ]
    assert graph.find_nodes(op="call_method", target="clamp")[0].kwargs == {"min": 0.0, "max": 1.0}


class StaticControlFlow(nn.Module):
    """The documentation's static control flow example (smaller linear)."""

    def __init__(self, do_activation: bool = False) -> None:
        super().__init__()
        self.do_activation = do_activation
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        x = self.linear(x)
        # This if-statement is so-called static control flow.
        if self.do_activation:
            x = torch.relu(x)
        return x


def test_static_control_flow_traces_the_branch_of_the_hyper_parameter():
    without_activation = fx.symbolic_trace(StaticControlFlow(do_activation=False))
    with_activation = fx.symbolic_trace(StaticControlFlow(do_activation=True))
    assert normalized(without_activation.code) == normalized(
        """
        def forward(self, x):
            linear_1 = self.linear(x);  x = None
            return linear_1
        """
    )
    assert normalized(with_activation.code) == normalized(
        """
        def forward(self, x):
            linear_1 = self.linear(x);  x = None
            relu_1 = torch.relu(linear_1);  linear_1 = None
            return relu_1
        """
    )


def func_to_trace(x):
    dim0 = x.size()[0]
    if dim0 == 3:  # <- documented dynamic control flow
        return torch.relu(x)
    return torch.neg(x)


def test_dynamic_control_flow_raises_the_documented_error_at_the_condition():
    with pytest.raises(fx.TraceError, match="cannot be used as inputs to control flow") as info:
        fx.symbolic_trace(func_to_trace)
    assert info.value.location == f"{__file__}:{line_of('# <- documented dynamic control flow')}"


def test_documented_workaround_binds_the_flag_and_traces():
    def f(x, flag):
        if flag:
            return x
        return x * 2

    with pytest.raises(fx.TraceError):
        fx.symbolic_trace(f)

    def g(flag):
        return lambda x: f(x, flag)

    gm = fx.symbolic_trace(g(flag=False))
    x = torch.randn(3)
    assert_close(gm(x), x * 2)


class MySpecialSubmodule(nn.Module):
    def forward(self, x):
        return torch.neg(x)


class LeafExample(nn.Module):
    """The documentation's leaf module example."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 4)
        self.submod = MySpecialSubmodule()

    def forward(self, x):
        return self.submod(self.linear(x))


def test_docs_leaf_module_example_keeps_linear_and_traces_through_the_submodule():
    model = LeafExample()
    gm = fx.symbolic_trace(model)
    assert normalized(gm.code) == normalized(
        """
        def forward(self, x):
            linear_1 = self.linear(x);  x = None
            neg_1 = torch.neg(linear_1);  linear_1 = None
            return neg_1
        """
    )
    x = torch.randn(2, 3)
    assert_close(gm(x), model(x))


def test_docs_custom_tracer_example_builds_a_runnable_graph_module():
    class MyCustomTracer(fx.Tracer):
        pass

    class MyModule(nn.Module):
        def forward(self, x):
            return torch.relu(x) + torch.ones(3, 4)

    mod = MyModule()
    traced_graph = MyCustomTracer().trace(mod)
    traced = fx.GraphModule(mod, traced_graph)
    x = torch.randn(3, 4)
    assert_close(traced(x), mod(x))


# ============================================================ the paper
def my_func(x):
    return torch.relu(x).neg()


def test_paper_figure_1_captures_the_documented_nodes_and_code():
    traced = fx.symbolic_trace(my_func)
    assert [(n.name, n.op, n.target) for n in traced.graph.nodes] == [
        ("x", "placeholder", "x"),
        ("relu", "call_function", torch.relu),
        ("neg", "call_method", "neg"),
        ("output", "output", "output"),
    ]
    assert normalized(traced.code) == normalized(
        """
        def forward(self, x):
            relu = torch.relu(x); x = None
            neg = relu.neg(); relu = None
            return neg
        """
    )


def replace_activation(g: fx.Graph, old: Any, new: Any) -> None:
    """Figure 2's transform, as printed in the paper."""
    for n in g.nodes:
        if n.op == "call_function" and n.target == old:
            with g.inserting_after(n):
                new_n = g.call_function(new, n.args)
            n.replace_all_uses_with(new_n)
            g.erase_node(n)


def traced_with_gelu() -> fx.GraphModule:
    traced = fx.symbolic_trace(my_func)
    replace_activation(traced.graph, torch.relu, F.gelu)
    traced.recompile()
    return traced


def test_paper_figure_2_transform_replaces_relu_with_gelu():
    traced = traced_with_gelu()
    assert calls(traced.graph) == [("call_function", F.gelu), ("call_method", "neg")]
    x = torch.randn(5)
    assert_close(traced(x), F.gelu(x).neg())


class SampleModule(nn.Module):
    def forward(self, x):
        return self.act(x + math.pi)


def test_paper_figure_3_retraces_a_graph_module_used_as_a_submodule():
    sm = SampleModule()
    sm.act = traced_with_gelu()  # from the previous figure
    traced = fx.symbolic_trace(sm)
    assert [(n.op, n.target) for n in traced.graph.nodes] == [
        ("placeholder", "x"),
        ("call_function", operator.add),
        ("call_function", F.gelu),
        ("call_method", "neg"),
        ("output", "output"),
    ]
    assert traced.graph.find_nodes(op="call_function", target=operator.add)[0].args[1] == math.pi
    x = torch.randn(5)
    assert_close(traced(x), sm(x))


def test_retracing_a_graph_module_with_tensor_constants_keeps_them_reachable():
    def with_constant(x):
        return torch.relu(x) * SHIFT

    sm = SampleModule()
    sm.act = fx.symbolic_trace(with_constant)
    traced = fx.symbolic_trace(sm)
    assert [n.target for n in traced.graph.nodes if n.op == "get_attr"] == ["act._tensor_constant0"]
    x = torch.randn(2, 4)
    assert_close(traced(x), sm(x))


def test_retracing_a_traced_module_gives_the_same_program():
    model = SmallResNet().eval()
    once = fx.symbolic_trace(model)
    twice = fx.symbolic_trace(once)
    assert normalized(twice.code) == normalized(once.code)
    x = torch.randn(2, 3, 8, 8)
    assert_close(twice(x), model(x))


def test_a_module_traced_with_concrete_args_can_be_traced_again():
    gm = fx.symbolic_trace(Gated(), concrete_args={"use_relu": True})
    again = fx.symbolic_trace(gm)
    x = torch.randn(5)
    assert_close(again(x), x.relu())


# ============================================================ agreement with torch.fx
def make_docs_module() -> nn.Module:
    return DocsModule()


def make_resnet() -> nn.Module:
    return SmallResNet().eval()


def make_transformer() -> nn.Module:
    return TransformerBlock().eval()


def make_containers() -> nn.Module:
    return Containers()


def make_graph_example() -> nn.Module:
    """The ``Graph`` docstring example of the torch.fx documentation."""

    class MyModule(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.param = nn.Parameter(torch.rand(3, 4))
            self.linear = nn.Linear(4, 5)

        def forward(self, x):
            return torch.topk(torch.sum(self.linear(x + self.linear.weight).relu(), dim=-1), 3)

    return MyModule()


MODELS = [
    (make_docs_module, (3, 4)),
    (make_graph_example, (5, 4)),
    (make_resnet, (2, 3, 8, 8)),
    (make_transformer, (2, 6, 16)),
    (make_containers, (2, 4)),
]


@pytest.mark.parametrize("make, shape", MODELS, ids=[m[0].__name__[5:] for m in MODELS])
def test_same_nodes_as_torch_fx(make, shape):
    # fxloom adds run-time checks torch.fx lacks (fxloom.guards, e.g. on unpacking
    # lengths); apart from those the graphs are the same.
    model = make()
    ours = [n for n in fx.symbolic_trace(model).graph.nodes if not is_guard(n)]
    theirs = list(torch.fx.symbolic_trace(model).graph.nodes)
    assert collections.Counter(n.op for n in ours) == collections.Counter(n.op for n in theirs)
    assert [(n.op, n.target) for n in ours if n.op != "placeholder"] == [
        (n.op, n.target) for n in theirs if n.op != "placeholder"
    ]


def is_guard(node):
    from fxloom.ops.runtime_functions import is_runtime_check

    return node.op == "call_function" and is_runtime_check(node.target)


@pytest.mark.parametrize("make, shape", MODELS, ids=[m[0].__name__[5:] for m in MODELS])
def test_same_outputs_as_torch_fx(make, shape):
    model = make()
    x = torch.randn(shape)
    assert_close(fx.symbolic_trace(model)(x), torch.fx.symbolic_trace(model)(x))


# ============================================================ interop
def test_a_numpy_ufunc_on_a_traced_size_is_recorded():
    import numpy as np

    class ScaleBySqrtWidth(nn.Module):
        def forward(self, x):
            return x / np.sqrt(x.shape[-1])

    model = ScaleBySqrtWidth()
    gm = fx.symbolic_trace(model)
    assert np.sqrt in [n.target for n in gm.graph.nodes]
    for width in (4, 9):
        x = torch.randn(2, width)
        assert_close(gm(x), model(x))


@torch.jit.script
def scripted_scale(x: torch.Tensor, k: int) -> torch.Tensor:
    return x * k


def test_a_torchscript_function_called_with_a_traced_value_is_recorded():
    class UsesScript(nn.Module):
        def forward(self, x):
            return scripted_scale(x, 3) + 1

    model = UsesScript()
    gm = fx.symbolic_trace(model)
    assert scripted_scale in [n.target for n in gm.graph.nodes]
    x = torch.randn(3)
    assert_close(gm(x), model(x))


def test_a_traced_value_cached_in_a_module_dict_does_not_outlive_the_trace():
    class Caches(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))
            self.cache = {}

        def forward(self, x):
            if "scale" not in self.cache:
                self.cache["scale"] = self.w * 2
            return x + self.cache["scale"]

    model = Caches()
    gm = fx.symbolic_trace(model)
    assert model.cache == {}
    x = torch.randn(3)
    assert_close(model(x), x + 2)
    assert_close(gm(x), x + 2)


def test_every_operation_has_an_nn_module_stack_even_at_the_root_level():
    class Top(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x) + 1

    graph = fx.symbolic_trace(Top()).graph
    stacks = {n.name: n.meta.get("nn_module_stack") for n in graph.nodes}
    assert stacks["lin"] == {"lin": ("lin", nn.Linear)}
    assert stacks["add"] == {}
    assert stacks["x"] is None and stacks["output"] is None


def test_a_namespace_patched_at_once_is_put_back_as_it_was():
    from fxloom.tracing.patcher import Patcher

    namespace = {"kept": 1, "patched": 2}
    patcher = Patcher()
    patcher.patch_namespace(namespace, {"patched": 20, "added": 30})
    patcher.patch_namespace(namespace, {"patched": 200})  # already patched: keeps the first
    assert namespace == {"kept": 1, "patched": 20, "added": 30}
    patcher.restore()
    assert namespace == {"kept": 1, "patched": 2}


class MaybeWeighted(nn.Module):
    def __init__(self, weighted: bool) -> None:
        super().__init__()
        if weighted:
            self.weight = nn.Parameter(torch.ones(2))

    def forward(self, x):
        return x


class ReadsOneOfTwo(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.plain = MaybeWeighted(False)  # listed first: its class still holds a parameter
        self.weighted = MaybeWeighted(True)

    def forward(self, x):
        return self.plain(x) * self.weighted.weight


def test_a_parameter_is_read_as_get_attr_when_another_module_of_its_class_holds_none():
    model = ReadsOneOfTwo()
    ours = [(n.op, n.target) for n in fx.symbolic_trace(model).graph.nodes]
    theirs = [(n.op, n.target) for n in torch.fx.symbolic_trace(model).graph.nodes]
    assert ("get_attr", "weighted.weight") in ours
    assert ours == theirs
