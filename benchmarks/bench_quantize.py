"""Post-training quantization benchmark (torch.fx paper, 6.2.1 and Appendix B): fxloom
against torch's own FX quantization, in one run.

The model is the paper's DeepRecommender (``fxloom.zoo.build("deeprec")``: 17768 items ->
512 -> 512 -> 1024 -> 512 -> 512 -> 17768, Linear + SELU, seeded random weights, eval mode)
on the CPU, with sparse rating vectors as data. Both libraries quantize the same model on
the same calibration batches for the same engine (x86 by default): fxloom with
``fxloom.quantize.prepare/calibrate/convert`` and its default config, torch with
``torch.ao.quantization.quantize_fx.prepare_fx/convert_fx`` and
``get_default_qconfig_mapping(engine)``. Three parts:

    latency  one forward under torch.no_grad() of fp32 (eager), fxloom int8 and torch FX
             int8, at batch 1, 16, 64 and 256. Targets: fxloom int8 >= 3x faster than fp32
             at batch 1 (the paper: 3.3x, 0.0777 s -> 0.0222 s, on a Xeon Gold 6138), and
             fxloom int8 / torch FX int8 <= 1 at every batch size.
    error    relative error and cosine similarity of each int8 model against fp32 on
             held-out data (256 rows never seen in calibration). Target: fxloom's error <=
             torch's.
    phases   prepare / calibrate / convert durations of each library (the paper: 44 ms /
             590 ms / 3.8 s).
    exported the same model as an exported program: fxloom's quantizer on ``fxloom.export``'s
             program against torch's PT2E flow (torchao's ``prepare_pt2e``/``convert_pt2e``
             with X86InductorQuantizer, ``benchmarks/pt2e_peer.py``) on torch.export's, both
             run eagerly: latency at the same batch sizes and error on the held-out rows.
             PT2E's converted module is a reference quantize/dequantize graph meant for
             torch.compile (inductor) to lower into int8 kernels, which this benchmark does
             not do; eagerly it computes in float. Exported programs have static shapes, so
             each batch size gets its own program, calibrated on the same rows in batches of
             that size. Skipped (with a note) when torchao is not installed.

Every latency is the best of several runs, the variants taking turns to go first, with the
garbage collector off inside timed regions; ratios are also given "paired" (the median over
repeats of runs timed next to each other), which a busy, shared machine disturbs less.

    python benchmarks/bench_quantize.py                   # the paper's model, all batch sizes
    python benchmarks/bench_quantize.py --quick           # smoke run: 256 items, batch 1 and 16
    python benchmarks/bench_quantize.py --threads 1       # torch.set_num_threads(1)
    python benchmarks/bench_quantize.py --engine qnnpack
    python benchmarks/bench_quantize.py --record          # append the tables to RESULTS.md
    python benchmarks/bench_quantize.py --bert            # BERT-base dynamic int8 (below)

``--bert`` runs another workload, in its own process: a BERT-base config (random init,
``transformers``), batch 1, sequence 128, dynamic int8 - fxloom's dynamic scheme (per-token
int8 activations, ``QuantConfig(scheme="dynamic")``) against torch.ao's ``quantize_dynamic``
(fbgemm, deprecated), torchao's eager int8 (``Int8DynamicActivationInt8WeightConfig``, when
torchao is installed) and fp32, interleaved (each round runs every variant, the order
rotating; medians), at 1 and 2 threads; the error is the last hidden state's relative error
against fp32 on held-out tokens. Target (issue 37): latency <= 0.95x torch.ao's and <= 0.5x
torchao's, error <= 0.6x torch.ao's.

``--deeprec-dynamic`` runs another workload, in its own process: the paper's DeepRecommender
(the full model above), dynamic int8 - fxloom's dynamic scheme against torch.ao's
``quantize_dynamic`` (fbgemm, deprecated) and fp32, interleaved as for BERT, at batch 1 and
64 (``--batch-sizes``), on 1 thread (``--threads``; 1 and 2 with ``--threads 0``). Each
variant's median wall time and median CPU time of the process (``time.process_time``: with
one thread it is the compute, less disturbed by other processes on a loaded machine) are
given. Target (issue 37): fxloom / torch.ao <= 1.0 at batch 1, <= 1/1.5 at batch 64.

``--pt2e-import`` (own process): the paper's DeepRecommender through torch's PT2E flow
(``pt2e_peer.pt2e_int8``, static, one program per batch size calibrated on the same rows),
its reference graph imported into fxloom's operators (``fxloom.quantize.import_quantized`` on
``fxloom.symbolic_trace`` of it) against that reference graph run eagerly, fxloom's own
static int8 (``convert``) and fp32, interleaved, CPU and wall time as above, with each one's
error against fp32 and the largest difference between imported and reference outputs.

``--resnet50`` (own process, one thread; ``--threads 2``: two): ResNet-50 (``fxloom.zoo``, random init) static int8
at batch 1, 224x224, calibrated on 8 random images: fxloom's default against torch.ao FX
(x86 qconfig mapping) and fp32, and fxloom's model lowered to ONNX Runtime as QDQ against
ORT's own ``quantize_static`` of torch.onnx's fp32 export (ORT at as many intra-op threads);
interleaved rounds, CPU and wall time, SQNR against fp32. Targets (issue 37): fxloom <= 1.0x
torch.ao FX at SQNR >= its; lowered <= 1.1x ORT's. Ablation rows run fxloom's model with one
kernel-table row changed (``WithKernels``): add_int8 on the reference, conv weights packed
without the input shape, conv outputs copied back to NCHW (as before issue 37's qconv branch);
and one converted without ``table.FUSED_SUMS`` (each residual add its own ``add_int8`` after
its convolution, as before the qfuse branch; the add_int8 ablation runs on that model, as the
default has no add_int8 left). ``--quick``: base width 8, 64x64.

``--llm-decode`` (own process, one thread; ``--threads 2``: two): a Llama-shaped decoder
(hidden 2048, intermediate 5632, ``--layers`` layers, random init) decoding 64 greedy tokens
at batch 1 with the default cache: fp32, bf16, fxloom w8 and w4 (group 128; each Linear converted on its own, the model
stays eager), torch.ao ``quantize_dynamic`` (fbgemm) and torchao's eager int8 weight-only
(16 tokens for the slow ones), best of ``--rounds`` interleaved rounds; tokens/s of CPU time
(of wall time at more threads, where it is the latency),
agreement with fp32's tokens (greedy and teacher-forced). Targets (issue 37): w8 >= fbgemm's
and >= 5x torchao's tokens/s, w4 >= 1.8x bf16, w8 agrees on >= 95% of steps. w8 and w4 also
with fp32 activations (the kernel table casts them to bf16 around the call).
``--quick``: a tiny config, 8 tokens.

torch.ao's FX quantization, torch.export and torchao are imported here only as the comparison.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: this checkout's fxloom and `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fxloom  # noqa: E402
from benchmarks._common import (
    SPREAD_IS,
    Samples,
    freeze_startup_heap,
    load_average,
    machine_line,
    noise_line,  # noqa: E402
    publish,
    rotated,
    timed,
    timed_call,
)
from fxloom import zoo  # noqa: E402
from fxloom.export import export  # noqa: E402
from fxloom.quantize import QuantConfig, QuantSpec, calibrate, convert, kernels, prepare  # noqa: E402
from fxloom.quantize.config import saturates_8_bit_activations  # noqa: E402
from fxloom.quantize.convert import quantized_engine  # noqa: E402
from fxloom.zoo.deeprec import PAPER_SIZES, ratings  # noqa: E402

SPEEDUP_TARGET = 3.0  # fp32 / fxloom int8 at batch 1
RATIO_TARGET = 1.0  # fxloom int8 / torch FX int8
VARIANTS = ("fp32", "fxloom", "torch")
LIBRARIES = ("fxloom", "torch")


@dataclass(frozen=True)
class Settings:
    model: str  # zoo name
    items: int
    batch_sizes: tuple[int, ...]
    repeats: dict[int, int]  # batch size -> latency repeats
    phase_repeats: int
    calibration_batches: int
    engine: str


def _reach(model: nn.Module) -> int:
    """The largest code magnitude among ``model``'s int8 weights (``kernels.reach``)."""
    return max(kernels.reach(b) for b in model.buffers() if b.dtype == torch.int8)


