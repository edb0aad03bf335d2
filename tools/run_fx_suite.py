"""Runs PyTorch's own FX suite (test/test_fx.py) with torch.fx replaced by fxloom.

PyTorch's test file is not part of this repository: fetch test/test_fx.py (and test/fx/named_tup.py,
which it imports) from the PyTorch tag matching the installed torch into a folder, and pass that
folder (or the file) to this tool:

    python tools/run_fx_suite.py /path/to/cache --out fx_suite.json
    python tools/run_fx_suite.py --compare before.json after.json

How torch.fx is replaced, without editing their file: the test module runs with its own
``__import__``, so every import statement in it (top-level or inside a test) that names
``torch.fx`` gets fxloom's module of the same path instead (``from torch.fx import Graph`` ->
``fxloom.Graph``, ``torch.fx.passes.shape_prop`` -> ``fxloom.passes.shape_prop``), and ``import
torch`` gets a view of torch whose ``fx`` attribute is that same fxloom view; the rest of torch is
the real one. A name fxloom does not have reads as a placeholder that raises when called, so only the
tests that use it fail. PATH_ALIASES lists the torch.fx modules whose fxloom counterpart has another
path. The module's top-level statements run one by one, so one failing import (a helper suite under
test/fx/ not fetched, a torch.fx-only name used at import time) costs the tests that need it, not
the whole file.

Other torch.fx suites run the same way: a file with no unittest.TestCase of its own runs under
pytest (torchvision's test/test_backbone_utils.py: parameters, pytest.raises), and with
--torchvision its ``from torchvision.models.feature_extraction import ...`` gets the rewrite of
that module against fxloom that tests/compat uses (CLIENT_REWRITES). ``--against torch.fx`` runs
a file unchanged, for the numbers fxloom's run is compared with:

    python tools/run_fx_suite.py DIR/test_backbone_utils.py --torchvision [--against torch.fx]

The summary counts passed / failed / errors / skipped and lists every test by outcome, with each
failure's message and each test's seconds.
``--compare`` prints the tests that passed in the first summary and not in the second, and the
reverse. This is a tool, not a test: it needs their file, which the repository does not hold.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import datetime
import fnmatch
import importlib
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
import types
import unittest
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# torch.fx modules whose fxloom counterpart lives at another path. Any other torch.fx.X is looked
# for as fxloom.X.
PATH_ALIASES = {
    "torch.fx": "fxloom",
    "torch.fx._pytree": "fxloom.pytree",
    "torch.fx._symbolic_trace": "fxloom.tracer",
}

# torch.fx modules that stay torch's own: the suite's configuration (a decorator on the CUDA
# profiler tests patches it), not API under test.
KEPT_TORCH_FX = {"torch.fx.experimental._config"}


class MissingName:
    """A torch.fx name fxloom lacks: harmless to store into, raises when used."""

    def __init__(self, path: str):
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return MissingName(f"{self._path}.{name}")

    def __setattr__(self, name, value):
        pass  # setUp's `torch.fx.proxy.TracerBase.check_mutable_operations = True`

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"fxloom has no counterpart of {self._path}")

    def __iter__(self):
        raise NotImplementedError(f"fxloom has no counterpart of {self._path}")

    def __repr__(self):
        return f"<missing in fxloom: {self._path}>"


def _fxloom_module(fx_path: str):
    target = PATH_ALIASES.get(fx_path, "fxloom" + fx_path[len("torch.fx") :])
    try:
        return importlib.import_module(target)
    except ImportError:
        return None


def _torch_has_module(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError):
        return False


class FxView(types.ModuleType):
    """torch.fx (or one of its modules) as fxloom provides it."""

    def __init__(self, path: str):
        super().__init__(path)
        self._fxloom = _fxloom_module(path)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        sub = f"{self.__name__}.{name}"
        if self._fxloom is not None and hasattr(self._fxloom, name):
            value = getattr(self._fxloom, name)
            if isinstance(value, types.ModuleType):
                value = view_of(sub)
            setattr(self, name, value)
            return value
        if _fxloom_module(sub) is not None or _torch_has_module(sub):
            value = view_of(sub)
            setattr(self, name, value)
            return value
        return MissingName(sub)


_VIEWS: dict[str, FxView] = {}


def view_of(path: str):
    if path in KEPT_TORCH_FX:
        return importlib.import_module(path)
    if path not in _VIEWS:
        _VIEWS[path] = FxView(path)
    return _VIEWS[path]


class TorchView(types.ModuleType):
    """The real torch, except that its ``fx`` is fxloom's view."""

    def __init__(self, torch):
        super().__init__("torch")
        self._torch = torch
        self.fx = view_of("torch.fx")

    def __getattr__(self, name):
        return getattr(self._torch, name)


