"""``fxloom.distributed.pipeline`` in one process: the cuts, the boundaries, the stage modules.

What a plan promises before any process starts: stages that run one after another compute
the model (on the example and on other batch sizes and lengths), every boundary carries only
tensors, the stage modules keep the model's parameter names, the cuts balance the chosen
measure, and bad requests get errors that say what to do. The multi-process runs are in
``test_pipeline_training.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import fxloom
from fxloom import zoo
from fxloom.distributed import (
    BoundaryError,
    PipelineError,
    SharedParameterError,
    pipeline,
)
from fxloom.distributed.carried import carry, uncarry
from fxloom.distributed.cuts import choose_cuts
from fxloom.zoo.hf_configs import BERT_LIKE, GPT2_LIKE, VOCAB, hf

pytestmark = pytest.mark.usefixtures("one_thread")


def run_stages(plan, *args, **kwargs):
    """The stage modules run one after another, as the pipeline runs them."""
    value = plan.stage_modules[0](*args, **kwargs)
    for module in plan.stage_modules[1:]:
        value = module(*value)
    return plan.output(value)


def ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    return hf("GPT2LMHeadModel", "GPT2Config", **GPT2_LIKE)().eval()


@pytest.fixture(scope="module")
def gpt2_plan(gpt2):
    return pipeline(gpt2, {"input_ids": ids(2, 8)}, stages=2, balance="flops")


# ---------------------------------------------------------------- stages compute the model
@pytest.mark.parametrize("batch, length", [(2, 8), (3, 5)])
def test_stages_compute_gpt2_at_the_example_and_other_sizes(gpt2, gpt2_plan, batch, length):
    with torch.no_grad():
        out = run_stages(gpt2_plan, input_ids=ids(batch, length, seed=1))
        expected = gpt2(input_ids=ids(batch, length, seed=1))
    assert type(out) is type(expected)
    torch.testing.assert_close(out.logits, expected.logits)


def test_boundaries_carry_only_tensors(gpt2_plan):
    """GPT-2 computes its output shape (a torch.Size) before the first block and uses it after
    the last: the cut between them sends tensors only."""
    with torch.no_grad():
        sent = gpt2_plan.stage_modules[0](input_ids=ids(2, 8))
    assert isinstance(sent, tuple) and all(isinstance(t, torch.Tensor) for t in sent)
    placeholders = [n for n in gpt2_plan.stage_modules[1].graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(sent)
    assert gpt2_plan.output_specs[0] == gpt2_plan.input_specs[1]  # static metadata agrees


def test_what_crosses_a_cut_is_exactly_what_the_stage_declares(gpt2_plan):
    """Contiguous, floating tensors of the declared shapes and dtypes: torch 2.11 checks the
    strides it sends (an expanded mask has stride 0) and makes every receive buffer require
    grad, which an int64 index cannot; it crosses as float64 bytes and is turned back."""
    with torch.no_grad():
        sent = gpt2_plan.stage_modules[0](input_ids=ids(2, 8))
    declared = gpt2_plan.output_specs[0]
    assert len(sent) == len(declared)
    for tensor, spec in zip(sent, declared):
        assert tensor.is_contiguous() and tensor.is_floating_point()
        assert (tuple(tensor.shape), tensor.dtype) == (spec.shape, spec.dtype)


def test_an_integer_tensor_crosses_as_float_bytes_and_arrives_unchanged():
    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            index = x.argmax(-1)  # int64, computed before the cut and used after it
            hidden = self.first(x)
            return self.second(hidden) + index.unsqueeze(-1)

    torch.manual_seed(0)
    model, x = Positions(), torch.randn(2, 5, 4)
    plan = pipeline(model, (x,), stages=2)
    with torch.no_grad():
        torch.testing.assert_close(run_stages(plan, x), model(x))
        sent = plan.stage_modules[0](x)
    assert torch.float64 in {t.dtype for t in sent}  # the index, as its own bytes
    assert all(t.is_floating_point() and t.is_contiguous() for t in sent)


def test_a_training_stage_returns_a_gradient_for_every_tensor_it_received():
    """torch.distributed.pipelining sends one back for each; zeros where autograd reaches
    none (an activation used only for its shape), adding nothing where it does."""
    from fxloom.distributed.wire import with_input_gradients

    class UsesOneForItsShape(nn.Module):
        def forward(self, used, shape_only):
            return used * 2 + shape_only.shape[0]

    stage = with_input_gradients(UsesOneForItsShape())
    used, shape_only = (torch.ones(3, requires_grad=True) for _ in range(2))
    stage(used, shape_only).sum().backward()
    torch.testing.assert_close(used.grad, torch.full((3,), 2.0))
    torch.testing.assert_close(shape_only.grad, torch.zeros(3))
    assert dict(stage.named_parameters()) == dict(UsesOneForItsShape().named_parameters())


def test_a_size_that_cannot_be_recomputed_is_carried_as_a_tensor(gpt2_plan):
    def targets(stage):
        return {n.target for n in gpt2_plan.stage_modules[stage].graph.nodes}

    assert carry in targets(0) and uncarry in targets(1)


def test_carried_numbers_come_back_as_they_were():
    for value in (torch.Size([2, 8, 32]), (3, (4, 5)), [1.5, 2], 7, True):
        layout = fxloom.distributed.carried.layout_of(value)
        assert uncarry(carry(value), layout) == value
        assert type(uncarry(carry(value), layout)) is type(value)


def test_stage_modules_keep_the_model_parameter_names(gpt2, gpt2_plan):
    names = set()
    for module in gpt2_plan.stage_modules:
        names |= set(dict(module.named_parameters(remove_duplicate=False)))
    assert names == set(dict(gpt2.named_parameters(remove_duplicate=False)))


def test_the_model_is_not_modified(gpt2):
    before = gpt2.forward
    state = {k: v.clone() for k, v in gpt2.state_dict().items()}
    pipeline(gpt2, {"input_ids": ids(2, 8)}, stages=2, balance="flops")
    assert gpt2.forward == before
    for key, value in gpt2.state_dict().items():
        assert torch.equal(value, state[key])


def test_a_tensor_that_skips_a_stage_is_passed_through():
    class Skip(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(*[nn.Linear(8, 8) for _ in range(3)])

        def forward(self, x):
            return self.layers(x) + x  # x is used after the last layer

    model = Skip()
    plan = pipeline(model, (torch.randn(2, 8),), stages=3, balance="flops")
    x = torch.randn(5, 8)
    torch.testing.assert_close(run_stages(plan, x), model(x))
    middle = [n for n in plan.stage_modules[1].graph.nodes if n.op == "placeholder"]
    assert "x" in [n.name for n in middle]  # received and sent on


@pytest.mark.parametrize("balance", ["time", "flops", "memory"])
def test_every_balance_gives_a_working_plan(balance):
    model, inputs = zoo.build("resnet_tiny")
    model.eval()
    plan = pipeline(model, inputs, stages=2, balance=balance)
    with torch.no_grad():
        torch.testing.assert_close(run_stages(plan, *inputs), model(*inputs))
    assert plan.balance == balance and len(plan.stages) == 2


def test_flops_balance_splits_equal_layers_evenly():
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])
    plan = pipeline(model, (torch.randn(4, 64),), stages=2, balance="flops")
    assert [s.first for s in plan.stages] == ["0", "4"]
    assert plan.stages[0].flops == plan.stages[1].flops


class Wrapped(nn.Module):
    """A model inside another module (a loss or task head's), whose forward calls it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).relu()


def test_a_wrapped_model_is_cut_at_its_layers_at_any_depth():
    layers = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])
    model = Wrapped(Wrapped(layers))
    plan = pipeline(model, (torch.randn(4, 64),), stages=2, balance="flops")
    assert [s.first for s in plan.stages] == ["model.model.0", "model.model.4"]
    with torch.no_grad():
        torch.testing.assert_close(run_stages(plan, torch.ones(4, 64)), model(torch.ones(4, 64)))


