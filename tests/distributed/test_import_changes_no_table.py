"""Importing ``fxloom.distributed`` changes no table of tracing: registries are declared, not filled.

What the distributed package adds to tracing (``rpc_sync``/``rpc_async`` as leaves, the async
pair of ``rpc_sync`` for ``schedule_async``) is declared in the tables themselves
(``fxloom.tracing.wrapped.LIBRARY_LEAVES``, ``fxloom.passes.schedule.LIBRARY_ASYNC_CALLS``),
so a trace does the same whether or not the package was imported. The check runs a fresh
interpreter: it first imports every module of fxloom the distributed package needs (so their
own first-import work is done), takes a snapshot of every module-level table of the tracing
layer and of the tables tracing reads, imports each module of ``fxloom.distributed``, and
compares.
"""

from __future__ import annotations

from tests.fresh_process import run_fresh

# The tables tracing owns, and those it reads (the torch.fx wrap registry through
# ``fxloom.values.fx_interop``, side effects in ``fxloom.ops``, the scheduler's async pairs).
TRACING_TABLES = (
    "fxloom.proxy",
    "fxloom.tracer",
    "fxloom.tracing",
    "fxloom.guards",
    "fxloom.autoleaf",
    "fxloom.values",
    "fxloom.ops",
    "fxloom.passes.schedule",
    "torch.fx._symbolic_trace",
)

_SNAPSHOT = """
import importlib, json, pkgutil, sys
import fxloom, fxloom.distributed as distributed

TABLES = %r
SEQUENCES = (list, tuple, set, frozenset)

def distributed_modules():
    names = [distributed.__name__]
    names += [m.name for m in pkgutil.walk_packages(distributed.__path__, "fxloom.distributed.")]
    return names

def watched(name):
    return any(name == t or name.startswith(t + ".") for t in TABLES)

def table_state(value):
    # What a registration changes: the keys and the identity of what each holds.
    if isinstance(value, dict):
        return sorted((repr(k), id(v)) for k, v in value.items())
    return sorted(id(item) for item in value) if isinstance(value, (set, frozenset)) else [
        id(item) for item in value
    ]

def snapshot():
    tables = {}
    for name, module in list(sys.modules.items()):
        if module is None or not watched(name):
            continue
        for attribute, value in list(vars(module).items()):
            if isinstance(value, (dict, *SEQUENCES)) and not attribute.startswith("__"):
                tables[f"{name}.{attribute}"] = table_state(value)
    return tables
"""


def _needed_modules() -> list[str]:
    """The modules importing all of ``fxloom.distributed`` loads, outside the package."""
    return run_fresh(
        _SNAPSHOT % (TRACING_TABLES,)
        + """
before = set(sys.modules)
for name in distributed_modules():
    importlib.import_module(name)
added = sorted(set(sys.modules) - before)
print(json.dumps([n for n in added if not n.startswith("fxloom.distributed")]))
"""
    )


def test_importing_fxloom_distributed_changes_no_tracing_table():
    needed = _needed_modules()
    changed = run_fresh(
        _SNAPSHOT % (TRACING_TABLES,)
        + f"""
for name in {needed!r}:
    importlib.import_module(name)
import fxloom.tracer  # the tracing layer whole, tables declared
before = snapshot()
for name in distributed_modules():
    importlib.import_module(name)
after = snapshot()
print(json.dumps(sorted(k for k in before if after.get(k) != before[k])))
"""
    )
    assert changed == [], f"importing fxloom.distributed changed {changed}"
