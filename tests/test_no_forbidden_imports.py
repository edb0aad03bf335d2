"""fxloom never uses the machinery it re-implements.

DESIGN.md: nothing inside fxloom/ may use torch.fx (nor torch.fx.experimental and its make_fx),
torch.export, torch._dynamo (nor torch.compile, its entry point), torch.jit,
torch._subclasses.fake_tensor, or torch's functionalization API. Tests and benchmarks may
import them to compare with; the library may not.

One exception (DESIGN.md, "interoperability"): fxloom may read torch.fx's wrap registry and set
its tracing flag, so libraries written for torch.fx behave alike. Exactly one module does, by
looking torch.fx's tracer module up in `sys.modules` (never importing it): ALLOWED_INTEROP.

Two checks enforce this:

* Statically: every source file under fxloom/ is parsed with `ast`, and its import
  statements, its `importlib.import_module("...")` / `__import__("...")` calls, and its dotted
  uses such as `torch.fx.Graph`, and `sys.modules` look-ups of a module by name (which work without importing torch.fx, because `import torch`
  loads it) are compared with the forbidden list. Comments and docstrings may mention torch.fx.
* At run time: a fresh interpreter imports torch, notes sys.modules, then imports fxloom and
  every submodule, and reports which modules fxloom's import added. `import torch` already
  loads torch.fx, torch.export and torch.jit itself, so this check mainly catches lazily
  loaded ones (torch._dynamo); the static check covers the rest.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "fxloom"

# Dotted names fxloom may not use: a use of one of these, or of anything beneath it, is forbidden.
FORBIDDEN_MODULES = (
    "torch.fx",  # includes torch.fx.experimental (and make_fx in its proxy_tensor module)
    "torch.export",
    "torch._dynamo",
    "torch.jit",
    "torch._subclasses.fake_tensor",
)
FORBIDDEN_TORCH_APIS = (
    "torch.compile",  # torch._dynamo's front door
    # torch's functionalization API
    "torch.func.functionalize",
    "torch._C._functionalization",
    "torch._to_functional_tensor",
    "torch._from_functional_tensor",
    "torch._enable_functionalization",
    "torch._disable_functionalization",
)
# The one use of torch.fx allowed (DESIGN.md's interoperability exception): source file -> name.
ALLOWED_INTEROP = {
    "fxloom/values/fx_interop.py": "torch.fx._symbolic_trace",
}
# Forbidden wherever in torch they are imported from (torch re-exports them in several places).
# fxloom may define its own functions of these names.
FORBIDDEN_TORCH_NAMES = ("make_fx", "functionalize")


@dataclass(frozen=True)
class Use:
    """One place a source file reaches for a forbidden name."""

    path: str
    line: int
    name: str
    how: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.how} {self.name}"


def is_forbidden(dotted_name: str) -> bool:
    parts = dotted_name.split(".")
    if parts[0] != "torch":
        return False
    if parts[-1] in FORBIDDEN_TORCH_NAMES:
        return True
    return any(
        dotted_name == prefix or dotted_name.startswith(prefix + ".")
        for prefix in FORBIDDEN_MODULES + FORBIDDEN_TORCH_APIS
    )


def forbidden_uses(source: str, path: str = "<source>") -> list[Use]:
    """Every forbidden import, dynamic import or dotted use in `source`, one per line and name."""
    tree = ast.parse(source, filename=path)
    torch_aliases = _names_bound_to_torch(tree)
    found: dict[tuple[int, str], Use] = {}
    for line, name, how in _dotted_names_used(tree, torch_aliases):
        if is_forbidden(name):
            found.setdefault((line, name), Use(path, line, name, how))
    # `torch.fx.Graph` also contains `torch.fx`: report only the longest name on each line.
    return [
        use
        for use in found.values()
        if not any(
            other.line == use.line and other.name.startswith(use.name + ".")
            for other in found.values()
        )
    ]


def _names_bound_to_torch(tree: ast.AST) -> set[str]:
    aliases = {"torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update(a.asname for a in node.names if a.name == "torch" and a.asname)
    return aliases


def _dotted_names_used(tree: ast.AST, torch_aliases: set[str]) -> Iterator[tuple[int, str, str]]:
    """(line, dotted name, how) for each import, import_module/__import__ call, dotted use and
    sys.modules look-up."""
    strings = _string_constants(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, "import"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}", "from-import"
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            if node.args and isinstance(node.args[0], ast.Constant):
                if isinstance(node.args[0].value, str):
                    yield node.lineno, node.args[0].value, "dynamic import of"
        elif isinstance(node, ast.Call | ast.Subscript):
            for name in _module_names_looked_up(node, strings):
                yield node.lineno, name, "sys.modules look-up of"
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is not None:
                root, _, rest = dotted.partition(".")
                if root in torch_aliases:
                    yield node.lineno, f"torch.{rest}", "use of"


def _module_names_looked_up(node: ast.AST, strings: dict[str, str]) -> Iterator[str]:
    """The module name in ``sys.modules.get(NAME)`` / ``sys.modules[NAME]`` (a literal, or a
    name bound to one in ``strings``): a module found by name is used as surely as one imported."""
    if isinstance(node, ast.Call) and node.args and _dotted(node.func) == "sys.modules.get":
        key = node.args[0]
    elif isinstance(node, ast.Subscript) and _dotted(node.value) == "sys.modules":
        key = node.slice
    else:
        return
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        yield key.value
    elif isinstance(key, ast.Name) and key.id in strings:
        yield strings[key.id]


def _string_constants(tree: ast.AST) -> dict[str, str]:
    """Names bound to a string literal anywhere in the file (``_MODULE = "torch.fx"``)."""
    strings = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        strings[target.id] = node.value.value
    return strings


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` for an attribute chain rooted at a plain name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def package_sources() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


# --- the rule, applied to fxloom ---------------------------------------------------------------


def test_the_whole_package_is_scanned() -> None:
    names = {path.relative_to(PACKAGE_DIR).as_posix() for path in package_sources()}
    assert "__init__.py" in names
    assert "cli/__init__.py" in names


def test_no_source_file_in_fxloom_uses_a_forbidden_module() -> None:
    uses = []
    for path in package_sources():
        relative = path.relative_to(PACKAGE_DIR.parent).as_posix()
        found = forbidden_uses(path.read_text(encoding="utf-8"), relative)
        uses += [use for use in found if ALLOWED_INTEROP.get(relative) != use.name]
    assert not uses, "fxloom must not use these (see DESIGN.md):\n" + "\n".join(map(str, uses))


FRESH_INTERPRETER_SCRIPT = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys

    import torch

    before = set(sys.modules)
    import fxloom

    skipped = []
    for module in pkgutil.walk_packages(fxloom.__path__, prefix="fxloom."):
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as error:
            if (error.name or "").split(".")[0] == "fxloom":
                raise
            skipped.append(f"{module.name} (needs {error.name})")  # an optional dependency
    print(json.dumps({"added": sorted(set(sys.modules) - before), "skipped": skipped}))
    """
)


