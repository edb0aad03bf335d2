"""fxloom's own result metadata for common operators is what torch's meta kernels give.

``fxloom.values.known_meta`` states the result of ``add``, ``mul``, ``sin``, ``eq``,
``addmm``... in the plain case (same sizes, contiguous, real dtypes, Python numbers) so that a first
``fxloom.compile`` does not run torch's Python meta kernels, whose first call imports
``torch._dynamo``. Each listed operator is checked here against torch's meta kernel over
sizes, layouts, dtypes and numbers: where fxloom answers, sizes, strides, dtype and device
are torch's; where torch raises, fxloom does not answer (the caller then runs torch's kernel,
which raises as before).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from fxloom.values.known_meta import OTHERS, POINTWISE, known_result

META = torch.device("meta")
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
)
NUMBERS = (2, -3, 0, 2.5, -0.5, 300, 2**40, True, 1j)


def _operator(name: str):
    """``aten::add.Tensor`` -> ``torch.ops.aten.add.Tensor``; ``aten::neg`` -> ``.default``."""
    packet, _, overload = name.removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _positional_kinds(func) -> list[str]:
    """'tensor' or 'number' for each positional argument without a default."""
    return [
        "tensor" if argument.type.kind() == "TensorType" else "number"
        for argument in func._schema.arguments
        if not argument.kwarg_only and not argument.has_default_value()
    ]


def _meta(size, dtype=torch.float32, strides=None):
    if strides is None:
        return torch.empty(size, dtype=dtype, device=META)
    return torch.empty_strided(size, strides, dtype=dtype, device=META)


# Layouts of the tensors of one call: description -> a tensor of the dtype given.
LAYOUTS = {
    "scalar tensor": lambda dtype: _meta((), dtype),
    "empty": lambda dtype: _meta((0,), dtype),
    "vector": lambda dtype: _meta((5,), dtype),
    "matrix": lambda dtype: _meta((2, 3), dtype),
    "4-d": lambda dtype: _meta((2, 3, 4, 5), dtype),
    "size-1 dims, any strides": lambda dtype: _meta((1, 3, 1), dtype, (7, 1, 9)),
    "4-d with size-1 dims (contiguous and channels-last)": lambda dtype: _meta((2, 3, 1, 1), dtype),
    "transposed": lambda dtype: _meta((3, 2), dtype).t(),
    "channels-last": lambda dtype: _meta((2, 3, 4, 5), dtype).contiguous(
        memory_format=torch.channels_last
    ),
    "strided slice": lambda dtype: _meta((4, 6), dtype)[:, ::2],
}


def _calls(func):
    """Argument tuples covering the operator's forms: tensor layouts, dtypes, numbers, mixes."""
    kinds = _positional_kinds(func)
    for make in LAYOUTS.values():
        for dtype in DTYPES:
            yield tuple(make(dtype) if kind == "tensor" else 2 for kind in kinds)
    if kinds == ["tensor", "tensor"]:
        for first, second in itertools.product(DTYPES, repeat=2):
            yield _meta((2, 3), first), _meta((2, 3), second)
        yield _meta((2, 3)), _meta((3,))  # broadcasting
        yield _meta((2, 1)), _meta((1, 3))
        yield _meta((2, 3)), _meta((2, 3)).t().contiguous().t()  # mixed layouts
        yield _meta(()), _meta((2, 3))
        for dtype, number in itertools.product(DTYPES, NUMBERS):
            yield _meta((2, 3), dtype), number  # x + 1 reaches add.Tensor with a number
    if kinds == ["tensor", "number"]:
        for dtype, number in itertools.product(DTYPES, NUMBERS):
            yield _meta((2, 3), dtype), number


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}/{tuple(value.stride())}/{value.dtype}"
    return repr(value)


