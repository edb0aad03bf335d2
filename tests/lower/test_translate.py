"""Translating fxloom graphs to ONNX (``fxloom.lower.translate``) and writing files (``to_onnx``).

Every operator of the coverage list runs in a tiny module that is traced, translated, checked by
``onnx.checker`` and run by ONNX Runtime on the CPU; the result must match eager PyTorch (rtol
1e-4, atol 1e-5). The same holds for exported programs (ATen operators), the embedded reference
models and Hugging Face models from tiny configs, whose files are reloaded from disk.
"""

from __future__ import annotations

import operator
import subprocess
import sys
from pathlib import Path

import pytest

onnxruntime = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import fxloom  # noqa: E402
import fxloom.export  # noqa: E402
from fxloom import zoo  # noqa: E402
from fxloom.lower import (  # noqa: E402
    ONNX_TRANSLATIONS,
    UnsupportedNodeError,
    to_onnx,
    translate,
    unsupported_reason,
)

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is not installed; import it from the checkout
    sys.path.insert(0, str(ROOT))

RTOL, ATOL = 1e-4, 1e-5


def run_onnx(model_proto_or_path, inputs: dict) -> list:
    source = model_proto_or_path
    if isinstance(source, onnx.ModelProto):
        source = source.SerializeToString()
    session = onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])
    feeds = {name: value.numpy() for name, value in inputs.items()}
    return [torch.from_numpy(out) for out in session.run(None, feeds)]


