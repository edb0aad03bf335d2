"""What a graph from a file may call and read is one closed table (fxloom.serialize.call_table):
a name outside it is refused whatever it prints as, and every entry was decided by a rule."""

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import fxloom
from fxloom.ops.runtime_functions import RUNTIME_FUNCTIONS, runtime_function
from fxloom.serialize import allowlist, attribute_table, call_table, torch_names
from fxloom.serialize.errors import SerializationError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.serialize import torch_functions_rules  # noqa: E402

PINNED_TORCH = next(
    line.split("==")[1].strip()
    for line in (Path(__file__).resolve().parents[2] / "constraints.txt").read_text().splitlines()
    if line.startswith("torch==")
)


# ------------------------------------------------------------------ the table
@pytest.mark.skipif(
    torch.__version__.split("+")[0] != PINNED_TORCH,
    reason="the lists are written for the pinned torch; regenerate them for another",
)
def test_the_torch_lists_are_what_the_reviewed_rules_give_on_the_pinned_torch():
    assert sorted(torch_names.TORCH_FUNCTIONS) == torch_functions_rules.allowed_names()
    assert sorted(torch_names.TENSOR_METHODS) == torch_functions_rules.allowed_methods()


_ROWS = RUNTIME_FUNCTIONS.values()


@pytest.mark.parametrize(
    "name", sorted(row.name for row in _ROWS if row.alias_of is None and not row.instances)
)
def test_every_runtime_function_row_names_a_function_that_prints_as_its_name(name):
    found = allowlist.find_callable(name)
    assert found is not allowlist.MISSING
    assert fxloom._format.qualified_name(found) == name
    assert runtime_function(found) is RUNTIME_FUNCTIONS[name]


@pytest.mark.parametrize("name", sorted(row.name for row in _ROWS if row.alias_of is not None))
def test_a_name_saved_before_a_function_moved_loads_as_the_function_it_moved_to(name):
    moved_to = RUNTIME_FUNCTIONS[name].alias_of
    assert allowlist.find_callable(name) is allowlist.find_callable(moved_to)


@pytest.mark.parametrize("name", sorted(row.name for row in _ROWS if row.instances))
def test_a_class_whose_instances_are_checks_is_never_called_from_a_file(name):
    # Its instances hold Python objects (a fixed config, a tree spec): they are not saved.
    assert allowlist.find_callable(name) is allowlist.MISSING


@pytest.mark.parametrize("name", sorted(row.twin for row in _ROWS if row.twin is not None))
def test_every_torchscript_twin_a_row_names_exists(name):
    module, _, attr = name.rpartition(".")
    assert callable(vars(__import__(module, fromlist=[attr]))[attr])


@pytest.mark.parametrize(
    "name",
    [
        "torch._import_dotted_name",  # imports any module by dotted name
        "torch._load_global_deps",  # loads shared libraries
        "torch.set_default_tensor_type",
        "torch.set_default_dtype",
        "torch.manual_seed",
        "torch.set_num_threads",
        "torch.set_grad_enabled",
        "torch.__getattr__",
        "torch.load",
        "torch.from_file",
        "torch.vmap",  # calls the function it is given
        "torch.sparse_coo_tensor",  # unchecked unless asked
        "torch.os.system",
        "fxloom.pytree.register_pytree_node",
        "fxloom.serialize.allowlist.register_serializable",
        "operator.attrgetter",
        "operator.methodcaller",
        "operator.call",
        "map",
        "filter",
        "eval",
        "open",
        "builtins.__import__",
        "os.system",
        "torch.ops.aten.from_file.default",
        "torch.ops.aten._sparse_coo_tensor_with_dims_and_tensors.default",
        "torch.ops.aten._reshape_alias.default",  # a view unchecked against its storage
        "torch.ops.aten.add_.Tensor",  # writes to its input
        "torch.ops.aten.add.out",
        "torch.ops.quantized.linear_prepack.default",  # not an elementwise quantized kernel
        "torch.ops.aten.manual_seed.default",
        "torch.ops.aten._print.default",
        "torch.ops.profiler._record_function_enter.default",
        "torch.ops.aten.max_pool2d_with_indices_backward.default",
    ],
)
def test_names_outside_the_table_are_refused(name):
    assert allowlist.find_callable(name) is allowlist.MISSING
    with pytest.raises(SerializationError, match="not allowed|refused|allow"):
        allowlist.resolve_callable(name)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("torch.relu", torch.relu),
        ("torch._C._nn.gelu", torch.nn.functional.gelu),
        ("torch.nn.functional.relu", torch.nn.functional.relu),
        ("torch.ops.aten.add.Tensor", torch.ops.aten.add.Tensor),
        ("torch.ops.aten._unsafe_view.default", torch.ops.aten._unsafe_view.default),
        ("torch.ops.aten._assert_scalar.default", torch.ops.aten._assert_scalar.default),
        ("torch._assert", torch._assert),
        ("torch.Size", torch.Size),
        ("torch.return_types.max", torch.return_types.max),
        ("operator.add", __import__("operator").add),
        ("math.sqrt", __import__("math").sqrt),
        ("getattr", getattr),
        ("fxloom.cond.cond_op", fxloom.cond_op),
        ("fxloom.guards.check_bool", __import__("fxloom.guards").guards.check_bool),
    ],
)
def test_names_in_the_table_resolve_to_what_they_print_as(name, expected):
    assert allowlist.resolve_callable(name) is expected


