"""The README's and the docs pages' Python examples run as written (so the docs never drift
from the code).

Every ```python block of README.md and of each docs/*.md page runs, a page's blocks in order in
one namespace (later blocks reuse earlier names), each page in a fresh one. A sketch that is not
meant to run (a rank's loop under torchrun) is fenced as ```text.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 320  # a front page: what fxloom is, a tour, links; the detail is in docs/


def python_blocks(page: Path = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


def run_blocks(page: Path) -> None:
    namespace: dict = {"__name__": page.stem.replace("-", "_")}
    for block in python_blocks(page):
        if "fxloom.compile(" in block or "fx.compile(" in block:
            if sys.version_info < (3, 11):
                continue  # fxloom.compile reads Python 3.11+ bytecode (tests/bytecode says why)
        # dont_inherit: the blocks run as a user would run them, without this file's __future__.
        code = compile(block, str(page), "exec", dont_inherit=True)
        exec(code, namespace)  # later blocks reuse earlier names


def test_the_readme_has_python_examples():
    assert len(python_blocks()) >= 3


def test_the_readme_is_a_front_page_with_a_table_of_contents():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "](#what-fxloom-is)" in text and "](#the-cli)" in text
    assert "make demo" in text and "make test" in text  # the two commands, at the top


def test_the_readme_links_only_to_files_that_exist():
    for target in re.findall(r"\]\(((?:docs|benchmarks)/[^)#]+)", README.read_text()):
        assert (ROOT / target).exists(), target


def test_the_readme_examples_run_in_order(capsys):
    run_blocks(README)


# compile.md is fxloom.compile's own page: every later block builds on the first one's compile,
# so on Python 3.10 the page as a whole is skipped, like the rest of the bytecode tests.
PAGES = [
    pytest.param(page, marks=pytest.mark.bytecode) if page.name == "compile.md" else page
    for page in DOCS
]


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in DOCS])
def test_the_docs_page_examples_run_in_order(page, capsys):
    run_blocks(page)


def test_every_docs_page_the_readme_names_has_runnable_examples():
    for name in ("tracing", "case-studies", "export", "lowering", "quantization", "saving"):
        assert python_blocks(ROOT / "docs" / f"{name}.md"), name
