"""Exception notes (PEP 678) on every supported Python, 3.10 included.

fxloom adds notes to errors it lets through (the node whose generated line raised, the hint to
trace a model yourself) so the error keeps its type and the user still learns where it came from.
Python 3.11 has ``BaseException.add_note`` and prints ``__notes__`` under the message; 3.10 has
neither. There, :func:`add_note` keeps the same ``__notes__`` list and, because 3.10's traceback
printer shows only ``str(err)``, also appends the note to the message when the message is a
plain string (the usual ``raise SomeError("text")``). Errors whose ``str`` is computed another way
keep their message; their notes are still in ``__notes__``.

    >>> err = ValueError("bad shape")
    >>> add_note(err, "fxloom: raised by %matmul")
    >>> notes_of(err)
    ['fxloom: raised by %matmul']

Depends on nothing (the foundation layer).
"""

from __future__ import annotations

import sys

_NATIVE = sys.version_info >= (3, 11)


def add_note(err: BaseException, note: str) -> None:
    """Attach ``note`` to ``err`` once, as Python 3.11's ``err.add_note(note)`` does."""
    if note in notes_of(err):
        return
    if _NATIVE:
        err.add_note(note)
        return
    err.__notes__ = [*notes_of(err), note]
    _show_in_message(err, note)


def notes_of(err: BaseException) -> list[str]:
    """The notes attached to ``err`` (an empty list when there are none)."""
    return list(getattr(err, "__notes__", ()))


def message_of(err: BaseException) -> str:
    """``str(err)`` without the notes :func:`add_note` appended to it on Python 3.10: the
    message as raised, the same on every Python."""
    text = str(err)
    for note in reversed(notes_of(err)):
        text = text.removesuffix(f"\n{note}")
    return text


def _show_in_message(err: BaseException, note: str) -> None:
    # Only a message held as the single string argument and printed as is: rewriting the args
    # of, say, a KeyError (printed as a repr) or an error with its own __str__ would garble it.
    plain = type(err).__str__ is BaseException.__str__
    if plain and len(err.args) == 1 and isinstance(err.args[0], str):
        err.args = (f"{err.args[0]}\n{note}",)
