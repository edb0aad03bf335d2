"""torch.fx's real clients, loaded with torch.fx replaced by fxloom.

torchvision's ``models/feature_extraction.py`` is read from the installed package at test time,
its import lines rewritten (``from torch import fx`` -> ``import fxloom as fx``, and its private
import from ``torch.fx.graph_module`` -> ``fxloom.graph_module``), and run as a new module: no copy
of their code is kept in this repository. timm's FX feature path calls torchvision's functions, so
it is pointed at the rewritten module.

torchvision's compiled operators do not load beside the CPU build of torch the project pins:
``import torchvision`` registers fake kernels for ``torchvision::`` operators that then do not
exist. ``import_torchvision`` makes ``torch.library.register_fake`` a no-op for those operators
only (classification backbones need none of them).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import linecache
import sys
import types
from pathlib import Path

import pytest
import torch

# The import lines of torchvision's feature_extraction.py that name torch.fx, and what they
# become. A line not found means torchvision changed: the loader says so instead of running
# their code against torch.fx unnoticed.
IMPORT_REWRITES = {
    "from torch import fx, nn": "import fxloom as fx\nfrom torch import nn",
    "from torch.fx.graph_module import": "from fxloom.graph_module import",
}


def _op_exists(qualname: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(qualname, "")
    except RuntimeError:
        return False
    return True


def _skip_missing_torchvision_ops(register_fake):
    @functools.wraps(register_fake)
    def register_fake_if_op_exists(op, *args, **kwargs):
        if isinstance(op, str) and op.startswith("torchvision::") and not _op_exists(op):
            if args:  # register_fake(op, fn): nothing to register, give fn back
                return args[0]
            return lambda fn: fn  # @register_fake(op) used as a decorator
        return register_fake(op, *args, **kwargs)

    return register_fake_if_op_exists


# Where `make setup` installs torchvision, timm and pillow: beside the venv, off its path, so
# that transformers (which imports torchvision whenever it finds it) never meets this
# torchvision outside these tests. pyproject.toml's `compat` extra says why.
COMPAT_PACKAGES = Path(sys.prefix) / "compat-packages"


def compat_packages_off_path() -> None:
    """Takes the compat packages off the path again: processes a later test spawns inherit
    ``sys.path``, and transformers there would find this torchvision and fail to import it."""
    while str(COMPAT_PACKAGES) in sys.path:
        sys.path.remove(str(COMPAT_PACKAGES))


def _compat_packages_on_path() -> None:
    """Puts the compat packages last on the path (they never shadow the venv's own)."""
    if COMPAT_PACKAGES.is_dir() and str(COMPAT_PACKAGES) not in sys.path:
        sys.path.append(str(COMPAT_PACKAGES))
        importlib.invalidate_caches()


def import_torchvision() -> types.ModuleType:
    """torchvision, imported beside this torch (skips the test where it is not installed)."""
    _compat_packages_on_path()  # for this test only: tests/compat/conftest.py takes it off after
    if "torchvision" not in sys.modules:
        if importlib.util.find_spec("torchvision") is None:
            pytest.skip(f"torchvision is not installed (make setup puts it in {COMPAT_PACKAGES})")
        original = torch.library.register_fake
        torch.library.register_fake = _skip_missing_torchvision_ops(original)
        try:
            import torchvision  # noqa: F401
        finally:
            torch.library.register_fake = original
    return sys.modules["torchvision"]


def import_timm() -> types.ModuleType:
    import_torchvision()
    return pytest.importorskip("timm")


@functools.cache
def fxloom_feature_extraction() -> types.ModuleType:
    """torchvision.models.feature_extraction with torch.fx replaced by fxloom."""
    import_torchvision()
    from torchvision.models import feature_extraction

    source = inspect.getsource(feature_extraction)
    for line, replacement in IMPORT_REWRITES.items():
        if line not in source:
            raise AssertionError(f"torchvision's feature_extraction.py has no line {line!r}")
        source = source.replace(line, replacement)
    module = types.ModuleType("fxloom_feature_extraction")
    module.__file__ = feature_extraction.__file__
    # Importable by name, so pickle finds its classes (DualGraphModule) as it finds torchvision's.
    sys.modules[module.__name__] = module
    filename = f"<fxloom rewrite of {feature_extraction.__file__}>"
    # Its source where inspect looks: torch.jit.script(extractor) reads the source of
    # DualGraphModule.__init__ (torchvision's test_jit_forward_backward scripts one).
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def timm_on_fxloom(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """timm, whose FX feature path calls the rewritten torchvision functions (for one test)."""
    timm = import_timm()
    from timm.layers import _fx

    ours = fxloom_feature_extraction()
    monkeypatch.setattr(_fx, "_create_feature_extractor", ours.create_feature_extractor)
    monkeypatch.setattr(_fx, "_get_graph_node_names", ours.get_graph_node_names)
    return timm