def flat_tensors(value) -> list[torch.Tensor]:
    return [v for v in fxloom.pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def input_feeds(gm, example_inputs) -> dict:
    """The ONNX inputs by name: the placeholders that hold tensors, in order."""
    names = [str(n.target).lstrip("*") for n in gm.graph.nodes if n.op == "placeholder"]
    if isinstance(example_inputs, dict):
        return {k: v for k, v in example_inputs.items() if isinstance(v, torch.Tensor)}
    return {n: v for n, v in zip(names, example_inputs) if isinstance(v, torch.Tensor)}


def assert_translates(fn, *inputs):
    """Trace ``fn``, translate it, run it with ONNX Runtime: the same values as eager."""
    # In-place operators recorded as written (operator.iadd), so their translation is tested.
    gm = fxloom.symbolic_trace(fn, example_inputs=inputs, record_inplace_operators=True)
    proto = translate(gm, inputs)
    onnx.checker.check_model(proto, full_check=True)
    expected = flat_tensors(fn(*inputs))
    actual = run_onnx(proto, input_feeds(gm, inputs))
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    return proto


# Example tensors come from a generator of their own: the tests leave torch's global one alone.
GENERATOR = torch.Generator().manual_seed(0)


def x4(*shape):
    """A random float tensor, (2, 3, 8, 8) by default."""
    return torch.randn(*(shape or (2, 3, 8, 8)), generator=GENERATOR)


# (id, module or function, example inputs)
OPERATORS = [
    ("conv2d", nn.Conv2d(3, 4, 3, stride=2, padding=1), (x4(),)),
    (
        "conv2d_groups_dilation",
        nn.Conv2d(4, 4, 3, groups=2, dilation=2, bias=False),
        (x4(1, 4, 9, 9),),
    ),
    ("conv2d_same", nn.Conv2d(3, 2, 4, padding="same"), (x4(),)),
    ("conv1d", nn.Conv1d(3, 5, 3), (x4(2, 3, 10),)),
    ("F.conv2d", lambda x, w: F.conv2d(x, w, padding=1), (x4(), x4(4, 3, 3, 3))),
    ("linear_2d", nn.Linear(8, 5), (x4(3, 8),)),
    ("linear_3d", nn.Linear(8, 5), (x4(2, 3, 8),)),
    (
        "F.linear",
        lambda x, w, b: F.linear(x, w, b),
        (x4(2, 3, 8), x4(5, 8), x4(5)),
    ),
    ("matmul", lambda a, b: a @ b, (x4(2, 3, 4), x4(2, 4, 5))),
    ("torch.matmul_broadcast", lambda a, b: torch.matmul(a, b), (x4(2, 3, 4), x4(4, 5))),
    ("bmm", lambda a, b: torch.bmm(a, b), (x4(2, 3, 4), x4(2, 4, 5))),
    ("add", lambda a, b: a + b, (x4(2, 3), x4(3))),
    ("add_scalar", lambda a: 1 + a, (x4(2, 3),)),
    ("add_alpha", lambda a, b: torch.add(a, b, alpha=2), (x4(2, 3), x4(2, 3))),
    ("sub", lambda a, b: a - b, (x4(2, 3), x4(2, 3))),
    ("rsub_scalar", lambda a: 1.5 - a, (x4(2, 3),)),
    ("mul", lambda a, b: a.mul(b), (x4(2, 3), x4(2, 3))),
    ("div", lambda a, b: a / b, (x4(2, 3), x4(2, 3).abs() + 1)),
    ("div_floor", lambda a: torch.div(a, 0.7, rounding_mode="floor"), (x4(2, 3),)),
    ("pow", lambda a: a.abs() ** 1.5, (x4(2, 3),)),
    ("int_plus_float", lambda a: a + 0.5, (torch.arange(6).reshape(2, 3),)),
    ("neg", lambda a: -a, (x4(2, 3),)),
    ("min_max_of_two", lambda a, b: torch.min(a, b) + 2 * torch.max(a, b), (x4(2, 3), x4(3))),
    (
        "zeros_like_full_like",
        lambda a: torch.maximum(a, torch.zeros_like(a)) + torch.full_like(a, 2.0),
        (x4(2, 3),),
    ),
    ("relu", lambda x: torch.relu(x), (x4(),)),
    ("relu_module", nn.ReLU(), (x4(),)),
    ("sigmoid", lambda x: torch.sigmoid(x), (x4(),)),
    ("tanh", nn.Tanh(), (x4(),)),
    ("exp_log", lambda x: torch.log(torch.exp(x) + 1), (x4(),)),
    ("sqrt_rsqrt", lambda x: x.abs().sqrt() + torch.rsqrt(x.abs() + 1), (x4(),)),
    ("gelu", lambda x: F.gelu(x), (x4(),)),
    ("gelu_tanh", nn.GELU(approximate="tanh"), (x4(),)),
    ("silu", nn.SiLU(), (x4(),)),
    ("mish", nn.Mish(), (x4(),)),
    ("softplus", lambda x: F.softplus(x), (x4(),)),
    ("hardswish", nn.Hardswish(), (x4(),)),
    ("hardsigmoid", nn.Hardsigmoid(), (x4(),)),
    ("leaky_relu", nn.LeakyReLU(0.2), (x4(),)),
    ("elu", nn.ELU(), (x4(),)),
    ("relu6", nn.ReLU6(), (x4() * 5,)),
    ("hardtanh", lambda x: F.hardtanh(x), (x4() * 2,)),
    ("clamp", lambda x: x.clamp(-0.5, 0.5), (x4(),)),
    ("clamp_min", lambda x: torch.clamp(x, min=0.1), (x4(),)),
    ("erf", lambda x: torch.erf(x), (x4(),)),
    ("abs_sin_cos", lambda x: x.abs() + x.sin() * x.cos(), (x4(),)),
    ("compare", lambda a, b: (a > b) & (a <= 0.5), (x4(2, 3), x4(2, 3))),
    ("eq_ne", lambda a: (a == 1) | (a != 2), (torch.arange(6),)),
    ("where", lambda a, b: torch.where(a > 0, a, b), (x4(2, 3), x4(2, 3))),
    ("masked_fill", lambda a: a.masked_fill(a < 0, -1e4), (x4(2, 3),)),
    ("maxpool2d", nn.MaxPool2d(3, stride=2, padding=1), (x4(),)),
    ("maxpool2d_ceil", nn.MaxPool2d(2, ceil_mode=True), (x4(1, 3, 7, 7),)),
    ("avgpool2d", nn.AvgPool2d(2), (x4(),)),
    ("avgpool2d_pad", nn.AvgPool2d(3, 1, 1, count_include_pad=False), (x4(),)),
    ("F.max_pool2d", lambda x: F.max_pool2d(x, 2), (x4(),)),
    ("adaptive_avgpool_1x1", nn.AdaptiveAvgPool2d((1, 1)), (x4(),)),
    ("adaptive_avgpool_2x2", nn.AdaptiveAvgPool2d(2), (x4(),)),
    ("F.adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 1), (x4(),)),
    ("batchnorm2d", nn.BatchNorm2d(3), (x4(),)),
    ("batchnorm1d", nn.BatchNorm1d(3), (x4(4, 3),)),
    ("layernorm", nn.LayerNorm(8), (x4(2, 5, 8),)),
    ("layernorm_2d_no_affine", nn.LayerNorm([5, 8], elementwise_affine=False), (x4(2, 5, 8),)),
    ("F.layer_norm", lambda x: F.layer_norm(x, (8,)), (x4(2, 5, 8),)),
    ("groupnorm", nn.GroupNorm(2, 4), (x4(2, 4, 5, 5),)),
    ("softmax", lambda x: x.softmax(dim=-1), (x4(2, 3, 5),)),
    ("F.softmax", lambda x: F.softmax(x, dim=1), (x4(2, 3, 5),)),
    ("softmax_module", nn.Softmax(dim=-1), (x4(2, 3, 5),)),
    ("log_softmax", lambda x: F.log_softmax(x, -1), (x4(2, 3, 5),)),
    ("view", lambda x: x.view(2, -1), (x4(2, 3, 4),)),
    ("view_tuple", lambda x: x.view((6, 4)), (x4(2, 3, 4),)),
    ("view_size_of_input", lambda x: x.view(x.size(0), -1), (x4(2, 3, 4),)),
    ("reshape", lambda x: torch.reshape(x, (4, 6)), (x4(2, 3, 4),)),
    ("permute", lambda x: x.permute(2, 0, 1), (x4(2, 3, 4),)),
    ("transpose", lambda x: x.transpose(-1, -2), (x4(2, 3, 4),)),
    ("t", lambda x: x.t(), (x4(3, 4),)),
    ("flatten", lambda x: torch.flatten(x, 1), (x4(),)),
    ("flatten_middle", lambda x: x.flatten(1, 2), (x4(),)),
    ("flatten_module", nn.Flatten(), (x4(),)),
    ("contiguous", lambda x: x.transpose(0, 1).contiguous(), (x4(2, 3),)),
    ("unsqueeze_squeeze", lambda x: x.unsqueeze(1).squeeze(1).unsqueeze(-1), (x4(2, 3),)),
    ("expand", lambda x: x.expand(2, 3, 4), (x4(3, 1),)),
    ("expand_minus_one", lambda x: x.expand(4, -1, -1), (x4(1, 3, 2),)),
    ("expand_as", lambda x, y: x.expand_as(y), (x4(3, 1), x4(3, 5))),
    ("repeat", lambda x: x.repeat(2, 1, 3), (x4(3, 2),)),
    ("cat", lambda a, b: torch.cat([a, b], dim=1), (x4(2, 3), x4(2, 4))),
    ("cat_axis_keyword", lambda a, b: torch.cat([a, b], axis=1), (x4(2, 3), x4(2, 4))),
    ("stack", lambda a, b: torch.stack([a, b], -1), (x4(2, 3), x4(2, 3))),
    ("split", lambda x: torch.split(x, 2, dim=1)[2], (x4(2, 5),)),
    ("split_sections", lambda x: x.split([1, 4], 1)[1], (x4(2, 5),)),
    ("chunk", lambda x: x.chunk(3, dim=-1)[1] * 2, (x4(2, 7),)),
    ("chunk_all", lambda x: x.chunk(2, -1), (x4(2, 6),)),
    ("unbind", lambda x: x.unbind(1)[1], (x4(2, 3),)),
    ("getitem_slice", lambda x: x[:, 1:3], (x4(2, 5),)),
    ("getitem_int", lambda x: x[:, 0], (x4(2, 5, 3),)),
    ("getitem_ellipsis_none", lambda x: x[..., None, 1:], (x4(2, 5, 3),)),
    ("getitem_step", lambda x: x[::2, -3:], (x4(5, 5),)),
    ("select_negative", lambda x: x[-1], (x4(4, 3),)),
    ("mean", lambda x: x.mean(dim=(-1, -2), keepdim=True), (x4(),)),
    ("mean_all", lambda x: torch.mean(x), (x4(),)),
    ("sum", lambda x: x.sum(1), (x4(),)),
    ("sum_bool", lambda x: (x > 0).sum(-1), (x4(2, 5),)),
    ("amax", lambda x: torch.amax(x, -1), (x4(2, 5),)),
    ("argmax", lambda x: x.argmax(-1), (x4(2, 5),)),
    ("cumsum", lambda x: torch.cumsum(x, dim=1), (x4(2, 5),)),
    ("embedding", nn.Embedding(10, 4), (torch.tensor([[1, 2, 9], [0, 3, 3]]),)),
    ("F.embedding", lambda i, w: F.embedding(i, w), (torch.tensor([1, 2]), x4(4, 3))),
    (
        "sdpa",
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        (x4(2, 2, 5, 4), x4(2, 2, 6, 4), x4(2, 2, 6, 4)),
    ),
    (
        "sdpa_causal",
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (x4(2, 2, 5, 4), x4(2, 2, 5, 4), x4(2, 2, 5, 4)),
    ),
    (
        "sdpa_bool_mask",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        (x4(1, 2, 3, 4), x4(1, 2, 3, 4), x4(1, 2, 3, 4), torch.tensor([[True, True, False]] * 3)),
    ),
    (
        "sdpa_float_mask_scale",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3),
        (x4(1, 2, 3, 4), x4(1, 2, 3, 4), x4(1, 2, 3, 4), x4(3, 3)),
    ),
    ("to_dtype", lambda x: x.to(torch.float16).float(), (x4(2, 3),)),
    ("type_as", lambda x, i: i.type_as(x) + x, (x4(2, 3), torch.ones(2, 3, dtype=torch.long))),
    ("long", lambda x: (x * 4).long(), (x4(2, 3),)),
    ("dropout_eval", nn.Dropout(0.5).eval(), (x4(2, 3),)),
    ("identity", nn.Identity(), (x4(2, 3),)),
    ("F.dropout_eval", lambda x: F.dropout(x, 0.3, training=False), (x4(2, 3),)),
    ("arange_folded", lambda x: x + torch.arange(x.shape[-1]), (x4(2, 3),)),
    ("einsum", lambda a, b: torch.einsum("bij,bjk->bik", a, b), (x4(2, 3, 4), x4(2, 4, 2))),
    ("tuple_output", lambda x: (x.relu(), x.sigmoid()), (x4(2, 3),)),
    ("pad_constant", lambda x: F.pad(x, (1, 2), value=0.5), (x4(2, 3, 4),)),
    ("pad_reflect_2d", lambda x: F.pad(x, (1, 1, 2, 0), mode="reflect"), (x4(),)),
    ("pad_replicate", lambda x: F.pad(x, (0, 1, 1, 0), mode="replicate"), (x4(),)),
    ("gather", lambda x, i: torch.gather(x, 1, i), (x4(2, 3), torch.tensor([[0, 2], [1, 1]]))),
    ("index_select", lambda x, i: x.index_select(1, i), (x4(2, 3), torch.tensor([2, 0]))),
    (
        "baddbmm",
        lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0),
        (x4(2, 3, 5), x4(2, 3, 4), x4(2, 4, 5)),
    ),
    ("norm", lambda x: x.norm(dim=-1, keepdim=True), (x4(2, 3),)),
    ("topk", lambda x: torch.topk(x, 2).values, (x4(2, 5),)),
    ("iadd", lambda x, y: operator.iadd(x * 1, y), (x4(2, 3), x4(2, 3))),
    ("new_ones", lambda x: x.new_ones(2, 3) + x, (x4(2, 3),)),
    ("new_full", lambda x: x.new_full((2, 3), 7.0) * x, (x4(2, 3),)),
    ("list_index", lambda x: x[[0, 2]], (x4(3, 4),)),
    # Integer floor division rounds toward minus infinity, as Python's // does.
    ("int_floordiv", lambda x: x // 2, (torch.tensor([-7, -4, -1, 0, 3, 7]),)),
    ("int_div_floor", lambda x: torch.div(x, 3, rounding_mode="floor"), (torch.tensor([-7, 5]),)),
    (
        "int_floor_divide",
        lambda x, y: torch.floor_divide(x, y),
        (torch.tensor([-7, 7]), torch.tensor([2, -2])),
    ),
]


@pytest.mark.parametrize(
    "fn, inputs", [pytest.param(fn, inputs, id=name) for name, fn, inputs in OPERATORS]
)
def test_operator_translation_matches_eager(fn, inputs):
    if isinstance(fn, nn.Module):
        fn.eval()
    with torch.no_grad():
        assert_translates(fn, *inputs)


# ---- exported programs (ATen operators) -------------------------------------------------------


class CausalAttention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


EXPORTED = [
    (
        "conv_bn_relu_pools_linear",
        nn.Sequential(
            nn.Conv2d(3, 4, 3),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.AvgPool2d(1),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, 3),
        ),
        (x4(),),
    ),
    (
        "layernorm_gelu_softmax",
        nn.Sequential(nn.LayerNorm(8), nn.GELU(), nn.Softmax(-1)),
        (x4(2, 3, 8),),
    ),
    ("embedding", nn.Embedding(10, 4), (torch.tensor([[1, 2], [3, 4]]),)),
    ("attention", CausalAttention(), (x4(1, 2, 4, 8), x4(1, 2, 4, 8), x4(1, 2, 4, 8))),
    ("groupnorm", nn.GroupNorm(2, 4), (x4(2, 4, 3, 3),)),
]


