"""Property tests: generated code agrees with a direct evaluation of the graph, and random
edits keep the graph's invariants (lint, users, find_nodes)."""

from __future__ import annotations

import operator
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

import fxloom as fx

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Every value in a generated program is a tensor of this shape.
SHAPE = (3, 4)
BINARY = [operator.add, operator.mul, operator.sub]
UNARY = [torch.relu, torch.tanh]
CONSTANTS = [-1.5, -1, 0.5, 2, 3.0]
# Placeholder names, some of which collide with builtins and suffix patterns.
INPUT_NAMES = ["x", "input", "sum", "y_1", "len"]


# ------------------------------------------------------------ the reference
def evaluate(graph: fx.Graph, inputs: list[Any]) -> Any:
    """Run ``graph`` node by node: the semantics of the six opcodes (no module state)."""
    env: dict[fx.Node, Any] = {}
    pending = iter(inputs)

    def read(a: Any) -> Any:
        return fx.map_arg(a, env.__getitem__)

    for node in graph.nodes:
        args, kwargs = read(node.args), dict(read(node.kwargs))
        if node.op == "placeholder":
            env[node] = next(pending)
        elif node.op == "call_function":
            env[node] = node.target(*args, **kwargs)
        elif node.op == "call_method":
            receiver, *rest = args
            env[node] = getattr(receiver, node.target)(*rest, **kwargs)
        elif node.op == "output":
            return args[0]
        else:
            raise AssertionError(f"the generator makes no {node.op} nodes")
    raise AssertionError("no output")


# ------------------------------------------------------- random programs
def add_random_step(data: st.DataObject, g: fx.Graph, values: list[fx.Node]) -> None:
    """Append one operation on earlier values to ``g`` and ``values``."""

    def pick() -> fx.Node:
        return data.draw(st.sampled_from(values))

    kind = data.draw(st.sampled_from(["binary", "binary_const", "unary", "method", "chunk"]))
    if kind == "binary":
        new = g.call_function(data.draw(st.sampled_from(BINARY)), (pick(), pick()))
    elif kind == "binary_const":
        operands = [pick(), data.draw(st.sampled_from(CONSTANTS))]
        if data.draw(st.booleans()):
            operands.reverse()  # a constant on the left: ``(-1.5) - x``
        new = g.call_function(data.draw(st.sampled_from(BINARY)), tuple(operands))
    elif kind == "unary":
        new = g.call_function(data.draw(st.sampled_from(UNARY)), (pick(),))
    elif kind == "method":
        source = pick()
        if data.draw(st.booleans()):
            new = g.call_method("neg", (source,))
        else:
            new = g.call_method("clamp", (source,), {"min": -0.5, "max": 0.5})
    else:  # split the last dimension in two and glue the halves back, maybe swapped
        chunks = g.call_function(torch.chunk, (pick(), 2), {"dim": -1})
        first = g.call_function(operator.getitem, (chunks, data.draw(st.sampled_from([0, 1]))))
        second = g.call_function(operator.getitem, (chunks, data.draw(st.sampled_from([0, 1]))))
        new = g.call_function(torch.cat, ([first, second],), {"dim": -1})
    values.append(new)


def random_program(data: st.DataObject) -> fx.Graph:
    g = fx.Graph()
    names = data.draw(st.lists(st.sampled_from(INPUT_NAMES), min_size=1, max_size=3, unique=True))
    values = [g.placeholder(name) for name in names]
    for _ in range(data.draw(st.integers(0, 12))):
        add_random_step(data, g, values)
    returned = data.draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
    g.output(returned[0] if len(returned) == 1 else tuple(returned))
    return g


@SETTINGS
@given(st.data())
def test_generated_code_agrees_with_direct_evaluation(data):
    g = random_program(data)
    g.lint()
    n_inputs = len(g.find_nodes(op="placeholder"))
    seed = data.draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(SHAPE, generator=generator) for _ in range(n_inputs)]
    expected = evaluate(g, [t.clone() for t in inputs])
    got = fx.GraphModule(torch.nn.Module(), g)(*[t.clone() for t in inputs])
    assert_close(got, expected)


@SETTINGS
@given(st.data())
def test_inputs_can_be_passed_by_placeholder_name(data):
    g = random_program(data)
    placeholders = g.find_nodes(op="placeholder")
    inputs = [torch.randn(SHAPE) for _ in placeholders]
    by_name = {str(p.target): t for p, t in zip(placeholders, inputs)}
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert_close(gm(**by_name), evaluate(g, inputs))


# ------------------------------------------------------- invariants under edits
def mentioned_nodes(value: Any) -> set[fx.Node]:
    """Every node inside an argument, found by brute force."""
    found: set[fx.Node] = set()
    fx.map_arg(value, lambda n: found.add(n) or n)
    return found


