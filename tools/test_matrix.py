"""Run fxloom's test suite across Python x torch x transformers versions (`make test-matrix`).

Each cell of ``CELLS`` is one environment: a Python from pyenv, one torch and one transformers
release, and the test extras (pyproject's ``[test]``) at whatever release pip picks for that
Python. Environments live outside the repository, under ``--cache`` (default
``~/.cache/fxloom-matrix/<cell>``), are built once and reused; ``--rebuild`` starts a cell afresh.
fxloom itself is never installed there: the suite runs with ``PYTHONPATH`` set to this checkout,
so every cell tests the working tree as it is.

Per cell the run leaves, in its environment directory: ``build.log`` (pip), ``freeze.txt`` (what
was installed), ``pytest.log`` (the whole run), ``junit.xml`` and ``result.json`` (counts and the
failing test ids). After the runs, the table in docs/compatibility.md between its ``matrix``
markers is regenerated from every cell's ``result.json`` (cells not run this time keep their last
result, with its date and the commit it ran at).

    python tools/test_matrix.py --list
    python tools/test_matrix.py --cells py3.12-torch2.11-tf5.17
    python tools/test_matrix.py --build-only          # environments only, no tests
    python tools/test_matrix.py --cells py3.13-torch2.13-tf5.24 -- -k hf_models

torch comes from PyPI (on Linux x86_64 that is a CUDA build: the wheel plus NVIDIA's runtime
packages, a few GB per cell; tests run on the CPU either way).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "compatibility.md"
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
DEFAULT_CACHE = Path.home() / ".cache" / "fxloom-matrix"

# pyproject's [test] extra, less transformers (pinned per cell). Kept unpinned on purpose: each
# cell takes what pip resolves for its Python, as a user's fresh environment would.
TEST_EXTRAS = (
    "rich",
    "pytest",
    "safetensors",
    "hypothesis",
    "numpy",
    "graphviz",
    "torchao",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "onnx_ir",
)


@dataclass(frozen=True)
class Cell:
    """One environment of the matrix, and why it is in the matrix."""

    python: str  # "3.12": found as ~/.pyenv/versions/3.12.*/bin/python
    torch: str  # exact release, e.g. "2.11.0"
    transformers: str  # exact release
    why: str
    # test id -> reason, for limitations of that version that fxloom cannot work around; each is
    # listed in docs/compatibility.md.
    known_failures: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        torch_minor = ".".join(self.torch.split(".")[:2])
        tf_minor = ".".join(self.transformers.split(".")[:2])
        return f"py{self.python}-torch{torch_minor}-tf{tf_minor}"


# The tests of tests/test_hf_models.py that build Phi and so fail where it cannot be built.
_TESTS_THAT_BUILD_PHI = (
    "test_traced_model_matches_eager_on_the_example",
    "test_traced_model_matches_eager_on_another_batch_size_and_length",
    "test_traced_model_matches_eager_with_a_padded_attention_mask",
    "test_traced_model_matches_eager_without_padding_when_traced_on_a_padded_mask",
    "test_traced_model_refuses_an_input_that_takes_another_branch",
    "test_traced_model_is_right_or_refuses_on_a_single_token",
    "test_traced_graph_lints",
    "test_tracing_leaves_the_eager_model_unchanged",
)

CELLS: tuple[Cell, ...] = (
    Cell(
        "3.12",
        "2.11.0",
        "5.17.0",
        "the oldest torch supported, as first reported (issue 22)",
        known_failures={
            "tests/values/test_symbolic.py::test_symbolic_sizes_and_strides_agree_with_torchs_fake_tensors_at_other_sizes": (
                "the comparison peer, not fxloom: torch 2.11's own FakeTensorMode over its "
                "ShapeEnv raises 'Cannot call numel() on tensor with symbolic sizes' while "
                "building the reference answers"
            ),
            "tests/values/test_symbolic.py::test_symbolic_sizes_and_strides_match_the_concrete_ones_at_the_examples_values[scaled_dot_product_attention]": (
                "torch 2.11's C++ scaled_dot_product_attention kernel reads sizes as ints "
                "and has no Python definition, so fxloom's symbolic meta cannot run it "
                "alone (exports of Hugging Face attention with dynamic sizes pass)"
            ),
            "tests/test_extensibility.py::test_enum_members_stay_constants_in_arguments_and_outputs[torch.fx]": (
                "the comparison peer, not fxloom: torch.fx 2.11 writes an enum member as its "
                "repr (<Color.RED: 1>) in generated code"
            ),
            "tests/quantize/test_pt2e_peer.py": (
                "the comparison peer, not fxloom: torchao's PT2E (0.18) does not run on torch 2.11"
            ),
        },
    ),
    Cell(
        "3.10",
        "2.12.0",
        "5.0.0",
        "the oldest Python and the oldest transformers 5",
        known_failures={
            "tests/values/test_symbolic.py::test_symbolic_sizes_and_strides_agree_with_torchs_fake_tensors_at_other_sizes": (
                "the comparison peer, not fxloom: torch 2.12's own FakeTensorMode over its "
                "ShapeEnv raises 'Cannot call numel() on tensor with symbolic sizes' while "
                "building the reference answers (as torch 2.11 does)"
            ),
            "tests/values/test_symbolic.py::test_symbolic_sizes_and_strides_match_the_concrete_ones_at_the_examples_values[scaled_dot_product_attention]": (
                "as on torch 2.11: torch 2.12's C++ scaled_dot_product_attention kernel reads "
                "sizes as ints (here through aten.size.default) and has no Python definition, "
                "so fxloom's symbolic meta cannot run it alone"
            ),
            **{
                f"tests/test_hf_models.py::{test}[phi]": (
                    "transformers 5.0's PhiModel reads config.pad_token_id, which its own "
                    "PhiConfig does not define: the eager model cannot be built"
                )
                for test in _TESTS_THAT_BUILD_PHI
            },
            **{
                f"tests/test_hf_models.py::test_traced_model_refuses_an_input_that_takes_another_branch[{name}]": (
                    "transformers 5.0's T5 takes the same path for one token as for the "
                    "example, so there is no branch to guard (traced output equals eager's)"
                )
                for name in ("t5", "t5_generator")
            },
            "tests/test_hf_models.py::test_traced_model_refuses_an_input_that_takes_another_branch[deit]": (
                "transformers 5.0's DeiT has no branch on the image size: eager itself fails "
                "on the other size, with the same error the traced module raises"
            ),
        },
    ),
    Cell("3.13", "2.13.0", "5.24.0", "the newest Python and the newest transformers"),
    Cell("3.11", "2.14.1", "5.23.0", "the newest torch this machine's pip allows"),
)


def cell_dir(cache: Path, cell: Cell) -> Path:
    return cache / cell.name


def pyenv_python(version: str) -> Path:
    """The pyenv interpreter for a "3.X" version (the newest patch release installed)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(root.glob(f"{version}.*/bin/python"), key=lambda p: p.parent.parent.name)
    if not found:
        raise SystemExit(
            f"no Python {version} under {root}; install it with `pyenv install {version}`"
        )
    return found[-1]


