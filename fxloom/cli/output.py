"""``-o/--output FILE``: the one option every command that makes a model has for saving it.

``export`` writes its program with ``fxloom.export.save``; ``lower`` and ``quantize`` write
the module they made with ``fxloom.save``. The file is written after the command printed its
report, and the last line says where, how big, and how to load it.

Depends on: fxloom's save functions, imported when a file is written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_output_argument", "write_output"]


def add_output_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """Add ``-o/--output FILE`` to a command whose result is ``what``."""
    parser.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="FILE",
        help=f"also save {what} to FILE (load it back with fxloom.load; see fxloom show FILE)",
    )


def write_output(result: Any, path: str | None) -> str | None:
    """Save ``result`` (an exported program or a module) to ``path``; the line to print, or
    None when no ``path`` was given."""
    if path is None:
        return None
    from fxloom.export import ExportedProgram

    if isinstance(result, ExportedProgram):
        from fxloom.export import save as save_program

        save_program(result, path)
        how = "fxloom.export.load"
    else:
        import fxloom

        fxloom.save(result, path)
        how = "fxloom.load"
    size = Path(path).stat().st_size
    return f"saved to {path} ({size / 1024:.1f} KiB); load it with {how}({str(path)!r})"
