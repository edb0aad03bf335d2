"""Runs every red-team family's hostile files once per session, in child processes in parallel.

Each family module registers its cases with ``red_team_harness.family`` when it is collected;
the ``verdicts`` fixture then runs all of them (batches of a family in one child each, a few
children at a time) and every test looks up its own verdict.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import red_team_harness as harness  # noqa: E402

BATCH = 16  # files per child: a fresh torch+fxloom interpreter costs a few seconds


@pytest.fixture(scope="session")
def verdicts() -> dict[str, dict]:
    batches = []
    for cases in harness.FAMILIES.values():
        for start in range(0, len(cases), BATCH):
            batches.append(cases[start : start + BATCH])
    batches.sort(key=len, reverse=True)
    found: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=3) as pool:
        for result in pool.map(harness.run_cases, batches):
            found.update(result)
    return found
