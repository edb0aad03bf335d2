"""The demo's tour of the passes (torch.fx paper, section 6): shapes, cost, fusion, drawing.

Each function is one step of ``fxloom demo`` (see ``fxloom.cli.demo.STEPS``) and takes the demo's
shared state: ``state.console`` to print on, ``state.traced`` (zoo models traced by earlier
steps), ``state.passes_match`` (False once a transformed model stops matching eager) and
``state.drawing_dir`` (where drawings are written).

Depends on: fxloom.passes, fxloom.zoo, torch, rich.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from rich.table import Table
from rich.text import Text

import fxloom
from fxloom import zoo
from fxloom.cli.timing import compare_latency

if TYPE_CHECKING:
    from fxloom.cli.demo import DemoState

SHAPES_MODEL = "resnet_tiny"
COST_MODEL = "resnet50"
COST_BATCH = 256  # on the meta device: no data, no compute, no memory
FUSION_MODEL = "resnet50"
FUSION_RUNS = 7  # ResNet-50 at batch 1 on one thread: about 0.1 s a call
SHAPE_ROWS = 12


def propagate_shapes(state: DemoState) -> None:
    from fxloom.passes.shape_prop import ShapeProp

    entry = state.traced[SHAPES_MODEL]
    ShapeProp(entry.traced).propagate(*entry.inputs)
    _say(
        state,
        f"ShapeProp(gm).propagate(x) stores node.meta['tensor_meta'] on every node of {SHAPES_MODEL}:",
    )
    table = Table(show_header=True, header_style="bold")
    for column in ("node", "op", "shape", "dtype"):
        table.add_column(column)
    nodes = [node for node in entry.traced.graph.nodes if "tensor_meta" in node.meta]
    for node in nodes[:SHAPE_ROWS]:
        meta = node.meta["tensor_meta"]
        dtype = str(meta.dtype).removeprefix("torch.")
        table.add_row(node.name, node.op, str(tuple(meta.shape)), dtype)
    state.console.print(table)
    if len(nodes) > SHAPE_ROWS:
        _say(state, f"... {len(nodes) - SHAPE_ROWS} more nodes")


def count_cost(state: DemoState) -> None:
    from fxloom.passes.cost import analyze_cost

    model, _ = zoo.build(COST_MODEL)
    traced = fxloom.symbolic_trace(model)
    batch = torch.empty(COST_BATCH, 3, 224, 224, device="meta")
    start = time.perf_counter()
    report = analyze_cost(traced, batch, mode="meta")
    seconds = time.perf_counter() - start
    _say(
        state,
        f"analyze_cost(gm, x) on {COST_MODEL} at batch {COST_BATCH}x3x224x224, on the meta device "
        f"(shapes only, no data): {seconds:.2f} s",
    )
    state.console.print(Text(report.summary()))
    state.console.print(report.table(by="module", depth=1))


def fuse_batch_norms(state: DemoState) -> None:
    from fxloom.passes.fuse import fuse

    model, inputs = zoo.build(FUSION_MODEL)
    fused = fuse(model)
    folded = len(fused.meta["fuse"]["fused"])
    _say(
        state,
        f"fuse(model) folds each batch norm into the conv before it: {folded} folded in {FUSION_MODEL}.",
    )
    with torch.no_grad():
        expected = model(*inputs)
        actual = fused(*inputs)
    latency = compare_latency(
        lambda: model(*inputs), lambda: fused(*inputs), labels=("eager", "fused"), runs=FUSION_RUNS
    )
    matches = torch.allclose(actual, expected, rtol=1e-3, atol=1e-4)
    state.passes_match = state.passes_match and matches
    difference = (actual - expected).abs().max().item()
    table = Table(show_header=True, header_style="bold")
    timing = f"latency (median of {latency.runs}, {latency.threads} thread)"
    for column in ("", "call_module nodes", timing, "max |fused - eager|"):
        table.add_column(column)
    unfused_s, fused_s = latency.seconds
    table.add_row("eager", "-", f"{unfused_s * 1e3:.1f} ms", "")
    modules = sum(node.op == "call_module" for node in fused.graph.nodes)
    table.add_row("fused", str(modules), f"{fused_s * 1e3:.1f} ms", f"{difference:.2g}")
    state.console.print(table)
    _say(
        state, f"latency change: {100 * (fused_s / unfused_s - 1):+.0f}%; matches eager: {matches}"
    )


def draw_graph(state: DemoState) -> None:
    from fxloom.passes.graph_drawer import FxGraphDrawer, GraphvizNotFoundError

    entry = state.traced[SHAPES_MODEL]
    drawer = FxGraphDrawer(entry.traced, SHAPES_MODEL)
    state.drawing_dir.mkdir(parents=True, exist_ok=True)
    svg = state.drawing_dir / f"{SHAPES_MODEL}.svg"
    try:
        written = drawer.write(svg)
    except GraphvizNotFoundError as error:
        written = drawer.write(svg.with_suffix(".dot"))
        _say(state, f"Graphviz's dot is not installed, so only the DOT source was written. {error}")
    _say(
        state,
        "FxGraphDrawer colours nodes by opcode, puts tensor shapes on edges and boxes module "
        f"paths: wrote {written}",
    )


def _say(state: DemoState, message: str) -> None:
    state.console.print(Text(message, style="dim"))
