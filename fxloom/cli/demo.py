"""`fxloom demo`: a guided tour of the core IR, in named steps.

The tour builds a graph by hand with the torch.fx-compatible API (``Graph.placeholder``,
``get_attr``, ``call_function``, ``call_module``, ``call_method``, ``output``), wraps it in a
``GraphModule``, shows the graph three ways (text, table, generated code), runs it and checks
the result against the same computation written directly in eager PyTorch. Then it captures
graphs automatically: ``fxloom.symbolic_trace`` traces two embedded models from
``fxloom.zoo`` (``mlp_tiny``, ``resnet_tiny``, ``transformer_tiny``), shows their graphs and code, and checks the
traced modules against the models run eagerly, and saves one with ``fxloom.save`` and loads it
back (``fxloom.cli.demo_save``). Last, the passes (``fxloom.cli.demo_passes``):
shapes propagated into ``node.meta``, a cost table for ResNet-50, batch norms fused into
convolutions (with the latency change), and a drawing of a graph; then export
(``fxloom.cli.demo_export``): a zoo model exported to ATen operators, its signature summary,
its cost, and ``ep.module()`` checked against eager; last, quantization
(``fxloom.cli.demo_quantize``): a DeepRecommender where int8 pays, its speedup, error and
report; and lowering (``fxloom.cli.demo_lower``): a zoo model run by ONNX Runtime, its
speedup and its check against eager; and ``fxloom.compile`` (``fxloom.cli.demo_compile``): a
model with a ``print`` and a branch on data, compiled, checked, and explained. The final
verdict covers every check.

Each step is a function of the shared ``DemoState``; ``STEPS`` lists them in order. To extend
the tour (passes, export, ...), write a step function and add a row to ``STEPS``.

Depends on: fxloom's core IR (Graph, GraphModule), fxloom.symbolic_trace, fxloom.zoo, torch,
rich.
"""

from __future__ import annotations

import inspect
import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from torch import nn

import fxloom
from fxloom import zoo
from fxloom.cli import demo_compile, demo_export, demo_lower, demo_passes, demo_quantize, demo_save
from fxloom.cli.console import cli_console

SEED = 0
SMALL_MODEL = "mlp_tiny"  # shown in full: table and code
BIG_MODEL = "resnet_tiny"  # shown trimmed: node counts and the first CODE_PREVIEW_LINES
TRANSFORMER_MODEL = "transformer_tiny"  # shown trimmed too
CODE_PREVIEW_LINES = 25


class DemoRoot(nn.Module):
    """The root module: the graph's get_attr and call_module nodes name its members."""

    def __init__(self) -> None:
        super().__init__()
        self.param = nn.Parameter(torch.rand(3, 4))
        self.linear = nn.Linear(4, 5)


def build_graph() -> fxloom.Graph:
    """Build clamp(linear(x + param), 0, 1) node by node, one node per opcode."""
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    param = graph.get_attr("param")
    added = graph.call_function(operator.add, (x, param))
    projected = graph.call_module("linear", (added,))
    clamped = graph.call_method("clamp", (projected,), {"min": 0.0, "max": 1.0})
    graph.output(clamped)
    return graph


def eager_reference(root: DemoRoot, x: torch.Tensor) -> torch.Tensor:
    """The same computation written directly in PyTorch, without fxloom."""
    return root.linear(x + root.param).clamp(min=0.0, max=1.0)


@dataclass(frozen=True)
class TracedModel:
    """A zoo model, its example inputs and what ``fxloom.symbolic_trace`` made of it."""

    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    traced: fxloom.GraphModule


@dataclass
class DemoState:
    """What the steps share: each step reads what earlier steps left and adds its own."""

    console: Console
    root: DemoRoot | None = None
    graph: fxloom.Graph | None = None
    module: fxloom.GraphModule | None = None
    results_match: bool | None = None
    traced: dict[str, TracedModel] = field(default_factory=dict)  # by zoo model name
    traced_match: bool | None = None
    save_match: bool = True  # False when a model loaded with fxloom.load differs from the saved
    passes_match: bool = True  # False once a transformed model differs from eager
    export_match: bool = True  # False when an exported program differs from eager
    quantize_match: bool = True  # False when the int8 model is too far from fp32
    lower_match: bool = True  # False when the model lowered to ONNX Runtime differs from eager
    compile_match: bool = True  # False when the model compiled with fxloom.compile differs
    compile_skipped: bool = False  # Python 3.10: fxloom.compile reads 3.11+ bytecode only
    drawing_dir: Path = field(default_factory=lambda: Path("fxloom-demo"))


@dataclass(frozen=True)
class Step:
    title: str
    run: Callable[[DemoState], None]


def make_root(state: DemoState) -> None:
    state.root = DemoRoot()
    _say(state, "A plain nn.Module owns the tensors; the graph will refer to them by name:")
    _show_plain(state, repr(state.root))
    _say(state, f"param: Parameter of shape {tuple(state.root.param.shape)}")


