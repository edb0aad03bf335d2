"""The child process of the generative red team: mutates valid files and judges each mutant.

Run as ``python generative_driver.py FOLDER RESULTS --examples N --seed S [--skip K]
[--crash-at C]``, with ``FOLDER`` a temporary directory (the working directory too). It builds
the corpus into ``FOLDER/corpus`` or ``--corpus`` (``generative_corpus``; reused by a restarted
driver, and by later runs where the parent keeps it),
judges each valid file once unwatched (lazy imports happen then) and once watched (a
control: it must be "equal"), then lets hypothesis draw ``N`` mutants
(``generative_mutations``) with seed ``S``. For each it writes one ``{"start": i, ...}`` line,
then one ``{"verdict": ...}`` line to ``RESULTS``, so the parent names the mutant a crash
happened on. ``--skip K`` draws the mutants before index ``K`` again without judging them
(one ``{"drawn": i, ...}`` line each: the parent checks they are the ones the first driver
drew, as they are, hypothesis being seeded and never failing), to go on after a crash.
``--crash-at C`` kills the driver (SIGFPE) at the first mutant from ``C`` on, to show crash
isolation works. A last ``{"summary": ...}`` line counts the verdicts.

How a mutant is judged (``judge``): loading it must raise ``SerializationError``, or give a
module ``M`` such that, with an audit hook recording what is dangerous (``AUDITED``) active
around loading and calling,

* nothing is recorded, and loading raises nothing but ``SerializationError``;
* calling ``M`` on the entry's inputs leaves its module tree as it was (``tree_print``);
* ``M`` computes what ``fxloom show`` displays (``shown_module``): the graphs
  ``fxloom.cli.save.summarise`` decodes, printed, parsed back with ``fxloom.parse_graph`` and
  built into GraphModules over ``M``'s own modules and tensors, give the same result on the
  same inputs (``same``), or both raise one of ``RUN_ERRORS``.

For an exported program, ``M`` is ``program.module()``; the shown root graph is the lifted
graph ``fxloom show`` prints, called with the inputs its printed ``graph_signature`` names
(parameters and buffers from ``program.state_dict``, constants from ``program.constants``,
then the user's inputs), and its USER_OUTPUT results are compared with the tensors of ``M``'s
result (``fxloom.pytree.tree_leaves``); for other files, the leaves of both results.
"""

from __future__ import annotations

import argparse
import builtins
import copy
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/serialize: hostile

import torch  # noqa: E402
from child_limits import lift_limits, set_limits  # noqa: E402
from generative_corpus import Entry, corpus, load  # noqa: E402
from generative_mutations import Program, add_generated_globals, mutate  # noqa: E402
from hostile import RUN_ERRORS  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from red_team_files import PROGRAM, read, rewrite  # noqa: E402

import fxloom  # noqa: E402
import fxloom.export  # noqa: E402
from fxloom import attr_path  # noqa: E402
from fxloom.cli.save import summarise  # noqa: E402
from fxloom.serialize import SerializationError  # noqa: E402

MEMORY_PER_MUTANT = 2**30
CPU_SECONDS_PER_MUTANT = 10
TMP = os.path.realpath(os.getcwd())
_real_open = builtins.open


# ------------------------------------------------------------------ the audit hook
# Audit events that must not happen while a file loads or runs (prefixes), and whether the
# hook also blocks them (raising in the hook stops the operation; imports are only recorded).
AUDITED = {
    "os.system": True, "os.exec": True, "os.spawn": True, "os.posix_spawn": True,
    "os.fork": True, "os.forkpty": True, "os.kill": True, "os.remove": True,
    "os.rename": True, "os.rmdir": True, "os.chmod": True, "os.truncate": True,
    "os.putenv": True, "os.unsetenv": True, "os.chdir": True, "shutil.rmtree": True,
    "subprocess.Popen": True, "ctypes.dlopen": True, "ctypes.dlsym": True,
    "ctypes.cdata": True, "ctypes.string_at": True, "pickle.find_class": True,
    "socket.connect": True, "socket.bind": True,
    "webbrowser.open": True, "builtins.input": True, "builtins.breakpoint": True,
    "sys.addaudithook": True, "sys.settrace": True, "sys.setprofile": True,
    "cpython.run_": True, "import": False,
}  # fmt: skip
# Libraries whose own modules torch and fxloom may import lazily, on a path a file chose (an
# error message's helper, a schema check): their imports, and the execution of their modules'
# code, are the library's, not the file's (as red_team_runner.py allows them). Any other
# import of a module not yet in sys.modules is recorded.
LIBRARIES = (
    "torch", "fxloom", "numpy", "sympy", "mpmath", "onnx", "onnxruntime", "google",
    "typing_extensions", "safetensors", "ml_dtypes",
)  # fmt: skip


