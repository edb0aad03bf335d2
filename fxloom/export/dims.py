"""``Dim``: a named dimension for ``dynamic_shapes``, as torch.export users write it.

    >>> from fxloom.export import Dim
    >>> batch = Dim("batch", min=1, max=1024)
    >>> batch
    Dim('batch', min=1, max=1024)

Symbolic sizes are not captured yet: ``export`` refuses a ``dynamic_shapes``
that names a ``Dim`` with an error saying so, rather than exporting a program
specialised to the example's sizes behind the user's back.

Depends on nothing of fxloom.
"""

from __future__ import annotations

__all__ = ["Dim"]


class Dim:
    """A dimension size that may vary between ``min`` and ``max`` (inclusive)."""

    def __init__(self, name: str, *, min: int | None = None, max: int | None = None) -> None:
        if not name.isidentifier():
            raise ValueError(f"Dim name {name!r} must be a Python identifier")
        low = 0 if min is None else min
        high = None if max is None else max
        if low < 0 or (high is not None and high < low):
            raise ValueError(f"Dim {name!r}: the range [{min}, {max}] is empty or negative")
        self.__name__ = name
        self.min = low
        self.max = high

    def __repr__(self) -> str:
        high = "" if self.max is None else f", max={self.max}"
        return f"Dim({self.__name__!r}, min={self.min}{high})"