@pytest.mark.parametrize("model, inputs", [pytest.param(m, i, id=name) for name, m, i in EXPORTED])
def test_exported_program_translation_matches_eager(model, inputs):
    model.eval()
    program = fxloom.export.export(model, inputs)
    proto = translate(program, inputs)
    onnx.checker.check_model(proto, full_check=True)
    (actual,) = run_onnx(proto, dict(zip([i.name for i in proto.graph.input], inputs)))
    with torch.no_grad():
        torch.testing.assert_close(actual, model(*inputs), rtol=RTOL, atol=ATOL)


def test_exported_program_weights_become_initializers_only_when_read():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).eval()
    inputs = (x4(2, 4),)
    proto = translate(fxloom.export.export(model, inputs), inputs)
    initializers = {init.name for init in proto.graph.initializer}
    assert "b_1_num_batches_tracked" not in initializers  # read by no node
    assert [i.name for i in proto.graph.input] == ["input"]


# ---- whole models, written by to_onnx and reloaded from the file ------------------------------


def assert_file_matches_eager(path, model, inputs: dict, fixed: dict | None = None):
    """Run the ONNX file at ``path`` with ONNX Runtime: the eager model's outputs."""
    with torch.no_grad():
        expected = flat_tensors(model(**inputs, **(fixed or {})))
    actual = run_onnx(str(path), inputs)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["resnet_tiny", "resnet50", "transformer_tiny"])
