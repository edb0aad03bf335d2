"""What runs is what was checked: ASCII names, a re-checked forward, a frozen module tree,
enumerated classes (issue 32).

The loader checks a file's names and graph; what runs is the Python code generated from that
graph and the module tree as it is at run time. These tests pin each rule that makes the two
the same, with the smallest file or graph that breaks it. (The red team,
``tests/serialize/red_team/test_family9``-``11``, tries the same families as an attacker would,
in a child process with recorders.)
"""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
from hostile import PROGRAM, member, rewrite
from torch import nn

import fxloom
import fxloom.export
from fxloom.codegen import CodeGen
from fxloom.serialize import SerializationError
from fxloom.serialize.generated_code import check_generated_forward


def saved(gm) -> bytes:
    buffer = io.BytesIO()
    fxloom.save(gm, buffer)
    return buffer.getvalue()


def edited(data: bytes, old: str, new: str) -> bytes:
    text = member(data, PROGRAM).decode()
    assert old in text
    return rewrite(data, PROGRAM, text.replace(old, new).encode())


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x):
        return self.lin(x) * self.scale


# ----------------------------------------------------------------------------- ASCII names
def test_the_name_generator_hands_out_ascii_names_for_look_alikes():
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    names = [
        graph.create_node("call_function", torch.relu, (x,), name=name).name
        for name in ["ｓｅｌｆ", "𝐭𝐨𝐫𝐜𝐡", "ｘ", "poids_é", "ſcale"]
    ]
    assert names == ["self_1", "torch_1", "x_1", "poids_e", "scale"]
    assert all(name.isascii() for name in names)


def test_a_non_ascii_attribute_is_read_by_its_exact_name_in_generated_code():
    class Accented(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("poids_é", torch.ones(3))
            self.register_buffer("poids_e", torch.zeros(3))

        def forward(self, x):
            return x + self.poids_é

    gm = fxloom.symbolic_trace(Accented())
    assert 'getattr(self, "poids_é")' in gm.code  # a string: Python does not fold it
    assert torch.equal(gm(torch.zeros(3)), torch.ones(3))


def test_saving_refuses_a_non_ascii_name_and_says_what_python_would_read():
    class Accented(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("ſcale", torch.ones(3))

        def forward(self, x):
            return x * getattr(self, "ſcale")  # noqa: B009 (self.ſcale would read self.scale)

    with pytest.raises(SerializationError, match="ASCII.*'scale'"):
        fxloom.save(fxloom.symbolic_trace(Accented()), io.BytesIO())


@pytest.mark.parametrize(
    "old, new, what",
    [
        ('"name":"scale"', '"name":"ｓｅｌｆ"', "node name"),
        ('"target":"scale"', '"target":"ſcale"', "attribute path"),
        ('"lin":{"class"', '"ｌｉｎ":{"class"', "submodule"),
        ('"class_name":"Scaled"', '"class_name":"𝐒caled"', "class name"),
        ('"in_features":3', '"ｉｎ_features":3', "attribute"),
    ],
)
def test_loading_refuses_a_non_ascii_name(old, new, what):
    data = edited(saved(fxloom.symbolic_trace(Scaled())), old, new)
    with pytest.raises(SerializationError, match=f"{what}.*ASCII"):
        fxloom.load(data)


def test_parse_graph_refuses_a_non_ascii_node_name():
    text = (
        "graph():\n    %x : [num_users=1] = placeholder[target=x]\n"
        "    %𝐭𝐨𝐫𝐜𝐡 : [num_users=1] = call_function[target=torch.relu](args = (%x,), kwargs = {})\n"
        "    return 𝐭𝐨𝐫𝐜𝐡"
    )
    with pytest.raises(fxloom.GraphParseError, match="node name.*'torch'"):
        fxloom.parse_graph(text)


# ------------------------------------------------------------ the generated forward, re-checked
class _Framed(CodeGen):
    """A code frame fxloom never writes for a file: the checker must catch what it adds."""

    def __init__(self, header: str):
        super().__init__()
        self.header = header

    def gen_fn_def(self, free_vars, maybe_return_annotation):
        return self.header + super().gen_fn_def(free_vars, maybe_return_annotation)


@pytest.mark.parametrize(
    "header, problem",
    [
        ("import os\n", "not a single function"),
        ("f = 1\n", "not a single function"),
    ],
)
def test_the_forward_is_checked_as_python_code(header, problem):
    gm = fxloom.symbolic_trace(Scaled())
    gm.graph.set_codegen(_Framed(header))
    with pytest.raises(SerializationError, match=problem):
        check_generated_forward(gm, "the module")


def test_the_code_is_checked_before_any_of_it_runs():
    ran = []

    class Recording(CodeGen):
        def gen_fn_def(self, free_vars, maybe_return_annotation):
            return "ran.append(1)\n" + super().gen_fn_def(free_vars, maybe_return_annotation)

        def additional_globals(self):
            return [("ran", ran)]

    gm = fxloom.symbolic_trace(Scaled())
    gm.graph.set_codegen(Recording())
    with pytest.raises(SerializationError, match="not a single function"):
        check_generated_forward(gm, "the module")
    assert ran == []  # refused before the module-level line could run


def test_the_check_refuses_syntax_code_generation_never_writes():
    class Lambda(CodeGen):
        def gen_fn_def(self, free_vars, maybe_return_annotation):
            return "def forward(self, x=lambda: 0):"

    gm = fxloom.symbolic_trace(Scaled())
    gm.graph.set_codegen(Lambda())
    with pytest.raises(SerializationError, match="Lambda"):
        check_generated_forward(gm, "the module")


def test_the_check_refuses_a_call_of_max_with_key_and_a_graph_value_called():
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(max, ([1, 2],), {"key": len}))
    with pytest.raises(SerializationError, match="key= to max"):
        check_generated_forward(fxloom.GraphModule(nn.Module(), graph), "m")
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_method("__call__", (x,)))
    gm = fxloom.GraphModule(nn.Module(), graph)
    with pytest.raises(SerializationError, match="__call__"):
        check_generated_forward(gm, "m")


