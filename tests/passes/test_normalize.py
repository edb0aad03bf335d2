"""Argument normalization (``fxloom.passes.normalize``): keyword arguments from signatures."""

from __future__ import annotations

import inspect
import operator
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import fxloom
from fxloom import zoo
from fxloom.ops import signatures
from fxloom.passes.normalize import NormalizeArgs, normalize_args, normalized_arguments


def normalized_line(fn, *, fill_defaults: bool = False, inputs: int = 2) -> str:
    """The generated line of the first operation of ``fn`` after normalization."""
    names = ["x", "y", "z"][:inputs]
    namespace = {"torch": torch, "F": F, "operator": operator}
    exec(f"def traced({', '.join(names)}):\n    return {fn}", namespace)  # noqa: S102
    gm = normalize_args(fxloom.symbolic_trace(namespace["traced"]), fill_defaults=fill_defaults)
    first = gm.code.strip().splitlines()[1].strip()
    return first.split(" = ", 1)[1].split(";")[0]


# ------------------------------------------------------------------ exact examples
@pytest.mark.parametrize(
    "call, expected",
    [
        ("torch.add(x, y, alpha=2)", "torch.add(input=x, other=y, alpha=2)"),
        ("torch.add(x, y)", "torch.add(input=x, other=y)"),
        (
            "F.conv2d(x, y, None, 1, 1)",
            "torch.conv2d(input=x, weight=y, bias=None, stride=1, padding=1)",
        ),
        ("F.linear(x, y)", "torch._C._nn.linear(input=x, weight=y)"),
        ("F.relu(x)", "torch.nn.functional.relu(input=x, inplace=False)"),  # traced with inplace
        ("torch.cat([x, y], 1)", "torch.cat(tensors=[x, y], dim=1)"),
        ("torch.where(x, x, y)", "torch.where(condition=x, input=x, other=y)"),
        ("x.transpose(1, 2)", "x.transpose(dim0=1, dim1=2)"),
        ("x.sum(1)", "x.sum(dim=1)"),
        ("x.std(1)", "x.std(dim=1)"),
        ("x.to(torch.float16)", "x.to(dtype=torch.float16)"),
        ("torch.max(x, 1)", "torch.max(input=x, dim=1)"),
        ("torch.arange(5)", "torch.arange(end=5)"),
    ],
)
def test_positional_arguments_become_keywords(call, expected):
    assert normalized_line(call) == expected


@pytest.mark.parametrize(
    "call, why",
    [
        ("x.view(2, -1)", "the sizes are *args (and view has a dtype overload)"),
        ("x.permute(1, 0)", "the dims are *args"),
        ("x.view(-1)", "size or dtype: the overloads disagree"),
        ("torch.max(x, y)", "y is `other` if a tensor but `dim` if an int"),
        ("x.to(y)", "y may be a tensor, a dtype or a device"),
        ("torch.add(x, 2, y)", "the deprecated add(input, alpha, other) of the Python binding"),
        ("operator.add(x, y)", "positional-only parameters"),
        ("x + y", "positional-only parameters"),
        ("torch.functional.einsum('ij->ji', x)", "operands are *args"),
        ("x.split(2)", "str.split exists: the receiver may not be a tensor"),
    ],
)
def test_calls_whose_keyword_form_is_uncertain_stay_as_they_are(call, why):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.add(x, 2, y) warns of its deprecation
        assert normalized_line(call) == call.replace("operator.add(x, y)", "x + y"), why


def test_a_method_named_like_a_str_method_is_normalized_when_meta_says_tensor():
    gm = fxloom.symbolic_trace(lambda x: x.split(2))
    x = gm.graph.find_nodes(op="placeholder")[0]
    x.meta["type"] = torch.Tensor  # as ShapeProp records it
    normalize_args(gm)
    assert "split = x.split(split_size=2)" in gm.code


def test_meta_type_saying_not_a_tensor_leaves_the_method_alone():
    gm = fxloom.symbolic_trace(lambda x: x.transpose(0, 1))
    gm.graph.find_nodes(op="placeholder")[0].meta["type"] = tuple
    normalize_args(gm)
    assert "x.transpose(0, 1)" in gm.code


def test_user_functions_get_keywords_and_keep_positional_only_parameters():
    def scale(value, /, factor, *, offset=0.0):
        return value * factor + offset

    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(scale, (x, 2.0), {"offset": 1.0}))
    gm = normalize_args(fxloom.GraphModule(nn.Module(), g))
    (node,) = gm.graph.find_nodes(op="call_function")
    assert node.args == (x,)
    assert dict(node.kwargs) == {"factor": 2.0, "offset": 1.0}
    assert_close(gm(torch.ones(1)), torch.full((1,), 3.0))


