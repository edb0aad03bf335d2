"""The child process of the red-team suite: loads hostile files and calls them, with recorders.

Run as ``python red_team_runner.py MANIFEST RESULTS`` with the temporary directory holding the
files as the working directory. It imports torch and fxloom, warms up on a file of its own
(so lazy imports happen before anything is watched), then installs recorders over every
dangerous entry point (process execution, unpickling, ``torch.load``, shared-library loading,
imports outside torch/fxloom/numpy/sympy/onnx, opens outside the temporary directory and
Python's own files, process-wide torch settings, fxloom's pytree registry). For each file it
writes one ``{"start": id}`` line, then one ``{"verdict": {...}}`` line to RESULTS, so the
parent can name the file that killed the process. Each file gets its own limits: 1 GiB of
address space above what the warm interpreter holds, and 10 s of CPU (the parent adds the
wall-clock timeout). Then what a reviewer reads of the file is checked (``review_case``): the
loader's error message, and, for ``fxloom.load``/``fxloom.export.load`` files, ``fxloom show
FILE`` (and with ``--code``, in this process, watched and limited the same way). The verdict
says whether show crashed, what it recorded, and any character a terminal would act on that
the message or show's output held.
"""

import builtins
import contextlib
import io
import json
import os
import sys
import time
import unicodedata

MANIFEST, RESULTS = sys.argv[1], sys.argv[2]
_real_open = builtins.open
out = _real_open(RESULTS, "a", buffering=1)

import ctypes  # noqa: E402
import importlib  # noqa: E402
import pickle  # noqa: E402
import subprocess  # noqa: E402

import child_limits  # noqa: E402
import numpy  # noqa: E402, F401
import sympy  # noqa: E402, F401
import torch  # noqa: E402

# torch's meta kernels import torch._dynamo lazily on first use; fxloom's common operators no
# longer reach them (values/known_meta.py), so the first such use could fall inside a watched
# file's run, where the runner's guards break the import itself
import torch._dynamo  # noqa: E402, F401
from child_limits import lift_limits  # noqa: E402
from torch import nn  # noqa: E402

import fxloom  # noqa: E402
import fxloom.export  # noqa: E402
import fxloom.pytree  # noqa: E402
from fxloom.serialize import SerializationError  # noqa: E402
from fxloom.serialize.graph_text import GraphParseError  # noqa: E402

MEMORY_PER_FILE = 2**30
CPU_SECONDS_PER_FILE = 10
TMP = os.path.realpath(os.getcwd())


def warm_up() -> None:
    """Load and run one file of each kind, unwatched: torch's and fxloom's lazy imports."""
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    buffer = io.BytesIO()
    fxloom.save(fxloom.symbolic_trace(model), buffer)
    fxloom.load(buffer.getvalue())(torch.randn(2, 3))
    buffer = io.BytesIO()
    fxloom.export.save(fxloom.export.export(model, (torch.randn(2, 3),)), buffer)
    fxloom.export.load(buffer.getvalue()).module()(torch.randn(2, 3))
    g = fxloom.parse_graph("graph():\n    %x : [num_users=1] = placeholder[target=x]\n    return x")
    fxloom.GraphModule(nn.Module(), g)(torch.randn(1))


# ------------------------------------------------------------------ recorders
CALLS: list[str] = []
ACTIVE = False


def _short(value) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _record(what: str, args=(), kwargs=None) -> None:
    parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in (kwargs or {}).items()]
    CALLS.append(f"{what}({', '.join(parts)})")


def _patch(owner, attr: str, label: str, call_through: bool = False) -> None:
    """Replace ``owner.attr`` by a recorder that keeps its name (so name checks see the same
    ``torch.manual_seed``); while watching it records, then blocks (or calls through)."""
    real = getattr(owner, attr, None)
    if real is None:
        return

    def recorder(*args, **kwargs):
        if ACTIVE:
            _record(label, args, kwargs)
            if not call_through:
                raise PermissionError(f"red-team harness blocked {label}")
        return real(*args, **kwargs)

    for name in ("__name__", "__qualname__", "__module__", "__doc__"):
        try:
            setattr(recorder, name, getattr(real, name))
        except (AttributeError, TypeError):
            pass
    setattr(owner, attr, recorder)


