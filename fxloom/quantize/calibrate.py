"""``calibrate``: run batches through a prepared model so its observers see real data.

Depends on: torch; rich (the progress bar).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from fxloom.graph_module import GraphModule
from fxloom.quantize.errors import QuantizeError
from fxloom.values.signature import call_of

__all__ = ["calibrate"]


def calibrate(prepared: GraphModule, data: Iterable[Any], progress: bool = True) -> GraphModule:
    """Call ``prepared`` on every batch of ``data`` (under ``torch.no_grad()``); return it.

    A batch is a tensor (one input), a tuple or list (positional inputs) or a dict (inputs by
    name). ``progress`` shows a rich progress bar (with a total when ``data`` has a length).

    >>> import torch
    >>> from fxloom.quantize import prepare, calibrate
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
    >>> prepared = prepare(model, (torch.randn(2, 4),))
    >>> _ = calibrate(prepared, [torch.randn(8, 4) for _ in range(3)], progress=False)
    >>> int(prepared.input_1_observer.seen)
    3
    """
    if "quantize" not in getattr(prepared, "meta", {}):
        raise QuantizeError(
            "calibrate() takes the model fxloom.quantize.prepare() returned; call "
            "prepare(model, example_inputs) first"
        )
    batches = _with_progress(data) if progress else data
    with torch.no_grad():
        for batch in batches:
            args, kwargs = call_of(batch)
            prepared(*args, **kwargs)
    return prepared


def _with_progress(data: Iterable[Any]) -> Iterable[Any]:
    from rich.progress import track

    total = len(data) if hasattr(data, "__len__") else None
    return track(data, description="calibrating", total=total, transient=True)
