"""The `fxloom` command line: the surface layer, which may use every other layer.

Usage: ``fxloom COMMAND [options]`` (or ``python -m fxloom COMMAND``). Run ``fxloom --help``.

This module holds the parser, the subcommand table and ``main``; each command's work lives in
a module of its own beside it: ``demo`` (the guided tour, with its pass steps in
``demo_passes``), ``cost``, ``draw``, ``export``, ``lower``, ``pipeline``, ``quantize`` and ``save`` (``save``
and ``show``); all but ``show`` read their MODEL argument with ``model_spec``.
Nothing in the library imports from this package (tests/test_layers.py checks).

Subcommands are rows of one table, ``SUBCOMMANDS``. To add one, write a ``_run_<name>(args)``
function returning an exit code (and, if the command takes options, an
``_add_<name>_arguments(parser)`` function), then add a ``Subcommand`` row; a command with more
than a few lines of work gets its own module here. A command imports its modules inside its run
function, so one command's dependencies never slow down the others.

Exit codes: 0 success; 1 the command ran and failed (an error, or the demo's results did not
match eager PyTorch); 2 usage error (unknown command, bad option, a MODEL that names no zoo
model and no importable factory). Errors are reported as one
line on stderr; ``--traceback`` shows the full Python traceback instead.

Depends on: the standard library; each subcommand on the fxloom modules it runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

from fxloom._format import printable

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Subcommand:
    """One row of the subcommand table."""

    name: str
    summary: str  # one line, listed by `fxloom --help`
    description: str  # the body of `fxloom NAME --help`
    run: Callable[[argparse.Namespace], int]
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None


def _run_demo(args: argparse.Namespace) -> int:
    from fxloom.cli import demo

    return demo.run(drawing_dir=args.output_dir)


def _add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir",
        default="fxloom-demo",
        metavar="DIR",
        help="where the demo writes its drawing (default: ./fxloom-demo)",
    )


def _run_version(args: argparse.Namespace) -> int:
    print(version_string())
    return EXIT_OK


def _run_cost(args: argparse.Namespace) -> int:
    from fxloom.cli import cost

    return cost.run(args)


def _add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    from fxloom.cli import cost

    cost.add_arguments(parser)


def _run_draw(args: argparse.Namespace) -> int:
    from fxloom.cli import draw

    return draw.run(args)


def _add_draw_arguments(parser: argparse.ArgumentParser) -> None:
    from fxloom.cli import draw

    draw.add_arguments(parser)


def _run_compile(args: argparse.Namespace) -> int:
    from fxloom.cli import compile as compile_command

    return compile_command.run(args)


def _add_compile_arguments(parser: argparse.ArgumentParser) -> None:
    from fxloom.cli import compile as compile_command

    compile_command.add_arguments(parser)


def _run_pipeline(args: argparse.Namespace) -> int:
    from fxloom.cli import pipeline

    return pipeline.run(args)


def _add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    from fxloom.cli import pipeline

    pipeline.add_arguments(parser)


def _run_export(args: argparse.Namespace) -> int:
    from fxloom.cli import export

    return export.run(args)


def _add_export_arguments(parser: argparse.ArgumentParser) -> None:
    from fxloom.cli import export

    export.add_arguments(parser)


def _run_lower(args: argparse.Namespace) -> int:
    from fxloom.cli import lower

    return lower.run(args)


def _add_lower_arguments(parser: argparse.ArgumentParser) -> None:
    from fxloom.cli import lower

    lower.add_arguments(parser)


def _run_quantize(args: argparse.Namespace) -> int:
    from fxloom.cli import quantize

    return quantize.run(args)


def _add_quantize_arguments(parser: argparse.ArgumentParser) -> None:
    from fxloom.cli import quantize

    quantize.add_arguments(parser)


def _run_save(args: argparse.Namespace) -> int:
    from fxloom.cli import save

    return save.run_save(args)


def _add_save_arguments(parser: argparse.ArgumentParser) -> None:
    from fxloom.cli import save

    save.add_save_arguments(parser)


def _run_show(args: argparse.Namespace) -> int:
    from fxloom.cli import save

    return save.run_show(args)


def _add_show_arguments(parser: argparse.ArgumentParser) -> None:
    from fxloom.cli import save

    save.add_show_arguments(parser)


def _model_text(zoo_models: str, inputs_needed: bool) -> str:
    """The paragraph on MODEL, one text for every command that takes one."""
    returns = (
        "(module, example_inputs)" if inputs_needed else "a module or (module, example_inputs)"
    )
    return (
        f"MODEL is an embedded zoo model ({zoo_models})\n"
        f"or module:factory, a function returning {returns}\n"
        "(the inputs a tuple or a dict); the module is looked for in the current\n"
        "directory first, as python -m does.\n\n"
    )


_EXAMPLE_ZOO = "mlp_tiny, resnet_tiny, transformer_tiny, resnet50, ..."

SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        name="compile",
        summary="compile a model with fxloom.compile; print its graphs, breaks and guards",
        description=(
            "Compile MODEL with fxloom.compile (bytecode-level capture: guards, a cache,\n"
            "graph breaks), call it on its example inputs and compare with eager PyTorch.\n"
            "Print the number of graphs and breaks and the first call's time; --explain\n"
            "prints every graph, every break with the user's file:line, why and what to\n"
            "do, and the guards; --code the generated Python of each compiled piece.\n\n"
            + _model_text(_EXAMPLE_ZOO, inputs_needed=True)
            + "examples:\n"
            "  fxloom compile transformer_tiny --explain\n"
            "  fxloom compile resnet_tiny --code"
        ),
        run=_run_compile,
        add_arguments=_add_compile_arguments,
    ),
    Subcommand(
        name="cost",
        summary="count a model's FLOPs, MACs, parameters, bytes and peak memory, per module",
        description=(
            "Trace MODEL with fxloom.symbolic_trace, propagate shapes on the meta device\n"
            "(no data, no compute) and count, per node (fxloom.passes.cost): FLOPs and\n"
            "MACs (a multiply-add is 1 MAC = 2 FLOPs), bytes read and written, parameter\n"
            "bytes, activation memory; then totals per module and a peak-memory estimate.\n"
            "Operators with no FLOP formula count 0 and are listed as not counted.\n\n"
            + _model_text(_EXAMPLE_ZOO, inputs_needed=False)
            + "examples:\n"
            "  fxloom cost resnet50\n"
            "  fxloom cost resnet50 --input-shape 256,3,224,224 --depth 2\n"
            "  fxloom cost transformer_tiny --by node --top 10"
        ),
        run=_run_cost,
        add_arguments=_add_cost_arguments,
    ),
    Subcommand(
        name="demo",
        summary="a guided tour: build, trace, transform, save, export, quantize and lower models",
        description=(
            "Walk through fxloom step by step: build a small Graph by hand\n"
            "(placeholder, get_attr, call_function, call_module, call_method, output),\n"
            "wrap it in a GraphModule, print the graph, its table and the generated\n"
            "Python code, run it and check the result matches eager PyTorch, edit the\n"
            "graph and run it again; then symbolically trace embedded reference models\n"
            "(fxloom.zoo), show their graphs and code, and check them against eager;\n"
            "then run passes: shape propagation, a cost table for ResNet-50, batch-norm\n"
            "fusion with its latency change, and a drawing written to --output-dir;\n"
            "then save and load a model, export one to ATen operators, quantize a\n"
            "DeepRecommender to int8 (at a size where int8 is faster than fp32) and\n"
            "lower resnet_tiny to ONNX Runtime. Every latency comparison runs on one\n"
            "thread (torch's and ONNX Runtime's), the median of interleaved runs, and\n"
            "says so.\n\n"
            "Exits 0 when all results match, 1 when any does not."
        ),
        run=_run_demo,
        add_arguments=_add_demo_arguments,
    ),
    Subcommand(
        name="draw",
        summary="draw a model's traced graph with Graphviz (svg, png, pdf or dot)",
        description=(
            "Trace MODEL with fxloom.symbolic_trace, record tensor shapes by running it on\n"
            "its example inputs (fxloom.passes.shape_prop), and draw the graph with\n"
            "fxloom.passes.graph_drawer: a box per node coloured by opcode, shapes and\n"
            "dtypes on the edges, nodes grouped by the module they came from.\n\n"
            + _model_text(_EXAMPLE_ZOO, inputs_needed=False)
            + "Images are rendered by Graphviz's 'dot' program; DOT source needs nothing.\n"
            "Without 'dot', the DOT source is written next to PATH (out.svg -> out.dot)\n"
            "and the command exits 1, since PATH itself could not be written.\n\n"
            "examples:\n"
            "  fxloom draw resnet_tiny -o resnet.svg\n"
            "  fxloom draw transformer_tiny --ignore-parameters -o transformer.png\n"
            "  fxloom draw mypkg.models:build_model | dot -Tpdf -o model.pdf"
        ),
        run=_run_draw,
        add_arguments=_add_draw_arguments,
    ),
    Subcommand(
        name="export",
        summary="export a model to ATen operators; print the program and its graph signature",
        description=(
            "Export MODEL with fxloom.export.export on its example inputs: run it once on\n"
            "stand-in tensors (shapes, no data) and record every ATen operator, as a\n"
            "functional program whose parameters, buffers and constants are inputs.\n"
            "Print a summary (nodes, operator calls, inputs and outputs by kind), the\n"
            "program's Python code (--graph: its graph) and its graph signature: what\n"
            "each input lifts (PARAMETER target='conv1.weight') and what each output is.\n\n"
            + _model_text(_EXAMPLE_ZOO, inputs_needed=True)
            + "examples:\n"
            "  fxloom export mlp_tiny\n"
            "  fxloom export resnet_tiny --graph\n"
            "  fxloom export transformer_tiny --check"
        ),
        run=_run_export,
        add_arguments=_add_export_arguments,
    ),
    Subcommand(
        name="lower",
        summary="run a model's supported regions in ONNX Runtime; print the report and speedup",
        description=(
            "Lower MODEL with fxloom.lower: trace it on its example inputs, cut the graph\n"
            "into regions of operators ONNX supports, translate each region to ONNX and\n"
            "run it in ONNX Runtime (CPU), leaving the other operators in PyTorch between\n"
            "the regions. Print the report (each region lowered or kept in PyTorch, each\n"
            "operator left in PyTorch and why, with its source line) and the latency of\n"
            "eager and lowered on the example inputs (median of interleaved runs, on\n"
            "--threads threads for torch and ONNX Runtime alike, 1 unless given).\n"
            "--check compares lowered with eager and fails past the tolerance;\n"
            "--dynamic-batch leaves dimension 0 of every input free (from Python,\n"
            "lower(..., dynamic_shapes=...) makes any dimensions dynamic).\n"
            "Needs the onnx extra: pip install fxloom[onnx].\n\n"
            + _model_text("resnet_tiny, resnet50, transformer_tiny, ...", inputs_needed=True)
            + "examples:\n"
            "  fxloom lower resnet50 --check\n"
            "  fxloom lower transformer_tiny --threads 2\n"
            "  fxloom lower resnet_tiny --dynamic-batch"
        ),
        run=_run_lower,
        add_arguments=_add_lower_arguments,
    ),
    Subcommand(
        name="pipeline",
        summary="cut a model into balanced pipeline stages; print the plan and its balance",
        description=(
            "Cut MODEL into pipeline stages with fxloom.distributed.pipeline: candidate\n"
            "cuts at module boundaries, the stages' cost balanced by measured time,\n"
            "FLOPs or memory (an exact dynamic program), boundaries that carry only\n"
            "tensors, and the model's parameter names kept. Print per stage the modules\n"
            "it spans, FLOPs, parameter bytes, measured time and bytes sent on, the\n"
            "balance (slowest stage over the mean), shared parameters, and whether the\n"
            "stages run one after another equal eager PyTorch. The example inputs are\n"
            "one microbatch. Exits 1 when the stages differ from eager.\n\n"
            + _model_text(_EXAMPLE_ZOO, inputs_needed=True)
            + "examples:\n"
            "  fxloom pipeline resnet_tiny --stages 2\n"
            "  fxloom pipeline transformer_tiny --stages 2 --balance flops --code"
        ),
        run=_run_pipeline,
        add_arguments=_add_pipeline_arguments,
    ),
    Subcommand(
        name="quantize",
        summary="quantize a model to int8; print its speedup, its error and what stayed float",
        description=(
            "Quantize MODEL with fxloom.quantize: static mode (default) prepares it\n"
            "(fuses batch norms, inserts observers), calibrates it on --batches random\n"
            "batches shaped like its example inputs (or on --data FILE.pt) and converts\n"
            "it to torch's int8 kernels; dynamic mode quantizes Linear/LSTM/GRU weights\n"
            "and quantizes activations at run time (no calibration). Then prints the fp32\n"
            "and int8 latency on the example inputs (one thread, median of interleaved\n"
            "runs), the int8 output's relative error and cosine similarity against fp32,\n"
            "and the report: each operator int8 or float, and why. Torch's quantized\n"
            "tensors are deprecated upstream; see docs/quantization.md.\n\n"
            + _model_text("deeprec_tiny, cnn_small, resnet_tiny, ...", inputs_needed=True)
            + "examples:\n"
            "  fxloom quantize deeprec_tiny\n"
            "  fxloom quantize cnn_small --engine qnnpack --batches 16 --batch-size 4\n"
            "  fxloom quantize deeprec --mode dynamic\n"
            "  fxloom quantize mypkg.models:build --data calibration.pt --batch-size 32"
        ),
        run=_run_quantize,
        add_arguments=_add_quantize_arguments,
    ),
    Subcommand(
        name="save",
        summary="trace (or export) a model and write it to a file with fxloom.save",
        description=(
            "Trace MODEL with fxloom.symbolic_trace and write the GraphModule with\n"
            "fxloom.save: one zip file of JSON (the graph, the module tree, node meta) and\n"
            "safetensors (the weights), which fxloom.load reads back without unpickling or\n"
            "running code from the file. --export exports MODEL on its example inputs\n"
            "instead (fxloom.export.export) and writes the program with fxloom.export.save.\n\n"
            + _model_text(_EXAMPLE_ZOO, inputs_needed=False)
            + "examples:\n"
            "  fxloom save resnet_tiny -o resnet_tiny.fxl\n"
            "  fxloom save transformer_tiny --export --dynamic-batch -o transformer.pt2"
        ),
        run=_run_save,
        add_arguments=_add_save_arguments,
    ),
    Subcommand(
        name="show",
        summary="describe a file written by fxloom.save without loading or running it",
        description=(
            "Read FILE's JSON documents, never its weights' values, build no module and run\n"
            "nothing; print the format version and kind, the fxloom and torch versions\n"
            "that wrote it, each graph as print(graph) shows it (--code: its generated\n"
            "Python code), the module tree (the class at each path), the parameters and\n"
            "other tensors by dtype and the devices they were saved on, the nodes by\n"
            "opcode and the most common targets, for exported programs the signature and\n"
            "range constraints, and the names fxloom.load would refuse (a class whose\n"
            "library is not imported, a name off the allowlist), with where and why: such\n"
            "a file is still described. Only a file that is not an fxloom file (or is\n"
            "damaged) gives the loader's message (exit code 2).\n\n"
            "examples:\n"
            "  fxloom show resnet_tiny.fxl\n"
            "  fxloom show resnet_tiny.fxl --code\n"
            "  fxloom show model.fxl --no-graph"
        ),
        run=_run_show,
        add_arguments=_add_show_arguments,
    ),
    Subcommand(
        name="version",
        summary="print the versions of fxloom, torch and Python",
        description="Print the installed versions of fxloom, torch and Python on one line.",
        run=_run_version,
    ),
)


def version_string() -> str:
    """One line naming the versions that matter when reporting a bug."""
    fxloom_version = _installed_version("fxloom")
    torch_version = _installed_version("torch")
    return f"fxloom {fxloom_version} (torch {torch_version}, Python {platform.python_version()})"


def _installed_version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for `fxloom`, with one sub-parser per row of SUBCOMMANDS."""
    parser = argparse.ArgumentParser(
        prog="fxloom",
        description=(
            "fxloom captures PyTorch programs into a small graph IR, lets you transform\n"
            "the graph in plain Python, and generates Python code from it; it also\n"
            "exports, quantizes, lowers to ONNX Runtime and saves models."
        ),
        epilog=(
            "examples:\n"
            "  fxloom demo             walk through building and running a graph\n"
            "  fxloom export mlp_tiny  print a model's exported program and its signature\n"
            "  fxloom save mlp_tiny -o m.fxl; fxloom show m.fxl\n"
            "                          write a traced model to a file; describe the file\n"
            "  fxloom version          show versions for a bug report\n\n"
            "Run 'fxloom COMMAND --help' for the details of a command."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_string())
    parser.add_argument("--traceback", action="store_true", help=_TRACEBACK_HELP)

    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for subcommand in SUBCOMMANDS:
        sub_parser = commands.add_parser(
            subcommand.name,
            help=subcommand.summary,
            description=subcommand.description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        # Also accepted after the command name; SUPPRESS keeps the top-level value otherwise.
        sub_parser.add_argument(
            "--traceback", action="store_true", default=argparse.SUPPRESS, help=_TRACEBACK_HELP
        )
        if subcommand.add_arguments is not None:
            subcommand.add_arguments(sub_parser)
        sub_parser.set_defaults(run=subcommand.run)
    return parser


_TRACEBACK_HELP = "on error, show the full Python traceback instead of a one-line message"


def main(argv: Sequence[str] | None = None) -> int:
    """Run `fxloom` with `argv` (default: sys.argv[1:]) and return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)  # a usage error exits here with status 2
    if args.command is None:
        parser.print_usage(sys.stderr)
        print("fxloom: error: choose a COMMAND (see 'fxloom --help')", file=sys.stderr)
        return EXIT_USAGE
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print(f"fxloom {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`fxloom demo | head`); stop quietly, without a second error
        # when Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except Exception as error:
        if _is_usage_error(error) and not args.traceback:
            print(f"fxloom {args.command}: error: {printable(str(error))}", file=sys.stderr)
            return EXIT_USAGE
        if args.traceback:
            traceback.print_exc()
        else:
            print(
                f"fxloom {args.command}: error: {_one_line(error)} (--traceback shows where)",
                file=sys.stderr,
            )
        return EXIT_FAILURE


def _is_usage_error(error: BaseException) -> bool:
    # model_spec is imported by the commands, not here (each command loads what it needs).
    model_spec = sys.modules.get("fxloom.cli.model_spec")
    return model_spec is not None and isinstance(error, model_spec.UsageError)


def _one_line(error: BaseException) -> str:
    """`Type: first line of the message`: fxloom's messages lead with what went wrong."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = lines[0] if lines else "(no message)"
    return f"{type(error).__name__}: {printable(message)}"  # a message may quote a file
