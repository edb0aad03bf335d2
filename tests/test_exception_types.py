"""Mistakes raise the exception type torch.fx raises for them (or a subclass).

Each case runs the same code under torch.fx and fxloom: ``except TypeError``
written for torch.fx keeps catching fxloom's error, whose message stays
fxloom's own. Where torch.fx finds a mistake only at ``lint`` (a node of another
graph), fxloom refuses the edit itself, with an error of lint's type.

Deliberate differences, not in the table: fxloom refuses ``concrete_args``
naming no parameter, erasing a node twice, ``node.args`` that is not a
sequence, a second output node (at lint) and code generation for a graph
without an output; torch.fx accepts these. Tracing something that is neither
a module nor a function, and a GraphModule root that is neither a module nor
a dict, are ``TypeError``s (torch.fx: ``AssertionError``, ``RuntimeError``).
"""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.fx

import fxloom

# --------------------------------------------------------------- the mistakes


def _raises(exc: BaseException):
    def fn(x):
        raise exc

    return fn


def _trace_calling(helper):
    return lambda fx: fx.symbolic_trace(lambda x: x + helper(x))


class _Unfinished(torch.nn.Module):
    def forward(self, x):
        raise NotImplementedError("forward of a template module")


def _relu_graph(fx):
    graph = fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.relu, (x,))
    graph.output(y)
    return graph, x, y


def _use_other_graphs_node(fx):
    _, x, _ = _relu_graph(fx)
    other = fx.Graph()
    other.output(other.call_function(torch.relu, (x,)))
    other.lint()


def _insert_before_other_graphs_node(fx):
    _, x, _ = _relu_graph(fx)
    fx.Graph().inserting_before(x)


def _replace_with_other_graphs_node(fx):
    graph, x, _ = _relu_graph(fx)
    _, other_x, _ = _relu_graph(fx)
    x.replace_all_uses_with(other_x)
    graph.lint()


def _replace_with_erased_node(fx):
    graph, x, y = _relu_graph(fx)
    erased = graph.call_function(torch.neg, (x,))
    graph.erase_node(erased)
    y.replace_all_uses_with(erased)
    graph.lint()


def _erase_used_node(fx):
    graph, x, _ = _relu_graph(fx)
    graph.erase_node(x)


def _erase_other_graphs_node(fx):
    _, x, _ = _relu_graph(fx)
    fx.Graph().erase_node(x)


def _set_unknown_opcode(fx):
    graph, _, y = _relu_graph(fx)
    y.op = "call_nothing"
    graph.lint()


def _use_before_definition(fx):
    graph, x, y = _relu_graph(fx)
    z = graph.call_function(torch.neg, (y,))
    y.prepend(z)
    graph.lint()


def _missing_attribute_in_lint(fx):
    graph = fx.Graph()
    graph.output(graph.get_attr("weight"))
    module = fx.GraphModule(torch.nn.Module(), _relu_graph(fx)[0])
    graph.owning_module = module  # fxloom holds it weakly: keep it alive
    graph.lint()


def _graph_module_missing_attribute(fx):
    graph = fx.Graph()
    graph.output(graph.get_attr("weight"))
    fx.GraphModule(torch.nn.Module(), graph)


def _graph_module_missing_root_key(fx):
    graph = fx.Graph()
    graph.output(graph.get_attr("weight"))
    fx.GraphModule({}, graph)


def _interpreter_missing_attribute(fx):
    module = fx.GraphModule(torch.nn.Module(), _relu_graph(fx)[0])
    fx.Interpreter(module).fetch_attr("weight")


def _interpreter_missing_input(fx):
    fx.Interpreter(fx.GraphModule(torch.nn.Module(), _relu_graph(fx)[0])).run()


def _wrap_inside_a_function(fx):
    fx.wrap("len")