def _library_files() -> tuple[str, ...]:
    """The folders of the libraries' packages (and the file of a one-file module)."""
    found: list[str] = []
    for spec in map(importlib.util.find_spec, LIBRARIES):
        if spec is not None and spec.submodule_search_locations:
            found += [os.path.join(folder, "") for folder in spec.submodule_search_locations]
        elif spec is not None and spec.origin:
            found.append(spec.origin)
    return tuple(found)


LIBRARY_FILES = _library_files()
# Code fxloom generates (its forwards) carries this file name prefix; other code executed
# while a file loads or runs is recorded, but that of the libraries' own modules.
GENERATED_FILES = "<fxloom-generated>"
# fxloom's safetensors reader copies each tensor's bytes through ``from_address`` of the
# tensor it just allocated; ``from_address`` anywhere else is recorded.
OWN_MEMORY_READER = "fxloom/serialize/safetensors_format.py"
RECORDED: list[str] = []
WATCHING = False


def _audit(event: str, args: tuple) -> None:
    if not WATCHING:
        return
    what = _audited(event, args)
    if what is None:
        return
    RECORDED.append(what)
    block = next((b for prefix, b in AUDITED.items() if event.startswith(prefix)), False)
    if block or what.startswith("open"):
        raise PermissionError(f"generative red team blocked {what}")


def _audited(event: str, args: tuple) -> str | None:
    """What the event did, in words, if it is one to record."""
    if event == "import":
        name = args[0]
        return (
            None if name in sys.modules or name.partition(".")[0] in LIBRARIES else f"import {name}"
        )
    if event == "open":
        return _open_outside(args)
    if event == "ctypes.cdata" and _called_from(OWN_MEMORY_READER):
        return None
    if event == "exec":  # compiling runs nothing (parse_graph's literals are ast.parse'd)
        name = getattr(args[0], "co_filename", "?")
        if name.startswith(GENERATED_FILES) or name.startswith(LIBRARY_FILES):
            return None
        return f"exec of code from {name[:80]}"
    if any(event.startswith(prefix) for prefix in AUDITED):
        return f"{event}{tuple(repr(a)[:60] for a in args)}"
    return None


def _called_from(filename: str) -> bool:
    caller = sys._getframe(3)  # _called_from, _audited, _audit, then the caller
    return caller.f_code.co_filename.endswith(filename)


def _open_outside(args: tuple) -> str | None:
    path, mode = args[0], args[1] if len(args) > 1 else "r"
    flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
    writing = any(c in str(mode or "") for c in "wax+") or bool(
        flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC)
    )
    if not writing or isinstance(path, int):
        return None
    real = os.path.realpath(os.fsdecode(path))
    if real == TMP or real.startswith(TMP + "/") or real == "/dev/null":
        return None
    return f"open {real!r} for writing"


# ------------------------------------------------------------------ limits
def _limit() -> None:
    """1 GiB of address space above what the interpreter holds, 10 s of CPU: a mutant that
    loops or allocates without end is killed (the parent names it)."""
    set_limits(CPU_SECONDS_PER_MUTANT, MEMORY_PER_MUTANT)


# ------------------------------------------------------------------ the module tree
# What fxloom fills in at the first call, not the tree: a GraphModule's generated code and
# its file name, an ONNX Runtime region's session and its input and output names.
CACHES = {
    "_code", "_compiled_graph", "_compiled_version", "_generated_forward", "_source_file",
    "_session", "_inputs", "_output_names",
}  # fmt: skip


