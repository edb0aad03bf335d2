"""Where a value read by the bytecode interpreter came from, as a Python expression.

Every value the compiled function reads from outside itself (an argument, a global, an
attribute of either, an item of a container, a closure cell) has a source. A source prints
as the expression that reads the same value again at call time, in the namespace of the
generated guard and entry functions (``fxloom.bytecode.guards``): arguments are that
function's parameters (``L_x``), globals come from the compiled function's globals (``G``),
closure cells from its closure (``C``), the compiled module's own submodules from the
entry's table of them (``R``)::

    >>> Attr(Attr(Local("self"), "config"), "n_head").expr
    'L_self.config.n_head'
    >>> Item(Global("TABLE"), 3).expr
    "G['TABLE'][3]"

Sources are values (frozen, hashable): one guard per (source, kind), one graph input per
tensor source.

Depends on nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Attr",
    "Cell",
    "Global",
    "Held",
    "Item",
    "Local",
    "Source",
    "local_name",
    "module_source",
]


def local_name(name: str) -> str:
    """The parameter name of local ``name`` in generated functions (never a builtin's; the
    hidden ``.0`` of comprehensions and the stack slots ``stack[i]`` made identifiers)."""
    if name.isidentifier():
        return f"L_{name}"
    return "S_" + re.sub(r"\W", "_", name)


@dataclass(frozen=True, slots=True)
class Source:
    """A place a value was read from; ``expr`` reads it again."""

    @property
    def expr(self) -> str:  # pragma: no cover - every kind defines it
        raise NotImplementedError

    @property
    def text(self) -> str:
        """How messages name the place: the user's own spelling where there is one."""
        return self.expr


@dataclass(frozen=True, slots=True)
class Local(Source):
    """An argument of the compiled function."""

    name: str

    @property
    def expr(self) -> str:
        return local_name(self.name)

    @property
    def text(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Global(Source):
    """A global variable of the compiled function's module (or of the module ``module``, for
    functions inlined from elsewhere)."""

    name: str
    module: str | None = None

    @property
    def expr(self) -> str:
        if self.module is None:
            return f"G[{self.name!r}]"
        return f"MODULES[{self.module!r}].__dict__[{self.name!r}]"

    @property
    def text(self) -> str:
        return self.name if self.module is None else f"{self.module}.{self.name}"


@dataclass(frozen=True, slots=True)
class Cell(Source):
    """The contents of closure cell ``index`` of the compiled function (variable ``name``)."""

    index: int
    name: str

    @property
    def expr(self) -> str:
        return f"C[{self.index}].cell_contents"

    @property
    def text(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class TypeOf(Source):
    """The class of another source's value, as ``type(x)`` gives it: attributes the program
    reads off it (``type(self).flag``) are guarded like any other."""

    base: Source

    @property
    def expr(self) -> str:
        return f"type({self.base.expr})"

    @property
    def text(self) -> str:
        return f"type({self.base.text})"


@dataclass(frozen=True, slots=True)
class Attr(Source):
    """Attribute ``name`` of another source's value."""

    base: Source
    name: str

    @property
    def expr(self) -> str:
        return self.on(self.base.expr)

    def on(self, base: str) -> str:
        """The expression reading this attribute of ``base``, an expression for the base's
        value (the generated guard reads a base once, into a local: ``GuardSet.source_code``)."""
        if self.name.isidentifier():
            return f"{base}.{self.name}"
        return f"getattr({base}, {self.name!r})"

    @property
    def text(self) -> str:
        return f"{self.base.text}.{self.name}"


@dataclass(frozen=True, slots=True)
class Item(Source):
    """Item ``key`` (a constant) of another source's value."""

    base: Source
    key: Any

    @property
    def expr(self) -> str:
        return self.on(self.base.expr)

    def on(self, base: str) -> str:
        """The expression reading this item of ``base`` (see ``Attr.on``)."""
        return f"{base}[{self.key!r}]"

    @property
    def text(self) -> str:
        return f"{self.base.text}[{self.key!r}]"


@dataclass(frozen=True, slots=True)
class Held(Source):
    """A submodule, parameter or buffer of the compiled module at ``path``, held by the entry
    (``R[path]``): the guards on the root's identity and the module epoch keep it the same
    object, so it is reached without walking ``self.blocks[0]...`` at every call."""

    path: str

    @property
    def expr(self) -> str:
        return f"R[{self.path!r}]"

    @property
    def text(self) -> str:
        return f"self.{self.path}" if self.path else "self"


def module_source(root: Source, path: str) -> Source:
    """The source of the submodule (or parameter, buffer) at dotted ``path`` under ``root``."""
    source = root
    for name in path.split(".") if path else ():
        source = Attr(source, name)
    return source