def _kernel(activations: str, model: nn.Module) -> str:
    """The kernel ``model``'s dynamic int8 linears of ``activations`` get on this CPU."""
    reach = _reach(model)
    return kernels.kernel_name("linear_int8", dynamic=True, activations=activations, reach=reach)


# fxloom's dynamic models with 8-bit weights, beside the default, where the default narrows
# them to 7 bits (a CPU without VNNI: QuantSpec.narrow_weights)
EIGHT_BIT_DYNAMIC = "fxloom, 8-bit weights"


def with_8_bit_weights(models: dict, model: nn.Module, example) -> dict:
    if not kernels.vnni():
        spec = QuantSpec(narrow_weights=False)
        config = QuantConfig(scheme="dynamic", global_spec=spec)
        models[EIGHT_BIT_DYNAMIC] = convert(prepare(model, example, config))
    return models


def eight_bit_line(times: dict, errors: dict, base: str = "torch.ao") -> str:
    """The 8-bit-weight variant's time and error against ``base``'s (empty where it is not
    run: with VNNI the default keeps 8 bits)."""
    if EIGHT_BIT_DYNAMIC not in errors:
        return ""
    return (
        f" With 8-bit weights (`QuantSpec(narrow_weights=False)`, "
        f"{_kernel('per_tensor', times['model'])}): time / {base} "
        + ", ".join(f"{label}: {ratio:.2f}" for label, ratio in times["ratios"])
        + f", error {errors[EIGHT_BIT_DYNAMIC]:.4f} (/ {base} "
        f"{errors[EIGHT_BIT_DYNAMIC] / errors[base]:.2f})."
    )


def settings(args: argparse.Namespace) -> Settings:
    if args.quick:
        return Settings("deeprec_tiny", 256, (1, 16), {1: 2, 16: 2}, 1, 2, args.engine)
    batches = tuple(args.batch_sizes)
    repeats = {batch: 30 if batch == 1 else 15 if batch <= 16 else 7 for batch in batches}
    return Settings("deeprec", 17768, batches, repeats, 3, 16, args.engine)


# ----------------------------------------------------------------------------- quantizers
def fxloom_phases(model: nn.Module, example: tuple, data: list, engine: str):
    config = QuantConfig(engine=engine)
    prepare_s, prepared = timed_call(lambda: prepare(model, example, config))
    calibrate_s, _ = timed_call(lambda: calibrate(prepared, data, progress=False))
    convert_s, quantized = timed_call(lambda: convert(prepared))
    return (prepare_s, calibrate_s, convert_s), quantized


def torch_phases(model: nn.Module, example: tuple, data: list, engine: str):
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    mapping = get_default_qconfig_mapping(engine)
    prepare_s, prepared = timed_call(lambda: prepare_fx(copy.deepcopy(model), mapping, example))

    def run_calibration() -> None:
        with torch.no_grad():
            for batch in data:
                prepared(batch)

    calibrate_s = timed(run_calibration)
    convert_s, quantized = timed_call(lambda: convert_fx(prepared))
    return (prepare_s, calibrate_s, convert_s), quantized


QUANTIZERS: dict[str, Callable] = {"fxloom": fxloom_phases, "torch": torch_phases}


@dataclass
class PhaseRow:
    best: dict[str, tuple[float, float, float]]  # library -> (prepare, calibrate, convert)


def run_phases(config: Settings, model: nn.Module, data: list) -> tuple[PhaseRow, dict]:
    example = (ratings(1, config.items, seed=0),)
    runs: dict[str, list[tuple[float, float, float]]] = {lib: [] for lib in LIBRARIES}
    models: dict[str, nn.Module] = {}
    for rep in range(config.phase_repeats):
        for lib in rotated(list(LIBRARIES), rep):
            durations, models[lib] = QUANTIZERS[lib](model, example, data, config.engine)
            runs[lib].append(durations)
    best = {lib: tuple(min(run[i] for run in runs[lib]) for i in range(3)) for lib in LIBRARIES}
    for lib in LIBRARIES:
        p, c, v = (seconds * 1e3 for seconds in best[lib])
        print(f"phases {lib:7} prepare {p:8.1f} ms  calibrate {c:8.1f} ms  convert {v:8.1f} ms")
    return PhaseRow(best), models


# ----------------------------------------------------------------------------- error
@dataclass
class ErrorRow:
    relative: dict[str, float]
    cosine: dict[str, float]


def run_error(config: Settings, model: nn.Module, models: dict) -> ErrorRow:
    held_out = ratings(256, config.items, seed=100)
    with torch.no_grad():
        ref = model(held_out)
        outs = {lib: models[lib](held_out) for lib in LIBRARIES}
    relative = {lib: float((out - ref).norm() / ref.norm()) for lib, out in outs.items()}
    cosine = {
        lib: float(torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0))
        for lib, out in outs.items()
    }
    for lib in LIBRARIES:
        print(f"error  {lib:7} relative {relative[lib]:.4f}  cosine {cosine[lib]:.6f}")
    return ErrorRow(relative, cosine)


# ----------------------------------------------------------------------------- latency
@dataclass
class LatencyRow:
    batch: int
    best: dict[str, float]  # variant -> seconds
    paired: float  # median of fxloom / torch per repeat
    paired_speedup: float  # median of fp32 / fxloom per repeat
    spread: float


def run_latency(
    config: Settings, model: nn.Module, models: dict, samples: Samples
) -> list[LatencyRow]:
    variants = {"fp32": model, **models}
    rows = []
    for batch in config.batch_sizes:
        x = ratings(batch, config.items, seed=7)
        prefix = f"latency b{batch}"
        with torch.no_grad():
            for variant in variants.values():  # warm-up
                variant(x)
            for rep in range(config.repeats[batch]):
                for name in rotated(list(VARIANTS), rep):
                    variant = variants[name]
                    samples.add(f"{prefix} {name}", timed(lambda v=variant, x=x: v(x)))
        best = {name: samples.best(f"{prefix} {name}") for name in VARIANTS}
        row = LatencyRow(
            batch,
            best,
            samples.paired_ratio(f"{prefix} fxloom", f"{prefix} torch"),
            1.0 / samples.paired_ratio(f"{prefix} fxloom", f"{prefix} fp32"),
            max(samples.spread(f"{prefix} {name}") for name in VARIANTS),
        )
        rows.append(row)
        print(
            f"latency batch {batch:4}  fp32 {best['fp32'] * 1e3:8.2f} ms  fxloom "
            f"{best['fxloom'] * 1e3:8.2f} ms  torch {best['torch'] * 1e3:8.2f} ms  speedup "
            f"{best['fp32'] / best['fxloom']:.2f}x  fxloom/torch {best['fxloom'] / best['torch']:.3f}"
            f" (paired {row.paired:.3f})",
            flush=True,
        )
    return rows


# ----------------------------------------------------------------------------- exported programs
EXPORTED = ("fp32", "fxloom", "pt2e")


@dataclass
class ExportedRow:
    batch: int
    best: dict[str, float]  # variant -> seconds
    paired: float  # median of fxloom / pt2e per repeat


