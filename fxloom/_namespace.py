"""The naming authority: unique, readable Python identifiers in amortised O(1).

Every node name and every global of generated code is handed out by a
``Namespace``. Its invariants:

* a returned name is a plain identifier (``is_plain_identifier``: ASCII letters, digits
  and ``_``), never a Python keyword, never a builtin's name and never one of the
  namespace's reserved words. ASCII because Python folds other identifiers to NFKC
  when it compiles generated code: ``ｓｅｌｆ`` and ``𝐬𝐞𝐥𝐟`` would both become ``self``,
  and two names that print differently would be one variable;
* a returned name is never returned again by the same namespace;
* the candidate is kept when it is free (``"add"``), otherwise a numeric suffix
  is added (``"add_1"``, ``"add_2"``, ...). A candidate that already carries a
  suffix (``"add_7"``) shares the counter of its base (``"add"``).

Cost: one counter per base name, moving only forward, so the suffix probing
over a namespace's lifetime is bounded by the number of names handed out — no
rescans of the graph, however long it grows.
"""

from __future__ import annotations

import builtins
import keyword
import re
import unicodedata
from typing import Any

__all__ = ["Namespace", "sanitize", "is_plain_identifier", "RESERVED_NAMES"]

_INVALID_CHARS = re.compile(r"[^0-9a-zA-Z_]+")
_SUFFIXED = re.compile(r"^(.*)_(\d+)$")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

# Names generated code may read as globals; a value named like one of them
# would shadow it.
RESERVED_NAMES = frozenset(
    set(keyword.kwlist)
    | set(getattr(keyword, "softkwlist", ()))
    | set(dir(builtins))
    | {"self", "torch", "operator", "math", "typing", "fxloom", "inf", "nan"}
)


def is_plain_identifier(name: Any) -> bool:
    """Whether ``name`` is a string of ASCII letters, digits and ``_``, not starting with a
    digit and not a keyword: the only names generated code and saved files use, since each
    means exactly itself (no NFKC folding, no second spelling)."""
    # For ASCII text, isidentifier() is exactly [A-Za-z_][A-Za-z0-9_]* (and as fast as it gets).
    return (
        isinstance(name, str)
        and name.isascii()
        and name.isidentifier()
        and not keyword.iskeyword(name)
    )


def sanitize(candidate: str) -> str:
    """Turn any string into a snake_case ASCII identifier stem (``"layer1.Conv"`` ->
    ``"layer1_conv"``; ``"poids_é"`` -> ``"poids_e"``: letters lose their accents; a character
    with no ASCII form is spelled by its code point, ``"π"`` -> ``"u03c0"``)."""
    dotted = candidate.replace(".", "_")  # fast path: a lower-case module path ("layer1.0.conv")
    if dotted.islower() and not dotted.startswith("_") and is_plain_identifier(dotted):
        return dotted
    if not candidate.isascii():
        candidate = "".join(map(_ascii_spelling, candidate))
    stem = _CAMEL_BOUNDARY.sub("_", candidate)
    stem = _INVALID_CHARS.sub("_", stem).lower()
    # "__add__" -> "add"; a trailing "_" that marks an in-place op ("add_") stays, and so do
    # leading ones ("_assert", "_get_bias"), as in torch.fx: a node name from torch.fx then
    # names the same node here.
    if stem.startswith("__") and stem.endswith("__"):
        stem = stem.strip("_")
    if not stem:
        return "_unnamed"
    if stem[0].isdigit():
        stem = "_" + stem
    return stem


def _ascii_spelling(char: str) -> str:
    if char.isascii():
        return char
    # NFKD splits "é" into "e" and a combining accent (dropped), "ｘ" and "𝐱" into "x".
    folded = unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode()
    if folded or unicodedata.combining(char):
        return folded
    return f"u{ord(char):04x}"


class Namespace:
    """Hands out unique identifiers; see the module docstring for the invariants."""

    __slots__ = ("_used", "_next_suffix", "_reserved", "_split_cache", "_taken_elsewhere")

    def __init__(
        self,
        reserved: frozenset[str] = RESERVED_NAMES,
        taken_elsewhere: Namespace | None = None,
    ) -> None:
        self._used: set[str] = set()
        # Another namespace whose names this one must also avoid (generated
        # globals avoid node names) — consulted, not copied.
        self._taken_elsewhere = (
            taken_elsewhere._used if taken_elsewhere is not None else frozenset()
        )
        self._next_suffix: dict[str, int] = {}
        self._reserved = reserved
        # candidate -> (base, requested suffix or 0); the same few candidates
        # ("add", "relu", ...) come back for every node, so sanitising once pays.
        self._split_cache: dict[str, tuple[str, int]] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._used or name in self._taken_elsewhere

    def _split(self, candidate: str) -> tuple[str, int]:
        split = self._split_cache.get(candidate)
        if split is None:
            stem = candidate if is_plain_identifier(candidate) else sanitize(candidate)
            match = _SUFFIXED.match(stem)
            if match and match.group(1) and not match.group(2).startswith("0"):
                split = (match.group(1), int(match.group(2)))
            else:
                split = (stem, 0)
            self._split_cache[candidate] = split
        return split

    def create_name(self, candidate: str) -> str:
        """Return ``candidate`` made unique (and valid), and mark it used."""
        base, suffix = self._split(candidate)
        name = f"{base}_{suffix}" if suffix else base
        used, reserved, elsewhere = self._used, self._reserved, self._taken_elsewhere
        if name in used or name in reserved or name in elsewhere:
            counter = self._next_suffix.get(base, 1)
            name = f"{base}_{counter}"
            while name in used or name in reserved or name in elsewhere:
                counter += 1
                name = f"{base}_{counter}"
            self._next_suffix[base] = counter + 1
        used.add(name)
        return name

    def reserve(self, name: str) -> None:
        """Mark ``name`` as taken (for names chosen elsewhere, e.g. a graph's node names)."""
        self._used.add(name)