def test_a_packet_call_is_refused_where_its_arguments_could_pick_a_writing_overload():
    add = torch.ops.quantized.add
    assert call_table.packet_call_refusal(add, 4, {}) is None  # add(qa, qb, scale, zero_point)
    assert "'out'" in call_table.packet_call_refusal(add, 3, {})  # add.out(qa, qb, out)
    assert "'out'" in call_table.packet_call_refusal(torch.ops.aten.add, 2, {"out"})
    graph = fxloom.Graph()
    a, b, c = (graph.placeholder(name) for name in "abc")
    with pytest.raises(SerializationError, match="could call its overload 'out'"):
        allowlist.check_call(add, (a, b, c))


def test_a_refused_operator_says_which_rule_refused_it():
    assert "writes to its arguments" in call_table.operator_refusal(torch.ops.aten.add_.Tensor)
    assert "sparse" in call_table.operator_refusal(
        torch.ops.aten._sparse_coo_tensor_with_dims_and_tensors.default
    )
    assert "namespace" in call_table.operator_refusal(
        torch.ops.profiler._record_function_enter.default
    )
    assert call_table.operator_refusal(torch.ops.aten.mm.default) is None


@pytest.mark.parametrize(
    "method", ["numpy", "data_ptr", "storage", "untyped_storage", "register_hook", "apply_",
               "map_", "share_memory_", "backward", "tolist", "set_", "as_subclass", "__reduce_ex__",
               "__setstate__", "__array__", "__dlpack__", "_typed_storage"]
)  # fmt: skip
def test_tensor_methods_that_leave_torch_or_call_functions_are_refused(method):
    assert not allowlist.allowed_method(method)


@pytest.mark.parametrize("method", ["add", "view", "size", "to", "item", "__getitem__", "__radd__"])
def test_tensor_methods_that_compute_are_allowed(method):
    assert allowlist.allowed_method(method)


# ------------------------------------------------------------ attribute reads
@pytest.mark.parametrize("name", ["numpy", "ctypes", "grad_fn", "__class__", "f_globals", "system"])
def test_getattr_of_an_attribute_outside_the_tables_is_refused(name):
    with pytest.raises(SerializationError, match="not allowed"):
        allowlist.check_call(getattr, (None, name))


def test_getattr_of_a_tensor_attribute_or_a_registered_container_field_is_allowed():
    for name in ("shape", "dtype", "T", "device", "values", "indices"):
        allowlist.check_call(getattr, (None, name))
    transformers = pytest.importorskip("transformers")
    assert transformers.modeling_outputs.BaseModelOutput  # registered with torch's pytree
    allowlist.check_call(getattr, (None, "last_hidden_state"))


def test_builtins_refuse_a_function_to_call():
    with pytest.raises(SerializationError, match="key"):
        allowlist.check_call(max, ((1, 2),), {"key": abs})
    allowlist.check_call(max, ((1, 2),), {})


SAMPLES = {
    "tensor": torch.randn(2, 3, requires_grad=True),
    "dtype": torch.float32,
    "device": torch.device("cpu"),
    "finfo": torch.finfo(torch.float32),
}


@pytest.mark.parametrize("kind", sorted(attribute_table.READABLE_ATTRIBUTES))
def test_every_readable_attribute_leads_to_tensors_sizes_and_plain_values_only(kind):
    """The tables are closed: no chain of allowed reads leaves the value kinds."""
    for name in attribute_table.READABLE_ATTRIBUTES[kind]:
        try:
            value = getattr(SAMPLES[kind], name)
        except (AttributeError, RuntimeError):  # not on this torch, or not for this dtype
            continue
        assert isinstance(value, attribute_table.VALUE_KINDS), (kind, name, type(value))


