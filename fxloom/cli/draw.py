"""``fxloom draw MODEL``: trace a model, propagate shapes, draw the graph with Graphviz.

MODEL is a zoo name or ``package.module:factory`` (see ``fxloom.cli.model_spec``). The drawing
goes to ``-o PATH`` (``.svg``, ``.png``, ``.pdf`` rendered by Graphviz's ``dot``; ``.dot`` as
source) or, without one, to stdout as DOT. Without ``dot`` the DOT source is written next to
PATH and the exit code is 1: the file asked for does not exist.

Depends on: ``fxloom.cli.model_spec``, ``fxloom.passes.graph_drawer``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    """Draw and write; returns the exit code (errors are raised, for the CLI to report)."""
    from fxloom.cli.model_spec import load_model, propagate_shapes, trace_model
    from fxloom.passes import _dot
    from fxloom.passes.graph_drawer import FxGraphDrawer

    loaded = load_model(args.model)
    gm = trace_model(loaded)
    note = propagate_shapes(gm, loaded) if args.shapes else None
    if note:
        print(f"fxloom draw: note: {note}", file=sys.stderr)
    dot = FxGraphDrawer(
        gm,
        loaded.name,
        ignore_getattr=args.ignore_getattr,
        ignore_parameters_and_buffers=args.ignore_parameters,
        show_shapes=args.shapes,
        clusters=args.clusters,
        rankdir=args.rankdir,
    ).get_dot_graph()
    if args.output in (None, "-"):
        sys.stdout.write(dot.source)
        return 0
    output = Path(args.output)
    try:
        dot.write(output, args.format)
    except _dot.GraphvizNotFoundError:
        # Keep the drawing: the DOT source renders later, once Graphviz is installed.
        fallback = dot.write(output.with_suffix(".dot"), "dot")
        image_format = _dot.format_for_path(output, args.format)
        print(
            f"fxloom draw: error: cannot write {output}: Graphviz's 'dot' program is not on "
            f"PATH; {_dot.INSTALL_HINT}.\nWrote the DOT source to {fallback} instead; "
            f"render it with: dot -T{image_format} {fallback} -o {output}",
            file=sys.stderr,
        )
        return 1
    print(f"wrote {output}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="a zoo model name or package.module:factory")
    parser.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="file to write: .svg, .png, .pdf (rendered by Graphviz) or .dot; '-' or none: "
        "DOT source on stdout",
    )
    parser.add_argument(
        "--format", help="output format when PATH's suffix does not say (svg, png, pdf, dot, ...)"
    )
    parser.add_argument(
        "--no-shapes",
        dest="shapes",
        action="store_false",
        help="skip shape propagation; no shapes on edges",
    )
    parser.add_argument(
        "--no-clusters",
        dest="clusters",
        action="store_false",
        help="do not group nodes in boxes by module",
    )
    parser.add_argument("--ignore-getattr", action="store_true", help="leave out get_attr nodes")
    parser.add_argument(
        "--ignore-parameters",
        action="store_true",
        help="leave out the parameter and buffer boxes beside each module call",
    )
    parser.add_argument(
        "--rankdir", default="TB", help="layout direction: TB (top to bottom, default), LR, ..."
    )