def test_module_calls_get_the_names_of_forward():
    gm = normalize_args(fxloom.symbolic_trace(nn.Sequential(nn.Linear(2, 2))))
    assert '_0 = getattr(self, "0")(input=input_1)' in gm.code


def test_modules_with_forward_hooks_are_left_alone():
    model = nn.Sequential(nn.Linear(2, 2))
    model[0].register_forward_pre_hook(lambda module, args: None)
    gm = normalize_args(fxloom.symbolic_trace(model))
    assert '_0 = getattr(self, "0")(input_1)' in gm.code


def test_guards_are_left_as_written():
    gm = fxloom.symbolic_trace(
        lambda x: x.sum(1), concrete_args=None, example_inputs=(torch.ones(2, 3),)
    )
    guards_before = [
        (n.args, dict(n.kwargs))
        for n in gm.graph.nodes
        if n.is_impure() and n.op == "call_function"
    ]
    normalize_args(gm)
    assert [
        (n.args, dict(n.kwargs))
        for n in gm.graph.nodes
        if n.is_impure() and n.op == "call_function"
    ] == guards_before


def test_the_signature_table_can_be_extended(monkeypatch):
    def wrapper(*args, **kwargs):
        return torch.clamp(*args, **kwargs)

    def clamp_signature(input, min=None, max=None):  # noqa: A002 - torch's names
        ...

    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(wrapper, (x, 0.0, 1.0)))
    gm = fxloom.GraphModule(nn.Module(), g)
    assert normalize_args(gm).graph.find_nodes(op="call_function")[0].args == (x, 0.0, 1.0)
    monkeypatch.setitem(signatures.SIGNATURES, wrapper, clamp_signature)
    (node,) = normalize_args(gm).graph.find_nodes(op="call_function")
    assert dict(node.kwargs) == {"input": x, "min": 0.0, "max": 1.0}


def test_a_signature_object_can_be_registered_too(monkeypatch):
    def wrapper(*args, **kwargs):
        return args[0] + kwargs.get("bias", args[1] if len(args) > 1 else 0)

    signature = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("x", "bias")]
    )
    monkeypatch.setitem(signatures.SIGNATURES, wrapper, signature)
    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(wrapper, (x, 1.0)))
    (node,) = normalize_args(fxloom.GraphModule(nn.Module(), g)).graph.find_nodes(
        op="call_function"
    )
    assert dict(node.kwargs) == {"x": x, "bias": 1.0}


# ------------------------------------------------------------------ defaults
@pytest.mark.parametrize(
    "call, expected",
    [
        ("F.relu(x)", "torch.nn.functional.relu(input=x, inplace=False)"),
        (
            "F.conv2d(x, y, None, 1, 1)",
            "torch.conv2d(input=x, weight=y, bias=None, stride=1, padding=1, dilation=[1, 1], "
            "groups=1)",
        ),
        ("torch.addmm(x, x, y)", "torch.addmm(input=x, mat1=x, mat2=y, beta=1, alpha=1)"),
    ],
)
def test_fill_defaults_writes_in_the_defaults_in_signature_order(call, expected):
    assert normalized_line(call, fill_defaults=True) == expected


def test_private_defaults_are_not_written_in():
    def helper(x, scale=2.0, _stacklevel=3):
        return x * scale

    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(helper, (x,)))
    gm = normalize_args(fxloom.GraphModule(nn.Module(), g), fill_defaults=True)
    assert dict(gm.graph.find_nodes(op="call_function")[0].kwargs) == {"x": x, "scale": 2.0}


# ------------------------------------------------------------------ NormalizeArgs
def test_normalize_args_transformer_returns_a_new_module_and_fills_defaults():
    gm = fxloom.symbolic_trace(lambda x: F.relu(x) + 1)
    before = gm.code
    new = NormalizeArgs(gm).transform()
    assert "torch.nn.functional.relu(input=x, inplace=False)" in new.code
    assert gm.code == before


def test_normalize_args_transformer_can_keep_positional_arguments():
    gm = fxloom.symbolic_trace(lambda x: F.relu(x))
    new = NormalizeArgs(gm, normalize_to_only_use_kwargs=False).transform()
    assert "torch.nn.functional.relu(x, inplace=False)" in new.code


def test_keeping_positional_arguments_never_repeats_one_as_a_default():
    def scale(x, factor=2.0, *, shift=0.0):
        return x * factor + shift

    g = fxloom.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(scale, (x, 3.0)))
    gm = fxloom.GraphModule(nn.Module(), g)
    new = NormalizeArgs(gm, normalize_to_only_use_kwargs=False).transform()
    (node,) = new.graph.find_nodes(op="call_function")
    assert node.args[1:] == (3.0,) and dict(node.kwargs) == {"shift": 0.0}
    assert_close(new(torch.ones(1)), torch.full((1,), 3.0))


