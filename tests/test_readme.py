"""The README's Python examples run as written (so the tour never drifts from the code)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_python_examples():
    assert len(python_blocks()) >= 3


def test_the_readme_examples_run_in_order(capsys):
    namespace: dict = {"__name__": "readme"}
    for block in python_blocks():
        if "fxloom.compile(" in block and sys.version_info < (3, 11):
            continue  # fxloom.compile reads Python 3.11+ bytecode (tests/bytecode checks why)
        # dont_inherit: the blocks run as a user would run them, without this file's __future__.
        code = compile(block, str(README), "exec", dont_inherit=True)
        exec(code, namespace)  # later blocks reuse earlier names
