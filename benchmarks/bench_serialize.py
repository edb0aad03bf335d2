"""Save and load benchmark: ``fxloom.save``/``fxloom.load`` next to pickling a GraphModule with
``torch.save``/``torch.load`` and next to ``torch.export.save``/``torch.export.load``, in one run.

Models: the embedded zoo (``fxloom.zoo``: mlp_tiny, resnet_tiny, transformer_tiny, resnet50,
...) and Hugging Face models from tiny configs (benchmarks/zoo/registry.py: bert, gpt2, t5, vit,
whisper, llama, ...), each captured once, then written to and read back from a file in a
temporary directory, five ways:

    fxloom          fxloom.save / fxloom.load of the fxloom-traced GraphModule
    pickle          torch.save / torch.load(weights_only=False) of that same GraphModule
    torch.fx        torch.save / torch.load(weights_only=False) of torch.fx.symbolic_trace's
                    GraphModule ('n/a' where torch.fx cannot trace the model)
    torch.export    torch.export.save / torch.export.load of torch.export.export's program
    fxloom.export   fxloom.export.save / fxloom.export.load of fxloom.export's program
                    (when this fxloom has them)

Times are the median of ``--repeats`` warm runs (one untimed run first), the sides taking
turns to go first, garbage collector off inside timed regions; sizes are the files' bytes.
"Ready to run" adds, for the GraphModule sides, what the first call would do first: a loaded
or unpickled fxloom GraphModule generates and compiles its ``forward`` then (``gm.code``;
``fxloom.load`` checks every name that goes into it while loading), torch.fx while
unpickling. Each loaded fxloom module is run on the model's inputs and must equal the traced
module. Target: fxloom load / pickle load <= 1.0 ("loading is no slower than unpickling").

torch.fx cannot pickle a GraphModule whose placeholders are annotated (the zoo's
``x: torch.Tensor``: its pickler trips on the annotation), so its annotations are dropped
before saving.

    python benchmarks/bench_serialize.py              # every model below
    python benchmarks/bench_serialize.py --quick      # smoke run: mlp_tiny, 3 repeats
    python benchmarks/bench_serialize.py --record     # append the tables to RESULTS.md

torch.fx and torch.export are imported here only as the comparison.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: this checkout's fxloom and `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fxloom  # noqa: E402
import fxloom.export  # noqa: E402
from benchmarks._common import (  # noqa: E402
    freeze_startup_heap,
    load_average,
    machine_line,
    noise_line,
    publish,
    rotated,
    timed,
)
from benchmarks.zoo.methods import FLAGS, fixed_args  # noqa: E402
from benchmarks.zoo.registry import get  # noqa: E402

MODELS = (
    "mlp_tiny",
    "resnet_tiny",
    "transformer_tiny",
    "cnn_small",
    "deeprec_tiny",
    "deeprec",
    "resnet50",
    "bert",
    "gpt2",
    "t5",
    "vit",
    "whisper",
    "llama",
)
SIDES = ("fxloom", "pickle", "torch.fx", "torch.export", "fxloom.export")


@dataclass(frozen=True)
class Way:
    """How one side writes its captured object to a path, reads it back, and readies what
    it read to run (``None``: nothing to do, or not measured)."""

    save: Callable[[Any, Path], None]
    load: Callable[[Path], Any]
    ready: Callable[[Any], Any] | None = None


def _torch_load(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, weights_only=False)


def _generated_code(gm: Any) -> str:
    return gm.code  # fxloom: generated and compiled here unless already current


PICKLED = Way(lambda obj, path: torch.save(obj, path), _torch_load, _generated_code)
READY_SIDES = ("fxloom", "pickle", "torch.fx")
WAYS: dict[str, Way] = {
    "fxloom": Way(fxloom.save, fxloom.load, _generated_code),
    "pickle": PICKLED,
    "torch.fx": PICKLED,
    "torch.export": Way(lambda ep, path: torch.export.save(ep, path), torch.export.load),
}
if hasattr(fxloom.export, "save") and hasattr(fxloom.export, "load"):
    WAYS["fxloom.export"] = Way(fxloom.export.save, fxloom.export.load)


@dataclass
class Row:
    model: str
    nodes: int
    save: dict[str, list[float]] = field(default_factory=dict)  # seconds of each run, by side
    load: dict[str, list[float]] = field(default_factory=dict)
    ready: dict[str, list[float]] = field(default_factory=dict)  # load, then ready to run
    size: dict[str, int] = field(default_factory=dict)  # bytes by side
    failed: dict[str, str] = field(default_factory=dict)  # side -> why it is n/a
    equal: bool = False  # the module fxloom.load returned computes what the traced one does


# ----------------------------------------------------------------------------- capturing
def captures(name: str) -> tuple[dict[str, Any], dict[str, str], fxloom.GraphModule, dict]:
    """What each side saves (by side), why the others cannot, the traced module and inputs."""
    model, inputs = get(name).build()
    flags = fixed_args(model, inputs)
    gm = fxloom.symbolic_trace(model, flags, example_inputs=inputs)
    objects: dict[str, Any] = {"fxloom": gm, "pickle": gm}
    failed: dict[str, str] = {}
    export_flags = {k: v for k, v in flags.items() if k in FLAGS}
    capturers: dict[str, Callable[[], Any]] = {
        "torch.fx": lambda: _without_annotations(
            torch.fx.symbolic_trace(model, concrete_args=flags)
        ),
        "torch.export": lambda: torch.export.export(
            model, (), {**inputs, **export_flags}, strict=False
        ),
    }
    if "fxloom.export" in WAYS:
        capturers["fxloom.export"] = lambda: fxloom.export.export(
            model, (), {**inputs, **export_flags}
        )
    for side, capture in capturers.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                objects[side] = capture()
        except Exception as error:
            failed[side] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
    return objects, failed, gm, inputs


def _without_annotations(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    for node in gm.graph.nodes:
        node.type = None
    gm.recompile()
    return gm


# ----------------------------------------------------------------------------- measuring
def measure(name: str, repeats: int, directory: Path) -> Row:
    objects, failed, gm, inputs = captures(name)
    row = Row(name, len(gm.graph.nodes), failed=failed)
    for side in list(objects):  # one untimed round each: warm caches, and drop what fails
        try:
            _round_trip(side, objects[side], directory)
        except Exception as error:
            row.failed[side] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
            del objects[side]
    for repeat in range(repeats):
        for side in rotated(list(objects), repeat):
            _time_side(row, side, objects[side], _file(directory, side))
    row.equal = _loaded_equals_traced(gm, inputs, directory)
    return row


# File suffixes by side: torch.export.load takes its own archive format only from ".pt2".
SUFFIXES = {"fxloom": ".fxl", "fxloom.export": ".pt2", "torch.export": ".pt2"}


def _file(directory: Path, side: str) -> Path:
    return directory / f"{side}{SUFFIXES.get(side, '.pt')}"


def _time_side(row: Row, side: str, obj: Any, path: Path) -> None:
    """One timed save, load and (where measured) load + ready of ``side``, into ``row``."""
    way = WAYS[side]
    row.save.setdefault(side, []).append(timed(lambda: way.save(obj, path)))
    row.load.setdefault(side, []).append(timed(lambda: way.load(path)))
    if way.ready is not None:
        row.ready.setdefault(side, []).append(timed(lambda: way.ready(way.load(path))))
    row.size[side] = os.path.getsize(path)


def _round_trip(side: str, obj: Any, directory: Path) -> None:
    path = _file(directory, side)
    WAYS[side].save(obj, path)
    WAYS[side].load(path)


def _loaded_equals_traced(gm: fxloom.GraphModule, inputs: dict, directory: Path) -> bool:
    from fxloom.pytree import tree_leaves

    buffer = io.BytesIO()
    fxloom.save(gm, buffer)
    loaded = fxloom.load(buffer.getvalue())
    with torch.no_grad():
        expected, actual = tree_leaves(gm(**inputs)), tree_leaves(loaded(**inputs))
    return len(expected) == len(actual) and all(
        torch.equal(a, e) if isinstance(e, torch.Tensor) else a == e
        for a, e in zip(actual, expected)
    )


# ----------------------------------------------------------------------------- reporting
def paired_ratio(runs: dict[str, list[float]], side: str, baseline: str) -> float:
    """Median over repeats of run i of ``side`` / run i of ``baseline`` (timed side by side,
    so a busy moment of the machine slows both and cancels out)."""
    return statistics.median(a / b for a, b in zip(runs[side], runs[baseline]))


def _medians(runs: dict[str, list[float]]) -> dict[str, float]:
    return {side: statistics.median(times) for side, times in runs.items()}


def _cell(row: Row, figures: dict[str, float], side: str, scale: float, digits: int) -> str:
    if side not in figures:
        return "n/a" if side in row.failed or side in WAYS else "-"
    return f"{figures[side] * scale:.{digits}f}"


def _sides() -> tuple[str, ...]:
    return tuple(side for side in SIDES if side in WAYS)


_TIME_TITLES = {
    "load": "Load time (median ms)",
    "ready": "Load time, ready to run (median ms; see the method)",
    "save": "Save time (median ms)",
}


def time_table(rows: list[Row], what: str) -> list[str]:
    sides = _sides() if what != "ready" else READY_SIDES
    lines = [
        f"### {_TIME_TITLES[what]}",
        "",
        f"| model | nodes | {' | '.join(sides)} | fxloom / pickle (paired) |",
        "|---|---:|" + "---:|" * len(sides) + "---:|",
    ]
    for row in rows:
        runs = {"load": row.load, "ready": row.ready, "save": row.save}[what]
        figures = _medians(runs)
        cells = " | ".join(_cell(row, figures, side, 1e3, 2) for side in sides)
        ratio = paired_ratio(runs, "fxloom", "pickle")
        lines.append(f"| {row.model} | {row.nodes} | {cells} | {ratio:.2f} |")
    return lines


def size_table(rows: list[Row]) -> list[str]:
    sides = _sides()
    lines = [
        "### File size (KiB)",
        "",
        f"| model | {' | '.join(sides)} | fxloom / pickle | fxloom / torch.export "
        "| loaded equals traced |",
        "|---|" + "---:|" * len(sides) + "---:|---:|---|",
    ]
    for row in rows:
        sizes = {side: float(size) for side, size in row.size.items()}
        cells = " | ".join(_cell(row, sizes, side, 1 / 1024, 1) for side in sides)
        to_export = (
            f"{row.size['fxloom'] / row.size['torch.export']:.2f}"
            if "torch.export" in row.size
            else "n/a"
        )
        lines.append(
            f"| {row.model} | {cells} | {row.size['fxloom'] / row.size['pickle']:.2f} "
            f"| {to_export} | {row.equal} |"
        )
    return lines


def summary_lines(rows: list[Row]) -> list[str]:
    ratios = [paired_ratio(row.load, "fxloom", "pickle") for row in rows]
    worst = max(zip(ratios, (row.model for row in rows)))
    met = "met" if worst[0] <= 1.0 else "NOT met"
    ready = [paired_ratio(row.ready, "fxloom", "pickle") for row in rows]
    worst_ready = max(zip(ready, (row.model for row in rows)))
    lines = [
        f"- {met}: fxloom load no slower than unpickling the same GraphModule: fxloom / pickle "
        f"load median {statistics.median(ratios):.2f}, worst {worst[0]:.2f} ({worst[1]})",
        f"- ready to run (both have generated and compiled forward): fxloom / pickle median "
        f"{statistics.median(ready):.2f}, worst {worst_ready[0]:.2f} ({worst_ready[1]})",
    ]
    if any("torch.export" in row.load for row in rows):
        exported = [
            paired_ratio(row.load, "fxloom", "torch.export")
            for row in rows
            if "torch.export" in row.load
        ]
        lines.append(
            f"- fxloom load / torch.export.load (of its own program): median "
            f"{statistics.median(exported):.2f}"
        )
    failures = sorted({f"{side} on {row.model}" for row in rows for side in row.failed})
    if failures:
        lines.append(f"- n/a: {', '.join(failures)}")
    return lines


def markdown(rows: list[Row], repeats: int, command: str, loads: tuple[float, float]) -> str:
    lines = [
        f"## Save and load — {date.today().isoformat()}",
        "",
        f"{machine_line()}; {torch.get_num_threads()} torch threads. `{command}`. Median of "
        f"{repeats} warm runs per side (after one untimed run), sides rotating which goes "
        "first, garbage collector off inside timed regions; files in a temporary directory. "
        "pickle = torch.save / torch.load(weights_only=False) of the fxloom-traced GraphModule; "
        "torch.fx = the same of torch.fx.symbolic_trace's; n/a = that side cannot capture "
        "or save the model.",
        "",
        *time_table(rows, "load"),
        "",
        *time_table(rows, "ready"),
        "",
        *time_table(rows, "save"),
        "",
        *size_table(rows),
        "",
        *summary_lines(rows),
        "",
        noise_line(loads, "."),
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="mlp_tiny only, 3 repeats")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=15, help="timed runs per side")
    parser.add_argument("--record", action="store_true", help="append the tables to RESULTS.md")
    args = parser.parse_args()
    models, repeats = (["mlp_tiny"], 3) if args.quick else (args.models, args.repeats)
    freeze_startup_heap()
    load_before = load_average()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_serialize.") as directory:
        for name in models:
            rows.append(measure(name, repeats, Path(directory)))
            print(f"{name}: done", flush=True)
    command = "python benchmarks/bench_serialize.py" + (" --quick" if args.quick else "")
    if not args.quick and tuple(args.models) != MODELS:
        command += f" --models {' '.join(args.models)}"
    if not args.quick and args.repeats != 15:
        command += f" --repeats {args.repeats}"
    publish(markdown(rows, repeats, command, (load_before, load_average())), args.record)


if __name__ == "__main__":
    main()
