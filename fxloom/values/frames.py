"""Finding the user's program among the frames of a trace: fxloom's own and torch's plumbing are skipped.

Error messages and ``stack_trace`` metadata name the line of the program being
traced, never a line of fxloom or of torch's module-call machinery. Depends on
nothing of fxloom.
"""

from __future__ import annotations

import linecache
import os
import sys
import types

import torch

__all__ = [
    "user_frame",
    "describe_frame",
    "short_location",
    "innermost_user_frame",
    "is_plumbing",
    "is_library",
    "program_frame",
]

_FXLOOM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
# torch files that only forward calls (module call machinery, overrides); a
# frame there is never "where the user's program did it".
_PLUMBING = tuple(
    os.path.join(_TORCH_DIR, *part.split("/"))
    for part in (
        "nn/modules/module.py",
        "overrides.py",
        "_tensor.py",
        "utils/_contextlib.py",
        "functional.py",
        "_jit_internal.py",
        "_ops.py",  # torch.ops.<namespace>.<op>(...): the overload's __call__ forwards it
    )
)
# Model code shipped in the package is user code as far as tracing is concerned.
_FXLOOM_USER_CODE = (os.path.join(_FXLOOM_DIR, "zoo") + os.sep,)


def is_plumbing(filename: str) -> bool:
    """Whether a frame of ``filename`` is fxloom's or torch's machinery rather than the user's."""
    if filename.startswith(_FXLOOM_DIR):
        return not filename.startswith(_FXLOOM_USER_CODE)
    return filename.startswith(_PLUMBING)


def is_library(filename: str) -> bool:
    """Whether a frame of ``filename`` is any of torch's or fxloom's own code (stricter than
    ``is_plumbing``): below the dispatcher, as export records, everything in torch is library."""
    return filename.startswith(_TORCH_DIR) or is_plumbing(filename)


def program_frame(skip: int = 1) -> types.FrameType | None:
    """The innermost frame of the user's program when torch's internals may be on the stack
    (an operator's decomposition, a meta kernel): torch's and fxloom's frames are skipped."""
    frame = sys._getframe(skip)
    while frame is not None and is_library(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_frame(skip: int = 1) -> types.FrameType | None:
    """The innermost frame of the program being traced (not fxloom's, not torch's plumbing).

    The search starts ``skip`` frames above this call; plumbing frames on the
    way are passed over, so any start inside fxloom finds the same frame.
    """
    frame = sys._getframe(skip)
    while frame is not None and is_plumbing(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def innermost_user_frame(tb: types.TracebackType | None) -> types.FrameType | None:
    """The last frame of the user's program in a traceback (where an exception came from)."""
    found = None
    while tb is not None:
        if not is_plumbing(tb.tb_frame.f_code.co_filename):
            found = tb.tb_frame
        tb = tb.tb_next
    return found


def describe_frame(frame: types.FrameType | None) -> tuple[str | None, str]:
    """``("file:line", "    <source line>")`` for an error message."""
    if frame is None:
        return None, ""
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    source = linecache.getline(filename, lineno, frame.f_globals).strip()
    return f"{filename}:{lineno}", f"\n    {source}" if source else ""


def short_location(frame: types.FrameType | None) -> str:
    """``file.py:12`` (no directories: it is printed into generated code)."""
    if frame is None:
        return "traced code"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
