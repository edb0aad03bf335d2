"""Pipeline stages: fxloom.distributed.pipeline against torch.distributed.pipelining.pipeline.

    python benchmarks/bench_pipeline.py [--quick] [--repeats N] [--record]

Four parts, each side measured in the same run, runs interleaved (the two tools take turns)
and repeated, medians reported:

1. **Split time** (one process) on GPT-2, BERT and Llama from tiny configs and the embedded
   ResNet, cut into 2 stages: torch's ``pipeline()`` (it exports the model, then splits at a
   ``split_spec`` at the equal-layer boundary) against fxloom's ``pipeline`` with
   ``balance="time"`` (trace, time every node on the microbatch, choose the cut) and
   ``"flops"``. Both tools' stages, run one after another, are checked against eager.
   Target (issue 25): fxloom at most 0.1 of pipeline()'s time.
2. **Stage balance** on a deliberately unbalanced model: a Llama-like decoder (8 layers) with
   a large vocabulary head. Each stage's forward + backward is timed alone in this process
   (one thread; the inputs it receives captured from a run of the stages before it);
   balance = the slowest stage over the mean. torch: the equal-layer split
   (``model.layers.4``); fxloom: ``balance="time"``. Target: fxloom at most 1.10.
3. **Bytes across each boundary** per microbatch, both tools (from part 1's stages).
4. **Throughput** of fxloom's stages on 2 processes (gloo, loopback, one thread each) for
   ``ScheduleGPipe`` and ``Schedule1F1B`` at 4 and 8 microbatches: training step time
   against one process running the same stage modules one after another on the same
   microbatches (one thread), and the bubble bound on the speed-up,
   p * m / (m + p - 1) for p stages and m microbatches. This machine has 2 cores, so at most
   2 stages truly run in parallel; gloo on loopback moves ~1 GB/s.

Depends on: torch (torch.distributed.pipelining, torch.export through it, as the peer),
transformers, fxloom.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from benchmarks._common import load_average, machine_line, noise_line, publish
from fxloom import pytree

MICROBATCH, SEQ = 4, 32
UNBALANCED = dict(  # a Llama-like decoder whose head costs as much as several layers
    vocab_size=6000,
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    use_cache=False,  # training: no cache (torch.export cannot output one either)
)


# ----------------------------------------------------------------------------- the models
def _models() -> dict[str, tuple[Any, dict[str, torch.Tensor], str]]:
    """name -> (builder, one microbatch of inputs by name, torch's equal-layer split point)."""
    from fxloom import zoo
    from fxloom.zoo.hf_configs import BERT_LIKE, DECODER, GPT2_LIKE, VOCAB, hf

    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    image = zoo.build("resnet_tiny")[1][0]
    return {
        "gpt2": (hf("GPT2LMHeadModel", "GPT2Config", **GPT2_LIKE), {"input_ids": ids}, "transformer.h.1"),
        "bert": (hf("BertModel", "BertConfig", **BERT_LIKE), {"input_ids": ids}, "encoder.layer.1"),
        "llama": (hf("LlamaForCausalLM", "LlamaConfig", **DECODER), {"input_ids": ids}, "model.layers.1"),
        "resnet_tiny": (lambda: zoo.build("resnet_tiny")[0], {"x": image}, "layers.1"),
    }  # fmt: skip


def _unbalanced() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**UNBALANCED)).eval()
    ids = torch.randint(0, UNBALANCED["vocab_size"], (MICROBATCH, SEQ))
    return model, {"input_ids": ids}