def exported_int8(model: nn.Module, x: torch.Tensor, data: list, engine: str) -> dict:
    """fxloom's and PT2E's int8 programs exported at ``x``'s shape, calibrated on ``data``'s
    rows in batches of that size (repeated when there are fewer rows than one batch)."""
    from benchmarks.pt2e_peer import pt2e_int8

    rows = torch.cat(data)
    rows = rows.repeat(-(-len(x) // len(rows)), 1)  # at least one full batch (--quick: 64 rows)
    example, chunks = (x,), [chunk for chunk in rows.split(len(x)) if len(chunk) == len(x)]
    prepared = prepare(export(model, example), example, QuantConfig(engine=engine))
    calibrate(prepared, chunks, progress=False)
    # PT2E with the activation bits fxloom's default gives this CPU (7 where FBGEMM sums in 16)
    seven_bits = saturates_8_bit_activations(engine)
    return {
        "fxloom": convert(prepared),
        "pt2e": pt2e_int8(model, example, chunks, reduce_range=seven_bits),
    }


def run_exported(config: Settings, model: nn.Module, data: list, samples: Samples):
    """Error rows ({variant: (relative, cosine)}) and latency rows of the exported programs."""
    held_out = ratings(256, config.items, seed=100)
    with torch.no_grad():
        ref = model(held_out)
        outs = {
            k: m(held_out) for k, m in exported_int8(model, held_out, data, config.engine).items()
        }
    error = {
        side: (
            float((out - ref).norm() / ref.norm()),
            float(nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0)),
        )
        for side, out in outs.items()
    }
    for side, (relative, cos) in error.items():
        print(f"exported error  {side:7} relative {relative:.4f}  cosine {cos:.6f}")
    rows = []
    for batch in config.batch_sizes:
        x = ratings(batch, config.items, seed=7)
        variants = {"fp32": model, **exported_int8(model, x, data, config.engine)}
        prefix = f"exported b{batch}"
        with torch.no_grad():
            for variant in variants.values():  # warm-up
                variant(x)
            for rep in range(config.repeats[batch]):
                for name in rotated(list(EXPORTED), rep):
                    variant = variants[name]
                    samples.add(f"{prefix} {name}", timed(lambda v=variant, x=x: v(x)))
        best = {name: samples.best(f"{prefix} {name}") for name in EXPORTED}
        rows.append(
            ExportedRow(batch, best, samples.paired_ratio(f"{prefix} fxloom", f"{prefix} pt2e"))
        )
        print(
            f"exported batch {batch:4}  fp32 {best['fp32'] * 1e3:8.2f} ms  fxloom "
            f"{best['fxloom'] * 1e3:8.2f} ms  pt2e {best['pt2e'] * 1e3:8.2f} ms  "
            f"fxloom/pt2e {best['fxloom'] / best['pt2e']:.3f} (paired {rows[-1].paired:.3f})",
            flush=True,
        )
    return error, rows


def exported_table(error: dict | None, rows: list[ExportedRow], config: Settings) -> list[str]:
    heading = "### Post-training quantization: exported programs, fxloom against PT2E"
    if error is None:
        return [heading, "", "Not run: torchao (torch's PT2E quantization) is not installed."]
    lines = [
        heading,
        "",
        f"{config.model} exported (fxloom.export / torch.export) at each batch size and "
        "quantized: fxloom's quantizer on the exported program against PT2E "
        "(torchao `prepare_pt2e`/`convert_pt2e`, X86InductorQuantizer), same calibration rows. "
        "Both run eagerly under `torch.no_grad()`, milliseconds per forward (best run). "
        "PT2E's converted module is a reference quantize/dequantize graph meant for "
        "torch.compile (inductor) to lower into int8 kernels, which this benchmark does not "
        "do: eagerly it computes in float on rounded values, so its latency here is not "
        "PT2E's deployed speed.",
        "",
        "| batch | fp32 | fxloom int8 (exported) | PT2E reference (eager) "
        "| fxloom / PT2E: best | paired |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        t = {name: seconds * 1e3 for name, seconds in row.best.items()}
        lines.append(
            f"| {row.batch} | {t['fp32']:.2f} | {t['fxloom']:.2f} | {t['pt2e']:.2f} "
            f"| {t['fxloom'] / t['pt2e']:.3f} | {row.paired:.3f} |"
        )
    lines += [
        "",
        "Error against fp32 on the 256 held-out rows (programs exported at batch 256):",
        "",
        "| library | relative error | cosine |",
        "|---|---:|---:|",
        *(f"| {side} | {rel:.4f} | {cos:.6f} |" for side, (rel, cos) in error.items()),
    ]
    return lines


def torchao_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchao") is not None


# ----------------------------------------------------------------------------- tables
def latency_table(rows: list[LatencyRow], config: Settings) -> list[str]:
    lines = [
        "### Post-training quantization: latency",
        "",
        f"{config.model} ({config.items} items), engine {config.engine}, CPU, milliseconds "
        "per forward (best run) under `torch.no_grad()`. Speedup = fp32 / fxloom int8 "
        f"(target >= {SPEEDUP_TARGET} at batch 1; the paper: 3.3x at batch 1, 1.1x at 256). "
        f"fxloom / torch compares the two int8 models (target <= {RATIO_TARGET}, judged on "
        "*paired*: the median of per-repeat ratios).",
        "",
        "| batch | fp32 | fxloom int8 | torch FX int8 | speedup: best | paired "
        "| fxloom / torch: best | paired | target | spread |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        t = {name: seconds * 1e3 for name, seconds in row.best.items()}
        meets = row.paired <= RATIO_TARGET and (row.batch != 1 or row.paired_speedup >= 3)
        lines.append(
            f"| {row.batch} | {t['fp32']:.2f} | {t['fxloom']:.2f} | {t['torch']:.2f} "
            f"| {t['fp32'] / t['fxloom']:.2f}x | {row.paired_speedup:.2f}x "
            f"| {t['fxloom'] / t['torch']:.3f} | {row.paired:.3f} "
            f"| {'meets' if meets else '**misses**'} | {row.spread * 100:.0f}% |"
        )
    return lines


def quality_table(error: ErrorRow, phases: PhaseRow, config: Settings) -> list[str]:
    def ms(lib: str, i: int) -> str:
        return f"{phases.best[lib][i] * 1e3:.0f}"

    verdict = "meets" if error.relative["fxloom"] <= error.relative["torch"] else "**misses**"
    return [
        "### Post-training quantization: error and phase durations",
        "",
        "Error of each int8 model against fp32 on 256 held-out rows (relative: "
        "||int8 - fp32|| / ||fp32||; target: fxloom <= torch). Phases: milliseconds (best of "
        f"{config.phase_repeats}) for prepare (from the model; torch's includes its deep "
        f"copy), calibrate ({config.calibration_batches} batches of 32 rows) and convert "
        "(the paper: 44 / 590 / 3800 ms on its model and machine).",
        "",
        "| library | relative error | cosine | prepare | calibrate | convert |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {lib} | {error.relative[lib]:.4f} | {error.cosine[lib]:.6f} | {ms(lib, 0)} "
            f"| {ms(lib, 1)} | {ms(lib, 2)} |"
            for lib in LIBRARIES
        ),
        "",
        f"Error target: {verdict}.",
    ]


def markdown(
    latency: list[LatencyRow],
    error: ErrorRow,
    phases: PhaseRow,
    exported: tuple[dict | None, list[ExportedRow]],
    config: Settings,
    command: str,
    loads: tuple[float, float],
) -> str:
    repeats = ", ".join(f"batch {b}: {n}" for b, n in config.repeats.items())
    lines = [
        f"## Post-training quantization — {date.today().isoformat()}",
        "",
        f"{machine_line()}. `{command}`; {torch.get_num_threads()} torch threads. Best of N "
        f"runs ({repeats}), rotating which variant goes first; garbage collector off inside "
        "timed regions.",
        "",
        *latency_table(latency, config),
        "",
        *quality_table(error, phases, config),
        "",
        *exported_table(*exported, config),
        "",
        noise_line(loads, SPREAD_IS),
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- BERT-base
BERT_ROUNDS = 15


def bert_models() -> tuple[nn.Module, dict, dict]:
    from torch.ao.quantization import quantize_dynamic

    from benchmarks.zoo.methods import fixed_args
    from fxloom.zoo.hf_configs import VOCAB, hf

    def tokens(seed: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, VOCAB, (1, 128), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    torch.manual_seed(0)
    model = hf("BertModel", "BertConfig")().eval()  # the base config: hidden 768, 12 layers
    example = tokens(0)
    traced = fxloom.symbolic_trace(model, fixed_args(model, example), example_inputs=example)
    models = {
        "fp32": model,
        "fxloom": convert(prepare(traced, example, QuantConfig(scheme="dynamic"))),
        "torch.ao": quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8),
        # the per-token form, beside the default per-tensor one
        "fxloom per token": convert(
            prepare(traced, example, QuantConfig(scheme="dynamic_per_token"))
        ),
    }
    with_8_bit_weights(models, traced, example)
    if torchao_installed():  # torchao's eager int8 (dynamic int8 activations, int8 weights)
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        models[TORCHAO_BERT] = copy.deepcopy(model)
        quantize_(models[TORCHAO_BERT], Int8DynamicActivationInt8WeightConfig())
    return model, models, tokens(100)


TORCHAO_BERT = "torchao int8 (eager)"


def lowered_at(lowered: nn.Module, threads: int) -> nn.Module:
    """A copy of ``lowered`` whose ONNX Runtime sessions run on ``threads`` threads (a copy
    starts its sessions afresh, with the settings it holds)."""
    from fxloom.lower import OrtModule

    copied = copy.deepcopy(lowered)
    for module in copied.modules():
        if isinstance(module, OrtModule):
            module.intra_op_num_threads = threads
    return copied


def _hidden(output) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output.last_hidden_state


def bert_rows(threads: int, models: dict, held_out: dict, cpu: dict | None = None) -> dict:
    """variant -> median wall seconds; ``cpu`` (if given) gets variant -> median CPU
    seconds (the process's CPU time: less sensitive to other processes on the machine)."""
    torch.set_num_threads(threads)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    names = list(models)
    with torch.no_grad():
        for model in models.values():
            model(**held_out)  # warm: packing on first use, allocator
        for round_ in range(BERT_ROUNDS):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                times[name].append(cpu_and_wall(lambda m=models[name]: m(**held_out)))
    middle = BERT_ROUNDS // 2
    if cpu is not None:
        cpu.update({name: sorted(c for c, _ in runs)[middle] for name, runs in times.items()})
    return {name: sorted(w for _, w in runs)[middle] for name, runs in times.items()}


def bert_main(record: bool) -> None:
    from fxloom.lower import lower

    model, models, held_out = bert_models()
    # fxloom's dynamic model lowered to ONNX Runtime as QDQ (fxloom.lower.onnx_ops_quant)
    lowered = lower(models["fxloom"], held_out, threads=1)
    assert lowered.lowering_report.nodes_in_pytorch == 0, str(lowered.lowering_report)
    models["fxloom ORT"] = lowered
    with torch.no_grad():
        ref = _hidden(model(**held_out, return_dict=False))
        errors = {
            name: float((_hidden(m(**held_out)) - ref).norm() / ref.norm())
            for name, m in models.items()
            if name != "fp32"
        }
    lines = [
        "### Quantization on plain tensors: BERT-base dynamic int8 (batch 1, sequence 128)",
        "",
        f"{machine_line()}. Command: `python benchmarks/bench_quantize.py --bert`; medians of "
        f"{BERT_ROUNDS} interleaved rounds (the order rotating), one process. Load average "
        f"{load_average():.2f}.",
        "",
        "| threads | fp32 ms | torch.ao quantize_dynamic ms | fxloom dynamic ms "
        "| fxloom / torch.ao | fxloom dynamic lowered to ONNX Runtime ms | lowered / fxloom "
        "| torchao int8 (eager) ms | fxloom / torchao |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    cpu_rows = {}
    for threads in (1, 2):
        at = {**models, "fxloom ORT": lowered_at(lowered, threads)}
        cpu_rows[threads] = {}
        row = bert_rows(threads, at, held_out, cpu_rows[threads])
        ratio = row["fxloom"] / row["torch.ao"]
        torchao = row.get(TORCHAO_BERT)
        lines.append(
            f"| {threads} | {row['fp32'] * 1e3:.1f} | {row['torch.ao'] * 1e3:.1f} | "
            f"{row['fxloom'] * 1e3:.1f} | {ratio:.2f} | {row['fxloom ORT'] * 1e3:.1f} | "
            f"{row['fxloom ORT'] / row['fxloom']:.2f} | "
            + ("not installed | - |" if torchao is None else
               f"{torchao * 1e3:.1f} | {row['fxloom'] / torchao:.2f} |")
        )  # fmt: skip
    eight_bit = {
        "model": models.get(EIGHT_BIT_DYNAMIC),
        "ratios": [
            (f"{threads} thread(s)", cpu.get(EIGHT_BIT_DYNAMIC, 0.0) / cpu["torch.ao"])
            for threads, cpu in cpu_rows.items()
        ],
    }
    lines += [
        "",
        f"Relative error of the last hidden state against fp32: fxloom {errors['fxloom']:.4f}, "
        f"lowered to ONNX Runtime {errors['fxloom ORT']:.4f}, "
        f"torch.ao {errors['torch.ao']:.4f} (fxloom / torch.ao "
        f"{errors['fxloom'] / errors['torch.ao']:.2f}; target <= 0.6)"
        + (f", torchao {errors[TORCHAO_BERT]:.4f}" if TORCHAO_BERT in errors else "")
        + ". Latency targets: fxloom / torch.ao <= 0.95, fxloom / torchao's eager int8 <= 0.5.",
        "",
        "CPU time (the process's, per forward; medians of the same rounds) and the per-token "
        f'form (`scheme="dynamic_per_token"`, {_kernel("per_token", models["fxloom per token"])})'
        f" beside the default per-tensor one ({_kernel('per_tensor', models['fxloom'])}):",
        "",
        "| threads | torch.ao CPU ms | fxloom dynamic (per tensor) CPU ms | / torch.ao "
        "| fxloom per token CPU ms | / torch.ao |",
        "|---|---|---|---|---|---|",
        *(
            f"| {threads} | {cpu['torch.ao'] * 1e3:.1f} | {cpu['fxloom'] * 1e3:.1f} | "
            f"{cpu['fxloom'] / cpu['torch.ao']:.2f} | {cpu['fxloom per token'] * 1e3:.1f} | "
            f"{cpu['fxloom per token'] / cpu['torch.ao']:.2f} |"
            for threads, cpu in cpu_rows.items()
        ),
        "",
        f"Relative error, per token: {errors['fxloom per token']:.4f} (/ torch.ao "
        f"{errors['fxloom per token'] / errors['torch.ao']:.2f})."
        f"{eight_bit_line(eight_bit, errors)} Load average after the run {load_average():.2f}.",
        "",
    ]
    publish("\n".join(lines), record)


# ----------------------------------------------------------------------------- DeepRecommender dynamic
DEEPREC_ROUNDS = 15
DEEPREC_TARGETS = {1: 1.0, 64: 1 / 1.5}  # fxloom / torch.ao latency, issue 37


def deeprec_dynamic_models() -> tuple[nn.Module, dict]:
    from torch.ao.quantization import quantize_dynamic

    model, example = zoo.build("deeprec")
    models = {
        "fp32": model,
        "fxloom": convert(prepare(model, example, QuantConfig(scheme="dynamic"))),
        "torch.ao": quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8),
        "fxloom per token": convert(
            prepare(model, example, QuantConfig(scheme="dynamic_per_token"))
        ),
    }
    return model, with_8_bit_weights(models, model, example)


def cpu_and_wall(fn: Callable[[], object]) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) of one ``fn()``, the collector off (a collection
    before, outside both clocks)."""
    gc.collect()
    gc.disable()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        return time.process_time() - cpu, time.perf_counter() - wall
    finally:
        gc.enable()


def deeprec_rows(threads: int, models: dict, x: torch.Tensor) -> dict[str, tuple[float, float]]:
    """variant -> (median CPU seconds, median wall seconds) over interleaved rounds."""
    torch.set_num_threads(threads)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    names = list(models)
    with torch.no_grad():
        for model in models.values():
            model(x)  # warm: packing on first use, allocator
        for round_ in range(DEEPREC_ROUNDS):
            for name in rotated(names, round_):
                samples[name].append(cpu_and_wall(lambda m=models[name]: m(x)))
    middle = DEEPREC_ROUNDS // 2
    return {
        name: (sorted(c for c, _ in runs)[middle], sorted(w for _, w in runs)[middle])
        for name, runs in samples.items()
    }


def deeprec_dynamic_main(batch_sizes: list[int], threads: int, record: bool) -> None:
    model, models = deeprec_dynamic_models()
    items = PAPER_SIZES[0]
    held_out = ratings(64, items, seed=100)
    with torch.no_grad():
        ref = model(held_out)
        errors = {
            name: float((m(held_out) - ref).norm() / ref.norm())
            for name, m in models.items()
            if name != "fp32"
        }
    load_before = load_average()
    thread_counts = (1, 2) if threads == 0 else (threads,)
    table = []
    for count in thread_counts:
        for batch in batch_sizes:
            row = deeprec_rows(count, models, ratings(batch, items, seed=200 + batch))
            table.append((count, batch, row))
    command = "python benchmarks/bench_quantize.py --deeprec-dynamic"
    if tuple(batch_sizes) != (1, 64):
        command += " --batch-sizes " + " ".join(map(str, batch_sizes))
    command += f" --threads {threads}"
    lines = [
        "### Quantization on plain tensors: DeepRecommender dynamic int8 (issue 37)",
        "",
        f"{machine_line()}. Command: `{command}`; medians of {DEEPREC_ROUNDS} interleaved "
        "rounds (the order rotating), one process; CPU = the process's CPU time per forward, "
        "wall = its wall time.",
        "",
        "| threads | batch | fp32 CPU ms | torch.ao quantize_dynamic CPU ms | fxloom dynamic "
        "CPU ms | fxloom / torch.ao (CPU) | wall ms fp32 / torch.ao / fxloom "
        "| fxloom / torch.ao (wall) | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for count, batch, row in table:
        cpu = {name: value[0] for name, value in row.items()}
        wall = {name: value[1] for name, value in row.items()}
        target = DEEPREC_TARGETS.get(batch)
        lines.append(
            f"| {count} | {batch} | {cpu['fp32'] * 1e3:.2f} | {cpu['torch.ao'] * 1e3:.2f} | "
            f"{cpu['fxloom'] * 1e3:.2f} | {cpu['fxloom'] / cpu['torch.ao']:.2f} | "
            f"{wall['fp32'] * 1e3:.2f} / {wall['torch.ao'] * 1e3:.2f} / "
            f"{wall['fxloom'] * 1e3:.2f} | {wall['fxloom'] / wall['torch.ao']:.2f} | "
            f"{'-' if target is None else f'<= {target:.2f}'} |"
        )
    lines += [
        "",
        f"Relative error against fp32 on 64 held-out rows: fxloom {errors['fxloom']:.4f}, "
        f'torch.ao {errors["torch.ao"]:.4f}; the per-token form (`scheme="dynamic_per_token"`, '
        f"{_kernel('per_token', models['fxloom per token'])}) "
        f"{errors['fxloom per token']:.4f}, its CPU time / torch.ao's: "
        + ", ".join(
            f"{count} thread(s) batch {batch}: "
            f"{row['fxloom per token'][0] / row['torch.ao'][0]:.2f}"
            for count, batch, row in table
        )
        + "."
        + eight_bit_line(
            {
                "model": models.get(EIGHT_BIT_DYNAMIC),
                "ratios": [
                    (
                        f"{count} thread(s) batch {batch}",
                        row.get(EIGHT_BIT_DYNAMIC, (0.0,))[0] / row["torch.ao"][0],
                    )
                    for count, batch, row in table
                ],
            },
            errors,
        ),
        noise_line((load_before, load_average()), "."),
        "",
    ]
    publish("\n".join(lines), record)


# ----------------------------------------------------------------------------- PT2E imported
def pt2e_import_main(batch_sizes: list[int], threads: int, record: bool) -> None:
    from benchmarks.pt2e_peer import pt2e_int8
    from fxloom.quantize import import_quantized

    model, _ = zoo.build("deeprec")
    items = PAPER_SIZES[0]
    rows = [ratings(64, items, seed) for seed in range(1, 5)]
    prepared = prepare(model, (rows[0],))
    calibrate(prepared, rows, progress=False)
    own = convert(prepared)
    load_before = load_average()
    lines = [
        "### Quantization on plain tensors: a PT2E reference graph imported (issue 37 item 6)",
        "",
        f"{machine_line()}. Command: `python benchmarks/bench_quantize.py --pt2e-import "
        f"--threads {threads}`; the paper's DeepRecommender, X86InductorQuantizer's default "
        f"config; medians of {DEEPREC_ROUNDS} interleaved rounds, CPU time per forward "
        "(wall in brackets).",
        "",
        "| batch | fp32 ms | PT2E reference, eager ms | PT2E imported into fxloom ms "
        "| fxloom convert ms | error: PT2E / imported / fxloom | imported - PT2E, max |",
        "|---|---|---|---|---|---|---|",
    ]
    for batch in batch_sizes:
        x = ratings(batch, items, seed=200 + batch)
        data = list(torch.cat(rows).split(batch))[: max(4, 256 // batch)]
        reference = pt2e_int8(model, (x,), data)
        models = {
            "fp32": model,
            "PT2E": reference,
            "imported": import_quantized(fxloom.symbolic_trace(reference)),
            "fxloom": own,
        }
        row = deeprec_rows(threads, models, x)
        with torch.no_grad():
            outs = {name: m(x) for name, m in models.items()}
        error = {k: float((v - outs["fp32"]).norm() / outs["fp32"].norm()) for k, v in outs.items()}
        gap = float((outs["imported"] - outs["PT2E"]).abs().max())
        cells = " | ".join(
            f"{row[name][0] * 1e3:.2f} ({row[name][1] * 1e3:.2f})" for name in models
        )
        lines.append(
            f"| {batch} | {cells} | {error['PT2E']:.4f} / {error['imported']:.4f} / "
            f"{error['fxloom']:.4f} | {gap:.1e} |"
        )
    lines += ["", noise_line((load_before, load_average()), "."), ""]
    publish("\n".join(lines), record)


# ----------------------------------------------------------------------------- ResNet-50 static
RESNET_ROUNDS = 15


def sqnr(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB: 10 log10(||ref||^2 / ||out - ref||^2)."""
    noise = (out.float() - ref.float()).pow(2).sum()
    return float(10 * torch.log10(ref.float().pow(2).sum() / noise))


def ort_session(path: str, threads: int = 1):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def ort_quantize_static(
    model: nn.Module, example: torch.Tensor, data: list, folder: str, threads: int = 1
):
    """ONNX Runtime's own static int8 of ``model``: torch.onnx's fp32 export, ORT's
    pre-processing (shape inference, batch-norm folding), then ``quantize_static`` (QDQ,
    per-channel int8 weights, uint8 activations, MinMax calibration on ``data``); returns
    ``(fp32 session, int8 session, input name)`` at ``threads`` intra-op threads."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    fp32, pre, int8 = (f"{folder}/{name}.onnx" for name in ("fp32", "pre", "int8"))
    torch.onnx.export(model, (example,), fp32, input_names=["x"], dynamo=True)
    quant_pre_process(fp32, pre)

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{"x": batch.numpy()} for batch in data])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(
        pre, int8, Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    return ort_session(fp32, threads), ort_session(int8, threads)


class WithKernels:
    """A model whose calls run with some of the kernel table's rows replaced: an ablation
    that measures what one row gives (``rows``: op -> its rows for these calls)."""

    def __init__(self, model: nn.Module, **rows: tuple) -> None:
        self.model, self.rows = model, rows

    def __call__(self, *args):
        from fxloom.quantize import kernels

        saved = {op: kernels.KERNELS[op] for op in self.rows}
        kernels.KERNELS.update(self.rows)
        try:
            return self.model(*args)
        finally:
            kernels.KERNELS.update(saved)


def unshaped_conv_rows() -> tuple:
    """conv2d_int8's rows packing the weight without the input shape (``input_size=None``);
    their own name, as packs are cached by (kernel name, weight)."""
    from fxloom.quantize import kernels

    def pack(args: tuple):
        x, x_scale, x_zp, w, w_scale, _, stride, padding, dilation, groups = args[:10]
        packed = torch.ops.onednn.qconv_prepack(
            w, w_scale, x_scale, x_zp, stride, padding, dilation, groups, None
        )
        return packed, torch.zeros(w_scale.shape, dtype=torch.int64)

    return tuple(
        dataclasses.replace(row, name=f"{row.name} (unshaped)", pack=pack, shaped=False)
        if row.shaped  # oneDNN's rows (the float32 row's pack knows no shape)
        else row
        for row in kernels.KERNELS["conv2d_int8"]
    )


def nchw_conv_rows() -> tuple:
    """conv2d_int8's rows copying their output back to NCHW, as before channels-last was kept."""
    from fxloom.quantize import kernels

    def copied_back(row):
        def compute(args: tuple, packed) -> torch.Tensor:
            return row.compute(args, packed).contiguous()

        return dataclasses.replace(row, name=f"{row.name} (NCHW out)", compute=compute)

    return tuple(copied_back(row) for row in kernels.KERNELS["conv2d_int8"])


EIGHT_BIT_WEIGHTS = "fxloom, 8-bit weights (narrow_weights=False)"
NO_FAST_ADD = "fxloom unfused, add_int8 on the reference (ablation)"
UNFUSED = "fxloom, conv + add not fused (ablation)"
NCHW = "fxloom, conv output copied back to NCHW (ablation)"
UNSHAPED = "fxloom, conv packed without the input shape (ablation)"


def unfused_convert(prepared: nn.Module) -> nn.Module:
    """``convert`` without ``table.FUSED_SUMS``: every residual add its own add_int8."""
    from fxloom.quantize import table

    saved = dict(table.FUSED_SUMS)
    table.FUSED_SUMS.clear()
    try:
        return convert(prepared)
    finally:
        table.FUSED_SUMS.update(saved)


def resnet50_models(quick: bool, folder: str, threads: int = 1) -> tuple[dict, list, torch.Tensor]:
    """{variant: callable of x} for ResNet-50 (``quick``: base width 8, 64x64), the held-out
    images, and the timed image."""
    from fxloom.lower import lower
    from fxloom.zoo.resnet50 import ResNet50

    size = 64 if quick else 224
    model = ResNet50(base_width=8).eval() if quick else zoo.build("resnet50")[0]
    images = [
        torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(s)) for s in range(16)
    ]
    data, held_out, x = images[:8], images[8:12], images[12]
    prepared = prepare(model, (x,))
    calibrate(prepared, data, progress=False)
    ours = convert(prepared)
    # 8-bit weights on every CPU (on one without VNNI the default narrows them to 7 bits)
    eight_bits = prepare(model, (x,), QuantConfig(global_spec=QuantSpec(narrow_weights=False)))
    calibrate(eight_bits, data, progress=False)
    _, torch_ao = torch_phases(model, (x,), data, "x86")
    lowered = lower(ours, (x,), threads=threads)
    assert lowered.lowering_report.nodes_in_pytorch == 0, str(lowered.lowering_report)
    ort_fp32, ort_int8 = ort_quantize_static(model, x, data, folder, threads)
    unfused = unfused_convert(prepared)  # its own weights, as the other ablations
    models = {
        "fp32": model,
        "torch.ao FX": torch_ao,
        "fxloom": ours,
        EIGHT_BIT_WEIGHTS: convert(eight_bits),
        UNFUSED: unfused,
        NO_FAST_ADD: WithKernels(unfused, add_int8=()),
        # its own weights: a layer's kernel and pack are looked up once per weight (PLANS)
        UNSHAPED: WithKernels(convert(prepared), conv2d_int8=unshaped_conv_rows()),
        NCHW: WithKernels(convert(prepared), conv2d_int8=nchw_conv_rows()),
        "fxloom QDQ on ORT": lowered,
        "ORT quantize_static": lambda x: torch.from_numpy(ort_int8.run(None, {"x": x.numpy()})[0]),
        "ORT fp32": lambda x: torch.from_numpy(ort_fp32.run(None, {"x": x.numpy()})[0]),
    }
    return models, held_out, x


def _weight_bits(model: nn.Module) -> int:
    """7 where every int8 weight of ``model`` is narrow (``QuantSpec.narrow_weights``), else 8."""
    return 7 if _reach(model) <= kernels.NARROW_WEIGHT else 8


def resnet50_main(quick: bool, record: bool, threads: int = 1) -> None:
    import tempfile

    torch.set_num_threads(threads)
    freeze_startup_heap()
    with tempfile.TemporaryDirectory() as folder:
        models, held_out, x = resnet50_models(quick, folder, threads)
        with torch.no_grad():
            ref = torch.cat([models["fp32"](image) for image in held_out])
            quality = {
                name: sqnr(torch.cat([m(image) for image in held_out]), ref)
                for name, m in models.items()
                if name != "fp32"
            }
        loads = (load_average(), None)
        rounds = 2 if quick else RESNET_ROUNDS
        times = interleaved(models, lambda m: m(x), rounds)
    loads = (loads[0], load_average())
    cpu = {name: value[0] * 1e3 for name, value in times.items()}
    wall = {name: value[1] * 1e3 for name, value in times.items()}
    command = "python benchmarks/bench_quantize.py --resnet50" + (" --quick" if quick else "")
    command += f" --threads {threads}" if threads != 1 else ""
    counted = (
        "one torch thread, ONNX Runtime at one intra-op thread"
        if threads == 1
        else (f"{threads} torch threads, ONNX Runtime at {threads} intra-op threads")
    )
    sized = "base width 8, 64x64 (--quick)" if quick else "224x224"
    lines = [
        f"### Quantization on plain tensors: ResNet-50 static int8 (batch 1, {sized}; issue 37)",
        "",
        f"{machine_line()}. Command: `{command}`; one process, {counted}; "
        "random init (fxloom.zoo resnet50), calibrated on the same 8 "
        f"random images by every library; medians of {rounds} interleaved rounds (the order "
        "rotating). CPU = the process's CPU time per forward (what the shared machine "
        "disturbs least), wall = wall time. SQNR against fp32 on 4 held-out random images.",
        "",
        "| variant | CPU ms | wall ms | CPU / torch.ao FX | CPU / ORT quantize_static | SQNR dB |",
        "|---|---|---|---|---|---|",
    ]
    for name in models:
        lines.append(
            f"| {name} | {cpu[name]:.1f} | {wall[name]:.1f} "
            f"| {cpu[name] / cpu['torch.ao FX']:.2f} "
            f"| {cpu[name] / cpu['ORT quantize_static']:.2f} "
            f"| {'-' if name == 'fp32' else f'{quality[name]:.1f}'} |"
        )
    # one thread: the process's CPU time is the compute; more: wall time is the latency
    judged = cpu if threads == 1 else wall
    eager = judged["fxloom"] / judged["torch.ao FX"]
    lowered = judged["fxloom QDQ on ORT"] / judged["ORT quantize_static"]
    lines += [
        "",
        f"Targets ({'CPU' if threads == 1 else 'wall'} time): "
        f"fxloom / torch.ao FX <= 1.0: {eager:.2f} "
        f"({'meets' if eager <= 1.0 else '**misses**'}); SQNR fxloom >= torch.ao FX: "
        f"{quality['fxloom']:.1f} vs {quality['torch.ao FX']:.1f} dB "
        f"({'meets' if quality['fxloom'] >= quality['torch.ao FX'] else '**misses**'}); "
        f"fxloom QDQ on ORT / ORT quantize_static <= 1.1: {lowered:.2f} "
        f"({'meets' if lowered <= 1.1 else '**misses**'}). Weights: fxloom's default "
        f"{_weight_bits(models['fxloom'])}-bit here; with 8-bit weights "
        f"{cpu[EIGHT_BIT_WEIGHTS] / cpu['torch.ao FX']:.2f} at {quality[EIGHT_BIT_WEIGHTS]:.1f} "
        "dB. Ablations / torch.ao FX: "
        f"conv + add not fused {cpu[UNFUSED] / cpu['torch.ao FX']:.2f}, and its add_int8 on "
        f"the reference {cpu[NO_FAST_ADD] / cpu['torch.ao FX']:.2f}, conv "
        f"packed without the input shape {cpu[UNSHAPED] / cpu['torch.ao FX']:.2f}, conv "
        f"output copied back to NCHW {cpu[NCHW] / cpu['torch.ao FX']:.2f}.",
        noise_line(loads, "."),
        "",
    ]
    publish("\n".join(lines), record)


def interleaved(models: dict, call: Callable, rounds: int) -> dict[str, tuple[float, float]]:
    """variant -> (median CPU seconds, median wall seconds) of ``call(model)`` over ``rounds``
    interleaved rounds, after one warm-up call each (packing on first use, allocator)."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    with torch.no_grad():
        for model in models.values():
            call(model)
        for round_ in range(rounds):
            for name in rotated(list(models), round_):
                samples[name].append(cpu_and_wall(lambda m=models[name]: call(m)))
    middle = rounds // 2
    return {
        name: (sorted(c for c, _ in runs)[middle], sorted(w for _, w in runs)[middle])
        for name, runs in samples.items()
    }


# ----------------------------------------------------------------------------- LLM decode
LLM_SHAPE = dict(
    hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=4,
    vocab_size=32000, max_position_embeddings=512,
)  # TinyLlama-1.1B's shape; the layer count is --layers  # fmt: skip
LLM_QUICK = dict(
    hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=1024, num_hidden_layers=2,
)  # fmt: skip
PROMPT = 8


def last_level_cache_bytes() -> int:
    """The largest CPU cache's size (sysfs), 0 where unknown."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
        sizes.append(int(text.rstrip("KM")) * scale)
    return max(sizes, default=0)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the state the decoder layers and head read per token (the embedding table is
    read one row a token, so it is left out): torch.ao's packed weights and torchao's tensor
    subclasses counted by what they hold."""
    state = model.state_dict(keep_vars=True)
    return sum(held_bytes(v) for k, v in state.items() if not k.endswith("embed_tokens.weight"))


def held_bytes(value: object) -> int:
    if isinstance(value, (tuple, list)):  # torch.ao's packed (weight, bias)
        return sum(held_bytes(v) for v in value)
    if not isinstance(value, torch.Tensor):
        return 0
    if hasattr(value, "__tensor_flatten__"):  # a tensor subclass (torchao): its inner tensors
        names, _ = value.__tensor_flatten__()
        return sum(held_bytes(getattr(value, name)) for name in names)
    if value.is_quantized:
        return value.numel() * value.element_size()
    return value.nbytes


def fxloom_weight_only(model: nn.Module, scheme: str) -> nn.Module:
    """``model`` with every Linear replaced by fxloom's ``scheme`` conversion of it (each traced
    on its own as a one-layer Sequential, so the model stays eager and ``generate`` and its
    cache run as they do)."""
    dtype = next(model.parameters()).dtype
    for name, layer in list(model.named_modules()):
        if isinstance(layer, nn.Linear):
            example = (torch.zeros(1, 1, layer.in_features, dtype=dtype),)
            wrapped = nn.Sequential(layer).eval()
            converted = convert(prepare(wrapped, example, QuantConfig(scheme=scheme)))
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, converted)
    return model


def llm_models(quick: bool, layers: int) -> tuple[dict, dict]:
    """{variant: model} and {variant: new tokens to time} for the decoder."""
    import transformers
    from torch.ao.quantization import quantize_dynamic

    shape = LLM_QUICK if quick else {**LLM_SHAPE, "num_hidden_layers": layers}
    torch.manual_seed(0)
    fp32 = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).eval()
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    models = {
        "fp32": fp32,
        "bf16": bf16,
        "fxloom w8 (bf16 act.)": fxloom_weight_only(copy.deepcopy(bf16), "w8"),
        "fxloom w8 (fp32 act.)": fxloom_weight_only(copy.deepcopy(fp32), "w8"),
        "fxloom w4_g128 (bf16 act.)": fxloom_weight_only(copy.deepcopy(bf16), "w4_g128"),
        "fxloom w4_g128 (fp32 act.)": fxloom_weight_only(copy.deepcopy(fp32), "w4_g128"),
        "torch.ao quantize_dynamic": quantize_dynamic(
            copy.deepcopy(fp32), {nn.Linear}, dtype=torch.qint8
        ),
    }
    tokens = dict.fromkeys(models, 8 if quick else 64)
    if torchao_installed():
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        models["torchao int8 weight-only (eager)"] = eager = copy.deepcopy(bf16)
        quantize_(eager, Int8WeightOnlyConfig())
        tokens["torchao int8 weight-only (eager)"] = 4 if quick else 16  # about 0.1x fp32
    return models, tokens


def decode(model, prompt: torch.Tensor, new: int) -> torch.Tensor:
    """Greedy decode of exactly ``new`` tokens (the default dynamic cache)."""
    out = model.generate(
        prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
    )
    return out[0, prompt.shape[1] :]


def timed_decode(model, prompt: torch.Tensor, new: int) -> tuple[tuple[float, float], torch.Tensor]:
    """((CPU seconds, wall seconds), tokens) of one ``decode``."""
    got: list[torch.Tensor] = []
    seconds = cpu_and_wall(lambda: got.append(decode(model, prompt, new)))
    return seconds, got[0]


def teacher_forced(model, sequence: torch.Tensor, new: int) -> torch.Tensor:
    """The model's argmax at each of the last ``new`` steps of ``sequence`` (fp32's decode)
    given fp32's tokens before it: agreement without divergence compounding."""
    with torch.no_grad():
        logits = model(sequence[None]).logits[0]
    return logits[-new - 1 : -1].argmax(-1)


