"""``fxloom.export.unflatten``: an exported program rebuilt as the source model's module tree.

Each test checks one promise against the source model, eager PyTorch, ``ep.module()``, or
``torch.export.unflatten`` on the same model (imported here only to compare with): the
module names, the numerics, which operators each submodule's graph holds, repeated calls
of one module, buffer writes, and the cases that are refused with the module named.
"""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import pytest
import torch
import torch.export
from torch.testing import assert_close

from fxloom.export import ExportedProgram, export, unflatten
from fxloom.export.unflattening import UnflattenError
from fxloom.graph_module import GraphModule
from fxloom.zoo import resnet_tiny, resnet_tiny_inputs, transformer_tiny, transformer_tiny_inputs

ZOO = {
    "resnet_tiny": (resnet_tiny, resnet_tiny_inputs),
    "transformer_tiny": (transformer_tiny, transformer_tiny_inputs),
}


def zoo_model(name: str) -> tuple[torch.nn.Module, tuple]:
    build, inputs = ZOO[name]
    torch.manual_seed(0)
    return build().eval(), tuple(inputs())


@functools.cache
def exported(name: str) -> tuple[torch.nn.Module, tuple, ExportedProgram]:
    """A zoo model, its inputs and its export, shared by the tests that only read them."""
    model, args = zoo_model(name)
    return model, args, export(model, args)


def module_names(module: torch.nn.Module) -> list[str]:
    return [name for name, _ in module.named_modules()]


def graphs(tree: torch.nn.Module) -> dict[str, GraphModule]:
    return {name: m for name, m in tree.named_modules() if isinstance(m, GraphModule)}


def called(tree: torch.nn.Module) -> dict[str, list[str]]:
    """For each module whose graph calls others: the ``call_module`` targets, in order."""
    calls = {}
    for name, module in tree.named_modules():
        graph = getattr(module, "graph", None)
        targets = [n.target for n in graph.nodes if n.op == "call_module"] if graph else []
        if targets:
            calls[name] = targets
    return calls


