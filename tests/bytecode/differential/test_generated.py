"""Generated programs, each called in a varied sequence, agree with eager (issue 33, item 6).

CI draws ``CI_EXAMPLES`` cases over the families the compiler gets right on main (well
within a minute on two cores); a failure is shrunk by hypothesis to the smallest program and
call sequence, both printed. The long run (``make differential``) sets
``FXLOOM_DIFFERENTIAL_EXAMPLES`` (10000), ``FXLOOM_DIFFERENTIAL_SEED`` and, to draw other
families than CI's, ``FXLOOM_DIFFERENTIAL_FAMILIES`` (comma-separated, ``all`` for every
family); it counts failures by kind and family instead of stopping at the first, prints the
table recorded in benchmarks/RESULTS.md, writes it as JSON to
``FXLOOM_DIFFERENTIAL_SUMMARY`` if set, and fails if a program that drew no known-failing
family, variation or pair of them (``run.KNOWN_FAILING``...) failed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from differential.grammar import FAMILIES
from differential.run import CI_FAMILIES, CI_VARIATIONS, draw_and_run
from differential.variations import VARIATIONS

pytestmark = pytest.mark.usefixtures("one_thread")

CI_EXAMPLES = 300  # about 30 s of CPU; the machine runs other work too
EXAMPLES = int(os.environ.get("FXLOOM_DIFFERENTIAL_EXAMPLES", CI_EXAMPLES))
SEED = int(os.environ.get("FXLOOM_DIFFERENTIAL_SEED", "0"))
ASKED = os.environ.get("FXLOOM_DIFFERENTIAL_FAMILIES", "")


def _families() -> frozenset[str]:
    if not ASKED:
        return CI_FAMILIES
    if ASKED == "all":
        return frozenset(FAMILIES)
    asked = frozenset(name.strip() for name in ASKED.split(","))
    unknown = asked - set(FAMILIES)
    assert not unknown, f"no grammar families {sorted(unknown)}; known: {sorted(FAMILIES)}"
    return asked


@pytest.fixture(scope="module")
def generated_run():
    families = _families()
    long_run = bool(EXAMPLES != CI_EXAMPLES or ASKED)
    variations = tuple(VARIATIONS) if long_run else CI_VARIATIONS
    summary = draw_and_run(EXAMPLES, SEED, families, variations, collect=long_run)
    if long_run:
        if os.environ.get("FXLOOM_DIFFERENTIAL_SUMMARY"):
            Path(os.environ["FXLOOM_DIFFERENTIAL_SUMMARY"]).write_text(summary.to_json())
        print(f"\n{summary.table()}")
        for kind, text in summary.examples.items():
            print(f"\n--- first '{kind}' failure\n{text[:3000]}")
    return summary


def test_generated_programs_agree_with_eager_over_varied_calls(generated_run):
    """In CI a failure stops the run inside the fixture (shrunk, program and calls printed);
    a long run fails here if a program drawn over CI's families only failed."""
    summary = generated_run
    assert summary.programs >= EXAMPLES * 0.9, f"only {summary.programs} programs ran"
    assert summary.clean[1] == 0, summary.table()


def test_the_run_draws_every_family_and_variation_it_asks_for(generated_run):
    if generated_run.programs < CI_EXAMPLES:
        pytest.skip("a short run need not reach every family")
    assert set(generated_run.by_family) == set(generated_run.families) | {"tensor"}
    assert set(generated_run.by_variation) == {"again", *generated_run.variations}
