"""``fxloom cost MODEL``: trace a model, analyse its cost, print a summary and a rich table.

MODEL is a zoo name or ``package.module:factory`` (see ``fxloom.cli.model_spec``). The inputs are
the model's example inputs, with ``--input-shape`` replacing them in order (``1,3,224,224``,
``2,16:int64``); shapes are propagated on the meta device unless ``--real`` is given, so a batch
of 256 images costs no memory.

Depends on: ``fxloom.cli.model_spec``, ``fxloom.passes.cost``, rich.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

__all__ = ["InputShape", "add_arguments", "parse_input_shape", "run"]

InputShape = tuple[tuple[int, ...], "torch.dtype | None"]


def parse_input_shape(text: str) -> InputShape:
    """``"1,3,224,224"`` -> ``((1, 3, 224, 224), None)``; ``"2,16:int64"`` -> ``(..., torch.int64)``.

    >>> parse_input_shape("2,16:int64")
    ((2, 16), torch.int64)
    """
    sizes, _, dtype_name = text.partition(":")
    try:
        shape = tuple(int(size) for size in sizes.split(",") if size.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a shape: give sizes separated by commas, e.g. 1,3,224,224 "
            "(optionally with a dtype: 2,16:int64)"
        ) from None
    if any(size < 0 for size in shape):
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must not be negative")
    if not dtype_name:
        return shape, None
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise argparse.ArgumentTypeError(
            f"{text!r}: {dtype_name!r} is not a torch dtype (float32, float16, int64, bool, ...)"
        )
    return shape, dtype


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fxloom cost``."""
    parser.add_argument("model", metavar="MODEL", help="a zoo model name or package.module:factory")
    parser.add_argument(
        "--input-shape",
        metavar="SHAPE",
        action="append",
        type=parse_input_shape,
        default=[],
        help="an input's shape, e.g. 1,3,224,224 or 2,16:int64 (repeat for later inputs); "
        "replaces the example inputs in order; the dtype defaults to the example's",
    )
    parser.add_argument(
        "--by", choices=("module", "node"), default="module", help="one row per module or per node"
    )
    parser.add_argument(
        "--depth",
        type=int,
        default=1,
        metavar="N",
        help="module rows cut to N levels of the module path (default 1: the root's children)",
    )
    parser.add_argument(
        "--top", type=int, metavar="N", help="only the N rows with the most FLOPs (and the total)"
    )
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "--meta",
        dest="mode",
        action="store_const",
        const="meta",
        help="propagate shapes on the meta device only (default: meta, falling back to a real "
        "run when an operator has no meta kernel)",
    )
    how.add_argument(
        "--real", dest="mode", action="store_const", const="real", help="run on real tensors"
    )
    parser.set_defaults(mode="auto")


def run(args: argparse.Namespace) -> int:
    """Analyse and print; returns the exit code (errors are raised, for the CLI to report)."""
    from rich.text import Text

    from fxloom.cli.console import cli_console
    from fxloom.cli.model_spec import load_model, trace_model
    from fxloom.passes.cost import analyze_cost

    if args.depth < 1:
        raise ValueError(f"--depth must be at least 1, got {args.depth}")
    loaded = load_model(args.model)
    gm = trace_model(loaded)
    positional, keywords = _inputs(loaded.inputs, args.input_shape, real=args.mode == "real")
    report = analyze_cost(gm, *positional, mode=args.mode, **keywords)
    report.model = loaded.name
    console = cli_console()
    console.print(Text(report.summary()))
    console.print(report.table(by=args.by, depth=args.depth, top=args.top))
    return 0


def _inputs(
    examples: tuple[Any, ...] | dict[str, Any] | None, shapes: list[InputShape], real: bool
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs to analyse: the examples, with the first ones replaced by ``shapes``."""
    if examples is None and not shapes:
        raise ValueError(
            "the MODEL factory returned no example inputs: give their shapes with --input-shape "
            "(e.g. --input-shape 1,3,224,224)"
        )
    names = list(examples) if isinstance(examples, dict) else None
    values = list(examples.values() if isinstance(examples, dict) else examples or ())
    for position, (shape, dtype) in enumerate(shapes):
        example = values[position] if position < len(values) else None
        dtype = dtype or (example.dtype if isinstance(example, torch.Tensor) else torch.float32)
        value = _tensor(shape, dtype) if real else (shape, dtype)
        if position < len(values):
            values[position] = value
        elif names is None:
            values.append(value)
        else:
            raise ValueError(
                f"{len(shapes)} input shapes given, but the model's example inputs are "
                f"{len(values)} keyword inputs ({', '.join(names)})"
            )
    if names is None:
        return tuple(values), {}
    return (), dict(zip(names, values))


def _tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A real input of ``shape``: random floats, zeros otherwise (valid token ids and masks)."""
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    return torch.zeros(shape, dtype=dtype)