def test_every_valid_kind_of_forward_passes_the_check():
    x = torch.randn(4, 3)
    for gm in [
        fxloom.symbolic_trace(Scaled()),
        fxloom.symbolic_trace(Scaled(), example_inputs=(x,)),
        fxloom.export.export(Scaled(), (x,)).module(),
        fxloom.export.export(nn.Linear(3, 2), (x,)).module(),  # its parameter is named input
    ]:
        check_generated_forward(gm, "m")


# ------------------------------------------------------------------ a frozen module tree
def _with_nodes(*lines: str, attributes: dict | None = None) -> bytes:
    """The Scaled file with nodes (JSON records) inserted before its output, and ``attributes``
    added to its root module."""
    import json

    data = saved(fxloom.symbolic_trace(Scaled()))
    program = json.loads(member(data, PROGRAM))
    program["module"]["attributes"].update(attributes or {})
    nodes = program["module"]["graph"]["nodes"]
    output = nodes.pop()
    nodes.extend(json.loads(line) for line in lines)
    nodes.append(output)
    return rewrite(data, PROGRAM, json.dumps(program).encode())


GET_LIN = '{"name": "m", "op": "get_attr", "target": "lin"}'


def test_a_module_read_by_get_attr_may_not_reach_a_tensor_method():
    data = _with_nodes(
        GET_LIN, '{"name": "d", "op": "call_method", "target": "double", "args": [{"node": "m"}]}'
    )
    with pytest.raises(SerializationError, match="reads the module 'lin'.*frozen"):
        fxloom.load(data)


def test_a_module_read_by_get_attr_may_not_be_written_to():
    data = _with_nodes(
        GET_LIN,
        '{"name": "s", "op": "call_function", "target": "operator.setitem", '
        '"args": [{"node": "m"}, "weight", 1]}',
    )
    with pytest.raises(SerializationError, match="passes it to %s"):
        fxloom.load(data)


