"""Tracing with example inputs: how much it costs over tracing without, against torch.fx.

With example inputs, fxloom answers a program's questions about its values (shapes, dtypes,
devices) from stand-ins, and computes real values only for questions on data. Two parts:

    vit   a ViT-B/16-size model (transformers ``ViTModel(ViTConfig())``: default sizes, random
          weights, ``torch.manual_seed(0)``, one 1x3x224x224 image) traced (trace + codegen) by
          fxloom with example inputs, by fxloom without (the non-tensor parameters fixed by
          concrete_args, as ``benchmarks/zoo/methods.fixed_args`` does), and by torch.fx; best
          of ``--repeats``, the sides alternating. The first run, in brackets, also pays the
          process's one-time costs (torch imports torch._dynamo on its first meta kernel call;
          stand-in results are remembered process-wide). From one more untimed trace: how
          many operators ran on real tensors while tracing, the largest difference from eager.
    zoo   ``benchmarks/zoo/worker.py MODEL fxloom`` for each of ``--models``: the warm capture
          time (best of a few; the first capture of the process in brackets, which also pays
          one-time costs) and whether the captured program matches eager (else the mismatch).

With ``--baseline PATH`` (another fxloom checkout, e.g. /work/main), both parts are measured
for it too, in the same run (in subprocesses), and printed side by side. A side that fails
shows the error's first line. torch.fx is imported here only as the comparison.

    python benchmarks/bench_examples.py
    python benchmarks/bench_examples.py --baseline /work/main --repeats 5
    python benchmarks/bench_examples.py --parts zoo --models bert gpt2 vit resnet
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _fxloom_root(argv: list[str]) -> Path:
    """The checkout to measure: ``--fxloom-root`` (how a baseline is run), else this one."""
    if "--fxloom-root" in argv:
        return Path(argv[argv.index("--fxloom-root") + 1])
    return ROOT


if __name__ == "__main__":  # run as a script: measure the checkout asked for
    sys.path.insert(0, str(_fxloom_root(sys.argv)))

import torch  # noqa: E402
import torch.fx  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

import fxloom  # noqa: E402

DEFAULT_MODELS = ["bert", "gpt2", "llama", "t5", "vit", "resnet", "swin", "whisper"]
RESULT_PREFIX = "ZOO-RESULT "  # benchmarks/zoo/worker.py's


# ----------------------------------------------------------------------------- vit part
class RealOperators(TorchDispatchMode):
    """Counts the operators that run on real tensors (stand-ins run theirs on the meta device)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        self.count += any(isinstance(t, torch.Tensor) and not t.is_meta for t in leaves)
        return func(*args, **kwargs)


def vit_model() -> tuple[torch.nn.Module, torch.Tensor, dict[str, Any]]:
    """ViT-B/16 with random weights, one image, and the forward's other parameters fixed."""
    from transformers import ViTConfig, ViTModel

    from benchmarks.zoo.methods import fixed_args

    torch.manual_seed(0)
    model = ViTModel(ViTConfig()).eval()
    image = torch.randn(1, 3, 224, 224)
    return model, image, fixed_args(model, {"pixel_values": image})


def vit_captures(
    model: torch.nn.Module, image: torch.Tensor, fixed: dict[str, Any]
) -> dict[str, Any]:
    """The captures compared on ViT, each ``() -> callable(image)``."""

    def with_examples() -> Any:
        gm = fxloom.symbolic_trace(model, fixed, example_inputs={"pixel_values": image})
        gm.code  # noqa: B018 -- fxloom generates code lazily: count it
        return gm

    def without_examples() -> Any:
        gm = fxloom.symbolic_trace(model, fixed)
        gm.code  # noqa: B018
        return gm

    def torch_fx() -> Any:
        return torch.fx.symbolic_trace(model, concrete_args=fixed)

    return {
        "fxloom, example inputs": with_examples,
        "fxloom, no example inputs": without_examples,
        "torch.fx": torch_fx,
    }


