"""Qualified names (``"layer1.0.conv.weight"``): read, install, name and delete what they reach.

A ``get_attr``/``call_module`` target is a dotted path from a root module. This
module is the one place that follows such paths::

    >>> import torch
    >>> from fxloom import attr_path
    >>> root = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False))
    >>> attr_path.get(root, "0.weight").shape
    torch.Size([2, 2])
    >>> attr_path.get(root, "0.bias") is None        # present, and None
    True
    >>> attr_path.find(root, "0.scale") is attr_path.MISSING
    True
    >>> attr_path.get(root, "0.scale")
    Traceback (most recent call last):
    ...
    fxloom.attr_path.MissingAttributeError: Sequential has no attribute '0.scale': '0' (a Linear) has no 'scale'
    >>> attr_path.install(root, "extra.scale", torch.ones(1), as_buffer=True)
    >>> type(root.extra).__name__, list(root.extra._buffers)
    ('Module', ['scale'])
    >>> attr_path.free_name(root, "extra.scale")
    'extra.scale_1'

Missing is never None: ``get`` raises ``MissingAttributeError`` (an
``AttributeError``) and ``find`` returns ``MISSING``, so a ``bias=None`` is told
apart from no bias. Each step reads a module's own ``_modules``/``_parameters``/
``_buffers`` first: dict lookups, where ``getattr`` would first fail through the
class and instance dict and then call ``nn.Module.__getattr__`` (GraphModule
construction and the Interpreter do this for every attribute node). Other
objects, and a module's plain attributes, properties and methods, are reached
with ``getattr``. The empty string is no path (it names nothing, not the root).

Depends on: torch (``nn.Module``, tensors) only.
"""

from __future__ import annotations

import difflib
from collections.abc import Container, Iterator
from typing import Any

import torch

from fxloom._mirrored_modules import MirroredModules, mirror

__all__ = [
    "MISSING",
    "MissingAttributeError",
    "PathBlockedError",
    "delete",
    "find",
    "free_name",
    "get",
    "install",
    "prefixes",
]


class _Missing:
    """The type of ``MISSING``: what ``find`` returns where a path leads nowhere (falsy; test
    it with ``is``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


class MissingAttributeError(AttributeError, RuntimeError):
    """A qualified name that leads nowhere.

    An ``AttributeError``, and a ``RuntimeError`` as torch.fx's Interpreter
    raises for a ``get_attr``/``call_module`` target that is not there.

    The message names the root's class, the whole path, the longest prefix that
    exists (``found``; ``""`` for the root itself) and the first missing part
    (``missing``, also ``name``), with close names where there are some. Callers
    that know more say so: ``context`` goes first (the node), ``fix`` last.
    """

    def __init__(self, root: Any, path: str, *, context: str = "", fix: str = "") -> None:
        owner, found, missing = _first_gap(root, path)
        self.path = path
        self.found = found
        self.missing = missing
        message = _missing_message(root, path, owner, found, missing)
        if context:
            message = f"{context}: {message}"
        if fix:
            message = f"{message}; {fix}"
        super().__init__(message, name=missing, obj=owner)


class PathBlockedError(KeyError):
    """Something other than a module stands where a path needs one, or something held another
    way (a parameter where a submodule goes, ...) stands where a value would be installed."""

    __str__ = BaseException.__str__  # KeyError would print the message quoted


# ------------------------------------------------------------------ reading
def find(root: Any, path: str) -> Any:
    """The object at ``path`` under ``root``, or ``MISSING`` where there is none."""
    value = root
    for name in path.split("."):
        value = _member(value, name)
        if value is MISSING:
            return MISSING
    return value


def get(root: Any, path: str) -> Any:
    """The object at ``path`` under ``root``; ``MissingAttributeError`` where there is none."""
    value = find(root, path)
    if value is MISSING:
        raise MissingAttributeError(root, path)
    return value


def _member(obj: Any, name: str) -> Any:
    """``getattr(obj, name, MISSING)``, reading a module's own tables first."""
    if isinstance(obj, torch.nn.Module):
        state = obj.__dict__
        entries = state["_modules"]
        if name in entries:
            return entries[name]
        entries = state["_parameters"]
        if name in entries:
            return entries[name]
        entries = state["_buffers"]
        if name in entries:
            return entries[name]
    return getattr(obj, name, MISSING)