def _build(builder: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    return builder().eval()


# ----------------------------------------------------------------------------- the tools
def torch_split(model: torch.nn.Module, inputs: dict, split_at: str) -> Any:
    from torch.distributed.pipelining import SplitPoint, pipeline

    # pipeline() patches the forward of the module it splits at: give it a copy
    return pipeline(
        copy.deepcopy(model),
        mb_args=(),
        mb_kwargs=inputs,
        split_spec={split_at: SplitPoint.BEGINNING},
    )


def fxloom_split(model: torch.nn.Module, inputs: dict, balance: str) -> Any:
    import fxloom.distributed

    return fxloom.distributed.pipeline(model, inputs, stages=2, balance=balance)


def _torch_stage_inputs(pipe: Any, inputs: dict) -> list[tuple[tuple, dict]]:
    """What each of torch's stage modules receives on ``inputs`` (captured by hooks)."""
    captured: list[tuple[tuple, dict]] = []
    hooks = [
        pipe.get_stage_module(i).register_forward_pre_hook(
            lambda _m, args, kwargs: captured.append((args, kwargs)), with_kwargs=True
        )
        for i in range(pipe.num_stages)
    ]
    with torch.no_grad():  # split_gm's own forward refuses calls: run its graph
        output = torch.fx.Interpreter(pipe.split_gm).run(*inputs.values())
    for hook in hooks:
        hook.remove()
    return captured, output


def _fxloom_stage_inputs(plan: Any, inputs: dict) -> tuple[list[tuple[tuple, dict]], Any]:
    captured = [((), dict(inputs))]
    with torch.no_grad():
        value = plan.stage_modules[0](**inputs)
        for module in plan.stage_modules[1:]:
            captured.append((tuple(value), {}))
            value = module(*value)
    return captured, plan.output(value)


_leaves = pytree.tensor_leaves


def _same(got: Any, expected: Any) -> bool:
    a, b = _leaves(got), _leaves(expected)
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(a, b)
    )


def _bytes(values: tuple) -> int:
    return sum(t.numel() * t.element_size() for t in _leaves(values))


# ----------------------------------------------------------------------------- part 1 and 3
def split_times(repeats: int, quick: bool) -> list[dict]:
    rows = []
    for name, (builder, inputs, split_at) in _models().items():
        if quick and name not in ("gpt2", "resnet_tiny"):
            continue
        model = _build(builder)
        inputs, torch_failure = _inputs_torch_takes(model, inputs, split_at)
        with torch.no_grad():
            expected = model(**inputs)
        times: dict[str, list[float]] = {"torch": [], "time": [], "flops": []}
        results: dict[str, Any] = {}
        for _ in range(repeats):
            for method in ("torch", "time", "flops"):  # interleaved
                start = time.perf_counter()
                if method == "torch":
                    results[method] = torch_split(model, inputs, split_at)
                else:
                    results[method] = fxloom_split(model, inputs, method)
                times[method].append(time.perf_counter() - start)
        try:
            torch_inputs, torch_out = _torch_stage_inputs(results["torch"], inputs)
        except Exception as error:  # torch's stages fail to run: reported
            print(f"  torch's stages of {name} do not run: {str(error).splitlines()[0][:100]}")
            torch_inputs, torch_out = [((), {}), ((), {})], None
        fx_inputs, fx_out = _fxloom_stage_inputs(results["time"], inputs)
        rows.append(
            {
                "model": name,
                "torch": statistics.median(times["torch"]),
                "time": statistics.median(times["time"]),
                "flops": statistics.median(times["flops"]),
                "torch_equal": "does not run" if torch_out is None else _same(torch_out, expected),
                "fxloom_equal": _same(fx_out, expected),
                "torch_bytes": _bytes(torch_inputs[1][0]) + _bytes(torch_inputs[1][1]),
                "fxloom_bytes": _bytes(fx_inputs[1][0]),
                "torch_count": len(_leaves(torch_inputs[1])),
                "fxloom_count": len(fx_inputs[1][0]),
                "fxloom_cut": results["time"].stages[1].first,
                "torch_cut": split_at,
                "torch_failure": torch_failure,
            }
        )
        print(f"  split {name}: torch {rows[-1]['torch']:.3f} s, fxloom {rows[-1]['time']:.3f} s")
    return rows


def _inputs_torch_takes(model: Any, inputs: dict, split_at: str) -> tuple[dict, str]:
    """The inputs as a user passes them, or, where torch's pipeline() fails on those (a
    decoder's default ``use_cache`` returns a cache object torch.export cannot output), the
    same with ``use_cache=False``; both tools are then timed on what torch takes."""
    try:
        torch_split(model, inputs, split_at)
        return inputs, ""
    except Exception as error:  # the peer's failure is a finding, reported in the table
        first = str(error).strip().splitlines()[0][:80]
    return {
        **inputs,
        "use_cache": False,
    }, f"default inputs fail ({first}); timed with use_cache=False"


# ----------------------------------------------------------------------------- part 2
def _stage_time(module: Any, args: tuple, kwargs: dict, repeats: int) -> float:
    """Median forward + backward time of one stage on its captured inputs."""

    def once() -> float:
        inputs = tuple(
            a.detach().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
            for a in args
        )
        start = time.perf_counter()
        out = module(*inputs, **kwargs)
        floats = [t for t in _leaves(out) if t.is_floating_point() and t.requires_grad]
        torch.autograd.backward(floats, [torch.ones_like(t) for t in floats])
        return time.perf_counter() - start

    once()  # warm-up
    return statistics.median(once() for _ in range(repeats))


