"""Where in the user's program a node came from: ``SourceLocation``, and the one stack-trace format.

A frontend stamps two entries on each node it records (``fxloom.values.provenance``):
``meta["stack_trace"]``, the user's frames as a traceback prints them (what torch.fx users
read), and ``meta["source_location"]``, the innermost of those frames as fields. Readers ask
``source_location(node)``, which also reads a stack trace set by hand. Files keep only the text:
loading stamps ``source_location`` back from it (``innermost_location``). Nothing else parses
stack-trace text::

    >>> trace = '  File "model.py", line 12, in forward\\n    return torch.relu(x)\\n'
    >>> parse_stack_trace(trace)
    [SourceLocation(file='model.py', line=12, function='forward', code='return torch.relu(x)')]
    >>> format_stack_trace(parse_stack_trace(trace)) == trace
    True

Depends on nothing of fxloom (a ``Node`` is only read).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fxloom.node import Node

__all__ = [
    "SourceLocation",
    "format_stack_trace",
    "innermost_location",
    "parse_stack_trace",
    "source_location",
]


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """One frame of the user's program: its file, line, function and the code on that line."""

    file: str
    line: int
    function: str
    code: str = ""

    @property
    def short(self) -> str:
        """``file.py:12``, without directories (for reports and generated code)."""
        return f"{os.path.basename(self.file)}:{self.line}"

    def frame_text(self) -> str:
        """The frame as a traceback prints it (the code line left out when unknown)."""
        where = f'  File "{self.file}", line {self.line}, in {self.function}\n'
        return f"{where}    {self.code}\n" if self.code else where


def format_stack_trace(locations: Iterable[SourceLocation]) -> str:
    """Frames, outermost first, as the text of ``meta["stack_trace"]``."""
    return "".join(location.frame_text() for location in locations)


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<function>.*))?$')


def parse_stack_trace(text: str | None) -> list[SourceLocation]:
    """The frames of a stack trace's text, outermost first; lines that are no frame are skipped."""
    locations: list[SourceLocation] = []
    lines = (text or "").splitlines()
    for index, line in enumerate(lines):
        frame = _FRAME.match(line)
        if frame is None:
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        code = "" if _FRAME.match(following) else following.strip()
        function = (frame["function"] or "").strip()
        locations.append(SourceLocation(frame["file"], int(frame["line"]), function, code))
    return locations


# Nodes of one line share one trace text: a loaded graph reads each once.
@functools.lru_cache(maxsize=4096)
def innermost_location(text: str) -> SourceLocation | None:
    """The innermost frame of a stack trace's text, or None if it holds no frame."""
    frames = parse_stack_trace(text)
    return frames[-1] if frames else None


def source_location(node: Node) -> SourceLocation | None:
    """The innermost frame of the user's program that made ``node``, or None if unknown."""
    stamped = node.meta.get("source_location")
    if isinstance(stamped, SourceLocation):
        return stamped
    trace = node.meta.get("stack_trace")
    return innermost_location(trace) if isinstance(trace, str) else None