# ---------------------------------------------------------- export verifier
class WithCond(nn.Module):
    def forward(self, x):
        return fxloom.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))


def test_a_cond_program_loads_in_a_fresh_process_whatever_was_imported(tmp_path):
    ep = fxloom.export.export(WithCond(), (torch.randn(3),))
    path = tmp_path / "cond.fxl"
    fxloom.export.save(ep, path)
    code = textwrap.dedent(
        f"""
        import torch, fxloom.export
        ep = fxloom.export.load({str(path)!r})
        x = torch.randn(3).abs()
        assert torch.allclose(ep.module()(x), x.sin()), "wrong branch"
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_the_verifier_refuses_a_cond_branch_wrapped_in_another_module():
    ep = fxloom.export.export(WithCond(), (torch.randn(3),))
    gm = ep.graph_module
    branch = next(n.target for n in gm.graph.nodes if n.op == "get_attr")
    setattr(gm, branch, nn.Sequential(getattr(gm, branch)))
    with pytest.raises(fxloom.export.ExportVerifierError, match="cond branch"):
        fxloom.export.verify(ep)


def test_the_verifier_refuses_a_module_holding_a_graph_that_no_get_attr_reads():
    ep = fxloom.export.export(WithCond(), (torch.randn(3),))
    ep.graph_module.stowaway = fxloom.symbolic_trace(nn.ReLU())
    with pytest.raises(fxloom.export.ExportVerifierError, match="stowaway"):
        fxloom.export.verify(ep)


def test_saving_refuses_a_graph_that_loading_would_refuse():
    gm = fxloom.symbolic_trace(nn.ReLU())
    node = next(n for n in gm.graph.nodes if n.op == "call_function" or n.op == "call_module")
    with gm.graph.inserting_after(node):
        gm.graph.call_function(torch.manual_seed, (0,))
    gm.recompile()
    with pytest.raises(SerializationError, match="manual_seed"):
        fxloom.save(gm, io.BytesIO())


class CallsNumpy(nn.Module):
    def forward(self, x):
        return x.numpy()


class ReadsAnAttributeOutsideTheTables(nn.Module):
    def forward(self, x):
        return x.grad_fn


@pytest.mark.parametrize("model", [CallsNumpy(), ReadsAnAttributeOutsideTheTables()])
def test_saving_refuses_methods_and_attributes_that_loading_would_refuse(model):
    gm = fxloom.symbolic_trace(model)
    with pytest.raises(SerializationError, match="numpy|grad_fn"):
        fxloom.save(gm, io.BytesIO())


def test_cond_op_calls_only_graphs_of_the_file_never_function_values():
    """A branch that is a function value would run a getattr the table never sees."""
    graph = fxloom.Graph()
    x = graph.placeholder("x")
    with pytest.raises(SerializationError, match="must be a graph of the file"):
        allowlist.check_call(fxloom.cond_op, (True, getattr, getattr, (x, "numpy")))
    branch = graph.get_attr("true_graph_0")
    allowlist.check_call(fxloom.cond_op, (True, branch, branch, (x,)))


def test_a_file_saved_with_the_old_names_of_the_input_checks_loads(tmp_path):
    # Files written before the input checks of both frontends moved to fxloom.runtime_checks
    # name them where they were: fxloom.guards and fxloom.export.input_checks.
    import json

    from hostile import PROGRAM, member, rewrite

    class Flagged(nn.Module):
        def forward(self, x, scale=True):
            return x * 2 if scale else x

    gm = fxloom.symbolic_trace(Flagged(), {"scale": True}, example_inputs={"x": torch.ones(2)})
    exported = fxloom.export.export(nn.Linear(2, 2), (torch.ones(1, 2),)).module()
    for module, old in [
        (gm, "fxloom.guards"),
        (exported, "fxloom.export.input_checks"),
    ]:
        buffer = io.BytesIO()
        fxloom.save(module, buffer)
        text = member(buffer.getvalue(), PROGRAM).decode()
        assert "fxloom.runtime_checks." in text
        old_file = rewrite(
            buffer.getvalue(), PROGRAM, text.replace("fxloom.runtime_checks.", f"{old}.").encode()
        )
        assert f"{old}.check_" in json.dumps(json.loads(member(old_file, PROGRAM)))
        loaded = fxloom.load(io.BytesIO(old_file))
        checks = {n.target for n in loaded.graph.nodes if n.op == "call_function"}
        assert checks & {
            fxloom.runtime_checks.check_tensor_input,
            fxloom.runtime_checks.check_tensor,
        }
        with pytest.raises((TypeError, ValueError), match="int64"):
            loaded(torch.ones(1, 2, dtype=torch.int64))