def build(cell: Cell, cache: Path, rebuild: bool) -> Path:
    """Create (or reuse) the cell's virtual environment; returns its python."""
    where = cell_dir(cache, cell)
    python = where / "venv" / "bin" / "python"
    stamp = where / "built.stamp"
    if rebuild and where.exists():
        shutil.rmtree(where)
    if stamp.exists():
        return python
    where.mkdir(parents=True, exist_ok=True)
    log = where / "build.log"
    print(f"[{cell.name}] building {where} (log: {log})", flush=True)
    with log.open("w") as out:
        steps = [
            [str(pyenv_python(cell.python)), "-m", "venv", str(where / "venv")],
            [str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"],
            # torch first and alone, so no later resolution picks another release.
            [str(python), "-m", "pip", "install", "-q", f"torch=={cell.torch}"],
            [
                str(python), "-m", "pip", "install", "-q",
                f"torch=={cell.torch}", f"transformers=={cell.transformers}", *TEST_EXTRAS,
            ],
            # fxloom's metadata and `fxloom` command only (`fxloom version` reads them); the
            # code under test comes from PYTHONPATH.
            [str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO)],
        ]  # fmt: skip
        for step in steps:
            out.write("$ " + " ".join(step) + "\n")
            out.flush()
            if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise SystemExit(f"[{cell.name}] build failed; see {log}")
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True)
    (where / "freeze.txt").write_text(freeze.stdout)
    stamp.touch()
    return python


