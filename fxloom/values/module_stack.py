"""Which modules a capture is inside: the one stack behind ``meta["nn_module_stack"]`` and error locations.

Depends on nothing of fxloom.
"""

from __future__ import annotations

__all__ = ["ModuleStack"]


class ModuleStack:
    """The modules whose forward is running, outermost first.

    ``entries`` maps each qualified name to ``(name, class)``; every recorded
    node gets a copy as ``meta["nn_module_stack"]``. ``path`` is the innermost
    (``""`` at the root's own level), named by errors. ``enter`` returns what
    ``leave`` puts back, so a failing module call unwinds it exactly.
    """

    __slots__ = ("entries", "path")

    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, type]] = {}
        self.path = ""

    def enter(self, path: str, cls: type) -> tuple[dict[str, tuple[str, type]], str]:
        saved = (self.entries, self.path)
        # A new dict, never an update: nodes recorded so far keep their copies' source intact.
        self.entries = {**self.entries, path: (path, cls)}
        self.path = path
        return saved

    def leave(self, saved: tuple[dict[str, tuple[str, type]], str]) -> None:
        self.entries, self.path = saved

    def class_of(self, path: str) -> type | None:
        """The class of the module at ``path`` if the trace is inside it."""
        entry = self.entries.get(path)
        return entry[1] if entry is not None else None
