"""``Interpreter`` (run a graph node by node) and ``Transformer`` (rebuild it symbolically)."""

from __future__ import annotations

import doctest
import operator
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
import torch
from torch.testing import assert_close

import fxloom as fx
import fxloom.interpreter
from fxloom import Interpreter, Target, Transformer
from fxloom._notes import notes_of

SEED = Path("/work/shared/seeds/001_12b8f1bf0ca83988.txt")


# ------------------------------------------------------------------- models
class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))).softmax(dim=-1)


class ConvBN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.nn.functional.relu(self.bn(self.conv(x))).flatten(1)


class ParamsModule(torch.nn.Module):
    """Reads its own parameter and buffer: get_attr nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x):
        return torch.matmul(x, self.weight) + self.offset


def chain_graph(length: int) -> fx.Graph:
    """``x + 1 + 1 + ...``: ``length`` additions, each consuming the previous value."""
    g = fx.Graph()
    value = g.placeholder("x")
    for _ in range(length):
        value = g.call_function(torch.add, (value, 1.0))
    g.output(value)
    return g


def node_named(gm: fx.GraphModule, name: str) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)


# ------------------------------------------------------- running real models
@pytest.mark.parametrize(
    ("model", "example"),
    [
        (MLP(), torch.randn(5, 8)),
        (ConvBN().eval(), torch.randn(2, 3, 6, 6)),
        (ParamsModule(), torch.randn(3, 4)),
    ],
    ids=["mlp", "conv_bn", "get_attr_params"],
)
def test_run_matches_graph_module_and_eager(model, example):
    gm = fx.symbolic_trace(model)
    result = Interpreter(gm).run(example)
    assert_close(result, gm(example))
    assert_close(result, model(example))


def test_run_passes_nested_arguments_and_kwargs():
    def fn(x, y):
        return torch.cat([x, y * 2], dim=1).sum(dim=(0,), keepdim=True)

    gm = fx.symbolic_trace(fn)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    assert_close(Interpreter(gm).run(x, y), fn(x, y))


def test_run_sees_edits_made_to_the_graph_after_construction():
    gm = fx.symbolic_trace(lambda x: torch.relu(x))
    interpreter = Interpreter(gm)
    relu = next(n for n in gm.graph.nodes if n.op == "call_function")
    relu.target = torch.neg
    x = torch.randn(4)
    assert_close(interpreter.run(x), -x)


def test_docstring_examples_run():
    failures, tried = doctest.testmod(fxloom.interpreter)
    assert tried > 0 and failures == 0


def test_interpreter_needs_a_graph():
    with pytest.raises(TypeError, match="graph=..."):
        Interpreter(torch.nn.Linear(2, 2))


# ------------------------------------------------------ documented examples
class NegSigmSwapInterpreter(Interpreter):
    def call_function(self, target : Target,
                      args : Tuple, kwargs : Dict) -> Any:  # fmt: skip
        if target == torch.sigmoid:
            return torch.neg(*args, **kwargs)
        return super().call_function(n)  # noqa: F821 - as documented; not reached here

    def call_method(self, target : Target,
                    args : Tuple, kwargs : Dict) -> Any:  # fmt: skip
        if target == "neg":
            call_self, *args_tail = args
            return call_self.sigmoid(*args_tail, **kwargs)
        return super().call_method(n)  # noqa: F821 - as documented; not reached here


class NegSigmSwapXformer(Transformer):
    def call_function(self, target : 'Target', args : Tuple[Any], kwargs : Dict[str, Any]) -> Any:  # fmt: skip  # noqa: UP037
        if target == torch.sigmoid:
            return torch.neg(*args, **kwargs)
        return super().call_function(n)  # noqa: F821 - as documented; not reached here

    def call_method(self, target : 'Target', args : Tuple[Any], kwargs : Dict[str, Any]) -> Any:  # fmt: skip  # noqa: UP037
        if target == "neg":
            call_self, *args_tail = args
            return call_self.sigmoid(*args_tail, **kwargs)
        return super().call_method(n)  # noqa: F821 - as documented; not reached here


def fn(x):
    return torch.sigmoid(x).neg()


@pytest.mark.filterwarnings("ignore:.*assert_allclose")
def test_docs_neg_sigm_swap_interpreter():
    gm = fx.symbolic_trace(fn)
    input = torch.randn(3, 4)
    result = NegSigmSwapInterpreter(gm).run(input)
    torch.testing.assert_allclose(result, torch.neg(input).sigmoid())


@pytest.mark.filterwarnings("ignore:.*assert_allclose")
def test_docs_neg_sigm_swap_transformer():
    gm = fx.symbolic_trace(fn)

    transformed: torch.nn.Module = NegSigmSwapXformer(gm).transform()
    input = torch.randn(3, 4)
    torch.testing.assert_allclose(transformed(input), torch.neg(input).sigmoid())


def seed_example(start: str, end: str) -> str:
    text = SEED.read_text()
    begin = text.index(start)
    stop = text.index(end, begin)
    stop = text.index("\n", stop)
    return text[begin:stop].replace("torch.fx.symbolic_trace", "fx.symbolic_trace")


@pytest.mark.filterwarnings("ignore:.*assert_allclose")
@pytest.mark.parametrize(
    ("start", "end"),
    [
        ("class NegSigmSwapInterpreter(Interpreter):", "torch.testing.assert_allclose(result"),
        ("class NegSigmSwapXformer(Transformer):", "torch.testing.assert_allclose(transformed"),
    ],
    ids=["interpreter", "transformer"],
)
def test_docs_examples_run_verbatim_from_the_seed(start, end):
    namespace = {"torch": torch, "fx": fx, "Any": Any, "Dict": Dict, "Tuple": Tuple}
    namespace.update(Interpreter=Interpreter, Transformer=Transformer, Target=Target)
    exec(compile(seed_example(start, end), "<seed example>", "exec"), namespace)


# ---------------------------------------------------------------- inputs
def test_initial_env_seeds_values_and_skips_those_nodes():
    gm = fx.symbolic_trace(lambda x: (x + 1) * 2)
    add = node_named(gm, "add")
    ran = []

    class Recording(Interpreter):
        def run_node(self, n):
            ran.append(n.name)
            return super().run_node(n)

    seeded = {add: torch.tensor([10.0])}
    result = Recording(gm).run(torch.tensor([0.0]), initial_env=seeded)
    assert_close(result, torch.tensor([20.0]))
    assert "add" not in ran
    assert list(seeded) == [add]  # the caller's dict is left alone


def test_initial_env_can_replace_every_input():
    gm = fx.symbolic_trace(lambda x: x * 3)
    result = Interpreter(gm).run(initial_env={node_named(gm, "x"): torch.tensor([2.0])})
    assert_close(result, torch.tensor([6.0]))


def test_missing_input_raises_naming_the_placeholder():
    gm = fx.symbolic_trace(lambda x, y: x + y)
    with pytest.raises(RuntimeError, match="no value for input 'y'"):
        Interpreter(gm).run(torch.ones(1))


def test_placeholder_default_used_when_inputs_run_out():
    def scaled(x, scale=3.0):
        return x * scale

    gm = fx.symbolic_trace(scaled)
    x = torch.tensor([1.0, 2.0])
    assert_close(Interpreter(gm).run(x), x * 3.0)
    assert_close(Interpreter(gm).run(x, 0.5), x * 0.5)


def test_star_args_placeholder_takes_the_remaining_inputs():
    g = fx.Graph()
    x = g.placeholder("x")
    rest = g.placeholder("*rest")
    g.output(g.call_function(operator.add, (x, g.call_function(len, (rest,)))))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert Interpreter(gm).run(10, "a", "b", "c") == 13 == gm(10, "a", "b", "c")
    assert Interpreter(gm).run(10) == 10


def test_double_star_placeholder_is_an_empty_dict():
    def fn(x, **options):
        return x + 1

    gm = fx.symbolic_trace(fn)
    assert Interpreter(gm).run(1) == 2


# ------------------------------------------------------------ subclassing
class ShapeRecorder(Interpreter):
    """Shape propagation in miniature: store each tensor's shape and dtype in ``node.meta``."""

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            n.meta["shape"] = tuple(result.shape)
            n.meta["dtype"] = result.dtype
        return result


