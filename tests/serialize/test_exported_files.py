"""``fxloom.export.save`` / ``fxloom.export.load``: an exported program comes back whole.

Each round trip checks the loaded program against the original structurally
(``str(ep)``, the signature, ``range_constraints``, ``size_ranges()``) and
numerically (``ep.module()`` gives the same outputs, at the examples' sizes and,
for dynamic programs, at others). ``torch.export.save``/``load`` of the same model
runs beside it as the peer.
"""

from __future__ import annotations

import functools
import io
import json
import zipfile

import pytest
import torch
import torch.export
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fxloom
from benchmarks.zoo.methods import fixed_args
from benchmarks.zoo.registry import get
from benchmarks.zoo.worker import tensor_leaves
from fxloom import zoo
from fxloom.export import Dim, ExportedProgram, export, load, save, unflatten
from fxloom.serialize import SerializationError


def round_trip(ep: ExportedProgram) -> ExportedProgram:
    """``ep`` saved and loaded again, after checking the loaded program is the same program."""
    buffer = io.BytesIO()
    save(ep, buffer)
    loaded = load(buffer.getvalue())
    assert str(loaded) == str(ep)
    assert loaded.graph_signature == ep.graph_signature
    assert loaded.range_constraints == ep.range_constraints
    assert loaded.size_ranges() == ep.size_ranges()
    assert loaded.arg_names == ep.arg_names
    assert loaded.module_hierarchy == ep.module_hierarchy
    assert loaded.shape_constraints == ep.shape_constraints
    assert loaded.state_dict.keys() == ep.state_dict.keys()
    for name, tensor in ep.state_dict.items():
        assert torch.equal(loaded.state_dict[name], tensor)
        assert type(loaded.state_dict[name]) is type(tensor)
    return loaded


