"""``fxloom pipeline MODEL --stages N``: cut a model into pipeline stages and print the plan.

MODEL is a zoo name or ``package.module:factory`` with example inputs (``fxloom.cli.model_spec``);
the inputs are taken as one microbatch. Prints the plan's table (per stage: the modules it
spans, nodes, FLOPs, parameter bytes, measured time, bytes sent on), the balance (the slowest
stage's time over the mean), the parameters stages share, and whether the stages run one
after another compute what the model does. ``--code`` adds each stage's generated Python.

Depends on: ``fxloom.cli.model_spec``, ``fxloom.distributed``, rich.
"""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fxloom pipeline``."""
    from fxloom.distributed.costs import BALANCES
    from fxloom.distributed.cuts import CUT_AT
    from fxloom.distributed.shared import SHARED

    parser.add_argument("model", metavar="MODEL", help="a zoo model name or package.module:factory")
    parser.add_argument("--stages", type=int, default=2, metavar="N", help="stages (default 2)")
    parser.add_argument(
        "--balance", choices=BALANCES, default="time", help="what to balance (default: time)"
    )
    parser.add_argument(
        "--cut-at",
        choices=CUT_AT,
        default="modules",
        help="where stages may start (default: modules)",
    )
    parser.add_argument(
        "--shared",
        choices=SHARED,
        default="sync",
        help="parameters several stages use: sum their gradients (sync) or refuse (error)",
    )
    parser.add_argument("--code", action="store_true", help="print each stage's generated Python")


def run(args: argparse.Namespace) -> int:
    """Plan, print, and check the stages against eager; 1 when they differ."""
    import torch
    from rich.syntax import Syntax

    import fxloom.distributed
    from fxloom.cli.console import cli_console
    from fxloom.cli.export import matches_outputs
    from fxloom.cli.model_spec import example_inputs_of, load_model, split_inputs

    loaded = load_model(args.model)
    inputs = example_inputs_of(loaded, "the pipeline is timed and shaped on them")
    model = loaded.model.eval()
    plan = fxloom.distributed.pipeline(
        model,
        inputs,
        stages=args.stages,
        balance=args.balance,
        cut_at=args.cut_at,
        shared=args.shared,
    )
    console = cli_console()
    console.print(plan.report)
    for row in plan.shared:
        console.print(f"shared: {row.describe()}")
    positional, keywords = split_inputs(inputs)
    with torch.no_grad():
        value = plan.stage_modules[0](*positional, **keywords)
        for module in plan.stage_modules[1:]:
            value = module(*value)
        same = matches_outputs(plan.output(value), model(*positional, **keywords))
    console.print(f"{loaded.name}: stages run one after another equal eager: {same}")
    if args.code:
        for index, module in enumerate(plan.stage_modules):
            console.rule(f"stage {index}")
            console.print(Syntax(module.code.strip(), "python"))
    return 0 if same else 1
