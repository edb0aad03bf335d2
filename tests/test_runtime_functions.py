"""fxloom's run-time functions have one row each (fxloom.ops.runtime_functions), and every
question about them — effect, exported graphs, the host, TorchScript, files — reads it."""

from __future__ import annotations

from pathlib import Path

import torch

import fxloom
from fxloom import guards, runtime_checks
from fxloom.ops import mutation
from fxloom.ops.higher_order import HigherOrderOperator
from fxloom.ops.runtime_functions import (
    RUNTIME_FUNCTIONS,
    exported_graph_may_call,
    is_runtime_check,
    runtime_function,
    stays_on_host,
)
from fxloom.values.symbolic.size_checks import check_sizes

ROOT = Path(__file__).resolve().parents[1]
CHECKS = [
    guards.check_bool,
    guards.check_length,
    runtime_checks.check_tensor_input,
    runtime_checks.check_fixed,
    runtime_checks.check_tensor,
    runtime_checks.check_value,
    runtime_checks.flatten_inputs,
    check_sizes,
    runtime_checks.FixedArgument("config", object()),
    runtime_checks.FlattenedInput("x", fxloom.pytree.tree_flatten((1, 2))[1], {}),
]


def test_every_check_is_kept_writes_nothing_and_stays_on_the_host():
    for check in CHECKS:
        assert is_runtime_check(check), check
        assert mutation.function_has_side_effect(check), check
        assert mutation.is_read_only_effect(check), check
        assert stays_on_host(check), check


def test_cond_op_is_pure_computed_where_the_graph_runs_and_allowed_in_exported_graphs():
    assert runtime_function(fxloom.cond_op) is RUNTIME_FUNCTIONS["fxloom.cond.cond_op"]
    assert not mutation.function_has_side_effect(fxloom.cond_op)
    assert not stays_on_host(fxloom.cond_op)
    assert exported_graph_may_call(fxloom.cond_op)
    assert isinstance(fxloom.cond_op, HigherOrderOperator)  # how the verifier allows it


def test_a_function_that_only_prints_as_a_check_gets_no_row():
    def check_bool(value, expected, where):
        return None

    check_bool.__module__, check_bool.__qualname__ = "fxloom.guards", "check_bool"
    assert runtime_function(check_bool) is None
    assert not is_runtime_check(check_bool)


def test_torch_functions_and_unhashable_callables_get_no_row():
    class Unhashable:
        __hash__ = None

        def __call__(self):
            return None

    assert runtime_function(torch.relu) is None
    assert runtime_function(Unhashable()) is None


def test_a_check_traced_again_records_itself_instead_of_running():
    gm = fxloom.symbolic_trace(torch.nn.Linear(2, 2), example_inputs=(torch.ones(1, 2),))
    outer = fxloom.symbolic_trace(lambda x: gm(x))
    targets = [n.target for n in outer.graph.nodes if n.op == "call_function"]
    assert runtime_checks.check_tensor_input in targets


def test_each_reusing_form_is_a_function_of_the_row_s_own_module():
    from fxloom.ops.runtime_functions import returns_fresh, reusing_functions
    from fxloom.quantize import ops

    rows = {name: row for name, row in RUNTIME_FUNCTIONS.items() if row.reuses is not None}
    assert rows  # the fused residual add
    found = reusing_functions()
    for name, row in rows.items():
        module, _, qualname = name.rpartition(".")
        target = getattr(__import__(module, fromlist=[qualname]), qualname)
        assert row.fresh and returns_fresh(target)
        assert found[target] == (row.reuses[0], getattr(ops, row.reuses[1].rpartition(".")[2]))
