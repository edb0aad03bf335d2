"""Lowering benchmark (torch.fx paper, section 6.4): eager PyTorch against the model lowered by
``fxloom.lower`` and against ``torch.onnx.export`` + ONNX Runtime of the whole model, in one run.

Models: ``fxloom.zoo``'s ResNet-50 (images 3x224x224) and a BERT-style model (the zoo
registry's ``bert``: Hugging Face's BertModel from a tiny config, 64 tokens), at batch 1 and
8, on the CPU, in eval mode under ``torch.no_grad()``. Three ways to run each:

    eager     the model itself
    fxloom    ``fxloom.lower.lower(model, inputs)``: supported regions in ONNX Runtime,
              the rest (if any) in PyTorch
    torch.onnx  ``torch.onnx.export(model, ..., dynamo=False)`` of the whole model, run by the
              same ``OrtModule`` (same session options, same tensor hand-over)

ONNX Runtime gets the same threads as torch (``--threads``, default torch's setting), one
inter-op thread, every graph optimization and no spinning. Latency is the median of
interleaved timed calls, the three taking turns to go first, garbage collector off inside
timed regions.
Targets: fxloom >= 1.5x faster than eager on ResNet-50 at batch 1, and within 10% of the
torch.onnx path (``fxloom / torch.onnx <= 1.1``).

Default settings: ``lower(model, inputs)`` as a user calls it, against ``torch.onnx.export``
(dynamo=True, torch's default exporter; dynamo=False where it fails) run by an
``onnxruntime.InferenceSession`` made with default options, as torch.onnx users run it:
ResNet-50 at batch 1 and 8, the ratio printed (target: within 10%). Each side runs in blocks
of calls (not interleaved call by call: ONNX Runtime's default worker threads spin after a
call, and would take the cores from the other side), blocks alternating, first call of each
block not counted.

Translation time: fxloom's whole ``lower`` (trace, shapes, split, translate, check, start the
sessions, one trial run) next to ``torch.onnx.export`` (dynamo=False, and dynamo=True when it
works) plus starting its session, once each, on the batch-1 inputs.

    python benchmarks/bench_lower.py               # ResNet-50 and BERT, batch 1 and 8
    python benchmarks/bench_lower.py --quick       # smoke run: resnet_tiny and BERT, batch 1
                                                   # (default settings: resnet_tiny, batch 1)
    python benchmarks/bench_lower.py --record      # append the tables to RESULTS.md
    python benchmarks/bench_lower.py --decoders    # language models' decode step, below

Decoders (``--decoders``): GPT-2, Llama and T5 from tiny configs (``fxloom.zoo.hf_configs``,
random weights), lowered with their key/value cache (``fxloom.lower.decoder``), one decode
step at batch 1 after a past of ``--past`` tokens (default 32). Three ways to run the step:

    eager       the model's forward, given a DynamicCache of the past
    fxloom      ``LoweredDecoder.forward`` (``lower(model, {"input_ids": ...})``) in its place:
                the cache flattened to the decode graph's inputs, rebuilt from its outputs
    torch.onnx  ``torch.onnx.export`` (dynamo=True, else dynamo=False) of the same step
                (flat tensors in and out), run by an ``InferenceSession`` on numpy arrays
    fxloom file ``decode.onnx`` from ``fxloom.lower.decoder_to_onnx``, run the same way: the
                file deployed, against torch.onnx's

All with ``--threads`` (default 1) torch and ONNX Runtime threads, interleaved calls, the
three rotating which goes first; the target is fxloom <= 0.7x eager.

torch.onnx is imported here only as the comparison.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: this checkout's fxloom and `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (  # noqa: E402
    SPREAD_IS,
    Samples,
    freeze_startup_heap,
    load_average,
    machine_line,
    noise_line,
    publish,
    rotated,
    timed,
)
from fxloom import zoo  # noqa: E402
from fxloom.lower.lowering import lower  # noqa: E402
from fxloom.lower.runtime import OrtModule  # noqa: E402
from fxloom.pytree import tree_flatten  # noqa: E402

SIDES = ("eager", "fxloom", "torch.onnx")
BERT_TOKENS = 64
DEFAULTS_BLOCKS = 4  # blocks of calls per side in the default-settings table


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    repeats: int
    threads: int
    defaults_model: str = "resnet50"
    defaults_batch_sizes: tuple[int, ...] = (1, 8)


@dataclass(frozen=True)
class DefaultsRow:
    model: str
    batch: int
    fxloom: float  # median seconds
    torch_onnx: float
    exporter: str  # "dynamo=True", or "dynamo=False" where dynamo failed
    settings: str  # what lower chose, from its report's notes


@dataclass(frozen=True)
class LatencyRow:
    model: str
    batch: int
    median: dict[str, float]  # seconds by side
    max_error: float  # fxloom against eager, largest absolute difference
    regions: str  # "1 region, 0 operators in PyTorch"


@dataclass(frozen=True)
class TranslationRow:
    model: str
    fxloom: float
    torch_onnx: float
    torch_onnx_dynamo: float | None  # None: dynamo=True failed


class TextModel(nn.Module):
    """A Hugging Face text model called with fixed keyword flags, returning a tuple of tensors.

    torch.onnx.export and the timing loop take positional tensors; Hugging Face models take
    keywords and return a ModelOutput. All three sides run this same wrapper.
    """

    def __init__(self, model: nn.Module, flags: dict[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.flags = flags

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        output = self.model(input_ids=input_ids, attention_mask=attention_mask, **self.flags)
        return output.to_tuple()  # a ModelOutput


def build(name: str, batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (same weights for every batch size) and its inputs at ``batch``."""
    if name == "bert":
        from benchmarks.zoo.methods import fixed_args
        from benchmarks.zoo.registry import get

        spec = get("bert")
        model, inputs = spec.build_model(), spec.make_inputs(batch, BERT_TOKENS)
        wrapped = TextModel(model, fixed_args(model, inputs))
        return wrapped.eval(), (inputs["input_ids"], inputs["attention_mask"])
    model, (example,) = zoo.build(name)
    torch.manual_seed(batch)
    return model.eval(), (torch.randn(batch, *example.shape[1:]),)