def tree_print(module: torch.nn.Module) -> dict[str, object]:
    """What a call must not change: the module at each path (object and class), each
    parameter and buffer (object, shape, dtype), each plain attribute's value."""
    rows: dict[str, object] = {}
    stack, seen = [("", module)], set()
    while stack:
        path, m = stack.pop()
        rows[f"module {path or '(root)'}"] = (id(m), type(m).__qualname__)
        if not isinstance(m, torch.nn.Module) or id(m) in seen:
            continue  # a module held twice (or made to hold itself) is walked once
        seen.add(id(m))
        for name, value in vars(m).items():
            if name in ("_modules", "_parameters", "_buffers") or name in CACHES:
                continue
            rows[f"attribute {path}.{name}"] = _value_print(value)
        for field in ("_parameters", "_buffers"):
            for name, t in vars(m).get(field, {}).items():
                rows[f"{field[1:-1]} {path}.{name}"] = _value_print(t)
        for name, child in vars(m).get("_modules", {}).items():
            stack.append((f"{path}.{name}" if path else name, child))
    return rows


def _value_print(value, depth: int = 0) -> object:
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), tuple(value.shape), str(value.dtype))
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return repr(value)
    if depth < 3 and isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_value_print(v, depth + 1) for v in value))
    if depth < 3 and isinstance(value, dict):
        items = tuple((repr(k), _value_print(v, depth + 1)) for k, v in value.items())
        return (type(value).__name__, items)
    return (type(value).__qualname__, id(value))


def tree_changes(before: dict, after: dict) -> list[str]:
    changed = [k for k in before if before[k] != after.get(k, "(gone)")]
    return changed + [f"{k} (new)" for k in after if k not in before]


# ------------------------------------------------------------------ what show displays
class Unjudgeable(Exception):
    """``fxloom show`` does not display a module that computes: its graph does not parse, or
    names what the loaded module lacks."""


class Interpreted(torch.nn.Module):
    """A shown graph run node by node (``fxloom.Interpreter``): what the printed graph says,
    with no generated Python in between (whose names Python would fold)."""

    def __init__(self, gm: fxloom.GraphModule):
        super().__init__()
        self.gm = gm

    def forward(self, *args):
        return fxloom.Interpreter(self.gm).run(*args)


def shown_module(data: bytes, module, program) -> tuple[torch.nn.Module, dict | None]:
    """The module ``fxloom show`` displays: each graph it prints (deepest first) parsed back,
    over the loaded modules and tensors its targets name, run by ``Interpreted``; and an
    exported program's printed signature."""
    summary = summarise(data)
    if summary.refusals:
        raise Unjudgeable(f"fxloom show says load would refuse: {summary.refusals[0]}")
    base = program.graph_module if program is not None else module
    built: dict[str, torch.nn.Module] = {}
    for path in sorted(summary.graphs, key=lambda p: -p.count(".") - bool(p)):
        try:
            graph = fxloom.parse_graph(str(summary.graphs[path]))
        except Exception as e:
            where = path or "root"
            raise Unjudgeable(f"the graph of {where} show prints does not parse: {e}") from e
        owner = attr_path.find(base, path) if path else base
        root = {}
        for node in graph.nodes:
            if node.op in ("get_attr", "call_module"):
                full = f"{path}.{node.target}" if path else node.target
                found = built.get(full, attr_path.find(owner, node.target))
                if found is attr_path.MISSING:
                    raise Unjudgeable(f"show's graph reads {full!r}, which the module lacks")
                root[node.target] = found
        built[path] = Interpreted(fxloom.GraphModule(root, graph))
    if "" not in built:
        raise Unjudgeable("fxloom show prints no root graph")
    return built[""], summary.program_sections.get("graph_signature")


def shown_call(shown, signature, program, inputs: tuple):
    """Call the shown module as the file says: an exported program's lifted graph with the
    inputs its signature names, keeping its user outputs."""
    if program is None:
        return shown(*inputs)
    users, arguments = iter(inputs), []
    for spec in signature["inputs"]:
        kind, target = spec["kind"], spec.get("target")
        if kind == "USER_INPUT":
            arguments.append(next(users))
        elif kind in ("PARAMETER", "BUFFER"):
            arguments.append(program.state_dict[target])
        elif kind == "CONSTANT_TENSOR":
            arguments.append(program.constants[target])
        else:
            raise Unjudgeable(f"signature input kind {kind}")
    result = shown(*arguments)
    kinds = [spec["kind"] for spec in signature["outputs"]]
    return [r for r, kind in zip(result, kinds) if kind == "USER_OUTPUT"]


