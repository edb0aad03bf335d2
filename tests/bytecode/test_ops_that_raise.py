"""Operations that raise in eager raise in the compiled call too, used or not.

Two ways a compiled call could go on where eager stops: a stand-in that computes a result
eager refuses (torch's meta kernel of ``mm`` does not check that both matrices have one
dtype: ``fxloom.values.eager_checks`` refuses as eager does, so capture stops there and
the operation runs as Python, raising), and dead-code elimination dropping an unused
operation whose kernel raises on its inputs' data (an index out of range, a singular
matrix: ``graph_builder.RAISES_ON_DATA`` keeps it). Every test compares with eager.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import fxloom
from fxloom.values.stand_in import StandIn

pytestmark = pytest.mark.usefixtures("one_thread")


def raised(fn, *args) -> type[BaseException] | None:
    try:
        fn(*args)
    except Exception as error:  # noqa: BLE001 - the type is what is compared
        return type(error)
    return None


def assert_raises_as_eager(fn, *args) -> type[BaseException]:
    expected = raised(fn, *args)
    assert expected is not None, "eager should raise in this test"
    assert raised(fxloom.compile(fn), *args) is expected
    return expected


def _unused_matmul(x, y):
    unused = x @ y  # noqa: F841
    return x + 1


def _used_matmul(x, y):
    return (x @ y).relu()


MIXED = (torch.ones(3, 3, dtype=torch.float64), torch.ones(3, 3))
SAME = (torch.ones(3, 3), torch.ones(3, 3))


# ------------------------------------------------------------------ dtypes eager refuses
def test_an_unused_matmul_of_mixed_dtypes_raises_as_in_eager():
    assert assert_raises_as_eager(_unused_matmul, *MIXED) is RuntimeError


def test_a_used_matmul_of_mixed_dtypes_raises_as_in_eager():
    assert assert_raises_as_eager(_used_matmul, *MIXED) is RuntimeError


def test_the_same_function_with_one_dtype_still_compiles_and_runs():
    compiled = fxloom.compile(_unused_matmul)
    torch.testing.assert_close(compiled(*SAME), _unused_matmul(*SAME))
    assert raised(compiled, *MIXED) is RuntimeError
    before = compiled.explain().graph_count
    torch.testing.assert_close(compiled(*SAME), _unused_matmul(*SAME))
    assert compiled.explain().graph_count == before  # the first entry, reused


@pytest.mark.parametrize(
    "op",
    [
        lambda x, y: F.linear(x, y),
        lambda x, y: F.linear(y, y, x[0]),  # the bias alone differs
        lambda x, y: torch.bmm(x[None], y[None]),
        lambda x, y: torch.addmm(x, y, y),
        lambda x, y: torch.mv(x, y[0]),
        lambda x, y: F.conv2d(x[None, None], y[None, None]),
        lambda x, y: torch.einsum("ij,jk->ik", x, y),
    ],
    ids=["linear", "linear bias", "bmm", "addmm", "mv", "conv2d", "einsum"],
)
def test_an_unused_product_of_mixed_dtypes_raises_as_in_eager(op):
    def f(x, y):
        unused = op(x, y)  # noqa: F841
        return x + 1

    assert assert_raises_as_eager(f, *MIXED) is RuntimeError


def test_a_stand_in_refuses_what_eager_refuses():
    x, y = (StandIn.like(tensor) for tensor in MIXED)
    with pytest.raises(RuntimeError, match="same dtype"):
        x @ y


def test_a_convolution_without_bias_is_not_refused():
    x = torch.ones(1, 1, 3, 3)

    def f(x):
        return F.conv2d(x, x)

    torch.testing.assert_close(fxloom.compile(f)(x), f(x))


# ------------------------------------------------------------------ data eager refuses
def _unused_index(x, i):
    unused = x[i]  # noqa: F841
    return x + 1


def _unused_index_select(x, i):
    unused = torch.index_select(x, 0, i)  # noqa: F841
    return x + 1


EMBEDDING = torch.nn.Embedding(3, 2)


def _unused_embedding(x, i):
    unused = EMBEDDING(i)  # noqa: F841
    return x + 1


def _unused_inverse(x, i):
    unused = torch.linalg.inv(x * 0)  # noqa: F841
    return x + 1


IN_RANGE, OUT_OF_RANGE = torch.tensor([0, 2]), torch.tensor([5, 0])


@pytest.mark.parametrize("fn", [_unused_index, _unused_index_select, _unused_embedding])
def test_an_unused_index_out_of_range_raises_as_in_eager(fn):
    compiled, x = fxloom.compile(fn), torch.ones(3, 3)
    torch.testing.assert_close(compiled(x, IN_RANGE), fn(x, IN_RANGE))
    expected = raised(fn, x, OUT_OF_RANGE)
    assert expected is IndexError
    assert raised(compiled, x, OUT_OF_RANGE) is expected
    assert compiled.explain().graph_count == 1  # the same graph: the index is data


def test_an_unused_inverse_of_a_singular_matrix_raises_as_in_eager():
    assert_raises_as_eager(_unused_inverse, torch.ones(3, 3), IN_RANGE)


def test_an_unused_operation_that_cannot_raise_is_still_removed():
    def f(x):
        unused = x.sin()  # noqa: F841
        return x + 1

    compiled = fxloom.compile(f)
    compiled(torch.ones(3))
    targets = [node.target for node in compiled.cache[0].graph_module.graph.nodes]
    assert torch.sin not in targets and "sin" not in targets
