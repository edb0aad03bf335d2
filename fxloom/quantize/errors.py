"""``QuantizeError``: quantization cannot go on as asked; the message says why and what to do.

Depends on: nothing.
"""

from __future__ import annotations

__all__ = ["QuantizeError"]


class QuantizeError(RuntimeError):
    """prepare/calibrate/convert refused; the user's model is unchanged."""