class Twice(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(self.lin(x)).relu()


# ------------------------------------------------------------------ module tree


@pytest.mark.parametrize("name", sorted(ZOO))
def test_module_tree_is_the_source_models(name):
    model, _, ep = exported(name)
    assert module_names(unflatten(ep)) == module_names(model)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_module_names_and_calls_match_torch_export_unflatten(name):
    model, args, ep = exported(name)
    ours = unflatten(ep)
    theirs = torch.export.unflatten(torch.export.export(model, args))
    assert module_names(ours) == module_names(theirs)
    assert called(ours) == called(theirs)


def test_submodules_are_graph_modules_named_for_their_class():
    model, _, ep = exported("resnet_tiny")
    tree = unflatten(ep)
    block = tree.get_submodule("layers.1")
    assert isinstance(block, GraphModule)
    assert type(block).__name__ == type(model.get_submodule("layers.1")).__name__
    assert type(tree).__name__ == type(model).__name__


@pytest.mark.parametrize("name", sorted(ZOO))
def test_each_submodule_graph_holds_only_its_own_operators(name):
    _, _, ep = exported(name)
    for path, module in graphs(unflatten(ep)).items():
        for node in module.graph.find_nodes(op="call_function"):
            stack = node.meta.get("nn_module_stack")
            if stack is None:  # a check or a getitem of a child's results
                continue
            innermost = list(stack.values())[-1][0] if stack else ""
            assert innermost == path, f"%{node.name} of {innermost!r} is in {path!r}'s graph"


def test_children_are_called_by_their_name_relative_to_the_caller():
    tree = unflatten(exported("transformer_tiny")[2])
    assert called(tree)["blocks.0.attention"] == ["qkv", "out"]
    assert called(tree)[""][2:4] == ["blocks.0", "blocks.1"]


def test_parameters_are_read_by_the_module_that_owns_them():
    model, _, ep = exported("resnet_tiny")
    tree = unflatten(ep)
    conv = tree.get_submodule("layers.0.conv1")
    assert [n.target for n in conv.graph.find_nodes(op="get_attr")] == ["weight"]
    assert conv.weight is ep.state_dict["layers.0.conv1.weight"]
    assert dict(tree.named_parameters()).keys() == dict(model.named_parameters()).keys()
    assert dict(tree.named_buffers()).keys() == dict(model.named_buffers()).keys()


def test_a_module_registered_under_two_names_keeps_both_as_torch_export_unflatten_does():
    class Aliased(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = torch.nn.Linear(3, 3)
            self.second = self.first

        def forward(self, x):
            return self.second(x).relu()

    model, x = Aliased(), torch.randn(2, 3)
    ours = unflatten(export(model, (x,)))
    theirs = torch.export.unflatten(torch.export.export(model, (x,)))
    assert module_names(ours) == module_names(theirs) == ["", "first", "second"]
    assert_close(ours(x), model(x))


def test_a_module_that_ran_no_operator_is_an_empty_module_at_its_path():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).eval()
    tree = unflatten(export(model, (torch.randn(1, 2),)))
    assert module_names(tree) == ["", "0", "1"]
    assert not isinstance(tree.get_submodule("1"), GraphModule)


# ------------------------------------------------------------------ numerics


@pytest.mark.parametrize("name", sorted(ZOO))
def test_computes_what_eager_and_ep_module_compute(name):
    model, args, ep = exported(name)
    with torch.no_grad():
        got = unflatten(ep)(*args)
        assert_close(got, model(*args))
        assert_close(got, ep.module()(*args))


def test_a_submodule_runs_on_its_own():
    model, _, ep = exported("resnet_tiny")
    block = unflatten(ep).get_submodule("layers.0")
    (placeholder,) = block.graph.find_nodes(op="placeholder")
    x = torch.randn(placeholder.meta["val"].shape)  # the shape it was exported for
    with torch.no_grad():
        assert_close(block(x), model.get_submodule("layers.0")(x))


def test_takes_and_returns_what_ep_module_does():
    class Pair(torch.nn.Module):
        def forward(self, pair, scale=2.0):
            return {"sum": pair["a"] + pair["b"] * scale, "first": pair["a"]}

    example = {"a": torch.randn(3), "b": torch.randn(3)}
    ep = export(Pair(), (example,))
    given = {"b": torch.ones(3), "a": torch.zeros(3)}
    got = unflatten(ep)(given)
    assert got.keys() == {"sum", "first"}
    assert_close(got, ep.module()(given))


def test_inputs_are_checked_as_ep_module_checks_them():
    tree = unflatten(exported("resnet_tiny")[2])
    with pytest.raises(ValueError, match="input 'x'.*exported for shape"):
        tree(torch.randn(1, 3, 5, 5))


@functools.cache
def bert() -> tuple[torch.nn.Module, dict, ExportedProgram]:
    """Hugging Face BERT from a tiny config (``benchmarks.zoo``), its inputs and its export."""
    pytest.importorskip("transformers")
    root = Path(__file__).resolve().parents[2]
    if str(root) not in sys.path:  # `benchmarks` is not installed; import it from the checkout
        sys.path.insert(0, str(root))
    from benchmarks.zoo import methods, registry

    model, inputs = registry.get("bert").build()
    flags = {k: v for k, v in methods.fixed_args(model, inputs).items() if k in methods.FLAGS}
    kwargs = {**inputs, **flags}
    return model, kwargs, export(model, (), kwargs)


def test_hugging_face_bert_keeps_its_tree_and_numerics():
    model, kwargs, ep = bert()
    tree = unflatten(ep)
    assert module_names(tree) == module_names(model)
    assert "encoder.layer.1.attention.self.query" in graphs(tree)
    with torch.no_grad():
        expected = model(**kwargs)
        assert_close(tree(**kwargs)["last_hidden_state"], expected["last_hidden_state"])


def test_hugging_face_bert_side_by_side_with_torch_export_unflatten():
    model, kwargs, ep = bert()
    ours = unflatten(ep)
    theirs = torch.export.unflatten(torch.export.export(model, (), kwargs))
    assert module_names(ours) == module_names(theirs)
    # torch.export keeps eval-mode dropout as an operator; fxloom's capture records none
    # for it (it returns its input), so those modules are never called here.
    dropouts = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Dropout)}

    def without_dropouts(calls: dict[str, list[str]]) -> dict[str, list[str]]:
        return {
            caller: [t for t in targets if f"{caller}.{t}".lstrip(".") not in dropouts]
            for caller, targets in calls.items()
        }

    assert called(ours) == without_dropouts(called(theirs))


# ------------------------------------------------------------------ repeated calls


def test_a_module_called_twice_is_called_twice_with_one_graph():
    model = Twice()
    x = torch.randn(2, 3)
    tree = unflatten(export(model, (x,)))
    assert called(tree) == {"": ["lin", "lin"]}
    assert len(tree.lin.graph.find_nodes(op="call_function")) == 2  # t, addmm: one call's
    assert_close(tree(x), model(x))


def test_a_module_called_twice_matches_torch_export_unflatten():
    model, x = Twice(), torch.randn(2, 3)
    ours = unflatten(export(model, (x,)))
    theirs = torch.export.unflatten(torch.export.export(model, (x,)))
    assert module_names(ours) == module_names(theirs)
    assert_close(ours(x), theirs(x))


def test_calls_that_run_different_operators_are_refused_naming_the_module():
    class Step(torch.nn.Module):
        def forward(self, x, double):
            return (x * 2).exp() if double else x + 1

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.step = Step()

        def forward(self, x):
            return self.step(self.step(x, True), False)

    ep = export(Model(), (torch.randn(3),))
    with pytest.raises(UnflattenError, match="module 'step' is called more than once"):
        unflatten(ep)