def test_subclass_records_shapes_per_node():
    gm = fx.symbolic_trace(MLP())
    ShapeRecorder(gm).run(torch.randn(5, 8))
    shapes = {n.name: n.meta.get("shape") for n in gm.graph.nodes}
    assert shapes == {
        "x": (5, 8),
        "fc1": (5, 16),
        "relu": (5, 16),
        "fc2": (5, 4),
        "softmax": (5, 4),
        "output": (5, 4),
    }


# ---------------------------------------------------------- value release
class EnvSizeRecorder(Interpreter):
    """Notes how many values are alive each time a node starts running."""

    def run(self, *args, **kwargs):
        self.live_counts: list[int] = []
        return super().run(*args, **kwargs)

    def run_node(self, n: fx.Node) -> Any:
        self.live_counts.append(len(self.env))
        return super().run_node(n)


def test_long_chain_keeps_few_values_alive():
    gm = fx.GraphModule(torch.nn.Module(), chain_graph(200))
    x = torch.zeros(256 * 1024)  # 1 MB of float32 per value
    interpreter = EnvSizeRecorder(gm)
    assert_close(interpreter.run(x), x + 200)
    assert max(interpreter.live_counts) <= 2
    assert len(interpreter.env) <= 2  # the output and its input, no more


def test_without_garbage_collection_every_value_stays():
    gm = fx.GraphModule(torch.nn.Module(), chain_graph(20))
    interpreter = EnvSizeRecorder(gm, garbage_collect_values=False)
    interpreter.run(torch.zeros(3))
    assert len(interpreter.env) == len(gm.graph.nodes)