def test_zoo_model_file_runs_in_onnxruntime(name, tmp_path):
    model, inputs = zoo.build(name)
    model.eval()
    if name == "resnet50":
        inputs = tuple(t[:1] for t in inputs)  # batch 1
    path = tmp_path / f"{name}.onnx"
    to_onnx(model, inputs, path)
    names = [i.name for i in onnx.load(str(path)).graph.input]
    assert_file_matches_eager(path, lambda **kw: model(*kw.values()), dict(zip(names, inputs)))


def test_dynamic_batch_file_runs_at_another_batch(tmp_path):
    model, inputs = zoo.build("resnet_tiny")
    model.eval()
    path = tmp_path / "resnet_tiny.onnx"
    proto = to_onnx(model, inputs, path, dynamic_batch=True)
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    bigger = x4(5, *inputs[0].shape[1:])
    assert_file_matches_eager(path, lambda x: model(x), {"x": bigger})


def test_dynamic_batch_refuses_an_input_whose_dim_0_is_not_the_batch():
    model, inputs = zoo.build("transformer_tiny")  # its second input is a (seq, seq) mask
    gm = fxloom.symbolic_trace(model.eval(), example_inputs=inputs)
    with pytest.raises(ValueError, match="dimension 0 of every input"):
        translate(gm, inputs, dynamic_batch=True)


