"""Family 2 of issue 21: a graph that loads fine but runs code when first called.

Every file here is the small traced model (or an exported one) with nodes added whose target
is a private torch helper that imports or loads libraries, a function that changes
process-wide state, a builtin that calls whatever it is given, or an attribute chain that
leaves tensors. Each must be refused while loading, with nothing recorded.
"""

import pytest
import torch
from red_team_files import (
    COMMAND,
    Small,
    call,
    edited,
    exported,
    graph_module_record,
    graph_with,
    insert_before_output,
    os_system_chain,
    ref,
)
from red_team_harness import Case, assert_refused, case, family


def _target(id, target, *args, doc, **kwargs) -> Case:
    def build():
        return graph_with(call("payload", target, *args, **kwargs))

    return Case(id, doc, build)


CASES = [
    _target(
        "torch._import_dotted_name",
        "torch._import_dotted_name",
        "os",
        doc="torch._import_dotted_name('os') imports any module by dotted name",
    ),
    _target(
        "torch._load_global_deps",
        "torch._load_global_deps",
        doc="torch._load_global_deps() loads shared libraries with ctypes",
    ),
    _target(
        "torch.set_default_tensor_type",
        "torch.set_default_tensor_type",
        "torch.DoubleTensor",
        doc="set_default_tensor_type resolves a type by its dotted name and changes the default",
    ),
    _target(
        "torch.manual_seed",
        "torch.manual_seed",
        1234,
        doc="manual_seed resets the process-wide random generator",
    ),
    _target(
        "torch.set_default_dtype",
        "torch.set_default_dtype",
        {"dtype": "float64"},
        doc="set_default_dtype changes every later torch.tensor/zeros of the process",
    ),
    _target(
        "torch.set_num_threads",
        "torch.set_num_threads",
        1,
        doc="set_num_threads changes the process's intra-op thread pool",
    ),
    _target(
        "torch.set_grad_enabled",
        "torch.set_grad_enabled",
        False,
        doc="set_grad_enabled(False) turns autograd off for the caller's thread",
    ),
    _target(
        "torch.set_default_device",
        "torch.set_default_device",
        "meta",
        doc="set_default_device('meta') makes every later factory of the process data-less",
    ),
    _target(
        "torch.use_deterministic_algorithms",
        "torch.use_deterministic_algorithms",
        True,
        doc="use_deterministic_algorithms changes process-wide kernel selection",
    ),
    _target(
        "torch.set_printoptions",
        "torch.set_printoptions",
        1,
        doc="set_printoptions changes how the whole process prints tensors",
    ),
    _target(
        "torch.set_float32_matmul_precision",
        "torch.set_float32_matmul_precision",
        "medium",
        doc="set_float32_matmul_precision lowers matmul precision process-wide",
    ),
    _target(
        "torch.set_flush_denormal",
        "torch.set_flush_denormal",
        True,
        doc="set_flush_denormal changes the CPU's floating-point mode",
    ),
    _target(
        "torch.set_anomaly_enabled",
        "torch.set_anomaly_enabled",
        True,
        doc="set_anomaly_enabled switches autograd anomaly mode for the process",
    ),
    _target(
        "torch.__getattr__",
        "torch.__getattr__",
        "os",
        doc="torch.__getattr__ is torch's lazy importer of submodules",
    ),
    _target(
        "fxloom.pytree.register_pytree_node",
        "fxloom.pytree.register_pytree_node",
        {"function": "builtins.int"},
        {"function": "builtins.list"},
        {"function": "builtins.int"},
        doc="register_pytree_node mutates fxloom's registry of container classes",
    ),
    _target(
        "max-key-import-dotted-name",
        "max",
        ["os"],
        key={"function": "torch._import_dotted_name"},
        doc="max(key=torch._import_dotted_name) calls a function value the file names",
    ),
    _target(
        "sorted-key-manual-seed",
        "sorted",
        [1, 2],
        key={"function": "torch.manual_seed"},
        doc="sorted(key=...) calls whatever function value it is given",
    ),
    _target(
        "min-key-set-num-threads",
        "min",
        [1],
        key={"function": "torch.set_num_threads"},
        doc="min(key=...) calls whatever function value it is given",
    ),
    _target(
        "map-manual-seed",
        "map",
        {"function": "torch.manual_seed"},
        [7],
        doc="map of a file-chosen function",
    ),
    _target(
        "filter-manual-seed",
        "builtins.filter",
        {"function": "torch.manual_seed"},
        [7],
        doc="filter of a file-chosen function",
    ),
]


@case("getattr-chain-numpy-ctypes-os-system")
def numpy_chain_to_os_system():
    """x.numpy().ctypes._ctypes._os.system reached by plain getattr, called by max(key=)"""
    return graph_with(*os_system_chain())


@case("getattr-chain-numpy-ctypes-CDLL")
def numpy_chain_to_cdll():
    """x.numpy().ctypes._ctypes.CDLL reached by getattr, called by max(key=) on None"""
    return graph_with(
        call("arr", "numpy", ref("x"), op="call_method"),
        call("np_ctypes", "getattr", ref("arr"), "ctypes"),
        call("ctypes_module", "getattr", ref("np_ctypes"), "_ctypes"),
        call("cdll", "getattr", ref("ctypes_module"), "CDLL"),
        call("run", "max", [None], key=ref("cdll")),
    )