def same(a, b) -> bool:
    """The same leaves: tensors of one dtype and shape, equal (NaN equal to NaN), other
    values equal."""
    left, right = fxloom.pytree.tree_leaves(a), fxloom.pytree.tree_leaves(b)
    if len(left) != len(right):
        return False
    for x, y in zip(left, right):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.is_quantized or y.is_quantized:
                x, y = x.dequantize(), y.dequantize()
            if (
                x.dtype != y.dtype
                or x.shape != y.shape
                or not torch.equal(x.nan_to_num(0.125), y.nan_to_num(0.125))
            ):
                return False
        elif x != y and not (x != x and y != y):
            return False
    return True


# ------------------------------------------------------------------ judging
def _error(e: BaseException) -> str:
    return f"{type(e).__module__}.{type(e).__qualname__}: {str(e)[:300]}"


def _call(function, *args):
    """(result, None) or (None, the error it raised)."""
    try:
        with torch.no_grad():
            return function(*args), None
    except BaseException as e:  # noqa: BLE001  (a mutant may raise anything, even SystemExit)
        return None, e


def judge(entry: Entry, data: bytes) -> dict:
    """The verdict on one file: ``refused``, ``equal``, ``both_raised``, or how it got through
    (``load_raised``, ``recorded``, ``tree_changed``, ``differs``, ``call_raised``,
    ``unjudgeable``)."""
    global WATCHING
    RECORDED.clear()
    _limit()
    WATCHING = True
    try:
        return _judged(entry, data)
    except BaseException as e:  # noqa: BLE001  (this file's own bug, or a mutant's exit)
        return _verdict("judge_raised", error=_error(e), where=traceback.format_exc()[-1500:])
    finally:
        WATCHING = False
        lift_limits()


def _judged(entry: Entry, data: bytes) -> dict:
    loaded, error = _call(load, entry, data)
    if isinstance(error, SerializationError):
        return _verdict("refused", error=_error(error))
    if error is not None:
        return _verdict("load_raised", error=_error(error))
    module, program = loaded
    before, values = tree_print(module), _tensor_values(module, program)
    got, got_error = _call(module, *entry.inputs)
    changes = tree_changes(before, tree_print(module))
    if changes:
        return _verdict("tree_changed", changed=changes[:8])
    if got_error is not None and not isinstance(got_error, RUN_ERRORS):
        return _verdict("call_raised", error=_error(got_error))
    try:
        shown, signature = shown_module(data, module, program)
    except Unjudgeable as e:
        return _verdict("unjudgeable", error=str(e)[:400])
    _restore(values)
    want, want_error = _call(shown_call, shown, signature, program, entry.inputs)
    if isinstance(want_error, Unjudgeable):
        return _verdict("unjudgeable", error=str(want_error)[:400])
    if got_error is not None and want_error is not None:
        return _verdict("both_raised", error=_error(got_error))
    if got_error is not None or want_error is not None:
        return _verdict(
            "differs",
            error=f"loaded: {_error(got_error) if got_error else 'ran'}; shown: "
            f"{_error(want_error) if want_error else 'ran'}",
        )
    return _verdict("equal" if same(got, want) else "differs")