# ------------------------------------------------------------------ meta and names
def test_names_and_meta_are_unchanged():
    gm = fxloom.symbolic_trace(lambda x: torch.add(x, x).transpose(0, 1))
    before = [(node.name, dict(node.meta)) for node in gm.graph.nodes]
    normalize_args(gm)
    assert [(node.name, dict(node.meta)) for node in gm.graph.nodes] == before


def test_returns_the_module_it_edited_in_place():
    gm = fxloom.symbolic_trace(lambda x: torch.add(x, x))
    assert normalize_args(gm) is gm


# ------------------------------------------------------------------ real models
@pytest.mark.parametrize("name", ["mlp_tiny", "resnet_tiny", "transformer_tiny"])
@pytest.mark.parametrize("fill_defaults", [False, True])
def test_zoo_models_compute_what_eager_does(name, fill_defaults):
    model, inputs = zoo.build(name)
    gm = normalize_args(fxloom.symbolic_trace(model), fill_defaults=fill_defaults)
    gm.graph.lint()
    with torch.no_grad():
        assert_close(gm(*inputs), model(*inputs))


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_hugging_face_models_compute_what_eager_does(name, traced_hf):
    hf = traced_hf(name)
    gm = hf.gm
    before = gm.code
    normalize_args(gm, fill_defaults=True)
    gm.graph.lint()
    assert gm.code != before
    with torch.no_grad():
        assert_close(gm(**hf.inputs)[0], hf.eager()[0])


# ------------------------------------------------------------------ bad input
def test_refuses_what_is_not_a_graph_module():
    with pytest.raises(TypeError, match="normalize_args works on an fxloom.GraphModule"):
        normalize_args(lambda x: x)


def test_checking_a_call_against_torch_does_not_run_it():
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    g = fxloom.Graph()
    g.output(g.call_function(torch.arange, (10**6,)))
    gm = fxloom.GraphModule(nn.Module(), g)
    with Spy():
        normalize_args(gm)
    assert "torch.arange(end=1000000)" in gm.code
    assert seen == []


def test_a_keyword_form_torch_refuses_is_not_used():
    # The schema says zeros(SymInt[] size); torch's binding takes an int only positionally.
    g = fxloom.Graph()
    g.output(g.call_function(torch.zeros, (3,)))
    gm = normalize_args(fxloom.GraphModule(nn.Module(), g))
    assert "torch.zeros(3)" in gm.code
    assert_close(gm(), torch.zeros(3))


# ---------------------------------------------------------------- normalized_arguments
class _Calls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = torch.add(self.conv(x), 1, alpha=2)
        w = self.linear(y.mean((2, 3)))
        return F.relu(w, inplace=False) + torch.sum(w, 1)[:, None]


def _printed(pair):
    return (
        None
        if pair is None
        else (tuple(map(str, pair.args)), {k: str(v) for k, v in pair.kwargs.items()})
    )


@pytest.mark.parametrize("only_kwargs", [False, True])
def test_normalized_arguments_are_torch_fx_s_where_it_finds_them(only_kwargs):
    """``normalized_arguments(node, root)`` as torch.fx's ``node.normalized_arguments(root)``,
    node by node; where torch.fx gives up (overloads it cannot tell apart) fxloom answers
    only when they agree on the layout."""
    import torch.fx

    ours, theirs = fxloom.symbolic_trace(_Calls()), torch.fx.symbolic_trace(_Calls())
    compared = 0
    for mine, other in zip(ours.graph.nodes, theirs.graph.nodes, strict=True):
        assert mine.name == other.name
        got = normalized_arguments(mine, ours, normalize_to_only_use_kwargs=only_kwargs)
        try:
            expected = other.normalized_arguments(theirs, normalize_to_only_use_kwargs=only_kwargs)
        except RuntimeError:  # torch.fx: "the schema match was ambiguous"
            continue
        assert _printed(got) == _printed(expected), mine.name
        compared += expected is not None
    assert compared >= 3  # four on torch 2.13; torch 2.11's torch.fx answers one node fewer


def test_normalized_arguments_fill_defaults_and_keep_the_node_as_it_is():
    gm = fxloom.symbolic_trace(_Calls())
    (add,) = gm.graph.find_nodes(op="call_function", target=torch.add)
    before = (add.args, dict(add.kwargs))
    pair = normalized_arguments(add, gm, normalize_to_only_use_kwargs=True)
    assert list(pair.kwargs) == ["input", "other", "alpha"] and pair.args == ()
    assert (add.args, dict(add.kwargs)) == before
    (output,) = gm.graph.find_nodes(op="output")
    assert normalized_arguments(output, gm) is None  # not a call
