"""What `import fxloom` costs: the core only; everything else loads when first used.

Each check runs a fresh interpreter (the modules a test process has imported say nothing about
a user's first import) and compares its ``sys.modules`` after ``import torch`` with after
``import fxloom``. Export, sympy, the distributed package, lowering, quantization, saving and
the bytecode frontend load on first use (``fxloom.__getattr__``, PEP 562), and nothing they
would have registered on import changes what the core does before they load: the rpc calls are
leaves of tracing and ``schedule_async`` knows their pair from declared tables, and the safe
loader finds fxloom's run-time functions by name (``fxloom.ops.runtime_functions``).
"""

from __future__ import annotations

import sys

import pytest
import torch

import fxloom
from tests.fresh_process import run_fresh

# What `import fxloom` must not load: the parts that load when first used, and the heavy
# libraries behind them. A prefix stands for the module and everything under it.
LOADED_ON_FIRST_USE = (
    "fxloom.backends",
    "fxloom.bytecode",
    "fxloom.cli",
    "fxloom.distributed",
    "fxloom.export",
    "fxloom.lower",
    "fxloom.quantize",
    "fxloom.serialize",
    "fxloom.subgraph_rewriter",
    "fxloom.values.symbolic",  # sympy behind it (``symbolic_scalars`` answers without it)
    "fxloom.zoo",
    "sympy",
    "mpmath",
    "torch._dynamo",
    "torch.distributed",  # beyond what `import torch` loaded itself
    "torch.fx.experimental.symbolic_shapes",
    "onnx",
    "onnxruntime",
    "transformers",
    "numpy",
)


def _modules_import_fxloom_adds() -> list[str]:
    return run_fresh(
        """
        import json, sys
        import torch
        before = set(sys.modules)
        import fxloom
        print(json.dumps(sorted(set(sys.modules) - before)))
        """
    )


@pytest.fixture(scope="module")
def added_by_import() -> list[str]:
    return _modules_import_fxloom_adds()


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_import_fxloom_loads_none_of_the_parts_used_later(added_by_import):
    loaded = {
        module
        for module in added_by_import
        for prefix in LOADED_ON_FIRST_USE
        if _under(module, prefix)
    }
    assert not loaded, f"`import fxloom` loads {sorted(loaded)}: load them when first used"


def test_import_fxloom_loads_no_library_beyond_torch_and_the_standard_library(added_by_import):
    others = {
        module
        for module in added_by_import
        if not _under(module, "fxloom")
        and module.partition(".")[0].lstrip("_") not in sys.stdlib_module_names
        and module.partition(".")[0] not in sys.stdlib_module_names
    }
    assert not others, f"`import fxloom` loads {sorted(others)}"


def test_import_fxloom_loads_the_core(added_by_import):
    for core in ("fxloom.graph", "fxloom.graph_module", "fxloom.tracer", "fxloom.interpreter"):
        assert core in added_by_import


def test_every_public_name_resolves_in_a_fresh_process():
    found = run_fresh(
        """
        import json, sys
        import fxloom
        missing = [name for name in fxloom.__all__ if not hasattr(fxloom, name)]
        not_listed = sorted(set(fxloom.__all__) - set(dir(fxloom)))
        namespace = {}
        exec("from fxloom import " + ", ".join(fxloom.__all__), namespace)
        same = all(namespace[name] is getattr(fxloom, name) for name in fxloom.__all__)
        print(json.dumps({"missing": missing, "not_listed": not_listed, "same": same}))
        """
    )
    assert found == {"missing": [], "not_listed": [], "same": True}


def test_torch_fx_s_submodule_names_resolve_as_its_clients_read_them():
    """Code written for torch.fx reads ``fx.subgraph_rewriter.replace_pattern_with_filters``
    or ``fx.passes...`` after ``import torch.fx as fx``: the same names on fxloom."""
    found = run_fresh(
        """
        import json
        import fxloom as fx
        names = ("graph", "graph_module", "immutable_collections", "interpreter", "node",
                 "passes", "proxy", "subgraph_rewriter")
        print(json.dumps([name for name in names if not hasattr(fx, name)]))
        """
    )
    assert found == []


def test_each_subpackage_loads_when_first_read():
    found = run_fresh(
        """
        import json, sys
        import fxloom
        names = {
            "export": fxloom.export.export.__module__,
            "Dim": fxloom.export.Dim.__name__,
            "pipeline": fxloom.distributed.pipeline.__module__,
            "rpc_wait": fxloom.distributed.rpc_wait.__name__,
            "lower": fxloom.lower.lower.__module__,
            "prepare": fxloom.quantize.prepare.__module__,
            "save": fxloom.save is fxloom.serialize.save,
            "eager": "eager" in fxloom.backends.BACKENDS,
            "explain": fxloom.explain.__module__,
            "in_dir": sorted({"export", "distributed", "lower", "quantize"} & set(dir(fxloom))),
        }
        print(json.dumps(names))
        """
    )
    assert found == {
        "export": "fxloom.export.exporter",
        "Dim": "Dim",
        "pipeline": "fxloom.distributed.pipeline",
        "rpc_wait": "rpc_wait",
        "lower": "fxloom.lower.lowering",
        "prepare": "fxloom.quantize.prepare",
        "save": True,
        "eager": True,
        "explain": "fxloom.bytecode.explain",
        "in_dir": ["distributed", "export", "lower", "quantize"],
    }


def test_a_function_named_like_its_module_stays_the_function_once_the_module_is_imported():
    found = run_fresh(
        """
        import json
        import fxloom.distributed.pipeline
        import fxloom.distributed
        print(json.dumps({"callable": callable(fxloom.distributed.pipeline)}))
        """
    )
    assert found == {"callable": True}