_ALLOWED_TOPS = {
    "torch", "fxloom", "numpy", "sympy", "mpmath", "onnx", "onnxruntime", "google",
    "typing_extensions", "safetensors",
    "encodings",  # Python's own codec lookup, when protobuf decodes a string
    "ml_dtypes",  # onnx's own dependency, imported by onnx when it reads a model
}  # fmt: skip


def _watch_imports() -> None:
    real_import, real_import_module = builtins.__import__, importlib.import_module

    def allowed(name: str, level: int) -> bool:
        return level > 0 or name in sys.modules or name.partition(".")[0] in _ALLOWED_TOPS

    def stdlib_for_a_library(name: str, importer: dict | None) -> bool:
        # A library loading needs may import a standard-library module the first time it
        # decodes something (protobuf's pure-Python well_known_types imports `calendar` on
        # Python 3.13); the file chose neither the library nor the module.
        top = (importer or {}).get("__name__", "").partition(".")[0]
        return name.partition(".")[0] in sys.stdlib_module_names and top in _ALLOWED_TOPS

    def watched_import(name, globals=None, locals=None, fromlist=(), level=0):
        if ACTIVE and not allowed(name, level) and not stdlib_for_a_library(name, globals):
            _record("builtins.__import__", (name,))
            raise ImportError(f"red-team harness blocked the import of {name}")
        return real_import(name, globals, locals, fromlist, level)

    def watched_import_module(name, package=None):
        if ACTIVE and not allowed(name, 1 if name.startswith(".") else 0):
            _record("importlib.import_module", (name,))
            raise ImportError(f"red-team harness blocked the import of {name}")
        return real_import_module(name, package)

    builtins.__import__ = watched_import
    importlib.import_module = watched_import_module


def _read_roots() -> tuple[str, ...]:
    import site
    import sysconfig

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(fxloom.__file__)}
    roots.update(site.getsitepackages())
    roots.update(p for p in sysconfig.get_paths().values())
    roots.update({"/proc/self", "/sys/devices/system/cpu", "/sys/fs/cgroup", "/dev/null"})
    # Installed packages' metadata (``fxloom --version`` reads it; an editable install of a
    # checkout keeps fxloom's beside the package, in fxloom.egg-info).
    for entry in sys.path:
        if os.path.isdir(entry):
            roots.update(
                os.path.join(entry, name)
                for name in os.listdir(entry)
                if name.endswith((".egg-info", ".dist-info"))
            )
    return tuple(os.path.realpath(r) for r in roots if r)


def _watch_opens() -> None:
    roots = _read_roots()
    real_os_open = os.open

    def under(path: str, root: str) -> bool:
        return path == root or path.startswith(root.rstrip("/") + "/")

    def allowed(path, writing: bool) -> bool:
        if isinstance(path, int):
            return True
        try:
            real = os.path.realpath(os.fsdecode(path))
        except Exception:
            return False
        if under(real, TMP):
            return True
        return not writing and any(under(real, r) for r in roots)

    def watched_open(file, mode="r", *args, **kwargs):
        writing = any(c in str(mode) for c in "wax+")
        if ACTIVE and not allowed(file, writing):
            _record("open", (file, mode))
            raise PermissionError(f"red-team harness blocked open({file!r}, {mode!r})")
        return _real_open(file, mode, *args, **kwargs)

    def watched_os_open(path, flags, *args, **kwargs):
        writing = bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))
        if ACTIVE and not allowed(path, writing):
            _record("os.open", (path, flags))
            raise PermissionError(f"red-team harness blocked os.open({path!r})")
        return real_os_open(path, flags, *args, **kwargs)

    builtins.open = watched_open
    io.open = watched_open
    os.open = watched_os_open


