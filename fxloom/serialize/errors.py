"""The one error type the loader raises, and its refusal of names off the allowlist."""

from __future__ import annotations

__all__ = ["SerializationError", "DisallowedNameError"]


class SerializationError(ValueError):
    """A file cannot be saved or loaded: malformed, unsupported, or unsafe.

    ``fxloom.load`` raises only this (or a subclass): whatever is wrong with a
    file, the caller never gets a partial module and never another exception.
    """


class DisallowedNameError(SerializationError):
    """A file names a function, method or class that is not on the allowlist."""

    def __init__(self, name: str, what: str = "target") -> None:
        self.name = name
        super().__init__(
            f"{what} '{name}' is not on fxloom's allowlist, so it is not loaded "
            f"(nothing from the file was run). If you trust it, allow it with "
            f"fxloom.register_serializable(<the object>, name={name!r}) before loading"
        )