def make_import(torch_view, replaced=None):
    """The suite's ``__import__``: torch.fx names fxloom; a module in ``replaced`` (a torch.fx
    client rewritten against fxloom) is that rewrite in ``from X import ...``, made by the
    function ``replaced`` holds when first imported (an older fxloom may lack what the rewrite
    needs: then that import statement fails, not every suite run with --torchvision)."""
    real_import = builtins.__import__
    replaced = replaced or {}

    def fx_import(name, globals=None, locals=None, fromlist=(), level=0):
        if name in KEPT_TORCH_FX:
            return real_import(name, globals, locals, fromlist, level)
        if level == 0 and fromlist and name in replaced:
            return replaced[name]()
        if level == 0 and (name == "torch.fx" or name.startswith("torch.fx.")):
            if fromlist:
                return view_of(name)
            return torch_view
        module = real_import(name, globals, locals, fromlist, level)
        if level == 0 and name.split(".")[0] == "torch" and not fromlist:
            return torch_view  # `import torch` and `import torch.x.y as z`
        return module

    return fx_import


def _expecttest_stand_in() -> None:
    """torch.testing._internal imports expecttest (PyTorch's CI installs it; torch's wheel does
    not require it). Where it is absent, a stand-in with its one class: only the CUDA profiler
    tests call assertExpectedInline, and they compare the text exactly."""
    if importlib.util.find_spec("expecttest") is not None:
        return
    stand_in = types.ModuleType("expecttest")

    class TestCase(unittest.TestCase):
        def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 - their name
            self.assertEqual(actual, expect)

    stand_in.TestCase = TestCase
    sys.modules["expecttest"] = stand_in


# torch.fx's clients that a suite imports, rewritten against fxloom by tests/compat/clients.py
# (with --torchvision): module -> the function of clients.py that returns the rewrite. A suite
# testing torchvision's feature extraction (test_backbone_utils.py) then tests it on fxloom.
CLIENT_REWRITES = {"torchvision.models.feature_extraction": "fxloom_feature_extraction"}

# What the suite's torch.fx is: fxloom (the point of the tool), or torch.fx itself, to run the
# same file the same way for the numbers to compare with.
AGAINST = ("fxloom", "torch.fx")


def _compat_clients() -> types.ModuleType:
    path = REPO / "tests" / "compat" / "clients.py"
    spec = importlib.util.spec_from_file_location("_fx_suite_compat_clients", path)
    clients = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(clients)
    return clients


def _import_torchvision() -> dict[str, Callable[[], types.ModuleType]]:
    """torchvision beside this torch, as tests/compat does it (its compiled operators do not load
    against the CPU build), so that the suite's torchvision tests run instead of skipping; returns
    what makes the rewrites of its torch.fx clients (CLIENT_REWRITES)."""
    clients = _compat_clients()
    clients.import_torchvision()
    return {name: getattr(clients, rewrite) for name, rewrite in CLIENT_REWRITES.items()}


