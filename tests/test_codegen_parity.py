"""Generated code side by side with torch.fx: paths, the CodeGen hooks, pytree signatures, errors.

Each test builds the same program with fxloom and with torch.fx and compares what
people see (code text) or get (values). Where fxloom differs on purpose, the
test says so.
"""

from __future__ import annotations

import copy
import operator
import pickle
import re
import traceback

import pytest
import torch
import torch.fx
import torch.utils._pytree as torch_pytree
from torch.fx.graph import _format_target
from torch.fx.graph import _PyTreeCodeGen as TorchPyTreeCodeGen
from torch.fx.graph import _PyTreeInfo as TorchPyTreeInfo
from torch.testing import assert_close

import fxloom as fx
from fxloom import pytree
from fxloom.graph import _PyTreeCodeGen, _PyTreeInfo


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Linear(4, 4)
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv1(x) * self.scale


class Nested(torch.nn.Module):
    """Plain (``head``) and numbered (``layers.1.0``) paths, to submodules and parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(Block(), torch.nn.Sequential(Block(), torch.nn.ReLU()))
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


class KeywordPath(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_module("class", torch.nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, "class")(x)


def code_lines(code: str) -> list[str]:
    return [line.strip() for line in code.strip().splitlines()]


# ------------------------------------------------------------ readable paths
def test_module_calls_print_the_qualified_path_as_torch_fx_does():
    ours = fx.symbolic_trace(Nested())
    for node in ours.graph.find_nodes(op="call_module"):
        path = _format_target("self", node.target)
        assert f"{node.name} = {path}(" in ours.code, path
    assert 'getattr(getattr(self.layers, "1"), "0").conv1(' in ours.code


def test_parameters_print_the_qualified_path_as_torch_fx_does():
    ours = fx.symbolic_trace(Nested())
    theirs = torch.fx.symbolic_trace(Nested())
    ours_lines = [line for line in code_lines(ours.code) if "scale" in line.split("=")[0]]
    theirs_lines = [line for line in code_lines(theirs.code) if "scale" in line.split("=")[0]]
    assert ours_lines == theirs_lines
    assert 'layers_0_scale = getattr(self.layers, "0").scale' in ours_lines


def test_a_keyword_path_part_goes_through_getattr_where_torch_fx_would_not_compile():
    # torch.fx prints self.class(x), a syntax error; fxloom prints getattr(self, "class")(x).
    model = KeywordPath()
    ours = fx.symbolic_trace(model)
    assert 'class_1 = getattr(self, "class")(x)' in ours.code
    x = torch.randn(3, 4)
    assert_close(ours(x), model(x))
    with pytest.raises(SyntaxError):
        torch.fx.symbolic_trace(model)


def test_readable_paths_compute_what_the_model_computes():
    model = Nested()
    x = torch.randn(3, 4)
    assert_close(fx.symbolic_trace(model)(x), model(x))


# ------------------------------------------------------- in-place operators
def inplace_graph(mod):
    g = mod.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    g.output((g.call_function(operator.imul, (a, b)), a))
    return mod.GraphModule(torch.nn.Module(), g)


def test_an_inplace_operator_prints_as_augmented_assignment():
    assert "imul = a;  imul *= b;  b = None" in inplace_graph(fx).code


def test_an_inplace_operator_mutates_a_tensor_as_torch_fx_does():
    ours_a, theirs_a = torch.ones(2), torch.ones(2)
    ours = inplace_graph(fx)(ours_a, torch.full((2,), 3.0))
    theirs = inplace_graph(torch.fx)(theirs_a, torch.full((2,), 3.0))
    assert_close(ours_a, theirs_a)
    assert ours[0] is ours_a and theirs[0] is theirs_a


def test_an_inplace_operator_on_an_int_rebinds_only_its_result():
    # operator.imul(2, 3) leaves 2 alone. torch.fx prints "a *= b;  imul = a", so its
    # later uses of a see 6; fxloom binds the result to the node's own name.
    assert inplace_graph(fx)(2, 3) == (6, 2) == fx.Interpreter(inplace_graph(fx)).run(2, 3)
    assert inplace_graph(torch.fx)(2, 3) == (6, 6)


# ------------------------------------------------------- return annotations
def annotated_graph(mod):
    g = mod.Graph()
    x = g.placeholder("x", type_expr=torch.Tensor)
    g.output(g.call_function(torch.relu, (x,)), type_expr=torch.Tensor)
    return g


def test_the_return_annotation_prints_as_torch_fx_prints_it():
    ours = annotated_graph(fx).python_code("self").src.splitlines()[0]
    theirs = annotated_graph(torch.fx).python_code("self").src.strip().splitlines()[0]
    assert ours.endswith(") -> torch.Tensor:") and theirs.endswith(") -> torch.Tensor:")
    assert ours == "def forward(self, x: torch.Tensor) -> torch.Tensor:"  # torch.fx: "x : T"


# ------------------------------------------------------------- the line map
def test_each_generated_line_maps_to_the_node_it_came_from():
    gm = fx.symbolic_trace(Nested())
    code = gm.graph.python_code("self")
    for lineno, line in enumerate(code.src.splitlines(), start=1):
        name = code.node_at_line(lineno)
        if line.strip().startswith("return"):
            assert name == "output"
        elif name is not None:
            assert line.strip().startswith(f"{name} = ")


def test_the_line_map_counts_the_lines_a_codegen_adds_to_the_header():
    gm = fx.GraphModule(torch.nn.Module(), pytree_graph(fx, _PyTreeCodeGen, _PyTreeInfo, pytree))
    code = gm.graph.python_code("self")
    lines = code.src.splitlines()
    add_line = next(i for i, line in enumerate(lines, 1) if line.strip().startswith("add ="))
    assert code.node_at_line(add_line) == "add"
    assert code.node_at_line(2) is None  # the flattening line belongs to no node


# ------------------------------------------------------- errors in generated code
class Failing(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) @ x  # shapes (n, 3) @ (n, 4): fails


def test_the_traceback_of_an_error_in_generated_code_shows_the_line_and_the_node():
    gm = fx.symbolic_trace(Failing())
    with pytest.raises(RuntimeError) as info:
        gm(torch.randn(2, 4))
    text = "".join(traceback.format_exception(info.value))
    assert re.search(r'File "<fxloom-generated>/Failing_\d+\.py", line \d+, in forward', text)
    assert "matmul = proj @ x" in text  # the generated line, from linecache
    assert "fxloom: raised by %matmul" in text  # the note names the node


def test_the_generated_file_is_named_for_the_module_class():
    gm = fx.symbolic_trace(Failing())
    assert re.fullmatch(
        r"<fxloom-generated>/Failing_\d+\.py", type(gm).forward.__code__.co_filename
    )


# ---------------------------------------------------------------- CodeGen
def make_codegen(base):
    class Boxed(base):
        """Returns the output in a one-element list and reads a global from additional_globals."""

        def gen_fn_def(self, free_vars, maybe_return_annotation, **kwargs):
            return super().gen_fn_def(free_vars, maybe_return_annotation, **kwargs)

        def generate_output(self, output_args, **kwargs):
            return super().generate_output([output_args, "boxed"], **kwargs)

        def additional_globals(self):
            return [("BOX_LABEL", "boxed")]

        def process_inputs(self, *args):
            return tuple(a * 2 for a in args)

        def process_outputs(self, outputs):
            return ("out", outputs)

    return Boxed()


def simple_graph(mod):
    g = mod.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.add, (x, 1)))
    return g


def test_a_codegen_subclass_frames_the_code_as_in_torch_fx():
    ours, theirs = simple_graph(fx), simple_graph(torch.fx)
    ours.set_codegen(make_codegen(fx.CodeGen))
    theirs.set_codegen(make_codegen(torch.fx.CodeGen))
    assert code_lines(ours.python_code("self").src) == code_lines(theirs.python_code("self").src)
    assert code_lines(ours.python_code("self").src)[-1] == "return [add, 'boxed']"


def test_additional_globals_are_bound_in_the_generated_globals():
    g = simple_graph(fx)
    g.set_codegen(make_codegen(fx.CodeGen))
    assert g.python_code("self").globals["BOX_LABEL"] == "boxed"


def test_set_codegen_regenerates_the_graph_modules_forward():
    gm = fx.GraphModule(torch.nn.Module(), simple_graph(fx))
    assert gm(1) == 2
    gm.graph.set_codegen(make_codegen(fx.CodeGen))
    assert gm(1) == [2, "boxed"]


@pytest.mark.parametrize("io", [True, False])
def test_the_interpreter_processes_inputs_and_outputs_as_torch_fx_does(io):
    results = []
    for mod in (fx, torch.fx):
        gm = mod.GraphModule(torch.nn.Module(), simple_graph(mod))
        gm.graph.set_codegen(make_codegen(mod.CodeGen))
        results.append(mod.Interpreter(gm).run(1, enable_io_processing=io))
    # The graph computes x + 1; with io processing x is doubled first and the result boxed.
    assert results[0] == results[1] == (("out", 3) if io else 2)


def test_the_default_codegen_processes_nothing():
    g = simple_graph(fx)
    assert g.process_inputs(1, 2) == (1, 2)
    assert g.process_outputs([3]) == [3]


def test_the_codegen_travels_with_deepcopy_and_pickle():
    g = simple_graph(fx)
    g.set_codegen(fx.CodeGen())
    assert type(copy.deepcopy(g)._codegen) is fx.CodeGen
    assert type(pickle.loads(pickle.dumps(g))._codegen) is fx.CodeGen


# ----------------------------------------------------------------- pytrees
def pytree_graph(mod, codegen_cls, info_cls, tree_module):
    """f(pair, scale) with pair = {"a": x, "b": (y, z)}: returns {"sum": x + y, "rest": [z * scale]}."""
    g = mod.Graph()
    x, y, z, scale = (g.placeholder(name) for name in ("x", "y", "z", "scale"))
    total = g.call_function(torch.add, (x, y))
    scaled = g.call_function(operator.mul, (z, scale))
    g.output([total, scaled])
    example = ({"a": 0, "b": (0, 0)}, 0)
    _, in_spec = tree_module.tree_flatten(example)
    _, out_spec = tree_module.tree_flatten({"sum": 0, "rest": [0]})
    g.set_codegen(codegen_cls(info_cls(["pair", "scale"], in_spec, out_spec)))
    return g


def pytree_inputs(keys=("a", "b")):
    values = {"a": torch.ones(2), "b": (torch.full((2,), 2.0), torch.full((2,), 3.0))}
    return {key: values[key] for key in keys}, torch.full((2,), 10.0)


def expected_pytree_output():
    return {"sum": torch.full((2,), 3.0), "rest": [torch.full((2,), 30.0)]}


def both_pytree_modules():
    ours = fx.GraphModule(torch.nn.Module(), pytree_graph(fx, _PyTreeCodeGen, _PyTreeInfo, pytree))
    theirs = torch.fx.GraphModule(
        torch.nn.Module(),
        pytree_graph(torch.fx, TorchPyTreeCodeGen, TorchPyTreeInfo, torch_pytree),
    )
    return ours, theirs


def test_a_pytree_graph_module_takes_and_returns_nested_structures_as_torch_fx():
    ours, theirs = both_pytree_modules()
    assert_close(ours(*pytree_inputs()), expected_pytree_output())
    assert_close(theirs(*pytree_inputs()), expected_pytree_output())


def test_a_pytree_forward_keeps_the_callers_signature():
    ours, theirs = both_pytree_modules()
    assert (
        code_lines(ours.code)[0] == code_lines(theirs.code)[0] == "def forward(self, pair, scale):"
    )
    assert ours._in_spec == ours.graph._codegen.pytree_info.in_spec


def test_the_interpreter_flattens_and_rebuilds_a_pytree_graph_as_torch_fx():
    ours, theirs = both_pytree_modules()
    assert_close(fx.Interpreter(ours).run(*pytree_inputs()), expected_pytree_output())
    assert_close(torch.fx.Interpreter(theirs).run(*pytree_inputs()), expected_pytree_output())


def test_the_interpreter_reads_a_dict_input_by_the_specs_keys():
    # torch.fx's Interpreter flattens a dict in its own key order ("b" first here) and
    # gives the leaves to the wrong placeholders; its generated forward reads by key.
    ours, theirs = both_pytree_modules()
    reordered = pytree_inputs(keys=("b", "a"))
    assert_close(fx.Interpreter(ours).run(*reordered), expected_pytree_output())
    assert_close(ours(*reordered), expected_pytree_output())
    assert_close(theirs(*reordered), expected_pytree_output())


def test_the_interpreter_without_io_processing_runs_on_the_leaves():
    ours, _ = both_pytree_modules()
    leaves = [torch.ones(2), torch.full((2,), 2.0), torch.full((2,), 3.0), torch.full((2,), 10.0)]
    flat = fx.Interpreter(ours).run(*leaves, enable_io_processing=False)
    assert_close(flat, [torch.full((2,), 3.0), torch.full((2,), 30.0)])


def test_boxed_run_takes_the_leaves_and_rebuilds_the_output_structure():
    # The boxed list holds one value per placeholder (the leaves): only the output is processed.
    ours, _ = both_pytree_modules()
    (pair, scale) = pytree_inputs()
    leaves = [pair["a"], *pair["b"], scale]
    assert_close(fx.Interpreter(ours).boxed_run(leaves), expected_pytree_output())
    assert leaves == []


def test_a_transformed_pytree_graph_keeps_its_signature_as_torch_fx():
    ours, theirs = both_pytree_modules()
    for transformed in (fx.Transformer(ours).transform(), torch.fx.Transformer(theirs).transform()):
        assert_close(transformed(*pytree_inputs()), expected_pytree_output())
    assert fx.Transformer(ours).transform().graph._codegen is ours.graph._codegen


def test_a_pytree_graph_module_survives_pickle_and_deepcopy():
    ours, _ = both_pytree_modules()
    for copied in (pickle.loads(pickle.dumps(ours)), copy.deepcopy(ours)):
        assert_close(copied(*pytree_inputs()), expected_pytree_output())


def test_a_pytree_input_of_the_wrong_shape_is_named():
    ours, _ = both_pytree_modules()
    with pytest.raises(ValueError, match=r"the input\[0\]\[1\] is a leaf"):
        ours({"a": torch.ones(2), "b": torch.ones(2)}, torch.ones(2))
