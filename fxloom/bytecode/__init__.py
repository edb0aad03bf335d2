"""The bytecode-level frontend: ``fxloom.compile`` (docs/compile.md).

One file per concern, read top-down:

- ``instructions``: the decoder (``dis`` plus the exception table), one instruction form for
  CPython 3.11–3.13;
- ``interpreter`` and ``handlers/``: the symbolic interpreter, one handler family per file;
- ``calls``: what a call does (inline, record, run natively, break);
- ``recording``, ``sources``, ``guards``, ``graph_builder``: values read from outside and their
  guards, and the graph;
- ``entry``: one cache entry (guard, graph, generated run function); ``driver``: pieces
  between graph breaks; ``compiled``: the API and the cache; ``explain``, ``breaks``: reports.

Depends on the IR and the values layer only (tests/test_layers.py).
"""
