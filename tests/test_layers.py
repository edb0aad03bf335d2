"""Each layer of fxloom imports only the layers beneath it (DESIGN.md: "No layer reaches back up").

``LAYERS`` places every module under fxloom/ in one layer; ``MAY_IMPORT`` says which other
layers each layer may import. The check reads the sources with ``ast`` and never imports
fxloom. It counts every import that runs: ``import``/``from ... import`` statements anywhere
(inside functions too, since a lazy import still ties a lower layer to a higher one) and
``importlib.import_module("fxloom...")`` calls. Imports under ``if TYPE_CHECKING:`` are left
out: they only name a type in annotations (``ops`` documents that it receives ``Node`` objects
without depending on the IR).

The frontends (symbolic tracing, export, the coming bytecode frontend) are each a layer of
their own and never import each other; what they share lives in ``values`` under them, which
imports no frontend. An import the table forbids but named work has yet to remove is listed in
``EXCEPTIONS`` with the reason. README's layer table quotes this one: the same layers in the same
order, each with the same "may import" (``test_readme_quotes_the_layer_table``).

A new module must be given a layer here (``test_every_module_belongs_to_a_layer`` says so);
``LAYERS`` already names where the next pieces go (``bytecode``), so a module added there is
placed at once.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

PACKAGE = "fxloom"
PACKAGE_DIR = Path(__file__).resolve().parent.parent / PACKAGE

# layer -> its modules. A package stands for everything inside it; `fxloom` itself is only the
# package's __init__ (the public names). A module belongs to the layer of its longest entry.
LAYERS: dict[str, tuple[str, ...]] = {
    # Facts and value helpers every layer shares: immutable argument containers, the argument
    # pytree, qualified-name access to attributes, operator facts.
    "foundation": (
        "fxloom.immutable_collections",
        "fxloom.pytree",
        "fxloom.library_containers",
        "fxloom._mirrored_modules",
        "fxloom.attr_path",
        "fxloom.ops",
        "fxloom._version",
        "fxloom._torch_compat",
        "fxloom._notes",
        "fxloom._lazy",
        "fxloom._union_find",
    ),
    "ir": (
        "fxloom.node",
        "fxloom.graph",
        "fxloom.codegen",
        "fxloom.pytree_codegen",
        "fxloom.graph_module",
        "fxloom.lint",
        "fxloom.liveness",
        "fxloom._format",
        "fxloom._namespace",
        "fxloom._graph_pickle",
        "fxloom._dead_code",
        "fxloom._renamed_modules",
        "fxloom._to_folder",
        "fxloom.source_location",
    ),
    # What every frontend computes with and owns none of: stand-in tensors, the metadata mode,
    # the shape environment and symbolic sizes, user frames, the module stack, provenance, the
    # torch.fx interop flag and the one capture context. Also what every frontend's programs
    # use: ``cond`` (users call it under any frontend) and the run-time checks graphs call (the
    # TorchScript twins of the guards; ``fxloom.runtime_checks``, the input checks traced and
    # exported modules share).
    "values": (
        "fxloom.values",
        "fxloom.cond",
        "fxloom._guards_torchscript",
        "fxloom.runtime_checks",
    ),
    # The frontends, each its own layer: none imports another.
    "symbolic tracing": (
        "fxloom.proxy",
        "fxloom.tracer",
        "fxloom.tracing",
        "fxloom.guards",
        "fxloom.autoleaf",
    ),
    "export": ("fxloom.export",),
    # The coming bytecode-level frontend (``fxloom.compile``): placed before it is written.
    "bytecode": ("fxloom.bytecode",),
    "run": ("fxloom.interpreter",),
    "passes": ("fxloom.passes", "fxloom.subgraph_rewriter", "fxloom.quantize"),
    "backends": ("fxloom.backends", "fxloom.lower", "fxloom.distributed"),
    "persistence": ("fxloom.serialize",),
    "surface": ("fxloom", "fxloom.__main__", "fxloom.cli", "fxloom.zoo"),
}

FRONTENDS = frozenset({"symbolic tracing", "export", "bytecode"})

# layer -> the other layers it may import (DESIGN.md's table of layers).
MAY_IMPORT: dict[str, frozenset[str]] = {
    "foundation": frozenset(),
    "ir": frozenset({"foundation"}),
    "values": frozenset({"foundation", "ir"}),
    "symbolic tracing": frozenset({"foundation", "ir", "values"}),
    "export": frozenset({"foundation", "ir", "values"}),
    "bytecode": frozenset({"foundation", "ir", "values"}),
    # Transformer, the documented torch.fx API, hands each opcode method Proxy values and
    # records them with a tracer: the run layer builds graphs the way symbolic tracing does.
    "run": frozenset({"foundation", "ir", "values", "symbolic tracing"}),
    # Passes take pattern functions and modules from users (replace_pattern, fuse) and trace
    # them, recognise the guard calls tracing records and accept exported programs: they use
    # the frontends' public entry points. No frontend imports passes.
    "passes": frozenset({"foundation", "ir", "values", "run"} | FRONTENDS),
    # Backends take plain modules and exported programs (fxloom.lower traces the module it is
    # given, translates an exported program): like passes, they use the frontends' entry points.
    "backends": frozenset({"foundation", "ir", "values", "run", "passes"} | FRONTENDS),
    # Saving writes what every other layer makes: exported programs (export), quantized
    # modules (passes), lowered ONNX Runtime modules (backends). Nothing below imports it.
    "persistence": frozenset(
        {"foundation", "ir", "values", "run", "passes", "backends"} | FRONTENDS
    ),
    "surface": frozenset(LAYERS) - {"surface"},
}

# Imports the table forbids that stay until named work removes them: (importer, imported) ->
# why, and what deletes it. ``test_every_exception_is_still_needed`` fails once one is gone, so
# the entry is deleted with the import.
EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    """One import of an fxloom module by a source file."""

    path: str
    line: int
    importer: str
    imported: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported}"


def layer_of(module: str) -> str | None:
    """The layer of `module` (its longest matching entry in LAYERS), or None if it has none."""
    best, best_length = None, -1
    for layer, entries in LAYERS.items():
        for entry in entries:
            covers = module == entry or (entry != PACKAGE and module.startswith(entry + "."))
            if covers and len(entry) > best_length:
                best, best_length = layer, len(entry)
    return best


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def fxloom_imports(
    source: str, importer: str, is_package: bool, modules: frozenset[str], path: str = "<source>"
) -> Iterator[Import]:
    """Every fxloom module that `source` (the module `importer`) imports, with its line."""
    package = importer if is_package else importer.rpartition(".")[0]
    tree = ast.parse(source, filename=path)
    # The body of ``if TYPE_CHECKING:`` only; an ``else:`` branch runs.
    type_only = {
        id(inner)
        for block in _type_checking_blocks(tree)
        for statement in block.body
        for inner in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            # `from fxloom.passes import _dot` imports a module; `from fxloom.node import Node`
            # imports a name from one.
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        elif isinstance(node, ast.Call) and _is_import_module(node):
            names = [node.args[0].value]
        else:
            continue
        for name in dict.fromkeys(names):
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                yield Import(path, node.lineno, importer, name)


def _type_checking_blocks(tree: ast.AST) -> Iterator[ast.If]:
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                yield node


def _absolute(module: str | None, level: int, package: str) -> str:
    if level == 0:
        return module or ""
    base = package.rsplit(".", level - 1)[0] if level > 1 else package
    return f"{base}.{module}" if module else base


def _is_import_module(call: ast.Call) -> bool:
    func = call.func
    named = (isinstance(func, ast.Name) and func.id == "import_module") or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )
    has_name = bool(call.args) and isinstance(call.args[0], ast.Constant)
    return named and has_name and isinstance(call.args[0].value, str)


@cache
def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


@cache
def package_imports() -> tuple[Import, ...]:
    modules = frozenset(package_modules())
    found: list[Import] = []
    for name, path in package_modules().items():
        relative = path.relative_to(PACKAGE_DIR.parent).as_posix()
        source = path.read_text(encoding="utf-8")
        found += fxloom_imports(source, name, path.name == "__init__.py", modules, relative)
    return tuple(found)


def _rules() -> Iterator[object]:
    for layer, allowed in MAY_IMPORT.items():
        for other in LAYERS:
            if other == layer or other in allowed:
                continue
            yield pytest.param(layer, other, id=f"{layer}-imports-no-{other}")


# --- the rule, applied to fxloom ---------------------------------------------------------------


def test_every_module_belongs_to_a_layer() -> None:
    homeless = [name for name in package_modules() if layer_of(name) is None]
    assert not homeless, f"give these modules a layer in LAYERS (tests/test_layers.py): {homeless}"


@pytest.mark.parametrize("layer, other", list(_rules()))
def test_a_layer_does_not_import_a_layer_above_it(layer: str, other: str) -> None:
    breaks = [
        str(found)
        for found in package_imports()
        if layer_of(found.importer) == layer
        and layer_of(found.imported) == other
        and (found.importer, found.imported) not in EXCEPTIONS
    ]
    assert not breaks, f"{layer} may import only {sorted(MAY_IMPORT[layer])}:\n" + "\n".join(breaks)


def test_every_exception_is_still_needed() -> None:
    edges = {(found.importer, found.imported) for found in package_imports()}
    allowed = [
        pair
        for pair in EXCEPTIONS
        if pair not in edges or layer_of(pair[1]) in MAY_IMPORT[layer_of(pair[0]) or ""]
    ]
    assert not allowed, f"these imports are gone or allowed: delete them from EXCEPTIONS: {allowed}"


def test_frontends_never_import_each_other() -> None:
    assert FRONTENDS <= set(LAYERS)
    for frontend in FRONTENDS:
        assert not MAY_IMPORT[frontend] & FRONTENDS, f"{frontend} may import another frontend"


def test_values_import_no_frontend() -> None:
    assert not MAY_IMPORT["values"] & FRONTENDS


def test_the_scan_sees_imports_of_every_kind() -> None:
    edges = {(found.importer, found.imported) for found in package_imports()}
    assert ("fxloom.graph", "fxloom.node") in edges  # from fxloom.node import Node
    assert (
        "fxloom.cli.demo",
        "fxloom.cli.demo_passes",
    ) in edges  # from fxloom.cli import demo_passes
    assert ("fxloom.cli.draw", "fxloom.passes._dot") in edges  # inside a function
    assert ("fxloom.__main__", "fxloom.cli") in edges


def test_the_layer_table_is_consistent() -> None:
    assert set(MAY_IMPORT) == set(LAYERS)
    entries = [entry for modules in LAYERS.values() for entry in modules]
    assert len(entries) == len(set(entries)), "a module is listed in two layers"


README = PACKAGE_DIR.parent / "README.md"
_README_HEADER = "| layer | in `fxloom/` | may import |"


def readme_layer_table() -> dict[str, frozenset[str]]:
    """README's layer table, in its order: layer -> the layers its "may import" cell names.

    Parenthesised remarks are left out; "torch only" names no layer, "everything" every other.
    """
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index(_README_HEADER) + 2  # past the header and its |---| line
    table: dict[str, frozenset[str]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        layer, _where, may_import = (cell.strip() for cell in line.strip("|").split("|"))
        named = re.sub(r"\([^()]*\)", "", may_import)
        if named.strip() == "everything":
            table[layer] = frozenset(LAYERS) - {layer}
            continue
        names = {name.strip() for name in named.split(",")} - {"torch only"}
        table[layer] = frozenset(names)
    return table


def test_readme_quotes_the_layer_table() -> None:
    quoted = readme_layer_table()
    assert list(quoted) == list(LAYERS), "README's layers are not LAYERS, in LAYERS' order"
    differ = {layer: sorted(quoted[layer] ^ MAY_IMPORT[layer]) for layer in LAYERS}
    assert not any(differ.values()), f"README's 'may import' differs from MAY_IMPORT: {differ}"


# --- the checker itself, on small examples ------------------------------------------------------

KNOWN = frozenset({"fxloom", "fxloom.pkg", "fxloom.pkg.sub", "fxloom.pkg.mod", "fxloom.node"})


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import fxloom.node", ["fxloom.node"]),
        ("import fxloom", ["fxloom"]),
        ("from fxloom.node import Node, map_arg", ["fxloom.node"]),
        ("from fxloom.pkg import sub, helper", ["fxloom.pkg.sub", "fxloom.pkg"]),
        ("from . import sub", ["fxloom.pkg.sub"]),
        ("from .sub import thing", ["fxloom.pkg.sub"]),
        ("from .. import node", ["fxloom.node"]),
        ("def f():\n    from fxloom.node import Node", ["fxloom.node"]),
        ("if TYPE_CHECKING:\n    from fxloom.node import Node", []),
        ("if typing.TYPE_CHECKING:\n    import fxloom.node", []),
        ("if TYPE_CHECKING:\n    pass\nelse:\n    import fxloom.node", ["fxloom.node"]),
        ("importlib.import_module('fxloom.pkg.sub')", ["fxloom.pkg.sub"]),
        ("import torch\nfrom torch import nn", []),
    ],
)
def test_the_checker_resolves(source: str, expected: list[str]) -> None:
    found = fxloom_imports(source, "fxloom.pkg.mod", is_package=False, modules=KNOWN)
    assert [each.imported for each in found] == expected


@pytest.mark.parametrize(
    "module, layer",
    [
        ("fxloom", "surface"),
        ("fxloom.cli.demo", "surface"),
        ("fxloom.node", "ir"),
        ("fxloom.values.stand_in", "values"),
        ("fxloom.values.symbolic.shape_env", "values"),
        ("fxloom.tracing.patches", "symbolic tracing"),
        ("fxloom.export.capture", "export"),
        ("fxloom.bytecode", "bytecode"),
        ("fxloom.passes.fuse.rules", "passes"),
        ("fxloom.nodes", None),  # a prefix of the name, not of the dotted path
        ("fxloom.brand_new", None),  # the package root does not swallow new modules
    ],
)
def test_layer_of(module: str, layer: str | None) -> None:
    assert layer_of(module) == layer
