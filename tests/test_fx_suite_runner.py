"""tools/run_fx_suite.py runs a torch.fx test file against fxloom.

PyTorch's own test/test_fx.py is not in this repository (the tool takes the path of a fetched
copy), so these tests give it a small suite written here, in the same shape: imports of torch.fx,
``torch.fx.X`` inside a test, a name fxloom lacks, a failing import at the top.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "tools" / "run_fx_suite.py"

SUITE = textwrap.dedent(
    """
    import unittest

    import torch
    import torch.fx._pytree as fx_pytree
    from torch.fx import Graph, symbolic_trace
    from torch.fx.proxy import TracerBase
    from fx.helper_not_fetched import TestHelper  # noqa: F401


    class TestSmall(unittest.TestCase):
        def setUp(self):
            TracerBase.check_mutable_operations = True  # a name fxloom lacks: stored, ignored

        def test_imports_name_fxloom(self):
            import fxloom
            import fxloom.pytree

            self.assertIs(Graph, fxloom.Graph)
            self.assertIs(symbolic_trace, fxloom.symbolic_trace)
            self.assertIs(torch.fx.GraphModule, fxloom.GraphModule)
            self.assertIs(fx_pytree.tree_flatten_spec, fxloom.pytree.tree_flatten_spec)

        def test_rest_of_torch_is_torch(self):
            self.assertEqual(torch.add(torch.ones(1), 1).item(), 2.0)

        def test_missing_name_fails_when_used(self):
            torch.fx.operator_schemas.get_signature_for_torch_op(torch.add)

        @unittest.skip("their reason")
        def test_skipped(self):
            pass
    """
)


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUNNER), *args], capture_output=True, text=True, timeout=300
    )


def test_runner_replaces_torch_fx_with_fxloom_and_counts_outcomes(tmp_path):
    (tmp_path / "test_fx.py").write_text(SUITE)
    out = tmp_path / "summary.json"
    done = run_tool(str(tmp_path), "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["tests"] == {
        "passed": ["TestSmall.test_imports_name_fxloom", "TestSmall.test_rest_of_torch_is_torch"],
        "failed": [],
        "error": ["TestSmall.test_missing_name_fails_when_used"],
        "skipped": ["TestSmall.test_skipped"],
    }
    assert (
        "torch.fx.operator_schemas.get_signature_for_torch_op"
        in (summary["details"]["TestSmall.test_missing_name_fails_when_used"])
    )
    # The helper import fails alone; the tests after it still load.
    assert summary["module_statements_failed"] == [
        "line 8: ModuleNotFoundError: No module named 'fx'"
    ]


def test_compare_lists_tests_that_passed_before_and_not_after(tmp_path):
    def summary(passed, failed):
        tests = {"passed": passed, "failed": failed, "error": [], "skipped": []}
        counts = {k: len(v) for k, v in tests.items()}
        return {"fxloom_commit": "c", "counts": counts, "tests": tests, "details": {}}

    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(summary(["T.a", "T.b"], [])))
    after.write_text(json.dumps(summary(["T.b", "T.c"], ["T.a"])))
    done = run_tool("--compare", str(before), str(after))
    assert done.returncode == 1  # a test was lost
    assert "passed before, not after (1):\n  T.a: failed" in done.stdout
    assert "passed after, not before (1):\n  T.c" in done.stdout


PYTEST_SUITE = textwrap.dedent(
    """
    import pytest
    import torch
    from torch.fx import symbolic_trace


    class AddK(torch.nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, x):
            return x + self.k


    @pytest.mark.parametrize("k", [1, 2])
    def test_traced_module_adds(k):
        assert symbolic_trace(AddK(k))(torch.zeros(1)).item() == k


    def test_runs_on_fxloom():
        assert type(symbolic_trace(AddK(1))).__module__.startswith("fxloom")


    def test_raises_inside():
        raise RuntimeError("not an assertion")
    """
)


def test_runner_runs_a_pytest_suite_with_parameters_and_selection(tmp_path):
    suite = tmp_path / "test_small_pytest.py"
    suite.write_text(PYTEST_SUITE)
    out = tmp_path / "summary.json"
    done = run_tool(str(suite), "-k", "test_traced*", "-k", "*fxloom", "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["tests"] == {
        "passed": [
            "test_runs_on_fxloom",
            "test_traced_module_adds[1]",
            "test_traced_module_adds[2]",
        ],
        "failed": [],
        "error": [],
        "skipped": [],
    }  # test_raises_inside was not selected


def test_runner_against_torch_fx_runs_the_file_as_it_is(tmp_path):
    suite = tmp_path / "test_small_pytest.py"
    suite.write_text(PYTEST_SUITE)
    out = tmp_path / "summary.json"
    done = run_tool(str(suite), "--against", "torch.fx", "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["fxloom_commit"] == "torch.fx"
    assert summary["tests"]["failed"] == ["test_runs_on_fxloom"]  # an assert: failed
    assert summary["tests"]["error"] == ["test_raises_inside"]  # anything else: an error
    assert "not an assertion" in summary["details"]["test_raises_inside"]


def test_a_timeout_ends_the_test_even_where_the_test_catches_exception(tmp_path):
    (tmp_path / "test_fx.py").write_text(
        textwrap.dedent(
            """
            import time
            import unittest


            class TestSlow(unittest.TestCase):
                def test_swallows_exceptions(self):
                    try:
                        time.sleep(30)
                    except Exception:
                        pass  # as a library's fallback would: the timeout must not end here
            """
        )
    )
    out = tmp_path / "summary.json"
    done = run_tool(str(tmp_path), "--timeout", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["tests"]["error"] == ["TestSlow.test_swallows_exceptions"]
    assert summary["details"]["TestSlow.test_swallows_exceptions"] == "Timeout: over 1 s"