def run_suite(cell: Cell, python: Path, cache: Path, pytest_args: list[str]) -> dict:
    """Run the suite in the cell's environment; returns (and saves) its result."""
    where = cell_dir(cache, cell)
    junit = where / "junit.xml"
    command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"]
    command += [f"--junitxml={junit}", *(f"--deselect={test}" for test in cell.known_failures)]
    command += pytest_args
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"[{cell.name}] pytest (log: {where / 'pytest.log'})", flush=True)
    with (where / "pytest.log").open("w") as out:
        code = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    result = {
        "cell": cell.name,
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": round((datetime.datetime.now(datetime.timezone.utc) - started).seconds / 60, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
        "versions": installed_versions(python),
        "selection": " ".join(pytest_args) or "whole suite",
        "commit": checkout_commit(),
        "exit_code": code.returncode,
        **junit_counts(junit),
    }
    (where / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def checkout_commit() -> str:
    """The commit the suite ran at (``+changes`` when the working tree differed from it)."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{head}+changes" if head and dirty else head or "unknown"


def installed_versions(python: Path) -> str:
    probe = (
        "import sys, torch, transformers; "
        "print(f'Python {sys.version.split()[0]}, torch {torch.__version__}, "
        "transformers {transformers.__version__}')"
    )
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() or "unknown (import failed)"


def junit_counts(junit: Path) -> dict:
    """passed/failed/skipped counts and the failing test ids from pytest's JUnit XML."""
    if not junit.exists():
        return {"passed": 0, "failed": 0, "skipped": 0, "failures": ["(pytest wrote no report)"]}
    failures, skipped, total = [], 0, 0
    for case in ElementTree.parse(junit).iter("testcase"):
        total += 1
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failures.append(test_id)
        elif case.find("skipped") is not None:
            skipped += 1
    passed = total - len(failures) - skipped
    return {"passed": passed, "failed": len(failures), "skipped": skipped, "failures": failures}


def pinned_result(cache: Path) -> list[dict]:
    """Every cell's last saved result, in the table's order."""
    results = []
    for cell in CELLS:
        saved = cell_dir(cache, cell) / "result.json"
        if saved.exists():
            results.append(json.loads(saved.read_text()))
    return results


def render_table(results: list[dict]) -> str:
    lines = [
        "| cell | versions | passed | failed | skipped | run | selection |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in results:
        lines.append(
            f"| `{r['cell']}` | {r['versions']} | {r['passed']} | {r['failed']} | {r['skipped']} "
            f"| {r['date']} at `{r.get('commit', 'unknown')}`, {r['minutes']} min, {r['machine']} "
            f"| {r['selection']} |"
        )
    failing = [r for r in results if r["failures"]]
    for r in failing:
        lines += ["", f"Failing in `{r['cell']}`:", ""]
        lines += [f"- `{test}`" for test in r["failures"][:50]]
        if len(r["failures"]) > 50:
            lines.append(f"- ... and {len(r['failures']) - 50} more (see the cell's pytest.log)")
    known = [(cell, test, why) for cell in CELLS for test, why in cell.known_failures.items()]
    if known:
        lines += ["", "Deselected as known limitations of a version:", ""]
        lines += [f"- `{cell.name}`: `{test}`: {why}" for cell, test, why in known]
    return "\n".join(lines)


def update_doc(results: list[dict]) -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{render_table(results)}\n{END}{tail}")


def chosen_cells(names: list[str] | None) -> list[Cell]:
    if not names:
        return list(CELLS)
    by_name = {cell.name: cell for cell in CELLS}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise SystemExit(f"unknown cell(s) {unknown}; --list shows them: {sorted(by_name)}")
    return [by_name[name] for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="+", metavar="CELL", help="cells to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the cells and exit")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where environments live")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the chosen environments")
    parser.add_argument("--build-only", action="store_true", help="build environments, run nothing")
    parser.add_argument("--no-doc", action="store_true", help="leave docs/compatibility.md alone")
    parser.add_argument(
        "--doc-only", action="store_true", help="regenerate the doc's table from saved results"
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    args = parser.parse_args(argv)
    if args.list:
        for cell in CELLS:
            built = (
                "built" if (cell_dir(args.cache, cell) / "built.stamp").exists() else "not built"
            )
            print(f"{cell.name:28} {built:10} {cell.why}")
        return 0
    if args.doc_only:
        update_doc(pinned_result(args.cache))
        return 0
    cells = chosen_cells(args.cells)
    pythons = {cell.name: build(cell, args.cache, args.rebuild) for cell in cells}
    if args.build_only:
        return 0
    results = [run_suite(cell, pythons[cell.name], args.cache, args.pytest_args) for cell in cells]
    for r in results:
        print(
            f"{r['cell']:28} passed {r['passed']:5}  failed {r['failed']:4}  skipped {r['skipped']:4}"
        )
    if not args.no_doc:
        update_doc(pinned_result(args.cache))
        print(f"updated {DOC.relative_to(REPO)}")
    return 0 if all(r["failed"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