def _equal_layers(node: Any) -> float:
    """A balance giving each decoder layer the same cost and nothing else any: torch's
    equal-layer split (``model.layers.4``), made with fxloom's stage machinery."""
    from fxloom.distributed.cuts import block_of

    return 1.0 if block_of(node).startswith("model.layers.") else 0.0


def stage_balance(repeats: int) -> dict:
    """Per-stage forward + backward time of fxloom's "time" cut and of the equal-layer cut.

    torch's own stages are timed when they run outside a PipelineStage; otherwise (Llama's
    unflattened stage modules fail to run on their own in torch 2.13) the equal-layer cut is
    made with fxloom's machinery, so both rows differ only in where the cut is."""
    model, inputs = _unbalanced()
    plan = fxloom_split(model, inputs, "time")
    fx_inputs, _ = _fxloom_stage_inputs(plan, inputs)
    pipe = torch_split(model, inputs, "model.layers.4")
    try:
        torch_inputs, _ = _torch_stage_inputs(pipe, inputs)
        torch_modules = [pipe.get_stage_module(i) for i in range(pipe.num_stages)]
        peer = "torch pipeline() stages"
    except Exception:
        import fxloom.distributed

        equal = fxloom.distributed.pipeline(model, inputs, stages=2, balance=_equal_layers)
        torch_inputs, _ = _fxloom_stage_inputs(equal, inputs)
        torch_modules = equal.stage_modules
        peer = "fxloom stages cut where torch's split_spec cuts (torch's own do not run alone)"
    fx_times: list[list[float]] = [[] for _ in plan.stage_modules]
    torch_times: list[list[float]] = [[] for _ in torch_modules]
    for _ in range(repeats):  # interleaved: each stage of each tool in turn
        for i, module in enumerate(plan.stage_modules):
            fx_times[i].append(_stage_time(module, *fx_inputs[i], repeats=3))
        for i, module in enumerate(torch_modules):
            torch_times[i].append(_stage_time(module, *torch_inputs[i], repeats=3))
    fx = [statistics.median(t) for t in fx_times]
    tt = [statistics.median(t) for t in torch_times]
    return {
        "fxloom": fx,
        "torch": tt,
        "fxloom_balance": max(fx) / statistics.mean(fx),
        "torch_balance": max(tt) / statistics.mean(tt),
        "fxloom_cut": plan.stages[1].first,
        "planned_balance": plan.balance_ratio,
        "peer": peer,
    }


# ----------------------------------------------------------------------------- part 4
def _train_rank(rank: int, world: int, schedules: list[tuple[str, int]], steps: int) -> dict:
    import torch.distributed as dist
    from torch.distributed import pipelining

    import fxloom.distributed

    model, inputs = _unbalanced()
    plan = fxloom.distributed.pipeline(model, inputs, stages=world, balance="time")
    stage = plan.build_stage(rank, torch.device("cpu"))
    loss = plan.loss(
        lambda out, target: F.cross_entropy(out.logits.flatten(0, 1), target.flatten())
    )
    times: dict[str, list[float]] = {}
    for _ in range(steps):
        for name, microbatches in schedules:  # interleaved
            batch = {"input_ids": inputs["input_ids"].repeat(microbatches, 1)}
            target = batch["input_ids"]
            schedule = getattr(pipelining, f"Schedule{name}")(
                stage, n_microbatches=microbatches, loss_fn=loss
            )
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                schedule.step(**batch)
            else:
                schedule.step(target=target, losses=[])
            dist.barrier()
            times.setdefault(f"{name}/{microbatches}", []).append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
    return {key: statistics.median(values[1:] or values) for key, values in times.items()}


def _single_process(microbatches: int, repeats: int) -> float:
    """One process running the same stage modules one after another on every microbatch."""
    import fxloom.distributed

    model, inputs = _unbalanced()
    plan = fxloom.distributed.pipeline(model, inputs, stages=2, balance="time")
    ids = inputs["input_ids"]

    def step() -> float:
        start = time.perf_counter()
        for _ in range(microbatches):
            out = plan.stage_modules[1](*plan.stage_modules[0](input_ids=ids))
            logits = plan.output(out).logits
            F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    step()
    return statistics.median(step() for _ in range(repeats))