def test_a_mutable_attribute_may_not_be_read_by_the_graph():
    data = _with_nodes(
        '{"name": "n", "op": "get_attr", "target": "names"}', attributes={"names": ["a"]}
    )
    with pytest.raises(SerializationError, match="a list.*immutable"):
        fxloom.load(data)


def test_cond_branches_are_the_modules_a_graph_may_read():
    class Branchy(nn.Module):
        def forward(self, x):
            return fxloom.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))

    x = torch.randn(4, 3)
    buffer = io.BytesIO()
    fxloom.export.save(fxloom.export.export(Branchy(), (x,)), buffer)
    loaded = fxloom.export.load(buffer.getvalue()).module()
    assert torch.equal(loaded(x), Branchy()(x))


def test_running_a_loaded_module_leaves_its_tree_as_loaded():
    loaded = fxloom.load(saved(fxloom.symbolic_trace(Scaled())))
    before = {name: id(m) for name, m in loaded.named_modules()}
    tensors = {name: t.clone() for name, t in loaded.state_dict().items()}
    loaded(torch.randn(2, 3))
    assert {name: id(m) for name, m in loaded.named_modules()} == before
    assert all(torch.equal(t, tensors[name]) for name, t in loaded.state_dict().items())


# ------------------------------------------------------------------- classes as call targets
def test_a_pytree_registered_class_is_not_a_call_target():
    data = _with_nodes(
        '{"name": "d", "op": "call_function", "target": "collections.defaultdict", '
        '"args": [{"function": "builtins.list"}]}'
    )
    with pytest.raises(SerializationError, match="collections.defaultdict"):
        fxloom.load(data)


def test_saving_a_call_of_a_container_class_says_why_and_how_to_allow_it():
    class Ordered(nn.Module):
        def forward(self, x):
            import collections

            return collections.OrderedDict(a=x)

    graph = fxloom.Graph()
    x = graph.placeholder("x")
    import collections

    graph.output(graph.call_function(collections.OrderedDict, (), {"a": x}))
    with pytest.raises(SerializationError, match="calling a class runs its code.*register"):
        fxloom.save(fxloom.GraphModule(nn.Module(), graph), io.BytesIO())


def test_container_values_and_specs_still_rebuild_registered_classes():
    import collections

    class Returns(nn.Module):
        def forward(self, x):
            return collections.OrderedDict(a=x + 1)

    x = torch.randn(2, 3)
    buffer = io.BytesIO()
    fxloom.export.save(fxloom.export.export(Returns(), (x,)), buffer)
    out = fxloom.export.load(buffer.getvalue()).module()(x)
    assert type(out) is collections.OrderedDict and torch.equal(out["a"], x + 1)


def test_only_transformers_own_output_dataclasses_are_callable():
    transformers = pytest.importorskip("transformers.modeling_outputs")
    from fxloom.serialize.allowlist import MISSING, find_callable

    assert find_callable("transformers.modeling_outputs.BaseModelOutput") is (
        transformers.BaseModelOutput
    )

    @dataclasses.dataclass
    class Mine(transformers.ModelOutput):  # a user's subclass: defined outside transformers
        last: torch.Tensor | None = None

    Mine.__module__ = __name__
    Mine.__qualname__ = "Mine"
    globals()["Mine"] = Mine
    try:
        assert find_callable(f"{__name__}.Mine") is MISSING
    finally:
        del globals()["Mine"]


def test_saving_refuses_a_graph_that_hands_a_module_to_a_function():
    gm = fxloom.symbolic_trace(Scaled())
    graph = gm.graph
    output = next(iter(graph.find_nodes(op="output")))
    with graph.inserting_before(output):
        lin = graph.get_attr("lin")
        graph.call_method("double", (lin,))
    gm.recompile()
    with pytest.raises(SerializationError, match="cannot save.*reads the module 'lin'"):
        fxloom.save(gm, io.BytesIO())