def measure_vit(repeats: int) -> dict[str, dict[str, Any]]:
    """Per capture: best seconds, real operators while tracing, max |captured - eager|."""
    from benchmarks._common import rotated, timed

    model, image, fixed = vit_model()
    with torch.no_grad():
        expected = model(image, **fixed)[0]
    results: dict[str, dict[str, Any]] = {}
    captures = vit_captures(model, image, fixed)
    for repeat in range(repeats):
        for label in rotated(list(captures), repeat):
            result = results.setdefault(label, {})
            if "error" in result:
                continue
            try:
                seconds = timed(captures[label])
            except Exception as error:  # a capture that fails is a result
                result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
                continue
            result.setdefault("first", seconds)  # also pays one-time costs of the process
            result["seconds"] = min(seconds, result.get("seconds", seconds))
    for label, result in results.items():
        if "error" not in result:
            with RealOperators() as real:
                gm = captures[label]()
            with torch.no_grad():
                actual = gm(image, **fixed)[0] if label == "torch.fx" else gm(image)[0]
            result["real_operators"] = real.count
            result["max_abs_diff"] = float((actual - expected).abs().max())
    return results


# ----------------------------------------------------------------------------- zoo part
def measure_zoo(root: Path, models: list[str]) -> dict[str, dict[str, Any]]:
    """``worker.py MODEL fxloom`` in ``root`` (its fxloom and its zoo), one process per model."""
    results = {}
    for name in models:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.zoo.worker", name, "fxloom"],
            cwd=root,
            capture_output=True,
            text=True,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
        results[name] = (
            json.loads(lines[-1][len(RESULT_PREFIX) :])
            if lines
            else {"status": "crash", "message": done.stderr.strip().splitlines()[-1:]}
        )
    return results


# ----------------------------------------------------------------------------- report
def measured_elsewhere(root: Path, repeats: int) -> dict[str, Any]:
    """The vit part for the checkout at ``root``, measured in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, __file__, "--parts", "vit", "--repeats", str(repeats), "--json"]
        + ["--fxloom-root", str(root)],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.splitlines()[-1])


def vit_cell(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"fails: {result['error']}"
    return (
        f"{result['seconds']:.3f} s (first {result['first']:.3f} s); "
        f"{result['real_operators']} real ops; diff {result['max_abs_diff']:.1e}"
    )


def zoo_cell(result: dict[str, Any]) -> str:
    """Warm capture (best of a few) and, in brackets, the first one of the process."""
    warm, first = result.get("capture_warm_s"), result.get("capture_s")
    timing = f"{warm:.3f} s ({first:.3f} s)" if warm is not None and first is not None else "-"
    status = result.get("status")
    return timing if status == "ok" else f"{timing} {status}: {result.get('message', '')}"[:100]


def table(title: str, columns: list[str], rows: dict[str, list[str]]) -> str:
    lines = [f"### {title}", "", "| | " + " | ".join(columns) + " |"]
    lines.append("|---" * (len(columns) + 1) + "|")
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["vit", "zoo"], choices=["vit", "zoo"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--baseline", type=Path, help="another fxloom checkout to compare with")
    parser.add_argument("--json", action="store_true", help="print the vit results as JSON")
    parser.add_argument("--fxloom-root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    here = args.fxloom_root or ROOT
    if args.json:
        print(json.dumps(measure_vit(args.repeats)))
        return
    sides = [here] + ([args.baseline] if args.baseline else [])
    columns = [f"{side}" for side in sides]
    print(f"fxloom {fxloom.__file__}; torch {torch.__version__}; shared cores: timings are noisy")
    if "vit" in args.parts:
        measured = [measure_vit(args.repeats)]
        measured += [measured_elsewhere(side, args.repeats) for side in sides[1:]]
        labels = list(measured[0])
        rows = {
            label: [vit_cell(m.get(label, {"error": "-"})) for m in measured] for label in labels
        }
        print(table("ViT-B/16, 1x3x224x224: trace + codegen", columns, rows) + "\n")
    if "zoo" in args.parts:
        measured = [measure_zoo(side, args.models) for side in sides]
        rows = {name: [zoo_cell(m[name]) for m in measured] for name in args.models}
        print(table("zoo, fxloom capture: warm (first)", columns, rows))


if __name__ == "__main__":
    main()