HF_MODELS = ["bert", "distilbert", "gpt2", "vit", "t5", "llama", "clip", "whisper"]


def hf_traced(name):
    pytest.importorskip("transformers")
    from benchmarks.zoo.methods import fixed_args
    from benchmarks.zoo.registry import get

    spec = get(name)
    model, inputs = spec.build()
    fixed = fixed_args(model, inputs)
    return spec, model, inputs, fixed, fxloom.symbolic_trace(model, fixed, example_inputs=inputs)


@pytest.mark.parametrize("name", HF_MODELS)
def test_hugging_face_model_file_runs_in_onnxruntime(name, tmp_path):
    _, model, inputs, fixed, gm = hf_traced(name)
    to_onnx(gm, inputs, tmp_path / "model.onnx")
    assert_file_matches_eager(tmp_path / "model.onnx", model, inputs, fixed)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_hugging_face_dynamic_batch_file_runs_at_another_batch(name, tmp_path):
    spec, model, inputs, fixed, gm = hf_traced(name)
    to_onnx(gm, inputs, tmp_path / "model.onnx", dynamic_batch=True)
    other = spec.make_inputs(spec.example[0] + 3, spec.example[1])
    assert_file_matches_eager(tmp_path / "model.onnx", model, other, fixed)


def test_same_outputs_as_torch_onnx_export(tmp_path):
    model, inputs = zoo.build("resnet_tiny")
    model.eval()
    to_onnx(model, inputs, tmp_path / "fxloom.onnx")
    torch.onnx.export(model, inputs, str(tmp_path / "torch.onnx"), dynamo=False)
    (ours,) = run_onnx(str(tmp_path / "fxloom.onnx"), {"x": inputs[0]})
    torch_input = onnx.load(str(tmp_path / "torch.onnx")).graph.input[0].name
    (theirs,) = run_onnx(str(tmp_path / "torch.onnx"), {torch_input: inputs[0]})
    torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=ATOL)


