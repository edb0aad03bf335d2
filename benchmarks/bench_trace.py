"""Tracing, generated-code and interpreter benchmark: fxloom against torch.fx, in one run.

Three parts, each timed on both libraries with the same models:

    trace        symbolic_trace(model) on CNNs, transformer encoders and long op chains, as
                 "trace -> GraphModule" (what the API returns: fxloom generates code lazily,
                 torch.fx eagerly) and "trace + codegen" (first call ready: fxloom's code is
                 forced with gm.code). The target, fxloom <= 0.5x torch.fx, is on the fair one.
    forward      the generated forward against the eager model on small tensors, where Python
                 overhead dominates (torch.set_num_threads(1), torch.no_grad()).
                 Target: fxloom / eager <= 1.05.
    interpreter  Interpreter(gm).run(*inputs) against the library's own generated forward;
                 overhead = interpreter - forward, and the ratio of overheads fxloom /
                 torch.fx (target <= 1.0). Also with one interpreter reused for every run.

Every measurement is the best of several runs, the libraries alternating which goes first;
the garbage collector is off inside timed regions (collected between them), as timeit does.
The forward part also gives each ratio to eager as the median of per-repeat ratios of runs
timed next to each other, which holds up better on a shared, busy machine. torch.fx is
imported here only as the comparison.

    python benchmarks/bench_trace.py                 # full sizes (chains of 1e3 .. 1e5 ops)
    python benchmarks/bench_trace.py --quick         # smoke run: small sizes, few repeats
    python benchmarks/bench_trace.py --parts trace   # one part only
    python benchmarks/bench_trace.py --record        # append the tables to RESULTS.md
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch import nn

import fxloom
from fxloom import zoo
from fxloom.zoo.resnet50 import ResNet50
from fxloom.zoo.transformer import TransformerTiny

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    Samples,
    compute_nodes,
    freeze_startup_heap,
    load_average,
    machine_line,
    noise_line,
    publish,
    rotated,
    timed,
)

LIBRARIES = {"fxloom": fxloom, "torch.fx": torch.fx}
PARTS = ("trace", "forward", "interpreter")
TRACE_TARGET = 0.5  # fxloom (trace + codegen) / torch.fx
FORWARD_TARGET = 1.05  # fxloom generated forward / eager
INTERPRETER_TARGET = 1.0  # fxloom interpreter overhead / torch.fx interpreter overhead
# (repeats, seconds per timed run) for the per-call parts. Many short runs rather than a few
# long ones: on a shared machine a short run is likelier to fall in a quiet moment.
FORWARD_TIMING = {"full": (60, 0.005), "quick": (2, 0.001)}
INTERPRETER_TIMING = {"full": (40, 0.01), "quick": (2, 0.001)}


# ----------------------------------------------------------------------------- models
class Chain(nn.Module):
    """``n`` elementwise ops in turn: ``x + 1``, ``x * 0.5``, ``torch.relu(x)``, ``x.neg()``.

    Traced, each op is one node (call_function for the first three, call_method for neg).
    """

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.n):
            step = i % 4
            if step == 0:
                x = x + 1
            elif step == 1:
                x = x * 0.5
            elif step == 2:
                x = torch.relu(x)
            else:
                x = x.neg()
        return x


def _seeded(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build().eval()


def mlp8() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    return _seeded(lambda: nn.Sequential(*layers)), (torch.randn(1, 16),)


def resnet50_like() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The zoo's ResNet-50 layout with widths 8..64 (not 64..512) and 10 classes."""
    model = _seeded(lambda: ResNet50(num_classes=10, base_width=8))
    return model, (torch.randn(1, 3, 32, 32),)


def transformer_12l() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    model = _seeded(lambda: TransformerTiny(num_layers=12))
    return model, zoo.transformer_tiny_inputs()


def chain(n: int) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    return lambda: (Chain(n), (torch.randn(4),))


def zoo_model(name: str) -> Callable[[], tuple[nn.Module, tuple[Any, ...]]]:
    return lambda: zoo.build(name)


@dataclass(frozen=True)
class Case:
    """A model to trace: how to build it with its inputs, and what the table says about it."""

    name: str
    build: Callable[[], tuple[nn.Module, tuple[Any, ...]]]
    note: str = ""
    # Used for both libraries if either cannot trace the model as it is.
    fallback_concrete_args: dict[str, Any] | None = None