def test_lazy_packages_list_their_names():
    for package in (fxloom, fxloom.distributed, fxloom.export):
        assert set(package.__all__) <= set(dir(package))
        for name in package.__all__:
            assert getattr(package, name) is not None


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        fxloom.not_a_name  # noqa: B018
    with pytest.raises(AttributeError, match="'fxloom.distributed' has no attribute 'nope'"):
        fxloom.distributed.nope  # noqa: B018


# What the first ``fxloom.compile`` of ``x + y`` must not load: torch's compiler stack (Dynamo
# alone is 1 to 2 s, and sympy comes with it), and fxloom's parts other than the bytecode frontend.
NOT_LOADED_BY_THE_FIRST_COMPILE = (
    "fxloom.export",
    "fxloom.distributed",
    "fxloom.values.symbolic",
    "torch._dynamo",
    "torch._inductor",
    "torch.fx.experimental.symbolic_shapes",
    "sympy",
)


@pytest.mark.bytecode  # fxloom.compile: Python 3.11+
def test_the_first_compile_of_x_plus_y_imports_neither_dynamo_nor_sympy_nor_export():
    found = run_fresh(
        f"""
        import json, sys
        import torch, fxloom
        a, b = torch.randn(3), torch.randn(3)
        same = torch.equal(fxloom.compile(lambda x, y: x + y)(a, b), a + b)
        loaded = [m for m in {NOT_LOADED_BY_THE_FIRST_COMPILE!r} if m in sys.modules]
        print(json.dumps({{"same": same, "loaded": loaded}}))
        """
    )
    assert found == {"same": True, "loaded": []}


@pytest.mark.bytecode
def test_common_pointwise_programs_compile_without_importing_dynamo():
    found = run_fresh(
        f"""
        import json, sys
        import torch, fxloom

        def f(x, y, n):
            z = (x * 2 - y / 3).sin() + torch.exp(-x) * (x > 0.5)
            return torch.maximum(z, y) - 1 + n, (x == y)

        x, y = torch.randn(4, 5), torch.rand(4, 5)
        ints = torch.arange(20).reshape(4, 5)
        compiled = fxloom.compile(f)
        results = [compiled(x, y, 1), compiled(ints, ints, 1), compiled(x, ints, 1)]
        expected = [f(x, y, 1), f(ints, ints, 1), f(x, ints, 1)]
        same = all(
            torch.equal(got, want) and got.dtype == want.dtype
            for pair in zip(results, expected) for got, want in zip(*pair)
        )
        loaded = [m for m in {NOT_LOADED_BY_THE_FIRST_COMPILE!r} if m in sys.modules]
        print(json.dumps({{"same": same, "loaded": loaded}}))
        """
    )
    assert found == {"same": True, "loaded": []}


@pytest.mark.bytecode
def test_a_linear_relu_model_compiles_without_importing_dynamo():
    found = run_fresh(
        f"""
        import json, sys
        import torch, fxloom
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
        )
        x = torch.randn(3, 4)
        same = torch.allclose(fxloom.compile(model)(x), model(x))
        loaded = [m for m in {NOT_LOADED_BY_THE_FIRST_COMPILE!r} if m in sys.modules]
        print(json.dumps({{"same": same, "loaded": loaded}}))
        """
    )
    assert found == {"same": True, "loaded": []}


rpc = pytest.importorskip("fxloom.distributed.rpc")


@pytest.mark.skipif(not rpc.rpc_available(), reason="this torch build has no rpc")
def test_rpc_calls_are_traced_and_scheduled_without_importing_the_distributed_package():
    found = run_fresh(
        """
        import json, sys
        import torch, fxloom
        import torch.distributed.rpc as rpc
        from fxloom.passes.schedule import schedule_async

        def rank(dense, ids):
            h = torch.relu(dense)
            embedded = rpc.rpc_sync("ps", torch.neg, args=(ids,))
            return torch.cat([h, embedded], 1)

        gm = schedule_async(fxloom.symbolic_trace(rank))
        calls = [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"]
        print(json.dumps({"calls": calls, "distributed": "fxloom.distributed" in sys.modules}))
        """
    )
    assert found == {"calls": ["rpc_async", "relu", "rpc_wait", "cat"], "distributed": False}


def test_a_saved_program_loads_in_a_process_that_imported_only_fxloom(tmp_path):
    def f(x):
        y = fxloom.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))
        return y * int(x.shape[0])

    x = torch.randn(3)
    path = tmp_path / "traced.fxloom"
    fxloom.save(fxloom.symbolic_trace(f, example_inputs=(x,)), path)
    torch.save(x, tmp_path / "x.pt")
    found = run_fresh(
        f"""
        import json, sys
        import torch, fxloom
        gm = fxloom.load({str(path)!r})
        x = torch.load({str(tmp_path / "x.pt")!r})
        print(json.dumps({{"value": gm(x).tolist()}}))
        """
    )
    assert torch.allclose(torch.tensor(found["value"]), f(x))


def test_an_exported_program_with_dynamic_sizes_loads_in_a_fresh_process(tmp_path):
    from fxloom.export import Dim, export

    model = torch.nn.Linear(4, 2)
    program = export(model, (torch.randn(3, 4),), dynamic_shapes=({0: Dim("batch")},))
    path = tmp_path / "exported.fxloom"
    fxloom.export.save(program, path)
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    found = run_fresh(
        f"""
        import json, sys
        import torch, fxloom
        program = fxloom.export.load({str(path)!r})
        print(json.dumps({{"shape": list(program.module()(torch.randn(5, 4)).shape)}}))
        """
    )
    assert found == {"shape": [5, 2]}
