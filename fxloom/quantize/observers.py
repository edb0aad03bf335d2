"""Observers: modules that watch the float values flowing past and choose int8 parameters.

An observer is an identity ``nn.Module``: ``observer(x)`` returns ``x`` itself, after noting
what it needs (a running min/max, a histogram). ``qparams()`` then gives the ``(scale,
zero_point)`` that map the observed range onto the integer range of its ``dtype``::

    >>> import torch
    >>> from fxloom.quantize.observers import MinMaxObserver
    >>> obs = MinMaxObserver()
    >>> _ = obs(torch.tensor([-1.0, 0.5, 3.0]))
    >>> obs.min_val.item(), obs.max_val.item()
    (-1.0, 3.0)
    >>> scale, zero_point = obs.qparams()
    >>> round(scale.item(), 6), zero_point.item()
    (0.015686, 64)

The kinds: ``MinMaxObserver`` (the whole range seen), ``MovingAverageMinMaxObserver`` (an
exponential average of each batch's range, less swayed by one outlier batch),
``HistogramObserver`` (a histogram of everything seen; the range is chosen to minimise the
expected squared quantization error, ``method="mse"``, or to keep a ``percentile`` of the
values, ``method="percentile"``), and ``PerChannelMinMaxObserver`` (one range per slice along
``ch_axis``: weights, one scale per output channel).

Ranges: ``torch.quint8`` is 0..255, ``torch.qint8`` is -128..127; ``reduce_range=True``
drops one bit (0..127, -64..63), which x86/FBGEMM kernels need for activations on CPUs
without AVX-512 VNNI, so that their 16-bit intermediate sums cannot overflow
(``config.saturates_8_bit_activations``). ``symmetric=True`` centres the range on zero (zero
point 0 for qint8, 128 or 64 for quint8): weights use it, so products need no zero-point
correction.

Observers also answer to the attributes torch's quantized modules read from an observer
(``dtype``, ``qscheme``, ``ch_axis``, ``quant_min``/``quant_max``,
``calculate_qparams``), so a torch module's
``from_float`` can use them.

Depends on: torch.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "HistogramObserver",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "Observer",
    "PerChannelMinMaxObserver",
    "quantized_range",
]


def quantized_range(dtype: torch.dtype, reduce_range: bool) -> tuple[int, int]:
    """The integers a quantized ``dtype`` can hold, one bit fewer with ``reduce_range``."""
    ranges = {torch.quint8: (0, 255), torch.qint8: (-128, 127), torch.qint32: (-(2**31), 2**31 - 1)}
    if dtype not in ranges:
        raise ValueError(f"observers quantize to torch.quint8, qint8 or qint32, not {dtype}")
    qmin, qmax = ranges[dtype]
    if reduce_range and dtype != torch.qint32:
        qmin, qmax = qmin // 2, qmax // 2
    return qmin, qmax


class Observer(nn.Module):
    """Base class: an identity module with a ``qparams()`` from what it has seen.

    Subclasses implement ``observe(x)`` and ``value_range()``; ``seen`` counts the tensors
    observed, so a converter can refuse an observer that never ran. Values that int8 cannot
    hold (inf, nan: an attention mask) are observed as 0 and flagged in ``nonfinite``, so a
    converter can keep their operators in float.
    """

    def __init__(
        self,
        dtype: torch.dtype = torch.quint8,
        symmetric: bool = False,
        reduce_range: bool = False,
        eps: float = torch.finfo(torch.float32).eps,
    ) -> None:
        super().__init__()
        self.dtype = dtype
        self.symmetric = symmetric
        self.reduce_range = reduce_range
        self.eps = eps
        self.ch_axis: int | None = None
        self.register_buffer("seen", torch.tensor(0, dtype=torch.long))
        self.register_buffer("nonfinite", torch.tensor(False))  # saw inf or nan

    @property
    def qscheme(self) -> torch.qscheme:
        return torch.per_tensor_symmetric if self.symmetric else torch.per_tensor_affine

    @property
    def quant_min(self) -> int:
        return quantized_range(self.dtype, self.reduce_range)[0]

    @property
    def quant_max(self) -> int:
        return quantized_range(self.dtype, self.reduce_range)[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            with torch.no_grad():
                self.observe(self._finite(x.detach()))
            self.seen += 1
        return x

    def _finite(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` with inf and nan as 0, noting that there were some (int8 holds neither)."""
        if bool(torch.isfinite(x.sum())):  # one pass; inf and nan propagate into the sum
            return x
        finite = torch.isfinite(x)
        if bool(finite.all()):  # the sum overflowed, the values are fine
            return x
        self.nonfinite.fill_(True)
        return torch.where(finite, x, torch.zeros((), dtype=x.dtype))

    def observe(self, x: torch.Tensor) -> None:
        raise NotImplementedError

    def value_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The float range (per channel for per-channel observers) to map onto the integers."""
        raise NotImplementedError

    def qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)``: float32 and int64 tensors (one element per channel)."""
        if not self.seen:
            raise RuntimeError(f"{type(self).__name__} has observed no values yet")
        low, high = self.value_range()
        return _qparams(low, high, self.dtype, self.symmetric, self.reduce_range, self.eps)

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """torch's name for ``qparams()`` (its quantized modules' ``from_float`` call it)."""
        return self.qparams()

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, symmetric={self.symmetric}, reduce_range={self.reduce_range}"