def test_time_balance_reports_flops_and_how_the_times_were_measured():
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)])
    plan = pipeline(model, (torch.randn(4, 32),), stages=2, balance="time")
    assert all(stage.flops > 0 for stage in plan.stages)
    assert plan.timing.startswith("best of 5 runs at 1 thread, spread ")
    assert "times: best of 5 runs" in str(plan.report)


def test_timing_pins_torchs_threads_and_puts_them_back(monkeypatch):
    from fxloom.distributed import costs

    seen = []
    original = costs._TimingInterpreter.run_node

    def recording(self, node):
        seen.append(torch.get_num_threads())
        return original(self, node)

    monkeypatch.setattr(costs._TimingInterpreter, "run_node", recording)
    torch.set_num_threads(2)
    try:
        pipeline(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), (torch.randn(2, 4),), stages=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert seen and set(seen) == {1}


def test_a_balance_function_decides_the_cut():
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)])

    def only_the_first_layer_costs(node):
        return 1.0 if node.target == "0" else 0.0

    plan = pipeline(model, (torch.randn(4, 16),), stages=2, balance=only_the_first_layer_costs)
    assert plan.stages[0].first == "0" and plan.stages[0].last == "0"


def test_cut_at_nodes_allows_cuts_inside_a_block():
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)))
    with pytest.raises(PipelineError, match="cut_at='nodes'"):
        pipeline(model, (torch.randn(2, 8),), stages=4, cut_at="modules")
    plan = pipeline(model, (torch.randn(2, 8),), stages=3, cut_at="nodes")
    x = torch.randn(3, 8)
    torch.testing.assert_close(run_stages(plan, x), model(x))