# ---- errors, the table, and onnx missing -----------------------------------------------------


class SortsInTheMiddle(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        z = torch.sort(y, dim=-1).values
        return torch.sigmoid(z)


def test_unsupported_node_makes_to_onnx_raise_naming_it_and_its_line(tmp_path):
    path = tmp_path / "never.onnx"
    with pytest.raises(UnsupportedNodeError) as raised:
        to_onnx(SortsInTheMiddle(), (x4(2, 3),), path)
    message = str(raised.value)
    assert "%sort (torch.sort): no ONNX translation" in message
    assert "test_translate.py" in message and "torch.sort(y, dim=-1)" in message
    assert [node.name for node, _ in raised.value.nodes] == ["sort"]
    assert not path.exists()


def test_unsupported_reason_is_none_for_supported_nodes():
    gm = fxloom.symbolic_trace(SortsInTheMiddle())
    reasons = {n.name: unsupported_reason(n, gm) for n in gm.graph.nodes}
    assert reasons["relu"] is None and reasons["sigmoid"] is None
    assert "no ONNX translation for torch.sort" in reasons["sort"]


def test_unsupported_reason_names_training_mode():
    gm = fxloom.symbolic_trace(nn.Sequential(nn.BatchNorm2d(3)).train())
    (bn,) = [n for n in gm.graph.nodes if n.op == "call_module"]
    assert "training mode" in unsupported_reason(bn, gm)


def test_users_extend_the_table(monkeypatch):
    def translate_sort(ctx, node, args, kwargs):  # the k smallest, k = the whole last dim
        k = ctx.constant([ctx.shape_of(args[0])[-1]])
        return ctx.node("TopK", [ctx.name(args[0]), k], outputs=2, largest=0)

    monkeypatch.setitem(ONNX_TRANSLATIONS, torch.sort, translate_sort)
    assert_translates(SortsInTheMiddle(), x4(2, 5))


def test_import_without_onnx_works_and_the_error_names_the_extra():
    script = (
        "import sys; sys.modules['onnx'] = None; sys.modules['onnxruntime'] = None\n"
        "import torch, fxloom, fxloom.lower\n"
        "try:\n"
        "    fxloom.lower.translate(fxloom.symbolic_trace(torch.nn.ReLU()), (torch.ones(1),))\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert "pip install fxloom[onnx]" in result.stdout


def test_flags_and_dtypes_read_from_tensors_are_supported_where_they_are_folded():
    gm = fxloom.symbolic_trace(lambda x: x.to(x.dtype) * (x.dim() == 2), example_inputs=(x4(2, 3),))
    fxloom.passes.shape_prop.ShapeProp(gm).propagate(x4(2, 3))
    reasons = {n.name: unsupported_reason(n, gm) for n in gm.graph.nodes}
    assert set(reasons.values()) == {None}


@pytest.mark.parametrize(
    "fn, reason",
    [
        pytest.param(lambda x: F.dropout(x, 0.5), "dropout with training=True", id="dropout_on"),
        pytest.param(lambda x: x[x > 0], "a boolean mask index", id="boolean_mask"),
        pytest.param(
            lambda x: x[torch.tensor([0, 1]), 1:], "mixes tensors with slices", id="mixed_index"
        ),
    ],
)
def test_unsupported_reason_names_the_argument_a_handler_refuses(fn, reason):
    gm = fxloom.symbolic_trace(fn, example_inputs=(x4(3, 4),))
    fxloom.passes.shape_prop.ShapeProp(gm).propagate(x4(3, 4))
    reasons = [unsupported_reason(n, gm) for n in gm.graph.nodes]
    assert any(r is not None and reason in r for r in reasons), reasons
    with pytest.raises(UnsupportedNodeError, match=reason):
        translate(gm, (x4(3, 4),))


def test_a_weight_read_twice_is_stored_once():
    class EmbedsTwice(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(10, 4)

        def forward(self, ids):
            return self.embedding(ids) + F.embedding(ids, self.embedding.weight) * 2

    proto = assert_translates(EmbedsTwice().eval(), torch.tensor([[1, 2, 3]]))
    sizes = [tuple(init.dims) for init in proto.graph.initializer]
    assert sizes.count((10, 4)) == 1


def test_an_in_place_update_read_afterwards_is_refused():
    def overwrite_then_read(x):
        y = x * 2
        z = operator.iadd(y, 1)  # y += 1, then y read again below
        return z + y

    gm = fxloom.symbolic_trace(overwrite_then_read, record_inplace_operators=True)
    (iadd,) = [n for n in gm.graph.nodes if n.target is operator.iadd]
    assert "which a later node reads" in unsupported_reason(iadd, gm)


def test_torch_min_over_a_dimension_is_refused_by_name():
    gm = fxloom.symbolic_trace(lambda x: torch.min(x, 1).values, example_inputs=(x4(2, 3),))
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.min]
    assert "only the elementwise form" in unsupported_reason(node, gm)


def test_a_torch_tensor_of_constants_is_folded_as_a_new_cache_layer_makes_it():
    """DynamicLayer starts from ``torch.tensor([])``, which ``torch.cat`` then skips."""
    proto = assert_translates(lambda x: torch.cat([torch.tensor([]), x]) * 2, x4(3))
    (concat,) = [node for node in proto.graph.node if node.op_type == "Concat"]
    assert len(concat.input) == 1
