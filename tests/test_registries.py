"""Registries are declared tables: importing a module fills none of them.

Backends have one registry, ``fxloom.backends.BACKENDS``: fxloom's own backends are declared in
it by module and name and enter it when first asked for, and ``fxloom.compile`` resolves names
there (the bytecode frontend keeps none of its own). Checks that depend on what was imported
run a fresh interpreter. (``tests/distributed/test_import_changes_no_table.py`` checks the
tables of tracing against importing ``fxloom.distributed``.) ``fxloom.cond_op`` is declared with
``fxloom.cond.CAPTURES``, how each frontend records a cond, by module and function name.
"""

from __future__ import annotations

import pytest
import torch

import fxloom
from fxloom.backends import BACKENDS, Backend, get_backend, register_backend
from fxloom.cond import CAPTURES
from tests.fresh_process import run_fresh


def test_importing_fxloom_lower_registers_no_backend():
    found = run_fresh(
        """
        import json
        from fxloom.backends import BACKENDS
        before = sorted(BACKENDS)
        import fxloom.lower, fxloom.lower.onnxruntime_backend
        print(json.dumps({"before": before, "after": sorted(BACKENDS)}))
        """
    )
    assert found == {"before": ["eager"], "after": ["eager"]}


def test_a_declared_backend_enters_the_registry_when_first_asked_for():
    from fxloom.lower.onnxruntime_backend import ONNX_RUNTIME

    assert get_backend("onnxruntime") is ONNX_RUNTIME
    assert BACKENDS["onnxruntime"] is ONNX_RUNTIME


def test_a_loaded_backend_module_brings_its_saving_rules():
    found = run_fresh(
        """
        import json
        from fxloom.backends import BACKENDS, saved_module_rules
        from fxloom.lower.runtime import OrtModule
        print(json.dumps({"rule": OrtModule in saved_module_rules(), "names": sorted(BACKENDS)}))
        """
    )
    assert found == {"rule": True, "names": ["eager", "onnxruntime"]}


class Doubling(Backend):
    name = "doubling_for_registry_test"

    def compile_program(self, graph_module, example_inputs):
        return lambda *args: tuple(2 * value for value in graph_module.forward(*args))


@pytest.mark.bytecode
def test_fxloom_compile_finds_a_registered_backend_by_name():
    register_backend(Doubling())
    try:
        compiled = fxloom.compile(lambda x: x + 1, backend="doubling_for_registry_test")
        assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 4.0))
    finally:
        del BACKENDS[Doubling.name]


@pytest.mark.bytecode
def test_the_bytecode_frontend_keeps_no_registry_and_points_to_the_one():
    from fxloom.bytecode import compiled

    assert not hasattr(compiled, "BACKENDS")
    with pytest.raises(ValueError, match="fxloom.backends.BACKENDS"):
        compiled.compile(lambda x: x, backend="onnxruntime")


def test_how_frontends_capture_cond_is_declared_and_no_import_changes_it():
    found = run_fresh(
        """
        import json
        import fxloom
        rows = lambda: [(i.frontend, i.loaded() is not None) for i in fxloom.cond_op.implementations]
        before = rows()
        import fxloom.export.exporter
        print(json.dumps({"before": before, "after": rows()}))
        """
    )
    # symbolic tracing's row counts once the tracer is loaded (``import fxloom`` loads it);
    # export's once export is: the table itself never changes
    assert found == {
        "before": [["export", False], ["symbolic trace", True]],
        "after": [["export", True], ["symbolic trace", True]],
    }


def test_every_cond_capture_row_names_functions_that_exist():
    import importlib

    for row in CAPTURES:
        module = importlib.import_module(row.module)
        for name in (row.claims, row.run, *row.value_types):
            assert hasattr(module, name), f"{row.frontend}: {row.module} has no {name}"