def load_suite(
    test_file: Path, torchvision: bool = False, against: str = "fxloom"
) -> tuple[types.ModuleType, list[str]]:
    """Their test module, run statement by statement against fxloom (or, with ``against``
    "torch.fx", as it is); returns the module and the top-level statements that failed (with
    why)."""
    import torch

    _expecttest_stand_in()
    rewrites = _import_torchvision() if torchvision else {}
    folder = str(test_file.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # `from fx.named_tup import ...`, `from common_utils import`
    module = types.ModuleType(test_file.stem)
    module.__file__ = str(test_file)
    sys.modules[module.__name__] = module  # pickle finds its module-level classes
    if against == "fxloom":
        module_builtins = dict(builtins.__dict__)
        module_builtins["__import__"] = make_import(TorchView(torch), rewrites)
        module.__dict__["__builtins__"] = module_builtins
    tree = ast.parse(test_file.read_text(), str(test_file))
    failures = []
    for statement in tree.body:
        code = compile(ast.Module([statement], []), str(test_file), "exec")
        try:
            exec(code, module.__dict__)
        except Exception as e:  # noqa: BLE001 - recorded, the rest still runs
            failures.append(f"line {statement.lineno}: {type(e).__name__}: {e}")
    # PyTorch's CI builds libtorchbind_test.so; the wheel has none. Their own switch for
    # platforms without it makes the tests that need it skip instead of every TestFX setUp
    # failing.
    locate = module.__dict__.get("find_library_location")
    if locate is not None and not locate("libtorchbind_test.so").exists():
        module.__dict__["IS_FBCODE"] = True
    return module, failures


class Timeout(BaseException):
    """A test ran past --timeout. A BaseException, as KeyboardInterrupt is: code under test that
    catches Exception (TorchScript's compiler does, to record an attribute it could not compile)
    would otherwise absorb it, or turn it into an error of its own, and the test would go on."""


class Recorder(unittest.TestResult):
    def __init__(self, timeout_s: int, verbose: bool, module_name: str = "test_fx"):
        super().__init__()
        self.prefix = module_name + "."
        self.timeout_s = timeout_s
        self.verbose = verbose
        self.outcomes: dict[str, tuple[str, str]] = {}
        self.seconds: dict[str, float] = {}  # per test: what a batch spends where
        self._started = 0.0

    def _on_alarm(self, signum, frame):
        raise Timeout(f"over {self.timeout_s} s")

    def startTest(self, test):
        super().startTest(test)
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.alarm(self.timeout_s)
        self._started = time.perf_counter()

    def stopTest(self, test):
        signal.alarm(0)
        super().stopTest(test)

    def _record(self, test, outcome, detail=""):
        name = test.id().removeprefix(self.prefix)
        self.outcomes[name] = (outcome, detail)
        self.seconds[name] = round(time.perf_counter() - self._started, 1)
        if self.verbose:
            print(f"{outcome:8} {name}", flush=True)

    def addSuccess(self, test):
        self._record(test, "passed")

    def addFailure(self, test, err):
        self._record(test, "failed", _message(err))

    def addError(self, test, err):
        self._record(test, "error", _message(err))

    def addSkip(self, test, reason):
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        self._record(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test):
        self._record(test, "failed", "unexpected success")


def _message(err) -> str:
    """The exception's type and its message, cut at MESSAGE_CHARS: TorchScript puts the
    culprit's source location on the lines after the first, so the first line alone
    ("builtin cannot be used as a value:") does not say where."""
    text = f"{err[0].__name__}: {str(err[1]).strip()}"
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " ..."


MESSAGE_CHARS = 2000


def _test_cases(module: types.ModuleType) -> list[type]:
    return [
        value
        for value in list(module.__dict__.values())
        if isinstance(value, type)
        and issubclass(value, unittest.TestCase)
        and value.__module__ == module.__name__
    ]


def _name_patterns(patterns: list[str] | None) -> list[str] | None:
    return [p if "*" in p else f"*{p}*" for p in patterns] if patterns else None


def _run_unittest(module, test_file, patterns, timeout_s, verbose) -> Recorder:
    loader = unittest.TestLoader()
    loader.testNamePatterns = _name_patterns(patterns)
    suite = unittest.TestSuite()
    for case in _test_cases(module):
        suite.addTests(loader.loadTestsFromTestCase(case))
    result = Recorder(timeout_s, verbose, module.__name__)
    # Ctrl-C (SIGINT) ends the run after the test under way; the summary still gets written,
    # marked interrupted, with the tests that ran.
    signal.signal(signal.SIGINT, lambda signum, frame: result.stop())
    suite.run(result)
    return result


class PytestRecorder:
    """A pytest plugin that collects the already-loaded module (its imports answered as for a
    unittest suite) and records outcomes as ``Recorder`` does: an AssertionError fails a test,
    any other exception is an error, as under unittest."""

    def __init__(self, module, test_file: Path, patterns, timeout_s: int, verbose: bool):
        self.module, self.test_file = module, test_file
        self.patterns = _name_patterns(patterns)
        self.timeout_s, self.verbose = timeout_s, verbose
        self.outcomes: dict[str, tuple[str, str]] = {}
        self.seconds: dict[str, float] = {}
        self.shouldStop = False

    def _name(self, nodeid: str) -> str:
        return nodeid.split("::", 1)[-1].replace("::", ".")

    def _selected(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.patterns)

    def pytest_pycollect_makemodule(self, module_path, parent):
        import pytest

        if Path(module_path) != self.test_file:
            return None
        loaded = self.module

        class LoadedModule(pytest.Module):
            def _getobj(self):
                return loaded  # not imported again: its imports were answered already

        return LoadedModule.from_parent(parent, path=Path(module_path))

    def pytest_collection_modifyitems(self, session, config, items):
        if self.patterns:
            keep = [i for i in items if self._selected(self._name(i.nodeid))]
            config.hook.pytest_deselected(items=[i for i in items if i not in keep])
            items[:] = keep

    def pytest_runtest_logstart(self, nodeid, location):
        def on_alarm(signum, frame):
            raise Timeout(f"over {self.timeout_s} s")

        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(self.timeout_s)
        self._started = time.perf_counter()

    def pytest_runtest_logfinish(self, nodeid, location):
        signal.alarm(0)
        name = self._name(nodeid)
        self.seconds[name] = round(time.perf_counter() - self._started, 1)
        if self.verbose and name in self.outcomes:
            print(f"{self.outcomes[name][0]:8} {name}", flush=True)

    def pytest_runtest_makereport(self, item, call):
        import pytest

        name = self._name(item.nodeid)
        excinfo = call.excinfo
        if excinfo is None:
            if call.when == "call":
                self.outcomes[name] = ("passed", "")
            return
        err = (excinfo.type, excinfo.value, excinfo.tb)
        if excinfo.errisinstance(pytest.skip.Exception):
            self.outcomes[name] = ("skipped", str(excinfo.value))
        elif call.when == "call" and excinfo.errisinstance(AssertionError):
            self.outcomes[name] = ("failed", _message(err))
        elif name not in self.outcomes or self.outcomes[name][0] == "passed":
            self.outcomes[name] = ("error", _message(err))  # setup, teardown or not an assert


def _run_pytest(module, test_file, patterns, timeout_s, verbose) -> PytestRecorder:
    """A suite written for pytest (parametrize, pytest.raises; no unittest.TestCase)."""
    import pytest

    recorder = PytestRecorder(module, test_file, patterns, timeout_s, verbose)
    args = [str(test_file), "-q", "-p", "no:cacheprovider", "-p", "no:warnings"]
    args += ["--rootdir", str(test_file.parent)]
    pytest.main(args, plugins=[recorder])
    return recorder


def run(
    test_file: Path,
    patterns: list[str] | None,
    timeout_s: int,
    verbose: bool,
    torchvision: bool,
    against: str = "fxloom",
) -> dict:
    module, load_failures = load_suite(test_file, torchvision, against)
    started = time.perf_counter()
    # unittest's suites (test_fx.py) run under unittest; one with no TestCase of its own is
    # written for pytest (torchvision's test_backbone_utils.py).
    runner = _run_unittest if _test_cases(module) else _run_pytest
    result = runner(module, test_file, patterns, timeout_s, verbose)
    by_outcome: dict[str, list[str]] = {"passed": [], "failed": [], "error": [], "skipped": []}
    for name, (outcome, _) in sorted(result.outcomes.items()):
        by_outcome[outcome].append(name)
    fxloom_dir = Path(importlib.import_module("fxloom").__file__).parent
    return {
        "test_file": str(test_file),
        "against": against,
        "fxloom": str(fxloom_dir),
        "fxloom_commit": _commit_of(fxloom_dir) if against == "fxloom" else against,
        "torch": __import__("torch").__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - started, 1),
        "interrupted": result.shouldStop,
        "counts": {k: len(v) for k, v in by_outcome.items()},
        "module_statements_failed": load_failures,
        "tests": by_outcome,
        "details": {name: detail for name, (_, detail) in result.outcomes.items() if detail},
        "seconds_by_test": dict(sorted(result.seconds.items())),
    }