def throughput(repeats: int, quick: bool) -> list[dict]:
    import fxloom.distributed

    schedules = [(name, m) for name in ("GPipe", "1F1B") for m in ((4,) if quick else (4, 8))]
    pipelined = fxloom.distributed.run_local(_train_rank, 2, args=(schedules, repeats + 1))[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = {m: _single_process(m, repeats) for m in {m for _, m in schedules}}
    finally:
        torch.set_num_threads(threads)
    rows = []
    for name, m in schedules:
        step = pipelined[f"{name}/{m}"]
        rows.append(
            {
                "schedule": name,
                "microbatches": m,
                "step": step,
                "single": single[m],
                "speedup": single[m] / step,
                "bound": 2 * m / (m + 1),
            }
        )
    return rows


# ----------------------------------------------------------------------------- report
def report(splits: list[dict], balance: dict, rates: list[dict], loads: tuple, args: Any) -> str:
    lines = [
        f"## Pipeline stages: fxloom.distributed.pipeline vs torch.distributed.pipelining — {time.strftime('%Y-%m-%d')}",
        "",
        machine_line()
        + f"; `python benchmarks/bench_pipeline.py{' --quick' if args.quick else ''} --repeats {args.repeats}`",
        "",
        "### Split time, 2 stages (one process; median of interleaved runs)",
        "",
        "| model | torch pipeline() s | fxloom time s | fxloom flops s | fxloom(time) / torch | target | cut: torch / fxloom | equal to eager: torch / fxloom |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    for r in splits:
        ratio = r["time"] / r["torch"]
        lines.append(
            f"| {r['model']} | {r['torch']:.3f} | {r['time']:.3f} | {r['flops']:.3f} | {ratio:.3f} | "
            f"{'meets' if ratio <= 0.1 else '**misses**'} (<= 0.1) | {r['torch_cut']} / {r['fxloom_cut']} | "
            f"{r['torch_equal']} / {r['fxloom_equal']} |"
        )
    for r in splits:
        if r["torch_failure"]:
            lines.append(
                f"\n{r['model']}: torch pipeline() {r['torch_failure']}; fxloom splits the default too."
            )
    lines += [
        "",
        "### Bytes across the boundary, per microbatch",
        "",
        "| model | torch: tensors, bytes | fxloom: tensors, bytes |",
        "|---|---:|---:|",
    ]
    for r in splits:
        lines.append(
            f"| {r['model']} | {r['torch_count']}, {r['torch_bytes']} | {r['fxloom_count']}, {r['fxloom_bytes']} |"
        )
    fx, tt = balance["fxloom"], balance["torch"]
    lines += [
        "",
        "### Stage balance on an unbalanced Llama-like decoder (8 layers, vocabulary 6000; forward + backward per stage, ms)",
        "",
        "| split | stage 0 | stage 1 | max / mean | target |",
        "|---|---:|---:|---:|---|",
        f"| equal layers (model.layers.4): {balance['peer']} | {tt[0] * 1e3:.1f} | {tt[1] * 1e3:.1f} | {balance['torch_balance']:.2f} | reported |",
        f'| fxloom, balance="time" (cut at {balance["fxloom_cut"]}) | {fx[0] * 1e3:.1f} | {fx[1] * 1e3:.1f} | {balance["fxloom_balance"]:.2f} | '
        f"{'meets' if balance['fxloom_balance'] <= 1.10 else '**misses**'} (<= 1.10) |",
        "",
        "### Throughput, fxloom stages on 2 processes (training step, median; one process = the same microbatches in one process, one thread)",
        "",
        "| schedule | microbatches | step ms | one process ms | speed-up | bubble bound p*m/(m+p-1) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rates:
        lines.append(
            f"| {r['schedule']} | {r['microbatches']} | {r['step'] * 1e3:.1f} | {r['single'] * 1e3:.1f} | "
            f"{r['speedup']:.2f} | {r['bound']:.2f} |"
        )
    lines += ["", noise_line(loads, "; two cores: at most two stages run truly in parallel.")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer models and repeats")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions")
    parser.add_argument("--record", action="store_true", help="append the tables to RESULTS.md")
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else args.repeats
    before = load_average()
    torch.set_num_threads(1)
    print("split time ...")
    splits = split_times(repeats, args.quick)
    print("stage balance ...")
    balance = stage_balance(repeats)
    print("throughput (2 processes) ...")
    rates = throughput(repeats, args.quick)
    publish(report(splits, balance, rates, (before, load_average()), args), args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
