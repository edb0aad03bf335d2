"""``QuantizeError``: quantization cannot go on as asked; the message says why and what to do.
``SaturationWarning``: it can go on, but the int8 kernels will overflow on this CPU.

Depends on: nothing.
"""

from __future__ import annotations

__all__ = ["QuantizeError", "SaturationWarning"]


class QuantizeError(RuntimeError):
    """prepare/calibrate/convert refused; the user's model is unchanged."""


class SaturationWarning(UserWarning):
    """8-bit activations were asked for where this CPU's int8 kernels sum in 16 bits and
    saturate: the converted model is fine on other CPUs but far off on this one."""