def llm_decode_main(quick: bool, layers: int, rounds: int, record: bool, threads: int) -> None:
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")  # generate's notes on generation config
    models, tokens = llm_models(quick, layers)
    prompt = torch.randint(0, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    loads = [load_average()]
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    outputs: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for model in models.values():  # warm-up: packing on first use, allocator
            decode(model, prompt, 2)
        for round_ in range(rounds):
            for name in rotated(list(models), round_):
                seconds, outputs[name] = timed_decode(models[name], prompt, tokens[name])
                samples[name].append(seconds)
                print(f"round {round_} {name}: {samples[name][-1][0]:.1f} s CPU", flush=True)
    loads.append(load_average())
    reference = outputs["fp32"]
    sequence = torch.cat([prompt[0], reference])
    forced_ref = teacher_forced(models["fp32"], sequence, len(reference))
    lines = llm_table(models, tokens, samples, outputs, sequence, forced_ref, quick, layers, rounds)
    lines += [noise_line((loads[0], loads[1]), "."), ""]
    publish("\n".join(lines), record)


def llm_table(models, tokens, samples, outputs, sequence, forced_ref, quick, layers, rounds):
    reference = outputs["fp32"]
    cache = last_level_cache_bytes()
    best = {name: min(c for c, _ in runs) for name, runs in samples.items()}
    best_wall = {name: min(w for _, w in runs) for name, runs in samples.items()}
    threads = torch.get_num_threads()
    judged_by = "(CPU)" if threads == 1 else "(wall)"
    # one thread: the process's CPU time is the compute; more: wall time is the latency
    judged = best if threads == 1 else best_wall
    rate = {name: tokens[name] / judged[name] for name in models}
    command = (
        "python benchmarks/bench_quantize.py --llm-decode"
        + (" --quick" if quick else f" --layers {layers} --rounds {rounds}")
        + (f" --threads {threads}" if threads > 1 else "")
    )
    shape = LLM_QUICK if quick else {**LLM_SHAPE, "num_hidden_layers": layers}
    lines = [
        "### Quantization on plain tensors: LLM decode, weight-only int8/int4 (issue 37)",
        "",
        f"{machine_line()}. Command: `{command}`; one process, {threads} torch thread(s). A "
        f"Llama-shaped decoder (transformers LlamaForCausalLM, random init: hidden "
        f"{shape['hidden_size']}, intermediate {shape['intermediate_size']}, "
        f"{shape['num_hidden_layers']} layers, {shape['num_attention_heads']} heads / "
        f"{shape['num_key_value_heads']} key-value heads, vocabulary {shape['vocab_size']}); "
        f"greedy `generate` from an {PROMPT}-token prompt with the default cache, batch 1. "
        "Tokens/s = new tokens / the process's CPU time for the whole `generate` (prefill "
        f"included), best of {rounds} interleaved rounds (order rotating); wall in brackets"
        f"{'' if threads == 1 else f' (the targets read wall time: the latency at {threads} threads)'}. "
        f"Last-level cache {cache / 2**20:.0f} MiB; weights = bytes the layers and head read "
        "per token (embedding table left out). fxloom's schemes convert each Linear "
        "(`fxloom_weight_only`: one traced Sequential per layer, the model stays eager). "
        "Agreement: greedy tokens equal to fp32's at the same step; teacher-forced: the "
        "argmax given fp32's tokens so far (no compounding after a first divergence).",
        "",
        f"| variant | new tokens | weights MiB | tokens/s CPU (wall) | x fp32 {judged_by} "
        "| x bf16 "
        "| agreement | teacher-forced |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, model in models.items():
        same = outputs[name] == reference[: len(outputs[name])]
        forced = teacher_forced(model, sequence, len(reference)) == forced_ref
        lines.append(
            f"| {name} | {tokens[name]} | {weight_bytes(model) / 2**20:.0f} "
            f"| {tokens[name] / best[name]:.2f} ({tokens[name] / best_wall[name]:.2f}) "
            f"| {rate[name] / rate['fp32']:.2f} | {rate[name] / rate['bf16']:.2f} "
            f"| {float(same.float().mean()):.0%} | {float(forced.float().mean()):.0%} |"
        )
    lines += ["", *llm_targets(rate, judged_by), ""]
    return lines


def llm_targets(rate: dict[str, float], judged_by: str) -> list[str]:
    """Each target for both activation dtypes a user's model may have (bf16 or fp32)."""
    fbgemm, eager = rate["torch.ao quantize_dynamic"], rate.get("torchao int8 weight-only (eager)")
    checks = []
    for act in ("bf16", "fp32"):
        w8 = rate[f"fxloom w8 ({act} act.)"]
        checks.append(
            (f"fxloom w8 ({act} act.) / torch.ao quantize_dynamic >= 1", w8 / fbgemm, 1.0)
        )
        if eager is not None:
            checks.append((f"fxloom w8 ({act} act.) / torchao eager >= 5", w8 / eager, 5.0))
    for act in ("bf16", "fp32"):
        w4 = rate[f"fxloom w4_g128 ({act} act.)"]
        checks.append((f"fxloom w4_g128 ({act} act.) / bf16 >= 1.8", w4 / rate["bf16"], 1.8))
    return [
        f"Targets (tokens/s {judged_by}, default kernels): "
        + "; ".join(
            f"{label}: {value:.2f} ({'meets' if value >= bound else '**misses**'})"
            for label, value, bound in checks
        )
        + "."
    ]


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 items, batch 1 and 16 (smoke)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16, 64, 256])
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    parser.add_argument("--engine", choices=("x86", "fbgemm", "qnnpack"), default="x86")
    parser.add_argument("--record", action="store_true", help="append the tables to RESULTS.md")
    parser.add_argument("--bert", action="store_true", help="BERT-base dynamic int8 instead")
    parser.add_argument(
        "--deeprec-dynamic", action="store_true",
        help="the paper's DeepRecommender, dynamic int8 against torch.ao quantize_dynamic "
        "(batch sizes default 1 and 64, threads default 1; --threads 0: 1 and 2)",
    )  # fmt: skip
    parser.add_argument(
        "--pt2e-import", action="store_true",
        help="the paper's DeepRecommender through PT2E, imported into fxloom's operators",
    )  # fmt: skip
    parser.add_argument(
        "--resnet50", action="store_true",
        help="ResNet-50 static int8 at batch 1 against torch.ao FX, and lowered to ONNX "
        "Runtime as QDQ against ORT's quantize_static (one thread; --threads 2: two)",
    )  # fmt: skip
    parser.add_argument(
        "--llm-decode", action="store_true",
        help="a Llama-shaped decoder's greedy decode: fp32, bf16, fxloom w8 / w4, torch.ao "
        "quantize_dynamic, torchao's eager int8 (one thread; --threads 2: two)",
    )  # fmt: skip
    parser.add_argument("--layers", type=int, default=6, help="--llm-decode's decoder layers")
    parser.add_argument("--rounds", type=int, default=2, help="--llm-decode's timed rounds")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*quantiz.*")  # torch's torchao migration notes
    warnings.filterwarnings("ignore", message=".*torchao.*")
    if args.bert:
        bert_main(args.record)
        return
    if args.resnet50:
        resnet50_main(args.quick, args.record, args.threads or 1)
        return
    if args.llm_decode:
        rounds = 1 if args.quick else args.rounds
        llm_decode_main(args.quick, args.layers, rounds, args.record, args.threads or 1)
        return
    sizes = [1, 64] if args.batch_sizes == [1, 16, 64, 256] else args.batch_sizes
    if args.deeprec_dynamic:
        deeprec_dynamic_main(sizes, 1 if args.threads is None else args.threads, args.record)
        return
    if args.pt2e_import:
        pt2e_import_main(sizes, args.threads or 1, args.record)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    config = settings(args)
    freeze_startup_heap()
    model, _ = zoo.build(config.model)
    data = [ratings(32, config.items, seed) for seed in range(1, config.calibration_batches + 1)]
    load_before = load_average()
    with quantized_engine(config.engine):
        phases, models = run_phases(config, model, data)
        error = run_error(config, model, models)
        latency = run_latency(config, model, models, Samples())
        exported = (None, [])
        if torchao_installed():
            exported = run_exported(config, model, data, Samples())
    command = "python benchmarks/bench_quantize.py" + (" --quick" if args.quick else "")
    if not args.quick and tuple(args.batch_sizes) != (1, 16, 64, 256):
        command += " --batch-sizes " + " ".join(map(str, args.batch_sizes))
    if args.threads:
        command += f" --threads {args.threads}"
    if args.engine != "x86":
        command += f" --engine {args.engine}"
    table = markdown(
        latency, error, phases, exported, config, command, (load_before, load_average())
    )
    publish(table, args.record)


if __name__ == "__main__":
    main()
