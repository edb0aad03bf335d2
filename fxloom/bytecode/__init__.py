"""The bytecode-level frontend: ``fxloom.compile`` (docs/compile.md).

One file per concern, read top-down:

- ``instructions``: the decoder (``dis`` plus the exception table), one instruction form for
  CPython 3.11–3.13;
- ``interpreter`` and ``handlers/``: the symbolic interpreter, one handler family per file;
- ``callees``: the callee table, what every callable does (the native-call policy, one row
  per callable, default deny for C code), extended with ``classify``; ``calls`` carries it out;
- ``recording``, ``sources``, ``guards``, ``graph_builder``: values read from outside and their
  guards, and the graph;
- ``entry``: one cache entry (guard, graph, generated run function); ``driver``: pieces
  between graph breaks; ``compiled``: the API and the cache; ``explain``, ``breaks``: reports.

Depends on the IR and the values layer only (tests/test_layers.py).
"""

from fxloom.bytecode.callees import classify

__all__ = ["classify"]
