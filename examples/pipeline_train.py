"""Train a model cut into pipeline stages by fxloom, on torch.distributed.pipelining.

Run it on this machine in two local processes (gloo on loopback), or under torchrun:

    python examples/pipeline_train.py                       # fxloom.distributed.run_local
    python examples/pipeline_train.py --schedule Interleaved1F1B
    torchrun --standalone --nproc-per-node 2 examples/pipeline_train.py

Each process builds the same model (same seed), asks fxloom for the same plan, builds its
own stage(s) and runs one of torch's schedules; the last rank prints the losses. With a
looped schedule (``Interleaved1F1B``) each rank holds two stages: rank r runs stages r and
r + world_size.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

import fxloom.distributed

MICROBATCHES, MICROBATCH, SEQ = 4, 2, 16


def build_model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=500,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,
    )
    return LlamaForCausalLM(config)


def lm_loss(output, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def train(rank: int, world_size: int, schedule_name: str = "1F1B") -> list[float]:
    from torch.distributed import pipelining

    looped = schedule_name in ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
    stages = world_size * (2 if looped else 1)
    model = build_model()
    ids = torch.randint(
        0, 500, (MICROBATCH * MICROBATCHES, SEQ), generator=torch.Generator().manual_seed(1)
    )
    plan = fxloom.distributed.pipeline(model, (ids[:MICROBATCH],), stages=stages)
    if rank == 0:
        print(plan.report)
    mine = [plan.build_stage(rank, "cpu", stage_index=i) for i in range(rank, stages, world_size)]
    schedule_class = getattr(pipelining, f"Schedule{schedule_name}")
    schedule = schedule_class(
        mine if looped else mine[0], n_microbatches=MICROBATCHES, loss_fn=plan.loss(lm_loss)
    )
    optimizer = torch.optim.SGD([p for s in mine for p in s.submod.parameters()], lr=0.1)
    history = []
    for _ in range(3):
        losses: list[torch.Tensor] = []
        last_rank = plan.rank_of(stages - 1, world_size)
        kwargs = {"target": ids, "losses": losses} if rank == last_rank else {}
        if rank == 0:  # positionally: torch hands keyword inputs to every stage of the rank
            schedule.step(ids, **kwargs)
        else:
            schedule.step(**kwargs)
        plan.sync_shared_grads(mine)
        optimizer.step()
        optimizer.zero_grad()
        if losses:
            history.append(round(float(torch.stack(losses).detach().mean()), 4))
    if history:
        print(f"rank {rank}: losses {history}")
    return history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="1F1B", help="GPipe, 1F1B, Interleaved1F1B, ...")
    args = parser.parse_args()
    if "RANK" in os.environ:  # under torchrun: this process is one rank
        import torch.distributed as dist

        dist.init_process_group("gloo")
        torch.set_num_threads(1)
        train(dist.get_rank(), dist.get_world_size(), args.schedule)
        dist.destroy_process_group()
    else:
        fxloom.distributed.run_local(train, 2, args=(args.schedule,))


if __name__ == "__main__":
    main()
