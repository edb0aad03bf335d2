"""Pipeline stages from ``fxloom.distributed.pipeline`` train as the model does in one process.

Two processes on loopback (gloo, one thread each) run GPT-2, BERT and Llama from tiny
configs and the embedded ResNet, each cut into 2 stages, under torch's own ``ScheduleGPipe``
and ``Schedule1F1B`` with 4 microbatches. The last rank's losses and outputs, and every
parameter's gradient on both ranks, must equal a single process running the same
microbatches (torch's schedules divide gradients by the number of microbatches, and so does
the reference). GPT-2 ties its embedding to its head, which the cut puts in different stages:
its gradients match only after ``plan.sync_shared_grads``.

One spawn serves the whole file (``tests/distributed/pipeline_cases.py`` runs in each rank).
"""

from __future__ import annotations

import pytest
import torch
from pipeline_cases import CASES, SCHEDULES, TRAINED, run_all, single_process

import fxloom.distributed

pytest.importorskip("transformers")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

ATOL = 1e-6


@pytest.fixture(scope="module")
def ranks(torch_distributed_checks_on) -> list[dict]:
    return fxloom.distributed.run_local(run_all, 2)


@pytest.fixture(scope="module")
def references() -> dict[str, dict]:
    return {name: single_process(CASES[name]) for name in TRAINED}


def _grads(ranks: list[dict], key: str) -> dict[str, torch.Tensor]:
    merged: dict[str, torch.Tensor] = {}
    for rank in ranks:
        merged.update(rank[key]["grads"])
    return merged


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", TRAINED)
def test_losses_equal_a_single_process(ranks, references, name, schedule):
    losses = ranks[1][f"{name}/{schedule}"]["losses"]
    assert len(losses) == 4
    torch.testing.assert_close(torch.stack(losses), torch.stack(references[name]["losses"]))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", TRAINED)
def test_outputs_equal_a_single_process(ranks, references, name, schedule):
    output = ranks[1][f"{name}/{schedule}"]["output"]
    torch.testing.assert_close(output, references[name]["output"])


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", TRAINED)
def test_every_gradient_equals_a_single_process(ranks, references, name, schedule):
    grads = _grads(ranks, f"{name}/{schedule}")
    expected = references[name]["grads"]
    assert grads.keys() == expected.keys()  # every parameter, under its original name
    for parameter, grad in grads.items():
        torch.testing.assert_close(grad, expected[parameter], atol=ATOL, rtol=1e-5, msg=parameter)


def test_each_rank_holds_only_its_stage(ranks, references):
    stage0 = set(ranks[0]["gpt2/GPipe"]["grads"])
    stage1 = set(ranks[1]["gpt2/GPipe"]["grads"])
    assert stage0 and stage1 and not stage0 & stage1
    assert stage0 | stage1 == set(references["gpt2"]["grads"])
    assert "transformer.wte.weight" in stage0 and "lm_head.weight" in stage1


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_tied_embedding_matches_only_with_shared_gradient_sync(ranks, references, schedule):
    expected = references["gpt2"]["grads"]["transformer.wte.weight"]
    synced = ranks[0][f"gpt2/{schedule}"]["grads"]["transformer.wte.weight"]
    unsynced = ranks[0][f"nosync/gpt2/{schedule}"]["grads"]["transformer.wte.weight"]
    torch.testing.assert_close(synced, expected, atol=ATOL, rtol=1e-5)
    assert (unsynced - expected).abs().max() > 1e-3  # the head's share is missing
    head = ranks[1][f"gpt2/{schedule}"]["grads"]["lm_head.weight"]
    torch.testing.assert_close(head, synced)  # both copies step alike


def test_stages_compiled_by_onnxruntime_run_inference(ranks, references):
    """A forward-only schedule (no loss) may run stages in another backend."""
    pytest.importorskip("onnxruntime")
    assert ranks[0]["resnet/onnxruntime"]["module"] == "OrtModule"
    output = ranks[1]["resnet/onnxruntime"]["output"]
    torch.testing.assert_close(output, references["resnet"]["output"], atol=1e-5, rtol=1e-4)


def test_a_backend_that_cannot_run_backward_is_refused_for_training():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    plan = fxloom.distributed.pipeline(model, (torch.randn(2, 4),), stages=1, balance="flops")
    with pytest.raises(ValueError, match="cannot run backward"):
        fxloom.distributed.plan._compiled(
            plan.stage_modules[0], (torch.randn(2, 4),), "onnxruntime", training=True
        )


def test_the_example_trains_under_a_looped_schedule_as_under_1f1b(ranks):
    """examples/pipeline_train.py: 4 stages looped on 2 ranks (Interleaved1F1B) learn exactly
    what 2 stages under 1F1B learn, step after step."""
    two_stages = ranks[1]["example/1F1B"]
    looped = ranks[1]["example/Interleaved1F1B"]
    assert len(two_stages) == 3 and two_stages[-1] < two_stages[0]  # it learns
    assert looped == two_stages
