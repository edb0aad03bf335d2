"""The demo's saving step: a traced zoo model written with ``fxloom.save`` and read back.

``save_and_load`` is one step of ``fxloom demo`` (see ``fxloom.cli.demo.STEPS``): it saves the
traced ``SAVE_MODEL`` (traced by an earlier step) to a temporary directory, loads it with
``fxloom.load`` (no unpickling, nothing from the file is run), checks the loaded module gives
the same outputs as the traced one, and prints the file's size and the load time next to
``torch.save`` / ``torch.load(weights_only=False)`` of the same pickled GraphModule. A loaded
module that differs sets ``state.save_match`` to False, which fails the demo.

Depends on: fxloom.save/load, torch, rich.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.table import Table
from rich.text import Text

import fxloom
from fxloom.passes._cost_report import format_bytes

if TYPE_CHECKING:
    from fxloom.cli.demo import DemoState

SAVE_MODEL = "resnet_tiny"
TIMED_LOADS = 5


def save_and_load(state: DemoState) -> None:
    entry = state.traced[SAVE_MODEL]
    with tempfile.TemporaryDirectory(prefix="fxloom-demo-") as directory:
        ours, pickled = Path(directory) / "model.fxl", Path(directory) / "model.pt"
        fxloom.save(entry.traced, ours)
        torch.save(entry.traced, pickled)
        loaded = fxloom.load(ours)
        load_ours = _median_seconds(lambda: fxloom.load(ours))
        load_pickled = _median_seconds(lambda: _unpickle(pickled))
        sizes = ours.stat().st_size, pickled.stat().st_size
    _say(
        state,
        f"fxloom.save(traced {SAVE_MODEL}, 'model.fxl') writes a zip of JSON (graph, modules, "
        "node meta) and safetensors weights; fxloom.load rebuilds it by name from an allowlist, "
        "never unpickling:",
    )
    with torch.no_grad():
        same = torch.equal(loaded(*entry.inputs), entry.traced(*entry.inputs))
    state.save_match = same and str(loaded.graph) == str(entry.traced.graph)
    table = Table(show_header=True, header_style="bold")
    for column in ("", "file size", f"load (median of {TIMED_LOADS})"):
        table.add_column(column)
    table.add_row("fxloom.save / fxloom.load", format_bytes(sizes[0]), _ms(load_ours))
    table.add_row(
        "torch.save / torch.load(weights_only=False)", format_bytes(sizes[1]), _ms(load_pickled)
    )
    state.console.print(table)
    _say(state, f"the loaded module has the same graph and outputs as the traced one: {same}")


def _unpickle(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, weights_only=False)


def _median_seconds(load: Callable[[], Any]) -> float:
    times = []
    for _ in range(TIMED_LOADS):
        start = time.perf_counter()
        load()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _say(state: DemoState, message: str) -> None:
    state.console.print(Text(message, style="dim"))