def prefixes(path: str) -> list[str]:
    """``"a.b.c"`` -> ``["a", "a.b", "a.b.c"]``: the paths of everything on the way, outermost first."""
    parts = path.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


# ------------------------------------------------------------------ writing
def install(
    root: torch.nn.Module,
    path: str,
    value: Any,
    *,
    as_buffer: bool = False,
    persistent: bool = True,
    copied_from: Any = None,
) -> None:
    """Put ``value`` at ``path`` under ``root``, creating empty parent modules as needed.

    A ``Parameter`` becomes a parameter, an ``nn.Module`` a submodule, anything
    else a plain attribute, except that a tensor becomes a buffer (``persistent``
    as given) with ``as_buffer``. ``copied_from``, the object ``value`` was read
    from at the same path, decides instead: ``value`` is a buffer (persistent or
    not) where it was one there, and new parents copy the ``training`` flag of
    the modules they stand for.

    Something of the same kind already at ``path`` is replaced. A non-module on
    the way, or something held another way at ``path`` (a parameter where a
    submodule would go), raises ``PathBlockedError`` and changes nothing.
    """
    *parents, field = _parts(path)
    owner, depth = _existing_parent(root, parents, path)
    source = copied_from
    for index, name in enumerate(parents):
        if copied_from is not None:
            source = _member(source, name)
        if index >= depth:  # missing from here on, so nothing below can be in the way
            child = torch.nn.Module()
            child.__dict__["training"] = getattr(source, "training", True)  # a plain attribute
            if type(owner._modules) is MirroredModules:  # a GraphModule's parents mirror too
                mirror(child)
            owner._modules[name] = child
            owner = child
    if copied_from is None:
        kind = _kind_of(value, as_buffer)
    elif isinstance(source, torch.nn.Module) and field in source._buffers:
        kind, persistent = "buffer", field not in source._non_persistent_buffers_set
    else:
        kind = _kind_of(value, False)
    _put(owner, field, value, kind, persistent, root, path)


def delete(root: torch.nn.Module, path: str) -> bool:
    """Remove what a module holds at ``path`` (submodule, parameter, buffer, plain attribute).

    False, changing nothing, where no module holds anything there.
    """
    parent, _, field = path.rpartition(".")
    owner = find(root, parent) if parent else root
    if not isinstance(owner, torch.nn.Module) or _held_as(owner, field) is None:
        return False
    delattr(owner, field)
    return True


def free_name(
    root: torch.nn.Module | None,
    wanted: str,
    *,
    taken: Container[str] = (),
    start: int | None = None,
) -> str:
    """The first of ``wanted``, ``wanted_1``, ``wanted_2``, ... that names nothing under ``root``.

    With ``start``, every candidate is numbered, from ``start``, with no
    separator (``_tensor_constant0``, ``_tensor_constant1``, ...). A dotted
    ``wanted`` keeps its parents and numbers the last part (``layer1.conv_fused_1``);
    missing parents are fine (``install`` creates them). Names in ``taken`` count
    as used too; with ``root`` None only they do (a module still being planned).
    ``PathBlockedError`` if a parent is not a module.
    """
    if root is None:
        return next(name for name in _numbered(wanted, start) if name not in taken)
    *parents, field = _parts(wanted)
    owner, depth = _existing_parent(root, parents, wanted)
    head = wanted[: len(wanted) - len(field)]
    for candidate in _numbered(field, start):
        name = head + candidate
        if name in taken:
            continue
        if depth < len(parents) or _member(owner, candidate) is MISSING:
            return name
    raise AssertionError("unreachable: the candidates never run out")


# ------------------------------------------------------------------ helpers
_KINDS = {"_modules": "submodule", "_parameters": "parameter", "_buffers": "buffer"}


def _parts(path: str) -> list[str]:
    parts = path.split(".")
    if "" in parts:
        raise ValueError(f"{path!r} is not a qualified name (an empty part)")
    return parts