def make_graph(state: DemoState) -> None:
    state.graph = build_graph()
    _say(state, "No tracing yet: the graph is built by calling the Graph API directly.")
    try:
        _show_python(state, inspect.getsource(build_graph))
    except OSError:  # no source on disk (e.g. a zipped install); the printed graph suffices
        pass
    _say(state, "print(graph) shows the IR, one node per line:")
    _show_plain(state, str(state.graph))


def tabulate_graph(state: DemoState) -> None:
    _say(state, "graph.print_tabular() lists each node's opcode, name, target, args and kwargs:")
    state.graph.print_tabular(file=state.console.file)


def generate_code(state: DemoState) -> None:
    state.module = fxloom.GraphModule(state.root, state.graph)
    _say(state, "GraphModule(root, graph) generates forward() from the graph. gm.code:")
    _show_python(state, state.module.code.strip())


def run_and_compare(state: DemoState) -> None:
    x = torch.rand(3, 4)
    actual = state.module(x)
    expected = eager_reference(state.root, x)
    same_shape = actual.shape == expected.shape
    state.results_match = same_shape and torch.allclose(actual, expected)
    _say(state, "Run gm(x) on a random x and compute the same thing in eager PyTorch:")
    _show_plain(state, inspect.getsource(eager_reference).strip())
    table = Table(show_header=True, header_style="bold")
    table.add_column("")
    table.add_column("shape")
    table.add_column("max |gm(x) - eager(x)|")
    table.add_column("torch.allclose")
    difference = (actual - expected).abs().max().item() if same_shape else float("nan")
    table.add_row("gm(x)", str(tuple(actual.shape)), f"{difference:.3g}", str(state.results_match))
    table.add_row("eager", str(tuple(expected.shape)), "", "")
    state.console.print(table)


def transform_graph(state: DemoState) -> None:
    """Edit the graph in place: clamp(v, 0, 1) becomes sigmoid(v); the code follows."""
    graph = state.module.graph
    (clamp,) = [n for n in graph.nodes if n.op == "call_method" and n.target == "clamp"]
    with graph.inserting_after(clamp):
        sigmoid = graph.call_function(torch.sigmoid, (clamp.args[0],))
    clamp.replace_all_uses_with(sigmoid)
    graph.erase_node(clamp)
    graph.lint()
    _say(state, "Edit the graph in place (clamp -> torch.sigmoid); the code is regenerated on use:")
    _show_python(state, state.module.code.strip())
    x = torch.rand(3, 4)
    expected = torch.sigmoid(state.root.linear(x + state.root.param))
    matches = torch.allclose(state.module(x), expected)
    state.results_match = bool(state.results_match) and matches
    _say(state, f"the edited module matches torch.sigmoid(linear(x + param)): {matches}")


def trace_small_model(state: DemoState) -> None:
    traced = _trace_zoo_model(state, SMALL_MODEL)
    _say(
        state, f"fxloom.symbolic_trace runs {SMALL_MODEL}'s forward on proxies and records a graph:"
    )
    traced.graph.print_tabular(file=state.console.file)
    _say(state, "Its generated code:")
    _show_python(state, traced.code.strip())


def trace_big_model(state: DemoState) -> None:
    _trace_with_preview(
        state,
        BIG_MODEL,
        "Blocks are traced through; layers are call_module, residual + call_function:",
    )


def trace_transformer_model(state: DemoState) -> None:
    _trace_with_preview(
        state,
        TRANSFORMER_MODEL,
        "Hand-written attention is traced op by op; sizes read from x.shape stay symbolic:",
    )


def _trace_with_preview(state: DemoState, name: str, note: str) -> None:
    traced = _trace_zoo_model(state, name)
    counts = Counter(node.op for node in traced.graph.nodes)
    summary = ", ".join(f"{count} {op}" for op, count in counts.items())
    _say(state, f"{len(traced.graph.nodes)} nodes: {summary}.")
    _say(state, note)
    lines = traced.code.strip().splitlines()
    _show_python(state, "\n".join(lines[:CODE_PREVIEW_LINES]))
    if len(lines) > CODE_PREVIEW_LINES:
        _say(state, f"... {len(lines) - CODE_PREVIEW_LINES} more lines")


def compare_traced_models(state: DemoState) -> None:
    _say(state, "Run each traced module and its eager model on the model's example inputs:")
    table = Table(show_header=True, header_style="bold")
    for column in ("model", "output shape", "max |traced - eager|", "torch.allclose"):
        table.add_column(column)
    all_match = bool(state.traced)
    for name, entry in state.traced.items():
        with torch.no_grad():
            actual = entry.traced(*entry.inputs)
            expected = entry.model(*entry.inputs)
        same_shape = actual.shape == expected.shape
        matches = same_shape and torch.allclose(actual, expected)
        difference = (actual - expected).abs().max().item() if same_shape else float("nan")
        table.add_row(name, str(tuple(actual.shape)), f"{difference:.3g}", str(matches))
        all_match = all_match and matches
    state.console.print(table)
    state.traced_match = all_match
    verdict = "match" if all_match else "MISMATCH"
    _say(state, f"traced models vs eager: {verdict}")


