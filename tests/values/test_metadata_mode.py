"""``MetadataMode``: operators run for their results' metadata only, on stand-ins.

Tracing with example inputs runs the recorded program in this mode to answer questions about
shapes, dtypes and devices without computing. Real tensors it meets are read, never changed;
results are remembered by the metadata of the call, which must tell apart every call whose
result differs.
"""

from __future__ import annotations

import pytest
import torch

from fxloom.values.metadata_mode import MetadataMode
from fxloom.values.stand_in import DataDependentError, StandIn


def stand_in(*size: int, dtype: torch.dtype = torch.float32) -> StandIn:
    return StandIn.like(torch.empty(size, dtype=dtype))


def test_results_have_the_metadata_eager_gives():
    x, weight = torch.randn(2, 3), torch.randn(4, 3)
    with MetadataMode():
        y = torch.nn.functional.linear(stand_in(2, 3), weight).softmax(-1).transpose(0, 1)
    expected = torch.nn.functional.linear(x, weight).softmax(-1).transpose(0, 1)
    assert isinstance(y, StandIn)
    assert (y.shape, y.stride(), y.dtype, y.device) == (
        expected.shape,
        expected.stride(),
        expected.dtype,
        expected.device,
    )


def test_real_tensors_are_read_and_never_changed():
    buffer = torch.zeros(3)
    with MetadataMode():
        buffer.add_(1)  # in place on a real tensor: a fresh stand-in of it changes instead
        buffer.unsqueeze_(0)
        assert (buffer * 2).shape == (3,)  # nor is the stand-in it is read as changed
    assert torch.equal(buffer, torch.zeros(3)) and buffer.shape == (3,)


def test_a_remembered_result_is_a_new_stand_in_each_time():
    x = stand_in(2, 3)
    with MetadataMode():
        first, second = x.t(), x.t()
    assert first is not second and first.shape == second.shape == (3, 2)


def test_python_scalars_of_another_type_give_another_result_dtype():
    counts = stand_in(3, dtype=torch.int64)
    with MetadataMode():
        assert (counts + 1).dtype == torch.int64
        assert (counts + 1.0).dtype == torch.float32
        assert (counts + True).dtype == torch.int64


def test_factories_report_the_default_device_and_dtype():
    with MetadataMode():
        made = torch.zeros(2, 5)
    assert isinstance(made, StandIn)
    assert (made.shape, made.dtype, made.device) == ((2, 5), torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("needs_data", [lambda x: x.nonzero(), lambda x: x.sum().item()])
def test_an_operator_whose_result_depends_on_data_raises(needs_data):
    with MetadataMode(), pytest.raises(DataDependentError):
        needs_data(stand_in(4))