TRANSFORMER_NOTE = "mask traced as an input (both tracers accept `mask is not None` on a proxy)"
CASES = {
    "mlp8": Case("mlp8", mlp8, "8 x (Linear(16,16), ReLU), batch 1"),
    "mlp_tiny": Case("mlp_tiny", zoo_model("mlp_tiny"), "zoo"),
    "resnet_tiny": Case("resnet_tiny", zoo_model("resnet_tiny"), "zoo"),
    "resnet50_like": Case(
        "resnet50_like", resnet50_like, "bottlenecks [3,4,6,3], widths 8..64, 32x32 input"
    ),
    "transformer_tiny": Case(
        "transformer_tiny",
        zoo_model("transformer_tiny"),
        f"zoo, 2 layers; {TRANSFORMER_NOTE}",
        fallback_concrete_args={"mask": None},
    ),
    "transformer_12l": Case(
        "transformer_12l",
        transformer_12l,
        f"TransformerTiny(num_layers=12); {TRANSFORMER_NOTE}",
        fallback_concrete_args={"mask": None},
    ),
}
for _exponent in (3, 4, 5):
    _name = f"chain_1e{_exponent}"
    CASES[_name] = Case(_name, chain(10**_exponent), f"{10**_exponent} ops on a 4-element tensor")


# ----------------------------------------------------------------------------- timing
def per_call(fn: Callable[..., object], args: tuple[Any, ...], number: int) -> float:
    """Seconds per ``fn(*args)``, over ``number`` back-to-back calls."""

    def calls() -> None:
        for _ in range(number):
            fn(*args)

    return timed(calls) / number


def calls_per_run(fn: Callable[..., object], args: tuple[Any, ...], seconds: float) -> int:
    """How many calls of ``fn`` take about ``seconds`` (doubling a trial count, as timeit does)."""
    fn(*args)  # warm-up: first-call work (lazy codegen, caches) is not what we time
    number = 1
    while True:
        elapsed = per_call(fn, args, number) * number
        if elapsed >= seconds / 4:
            return max(1, round(number * seconds / elapsed))
        number *= 2


def best_calls(
    callables: dict[str, tuple[Callable[..., object], tuple[Any, ...]]],
    repeats: int,
    seconds: float,
    samples: Samples,
    prefix: str,
) -> dict[str, float]:
    """Best seconds per call of each callable, timed in turn, rotating the order each repeat."""
    numbers = {label: calls_per_run(fn, args, seconds) for label, (fn, args) in callables.items()}
    labels = list(callables)
    for rep in range(repeats):
        for label in rotated(labels, rep):
            fn, args = callables[label]
            samples.add(f"{prefix} {label}", per_call(fn, args, numbers[label]))
    return {label: samples.best(f"{prefix} {label}") for label in labels}


def check_same_output(name: str, lib: str, gm: Any, model: nn.Module, inputs: tuple) -> None:
    with torch.no_grad():
        torch.testing.assert_close(gm(*inputs), model(*inputs), msg=f"{lib} traced {name} differs")


# ----------------------------------------------------------------------------- part 1
@dataclass
class TraceRow:
    case: Case
    nodes: dict[str, int]
    trace: dict[str, float]  # seconds, trace -> GraphModule as returned
    ready: dict[str, float]  # seconds, trace + codegen (first call ready)
    concrete_args: dict[str, Any] | None
    failures: dict[str, str]