def test_a_module_called_from_outside_its_parent_is_refused_naming_both():
    class Borrower(torch.nn.Module):
        def __init__(self, lent: torch.nn.Module) -> None:
            super().__init__()
            self.lent = [lent]  # a plain list: not registered here

        def forward(self, x):
            return self.lent[0](x) + 1

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.borrower = Borrower(self.lin)

        def forward(self, x):
            return self.borrower(x)

    ep = export(Model(), (torch.randn(1, 2),))
    with pytest.raises(UnflattenError, match="module 'lin' runs inside 'borrower'"):
        unflatten(ep)


# ------------------------------------------------------------------ buffer writes


def batch_norm_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()


def test_batch_norm_in_train_mode_updates_buffers_as_eager_does():
    x = torch.randn(2, 3, 6, 6)
    eager = batch_norm_model()
    tree = unflatten(export(batch_norm_model(), (x,)))
    for _ in range(2):
        assert_close(tree(x), eager(x))
    assert_close(dict(tree.named_buffers()), dict(eager.named_buffers()))


def test_batch_norm_writes_its_buffers_in_its_own_graph():
    x = torch.randn(2, 3, 6, 6)
    tree = unflatten(export(batch_norm_model(), (x,)))
    copies = tree.get_submodule("1").graph.find_nodes(
        op="call_function", target=torch.ops.aten.copy_.default
    )
    assert len(copies) == 3  # running_mean, running_var, num_batches_tracked
    assert not tree.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default)


def test_batch_norm_updates_as_ep_module_does():
    x = torch.randn(2, 3, 6, 6)
    by_tree = unflatten(export(batch_norm_model(), (x,)))
    by_module = export(batch_norm_model(), (x,)).module()
    assert_close(by_tree(x), by_module(x))
    assert_close(dict(by_tree.named_buffers()), dict(by_module.named_buffers()))


class Writer(torch.nn.Module):
    """Writes its input and its buffer: ``x += 1``, ``buf = y``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(3))

    def forward(self, x, y):
        x.add_(1)
        self.buf.copy_(y)
        return x * 2


class WritesInASubmodule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.writer = Writer()

    def forward(self, x, y):
        return self.writer(x, y) + self.writer.buf


def test_writes_to_inputs_and_buffers_in_a_submodule_happen_as_in_eager():
    x, y = torch.randn(3), torch.randn(3)
    eager = WritesInASubmodule()
    tree = unflatten(export(WritesInASubmodule(), (x.clone(), y)))
    x_eager, x_tree = x.clone(), x.clone()
    assert_close(tree(x_tree, y), eager(x_eager, y))
    assert_close(x_tree, x_eager)
    assert_close(tree.writer.buf, y)


def test_a_submodule_that_only_writes_its_buffer_is_still_called():
    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self) -> None:
            self.calls.add_(1)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.counter = Counter()

        def forward(self, x):
            self.counter()
            return x * 2

    tree = unflatten(export(Model(), (torch.ones(2),)))
    tree(torch.ones(2))
    assert tree.counter() is None
    assert tree.counter.calls.item() == 2


def test_a_write_of_an_input_as_it_is_happens_at_the_end_of_the_root():
    ep = export(WritesInASubmodule(), (torch.randn(3), torch.randn(3)))
    output = ep.graph.find_nodes(op="output")[0]
    written = [spec.target for spec in ep.graph_signature.output_specs]
    y = ep.graph.find_nodes(op="placeholder", target="y")[0]
    results = list(output.args[0])
    results[written.index("writer.buf")] = y  # as a capture could record buf.copy_(y)
    output.args = (tuple(results),)
    tree = unflatten(ep)
    assert tree.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default)
    y_value = torch.randn(3)
    tree(torch.randn(3), y_value)
    assert_close(tree.writer.buf, y_value)


# ------------------------------------------------------------------ how calls are found


def test_a_node_recorded_after_its_module_returned_goes_to_the_caller():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Tanh())
    ep = export(model, (torch.randn(2, 3),))
    linear_stack = ep.graph.find_nodes(op="call_function")[0].meta["nn_module_stack"]
    late = ep.graph.find_nodes(op="call_function")[-1]  # tanh's, now as if recorded in "0"
    late.meta["nn_module_stack"] = linear_stack
    tree = unflatten(ep)
    assert late.name in [n.name for n in tree.graph.nodes]
    x = torch.randn(2, 3)
    assert_close(tree(x), model(x))


def test_without_the_module_hierarchy_the_tree_holds_the_modules_that_ran():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).eval()
    ep = export(model, (torch.randn(1, 2),))
    ep.module_hierarchy = {}  # as for a program built by other means
    tree = unflatten(ep)
    assert module_names(tree) == ["", "0"]
    assert type(tree).__name__ == "UnflattenedModule"


def test_stacks_not_shared_between_nodes_split_by_equal_neighbours():
    model, args = zoo_model("resnet_tiny")
    ep = export(model, args)
    for node in ep.graph.nodes:  # as if built elsewhere: every node its own entries
        stack = node.meta.get("nn_module_stack")
        if stack is not None:
            node.meta["nn_module_stack"] = copy.deepcopy(stack)
    tree = unflatten(ep)
    assert module_names(tree) == module_names(model)
    with torch.no_grad():
        assert_close(tree(*args), model(*args))