def check_invariants(g: fx.Graph) -> None:
    g.lint()
    nodes = list(g.nodes)
    assert len(nodes) == len(g.nodes)
    for node in nodes:
        expected_users = {m for m in nodes if node in mentioned_nodes((m.args, m.kwargs))}
        assert set(node.users) == expected_users, node.name
        assert node.all_input_nodes == list(
            dict.fromkeys(n for n in _walk((node.args, node.kwargs)))
        ), node.name
    for op in ("placeholder", "call_function", "call_method", "output"):
        assert g.find_nodes(op=op) == [n for n in nodes if n.op == op]
        for target in {n.target for n in nodes if n.op == op}:
            assert g.find_nodes(op=op, target=target) == [
                n for n in nodes if n.op == op and n.target == target
            ]
            assert set(g.find_nodes(op=op, target=target, sort=False)) == {
                n for n in nodes if n.op == op and n.target == target
            }


def _walk(value: Any) -> list[fx.Node]:
    """Nodes inside an argument in order of appearance (args before kwargs)."""
    order: list[fx.Node] = []
    fx.map_arg(value, lambda n: order.append(n) or n)
    return order


def usable(node: fx.Node) -> bool:
    """Whether ``node`` holds a full-shape tensor (not the output, a chunk tuple or a half)."""
    return node.op != "output" and node.target not in (torch.chunk, operator.getitem)


def erase_unused(data: st.DataObject, g: fx.Graph) -> None:
    candidates = [n for n in g.nodes if not n.users and n.op != "output"]
    if candidates:
        g.erase_node(data.draw(st.sampled_from(candidates)))


def insert_somewhere(data: st.DataObject, g: fx.Graph) -> None:
    """Insert a node before or after a random node, using only values defined before it."""
    nodes = list(g.nodes)
    anchor = data.draw(st.sampled_from(nodes))
    after = anchor.op != "output" and data.draw(st.booleans())
    position = nodes.index(anchor) + (1 if after else 0)
    earlier = [n for n in nodes[:position] if usable(n)]
    if not earlier:
        return
    first = data.draw(st.sampled_from(earlier))
    second = data.draw(st.sampled_from([*earlier, *CONSTANTS]))
    form = data.draw(st.sampled_from(["operator", "container", "keyword"]))
    with g.inserting_after(anchor) if after else g.inserting_before(anchor):
        if form == "operator":
            g.call_function(data.draw(st.sampled_from(BINARY)), (first, second))
        elif form == "container":  # nodes inside a tuple argument
            g.call_function(operator.getitem, ((first, second), 0))
        else:  # a node as a keyword argument
            g.call_function(torch.add, (first,), {"other": second})


def replace_uses(data: st.DataObject, g: fx.Graph) -> None:
    """Replace some uses of a node by an earlier node (so topological order is kept)."""
    nodes = [n for n in g.nodes if usable(n)]
    if len(nodes) < 2:
        return
    old_index = data.draw(st.integers(1, len(nodes) - 1))
    old = nodes[old_index]
    new = data.draw(st.sampled_from(nodes[:old_index]))
    users_before = list(old.users)
    keep = data.draw(st.sets(st.sampled_from(users_before))) if users_before else set()
    changed = old.replace_all_uses_with(new, delete_user_cb=lambda user: user not in keep)
    assert changed == [u for u in users_before if u not in keep]
    assert set(old.users) == keep


def rewire_an_argument(data: st.DataObject, g: fx.Graph) -> None:
    """Point the first argument of a call at another earlier value."""
    nodes = list(g.nodes)
    calls = [n for n in nodes if usable(n) and n.op != "placeholder" and type(n.args[0]) is fx.Node]
    if not calls:
        return
    node = data.draw(st.sampled_from(calls))
    earlier = [n for n in nodes[: nodes.index(node)] if usable(n)]
    if earlier:
        node.update_arg(0, data.draw(st.sampled_from(earlier)))


def starting_graph(data: st.DataObject) -> fx.Graph:
    g = fx.Graph()
    values = [g.placeholder(f"in{i}") for i in range(data.draw(st.integers(1, 3)))]
    for _ in range(data.draw(st.integers(0, 6))):
        add_random_step(data, g, values)
    g.output(values[-1])
    return g


EDITS = {
    "erase": erase_unused,
    "insert": insert_somewhere,
    "replace": replace_uses,
    "rewire": rewire_an_argument,
}


@SETTINGS
@given(st.data())
def test_random_edits_keep_the_invariants(data):
    g = starting_graph(data)
    check_invariants(g)
    for edit in data.draw(st.lists(st.sampled_from(sorted(EDITS)), max_size=20)):
        EDITS[edit](data, g)
        check_invariants(g)


@SETTINGS
@given(st.data())
def test_random_edits_then_dead_code_elimination_still_run_like_the_reference(data):
    g = starting_graph(data)
    for edit in data.draw(st.lists(st.sampled_from(sorted(EDITS)), max_size=12)):
        EDITS[edit](data, g)
    inputs = [torch.randn(SHAPE) for _ in g.find_nodes(op="placeholder")]
    expected = evaluate(g, inputs)
    g.eliminate_dead_code()
    check_invariants(g)
    assert all(n.users or n.is_impure() for n in g.nodes)
    assert_close(fx.GraphModule(torch.nn.Module(), g)(*inputs), expected)
