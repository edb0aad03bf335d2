"""JSON as the loader reads it: one meaning for every document.

``json.loads`` accepts two things a reader of the file would misread: a key given twice in one
object (``{"target": "torch.relu", "target": "torch.neg"}``: a reviewer reads the first, Python
keeps the last, other readers differ), and ``NaN``/``Infinity``, which are not JSON. Both are
refused. The document's values are counted first (``limits.check_json_values``), so parsing
and the duplicate check stay within the per-byte limits; a document nested too deeply to parse
is refused too. Every JSON document a file holds (``format.json``, ``program.json``, the
weights' safetensors header) is parsed here.

Depends on ``limits``.
"""

from __future__ import annotations

import json
from typing import Any

from fxloom.serialize import limits
from fxloom.serialize.errors import SerializationError

__all__ = ["parse_json"]

# Keys that name an object in fxloom's documents, in the order they are tried when a
# message says which object gives a key twice: a node, a tensor record, a module record.
_NAMING_KEYS = ("name", "key", "class", "kind")


def parse_json(data: bytes | bytearray | str, document: str) -> Any:
    """``data`` parsed, or ``SerializationError`` naming ``document`` (``fxloom/program.json``)::

    >>> parse_json(b'{"op": "call_function", "target": "torch.relu"}', "program.json")
    {'op': 'call_function', 'target': 'torch.relu'}
    >>> parse_json(b'{"name": "r", "target": "torch.relu", "target": "torch.neg"}', "program.json")
    Traceback (most recent call last):
    ...
    fxloom.serialize.errors.SerializationError: program.json gives the key 'target' twice in one object (the object whose "name" is 'r'): a reviewer reads one value and a parser may keep the other; refused
    """
    limits.check_json_values(data.encode() if isinstance(data, str) else data, document)
    try:
        return json.loads(data, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except _KeyGivenTwice as e:
        raise SerializationError(
            f"{document} gives the key {e.key!r} twice in one object ({e.describe()}): a reviewer "
            "reads one value and a parser may keep the other; refused"
        ) from None
    except RecursionError:
        raise SerializationError(f"{document} is nested too deeply; refused") from None
    except ValueError as e:
        raise SerializationError(f"{document} is not valid JSON: {e}") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Called for every object: the dict is built in C, and the pairs are looked at again only
    # when it came out shorter.
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _KeyGivenTwice(pairs)
    return result


def _refuse_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


class _KeyGivenTwice(Exception):
    """Raised inside ``json.loads`` (not a ``ValueError``, which would read as a syntax error)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        seen: set[str] = set()
        self.key = next(k for k, _ in pairs if k in seen or seen.add(k))
        self.pairs = pairs

    def describe(self) -> str:
        """Which object: by the key that names it in fxloom's documents, else by its keys."""
        for naming in _NAMING_KEYS:
            value = next((v for k, v in self.pairs if k == naming and isinstance(v, str)), None)
            if value is not None:
                return f'the object whose "{naming}" is {value[:80]!r}'
        keys = list(dict.fromkeys(k for k, _ in self.pairs))
        shown = ", ".join(repr(k[:40]) for k in keys[:6]) + (", ..." if len(keys) > 6 else "")
        return f"an object with the keys {shown}"