# ----------------------------------------------------------------------------- the peer
def torch_onnx_bytes(model: nn.Module, inputs: tuple, dynamo: bool) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
            program.save(buffer)
        else:
            torch.onnx.export(model, inputs, buffer, dynamo=False, opset_version=18)
    return buffer.getvalue()


def torch_onnx_module(model: nn.Module, inputs: tuple, threads: int, dynamo: bool) -> OrtModule:
    with torch.no_grad():
        _, spec = tree_flatten(model(*inputs))
    module = OrtModule(
        torch_onnx_bytes(model, inputs, dynamo),
        name="torch.onnx",
        output_spec=spec,
        intra_op_num_threads=threads,
    )
    module.session  # noqa: B018  (started here, as lower starts its sessions)
    return module


class DefaultSession:
    """A torch.onnx file run as its users run it: ``InferenceSession`` with default options."""

    def __init__(self, model_bytes: bytes) -> None:
        import onnxruntime

        self.session = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
        self.names = [declared.name for declared in self.session.get_inputs()]

    def __call__(self, *inputs: torch.Tensor) -> list[Any]:
        return self.session.run(None, {n: t.numpy() for n, t in zip(self.names, inputs)})


def default_peer(model: nn.Module, inputs: tuple) -> tuple[DefaultSession, str]:
    try:
        return DefaultSession(torch_onnx_bytes(model, inputs, dynamo=True)), "dynamo=True"
    except Exception as error:  # the table says which exporter the peer used
        print(f"torch.onnx.export(dynamo=True) failed: {type(error).__name__}: {error}")
        return DefaultSession(torch_onnx_bytes(model, inputs, dynamo=False)), "dynamo=False"