def _existing_parent(
    root: torch.nn.Module, parents: list[str], path: str
) -> tuple[torch.nn.Module, int]:
    """The deepest existing module on the way to ``path`` and how many parents it covers.

    ``PathBlockedError`` if a non-module (a tensor, a ``None`` parameter, any
    plain attribute) stands where a parent module is needed.
    """
    owner = root
    for depth, name in enumerate(parents):
        child = owner._modules.get(name)
        if child is None:  # an empty submodule slot counts as missing
            held = _held_as(owner, name)
            if held is not None and held != "submodule":
                raise PathBlockedError(
                    f"cannot install {path!r} in {type(root).__name__}: "
                    f"{'.'.join(parents[: depth + 1])!r} is {_describe(owner, name, held)}, "
                    "not a module"
                )
            return owner, depth
        owner = child
    return owner, len(parents)


def _held_as(owner: torch.nn.Module, name: str) -> str | None:
    """How ``owner`` itself holds ``name`` (``"submodule"``, ..., ``"attribute"``), or None."""
    state = owner.__dict__
    for table, kind in _KINDS.items():
        if name in state[table]:
            return kind
    return "attribute" if name in state else None


def _describe(owner: torch.nn.Module, name: str, held: str) -> str:
    """``a parameter (Parameter)``, ``a plain attribute (dict)``, ``a parameter (None)``."""
    value = _member(owner, name)
    what = "None" if value is None else type(value).__name__
    return f"a {'plain attribute' if held == 'attribute' else held} ({what})"


def _kind_of(value: Any, as_buffer: bool) -> str:
    """How ``value`` is held: a parameter, a submodule, a buffer (with ``as_buffer``) or an attribute."""
    # Module first: an isinstance check against Parameter runs Python code (its metaclass).
    if isinstance(value, torch.nn.Module):
        return "submodule"
    if isinstance(value, torch.nn.Parameter):
        return "parameter"
    if as_buffer and isinstance(value, torch.Tensor):
        return "buffer"
    return "attribute"


def _put(
    owner: torch.nn.Module,
    field: str,
    value: Any,
    kind: str,
    persistent: bool,
    root: torch.nn.Module,
    path: str,
) -> None:
    held = _held_as(owner, field)
    if held is None and kind != "attribute":
        # Nothing there yet: write the table as nn.Module's setters would, without their
        # cost (their checks cannot fail here; global registration hooks are not run).
        state = owner.__dict__
        if kind == "buffer":
            state["_buffers"][field] = value
            if not persistent:
                owner._non_persistent_buffers_set.add(field)
        elif kind == "parameter":
            state["_parameters"][field] = value
        else:
            state["_modules"][field] = value
    elif held is not None and held != kind:
        raise PathBlockedError(
            f"cannot install {path!r} in {type(root).__name__}: it holds "
            f"{_describe(owner, field, held)} there, and the new {type(value).__name__} would be "
            f"a {kind}; delete the old one first"
        )
    elif kind == "buffer":
        owner.register_buffer(field, value, persistent=persistent)
    else:
        setattr(owner, field, value)


def _numbered(field: str, start: int | None) -> Iterator[str]:
    if start is None:
        yield field
        start, field = 1, f"{field}_"
    while True:
        yield f"{field}{start}"
        start += 1


def _first_gap(root: Any, path: str) -> tuple[Any, str, str]:
    """(the last object reached, its path, the first missing part) along ``path``."""
    value = root
    walked: list[str] = []
    for name in path.split("."):
        found = _member(value, name)
        if found is MISSING:
            return value, ".".join(walked), name
        value = found
        walked.append(name)
    # Only paths that find() does not resolve make a MissingAttributeError.
    raise ValueError(f"{path!r} exists under {type(root).__name__}")


def _missing_message(root: Any, path: str, owner: Any, found: str, missing: str) -> str:
    close = difflib.get_close_matches(missing, _attribute_names(owner), n=3)
    hint = f" (did you mean {', '.join(repr(name) for name in close)}?)" if close else ""
    if not found:
        return f"{type(root).__name__} has no attribute {missing!r}{hint}"
    where = (
        f"{found!r} is None, which" if owner is None else f"{found!r} (a {type(owner).__name__})"
    )
    return f"{type(root).__name__} has no attribute {path!r}: {where} has no {missing!r}{hint}"


def _attribute_names(value: Any) -> list[str]:
    if isinstance(value, torch.nn.Module):
        return [*value._modules, *value._parameters, *value._buffers, *vars(value)]
    return [name for name in dir(value) if not name.startswith("__")]
