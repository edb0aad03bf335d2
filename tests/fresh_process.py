"""Running a snippet in a new interpreter: what a test process has already imported or
registered says nothing about what a user's first import does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_fresh(source: str) -> dict:
    """Runs ``source`` in a new interpreter with this checkout's fxloom first on the path; the
    snippet prints one JSON object last, which is returned."""
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])
