"""``GraphModule``: attribute copying, lazy code generation, submodules, copies, pickling,
``to_folder`` and error notes."""

from __future__ import annotations

import copy
import gc
import inspect
import operator
import pickle
import pickletools
import subprocess
import sys
import textwrap
import traceback
import weakref

import pytest
import torch
from torch.testing import assert_close

import fxloom as fx
import fxloom.graph_module
from fxloom._notes import notes_of


class Net(torch.nn.Module):
    """A small model with every kind of state a GraphModule must carry over."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)
        self.seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        self.scale = torch.nn.Parameter(torch.rand(4))
        self.register_buffer("shift", torch.arange(4.0))
        self.register_buffer("bias_np", torch.full((4,), 0.5), persistent=False)
        self.unused = torch.nn.Linear(3, 3)
        self.register_buffer("unused_buffer", torch.zeros(1))

    def forward(self, x):
        h = self.lin(x) * self.scale + self.shift + self.bias_np
        return self.seq(h)


def net_graph() -> fx.Graph:
    """``Net.forward`` built by hand."""
    g = fx.Graph()
    x = g.placeholder("x")
    lin = g.call_module("lin", (x,))
    scale = g.get_attr("scale")
    mul = g.call_function(operator.mul, (lin, scale))
    shift = g.get_attr("shift")
    add = g.call_function(operator.add, (mul, shift))
    bias = g.get_attr("bias_np")
    add_1 = g.call_function(operator.add, (add, bias))
    g.output(g.call_module("seq", (add_1,)))
    return g


def relu_graph() -> fx.Graph:
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.relu, (x,)))
    return g


def find(graph: fx.Graph, name: str) -> fx.Node:
    return next(n for n in graph.nodes if n.name == name)


# ------------------------------------------------------------ construction
def test_graph_module_matches_eager():
    net = Net()
    gm = fx.GraphModule(net, net_graph())
    x = torch.randn(2, 3)
    assert_close(gm(x), net(x))


def test_only_referenced_attributes_are_copied():
    gm = fx.GraphModule(Net(), net_graph())
    assert set(dict(gm.named_children())) == {"lin", "seq"}
    assert not hasattr(gm, "unused")
    assert not hasattr(gm, "unused_buffer")


def test_parameters_stay_parameters_and_are_shared_with_the_root():
    net = Net()
    gm = fx.GraphModule(net, net_graph())
    assert dict(gm.named_parameters())["scale"] is net.scale
    assert isinstance(gm.scale, torch.nn.Parameter)
    assert gm.lin is net.lin


def test_buffers_stay_buffers_with_their_persistence():
    gm = fx.GraphModule(Net(), net_graph())
    assert set(dict(gm.named_buffers())) == {"shift", "bias_np"}
    state = gm.state_dict()
    assert "shift" in state
    assert "bias_np" not in state


def test_intermediate_submodules_are_plain_modules_holding_only_what_is_used():
    net = Net()
    g = fx.Graph()
    x = g.placeholder("x")
    h = g.call_module("seq.0", (x,))
    g.output(g.call_module("seq.1", (h,)))
    gm = fx.GraphModule(net, g)
    assert type(gm.seq) is torch.nn.Module
    assert gm.seq.get_submodule("0") is net.seq[0]
    t = torch.randn(2, 4)
    assert_close(gm(t), net.seq(t))


def test_nested_buffer_keeps_its_persistence_under_a_created_parent():
    root = torch.nn.Module()
    root.block = torch.nn.Module()
    root.block.register_buffer("mask", torch.ones(2), persistent=False)
    g = fx.Graph()
    g.output(g.get_attr("block.mask"))
    gm = fx.GraphModule(root, g)
    assert "block.mask" in dict(gm.named_buffers())
    assert "block.mask" not in gm.state_dict()


def test_training_mode_is_copied_from_the_root():
    net = Net().eval()
    assert fx.GraphModule(net, net_graph()).training is False


def test_dict_root_installs_each_qualified_name():
    lin = torch.nn.Linear(3, 3)
    weight = torch.nn.Parameter(torch.ones(3))
    g = fx.Graph()
    x = g.placeholder("x")
    h = g.call_module("block.lin", (x,))
    w = g.get_attr("block.weight")
    c = g.get_attr("const")
    g.output(g.call_function(operator.add, (g.call_function(operator.mul, (h, w)), c)))
    gm = fx.GraphModule(
        {"block.lin": lin, "block.weight": weight, "const": torch.full((3,), 2.0)}, g
    )
    assert gm.block.lin is lin
    assert dict(gm.named_parameters())["block.weight"] is weight
    assert "const" in dict(gm.named_buffers())
    t = torch.randn(2, 3)
    assert_close(gm(t), lin(t) * weight + 2.0)


def test_missing_module_target_names_the_node_and_the_target():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("linn", (x,)))
    with pytest.raises(
        AttributeError, match=r"%linn \(call_module\) refers to 'linn'.*Net.*did you mean 'lin'"
    ):
        fx.GraphModule(Net(), g)


def test_missing_attribute_target_names_the_node_and_the_target():
    g = fx.Graph()
    g.output(g.get_attr("lin.wieght"))
    with pytest.raises(
        AttributeError, match=r"%lin_wieght \(get_attr\) refers to 'lin.wieght'.*'weight'"
    ):
        fx.GraphModule(Net(), g)


def test_missing_dict_key_names_the_node_the_target_and_the_keys():
    g = fx.Graph()
    g.output(g.get_attr("missing"))
    with pytest.raises(KeyError, match=r"%missing \(get_attr\) refers to 'missing'.*keys: a, b"):
        fx.GraphModule({"b": torch.ones(1), "a": torch.ones(1)}, g)


def test_calling_a_non_module_is_refused_at_construction():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("scale", (x,)))
    with pytest.raises(
        TypeError, match=r"%scale calls 'scale' as a module, but in Net it is a Parameter"
    ):
        fx.GraphModule(Net(), g)


def test_root_must_be_a_module_or_a_dict():
    with pytest.raises(TypeError, match="nn.Module or a dict"):
        fx.GraphModule([1, 2], relu_graph())


def test_graph_must_be_an_fxloom_graph():
    with pytest.raises(TypeError, match="fxloom.Graph"):
        fx.GraphModule(torch.nn.Module(), "graph")


def test_class_name_names_the_generated_class():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph(), class_name="Activation")
    assert type(gm).__name__ == "Activation"
    assert isinstance(gm, fx.GraphModule)


# ----------------------------------------------------------------- the graph
def test_graph_setter_switches_the_program():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    t = torch.tensor([-1.0, 2.0])
    assert_close(gm(t), torch.tensor([0.0, 2.0]))
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.neg, (x,)))
    gm.graph = g
    assert gm.graph is g
    assert g.owning_module is gm
    assert_close(gm(t), -t)


def test_graph_setter_refuses_a_non_graph():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    with pytest.raises(TypeError, match="fxloom.Graph"):
        gm.graph = None


def test_in_place_graph_edits_are_run_on_the_next_call():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    t = torch.tensor([-1.0, 2.0])
    assert_close(gm(t), torch.tensor([0.0, 2.0]))
    relu = find(gm.graph, "relu")
    with gm.graph.inserting_after(relu):
        neg = gm.graph.call_function(torch.neg, (relu,))
    relu.replace_all_uses_with(neg, delete_user_cb=lambda user: user is not neg)
    assert_close(gm(t), torch.tensor([0.0, -2.0]))
    assert "neg = torch.neg(relu)" in gm.code


def test_many_edits_regenerate_code_once(monkeypatch):
    compiles = []
    original = fxloom.graph_module._compile_forward

    def counting(code, class_name, tree=None):
        compiles.append(code.src)
        return original(code, class_name, tree)

    monkeypatch.setattr(fxloom.graph_module, "_compile_forward", counting)
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    assert compiles == []  # construction is lazy
    t = torch.tensor([1.0, -1.0])
    gm(t)
    gm(t)
    assert len(compiles) == 1
    graph = gm.graph
    value = find(graph, "relu")
    output = find(graph, "output")
    with graph.inserting_before(output):
        for _ in range(50):
            value = graph.call_function(operator.add, (value, 1))
    output.args = (value,)
    assert len(compiles) == 1  # editing is free
    assert_close(gm(t), torch.tensor([51.0, 50.0]))
    assert_close(gm(t), torch.tensor([51.0, 50.0]))
    assert len(compiles) == 2


def test_reading_code_generates_once_and_calling_reuses_it(monkeypatch):
    calls = []
    original = fx.Graph.python_code

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(fx.Graph, "python_code", counting)
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    assert "torch.relu(x)" in gm.code
    gm(torch.ones(1))
    assert "torch.relu(x)" in gm.code
    assert len(calls) == 1


def test_forward_called_directly_before_any_call_generates_code():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    assert_close(gm.forward(torch.tensor([-3.0])), torch.tensor([0.0]))


def test_recompile_returns_python_code_and_refreshes_forward():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    find(gm.graph, "relu").target = torch.neg
    code = gm.recompile()
    assert isinstance(code, fx.PythonCode)
    assert "torch.neg(x)" in code.src
    assert_close(gm.forward(torch.tensor([2.0])), torch.tensor([-2.0]))


def test_code_property_is_the_forward_source():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    assert (
        gm.code == "def forward(self, x):\n    relu = torch.relu(x);  x = None\n    return relu\n"
    )


def test_print_readable_returns_the_class_with_its_forward(capsys):
    gm = fx.GraphModule(Net(), net_graph(), class_name="Net")
    text = gm.print_readable(print_output=False)
    assert capsys.readouterr().out == ""
    assert text.startswith("class Net(torch.nn.Module):")
    assert "    def forward(self, x):" in text
    assert "        lin = self.lin(x);  x = None" in text
    assert gm.print_readable() == text
    assert text in capsys.readouterr().out


def test_print_readable_nests_child_graph_modules():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph(), class_name="Outer")
    gm.add_submodule("inner", fx.GraphModule(torch.nn.Module(), relu_graph()))
    text = gm.print_readable(print_output=False)
    assert "    class inner(torch.nn.Module):" in text
    assert "        def forward(self, x):" in text


def test_str_shows_the_module_and_its_code():
    text = str(fx.GraphModule(Net(), net_graph()))
    assert "(lin): Linear(in_features=3, out_features=4, bias=True)" in text
    assert "def forward(self, x):" in text


# ------------------------------------------------------------------ submodules
def test_add_submodule_creates_missing_parents():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    lin = torch.nn.Linear(2, 2)
    assert gm.add_submodule("a.b.lin", lin) is True
    assert gm.get_submodule("a.b.lin") is lin
    assert type(gm.a) is torch.nn.Module


def test_add_submodule_refuses_a_non_module_in_the_path():
    gm = fx.GraphModule(Net(), net_graph())
    gm.config = {"depth": 2}
    assert gm.add_submodule("scale.inner", torch.nn.ReLU()) is False
    assert gm.add_submodule("config.inner", torch.nn.ReLU()) is False
    assert gm.config == {"depth": 2}


def test_delete_submodule():
    gm = fx.GraphModule(Net(), net_graph())
    assert gm.delete_submodule("seq.1") is True
    assert not hasattr(gm.seq, "1")
    assert gm.delete_submodule("seq.1") is False
    assert gm.delete_submodule("scale") is False  # a parameter, not a submodule
    assert gm.delete_submodule("nowhere.deep") is False
    assert gm.delete_submodule("scale.inner") is False


def test_delete_all_unused_submodules_keeps_called_modules_with_their_children():
    gm = fx.GraphModule(Net(), net_graph())
    gm.add_submodule("extra.inner", torch.nn.Linear(1, 1))
    gm.add_submodule("spare", torch.nn.ReLU())
    gm.delete_all_unused_submodules()
    assert {name for name, _ in gm.named_modules()} == {"", "lin", "seq", "seq.0", "seq.1"}
    assert_close(gm(torch.ones(1, 3)), gm(torch.ones(1, 3)))


def test_delete_all_unused_submodules_keeps_parents_of_attributes():
    root = torch.nn.Module()
    root.block = torch.nn.Linear(2, 2)
    root.other = torch.nn.Linear(2, 2)
    g = fx.Graph()
    g.output(g.get_attr("block.weight"))
    gm = fx.GraphModule(root, g)
    gm.add_submodule("other", root.other)
    gm.delete_all_unused_submodules()
    assert {name for name, _ in gm.named_modules()} == {"", "block"}


# --------------------------------------------------------- one class per instance
def test_each_graph_module_has_its_own_class():
    relu_gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.neg, (x,)))
    neg_gm = fx.GraphModule(torch.nn.Module(), g)
    t = torch.tensor([-1.0, 1.0])
    assert_close(relu_gm(t), torch.tensor([0.0, 1.0]))
    assert_close(neg_gm(t), torch.tensor([1.0, -1.0]))
    assert_close(relu_gm(t), torch.tensor([0.0, 1.0]))
    assert type(relu_gm) is not type(neg_gm)
    assert isinstance(relu_gm, fx.GraphModule) and isinstance(neg_gm, fx.GraphModule)


def test_subclasses_of_graph_module_keep_their_methods():
    class Tagged(fx.GraphModule):
        def tag(self):
            return "tagged"

    gm = Tagged(torch.nn.Module(), relu_graph())
    assert isinstance(gm, Tagged)
    assert gm.tag() == "tagged"
    assert_close(gm(torch.tensor([-1.0])), torch.tensor([0.0]))


def test_the_class_sees_the_generated_forward_of_the_current_graph():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    assert list(inspect.signature(type(gm).forward).parameters) == ["self", "x"]
    with gm.graph.inserting_after(find(gm.graph, "x")):
        gm.graph.placeholder("y")  # edited in place; nothing recompiled by hand
    assert list(inspect.signature(type(gm).forward).parameters) == ["self", "x", "y"]


def test_forward_assigned_on_an_instance_overrides_the_generated_one():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    gm.forward = lambda x: x + 1
    assert_close(gm(torch.tensor([-2.0])), torch.tensor([-1.0]))


def test_a_dropped_graph_module_is_freed_without_the_cycle_collector():
    # Its class refers back to it only weakly (_instance_ref), and so does each mirror of
    # submodules (fxloom._mirrored_modules), here on the module and on the parent "seq".
    root = torch.nn.Module()
    root.seq = torch.nn.Sequential(torch.nn.ReLU())
    g = fx.Graph()
    g.output(g.call_module("seq.0", (g.placeholder("x"),)))
    gm = fx.GraphModule(root, g)
    gm(torch.ones(1))
    ref = weakref.ref(gm)
    gc.disable()
    try:
        del gm
        assert ref() is None
    finally:
        gc.enable()


# ------------------------------------------------------------- copy and pickle
def test_deepcopy_gives_an_independent_module_with_equal_outputs():
    net = Net()
    gm = fx.GraphModule(net, net_graph(), class_name="Net")
    x = torch.randn(2, 3)
    expected = gm(x)
    clone = copy.deepcopy(gm)
    assert_close(clone(x), expected)
    assert type(clone).__name__ == "Net"
    assert type(clone) is not type(gm)
    assert clone.graph is not gm.graph and clone.graph.owning_module is clone
    assert clone.scale is not gm.scale
    with torch.no_grad():
        clone.scale.zero_()
    assert_close(gm(x), expected)


def test_deepcopy_then_edit_does_not_touch_the_original():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    clone = copy.deepcopy(gm)
    find(clone.graph, "relu").target = torch.neg
    t = torch.tensor([-2.0])
    assert_close(gm(t), torch.tensor([0.0]))
    assert_close(clone(t), torch.tensor([2.0]))


def test_pickle_round_trip_gives_equal_outputs():
    gm = fx.GraphModule(Net(), net_graph(), class_name="Net")
    x = torch.randn(2, 3)
    loaded = pickle.loads(pickle.dumps(gm))
    assert_close(loaded(x), gm(x))
    assert type(loaded).__name__ == "Net"
    assert loaded.code == gm.code
    assert "bias_np" not in loaded.state_dict() and "bias_np" in dict(loaded.named_buffers())


def _pickled_globals(payload: bytes) -> set[str]:
    """``module.name`` of every global a pickle payload refers to."""
    found, strings = set(), []
    for opcode, arg, _ in pickletools.genops(payload):
        if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif opcode.name == "STACK_GLOBAL":
            found.add(f"{strings[-2]}.{strings[-1]}")
        elif opcode.name in ("GLOBAL", "INST"):
            found.add(arg.replace(" ", "."))
    return found


def test_pickle_carries_the_graph_not_generated_code():
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    gm(torch.ones(1))  # code generated and compiled
    # Edit without recompiling: the payload must describe the edited program.
    find(gm.graph, "relu").target = torch.neg
    payload = pickle.dumps(gm)
    names = _pickled_globals(payload)
    assert "fxloom.graph_module._rebuild" in names
    assert "fxloom._graph_pickle.graph_from_records" in names
    assert not any(
        name.startswith(("types.", "marshal.", "builtins.exec", "builtins.compile"))
        for name in names
    )
    assert b"def forward" not in payload
    assert b"co_code" not in payload
    assert_close(pickle.loads(payload)(torch.tensor([3.0])), torch.tensor([-3.0]))


def test_pickle_of_a_graph_module_with_a_local_function_fails_clearly():
    def local(x):
        return x

    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(local, (x,)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    with pytest.raises((pickle.PicklingError, AttributeError), match="local"):
        pickle.dumps(gm)


# -------------------------------------------------------------------- to_folder
def test_to_folder_writes_a_package_that_runs_in_a_fresh_interpreter(tmp_path):
    net = Net()
    gm = fx.GraphModule(net, net_graph())
    x = torch.randn(2, 3)
    torch.save({"x": x, "expected": gm(x)}, tmp_path / "io.pt")
    gm.to_folder(tmp_path / "exported_net", "ExportedNet")
    script = textwrap.dedent(
        f"""
        import sys
        import torch
        sys.path.insert(0, {str(tmp_path)!r})
        from exported_net import ExportedNet
        m = ExportedNet()
        data = torch.load({str(tmp_path / "io.pt")!r})
        torch.testing.assert_close(m(data["x"]), data["expected"])
        assert "bias_np" not in m.state_dict()
        assert "bias_np" in dict(m.named_buffers())
        assert isinstance(m.scale, torch.nn.Parameter)
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_to_folder_carries_plain_attributes_read_by_get_attr(tmp_path):
    root = torch.nn.Module()
    root.block = torch.nn.Module()
    root.block.factor = 3
    root._offset = torch.full((2,), 0.5)  # a private tensor attribute, still needed
    g = fx.Graph()
    x = g.placeholder("x")
    factor = g.get_attr("block.factor")
    offset = g.get_attr("_offset")
    g.output(g.call_function(operator.add, (g.call_function(operator.mul, (x, factor)), offset)))
    gm = fx.GraphModule(root, g)
    gm.to_folder(tmp_path / "scaled", "Scaled")
    script = textwrap.dedent(
        f"""
        import sys
        import torch
        sys.path.insert(0, {str(tmp_path)!r})
        from scaled import Scaled
        print(Scaled()(torch.ones(2)).tolist())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(gm(torch.ones(2)).tolist()) == "[3.5, 3.5]"


def test_to_folder_refuses_an_attribute_it_cannot_write(tmp_path):
    root = torch.nn.Module()
    root.table = object()
    g = fx.Graph()
    g.output(g.get_attr("table"))
    gm = fx.GraphModule(root, g)
    with pytest.raises(ValueError, match=r"%table reads attribute 'table', a object"):
        gm.to_folder(tmp_path / "out", "M")


def test_to_folder_refuses_a_function_that_cannot_be_imported(tmp_path):
    def local_helper(x):
        return x + 1

    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(local_helper, (x,)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    with pytest.raises(ValueError, match=r"local_helper.*cannot import.*importable module"):
        gm.to_folder(tmp_path / "out", "M")
    assert not (tmp_path / "out").exists()


def test_to_folder_refuses_a_module_name_that_is_not_an_identifier(tmp_path):
    gm = fx.GraphModule(torch.nn.Module(), relu_graph())
    with pytest.raises(ValueError, match="identifier"):
        gm.to_folder(tmp_path / "out", "my-module")


# --------------------------------------------------------------------- errors
def _failing_module() -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("w")
    g.output(g.call_function(torch.matmul, (x, w)))
    root = torch.nn.Module()
    root.register_buffer("w", torch.ones(5, 2))
    return fx.GraphModule(root, g)


def test_an_exception_in_generated_code_carries_a_note_naming_the_node():
    gm = _failing_module()
    with pytest.raises(RuntimeError) as info:
        gm(torch.ones(3, 4))
    notes = "\n".join(notes_of(info.value))
    assert "fxloom: raised by %matmul" in notes
    assert "matmul = torch.matmul(x, w);  x = w = None" in notes
    assert "call_function[target=torch.matmul]" in notes


def test_the_note_carries_the_captured_stack_trace():
    gm = _failing_module()
    find(gm.graph, "matmul").stack_trace = '  File "model.py", line 7, in forward\n'
    with pytest.raises(RuntimeError) as info:
        gm(torch.ones(3, 4))
    assert 'File "model.py", line 7, in forward' in "\n".join(notes_of(info.value))


def test_traceback_shows_the_generated_source_line():
    gm = _failing_module()
    try:
        gm(torch.ones(3, 4))
    except RuntimeError as err:
        formatted = "".join(traceback.format_exception(err))
    else:
        pytest.fail("the shapes do not match; matmul must raise")
    assert "<fxloom-generated>" in formatted
    assert "matmul = torch.matmul(x, w);  x = w = None" in formatted


def test_an_exception_in_a_called_submodule_is_attributed_to_its_node():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("lin", (x,)))
    gm = fx.GraphModule(Net(), g)
    with pytest.raises(RuntimeError) as info:
        gm(torch.ones(2, 7))
    assert "fxloom: raised by %lin" in "\n".join(notes_of(info.value))


def test_nested_graph_modules_each_add_a_note():
    outer_graph = fx.Graph()
    x = outer_graph.placeholder("x")
    outer_graph.output(outer_graph.call_module("inner", (x,)))
    outer = fx.GraphModule({"inner": _failing_module()}, outer_graph)
    with pytest.raises(RuntimeError) as info:
        outer(torch.ones(3, 4))
    notes = notes_of(info.value)
    assert len(notes) == 2
    assert "fxloom: raised by %matmul" in notes[0]
    assert "fxloom: raised by %inner" in notes[1]


def test_changing_a_node_type_annotation_regenerates_the_code():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(x)
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert "def forward(self, x):" in gm.code
    x.type = torch.Tensor
    assert "def forward(self, x: torch.Tensor):" in gm.code