def install_recorders() -> None:
    import posix

    for name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp") + tuple(
        n for n in dir(os) if n.startswith(("exec", "spawn"))
    ):
        _patch(os, name, f"os.{name}")
    _patch(posix, "system", "posix.system")
    _patch(subprocess, "Popen", "subprocess.Popen")
    for name in ("loads", "load", "Unpickler"):
        _patch(pickle, name, f"pickle.{name}")
    _patch(torch, "load", "torch.load")
    _patch(torch.serialization, "load", "torch.serialization.load")
    _patch(torch.ops, "load_library", "torch.ops.load_library")
    for name in ("CDLL", "PyDLL", "LoadLibrary"):
        _patch(ctypes, name, f"ctypes.{name}")
    for loader in ("cdll", "pydll"):
        _patch(getattr(ctypes, loader), "LoadLibrary", f"ctypes.{loader}.LoadLibrary")
    for name in ("_import_dotted_name", "_load_global_deps", "set_default_tensor_type"):
        _patch(torch, name, f"torch.{name}")
    # Process-wide settings: recorded, then applied (harmless in this throwaway process).
    for name in ("manual_seed", "set_default_dtype", "set_num_threads", "set_grad_enabled"):
        _patch(torch, name, f"torch.{name}", call_through=True)
    _patch(fxloom.pytree, "register_pytree_node", "fxloom.pytree.register_pytree_node")
    _watch_imports()
    _watch_opens()


# --------------------------------------------------------------------- limits
def set_limits() -> None:
    child_limits.set_limits(CPU_SECONDS_PER_FILE, MEMORY_PER_FILE)


# ---------------------------------------------------------------------- cases
def make_inputs(specs: list) -> list:
    generator = torch.Generator().manual_seed(0)
    inputs = []
    for spec in specs:
        if "randn" in spec:
            inputs.append(torch.randn(spec["randn"], generator=generator))
        elif "long" in spec:
            inputs.append(torch.tensor(spec["long"], dtype=torch.long))
        elif "value" in spec:
            inputs.append(spec["value"])
        else:
            raise ValueError(f"unknown input spec {spec}")
    return inputs


def _snapshot() -> dict[str, tuple[int, int]]:
    found = {}
    for root, _, files in os.walk(TMP):
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            found[os.path.relpath(path, TMP)] = (st.st_size, st.st_mtime_ns)
    return found


