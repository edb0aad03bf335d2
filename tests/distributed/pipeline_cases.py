"""The models the pipeline tests cut, and the checks each rank runs (imported by spawned ranks).

Every case is built the same way in the test process and in each rank (fixed seeds), so a
rank's stage holds the same weights as the single-process reference. Models run in eval mode
(no dropout, BatchNorm on its running statistics) with gradients on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fxloom import zoo
from fxloom.zoo.hf_configs import BERT_LIKE, DECODER, GPT2_LIKE, VOCAB, hf

MICROBATCHES = 4
MICROBATCH = 2
SEQ = 8


@dataclass
class Case:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int], dict[str, torch.Tensor]]  # batch -> inputs by name
    target: Callable[[int], torch.Tensor]
    loss: Callable[[Any, torch.Tensor], torch.Tensor]


def _ids(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


def lm_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def hidden_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    return (output.last_hidden_state - target).pow(2).mean()


def image_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, target)


def _seeded(factory: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return factory().eval()

    return build


def _resnet() -> torch.nn.Module:
    model, _ = zoo.build("resnet_tiny")
    return model


def _images(batch: int) -> dict[str, torch.Tensor]:
    (example,) = zoo.build("resnet_tiny")[1]
    shape = (batch, *example.shape[1:])
    return {"x": torch.randn(shape, generator=torch.Generator().manual_seed(1))}


CASES = {
    "gpt2": Case(
        "gpt2",
        _seeded(hf("GPT2LMHeadModel", "GPT2Config", **GPT2_LIKE)),
        lambda b: {"input_ids": _ids(b)},
        lambda b: _ids(b, seed=5),
        lm_loss,
    ),
    "bert": Case(
        "bert",
        _seeded(hf("BertModel", "BertConfig", **BERT_LIKE)),
        lambda b: {"input_ids": _ids(b)},
        lambda b: torch.randn(b, SEQ, 32, generator=torch.Generator().manual_seed(5)),
        hidden_loss,
    ),
    "llama": Case(
        "llama",
        _seeded(hf("LlamaForCausalLM", "LlamaConfig", **DECODER)),
        lambda b: {"input_ids": _ids(b)},
        lambda b: _ids(b, seed=5),
        lm_loss,
    ),
    "resnet": Case(
        "resnet",
        _seeded(_resnet),
        _images,
        lambda b: torch.randint(0, 10, (b,), generator=torch.Generator().manual_seed(5)),
        image_loss,
    ),
}


def batch_of(case: Case) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A whole batch (MICROBATCHES microbatches) of inputs and targets."""
    size = MICROBATCH * MICROBATCHES
    return case.inputs(size), case.target(size)


def single_process(case: Case) -> dict[str, Any]:
    """What the pipeline must reproduce: per-microbatch losses, mean gradients, outputs."""
    model = case.build()
    inputs, target = batch_of(case)
    losses, outputs = [], []
    for index in range(MICROBATCHES):
        part = slice(index * MICROBATCH, (index + 1) * MICROBATCH)
        output = model(**{k: v[part] for k, v in inputs.items()})
        loss = case.loss(output, target[part])
        loss.backward()
        losses.append(loss.detach())
        outputs.append(_logits(output).detach())
    # torch's schedules divide gradients by the number of microbatches (scale_grads=True)
    grads = {n: _grad(p) / MICROBATCHES for n, p in model.named_parameters(remove_duplicate=False)}
    return {"losses": losses, "output": torch.cat(outputs), "grads": grads}


def _grad(parameter: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient; zeros for one the loss does not reach (BERT's pooler here)."""
    return torch.zeros_like(parameter) if parameter.grad is None else parameter.grad.clone()


def _logits(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    return output[0]


SCHEDULES = ("GPipe", "1F1B")


def run_rank(rank: int, world_size: int, names: list[str], sync: bool = True) -> dict[str, Any]:
    """Cut each case into ``world_size`` stages, train one step per schedule; report this rank's part."""
    from torch.distributed import pipelining

    import fxloom.distributed

    results: dict[str, Any] = {}
    for name in names:
        case = CASES[name]
        model = case.build()
        inputs, target = batch_of(case)
        microbatch = {k: v[:MICROBATCH] for k, v in inputs.items()}
        plan = fxloom.distributed.pipeline(model, microbatch, stages=world_size)
        for schedule_name in SCHEDULES:
            stage = plan.build_stage(rank, torch.device("cpu"))
            schedule = getattr(pipelining, f"Schedule{schedule_name}")(
                stage, n_microbatches=MICROBATCHES, loss_fn=plan.loss(case.loss)
            )
            losses: list[torch.Tensor] = []
            if rank == 0:
                schedule.step(**inputs)
                output = None
            else:
                output = schedule.step(target=target, losses=losses)
            if sync:
                plan.sync_shared_grads(stage)
            grads = {n: _grad(p) for n, p in stage.submod.named_parameters(remove_duplicate=False)}
            model.zero_grad(set_to_none=True)
            results[f"{name}/{schedule_name}"] = {
                "grads": grads,
                "losses": [loss.detach() for loss in losses],
                "output": None if output is None else _logits(plan.output(output)).detach(),
            }
    return results


TRAINED = ("gpt2", "bert", "llama", "resnet")


def run_all(rank: int, world_size: int) -> dict[str, Any]:
    """Everything the training test checks, in one spawn (a spawn costs ~20 s here).

    Each case with shared-gradient sync, and GPT-2 once more without it (keys ``nosync/...``).
    """
    results = run_rank(rank, world_size, list(TRAINED), sync=True)
    unsynced = run_rank(rank, world_size, ["gpt2"], sync=False)
    results.update({f"nosync/{key}": value for key, value in unsynced.items()})
    results["resnet/onnxruntime"] = run_inference(rank, world_size, "onnxruntime")
    example = _example_script()
    for schedule in ("1F1B", "Interleaved1F1B"):  # 2 stages, and 4 stages looped on 2 ranks
        results[f"example/{schedule}"] = example.train(rank, world_size, schedule)
    return results


def _example_script() -> Any:
    """``examples/pipeline_train.py``, the runnable example the docs point to."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "pipeline_train.py"
    spec = importlib.util.spec_from_file_location("pipeline_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_inference(rank: int, world_size: int, backend: str) -> Any:
    """ResNet cut in two, each stage compiled by ``backend``, run forward only (no loss)."""
    from torch.distributed import pipelining

    import fxloom.distributed

    case = CASES["resnet"]
    model = case.build()
    inputs, _ = batch_of(case)
    # Planned with positional inputs, as stage 0 receives them (``step(*inputs)``): a stage
    # compiled by ONNX Runtime takes its inputs by position only.
    plan = fxloom.distributed.pipeline(
        model, tuple(v[:MICROBATCH] for v in inputs.values()), stages=world_size
    )
    stage = plan.build_stage(rank, torch.device("cpu"), backend=backend, training=False)
    schedule = pipelining.ScheduleGPipe(stage, n_microbatches=MICROBATCHES)
    with torch.no_grad():
        output = schedule.step(*inputs.values()) if rank == 0 else schedule.step()
    return {
        "output": None if output is None else output.detach(),
        "module": type(stage.submod).__name__,
    }
