"""Observers: statistics and quantization parameters on known inputs, next to torch.ao's."""

from __future__ import annotations

import pytest
import torch
import torch.ao.quantization as tq

from fxloom.quantize import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    PerChannelMinMaxObserver,
)
from fxloom.quantize.observers import quantized_range


def test_an_observer_returns_its_input_itself() -> None:
    x = torch.randn(4)
    assert MinMaxObserver()(x) is x


def test_min_max_tracks_the_whole_range_over_batches() -> None:
    observer = MinMaxObserver()
    observer(torch.tensor([-1.0, 2.0]))
    observer(torch.tensor([0.5, 3.0]))
    assert (observer.min_val.item(), observer.max_val.item()) == (-1.0, 3.0)
    assert int(observer.seen) == 2


def test_affine_quint8_parameters_of_a_known_range() -> None:
    observer = MinMaxObserver()
    observer(torch.tensor([-1.0, 3.0]))
    scale, zero_point = observer.qparams()
    assert scale.item() == pytest.approx(4.0 / 255)
    assert zero_point.item() == 64  # round(1 / (4/255)) = round(63.75): zero is exact


def test_the_range_always_holds_zero() -> None:
    observer = MinMaxObserver()
    observer(torch.tensor([2.0, 4.0]))
    scale, zero_point = observer.qparams()
    assert scale.item() == pytest.approx(4.0 / 255) and zero_point.item() == 0


def test_symmetric_qint8_centres_on_zero() -> None:
    observer = MinMaxObserver(dtype=torch.qint8, symmetric=True)
    observer(torch.tensor([-1.0, 3.0]))
    scale, zero_point = observer.qparams()
    assert scale.item() == pytest.approx(3.0 / 127.5) and zero_point.item() == 0


def test_reduce_range_drops_one_bit() -> None:
    assert quantized_range(torch.quint8, True) == (0, 127)
    assert quantized_range(torch.qint8, True) == (-64, 63)


def test_moving_average_moves_towards_each_batch_by_the_averaging_constant() -> None:
    observer = MovingAverageMinMaxObserver(averaging_constant=0.5)
    observer(torch.tensor([-2.0, 2.0]))
    observer(torch.tensor([0.0, 4.0]))
    assert (observer.min_val.item(), observer.max_val.item()) == (-1.0, 3.0)


def test_per_channel_ranges_are_per_output_channel() -> None:
    weight = torch.tensor([[1.0, -2.0], [0.5, 0.25]])
    observer = PerChannelMinMaxObserver()
    observer(weight)
    assert observer.min_val.tolist() == [-2.0, 0.25]
    scale, zero_point = observer.qparams()
    assert scale.tolist() == pytest.approx([2.0 / 127.5, 0.5 / 127.5])
    assert zero_point.tolist() == [0, 0]


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda: MinMaxObserver(), lambda: tq.MinMaxObserver()),
        (
            lambda: MinMaxObserver(dtype=torch.qint8, symmetric=True),
            lambda: tq.MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric),
        ),
        (
            lambda: MovingAverageMinMaxObserver(reduce_range=True),
            lambda: tq.MovingAverageMinMaxObserver(reduce_range=True),
        ),
        (
            lambda: PerChannelMinMaxObserver(),
            lambda: tq.PerChannelMinMaxObserver(
                dtype=torch.qint8, qscheme=torch.per_channel_symmetric
            ),
        ),
    ],
    ids=["minmax", "minmax-symmetric", "moving-average-reduced", "per-channel"],
)
def test_parameters_match_torch_ao_observers(ours, theirs) -> None:
    generator = torch.Generator().manual_seed(0)
    a, b = ours(), theirs()
    for _ in range(3):
        x = torch.randn(8, 16, generator=generator) * 3 + 0.5
        a(x)
        b(x)
    (scale, zero_point), (their_scale, their_zero_point) = a.qparams(), b.calculate_qparams()
    torch.testing.assert_close(scale, their_scale.float().reshape(scale.shape))
    assert zero_point.tolist() == their_zero_point.reshape(zero_point.shape).tolist()


def test_histogram_counts_everything_when_the_range_grows() -> None:
    observer = HistogramObserver(bins=64)
    observer(torch.linspace(-1, 1, 1000))
    observer(torch.linspace(-4, 4, 1000))
    assert observer.histogram.sum().item() == pytest.approx(2000)
    assert (observer.min_val.item(), observer.max_val.item()) == (-4.0, 4.0)


def test_histogram_percentile_clips_rare_outliers() -> None:
    x = torch.cat([torch.linspace(-1, 1, 100_000), torch.tensor([50.0])])
    observer = HistogramObserver(method="percentile", percentile=99.9)
    observer(x)
    low, high = observer.value_range()
    assert -1.01 <= low.item() <= -0.99 and 0.99 <= high.item() <= 1.1


def test_histogram_mse_clips_a_tail_that_costs_more_resolution_than_it_is_worth() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(100_000, generator=generator), torch.tensor([60.0])])
    observer = HistogramObserver(method="mse")
    observer(x)
    low, high = observer.value_range()
    assert high.item() < 60.0  # the single outlier is clipped
    assert low.item() < -3.0  # the Gaussian's tails are kept


def test_histogram_mse_is_close_to_torch_ao_histogram_observer() -> None:
    generator = torch.Generator().manual_seed(0)
    ours, theirs = HistogramObserver(reduce_range=True), tq.HistogramObserver(reduce_range=True)
    for _ in range(3):
        x = torch.randn(10_000, generator=generator)
        ours(x)
        theirs(x)
    scale, _ = ours.qparams()
    their_scale, _ = theirs.calculate_qparams()
    assert scale.item() == pytest.approx(their_scale.item(), rel=0.15)


def test_an_unknown_histogram_method_is_refused() -> None:
    with pytest.raises(ValueError, match="'mse' or 'percentile'"):
        HistogramObserver(method="entropy")


def test_an_observer_that_saw_nothing_has_no_parameters() -> None:
    with pytest.raises(RuntimeError, match="observed no values"):
        MinMaxObserver().qparams()
