"""Translating fxloom graphs to ONNX (``fxloom.lower.translate``) and writing files (``to_onnx``).

Every operator of the coverage list runs in a tiny module that is traced, translated, checked by
``onnx.checker`` and run by ONNX Runtime on the CPU; the result must match eager PyTorch (rtol
1e-4, atol 1e-5). The same holds for exported programs (ATen operators), the embedded reference
models and Hugging Face models from tiny configs, whose files are reloaded from disk.
"""

from __future__ import annotations

import pytest

onnxruntime = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import fxloom  # noqa: E402
import fxloom.export  # noqa: E402
from fxloom.lower import translate  # noqa: E402

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
    gm = fxloom.symbolic_trace(fn, example_inputs=inputs)
    proto = translate(gm, inputs)
    onnx.checker.check_model(proto, full_check=True)
    expected = flat_tensors(fn(*inputs))
    actual = run_onnx(proto, input_feeds(gm, inputs))
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    return proto


def x4(*shape):
    return torch.randn(*shape) if shape else torch.randn(2, 3, 8, 8)


torch.manual_seed(0)

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
    ("F.conv2d", lambda x, w: F.conv2d(x, w, padding=1), (x4(), torch.randn(4, 3, 3, 3))),
    ("linear_2d", nn.Linear(8, 5), (x4(3, 8),)),
    ("linear_3d", nn.Linear(8, 5), (x4(2, 3, 8),)),
    (
        "F.linear",
        lambda x, w, b: F.linear(x, w, b),
        (x4(2, 3, 8), torch.randn(5, 8), torch.randn(5)),
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
    ("F.embedding", lambda i, w: F.embedding(i, w), (torch.tensor([1, 2]), torch.randn(4, 3))),
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
]


@pytest.mark.parametrize(
    "fn, inputs", [pytest.param(fn, inputs, id=name) for name, fn, inputs in OPERATORS]
)
def test_operator_translation_matches_eager(fn, inputs):
    if isinstance(fn, nn.Module):
        fn.eval()
    with torch.no_grad():
        assert_translates(fn, *inputs)