def test_values_the_output_uses_are_kept_until_the_output():
    g = fx.Graph()
    x = g.placeholder("x")
    first = g.call_function(torch.mul, (x, 2.0))
    value = first
    for _ in range(50):
        value = g.call_function(torch.add, (value, 1.0))
    g.output((first, value, x))
    gm = fx.GraphModule(torch.nn.Module(), g)

    class CheckAtOutput(Interpreter):
        def output(self, target, args, kwargs):
            assert {first, value, x} <= set(self.env)
            return super().output(target, args, kwargs)

    a, b, c = CheckAtOutput(gm).run(torch.ones(2))
    assert_close(a, torch.full((2,), 2.0))
    assert_close(b, torch.full((2,), 52.0))
    assert_close(c, torch.ones(2))


def test_unused_values_are_released_at_once():
    g = fx.Graph()
    x = g.placeholder("x")
    unused = g.call_function(torch.mul, (x, 2.0))
    y = g.call_function(torch.add, (x, 1.0))
    g.output(y)
    gm = fx.GraphModule(torch.nn.Module(), g)
    interpreter = Interpreter(gm)
    interpreter.run(torch.ones(1))
    assert unused not in interpreter.env


# ----------------------------------------------------------------- errors
def test_error_keeps_its_type_and_gains_a_note_naming_the_node():
    gm = fx.symbolic_trace(lambda x, w: torch.matmul(x, w) + 1)
    matmul = node_named(gm, "matmul")
    matmul.meta["stack_trace"] = '  File "model.py", line 7, in forward\n    y = x @ w\n'
    with pytest.raises(RuntimeError) as info:
        Interpreter(gm).run(torch.ones(2, 3), torch.ones(4, 5))
    notes = "\n".join(notes_of(info.value))
    assert "while Interpreter ran %matmul" in notes
    assert matmul.format_node() in notes
    assert 'model.py", line 7' in notes