def _tensor_values(module, program) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tensor, a copy of its values) for every parameter, buffer and constant: a graph may
    write its own tensors in place (allowed, as a BatchNorm's running statistics are), and the
    shown module must start from the values the loaded one started from."""
    tensors = [*module.parameters(), *module.buffers()]
    if program is not None:
        tensors += [*program.state_dict.values(), *program.constants.values()]
    unique = {id(t): t for t in tensors if isinstance(t, torch.Tensor)}
    return [(t, t.detach().clone()) for t in unique.values()]


def _restore(values: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for tensor, copy_ in values:
            tensor.copy_(copy_)


def _verdict(outcome: str, **details) -> dict:
    """The outcome; anything the hook recorded turns it into ``recorded``."""
    if RECORDED:
        return {"outcome": "recorded", "recorded": list(RECORDED)[:8], "was": outcome, **details}
    return {"outcome": outcome, **details}


# ------------------------------------------------------------------ the run
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("results", type=Path)
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--corpus", type=Path, help="where the corpus is kept (FOLDER/corpus)")
    # The parent's test of crash isolation: the first mutant judged from this index on kills
    # the driver as a native crash would (SIGFPE), before it is judged.
    parser.add_argument("--crash-at", type=int, default=-1)
    args = parser.parse_args()
    entries = corpus(args.corpus or args.folder / "corpus")
    for entry in entries:
        judge(entry, entry.data)  # unwatched first: torch's and fxloom's lazy imports
        add_generated_globals(_generated_globals(entry))
    sys.addaudithook(_audit)
    documents = {e.name: read(e.data) for e in entries}
    run = Run(
        entries, documents, args.examples, args.seed, _real_open(args.results, "a", 1), Counter()
    )
    if args.skip == 0:
        for entry in entries:
            run.write({"control": entry.name, "verdict": judge(entry, entry.data)})
    started = time.perf_counter()
    run.explorer(args.skip, crash_at=args.crash_at)()
    seconds = time.perf_counter() - started
    tried = sum(run.counts.values())
    run.write({"summary": {"by_entry": _nested(run.counts), "tried": tried, "seconds": seconds}})


def _generated_globals(entry: Entry) -> list[str]:
    module, _ = load(entry, entry.data)
    return [n for m in module.modules() if isinstance(m, fxloom.GraphModule)
            for n in m.graph.python_code("self").globals]  # fmt: skip


def _nested(counts: Counter) -> dict:
    nested: dict = {}
    for (entry, outcome), n in sorted(counts.items()):
        nested.setdefault(entry, {})[outcome] = n
    return nested


@dataclass
class Run:
    """What the driver draws from (the corpus and its documents), how many and with which
    seed, where it writes, and the verdicts counted by (entry, outcome)."""

    entries: list[Entry]
    documents: dict[str, dict]
    examples: int
    seed: int
    out: object
    counts: Counter

    def explorer(self, skip: int, crash_at: int = -1):
        """The hypothesis test that draws the mutants and judges those from ``skip`` on. It
        never fails (verdicts are written, not asserted), so nothing is shrunk and a seed
        draws the same mutants."""
        index = iter(range(10**9))

        @seed(self.seed)
        @settings(
            max_examples=self.examples,
            database=None,
            deadline=None,
            derandomize=False,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(st.data())
        def explore(data):
            i = next(index)
            entry = data.draw(st.sampled_from(self.entries), label="entry")
            engine = _engine(entry, data.draw)
            program = Program(copy.deepcopy(self.documents[entry.name]), entry.exported)
            try:
                done = mutate(program, data.draw)
            except Exception:  # a bug of the mutation table: reported, not a verdict
                self.write({"start": i, "mutation_error": traceback.format_exc()})
                return
            did = [d for _, d in done] + ([f"on the {engine} engine"] if engine else [])
            if i < skip:  # drawn again after a crash: the parent checks it is the same mutant
                self.write({"drawn": i, "entry": entry.name, "did": did})
                return
            self.write({"start": i, "entry": entry.name, "kind": entry.kind,
                        "mutations": [n for n, _ in done], "did": did})  # fmt: skip
            if skip <= crash_at <= i:  # the first judged from crash_at on, in the first child
                self.write({"simulated_crash": i})
                os.kill(os.getpid(), signal.SIGFPE)
            verdict = judge(
                entry, rewrite(entry.data, {PROGRAM: json.dumps(program.document).encode()})
            )
            self.counts[(entry.name, verdict["outcome"])] += 1
            self.write({"verdict": verdict, "index": i})
            _reset_process_state()

        return explore

    def write(self, line: dict) -> None:
        self.out.write(json.dumps(line) + "\n")


# Quantized files are loaded and run on every quantized engine torch has here (a kernel's
# preconditions differ between fbgemm, qnnpack, onednn and x86); the engine is drawn.
QUANTIZED_ENGINES = sorted(e for e in torch.backends.quantized.supported_engines if e != "none")
DEFAULT_ENGINE = torch.backends.quantized.engine


def _engine(entry: Entry, draw) -> str | None:
    if entry.kind != "quantized":
        return None
    return draw(st.sampled_from(QUANTIZED_ENGINES), label="quantized engine")


def _reset_process_state() -> None:
    """Undo what a mutant may have changed process-wide, so the next is judged alone."""
    torch.backends.quantized.engine = DEFAULT_ENGINE
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    torch.manual_seed(0)


if __name__ == "__main__":
    main()
