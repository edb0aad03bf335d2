"""``fxloom export MODEL``: export a model to ATen operators; print the program and its signature.

MODEL is a zoo name or ``package.module:factory`` (see ``fxloom.cli.model_spec``); it is exported
with ``fxloom.export.export`` on its example inputs (a tuple: positional, a dict: keyword). The
command prints a one-line summary (``signature_summary``), the program's Python code (or, with
``--graph``, its graph in the IR's text form), and its graph signature: what each placeholder
lifts and what each output is. ``--dynamic-batch`` exports with dimension 0 of the batched
inputs dynamic (one ``Dim("batch")``) and prints the range and shape constraints. ``--check`` also runs ``ep.module()`` on the example inputs and
compares it with the model run eagerly (exit code 1 when they differ).

Depends on: ``fxloom.cli.model_spec``, ``fxloom.export``, rich.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import torch

from fxloom.cli.output import add_output_argument, write_output

__all__ = [
    "add_arguments",
    "batch_shapes",
    "matches_eager",
    "matches_outputs",
    "run",
    "signature_summary",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fxloom export``."""
    parser.add_argument("model", metavar="MODEL", help="a zoo model name or package.module:factory")
    parser.add_argument(
        "--graph",
        action="store_true",
        help="print the graph in the IR's text form instead of the generated Python code",
    )
    parser.add_argument(
        "--dynamic-batch",
        action="store_true",
        help="make dimension 0 of every batched input one Dim('batch') (inputs whose "
        "dimension 0 has the first input's size); prints the range and shape constraints",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="also run ep.module() on the example inputs and compare with eager PyTorch "
        "(exit code 1 if they differ)",
    )
    add_output_argument(parser, "the exported program")


def run(args: argparse.Namespace) -> int:
    """Export and print; returns the exit code (errors are raised, for the CLI to report)."""
    from rich.console import Console
    from rich.syntax import Syntax
    from rich.text import Text

    from fxloom.cli.model_spec import example_inputs_of, load_model, split_inputs
    from fxloom.export import export

    loaded = load_model(args.model)
    example_inputs_of(loaded, "export runs the model on them")
    positional, keywords = split_inputs(loaded.inputs)
    shapes = batch_shapes(loaded.model, positional, keywords) if args.dynamic_batch else None
    ep = export(loaded.model, positional, keywords, dynamic_shapes=shapes)
    console = Console()
    if not console.is_terminal:
        console.width = 160  # a pipe or a file: don't fold the code into 80 columns
    console.print(Text(f"{loaded.name}: {signature_summary(ep)}", style="bold"))
    console.print()
    if args.graph:
        console.print(Text(str(ep.graph)), soft_wrap=True)
    else:
        code = ep.graph_module.code.strip("\n")
        console.print(Syntax(code, "python", background_color="default"), soft_wrap=True)
    console.print()
    console.print(Text("Graph signature:", style="bold"))
    console.print(Text(str(ep.graph_signature)), soft_wrap=True)
    if args.dynamic_batch:
        console.print(Text(f"Range constraints: {ep.range_constraints}"), soft_wrap=True)
        for line in ep.shape_constraints:
            console.print(Text(f"Shape constraint: {line}"), soft_wrap=True)
    saved = write_output(ep, args.output)
    if saved is not None:
        console.print(Text(saved))
    if not args.check:
        return 0
    matches = matches_eager(ep, loaded.model, positional, keywords)
    console.print()
    console.print(Text(f"ep.module() matches eager PyTorch on the example inputs: {matches}"))
    return 0 if matches else 1


def batch_shapes(model: torch.nn.Module, positional: tuple, keywords: dict) -> dict[str, Any]:
    """``dynamic_shapes`` (by forward's parameter names) with one ``Dim("batch")``: see
    ``fxloom.values.symbolic.dynamic_shapes.batch_dims``."""
    from fxloom.values.signature import bind
    from fxloom.values.symbolic.dynamic_shapes import batch_dims

    return batch_dims(bind(model.forward, positional, keywords, defaults=False))


def signature_summary(ep: Any) -> str:
    """One line: node and operator counts, then what the inputs and outputs are, by kind.

    >>> import torch
    >>> from fxloom.export import export
    >>> ep = export(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
    >>> signature_summary(ep)
    '6 nodes, 2 operator calls; inputs: 2 parameters, 1 user input; outputs: 1 user output'
    """
    calls = sum(node.op == "call_function" for node in ep.graph.nodes)
    inputs = Counter(spec.kind.name for spec in ep.graph_signature.input_specs)
    outputs = Counter(spec.kind.name for spec in ep.graph_signature.output_specs)
    return (
        f"{len(ep.graph.nodes)} nodes, {calls} operator call{'s' if calls != 1 else ''}; "
        f"inputs: {_counted(inputs)}; outputs: {_counted(outputs)}"
    )


def _counted(kinds: Counter[str]) -> str:
    """``Counter({"PARAMETER": 2})`` -> ``2 parameters`` (kinds in the order they came)."""
    if not kinds:
        return "none"
    words = []
    for kind, count in kinds.items():
        name = kind.lower().replace("_", " ")
        words.append(f"{count} {name}{'s' if count != 1 else ''}")
    return ", ".join(words)


def matches_eager(ep: Any, model: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
    """Whether ``ep.module()`` and ``model`` give the same outputs on ``args``/``kwargs``."""
    with torch.no_grad():
        return matches_outputs(ep.module()(*args, **kwargs), model(*args, **kwargs))


def matches_outputs(actual: Any, expected: Any) -> bool:
    """Whether two outputs have the same leaves (tensors close, other values equal)."""
    from fxloom.pytree import tree_leaves

    wanted, got = tree_leaves(expected), tree_leaves(actual)
    return len(wanted) == len(got) and all(_same(a, b) for a, b in zip(got, wanted))


def _same(got: Any, wanted: Any) -> bool:
    if isinstance(wanted, torch.Tensor):
        return (
            isinstance(got, torch.Tensor)
            and got.shape == wanted.shape
            and torch.allclose(got, wanted, rtol=1e-4, atol=1e-5)
        )
    return bool(got == wanted)