@case("cond_op-calls-getattr-as-a-branch")
def cond_op_calls_getattr():
    """cond_op(True, getattr, getattr, (x, 'numpy')): the attribute read happens inside the
    branch call, where no getattr node is checked; then cond_op calls the bound method"""
    return graph_with(
        call(
            "numpy_method",
            "fxloom.cond.cond_op",
            True,
            {"function": "getattr"},
            {"function": "getattr"},
            {"tuple": [ref("x"), "numpy"]},
        ),
        call("method", "operator.getitem", ref("numpy_method"), 0),
        call("arr", "fxloom.cond.cond_op", True, ref("method"), ref("method"), {"tuple": []}),
    )


@case("cond_op-calls-a-computed-value")
def cond_op_calls_a_computed_value():
    """a branch that is a value the graph computed (here a table function, passed through)"""
    return graph_with(
        call("pick", "operator.getitem", {"tuple": [{"function": "torch.relu"}]}, 0),
        call("run", "fxloom.cond.cond_op", True, ref("pick"), ref("pick"), {"tuple": [ref("x")]}),
    )


@case("getattr-numpy-tofile-writes-a-file")
def numpy_tofile():
    """x.numpy().tofile reached by getattr writes a file when max(key=) calls it"""
    return graph_with(
        call("arr", "numpy", ref("x"), op="call_method"),
        call("tofile", "getattr", ref("arr"), "tofile"),
        call("run", "max", ["fxloom_red_team_written.bin"], key=ref("tofile")),
    )


@case("getattr-chain-through-numpy-module-to-load")
def numpy_load_chain():
    """getattr chain x.numpy() -> numpy's ctypeslib module -> np.load(allow_pickle) style reach"""
    return graph_with(
        call("arr", "numpy", ref("x"), op="call_method"),
        call("np_ctypes", "getattr", ref("arr"), "ctypes"),
        call("ctypes_module", "getattr", ref("np_ctypes"), "_ctypes"),
        call("os_module", "getattr", ref("ctypes_module"), "_os"),
        call("popen", "getattr", ref("os_module"), "popen"),
        call("run", "max", [COMMAND], key=ref("popen")),
    )


def _method(name: str, doc: str, *args) -> Case:
    def build():
        return graph_with(call("payload", name, ref("x"), *args, op="call_method"))

    return Case(f"call_method-{name}", doc, build)


METHODS = [
    _method("numpy", "Tensor.numpy leaves torch: its result's attributes reach numpy and ctypes"),
    _method("tolist", "Tensor.tolist leaves torch for Python lists"),
    _method("data_ptr", "Tensor.data_ptr exposes a raw address"),
    _method("storage", "Tensor.storage exposes the typed storage object"),
    _method("untyped_storage", "Tensor.untyped_storage exposes raw storage (set_/from_file reach)"),
    _method("_typed_storage", "Tensor._typed_storage is a private storage accessor"),
    _method("__reduce_ex__", "Tensor.__reduce_ex__ is the pickling protocol", 2),
    _method("share_memory_", "Tensor.share_memory_ moves the tensor to a shared-memory file"),
]


@case("cond-branch-wrapped-in-sequential", kind="exported")
def cond_branch_wrapped():
    """an exported cond whose true branch is a Sequential holding a GraphModule that calls
    torch.manual_seed: the verifier only checks submodules that have a .graph"""

    class M(torch.nn.Module):
        def forward(self, x):
            import fxloom

            return fxloom.cond(x.sum() > 0, lambda x: x.relu(), lambda x: x - 1, (x,))

    data = exported(M(), (torch.randn(4, 3),))

    def edit(program):
        root = program["graph_module"]
        branch = root["children"]["true_graph_0"]
        output = branch["graph"]["nodes"].pop()
        branch["graph"]["nodes"].append(call("seed", "torch.manual_seed", 4321))
        branch["graph"]["nodes"].append(output)
        root["children"]["true_graph_0"] = {
            "class": "torch.nn.modules.container.Sequential",
            "training": False,
            "attributes": {},
            "parameters": {},
            "buffers": {},
            "children": {"0": branch},
        }

    return edited(edit, data)


@case("exported-graph-calls-manual-seed", kind="exported")
def exported_manual_seed():
    """an exported program (ATen only, says the verifier) calling torch.manual_seed"""
    data = exported(Small(), (torch.randn(4, 3),))
    return edited(lambda p: insert_before_output(p, call("seed", "torch.manual_seed", 99)), data)


@case("exported-submodule-graph-not-a-cond-branch", kind="exported")
def exported_extra_graph_module():
    """an exported program holding an extra GraphModule child (no get_attr reaches it) whose
    graph calls torch.set_num_threads, reached by call_module"""
    data = exported(Small(), (torch.randn(4, 3),))

    def edit(program):
        root = program["graph_module"]
        root["children"]["hidden"] = graph_module_record(
            call("threads", "torch.set_num_threads", 1)
        )
        insert_before_output(program, call("h", "hidden", ref("x"), op="call_module"))

    return edited(edit, data)


CASES += [
    numpy_chain_to_os_system,
    numpy_chain_to_cdll,
    numpy_tofile,
    numpy_load_chain,
    cond_op_calls_getattr,
    cond_op_calls_a_computed_value,
    *METHODS,
    cond_branch_wrapped,
    exported_manual_seed,
    exported_extra_graph_module,
]
family("family2", CASES)


@pytest.mark.parametrize("attack", CASES, ids=[c.id for c in CASES])
def test_code_at_first_call_is_refused_while_loading(attack, verdicts):
    """The file is refused by fxloom.load (SerializationError), nothing recorded, no crash."""
    assert_refused(verdicts, attack)