def _trace_zoo_model(state: DemoState, name: str) -> fxloom.GraphModule:
    model, inputs = zoo.build(name)
    traced = fxloom.symbolic_trace(model)
    state.traced[name] = TracedModel(model, inputs, traced)
    shapes = ", ".join(str(tuple(value.shape)) for value in inputs)
    _say(state, f"zoo.build({name!r}): {zoo.MODELS[name].description}")
    _say(state, f"example input{'s' if len(inputs) > 1 else ''}: {shapes}")
    return traced


STEPS: tuple[Step, ...] = (
    Step("Make the root module", make_root),
    Step("Build a graph by hand", make_graph),
    Step("Tabulate the graph", tabulate_graph),
    Step("Generate Python code", generate_code),
    Step("Run it and compare with eager PyTorch", run_and_compare),
    Step("Transform the graph and run it again", transform_graph),
    Step(f"Trace an embedded model: {SMALL_MODEL}", trace_small_model),
    Step(f"Trace a bigger embedded model: {BIG_MODEL}", trace_big_model),
    Step(f"Trace a transformer-style model: {TRANSFORMER_MODEL}", trace_transformer_model),
    Step("Compare the traced models with eager PyTorch", compare_traced_models),
    Step(f"Save and load a traced model: {demo_save.SAVE_MODEL}", demo_save.save_and_load),
    Step("Propagate shapes through a traced model", demo_passes.propagate_shapes),
    Step("Count FLOPs, parameters and memory: ResNet-50", demo_passes.count_cost),
    Step("Fuse batch norms into convolutions: ResNet-50", demo_passes.fuse_batch_norms),
    Step("Draw a traced graph", demo_passes.draw_graph),
    Step(f"Export a model to ATen operators: {demo_export.EXPORT_MODEL}", demo_export.export_model),
    Step(f"Quantize a model to int8: {demo_quantize.QUANTIZE_MODEL}", demo_quantize.quantize_model),
    Step(f"Lower a model to ONNX Runtime: {demo_lower.LOWER_MODEL}", demo_lower.lower_model),
    Step("Compile a model with a print and a branch on data", demo_compile.compile_model),
)


def run(console: Console | None = None, drawing_dir: str | Path = "fxloom-demo") -> int:
    """Run every step of the tour; return 0 if every result matches eager PyTorch, else 1.

    Drawings are written to ``drawing_dir``.
    """
    console = console if console is not None else cli_console()
    state = DemoState(console=console, drawing_dir=Path(drawing_dir))
    with torch.random.fork_rng():  # reproducible, without disturbing the caller's RNG
        torch.manual_seed(SEED)
        for number, step in enumerate(STEPS, start=1):
            console.print()
            console.rule(f"[bold]Step {number}/{len(STEPS)}: {step.title}", align="left")
            step.run(state)
    console.print()
    return _summarise(state)


def _summarise(state: DemoState) -> int:
    checks = (
        state.results_match,
        state.traced_match,
        state.save_match,
        state.passes_match,
        state.export_match,
        state.lower_match,
        state.compile_match,
    )
    if all(checks) and state.quantize_match:
        message = (
            "The generated code ran: the hand-built graph, the traced "
            f"{', '.join(state.traced)}, the fused model and the exported program match eager "
            "PyTorch; the int8 model is close to fp32.\nThe model lowered to ONNX Runtime "
            "matches eager PyTorch too"
            + (
                " (fxloom.compile skipped: it needs Python 3.11 or newer)."
                if state.compile_skipped
                else ", and so does the model compiled with fxloom.compile."
            )
        )
        state.console.print(Panel(message, title="OK", border_style="green", expand=False))
        return 0
    failed = [
        what
        for what, ok in (
            ("the hand-built GraphModule", state.results_match),
            ("the traced zoo models", state.traced_match),
            ("the model loaded with fxloom.load", state.save_match),
            ("the fused model", state.passes_match),
            ("the exported program", state.export_match),
            (f"the {demo_lower.LOWER_MODEL} lowered to ONNX Runtime", state.lower_match),
            ("the model compiled with fxloom.compile", state.compile_match),
        )
        if not ok
    ]
    if not state.quantize_match:
        failed.append(f"the int8 {demo_quantize.QUANTIZE_MODEL} (too far from fp32)")
    message = f"MISMATCH: {' and '.join(failed)} differ from eager PyTorch."
    state.console.print(Panel(message, title="FAILED", border_style="red", expand=False))
    return 1


def _say(state: DemoState, message: str) -> None:
    state.console.print(Text(message, style="dim"))


def _show_plain(state: DemoState, text: str) -> None:
    # Text(...) so brackets such as `[num_users=1]` are shown, not read as rich markup.
    state.console.print(Text(text), soft_wrap=True)


def _show_python(state: DemoState, source: str) -> None:
    state.console.print(Syntax(source, "python", background_color="default"), soft_wrap=True)