def trace_once(lib: Any, model: nn.Module, concrete_args: dict | None) -> tuple[float, float]:
    """(trace -> GraphModule, trace + codegen) seconds for one trace of ``model``."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        gm = lib.symbolic_trace(model, concrete_args)
        traced = time.perf_counter()
        _ = gm.code  # fxloom generates and compiles forward here; torch.fx already has
        ready = time.perf_counter()
    finally:
        gc.enable()
    return traced - start, ready - start


def first_trace(case: Case, model: nn.Module, inputs: tuple) -> tuple[dict | None, dict, dict]:
    """Trace once with each library (checking outputs against eager); fall back to concrete args."""
    failures: dict[str, str] = {}
    nodes: dict[str, int] = {}
    for concrete_args in (None, case.fallback_concrete_args):
        failures.clear()
        for lib_name, lib in LIBRARIES.items():
            try:
                gm = lib.symbolic_trace(model, concrete_args)
            except Exception as err:  # the table reports it
                failures[lib_name] = f"{type(err).__name__}: {str(err).splitlines()[0][:80]}"
                continue
            nodes[lib_name] = compute_nodes(gm)
            if concrete_args is None:  # with them, the inputs no longer match the signature
                check_same_output(case.name, lib_name, gm, model, inputs)
        if not failures or case.fallback_concrete_args is None:
            return concrete_args, nodes, failures
    return concrete_args, nodes, failures


def trace_repeats(nodes: int, quick: bool) -> int:
    if quick:
        return 1
    return 20 if nodes <= 2_000 else 5 if nodes <= 20_000 else 3


def run_trace(case_names: list[str], quick: bool, samples: Samples) -> list[TraceRow]:
    rows = []
    for name in case_names:
        case = CASES[name]
        model, inputs = case.build()
        concrete_args, nodes, failures = first_trace(case, model, inputs)
        sides = [lib for lib in LIBRARIES if lib not in failures]
        for rep in range(trace_repeats(max(nodes.values(), default=0), quick)):
            for lib_name in rotated(sides, rep):
                traced, ready = trace_once(LIBRARIES[lib_name], model, concrete_args)
                samples.add(f"trace {name} {lib_name} trace", traced)
                samples.add(f"trace {name} {lib_name} ready", ready)
        gc.collect()
        row = TraceRow(
            case,
            nodes,
            {lib: samples.best(f"trace {name} {lib} trace") for lib in sides},
            {lib: samples.best(f"trace {name} {lib} ready") for lib in sides},
            concrete_args,
            failures,
        )
        rows.append(row)
        print(
            f"trace  {name:17} nodes {_pair(nodes, '{}')}  trace {_pair(row.trace, '{:.2f}', 1e3)} ms"
            f"  trace+codegen {_pair(row.ready, '{:.2f}', 1e3)} ms"
            f"  ratio {_ratio(row.ready)}  {'; '.join(failures.values())}",
            flush=True,
        )
    return rows


# ----------------------------------------------------------------------------- part 2
@dataclass
class ForwardRow:
    case: Case
    per_call: dict[str, float]  # "eager", "fxloom", "torch.fx": best seconds per call
    paired: dict[str, float]  # "fxloom", "torch.fx": median of per-repeat ratios to eager


def traced_modules(case: Case) -> tuple[nn.Module, tuple, dict[str, Any]]:
    model, inputs = case.build()
    modules = {lib_name: lib.symbolic_trace(model) for lib_name, lib in LIBRARIES.items()}
    for lib_name, gm in modules.items():
        check_same_output(case.name, lib_name, gm, model, inputs)
    return model, inputs, modules


def run_forward(case_names: list[str], quick: bool, samples: Samples) -> list[ForwardRow]:
    rows = []
    repeats, seconds = FORWARD_TIMING["quick" if quick else "full"]
    for name in case_names:
        model, inputs, modules = traced_modules(CASES[name])
        callables = {"eager": (model, inputs)}
        callables.update({lib: (gm, inputs) for lib, gm in modules.items()})
        with torch.no_grad():
            best = best_calls(callables, repeats, seconds, samples, f"forward {name}")
        prefix = f"forward {name}"
        paired = {
            lib: samples.paired_ratio(f"{prefix} {lib}", f"{prefix} eager") for lib in modules
        }
        rows.append(ForwardRow(CASES[name], best, paired))
        eager = best["eager"]
        print(
            f"forward {name:16} eager {eager * 1e6:8.1f} us  fxloom {best['fxloom'] * 1e6:8.1f} us"
            f"  torch.fx {best['torch.fx'] * 1e6:8.1f} us  fxloom/eager {best['fxloom'] / eager:5.3f}"
            f" (paired {paired['fxloom']:5.3f})  torch.fx/eager {best['torch.fx'] / eager:5.3f}"
            f" (paired {paired['torch.fx']:5.3f})",
            flush=True,
        )
    return rows


# ----------------------------------------------------------------------------- part 3
@dataclass
class InterpreterRow:
    case: Case
    nodes: int
    per_call: dict[str, float]  # "<lib> forward", "<lib> new+run", "<lib> run": seconds per call

    def overhead(self, lib: str, kind: str) -> float:
        return self.per_call[f"{lib} {kind}"] - self.per_call[f"{lib} forward"]

    def overhead_ratio(self, kind: str) -> float:
        theirs = self.overhead("torch.fx", kind)
        return self.overhead("fxloom", kind) / theirs if theirs > 0 else float("nan")


def run_interpreter(case_names: list[str], quick: bool, samples: Samples) -> list[InterpreterRow]:
    rows = []
    repeats, seconds = INTERPRETER_TIMING["quick" if quick else "full"]
    for name in case_names:
        model, inputs, modules = traced_modules(CASES[name])
        callables: dict[str, tuple[Callable[..., object], tuple]] = {}
        for lib_name, gm in modules.items():
            interpreter_cls = LIBRARIES[lib_name].Interpreter
            reused = interpreter_cls(gm)
            callables[f"{lib_name} forward"] = (gm, inputs)
            callables[f"{lib_name} new+run"] = (
                lambda *args, cls=interpreter_cls, gm=gm: cls(gm).run(*args),
                inputs,
            )
            callables[f"{lib_name} run"] = (reused.run, inputs)
            with torch.no_grad():
                torch.testing.assert_close(reused.run(*inputs), model(*inputs))
        with torch.no_grad():
            best = best_calls(callables, repeats, seconds, samples, f"interpreter {name}")
        row = InterpreterRow(CASES[name], compute_nodes(modules["fxloom"]), best)
        rows.append(row)
        print(
            f"interp {name:16} fxloom fwd {best['fxloom forward'] * 1e6:8.1f} us "
            f"new+run {best['fxloom new+run'] * 1e6:8.1f} us  torch.fx fwd "
            f"{best['torch.fx forward'] * 1e6:8.1f} us new+run {best['torch.fx new+run'] * 1e6:8.1f} us"
            f"  overhead ratio {row.overhead_ratio('new+run'):5.2f}"
            f" (reused interpreter {row.overhead_ratio('run'):5.2f})",
            flush=True,
        )
    return rows


# ----------------------------------------------------------------------------- tables
def _pair(values: dict[str, float], fmt: str, scale: float = 1) -> str:
    return " / ".join(
        fmt.format(values[lib] * scale) if lib in values else "fails" for lib in LIBRARIES
    )


def _ratio(values: dict[str, float]) -> str:
    if len(values) < 2 or not values["torch.fx"]:
        return "n/a"
    return f"{values['fxloom'] / values['torch.fx']:.2f}"


def _verdict(value: float, target: float) -> str:
    return "meets" if value <= target else "**misses**"


def trace_table(rows: list[TraceRow]) -> list[str]:
    lines = [
        "### Trace time",
        "",
        "Milliseconds. *trace* = `symbolic_trace(model)` as each API returns it (fxloom's "
        "GraphModule generates its code lazily, torch.fx's eagerly, so this favours fxloom); "
        "*trace + codegen* = the same followed by `gm.code`, i.e. ready for the first call "
        f"(the fair comparison; target ratio <= {TRACE_TARGET}). "
        "Nodes = graph nodes other than placeholders and the output.",
        "",
        "| model | nodes fxloom / torch.fx | trace: fxloom | torch.fx | ratio "
        "| trace + codegen: fxloom | torch.fx | ratio | target | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        notes = [row.case.note] if row.case.note else []
        notes += [f"{lib} cannot trace it: {why}" for lib, why in row.failures.items()]
        if row.concrete_args:
            notes.append(f"traced with concrete_args={row.concrete_args}")
        verdict = "n/a"
        if len(row.ready) == 2:
            verdict = _verdict(row.ready["fxloom"] / row.ready["torch.fx"], TRACE_TARGET)
        lines.append(
            f"| {row.case.name} | {_pair(row.nodes, '{}')} "
            f"| {_cell(row.trace, 'fxloom', 1e3, '.2f')} | {_cell(row.trace, 'torch.fx', 1e3, '.2f')} "
            f"| {_ratio(row.trace)} "
            f"| {_cell(row.ready, 'fxloom', 1e3, '.2f')} | {_cell(row.ready, 'torch.fx', 1e3, '.2f')} "
            f"| {_ratio(row.ready)} | {verdict} | {'; '.join(notes)} |"
        )
    return lines


def _cell(values: dict[str, float], lib: str, scale: float, fmt: str) -> str:
    return format(values[lib] * scale, fmt) if lib in values else "fails"


def forward_table(rows: list[ForwardRow]) -> list[str]:
    lines = [
        "### Generated forward against eager",
        "",
        "Microseconds per call (best run), `torch.set_num_threads(1)`, under `torch.no_grad()`. "
        "Ratios to eager two ways: *best* = best / best; *paired* = the median over repeats of "
        "the ratio of runs timed next to each other, which a machine slowed for a while by "
        f"other work affects less. Target fxloom / eager <= {FORWARD_TARGET}, judged on *paired*.",
        "",
        "| model | eager | fxloom gm | torch.fx gm | fxloom / eager: best | paired "
        "| torch.fx / eager: best | paired | target | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        t = row.per_call
        ours, theirs = t["fxloom"] / t["eager"], t["torch.fx"] / t["eager"]
        lines.append(
            f"| {row.case.name} | {t['eager'] * 1e6:.1f} | {t['fxloom'] * 1e6:.1f} "
            f"| {t['torch.fx'] * 1e6:.1f} | {ours:.3f} | {row.paired['fxloom']:.3f} "
            f"| {theirs:.3f} | {row.paired['torch.fx']:.3f} "
            f"| {_verdict(row.paired['fxloom'], FORWARD_TARGET)} | {row.case.note} |"
        )
    return lines


def interpreter_table(rows: list[InterpreterRow]) -> list[str]:
    lines = [
        "### Interpreter against generated forward",
        "",
        "Microseconds per call. *new+run* = `Interpreter(gm).run(*inputs)` (construction "
        "included, as usually written); *run* = one interpreter reused for every call. "
        "Overhead = interpreter - the same library's generated forward; ratio = fxloom "
        f"overhead / torch.fx overhead (target <= {INTERPRETER_TARGET}).",
        "",
        "| model | nodes | fxloom: forward | new+run | run | torch.fx: forward | new+run | run "
        "| overhead ratio, new+run | target | overhead ratio, run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        t = {label: seconds * 1e6 for label, seconds in row.per_call.items()}
        ratio = row.overhead_ratio("new+run")
        lines.append(
            f"| {row.case.name} | {row.nodes} "
            f"| {t['fxloom forward']:.1f} | {t['fxloom new+run']:.1f} | {t['fxloom run']:.1f} "
            f"| {t['torch.fx forward']:.1f} | {t['torch.fx new+run']:.1f} | {t['torch.fx run']:.1f} "
            f"| {ratio:.2f} | {_verdict(ratio, INTERPRETER_TARGET)} "
            f"| {row.overhead_ratio('run'):.2f} |"
        )
    return lines


def markdown(results: dict[str, list], samples: Samples, loads: tuple, quick: bool) -> str:
    command = "python benchmarks/bench_trace.py" + (" --quick" if quick else "")
    mode = "quick" if quick else "full"
    lines = [
        f"## Tracing, generated code and interpreter — {date.today().isoformat()}",
        "",
        f"{machine_line()}. `{command}`. Best of N runs "
        f"(trace: {_trace_repeats_text(quick)}; forward: {FORWARD_TIMING[mode][0]} runs of "
        f"{FORWARD_TIMING[mode][1] * 1e3:g} ms; interpreter: {INTERPRETER_TIMING[mode][0]} runs "
        f"of {INTERPRETER_TIMING[mode][1] * 1e3:g} ms), rotating which library (or eager) "
        "goes first; garbage collector off inside timed regions; one thread.",
        "",
    ]
    tables = {"trace": trace_table, "forward": forward_table, "interpreter": interpreter_table}
    for part, rows in results.items():
        lines += tables[part](rows) + [""]
    label, spread = samples.noisiest()
    lines += [
        noise_line(
            loads,
            ". Spread of the median run over the best run: "
            f"{samples.typical_spread() * 100:.0f}% typically, {spread * 100:.0f}% at most "
            f"({label}); the tables show best runs.",
        ),
        "",
    ]
    return "\n".join(lines)


def _trace_repeats_text(quick: bool) -> str:
    if quick:
        return f"{trace_repeats(0, True)} run"
    counts = [trace_repeats(n, False) for n in (10**3, 10**4, 10**5)]
    return f"{counts[0]} up to 2e3 nodes, {counts[1]} up to 2e4, {counts[2]} beyond"


# ----------------------------------------------------------------------------- main
def plan(quick: bool) -> dict[str, list[str]]:
    """The cases each part runs."""
    chains = ["chain_1e3"] if quick else ["chain_1e3", "chain_1e4", "chain_1e5"]
    models = ["resnet_tiny", "resnet50_like", "transformer_tiny", "transformer_12l"]
    small = ["mlp8", "mlp_tiny", "transformer_tiny"]
    return {"trace": models + chains, "forward": small, "interpreter": small + ["chain_1e3"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (smoke)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--record", action="store_true", help="append the tables to RESULTS.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    freeze_startup_heap()
    runners = {"trace": run_trace, "forward": run_forward, "interpreter": run_interpreter}
    cases = plan(args.quick)
    samples = Samples()
    load_before = load_average()
    results = {part: runners[part](cases[part], args.quick, samples) for part in args.parts}
    table = markdown(results, samples, (load_before, load_average()), args.quick)
    publish(table, args.record)


if __name__ == "__main__":
    main()