def _qparams(
    low: torch.Tensor,
    high: torch.Tensor,
    dtype: torch.dtype,
    symmetric: bool,
    reduce_range: bool,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point mapping ``[low, high]`` (widened to hold 0) onto the integers.

    Zero must be exact (padding, ReLU outputs), so the range always includes it.
    """
    qmin, qmax = quantized_range(dtype, reduce_range)
    low = torch.clamp(low.float(), max=0.0)
    high = torch.clamp(high.float(), min=0.0)
    if symmetric:
        bound = torch.maximum(-low, high)
        scale = torch.clamp(bound / ((qmax - qmin) / 2), min=eps)
        middle = 0 if dtype == torch.qint8 else (qmin + qmax + 1) // 2
        zero_point = torch.full_like(scale, middle, dtype=torch.long)
    else:
        scale = torch.clamp((high - low) / (qmax - qmin), min=eps)
        zero_point = torch.clamp(qmin - torch.round(low / scale), qmin, qmax).long()
    return scale, zero_point


class MinMaxObserver(Observer):
    """The smallest and largest value seen over all batches."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.register_buffer("min_val", torch.tensor(float("inf")))
        self.register_buffer("max_val", torch.tensor(float("-inf")))

    def observe(self, x: torch.Tensor) -> None:
        low, high = torch.aminmax(x)
        self.min_val = torch.minimum(self.min_val, low.float())
        self.max_val = torch.maximum(self.max_val, high.float())

    def value_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.min_val, self.max_val


class MovingAverageMinMaxObserver(MinMaxObserver):
    """An exponential moving average of each batch's min and max (the first batch sets them).

    ``averaging_constant`` is the weight of the newest batch.
    """

    def __init__(self, averaging_constant: float = 0.01, **kwargs) -> None:
        super().__init__(**kwargs)
        self.averaging_constant = averaging_constant

    def observe(self, x: torch.Tensor) -> None:
        low, high = (v.float() for v in torch.aminmax(x))
        if not self.seen:
            self.min_val, self.max_val = low, high
            return
        c = self.averaging_constant
        self.min_val = self.min_val + c * (low - self.min_val)
        self.max_val = self.max_val + c * (high - self.max_val)


class PerChannelMinMaxObserver(Observer):
    """Min and max of each slice along ``ch_axis`` (0: a weight's output channels)."""

    def __init__(
        self,
        ch_axis: int = 0,
        dtype: torch.dtype = torch.qint8,
        symmetric: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(dtype=dtype, symmetric=symmetric, **kwargs)
        self.ch_axis = ch_axis
        self.register_buffer("min_val", torch.tensor([]))
        self.register_buffer("max_val", torch.tensor([]))

    @property
    def qscheme(self) -> torch.qscheme:
        return torch.per_channel_symmetric if self.symmetric else torch.per_channel_affine

    def observe(self, x: torch.Tensor) -> None:
        rows = x.transpose(0, self.ch_axis).reshape(x.shape[self.ch_axis], -1)
        low, high = (v.float() for v in torch.aminmax(rows, dim=1))
        if self.min_val.numel():
            low, high = torch.minimum(self.min_val, low), torch.maximum(self.max_val, high)
        self.min_val, self.max_val = low, high

    def value_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.min_val, self.max_val

    def extra_repr(self) -> str:
        return f"ch_axis={self.ch_axis}, " + super().extra_repr()


class HistogramObserver(Observer):
    """A histogram of all values seen; the range is chosen from it at ``qparams()`` time.

    ``method="mse"`` tries ranges ``[edge_i, edge_j]`` made of histogram edges and keeps the
    one with the least expected squared error (values outside are clipped to its ends; inside,
    rounding costs ``step**2 / 12`` per value). ``method="percentile"`` clips the lowest and
    highest ``(100 - percentile) / 2`` percent of the values.
    When a batch falls outside the current range the histogram is widened: its counts are
    spread over the new, coarser bins in proportion to how much of each old bin they cover.
    """

    def __init__(
        self,
        bins: int = 2048,
        method: str = "mse",
        percentile: float = 99.99,
        **kwargs,
    ) -> None:
        if method not in ("mse", "percentile"):
            raise ValueError(f"HistogramObserver method is 'mse' or 'percentile', not {method!r}")
        super().__init__(**kwargs)
        self.bins = bins
        self.method = method
        self.percentile = percentile
        self.register_buffer("histogram", torch.zeros(bins, dtype=torch.float64))
        self.register_buffer("min_val", torch.tensor(float("inf")))
        self.register_buffer("max_val", torch.tensor(float("-inf")))

    def observe(self, x: torch.Tensor) -> None:
        low, high = (v.float() for v in torch.aminmax(x))
        new_low = torch.minimum(self.min_val, low)
        new_high = torch.maximum(self.max_val, high)
        if new_high <= new_low:  # a constant tensor: a tiny range around it
            new_high = new_low + self.eps
        if self.seen and (new_low < self.min_val or new_high > self.max_val):
            self.histogram = _rebin(self.histogram, self.min_val, self.max_val, new_low, new_high)
        counts = torch.histc(x.float(), self.bins, new_low.item(), new_high.item())
        self.histogram = self.histogram + counts.double()
        self.min_val, self.max_val = new_low, new_high

    def edges(self) -> torch.Tensor:
        return torch.linspace(self.min_val.item(), self.max_val.item(), self.bins + 1).double()

    def value_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        # The search runs on a few thousand numbers: waking torch's thread pool for each of
        # its small operations costs far more than it saves (0.5 ms here, 150 ms on a loaded
        # two-core machine).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._percentile_range() if self.method == "percentile" else self._mse_range()
        finally:
            torch.set_num_threads(threads)

    def _percentile_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        cumulative = torch.cumsum(self.histogram, 0) / self.histogram.sum()
        tail = (100.0 - self.percentile) / 200.0
        edges = self.edges()
        first = int(torch.searchsorted(cumulative, torch.tensor(tail, dtype=torch.float64)))
        last = int(torch.searchsorted(cumulative, torch.tensor(1.0 - tail, dtype=torch.float64)))
        return edges[first].float(), edges[min(last + 1, self.bins)].float()

    def _mse_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Search ``[edge_i, edge_j]`` windows, shrinking from both ends in 1/256 steps.

        The clipping error of bins below ``edge_i`` is ``sum(n * (c - lo)**2)``, which prefix
        sums of ``n``, ``n * c`` and ``n * c**2`` give for every candidate at once.
        """
        qmin, qmax = quantized_range(self.dtype, self.reduce_range)
        edges = self.edges()
        centres = (edges[:-1] + edges[1:]) / 2
        counts = self.histogram

        def prefix(values: torch.Tensor) -> torch.Tensor:
            return torch.cat([values.new_zeros(1), torch.cumsum(values, 0)])

        n, nc, ncc = prefix(counts), prefix(counts * centres), prefix(counts * centres**2)
        steps = torch.linspace(0, self.bins // 2 - 1, 129).long().unique()
        starts, stops = torch.meshgrid(steps, self.bins - steps, indexing="ij")
        starts, stops = starts.reshape(-1), stops.reshape(-1)
        low, high = edges[starts], edges[stops]
        below = ncc[starts] - 2 * low * nc[starts] + low**2 * n[starts]
        above_n, above_nc = n[-1] - n[stops], nc[-1] - nc[stops]
        above = (ncc[-1] - ncc[stops]) - 2 * high * above_nc + high**2 * above_n
        inside = (n[stops] - n[starts]) * ((high - low) / (qmax - qmin)) ** 2 / 12
        best = int(torch.argmin(below + above + inside))
        return low[best].float(), high[best].float()

    def extra_repr(self) -> str:
        return f"bins={self.bins}, method={self.method!r}, " + super().extra_repr()


def _rebin(
    histogram: torch.Tensor,
    old_low: torch.Tensor,
    old_high: torch.Tensor,
    new_low: torch.Tensor,
    new_high: torch.Tensor,
) -> torch.Tensor:
    """``histogram`` over ``[old_low, old_high]`` re-expressed over ``[new_low, new_high]``.

    Interpolates the cumulative counts at the new edges (counts spread evenly in each old bin).
    """
    bins = histogram.numel()
    old_edges = torch.linspace(old_low.item(), old_high.item(), bins + 1).double()
    new_edges = torch.linspace(new_low.item(), new_high.item(), bins + 1).double()
    cumulative = torch.cat([histogram.new_zeros(1), torch.cumsum(histogram, 0)])
    position = (new_edges - old_edges[0]) / (old_edges[-1] - old_edges[0]) * bins
    position = torch.clamp(position, 0, bins)
    below = torch.clamp(position.floor().long(), max=bins - 1)
    fraction = position - below
    at_edges = cumulative[below] + fraction * histogram[below]
    return torch.diff(at_edges)