def test_exported_programs_give_operator_level_stages():
    model, inputs = zoo.build("mlp_tiny")
    ep = fxloom.export.export(model.eval(), inputs)
    plan = pipeline(ep, inputs, stages=2, balance="flops")
    with torch.no_grad():
        torch.testing.assert_close(run_stages(plan, *inputs), model(*inputs))
    targets = [
        n.target for m in plan.stage_modules for n in m.graph.nodes if n.op == "call_function"
    ]
    assert any("aten" in str(t) for t in targets)


def test_bert_with_a_dict_of_inputs():
    torch.manual_seed(0)
    bert = hf("BertModel", "BertConfig", **BERT_LIKE)().eval()
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, -2:] = 0
    plan = pipeline(bert, {"input_ids": ids(2, 8), "attention_mask": mask}, stages=2)
    with torch.no_grad():
        out = run_stages(plan, input_ids=ids(2, 8, 3), attention_mask=mask)
        expected = bert(input_ids=ids(2, 8, 3), attention_mask=mask)
    torch.testing.assert_close(out.last_hidden_state, expected.last_hidden_state)


def test_the_report_names_stages_and_balance(gpt2_plan):
    text = str(gpt2_plan.report)
    assert "stage" in text and "balance" in text and "FLOPs" in text
    assert "shared: parameter shared by stages (0, 1)" in text
    assert gpt2_plan.balance_ratio >= 1.0


# ---------------------------------------------------------------- the cut chooser
def test_choose_cuts_minimises_the_costliest_stage():
    assert choose_cuts([1, 1, 1, 1], [0, 0, 0], 2) == [2]
    assert choose_cuts([3, 1, 1, 1], [0, 0, 0], 2) == [1]
    assert choose_cuts([1, 1, 1, 1, 4], [0, 0, 0, 0], 2) == [4]


def test_choose_cuts_avoids_a_costly_boundary():
    # the even cut (after segment 1) would send 10; one segment more on a side costs less
    assert choose_cuts([1, 1, 1, 1], [0, 10, 0], 2) in ([1], [3])


def test_a_costly_boundary_moves_the_cut_of_a_real_model():
    """Tiny layers: sending an activation costs more than a layer's FLOPs, so the flops
    balance gives the stage that sends one layer fewer."""
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(8)])
    plan = pipeline(model, (torch.randn(4, 16),), stages=2, balance="flops")
    assert [s.first for s in plan.stages] == ["0", "3"]


def test_choose_cuts_is_exact_on_small_cases():
    import itertools

    costs, sends = [5, 1, 4, 2, 2, 3, 1], [1, 0, 2, 0, 1, 3]
    for stages in (2, 3, 4):
        best = min(
            max(_stage_costs(costs, sends, cut))
            for cut in itertools.combinations(range(1, len(costs)), stages - 1)
        )
        chosen = choose_cuts(costs, sends, stages)
        assert max(_stage_costs(costs, sends, tuple(chosen))) == best


def _stage_costs(costs, sends, cuts):
    bounds = [0, *cuts, len(costs)]
    return [
        sum(costs[a:b]) + (sends[b - 1] if b < len(costs) else 0)
        for a, b in zip(bounds, bounds[1:])
    ]


# ---------------------------------------------------------------- errors
def test_more_stages_than_cut_points_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(PipelineError, match="cannot be cut into 5 stages: ask for at most 2"):
        pipeline(model, (torch.randn(2, 4),), stages=5)


