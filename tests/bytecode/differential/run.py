"""Drawing many generated cases and summarising them: the CI slice and the long run.

``draw_and_run(examples, seed, families, variations, collect)`` lets hypothesis draw
``examples`` cases (``grammar.cases``) with a fixed seed and no example database, so every
run of a seed tries the same programs, and runs each (``harness.run_case``). With
``collect=False`` (CI) the first failure raises: hypothesis shrinks it and prints the
smallest program and call sequence that still fail. With ``collect=True`` (the long run)
every failure is counted by kind and by the families its program used, and the run goes on.

Families, variations and pairs of a family and a variation the compiler is known to get
wrong on main (``KNOWN_FAILING``, ``KNOWN_FAILING_VARIATIONS``, ``KNOWN_FAILING_PAIRS``; each
has a strict xfail in ``test_known_cases.py``) are left out of the CI slice, which therefore
must pass; the long run draws them too and reports their failure rates.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, seed, settings

from differential.grammar import FAMILIES, cases
from differential.harness import run_case
from differential.variations import VARIATIONS

# family -> why it fails on main (the kind, and the branch of issue 33 that fixes it)
KNOWN_FAILING: dict[str, str] = {}
KNOWN_FAILING_VARIATIONS: dict[str, str] = {}
# (family, family or variation) -> why a program that draws both fails
# (none now: the output and changes made before an op of the graph that raises at run time
# are done, as in eager -- entry.py ``Raised``)
KNOWN_FAILING_PAIRS: dict[tuple[str, str], str] = {}
CI_FAMILIES = frozenset(FAMILIES) - set(KNOWN_FAILING)
CI_VARIATIONS = tuple(v for v in VARIATIONS if v not in KNOWN_FAILING_VARIATIONS)


def known_failing(used: frozenset[str], variations: tuple[str, ...]) -> bool:
    """Whether a case draws a family, variation or pair known to fail on main."""
    return bool(
        set(used) & set(KNOWN_FAILING)
        or set(variations) & set(KNOWN_FAILING_VARIATIONS)
        or any(set(pair) <= set(used) | set(variations) for pair in KNOWN_FAILING_PAIRS)
    )


@dataclass
class Summary:
    seed: int
    families: list[str]
    variations: list[str]
    programs: int = 0
    calls: int = 0
    failures: int = 0
    seconds: float = 0.0
    by_kind: Counter = field(default_factory=Counter)
    # family -> [programs that used it, of which failed]
    by_family: dict[str, list[int]] = field(default_factory=dict)
    by_variation: dict[str, list[int]] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)  # kind -> the first failure
    # programs that drew no known-failing family, variation or pair: [run, failed] (0 failed)
    clean: list[int] = field(default_factory=lambda: [0, 0])

    def count(self, case, failure) -> None:
        self.programs += 1
        self.calls += len(case.calls) if failure is None else failure.call + 1
        self.failures += failure is not None
        for table, names in ((self.by_family, case.used), (self.by_variation, case.variations)):
            for name in names:
                row = table.setdefault(name, [0, 0])
                row[0] += 1
                row[1] += failure is not None
        if not known_failing(case.used, case.variations):
            self.clean[0] += 1
            self.clean[1] += failure is not None
        if failure is not None:
            self.by_kind[failure.kind] += 1
            self.examples.setdefault(failure.kind, str(failure))

    def to_json(self) -> str:
        # (not dataclasses.asdict: it rebuilds the Counter from (key, value) pairs as keys)
        return json.dumps({**vars(self), "by_kind": dict(self.by_kind)}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Summary:
        fields = json.loads(text)
        fields["by_kind"] = Counter(fields["by_kind"])
        return cls(**fields)

    def table(self) -> str:
        """Markdown: failures by kind, then per family and per variation."""
        lines = [f"{self.programs} programs, {self.calls} calls, {self.failures} failing "
                 f"(seed {self.seed}, {self.seconds:.0f} s); of the {self.clean[0]} that drew "
                 f"no known-failing family, variation or pair, {self.clean[1]} failing", "",
                 "| failure kind | programs |", "|---|---|"]  # fmt: skip
        lines += [f"| {kind} | {n} |" for kind, n in self.by_kind.most_common()]
        for title, table in (("family", self.by_family), ("variation", self.by_variation)):
            # a failing program counts against every family and variation it drew
            lines += ["", f"| {title} | programs using it | failing | rate |", "|---|---|---|---|"]
            for name, (used, failed) in sorted(table.items()):
                lines.append(f"| {name} | {used} | {failed} | {failed / max(used, 1):.1%} |")
        return "\n".join(lines)


def merged(summaries: list[Summary]) -> Summary:
    """One summary of several runs (the chunks of a long run, each with its own seed)."""
    total = Summary(min(s.seed for s in summaries), summaries[0].families, summaries[0].variations)
    for part in summaries:
        total.programs += part.programs
        total.calls += part.calls
        total.failures += part.failures
        total.seconds += part.seconds
        total.by_kind.update(part.by_kind)
        total.clean = [a + b for a, b in zip(total.clean, part.clean)]
        for mine, theirs in (
            (total.by_family, part.by_family),
            (total.by_variation, part.by_variation),
        ):
            for name, (used, failed) in theirs.items():
                row = mine.setdefault(name, [0, 0])
                row[0] += used
                row[1] += failed
        for kind, text in part.examples.items():
            total.examples.setdefault(kind, text)
    return total


def draw_and_run(
    examples: int,
    seed_value: int,
    families: frozenset[str] = CI_FAMILIES,
    variations: tuple[str, ...] = CI_VARIATIONS,
    collect: bool = False,
) -> Summary:
    summary = Summary(seed_value, sorted(families), list(variations))
    started = time.perf_counter()
    # a run over CI's families is one that must pass: it leaves the known-failing pairs out
    # (a run asking for other families, a pair's two included, draws them)
    left_out = tuple(KNOWN_FAILING_PAIRS) if families == CI_FAMILIES else ()

    @seed(seed_value)
    @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck), print_blob=False)  # fmt: skip
    @given(cases(families, variations, left_out))
    def one(case) -> None:
        failure = run_case(case)
        summary.count(case, failure)
        if failure is not None and not collect:
            raise AssertionError(str(failure))

    one()
    summary.seconds = time.perf_counter() - started
    return summary