def _commit_of(folder: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def compare(before_path: Path, after_path: Path) -> int:
    before = json.loads(before_path.read_text())
    after = json.loads(after_path.read_text())
    passed_before = set(before["tests"]["passed"])
    passed_after = set(after["tests"]["passed"])
    outcome_after = {n: o for o, names in after["tests"].items() for n in names}
    print(f"before: {before['fxloom_commit']} {before['counts']}")
    print(f"after:  {after['fxloom_commit']} {after['counts']}")
    lost = sorted(passed_before - passed_after)
    gained = sorted(passed_after - passed_before)
    print(f"passed before, not after ({len(lost)}):")
    for name in lost:
        detail = after["details"].get(name, "").splitlines()[:1]  # the whole text is in the file
        detail = detail[0] if detail else ""
        print(f"  {name}: {outcome_after.get(name, 'absent')} {detail}")
    print(f"passed after, not before ({len(gained)}):")
    for name in gained:
        print(f"  {name}")
    return 1 if lost else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "suite", nargs="?", help="test_fx.py, or the folder holding it, or another torch.fx suite"
    )
    parser.add_argument("--out", help="where to write the JSON summary")
    parser.add_argument(
        "--fxloom-root", help="run against the fxloom package under this checkout (default: ours)"
    )
    parser.add_argument(
        "-k",
        dest="patterns",
        action="append",
        help="only tests whose name matches (unittest -k; repeatable)",
    )
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument(
        "--torchvision",
        action="store_true",
        help="import torchvision from .venv/compat-packages (make setup) so its tests run",
    )
    parser.add_argument(
        "--against",
        choices=AGAINST,
        default="fxloom",
        help="torch.fx: run the file as it is (the numbers fxloom's run compares with)",
    )
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")  # their hint, once per failure
    if args.compare:
        return compare(Path(args.compare[0]), Path(args.compare[1]))
    if not args.suite:
        parser.error("give the path of test_fx.py (or its folder), or --compare")
    test_file = Path(args.suite)
    if test_file.is_dir():
        test_file = test_file / "test_fx.py"
    if not test_file.is_file():
        parser.error(f"{test_file} not found: fetch PyTorch's test/test_fx.py there first")
    test_file = test_file.resolve()
    out = Path(args.out).resolve() if args.out else None
    root = Path(args.fxloom_root).resolve() if args.fxloom_root else REPO
    sys.path.insert(0, str(root))
    os.chdir(test_file.parent)  # the suite writes and reads files beside itself
    summary = run(
        test_file, args.patterns, args.timeout, args.verbose, args.torchvision, args.against
    )
    print(json.dumps({k: summary[k] for k in ("fxloom_commit", "counts", "seconds")}))
    for failure in summary["module_statements_failed"]:
        print(f"top-level statement failed: {failure}")
    if out:
        out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