def test_the_interoperability_module_uses_only_the_allowed_torch_fx_module() -> None:
    for relative, allowed in ALLOWED_INTEROP.items():
        source = (PACKAGE_DIR.parent / relative).read_text(encoding="utf-8")
        assert {use.name for use in forbidden_uses(source, relative)} == {allowed}


def test_importing_fxloom_and_all_its_submodules_loads_no_forbidden_module() -> None:
    result = subprocess.run(
        [sys.executable, "-c", FRESH_INTERPRETER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"importing fxloom's modules failed:\n{result.stderr}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    added_by_fxloom = [name for name in report["added"] if is_forbidden(name)]
    assert not added_by_fxloom, f"importing fxloom loaded {added_by_fxloom}"
    assert "fxloom.cli" in report["added"]  # the walk did reach the submodules


# --- the checker itself, on small examples ------------------------------------------------------


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import torch.fx", "torch.fx"),
        ("import torch.fx as fx", "torch.fx"),
        ("from torch import fx", "torch.fx"),
        ("from torch.fx import Graph", "torch.fx.Graph"),
        ("from torch.fx.experimental.proxy_tensor import make_fx", "torch.fx.experimental"),
        ("from torch._functorch.aot_autograd import make_fx", "make_fx"),
        ("import torch.export", "torch.export"),
        ("import torch\ntorch.export.export(m, ())", "torch.export.export"),
        ("import torch as t\nt._dynamo.reset()", "torch._dynamo.reset"),
        ("import torch\ntorch.compile(model)", "torch.compile"),
        ("import torch\ntorch.jit.script(model)", "torch.jit.script"),
        ("from torch._subclasses.fake_tensor import FakeTensorMode", "torch._subclasses"),
        ("from torch.func import functionalize", "torch.func.functionalize"),
        ("import importlib\nimportlib.import_module('torch._dynamo')", "torch._dynamo"),
        ("__import__('torch.jit')", "torch.jit"),
        ("import sys\nsys.modules.get('torch.fx._symbolic_trace')", "torch.fx._symbolic_trace"),
        ("import sys\nNAME = 'torch._dynamo'\nsys.modules[NAME]", "torch._dynamo"),
    ],
)
def test_the_checker_catches(source: str, expected: str) -> None:
    uses = forbidden_uses(source)
    assert len(uses) == 1, uses
    assert expected in uses[0].name


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nlayer = torch.nn.Linear(4, 5)",
        "from torch.utils._python_dispatch import TorchDispatchMode",
        "# unlike torch.fx, we allocate names in O(1)",
        '"""Compatible with torch.fx.Graph."""',
        "from fxloom.export.functionalize import functionalize",
        "import torch\nname = 'torch.fx'",
        "from torch import fxloom_like_name",
    ],
)
def test_the_checker_allows(source: str) -> None:
    assert forbidden_uses(source) == []
