"""Hugging Face generate with a compiled forward: fxloom.compile against torch.compile, in compiles.

    python benchmarks/bench_generate_compiles.py [--record]

GPT-2 and Llama from tiny configs (random weights, nothing downloaded), eval mode, greedy
``generate`` with the default ``DynamicCache`` over issue 35's sequence: a 5-token prompt and 8
new tokens, 16 more tokens from that output, then a 9-token prompt and 8 new tokens. The
forward is compiled in place (``model.forward = compile(model.forward)``) by

- ``fxloom``: ``fxloom.compile`` (default options), compiles = ``explain().graph_count``;
- ``fxloom dynamic=True``: every size symbolic from the first call;
- ``dynamo``: ``torch.compile(backend=counter)``, compiles = the backend's calls.

Each (model, method) runs in a fresh process (``--worker MODEL METHOD``), one torch thread: it
builds the model, generates the sequence eagerly, compiles, generates it again and reports
whether every token equals eager's, the compiles, graph breaks, and the wall time of the
compiled sequence (compiling included). Target (issue 35): tokens equal, fxloom <= 2
compiles (Dynamo: 4).

Depends on: torch (torch._dynamo only here, as the peer), transformers, fxloom.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks._common import load_average, machine_line, noise_line, publish

PREFIX = "GENERATE-RESULT "
MODELS = ("gpt2", "llama")
METHODS = ("fxloom", "fxloom dynamic=True", "dynamo")


def _model(name: str) -> torch.nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, vocab_size=100)  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    model.eval()
    model.generation_config.pad_token_id = 0
    return model


def _prompt(length: int) -> torch.Tensor:
    return torch.randint(1, 100, (1, length), generator=torch.Generator().manual_seed(length))


def _sequence(model: torch.nn.Module) -> list[torch.Tensor]:
    with torch.no_grad():
        first = model.generate(_prompt(5), max_new_tokens=8, do_sample=False)
        longer = model.generate(first, max_new_tokens=16, do_sample=False)
        other = model.generate(_prompt(9), max_new_tokens=8, do_sample=False)
    return [first, longer, other]


def _compile(model: torch.nn.Module, method: str) -> tuple[object, list[int]]:
    """Compile ``model.forward`` in place; (the compiled forward, a counter of compiles)."""
    calls = [0]
    if method == "dynamo":

        def counter(graph_module, example_inputs):
            calls[0] += 1
            return graph_module.forward

        model.forward = torch.compile(model.forward, backend=counter)
    else:
        import fxloom

        options = {"dynamic": True} if method.endswith("dynamic=True") else {}
        model.forward = fxloom.compile(model.forward, **options)
    return model.forward, calls


def worker(name: str, method: str) -> dict:
    torch.set_num_threads(1)
    model = _model(name)
    expected = _sequence(model)
    compiled, calls = _compile(model, method)
    started = time.perf_counter()
    got = _sequence(model)
    seconds = time.perf_counter() - started
    if method == "dynamo":
        compiles, breaks = calls[0], None
    else:
        report = compiled.explain()
        compiles, breaks = report.graph_count, report.graph_break_count
    return {
        "equal": all(torch.equal(a, b) for a, b in zip(got, expected)),
        "compiles": compiles,
        "breaks": breaks,
        "seconds": seconds,
    }


def _run_worker(name: str, method: str) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--worker", name, method],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX) :])
    return {"error": (done.stderr.strip().splitlines() or ["no result"])[-1]}


def report(results: dict[tuple[str, str], dict], loads: tuple[float, float]) -> str:
    lines = [
        f"## Hugging Face generate with a compiled forward: compiles — {time.strftime('%Y-%m-%d')}",
        "",
        f"{machine_line()}. `python benchmarks/bench_generate_compiles.py`: GPT-2 and Llama "
        "(tiny configs, random weights), greedy `generate` with the default `DynamicCache`: "
        "prompt 5 + 8 tokens, then 16 more from that output, then a 9-token prompt + 8; "
        "`model.forward = compile(model.forward)`; each (model, method) in a fresh process, "
        "one torch thread; wall time of the compiled sequence, compiling included. Target "
        "(issue 35): tokens equal, fxloom <= 2 compiles (Dynamo 4).",
        "",
        "| model | method | tokens equal eager | compiles | breaks | sequence (s) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for (name, method), found in results.items():
        if "error" in found:
            lines.append(f"| {name} | {method} | error: {found['error']} | | | |")
            continue
        breaks = "" if found["breaks"] is None else found["breaks"]
        lines.append(
            f"| {name} | {method} | {'yes' if found['equal'] else '**no**'} | "
            f"{found['compiles']} | {breaks} | {found['seconds']:.2f} |"
        )
    lines += ["", noise_line(loads, ".")]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "METHOD"))
    parser.add_argument("--record", action="store_true", help="append to benchmarks/RESULTS.md")
    options = parser.parse_args()
    if options.worker:
        print(PREFIX + json.dumps(worker(*options.worker)))
        return
    before = load_average()
    results = {(name, method): _run_worker(name, method) for name in MODELS for method in METHODS}
    publish(report(results, (before, load_average())), options.record)


if __name__ == "__main__":
    main()