# ----------------------------------------------------------------------------- measuring
def run_translation(name: str, config: Settings) -> tuple[TranslationRow, nn.Module, nn.Module]:
    model, inputs = build(name, 1)
    fxloom_seconds = timed(lambda: lower(model, inputs, threads=config.threads))
    peer_seconds = timed(lambda: torch_onnx_module(model, inputs, config.threads, False))
    try:
        dynamo_seconds: float | None = timed(
            lambda: torch_onnx_module(model, inputs, config.threads, True)
        )
    except Exception as error:  # the report says it failed, the rest of the table stands
        print(f"torch.onnx.export(dynamo=True) failed on {name}: {type(error).__name__}: {error}")
        dynamo_seconds = None
    return TranslationRow(name, fxloom_seconds, peer_seconds, dynamo_seconds), model, inputs


def run_latency(name: str, batch: int, config: Settings) -> LatencyRow:
    model, inputs = build(name, batch)
    # Spinning off, as for the peer: calls interleave, and spinning workers of one side
    # would take the cores of the next (the default-settings table measures spinning).
    lowered = lower(model, inputs, threads=config.threads, spinning=False)
    peer = torch_onnx_module(model, inputs, config.threads, dynamo=False)
    calls: dict[str, Callable[[], Any]] = {
        "eager": lambda: model(*inputs),
        "fxloom": lambda: lowered(*inputs),
        "torch.onnx": lambda: peer(*inputs),
    }
    samples = Samples()
    with torch.no_grad():
        for call in calls.values():  # warm up
            call()
        for repeat in range(config.repeats):
            for side in rotated(list(SIDES), repeat):
                samples.add(side, timed(calls[side]))
        error = max_error(calls["fxloom"](), calls["eager"]())
    report = lowered.lowering_report
    regions = (
        f"{len(report.lowered)} region{'s' * (len(report.lowered) != 1)}, "
        f"{report.nodes_in_pytorch} operators in PyTorch"
    )
    median = {side: statistics.median(samples.runs[side]) for side in SIDES}
    return LatencyRow(name, batch, median, error, regions)