def _summary(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {value.dtype} {list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def run_case(case: dict) -> dict:
    global ACTIVE
    inputs = make_inputs(case["inputs"])
    before = _snapshot()
    CALLS.clear()
    verdict = {"id": case["id"], "stage": "load"}
    started, cpu_started = time.perf_counter(), time.process_time()
    if case.get("engine"):  # the quantized engine that packs the file's int8 weights
        torch.backends.quantized.engine = case["engine"]
    set_limits()
    ACTIVE = True
    try:
        if case["kind"] == "graph_module":
            module = fxloom.load(case["file"])
        elif case["kind"] == "exported":
            module = fxloom.export.load(case["file"]).module()
        else:
            with _real_open(case["file"], encoding="utf-8") as f:
                text = f.read()
            module = fxloom.GraphModule(nn.Module(), fxloom.parse_graph(text))
        verdict["stage"] = "call"
        verdict["recorded_while_loading"] = list(CALLS)
        result = module(*inputs)
        verdict.update(outcome="loaded_and_ran", result=_summary(result))
    except BaseException as e:  # noqa: BLE001  (a hostile file may raise anything, even SystemExit)
        ACTIVE = False
        lift_limits()
        refusal = GraphParseError if case["kind"] == "text" else SerializationError
        refused = verdict["stage"] == "load" and isinstance(e, refusal)
        verdict.update(
            outcome="refused" if refused else "raised",
            error_type=f"{type(e).__module__}.{type(e).__qualname__}",
            serialization_error=isinstance(e, SerializationError),
            message=str(e)[:600],
        )
    finally:
        ACTIVE = False
        lift_limits()
    verdict["seconds"] = round(time.perf_counter() - started, 3)
    verdict["cpu_seconds"] = round(time.process_time() - cpu_started, 3)
    verdict.setdefault("recorded_while_loading", list(CALLS))
    verdict["recorded"] = list(CALLS)
    after = _snapshot()
    changed = sorted(p for p in after if before.get(p) != after[p] and p != case["file"])
    changed += sorted(f"{p} (removed)" for p in before if p not in after)
    verdict["files_changed"] = [p for p in changed if not p.startswith(("results", "child."))]
    return verdict


ENGINE = torch.backends.quantized.engine


def reset_state() -> None:
    """Undo what a file may have changed process-wide, so the next file is judged alone."""
    torch.backends.quantized.engine = ENGINE
    torch.set_default_dtype(torch.float32)
    torch.set_default_device(None)
    torch.set_grad_enabled(True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(False)
    torch.set_anomaly_enabled(False)
    torch.set_flush_denormal(False)
    torch.set_float32_matmul_precision("highest")
    torch.set_printoptions(profile="default")


# ----------------------------------------------------------------------- show
SHOWN_KINDS = ("graph_module", "exported")  # the kinds `fxloom show` reads (not graph text)
SHOW_OPTIONS = ([], ["--code"])
SHOW_EXITS = (0, 2)  # described, or "not an fxloom file" with the loader's message
# Characters a terminal may act on: controls (C0 and C1, ESC among them), format characters
# (bidi overrides and isolates), line and paragraph separators, and lone surrogates (which a
# UTF-8 terminal cannot even be sent). Only show's own newlines and tabs may be printed.
FORBIDDEN_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Cs"}


def _show(file: str, options: list) -> tuple[int, str]:
    """``fxloom show FILE OPTIONS`` in this process: its exit code and everything it printed."""
    from fxloom.cli import build_parser

    args = build_parser().parse_args(["show", file, *options])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = args.run(args)
    return code, printed.getvalue()


def warm_up_show() -> None:
    """Show a file of each kind, unwatched: rich's and pygments' lazy imports. Colour stays off
    (rich writes its own escape sequences where asked to)."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        os.environ.pop(name, None)
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    fxloom.save(fxloom.symbolic_trace(model), "warm_up.fxl")
    fxloom.export.save(fxloom.export.export(model, (torch.randn(2, 3),)), "warm_up_export.fxl")
    for file in ("warm_up.fxl", "warm_up_export.fxl"):
        for options in SHOW_OPTIONS:
            _show(file, options)


def forbidden_characters(text: str) -> list[str]:
    """The lines of ``text`` holding a character of ``FORBIDDEN_CATEGORIES`` (tab aside)."""
    found = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.isprintable():
            continue
        bad = {c for c in line if c != "\t" and unicodedata.category(c) in FORBIDDEN_CATEGORIES}
        if bad:
            found.append(
                f"line {number}: {', '.join(sorted(map(ascii, bad)))} in {ascii(line)[:160]}"
            )
    return found


def review_case(case: dict, message: str) -> dict:
    """What a reviewer reads of the case's file: ``message_printed`` (forbidden characters in
    the loader's error ``message``) and, for the kinds show reads, ``show_case``'s fields."""
    review = {"message_printed": forbidden_characters(message)}
    if case["kind"] in SHOWN_KINDS:
        review.update(show_case(case))
    return review


def show_case(case: dict) -> dict:
    """Show the case's file as a user would review it: ``shown`` (each run and its exit code),
    ``show_crashed`` (an exception, or an exit code show does not give), ``show_printed``
    (forbidden characters in its output), ``recorded_while_showing``."""
    global ACTIVE
    verdict = {"shown": [], "show_crashed": [], "show_printed": [], "recorded_while_showing": []}
    for options in SHOW_OPTIONS:
        command = " ".join(["show", *options])
        CALLS.clear()
        set_limits()
        ACTIVE = True
        try:
            code, printed = _show(case["file"], options)
        except BaseException as e:  # noqa: BLE001  (show must survive any file)
            code, printed = None, ""
            verdict["show_crashed"].append(f"{command}: {type(e).__name__}: {str(e)[:300]}")
        finally:
            ACTIVE = False
            lift_limits()
        verdict["recorded_while_showing"] += CALLS
        verdict["shown"].append(f"{command}: exit {code}")
        if code is not None and code not in SHOW_EXITS:
            verdict["show_crashed"].append(f"{command}: exit code {code}")
        verdict["show_printed"] += [
            f"{command}, {found}" for found in forbidden_characters(printed)
        ]
    CALLS.clear()
    return verdict


def main() -> None:
    with _real_open(MANIFEST) as f:
        manifest = json.load(f)
    warm_up()
    warm_up_show()
    install_recorders()
    for case in manifest["cases"]:
        out.write(json.dumps({"start": case["id"]}) + "\n")
        verdict = run_case(case)
        reset_state()
        verdict.update(review_case(case, verdict.get("message", "")))
        reset_state()
        out.write(json.dumps({"verdict": verdict}) + "\n")
    out.write(json.dumps({"done": True}) + "\n")


main()
