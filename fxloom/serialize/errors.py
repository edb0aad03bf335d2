"""The one error type the loader raises, and its refusal of names off the allowlist."""

from __future__ import annotations

from fxloom._format import printable

__all__ = ["SerializationError", "DisallowedNameError"]


class SerializationError(ValueError):
    r"""A file cannot be saved or loaded: malformed, unsupported, or unsafe.

    ``fxloom.load`` raises only this (or a subclass): whatever is wrong with a
    file, the caller never gets a partial module and never another exception.

    A message quotes the file's strings (names, keys, devices), and a hostile file makes them
    escape sequences or forged lines: the error escapes its own message (``printable``), so
    no quoting site can forget. Each argument is one line, newlines in it escaped too; the
    lines are joined with newlines::

        >>> print(SerializationError("node %a\x1b[2J: refused", "    the line"))
        node %a\x1b[2J: refused
            the line
    """

    def __init__(self, *lines: object) -> None:
        super().__init__(*(["\n".join(printable(str(line)) for line in lines)] if lines else []))


class DisallowedNameError(SerializationError):
    """A file names a function, method or class that is not on the allowlist."""

    def __init__(self, name: str, what: str = "target") -> None:
        self.name = name
        super().__init__(
            f"{what} '{name}' is not on fxloom's allowlist, so it is not loaded "
            f"(nothing from the file was run).{_not_imported_hint(name)} If you trust it, allow "
            f"it with fxloom.register_serializable(<the object>, name={name!r}) before loading"
        )


def _not_imported_hint(name: str) -> str:
    """Container classes are looked up among imported modules (and a library's enumerated
    modules once the library is imported): say what to import."""
    import sys

    module, _, _ = str(name).rpartition(".")
    package = module.partition(".")[0]
    if (
        not package.isidentifier()
        or package in ("torch", "fxloom", "builtins")
        or module in sys.modules
    ):
        return ""
    from fxloom.serialize.allowlist import LIBRARY_CLASS_MODULES

    if package in LIBRARY_CLASS_MODULES and package not in sys.modules:
        # Its output and cache modules are found once the library itself is imported.
        return f" If it is a class of {package}, import {package} before loading."
    return (
        f" fxloom never imports a module a file names: if it is a class of {module}, "
        f"import {module} before loading."
    )