def run_defaults(name: str, batch: int, config: Settings) -> DefaultsRow:
    """fxloom's ``lower`` and torch.onnx + ONNX Runtime, both as their defaults leave them."""
    model, inputs = build(name, batch)
    lowered = lower(model, inputs)
    peer, exporter = default_peer(model, inputs)
    calls: dict[str, Callable[[], Any]] = {
        "fxloom": lambda: lowered(*inputs),
        "torch.onnx": lambda: peer(*inputs),
    }
    samples = Samples()
    per_block = max(1, config.repeats // DEFAULTS_BLOCKS)
    with torch.no_grad():
        for block in range(DEFAULTS_BLOCKS):
            for side in rotated(list(calls), block):
                calls[side]()  # the other side's workers stop spinning; caches warm
                for _ in range(per_block):
                    samples.add(side, timed(calls[side]))
    median = {side: statistics.median(samples.runs[side]) for side in calls}
    settings = lowered.lowering_report.notes[-1] if lowered.lowering_report.notes else ""
    return DefaultsRow(name, batch, median["fxloom"], median["torch.onnx"], exporter, settings)


def max_error(got: Any, expected: Any) -> float:
    pairs = zip(tree_flatten(got)[0], tree_flatten(expected)[0])
    return max(float((a.double() - b.double()).abs().max()) for a, b in pairs)


# ----------------------------------------------------------------------------- decoders
DECODERS = ("gpt2", "llama", "t5")


@dataclass(frozen=True)
class DecoderRow:
    model: str
    median: dict[str, float | None]  # seconds by side; None: the side failed
    lowered: str  # "414 of 418 operators"
    peer: str  # which exporter the torch.onnx side used, or why it failed


def build_decoder(name: str) -> nn.Module:
    from fxloom.zoo.hf_configs import DECODER, GPT2_LIKE, T5_LIKE, hf

    builders = {
        "gpt2": hf("GPT2LMHeadModel", "GPT2Config", **GPT2_LIKE),
        "llama": hf("LlamaForCausalLM", "LlamaConfig", **DECODER),
        "t5": hf("T5ForConditionalGeneration", "T5Config", **T5_LIKE),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        return builders[name]().eval()


def decoder_file(model: nn.Module, past: int, threads: int) -> Callable[[], Any]:
    """fxloom's ``decode.onnx`` run by an ``InferenceSession`` on numpy arrays."""
    import tempfile

    from fxloom.lower import decoder

    layout = decoder._layout(model, True)
    inputs = _peer_inputs(model, layout, past)
    with tempfile.TemporaryDirectory() as directory:
        path = decoder.decoder_to_onnx(model, directory)["decode"]
        session = _session(path.read_bytes(), threads)
    feeds = {
        decoder._dotted(name): value.numpy()
        for name, value in inputs.items()
        if name in layout.parameters()
    }
    return lambda: session.run(None, feeds)


def _session(model_bytes: bytes, threads: int) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def decoder_peer(model: nn.Module, past: int, threads: int) -> tuple[Callable[[], Any], str]:
    """torch.onnx's export of the decode step (flat tensors in and out), run in ONNX Runtime."""
    from fxloom.lower import decoder

    layout = decoder._layout(model, True)
    step = decoder._step_class(layout)(model, layout).eval()
    inputs = _peer_inputs(model, layout, past)
    failures = []
    for dynamo in (True, False):
        try:
            model_bytes = torch_onnx_bytes(step, tuple(inputs.values()), dynamo)
            break
        except Exception as error:  # the table says which exporter worked, or why none did
            failures.append(f"dynamo={dynamo}: {type(error).__name__}: {str(error)[:120]}")
    else:
        return None, "; ".join(failures)
    session = _session(model_bytes, threads)
    names = [declared.name for declared in session.get_inputs()]
    feeds = dict(zip(names, (value.numpy() for value in inputs.values())))
    exporter = "dynamo=True" if not failures else "dynamo=False"
    return (lambda: session.run(None, feeds)), exporter


def _peer_inputs(model: nn.Module, layout: Any, past: int) -> dict[str, torch.Tensor]:
    """The decode step's flat inputs at batch 1: one new token after ``past`` cached ones."""
    from fxloom.lower import decoder

    ids = torch.arange(past + 1).reshape(1, past + 1) % decoder._vocabulary(model)
    context: dict[str, Any] = {}
    inputs: dict[str, torch.Tensor] = {layout.token_ids: ids[:, past:]}
    if layout.encoder:
        source = torch.ones(1, 16, dtype=torch.long)
        with torch.no_grad():
            hidden = model.get_encoder()(input_ids=source, attention_mask=source)
        context = {"encoder_outputs": hidden, "attention_mask": source}
        inputs |= {"encoder_hidden_states": hidden.last_hidden_state, "attention_mask": source}
    else:
        inputs["attention_mask"] = torch.ones(1, past + 1, dtype=torch.long)
    if layout.position_ids:
        inputs["position_ids"] = torch.tensor([[past]])
    with torch.no_grad():
        first = model(**{layout.token_ids: ids[:, :past]}, use_cache=True, **context)
    names = [f"past_key_values_{part}" for part in layout.cache_parts()]
    inputs |= dict(zip(names, decoder._tensors_of(first.past_key_values)))
    return inputs


def run_decoder(name: str, past: int, repeats: int, threads: int) -> DecoderRow:
    from fxloom.lower.decoder import decode_step

    model = build_decoder(name)
    lowered = lower(model, {"input_ids": torch.ones(1, 4, dtype=torch.long)}, threads=threads)
    peer, exporter = decoder_peer(model, past, threads)
    calls: dict[str, Callable[[], Any] | None] = {
        "eager": decode_step(model, past=past),
        "fxloom": decode_step(model, lowered.forward, past=past),
        "torch.onnx": peer,
        "fxloom file": decoder_file(model, past, threads),
    }
    sides = [side for side, call in calls.items() if call is not None]
    samples = Samples()
    with torch.no_grad():
        for side in sides:  # warm up
            calls[side]()
        for repeat in range(repeats):
            for side in rotated(sides, repeat):
                samples.add(side, timed(calls[side]))
    median = {
        side: statistics.median(samples.runs[side]) if side in sides else None for side in calls
    }
    report = lowered.lowering_report
    total = report.nodes_lowered + report.nodes_in_pytorch
    return DecoderRow(name, median, f"{report.nodes_lowered} of {total}", exporter)


def decoder_table(rows: list[DecoderRow], past: int) -> list[str]:
    def ms(seconds: float | None) -> str:
        return "failed" if seconds is None else f"{seconds * 1e3:.3f}"

    def ratio(seconds: float | None, eager: float) -> str:
        return "-" if seconds is None else f"{seconds / eager:.2f}x"

    lines = [
        f"Decode step at batch 1, past {past} (ms, median; ratio to eager; target fxloom <= 0.7x):",
        "",
        "| model | eager | fxloom | fxloom/eager | torch.onnx | torch.onnx/eager | "
        "fxloom file | fxloom file/eager | operators lowered | torch.onnx exporter |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        eager = row.median["eager"]
        lines.append(
            f"| {row.model} | {ms(eager)} | {ms(row.median['fxloom'])} | "
            f"{ratio(row.median['fxloom'], eager)} | {ms(row.median['torch.onnx'])} | "
            f"{ratio(row.median['torch.onnx'], eager)} | {ms(row.median['fxloom file'])} | "
            f"{ratio(row.median['fxloom file'], eager)} | {row.lowered} | {row.peer} |"
        )
    return lines


def decoders_markdown(
    rows: list[DecoderRow],
    past: int,
    threads: int,
    repeats: int,
    command: str,
    loads: tuple[float, float],
) -> str:
    import onnxruntime
    import transformers

    return "\n".join(
        [
            f"## Language models lowered with their key/value cache — {date.today().isoformat()}",
            "",
            f"{machine_line()}; onnxruntime {onnxruntime.__version__}; transformers "
            f"{transformers.__version__}. `{command}`; {threads} torch and ONNX Runtime "
            f"thread(s). Tiny configs (fxloom.zoo.hf_configs: 2 layers, hidden size 32), random "
            f"weights. Median of {repeats} interleaved runs per side, rotating which goes first; "
            "garbage collector off inside timed regions.",
            "",
            *decoder_table(rows, past),
            "",
            noise_line(loads, SPREAD_IS),
            "",
        ]
    )


# ----------------------------------------------------------------------------- reporting
def latency_table(rows: list[LatencyRow]) -> list[str]:
    lines = [
        "### Latency (median ms) and speedup",
        "",
        "| model | batch | eager | fxloom lowered | torch.onnx + ORT | fxloom vs eager "
        "| fxloom / torch.onnx | max abs error | lowered |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        eager, ours, peer = (row.median[side] * 1e3 for side in SIDES)
        lines.append(
            f"| {row.model} | {row.batch} | {eager:.2f} | {ours:.2f} | {peer:.2f} "
            f"| {eager / ours:.2f}x | {ours / peer:.2f} | {row.max_error:.1e} | {row.regions} |"
        )
    return lines


def defaults_table(rows: list[DefaultsRow]) -> list[str]:
    lines = [
        "### Default settings: lower(model, inputs) against torch.onnx + InferenceSession() "
        "(median ms)",
        "",
        "| model | batch | fxloom lower() | torch.onnx + ORT | fxloom / torch.onnx | exporter "
        "| lower chose |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ours, peer = row.fxloom * 1e3, row.torch_onnx * 1e3
        lines.append(
            f"| {row.model} | {row.batch} | {ours:.2f} | {peer:.2f} | {ours / peer:.2f} "
            f"| {row.exporter} | {row.settings} |"
        )
    return lines


def translation_table(rows: list[TranslationRow]) -> list[str]:
    lines = [
        "### Translation time (s, batch 1, once)",
        "",
        "| model | fxloom lower | torch.onnx.export (dynamo=False) | torch.onnx.export "
        "(dynamo=True) |",
        "|---|---|---|---|",
    ]
    for row in rows:
        dynamo = "failed" if row.torch_onnx_dynamo is None else f"{row.torch_onnx_dynamo:.2f}"
        lines.append(f"| {row.model} | {row.fxloom:.2f} | {row.torch_onnx:.2f} | {dynamo} |")
    return lines


def markdown(
    latency: list[LatencyRow],
    defaults: list[DefaultsRow],
    translation: list[TranslationRow],
    config: Settings,
    command: str,
    loads: tuple[float, float],
) -> str:
    import onnxruntime

    lines = [
        f"## Lowering to ONNX Runtime — {date.today().isoformat()}",
        "",
        f"{machine_line()}; onnxruntime {onnxruntime.__version__}. `{command}`; "
        f"{config.threads} torch and ONNX Runtime threads. Median of {config.repeats} "
        "interleaved runs per side, rotating which goes first; garbage collector off inside "
        "timed regions. Translation times include starting the ONNX Runtime sessions.",
        "",
        *latency_table(latency),
        "",
        *defaults_table(defaults),
        "",
        *translation_table(translation),
        "",
        noise_line(loads, SPREAD_IS),
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
def settings(args: argparse.Namespace) -> Settings:
    threads = torch.get_num_threads()
    if args.quick:
        return Settings(("resnet_tiny", "bert"), (1,), 5, threads, "resnet_tiny", (1,))
    return Settings(("resnet50", "bert"), tuple(args.batch_sizes), args.repeats, threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="resnet_tiny and BERT, batch 1")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--repeats", type=int, default=15, help="timed runs per side")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    parser.add_argument("--record", action="store_true", help="append the tables to RESULTS.md")
    parser.add_argument(
        "--decoders", action="store_true", help="GPT-2, Llama, T5: one decode step (see above)"
    )
    parser.add_argument("--past", type=int, default=32, help="with --decoders: cached tokens")
    args = parser.parse_args()
    if args.decoders:
        run_decoders(args)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    config = settings(args)
    freeze_startup_heap()
    load_before = load_average()
    translation = [run_translation(name, config)[0] for name in config.models]
    latency = [run_latency(n, b, config) for n in config.models for b in config.batch_sizes]
    defaults = [run_defaults(config.defaults_model, b, config) for b in config.defaults_batch_sizes]
    command = "python benchmarks/bench_lower.py" + (" --quick" if args.quick else "")
    if args.threads:
        command += f" --threads {args.threads}"
    publish(
        markdown(latency, defaults, translation, config, command, (load_before, load_average())),
        args.record,
    )


def run_decoders(args: argparse.Namespace) -> None:
    threads = args.threads or 1
    torch.set_num_threads(threads)
    repeats = 5 if args.quick else max(args.repeats, 30)
    freeze_startup_heap()
    load_before = load_average()
    rows = [run_decoder(name, args.past, repeats, threads) for name in DECODERS]
    command = f"python benchmarks/bench_lower.py --decoders --past {args.past} --threads {threads}"
    command += " --quick" if args.quick else ""
    loads = (load_before, load_average())
    publish(decoders_markdown(rows, args.past, threads, repeats, command, loads), args.record)


if __name__ == "__main__":
    main()