def test_error_from_a_user_function_keeps_its_exact_type():
    class Boom(Exception):
        pass

    def explode(x):
        raise Boom("nope")

    g = fx.Graph()
    g.output(g.call_function(explode, (g.placeholder("x"),)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    with pytest.raises(Boom) as info:
        Interpreter(gm).run(1)
    assert any("%explode" in note for note in notes_of(info.value))


def test_missing_attribute_names_the_target():
    g = fx.Graph()
    g.output(g.get_attr("block.weight"))
    gm = fx.GraphModule({"block.weight": torch.ones(1)}, g)
    del gm.block.weight
    with pytest.raises(AttributeError, match="'block.weight'"):
        Interpreter(gm).run()


def test_value_used_before_it_is_computed_names_both_nodes():
    g = fx.Graph()
    x = g.placeholder("x")
    double = g.call_function(torch.mul, (x, 2.0))
    total = g.call_function(torch.add, (double, 1.0))
    g.output(total)
    gm = fx.GraphModule(torch.nn.Module(), g)
    double.prepend(total)  # out of topological order
    with pytest.raises(RuntimeError, match="%add needs the value of %mul"):
        Interpreter(gm).run(torch.ones(1))


# ------------------------------------------------------------ Transformer
def ops_and_targets(gm: fx.GraphModule) -> list[tuple[str, Any]]:
    return [(n.op, n.target) for n in gm.graph.nodes]


@pytest.mark.parametrize(
    ("model", "example"),
    [
        (MLP(), torch.randn(5, 8)),
        (ConvBN().eval(), torch.randn(2, 3, 6, 6)),
        (ParamsModule(), torch.randn(3, 4)),
    ],
    ids=["mlp", "conv_bn", "get_attr_params"],
)
def test_transformer_without_overrides_preserves_semantics_and_nodes(model, example):
    gm = fx.symbolic_trace(model)
    transformed = Transformer(gm).transform()
    assert isinstance(transformed, fx.GraphModule)
    assert_close(transformed(example), gm(example))
    assert ops_and_targets(transformed) == ops_and_targets(gm)
    assert [n.name for n in transformed.graph.nodes] == [n.name for n in gm.graph.nodes]
    transformed.graph.lint()


def test_transformer_keeps_call_module_nodes():
    gm = fx.symbolic_trace(ConvBN())
    transformed = Transformer(gm).transform()
    modules = [n.target for n in transformed.graph.nodes if n.op == "call_module"]
    assert modules == ["conv", "bn"]
    assert transformed.conv is gm.conv


def test_transformer_keeps_placeholder_defaults_and_annotations():
    def scaled(x: torch.Tensor, scale: float = 3.0) -> torch.Tensor:
        return x * scale

    transformed = Transformer(fx.symbolic_trace(scaled)).transform()
    x, scale = list(transformed.graph.nodes)[:2]
    assert (x.type, scale.type, scale.args) == (torch.Tensor, float, (3.0,))
    assert_close(transformed(torch.ones(2)), torch.full((2,), 3.0))


def test_transformer_carries_provenance_meta_to_new_nodes():
    gm = fx.symbolic_trace(fn)
    sigmoid = node_named(gm, "sigmoid")
    sigmoid.meta["stack_trace"] = "model.py:3"
    sigmoid.meta["nn_module_stack"] = {"block": ("block", torch.nn.Module)}
    sigmoid.meta["shape"] = (3, 4)  # an analysis result: dropped

    transformed = NegSigmSwapXformer(gm).transform()
    neg = next(n for n in transformed.graph.nodes if n.target is torch.neg)
    assert neg.meta["stack_trace"] == "model.py:3"
    assert neg.meta["nn_module_stack"] == {"block": ("block", torch.nn.Module)}
    assert "shape" not in neg.meta


def test_transformer_override_may_emit_several_nodes():
    class ReluTwice(Transformer):
        def call_function(self, target, args, kwargs):
            if target is torch.relu:
                once = super().call_function(target, args, kwargs)
                return super().call_function(target, (once,), kwargs) * 2
            return super().call_function(target, args, kwargs)

    gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    transformed = ReluTwice(gm).transform()
    x = torch.randn(6)
    assert_close(transformed(x), torch.relu(x) * 2 + 1)
    assert [n.name for n in transformed.graph.nodes] == [
        "x",
        "relu",
        "relu_1",
        "mul",
        "add",
        "output",
    ]


def test_transformer_turns_tensors_from_overrides_into_attributes():
    class AddBias(Transformer):
        def output(self, target, args, kwargs):
            return args[0] + torch.tensor([100.0])

    gm = fx.symbolic_trace(ParamsModule())
    transformed = AddBias(gm).transform()
    x = torch.randn(3, 4)
    assert_close(transformed(x), gm(x) + 100.0)
    assert transformed.weight is gm.weight


def test_transform_called_twice_builds_the_same_graph():
    transformer = Transformer(fx.symbolic_trace(MLP()))
    first = transformer.transform()
    second = transformer.transform()
    assert ops_and_targets(first) == ops_and_targets(second)