def _assert_known_results_match_torch(name: str, func, calls) -> None:
    """Where fxloom answers a call, torch's meta kernel accepts it and gives the same sizes,
    strides, dtype, device and ``requires_grad``; fxloom answers at least one call."""
    answered = 0
    for args in calls:
        ours = known_result(func, args, {})
        if ours is None:
            continue
        answered += 1
        call = f"{name}({', '.join(_describe(arg) for arg in args)})"
        try:
            theirs = func(*args)
        except Exception as error:  # noqa: BLE001 - any refusal of torch's must be ours too
            pytest.fail(f"{call}: torch raises {error!r}, fxloom answered")
        assert (ours.shape, ours.stride(), ours.dtype, ours.device) == (
            theirs.shape,
            theirs.stride(),
            theirs.dtype,
            theirs.device,
        ), call
        assert ours.requires_grad == theirs.requires_grad, call
    assert answered, f"{name}: fxloom answered no call"


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_a_listed_operator_gives_what_torchs_meta_kernel_gives(name):
    func = _operator(name)
    _assert_known_results_match_torch(name, func, _calls(func))


def _matrices(rows: int, inner: int, columns: int, dtype: torch.dtype):
    """mat1 and mat2 in each layout: contiguous, transposed (a ``Linear`` weight), sliced."""
    yield _meta((rows, inner), dtype), _meta((inner, columns), dtype)
    yield _meta((rows, inner), dtype), _meta((columns, inner), dtype).t()
    yield _meta((inner, rows), dtype).t(), _meta((inner, 2 * columns), dtype)[:, ::2]


def _addmm_calls():
    sizes = [(3, 4, 5), (1, 4, 5), (3, 4, 1), (1, 1, 1), (0, 4, 5), (3, 0, 5), (3, 4, 0)]
    for (rows, inner, columns), dtype in itertools.product(sizes, DTYPES[:6]):
        biases = [
            _meta((columns,), dtype),
            _meta((rows, columns), dtype),
            _meta((1, columns), dtype),
            _meta((rows, 1), dtype),  # broadcast the other way: left to torch
            _meta((columns, rows), dtype).t(),  # transposed: left to torch
            _meta((columns,), torch.float64 if dtype != torch.float64 else torch.float32),
        ]
        for bias, (mat1, mat2) in itertools.product(biases, _matrices(rows, inner, columns, dtype)):
            yield bias, mat1, mat2


def test_addmm_gives_what_torchs_meta_kernel_gives():
    assert "aten::addmm" in OTHERS
    _assert_known_results_match_torch("addmm", torch.ops.aten.addmm.default, _addmm_calls())


def test_x_plus_y_is_answered_without_torchs_kernel():
    x, y = _meta((8,)), _meta((8,))
    result = known_result(torch.ops.aten.add.Tensor, (x, y), {})
    assert (result.shape, result.dtype, result.device) == (torch.Size([8]), torch.float32, META)


def test_the_default_dtype_is_where_integers_divide_to():
    integers = _meta((3,), torch.int64)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        result = known_result(torch.ops.aten.div.Tensor, (integers, integers), {})
    finally:
        torch.set_default_dtype(previous)
    assert result.dtype == torch.float64


@pytest.mark.parametrize(
    "why, func, args, kwargs",
    [
        ("an operator not listed", torch.ops.aten.mm.default, (_meta((2, 2)), _meta((2, 2))), {}),
        ("a keyword argument", torch.ops.aten.add.Tensor, (_meta((2,)), _meta((2,))), {"alpha": 2}),
        ("broadcasting", torch.ops.aten.add.Tensor, (_meta((2, 3)), _meta((3,))), {}),
        ("a transposed input", torch.ops.aten.sin.default, (_meta((3, 2)).t(),), {}),
        ("a bool tensor", torch.ops.aten.sub.Tensor, (_meta((2,), torch.bool),) * 2, {}),
        ("a bool number", torch.ops.aten.sub.Tensor, (_meta((2,)), True), {}),
        ("a real tensor", torch.ops.aten.add.Tensor, (torch.ones(2), torch.ones(2)), {}),
        ("integer addmm", torch.ops.aten.addmm.default, (_meta((2,), torch.int64),) * 3, {}),
        (
            "addmm with beta",
            torch.ops.aten.addmm.default,
            (_meta((2,)), _meta((3, 2)), _meta((2, 2))),
            {"beta": 2},
        ),
    ],
)
def test_anything_but_the_plain_case_is_left_to_torch(why, func, args, kwargs):
    assert known_result(func, args, kwargs) is None, why