MISTAKES = {
    # tracing: an exception from the traced code
    "TypeError in traced code": _trace_calling(lambda x: 1 + "a"),
    "ValueError in traced code": _trace_calling(_raises(ValueError("bad value"))),
    "KeyError in traced code": _trace_calling(lambda x: {}["missing"]),
    "AttributeError in traced code": _trace_calling(lambda x: None.weight),
    "NameError in traced code": _trace_calling(lambda x: undefined_name),  # noqa: F821
    "RuntimeError in traced code": _trace_calling(_raises(RuntimeError("shapes differ"))),
    "NotImplementedError in a forward": lambda fx: fx.symbolic_trace(_Unfinished()),
    # tracing: what a proxy cannot do
    "control flow on a proxy": lambda fx: fx.symbolic_trace(lambda x: x if x.sum() > 0 else -x),
    "iterating a proxy": lambda fx: fx.symbolic_trace(lambda x: [row for row in x]),
    "len of a proxy": lambda fx: fx.symbolic_trace(lambda x: len(x)),
    "int of a proxy": lambda fx: fx.symbolic_trace(lambda x: int(x)),
    "float of a proxy": lambda fx: fx.symbolic_trace(lambda x: float(x)),
    "a proxy as a list index": lambda fx: fx.symbolic_trace(lambda x: [1, 2][x]),
    "range of a proxy": lambda fx: fx.symbolic_trace(lambda x: range(x)),
    "wrap inside a function": _wrap_inside_a_function,
    # graph edits
    "an argument from another graph": _use_other_graphs_node,
    "inserting before another graph's node": _insert_before_other_graphs_node,
    "replacing uses with another graph's node": _replace_with_other_graphs_node,
    "replacing uses with an erased node": _replace_with_erased_node,
    "erasing a node that has users": _erase_used_node,
    "erasing another graph's node": _erase_other_graphs_node,
    "create_node with an unknown opcode": lambda fx: fx.Graph().create_node("call_foo", torch.relu),
    "setting an unknown opcode": _set_unknown_opcode,
    "call_module with a function target": lambda fx: fx.Graph().create_node(
        "call_module", torch.relu
    ),
    "call_function with a non-callable target": lambda fx: fx.Graph().call_function(5),
    "lint: use before definition": _use_before_definition,
    "lint: get_attr of a missing attribute": _missing_attribute_in_lint,
    # modules and interpreters
    "GraphModule: get_attr of a missing attribute": _graph_module_missing_attribute,
    "GraphModule: a target missing from the root dict": _graph_module_missing_root_key,
    "Interpreter: fetching a missing attribute": _interpreter_missing_attribute,
    "Interpreter: an input not given": _interpreter_missing_input,
    "get_submodule of a missing path": lambda fx: fx.GraphModule(
        torch.nn.Module(), _relu_graph(fx)[0]
    ).get_submodule("block.linear"),
}


def _error_of(mistake, fx) -> BaseException:
    with pytest.raises(Exception) as caught:
        mistake(fx)
    return caught.value


def _expected_type(torch_fx_error: BaseException) -> type[BaseException]:
    # fxloom has its own TraceError; torch.fx's is a plain ValueError subclass.
    if type(torch_fx_error) is torch.fx.proxy.TraceError:
        return ValueError
    return type(torch_fx_error)


@pytest.mark.parametrize("name", list(MISTAKES))
def test_fxloom_raises_the_type_torch_fx_raises(name):
    mistake = MISTAKES[name]
    expected = _expected_type(_error_of(mistake, torch.fx))
    error = _error_of(mistake, fxloom)
    assert isinstance(error, expected), f"{name}: {type(error).__mro__} is no {expected}"


# ------------------------------------------------------ TraceError's identity


def test_trace_error_is_a_value_error_like_torch_fx_and_a_runtime_error_like_before():
    assert issubclass(fxloom.TraceError, ValueError)
    assert issubclass(fxloom.TraceError, RuntimeError)


def test_an_error_of_the_traced_code_is_caught_as_its_type_and_as_a_trace_error():
    with pytest.raises(KeyError) as caught:
        fxloom.symbolic_trace(lambda x: x + {}["missing"])
    error = caught.value
    assert isinstance(error, fxloom.TraceError)
    assert type(error.__cause__) is KeyError
    assert str(error).startswith("KeyError: 'missing'")  # fxloom's message, not quoted
    assert "while tracing the root module" in str(error)
    assert error.partial_graph is not None


def test_one_class_per_original_type():
    assert fxloom.TraceError.like(TypeError) is fxloom.TraceError.like(TypeError)
    assert fxloom.TraceError.like(ValueError) is fxloom.TraceError


def test_a_user_exception_with_its_own_initialiser_still_combines():
    class ShapeMismatch(Exception):
        def __init__(self, expected, got):
            super().__init__(f"expected {expected}, got {got}")

    def check(x):
        raise ShapeMismatch(3, 4)

    with pytest.raises(ShapeMismatch) as caught:
        fxloom.symbolic_trace(lambda x: check(x))
    assert isinstance(caught.value, fxloom.TraceError)
    assert "ShapeMismatch: expected 3, got 4" in str(caught.value)


def test_a_combined_trace_error_survives_pickling():
    error = fxloom.TraceError.like(KeyError)("no key", location="net.py:3", module_path="block")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (str(copy), copy.location, copy.module_path) == ("no key", "net.py:3", "block")


def test_converting_a_proxy_to_int_is_a_type_error_with_fxloom_s_explanation():
    with pytest.raises(TypeError, match="cannot be converted to int during symbolic tracing"):
        fxloom.symbolic_trace(lambda x: int(x))


# ------------------------------------------------- refused at the edit itself


def test_a_node_of_another_graph_is_refused_when_used_with_lint_s_type():
    _, x, _ = _relu_graph(fxloom)
    other = fxloom.Graph()
    with pytest.raises(fxloom.GraphLintError, match="belongs to another graph"):
        other.call_function(torch.relu, (x,))
