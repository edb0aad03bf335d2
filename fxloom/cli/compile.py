"""``fxloom compile MODEL``: compile a model with fxloom.compile, run it, compare with eager.

MODEL is a zoo name or ``package.module:factory`` (see ``fxloom.cli.model_spec``). The model
is compiled (``fxloom.compile``), called on its example inputs twice (the first call
compiles, the second reuses the cache), and compared with the model run eagerly. The command
prints one line (graphs, breaks, guards, compile time, equal to eager or not); ``--explain``
prints the whole report (graphs, every break with file:line, why and what to do, the
guards), ``--code`` the generated Python of each piece.

Depends on: ``fxloom.cli.model_spec``, ``fxloom.bytecode``, rich.
"""

from __future__ import annotations

import argparse
import time

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fxloom compile``."""
    parser.add_argument("model", metavar="MODEL", help="a zoo model name or package.module:factory")
    parser.add_argument(
        "--explain", action="store_true", help="print the report: graphs, breaks, guards"
    )
    parser.add_argument(
        "--code", action="store_true", help="print the generated Python of every compiled piece"
    )
    parser.add_argument(
        "--fullgraph",
        action="store_true",
        help="fail on the first graph break, naming the line, instead of splitting there",
    )


def run(args: argparse.Namespace) -> int:
    """Compile, run and report; returns the exit code (1 when the results differ from eager)."""
    import torch
    from rich.text import Text

    import fxloom
    from fxloom.cli.console import cli_console
    from fxloom.cli.export import matches_outputs
    from fxloom.cli.model_spec import example_inputs_of, load_model, split_inputs

    loaded = load_model(args.model)
    example_inputs_of(loaded, "compiling runs the model on them")
    positional, keywords = split_inputs(loaded.inputs)
    model = loaded.model.eval()
    compiled = fxloom.compile(model, fullgraph=args.fullgraph)
    with torch.no_grad():
        started = time.perf_counter()
        compiled(*positional, **keywords)
        first = time.perf_counter() - started
        got = compiled(*positional, **keywords)
        expected = model(*positional, **keywords)
    same = matches_outputs(got, expected)
    report = compiled.explain()
    console = cli_console()
    console.print(
        Text(
            f"{loaded.name}: {report.graph_count} graph(s), {report.break_count} break(s), "
            f"first call {first * 1e3:.1f} ms, "
            + ("equal to eager" if same else "DIFFERS from eager")
        )
    )
    if args.explain:
        console.print(report)
    if args.code:
        console.print(Text(compiled.code))
    return 0 if same else 1