def assert_same_outputs(got, expected) -> None:
    for ours, theirs in zip(tensor_leaves(got), tensor_leaves(expected), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


# ------------------------------------------------------------------ embedded models


@pytest.mark.parametrize("name", ["mlp_tiny", "resnet_tiny", "transformer_tiny", "cnn_small"])
def test_zoo_models_round_trip_structurally_and_numerically(name):
    model, inputs = zoo.build(name)
    model.eval()
    ep = export(model, inputs)
    loaded = round_trip(ep)
    with torch.no_grad():
        assert_same_outputs(loaded.module()(*inputs), ep.module()(*inputs))


def test_loaded_values_are_stand_ins_as_export_makes_them():
    model, inputs = zoo.build("mlp_tiny")
    ep = export(model, inputs)
    loaded = round_trip(ep)
    for old, new in zip(ep.graph.nodes, loaded.graph.nodes):
        assert type(new.meta.get("val")) is type(old.meta.get("val"))
        assert new.meta.keys() == old.meta.keys()


def test_save_and_load_take_a_path(tmp_path):
    model, inputs = zoo.build("mlp_tiny")
    ep = export(model, inputs)
    save(ep, tmp_path / "mlp.fxl")
    assert str(load(str(tmp_path / "mlp.fxl"))) == str(ep)


def test_a_stand_in_keeps_the_device_of_the_value_it_describes():
    from fxloom.serialize.meta import decode_meta, encode_meta
    from fxloom.serialize.symbols import SymbolicCodecs
    from fxloom.values.stand_in import StandIn

    on_gpu = StandIn(torch.empty(2, 3, device="meta"), torch.device("cuda", 1))
    codecs = SymbolicCodecs(None)
    loaded = decode_meta(encode_meta({"val": on_gpu}, codecs, "val"), codecs, "val")["val"]
    assert isinstance(loaded, StandIn) and loaded.device == torch.device("cuda", 1)


def test_the_example_inputs_are_saved():
    model, inputs = zoo.build("mlp_tiny")
    loaded = round_trip(export(model, inputs))
    (args, kwargs) = loaded.example_inputs
    assert kwargs == {} and all(torch.equal(a, b) for a, b in zip(args, inputs, strict=True))


def test_analyze_cost_and_run_decompositions_work_on_a_loaded_program():
    from fxloom.passes.cost import analyze_cost

    model, inputs = zoo.build("resnet_tiny")
    ep = export(model.eval(), inputs)
    loaded = round_trip(ep)
    assert str(analyze_cost(loaded.graph_module)) == str(analyze_cost(ep.graph_module))
    decomposed = loaded.run_decompositions()
    assert str(decomposed) == str(ep.run_decompositions())


def test_a_loaded_program_translates_to_the_same_onnx_model():
    pytest.importorskip("onnx")
    from fxloom.lower import translate

    model, inputs = zoo.build("resnet_tiny")
    ep = export(model.eval(), inputs)
    ours = translate(round_trip(ep), inputs)
    assert ours.SerializeToString() == translate(ep, inputs).SerializeToString()


def test_a_program_after_run_decompositions_round_trips():
    model, inputs = zoo.build("transformer_tiny")
    core = export(model.eval(), inputs).run_decompositions()
    loaded = round_trip(core)
    with torch.no_grad():
        assert_same_outputs(loaded.module()(*inputs), core.module()(*inputs))


# ------------------------------------------------------------------ dynamic sizes


class Flatten(nn.Module):
    def forward(self, x):
        return x.view(x.shape[0], -1) * torch.arange(x.shape[1] * x.shape[2])


def test_symbolic_sizes_come_back_as_sizes_of_the_loaded_shape_env():
    ep = export(Flatten(), (torch.randn(4, 3, 5),), dynamic_shapes={"x": {0: Dim("b", max=64)}})
    loaded = round_trip(ep)
    (x,) = loaded.graph.find_nodes(op="placeholder")
    assert str(x.meta["val"].shape) == "torch.Size([s0, 3, 5])"
    assert x.meta["val"].shape[0].node.env is loaded.shape_env
    assert loaded.shape_env.symbols.keys() == ep.shape_env.symbols.keys()
    for size in (2, 9, 64):
        x = torch.randn(size, 3, 5)
        assert torch.equal(loaded.module()(x), Flatten()(x))


def test_a_loaded_dynamic_program_refuses_sizes_outside_the_dim_naming_it():
    ep = export(Flatten(), (torch.randn(4, 3, 5),), dynamic_shapes={"x": {0: Dim("b", max=64)}})
    module = round_trip(ep).module()
    with pytest.raises(ValueError, match=r"input 'x': dimension 0 is 65, outside .*Dim 'b'"):
        module(torch.randn(65, 3, 5))


class Positive(nn.Module):
    def forward(self, x):
        rows = x.nonzero()
        count = rows.shape[0]
        torch._check(count >= 1)
        return rows.float().sum(0) / count, torch.zeros(count - 1), x[x > 0] * x.max().item()


def test_data_dependent_sizes_and_their_runtime_assertions_round_trip():
    ep = export(Positive(), (torch.tensor([1.0, -2.0, 3.0, 0.0]),))
    loaded = round_trip(ep)
    assert len(loaded.shape_env.deferred_assertions) == len(ep.shape_env.deferred_assertions)
    module = loaded.module()
    for x in (torch.tensor([0.0, 5.0, -1.0, 2.0]), torch.tensor([4.0, 0.0, 0.0, 0.0, 3.0])[:4]):
        assert_same_outputs(module(x), Positive()(x))
    with pytest.raises(RuntimeError, match=r"torch._check\(count >= 1\)"):
        module(torch.zeros(4))


class Halves(nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[0] // 2, 2, -1).sum(1)


def test_divisibility_and_auto_ranges_round_trip():
    ep = export(Halves(), (torch.randn(6, 3),), dynamic_shapes={"x": {0: Dim.AUTO}})
    loaded = round_trip(ep)
    assert loaded.shape_env.divisible == ep.shape_env.divisible
    for size in (2, 8):
        x = torch.randn(size, 3)
        assert torch.equal(loaded.module()(x), Halves()(x))
    with pytest.raises((ValueError, RuntimeError)):
        loaded.module()(torch.randn(5, 3))


# ------------------------------------------------------------------ cond, state, unflatten


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("offset", torch.full((3,), 0.5))

    def forward(self, x):
        return fxloom.cond(
            x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: x - self.offset, (x,)
        )


def test_a_cond_program_keeps_both_branches():
    ep = export(Gate(), (torch.ones(2, 3),))
    loaded = round_trip(ep)
    for x in (torch.ones(2, 3), -torch.ones(2, 3)):
        assert torch.equal(loaded.module()(x), ep.module()(x))


def test_buffers_written_in_training_mode_are_written_by_the_loaded_module():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).train()
    x = torch.randn(8, 3)
    ep = export(model, (x,))
    loaded = round_trip(ep)
    assert loaded.graph_signature.buffers_to_mutate == ep.graph_signature.buffers_to_mutate
    ours, theirs = loaded.module(), ep.module()
    assert_same_outputs(ours(x), theirs(x))
    for name, buffer in theirs.named_buffers():
        assert torch.equal(ours.get_buffer(name), buffer), name


def test_unflatten_of_a_loaded_program_rebuilds_the_module_tree():
    model, inputs = zoo.build("resnet_tiny")
    ep = export(model.eval(), inputs)
    tree = unflatten(round_trip(ep))
    expected = unflatten(ep)
    assert [n for n, _ in tree.named_modules()] == [n for n, _ in expected.named_modules()]
    assert [type(m).__name__ for m in tree.modules()] == [
        type(m).__name__ for m in expected.modules()
    ]
    with torch.no_grad():
        assert_same_outputs(tree(*inputs), expected(*inputs))


def test_classes_that_are_not_imported_are_kept_by_name():
    ep = export(Flatten(), (torch.randn(4, 3, 5),))
    buffer = io.BytesIO()
    save(ep, buffer)
    renamed = _edited(buffer.getvalue(), lambda text: text.replace("Flatten", "NotImported"))
    loaded = load(renamed)
    assert loaded.module_hierarchy[""] == f"{__name__}.NotImported"
    assert type(unflatten(loaded)).__name__ == "NotImported"


def test_a_module_file_naming_the_size_check_by_its_name_before_it_moved_loads_and_checks():
    # The exported module's graph calls check_sizes; files written before issue 23 name it
    # fxloom.export.size_checks.check_sizes.
    ep = export(Flatten(), (torch.randn(4, 3, 5),), dynamic_shapes={"x": {0: Dim("b", max=64)}})
    buffer = io.BytesIO()
    fxloom.save(ep.module(), buffer)
    moved, before = "fxloom.values.symbolic.size_checks.check_sizes", "fxloom.export.size_checks"
    out = io.BytesIO()
    with zipfile.ZipFile(buffer) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            content = source.read(info.filename)
            if info.filename.endswith(".json") and moved.encode() in content:
                content = content.replace(moved.encode(), f"{before}.check_sizes".encode())
                before = None  # renamed
            target.writestr(info.filename, content)
    assert before is None, "the saved module does not call check_sizes"
    module = fxloom.load(out.getvalue())
    assert torch.equal(module(torch.ones(8, 3, 5)), Flatten()(torch.ones(8, 3, 5)))
    with pytest.raises(ValueError, match="'b'"):
        module(torch.ones(65, 3, 5))


# ------------------------------------------------------------------ Hugging Face


@pytest.fixture(scope="module", params=["bert", "gpt2"])
def hf_model(request):
    model, inputs = get(request.param).build()
    return request.param, model, inputs, fixed_args(model, inputs)


def test_hugging_face_models_round_trip_static(hf_model):
    name, model, inputs, fixed = hf_model
    ep = export(model, (), {**inputs, **fixed})
    loaded = round_trip(ep)
    with torch.no_grad():
        assert_same_outputs(loaded.module()(**inputs, **fixed), ep.module()(**inputs, **fixed))


def test_hugging_face_models_round_trip_with_dynamic_batch_and_sequence(hf_model):
    name, model, inputs, fixed = hf_model
    batch, seq = Dim("batch", max=16), Dim("seq", max=64)
    dynamic = {key: {0: batch, 1: seq} for key in inputs}
    ep = export(model, (), {**inputs, **fixed}, dynamic_shapes=dynamic)
    module = round_trip(ep).module()
    with torch.no_grad():
        for size in [(2, 7), (3, 5), (16, 64)]:
            given = get(name).make_inputs(*size)
            assert_same_outputs(module(**given, **fixed), model(**given, **fixed))
    with pytest.raises(ValueError, match=r"input 'input_ids': dimension 1 is 65, .*'seq'"):
        module(**get(name).make_inputs(2, 65), **fixed)


# ------------------------------------------------------------------ the peer


def test_torch_export_save_and_load_give_the_same_outputs_as_ours():
    model, inputs = zoo.build("transformer_tiny")
    model.eval()
    ours, theirs = io.BytesIO(), io.BytesIO()
    save(export(model, inputs), ours)
    torch.export.save(torch.export.export(model, inputs), theirs)
    theirs.seek(0)
    with torch.no_grad():
        assert_same_outputs(
            load(ours.getvalue()).module()(*inputs), torch.export.load(theirs).module()(*inputs)
        )


# ------------------------------------------------------------------ refusals


def _edited(data: bytes, edit) -> bytes:
    """The file with its program.json rewritten by ``edit`` (text to text)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            content = source.read(info.filename)
            if info.filename.endswith("program.json"):
                content = edit(content.decode()).encode()
            target.writestr(info.filename, content)
    return out.getvalue()


def _saved_dynamic() -> bytes:
    ep = export(Flatten(), (torch.randn(4, 3, 5),), dynamic_shapes={"x": {0: Dim("b", max=64)}})
    buffer = io.BytesIO()
    save(ep, buffer)
    return buffer.getvalue()


def _with_program(data: bytes, change) -> bytes:
    def edit(text: str) -> str:
        program = json.loads(text)
        change(program)
        return json.dumps(program)

    return _edited(data, edit)


def test_an_expression_naming_a_sympy_class_off_the_list_is_refused():
    def sneak(program):
        program["shape_env"]["facts"].append({"op": "Function", "args": ["os.system"]})

    with pytest.raises(SerializationError, match="invalid expression"):
        load(_with_program(_saved_dynamic(), sneak))


def test_an_expression_asking_for_a_huge_power_is_refused():
    def huge(program):
        program["shape_env"]["facts"].append({"op": "Pow", "args": [10, 10**12]})

    with pytest.raises(SerializationError, match="too large"):
        load(_with_program(_saved_dynamic(), huge))


def test_a_program_that_breaks_the_export_verifier_is_refused():
    def rename(program):
        program["graph_signature"]["inputs"][0]["arg"] = {"tensor": "y"}

    with pytest.raises(SerializationError, match="Export IR's rules.*signature names this input"):
        load(_with_program(_saved_dynamic(), rename))


def test_a_parameter_name_that_is_not_an_identifier_is_refused():
    def inject(program):
        program["arg_names"][0]["name"] = "x):\n    import os #"

    with pytest.raises(SerializationError, match="not a valid identifier"):
        load(_with_program(_saved_dynamic(), inject))


def test_each_loader_points_to_the_other_for_the_other_kind_of_file():
    graph_module_file, exported_file = io.BytesIO(), io.BytesIO()
    fxloom.save(fxloom.symbolic_trace(nn.ReLU()), graph_module_file)
    save(export(nn.ReLU(), (torch.randn(2),)), exported_file)
    with pytest.raises(SerializationError, match="fxloom.load"):
        load(graph_module_file.getvalue())
    with pytest.raises(SerializationError, match="fxloom.export.load"):
        fxloom.load(exported_file.getvalue())


def test_save_takes_an_exported_program():
    with pytest.raises(TypeError, match="fxloom.save"):
        save(fxloom.symbolic_trace(nn.ReLU()), io.BytesIO())


# ------------------------------------------------------------------ expressions


def test_every_kind_of_expression_a_shape_env_makes_reads_back_equal():
    import sympy

    from fxloom.serialize.symbols import decode_expr, encode_expr

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    i0 = sympy.Symbol("i0", integer=True, nonnegative=True)
    symbols = {"s0": s0, "i0": i0}
    expressions = [
        2 * s0 + 1,
        sympy.floor(s0 / 3) * i0 - sympy.Rational(1, 2),
        sympy.Mod(s0, 4),
        sympy.Max(s0, i0 + 2),
        sympy.And(sympy.Ge(s0, 2), sympy.Not(sympy.Eq(i0, 3))),
        sympy.Piecewise((s0, sympy.Lt(i0, 5)), (i0, True)),
        s0**2 * sympy.Float(0.5),
        sympy.oo,
    ]
    for expr in expressions:
        data = json.loads(json.dumps(encode_expr(expr)))
        assert decode_expr(data, symbols, "test") == expr


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_mutated_file_loads_or_is_refused_with_serialization_error(data):
    original = _saved_dynamic_cached()
    with zipfile.ZipFile(io.BytesIO(original)) as z:
        program = json.loads(z.read("fxloom/program.json"))
    places = list(_places(program))
    for _ in range(data.draw(st.integers(1, 3))):
        container, key = data.draw(st.sampled_from(places))
        container[key] = data.draw(_JUNK)
    try:
        loaded = load(_edited(original, lambda _: json.dumps(program)))
    except SerializationError:
        return
    assert isinstance(loaded, ExportedProgram)


_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from(["s0", "oo", "x", "os.system", "__import__('os')", ""]),
    st.just({"symbol": "s7"}),
    st.just({"op": "Pow", "args": [2, 10**9]}),
    st.just({"op": "Max", "args": [True, 1]}),
    st.lists(st.integers(), max_size=3),
)


@functools.cache
def _saved_dynamic_cached() -> bytes:
    return _saved_dynamic()


def _places(obj):
    """Every (container, key) of a JSON document."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    for key, value in items:
        yield obj, key
        if isinstance(value, (dict, list)):
            yield from _places(value)


# ------------------------------------------------------------------ literal defaults
class Scaled(nn.Module):
    def forward(self, x, scale=(1.0, 2.0), flag=True):
        return x * scale[0] if flag else x


def test_a_literal_default_of_any_kind_the_ir_prints_is_kept_and_saved():
    ep = export(Scaled(), (torch.ones(2),))
    assert ep.arg_names == ["x", "scale=(1.0, 2.0)", "flag=True"]
    assert round_trip(ep).arg_names == ep.arg_names