def test_a_model_that_does_not_trace_says_how_to_capture_it():
    class ThroughNumpy(nn.Module):
        def forward(self, x):
            return torch.from_numpy(np.asarray(x) * 2)  # leaves torch: nothing to record

    with pytest.raises(fxloom.TraceError) as raised:
        pipeline(ThroughNumpy(), (torch.randn(2),), stages=1, balance="flops")
    assert "fxloom.distributed.pipeline" in str(raised.value) + "".join(
        getattr(raised.value, "__notes__", [])
    )


def test_a_shared_parameter_is_refused_when_asked(gpt2):
    with pytest.raises(SharedParameterError, match="shared='sync'"):
        pipeline(gpt2, {"input_ids": ids(2, 8)}, stages=2, balance="flops", shared="error")


def test_a_shared_buffer_updated_in_place_cannot_be_split():
    class SharedNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm1d(4)
            self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x):
            x = self.blocks[0](self.norm(x))
            return self.blocks[1](self.norm(x))

    model = SharedNorm().train()
    with pytest.raises(SharedParameterError, match="updated in place"):
        pipeline(model, (torch.randn(3, 4),), stages=3, balance="flops")


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.a(x), self.b(x)


def test_a_tuple_of_tensors_crosses_as_its_tensors():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Pair(), nn.Linear(4, 4)])

        def forward(self, x):
            pair = self.blocks[0](x)
            return self.blocks[1](pair[0]) * pair[1]

    model = TwoHeads()
    plan = pipeline(model, (torch.randn(2, 4),), stages=2, balance="flops")
    x = torch.randn(3, 4)
    torch.testing.assert_close(run_stages(plan, x), model(x))
    with torch.no_grad():
        sent = plan.stage_modules[0](x)
    assert all(isinstance(t, torch.Tensor) for t in sent)


class Box:
    """Not a tensor, a number or a tuple: nothing PipelineStage can send."""

    def __init__(self, value):
        self.value = value


def make_box(value):
    return Box(value)


fxloom.wrap("make_box")  # a leaf of tracing: its Box is a value in the graph


def test_a_value_that_cannot_be_sent_is_named():
    class Boxes(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x):
            box = make_box(self.blocks[0](x))
            return self.blocks[1](box.value)

    def cut_after_the_box(node):  # halves of equal cost meet between make_box and .value
        return 0.5 if node.op == "call_module" or node.target in (make_box, getattr) else 0.0

    with pytest.raises(BoundaryError, match=r"%make_box .* stage 0 .* stage 1, but a Box cannot"):
        pipeline(Boxes(), (torch.randn(2, 4),), stages=2, balance=cut_after_the_box, cut_at="nodes")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"stages": 0}, "stages=0"),
        ({"stages": 2, "balance": "speed"}, "balance='speed'"),
        ({"stages": 2, "cut_at": "layers"}, "cut_at='layers'"),
        ({"stages": 2, "shared": "ignore"}, "shared='ignore'"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with pytest.raises(ValueError, match=message):
        pipeline(model, (torch.randn(2, 4),), **kwargs)


# ---------------------------------------------------------------- saving stages
def test_stage_modules_save_and_load_in_a_fresh_interpreter(gpt2, gpt2_plan, tmp_path):
    """Each stage is a GraphModule fxloom.save writes (its carried sizes and output leaves are
    run-time functions on the allowlist) and a fresh process loads and runs."""
    import subprocess
    import sys

    for index, module in enumerate(gpt2_plan.stage_modules):
        fxloom.save(module, tmp_path / f"stage{index}.fxl")
    other = ids(3, 5, seed=4)
    with torch.no_grad():
        torch.save({"ids": other, "logits": gpt2(input_ids=other).logits}, tmp_path / "expected.pt")
    script = (
        "import sys, torch, fxloom\n"
        # the classes the last stage builds (its output, its cache): fxloom.load imports nothing
        "import transformers.cache_utils, transformers.modeling_outputs\n"
        "folder = sys.argv[1]\n"
        "first, last = (fxloom.load(f'{folder}/stage{i}.fxl') for i in (0, 1))\n"
        "expected = torch.load(f'{folder}/expected.pt')\n"
        "with torch.no_grad():\n"
        "    leaves = last(*first(input_ids=expected['ids']))\n"
        "print(torch.allclose(leaves[0], expected['logits'], atol=1e-6))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("True")
