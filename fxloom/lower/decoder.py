"""Causal language models lowered with their key/value cache: ``lower_decoder``, ``decoder_to_onnx``.

A Hugging Face causal LM called with its cache on (the default) takes a ``DynamicCache`` and
returns it grown by the new tokens. ONNX has no such object, so the cache is flattened to
tensors at the boundary: one pair per layer, in and out, named after the cache::

    inputs   input_ids [batch, sequence]   attention_mask [batch, total_sequence]
             (position_ids [batch, sequence], when the model's forward takes them)
             past_key_values.0.key / past_key_values.0.value ... [batch, heads, past_sequence, head_dim]
    outputs  logits [batch, sequence, vocabulary]
             present.0.key / present.0.value ...                  [batch, heads, total_sequence, head_dim]

where ``total_sequence = past_sequence + sequence``. The model is traced through a small
module (``_Step``) that takes those tensors, rebuilds the ``DynamicCache`` the model expects,
calls it, and returns the logits and the grown cache's tensors: the graph then holds only
tensor code, and every dimension above is dynamic.

Two graphs are made, as the model runs: the *prefill* (no past: the prompt) and the *decode*
step (a past of any length, any number of new tokens). The decoder is traced at sizes of its
own (batch 2, 3 new tokens, a past of 5), so that no two dynamic sizes coincide, with each of
them changed in a run of its own (``fxloom.lower.dynamic_dims.SizeRun``): the attention mask
is as long as the past and the new tokens together, which no single ``Dim`` describes. The
model is traced with its attention in the plain ("eager") implementation: the SDPA one takes
shortcuts on the values of the mask (all ones?) and the number of new tokens (one?), which
would be fixed in the graph.

``lower_decoder`` (what ``fxloom.lower.lower`` does with such a model) lowers both graphs and
returns a ``LoweredDecoder``: a module whose ``forward`` is a drop-in for the model's, so that
``model.forward = lowered.forward`` makes ``model.generate`` run in ONNX Runtime. It takes the
caller's ``DynamicCache``, feeds its tensors to the prefill or decode graph, and fills the
same cache object with the grown tensors, as the eager model does. A call the graphs were
not made for (``inputs_embeds``, attention outputs, a cache of another kind, or a traced
condition that comes out otherwise) runs the eager forward instead, with a ``LoweringWarning``
saying why: never a wrong result.

``decoder_to_onnx(model, directory)`` writes ``prefill.onnx`` and ``decode.onnx`` with the
names above (``decode.onnx`` also runs the prefill, given a past of length 0).

Depends on: ``fxloom.lower.lowering``, ``fxloom.lower.onnx_translate``,
``fxloom.lower.dynamic_dims``; transformers (already imported by whoever built the model).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fxloom.lower.dynamic_dims import BATCH, SizeRun

__all__ = [
    "DecoderLayout",
    "LoweredDecoder",
    "decoder_to_onnx",
    "is_causal_lm",
    "lower_decoder",
]

SEQUENCE, PAST, TOTAL = "sequence", "past_sequence", "total_sequence"
# The sizes the decoder is traced at, and doubled in turn: no two coincide, nor any sum.
EXAMPLE_BATCH, EXAMPLE_SEQUENCE, EXAMPLE_PAST = 2, 3, 5
# Keyword arguments ``generate`` passes that the graphs follow when they hold these values.
_NEUTRAL = {
    "use_cache": (None, True),
    "output_attentions": (None, False),
    "output_hidden_states": (None, False),
    "return_dict": (None, True, False),
    "inputs_embeds": (None,),
    "token_type_ids": (None,),
    "head_mask": (None,),
}


def is_causal_lm(model: Any, concrete_args: dict[str, Any] | None = None) -> bool:
    """Whether ``model`` is a transformers model that generates text with a key/value cache
    (its forward takes ``past_key_values``, its config keeps ``use_cache`` on) and is not
    told otherwise (``concrete_args={"use_cache": False}``); encoder-decoders are not."""
    if not isinstance(model, nn.Module) or not hasattr(model, "can_generate"):
        return False
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    if not getattr(config, "use_cache", False) or (concrete_args or {}).get("use_cache") is False:
        return False
    try:
        generates = bool(model.can_generate())
    except Exception:  # a model that cannot tell is not one we rebuild the cache of
        return False
    return generates and "past_key_values" in inspect.signature(type(model).forward).parameters


@dataclass(frozen=True)
class DecoderLayout:
    """The tensors at a decoder's boundary: their names, in order, for one graph."""

    layers: int
    position_ids: bool  # whether the model's forward takes position_ids
    past: bool  # the decode graph (True) or the prefill (False)

    def parameters(self) -> list[str]:
        """The step module's parameters (Python names: ``past_key_values_0_key``)."""
        names = ["input_ids", "attention_mask"] + ["position_ids"] * self.position_ids
        if self.past:
            names += [f"past_key_values_{i}_{kind}" for i in range(self.layers) for kind in _KV]
        return names

    def inputs(self) -> list[str]:
        """The ONNX inputs: the parameters, the cache's named ``past_key_values.0.key``."""
        return [_dotted(name) for name in self.parameters()]

    def outputs(self) -> list[str]:
        return ["logits"] + [f"present.{i}.{kind}" for i in range(self.layers) for kind in _KV]


_KV = ("key", "value")


def _dotted(name: str) -> str:
    """``past_key_values_12_key`` -> ``past_key_values.12.key``."""
    if not name.startswith("past_key_values_"):
        return name
    layer, kind = name[len("past_key_values_") :].rsplit("_", 1)
    return f"past_key_values.{layer}.{kind}"


# ---------------------------------------------------------------- the traced step
class _Step(nn.Module):
    """Flat tensors in, flat tensors out: the model called with a cache rebuilt from them.

    ``forward`` is made per layout (``_step_class``), with one named parameter per tensor, so
    the graph's inputs carry the names of the cache.
    """

    def __init__(self, model: nn.Module, layout: DecoderLayout) -> None:
        super().__init__()
        self.model = model
        self.layout = layout

    def step(self, input_ids: Any, attention_mask: Any, position_ids: Any, past: list) -> tuple:
        from transformers.cache_utils import DynamicCache

        cache = _cache_of(past) if self.layout.past else DynamicCache(config=self.model.config)
        extra = {"position_ids": position_ids} if self.layout.position_ids else {}
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=cache,
            use_cache=True,
            return_dict=True,
            **extra,
        )
        return (output.logits, *_tensors_of(output.past_key_values))


def _step_class(layout: DecoderLayout) -> type[_Step]:
    """A ``_Step`` whose forward names each tensor (``past_key_values_0_key``)."""
    names = layout.parameters()
    past = [name for name in names if name.startswith("past_key_values_")]
    position = "position_ids" if layout.position_ids else "None"
    source = (
        f"def forward(self, {', '.join(names)}):\n"
        f"    return self.step(input_ids, attention_mask, {position}, [{', '.join(past)}])\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<fxloom decoder step, {len(names)} inputs>", "exec"), namespace)
    return type("DecoderStep", (_Step,), {"forward": namespace["forward"]})


def _cache_of(tensors: list[torch.Tensor]) -> Any:
    """A ``DynamicCache`` holding ``tensors`` (key, value per layer) as its state."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    return _filled(cache, tensors)


def _filled(cache: Any, tensors: list[torch.Tensor] | tuple) -> Any:
    """``cache`` with its layers' keys and values set to ``tensors``, as ``update`` leaves
    them (the caller's cache object is filled in place, as the eager model does)."""
    from transformers.cache_utils import DynamicLayer

    pairs = list(zip(tensors[0::2], tensors[1::2]))
    while len(cache.layers) < len(pairs):
        cache.layers.append(DynamicLayer())
    for layer, (keys, values) in zip(cache.layers, pairs):
        layer.keys, layer.values = keys, values
        layer.dtype, layer.device = keys.dtype, keys.device
        layer.is_initialized = True
    return cache


def _tensors_of(cache: Any) -> list[torch.Tensor]:
    return [tensor for layer in cache.layers for tensor in (layer.keys, layer.values)]


def _plain_cache_reason(cache: Any) -> str | None:
    """Why the graphs cannot take ``cache`` (None: a DynamicCache of plain layers)."""
    if type(cache).__qualname__ != "DynamicCache":
        return f"a {type(cache).__qualname__} cache (the graphs take a DynamicCache)"
    for index, layer in enumerate(cache.layers):
        if type(layer).__qualname__ != "DynamicLayer":
            return f"layer {index} of the cache is a {type(layer).__qualname__}"
    return None


# ---------------------------------------------------------------- examples and runs
def _examples(model: nn.Module, layout: DecoderLayout, user_ids: torch.Tensor | None) -> dict:
    """The inputs a graph is traced on: batch 2, 3 new tokens, a past of 5 (decode)."""
    generator = torch.Generator().manual_seed(0)
    vocabulary = int(getattr(model.config, "vocab_size", 2) or 2)
    dtype = user_ids.dtype if user_ids is not None else torch.long
    past = EXAMPLE_PAST if layout.past else 0
    ids = torch.randint(0, vocabulary, (EXAMPLE_BATCH, EXAMPLE_SEQUENCE), generator=generator)
    inputs: dict[str, Any] = {
        "input_ids": ids.to(dtype),
        "attention_mask": torch.ones(EXAMPLE_BATCH, past + EXAMPLE_SEQUENCE, dtype=torch.long),
    }
    if layout.position_ids:
        positions = torch.arange(past, past + EXAMPLE_SEQUENCE)
        inputs["position_ids"] = positions.unsqueeze(0).expand(EXAMPLE_BATCH, -1).contiguous()
    if layout.past:
        prompt = torch.randint(0, vocabulary, (EXAMPLE_BATCH, past), generator=generator)
        with torch.no_grad():
            cached = model(input_ids=prompt.to(dtype), use_cache=True).past_key_values
        names = [name for name in layout.parameters() if name.startswith("past_key_values_")]
        inputs.update(zip(names, _tensors_of(cached)))
    return inputs


def _runs(inputs: dict[str, Any], layout: DecoderLayout) -> list[SizeRun]:
    """One run per dynamic size doubled: batch, the new tokens, the past (decode only)."""
    batch = {name: _repeat(value, 0, 2 * value.shape[0]) for name, value in inputs.items()}
    runs = [SizeRun(batch, {(EXAMPLE_BATCH, 2 * EXAMPLE_BATCH): BATCH})]
    past = EXAMPLE_PAST if layout.past else 0
    longer = {name: _grown(name, value, EXAMPLE_SEQUENCE, 0) for name, value in inputs.items()}
    total = past + EXAMPLE_SEQUENCE
    names = {(EXAMPLE_SEQUENCE, 2 * EXAMPLE_SEQUENCE): SEQUENCE}
    if layout.past:
        names[(total, total + EXAMPLE_SEQUENCE)] = TOTAL
    runs.append(SizeRun(longer, names))
    if layout.past:
        older = {name: _grown(name, value, 0, EXAMPLE_PAST) for name, value in inputs.items()}
        runs.append(
            SizeRun(
                older,
                {(EXAMPLE_PAST, 2 * EXAMPLE_PAST): PAST, (total, total + EXAMPLE_PAST): TOTAL},
            )
        )
    return runs


def _grown(name: str, value: torch.Tensor, new: int, past: int) -> torch.Tensor:
    """An input with ``new`` more tokens and ``past`` more cached positions."""
    if name == "attention_mask":
        return _repeat(value, 1, value.shape[1] + new + past)
    if name == "position_ids":
        start = int(value[0, 0]) + past
        positions = torch.arange(start, start + value.shape[1] + new)
        return positions.unsqueeze(0).expand(value.shape[0], -1).contiguous()
    if name.startswith("past_key_values_"):
        return _repeat(value, 2, value.shape[2] + past)
    return _repeat(value, 1, value.shape[1] + new)


def _repeat(value: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    positions = torch.arange(size) % value.shape[dim]
    return value.index_select(dim, positions)


@contextlib.contextmanager
def _plain_attention(model: nn.Module) -> Iterator[None]:
    """The model's attention in its plain implementation while tracing, restored after."""
    before = getattr(model.config, "_attn_implementation", None)
    setter = getattr(model, "set_attn_implementation", None)
    if setter is None or before in (None, "eager"):
        yield
        return
    setter("eager")
    try:
        yield
    finally:
        setter(before)


def _layout(model: nn.Module, past: bool) -> DecoderLayout:
    with torch.no_grad():
        probe = torch.zeros(1, 1, dtype=torch.long)
        cache = model(input_ids=probe, use_cache=True).past_key_values
    reason = _plain_cache_reason(cache)
    if reason is not None:
        raise TypeError(
            f"fxloom.lower cannot lower {type(model).__name__} with its cache: it returns {reason}. "
            'Lower it with concrete_args={"use_cache": False}'
        )
    takes = "position_ids" in inspect.signature(type(model).forward).parameters
    return DecoderLayout(len(cache.layers), takes, past)


def _traced_step(model: nn.Module, layout: DecoderLayout, user_ids: Any) -> tuple[Any, dict, list]:
    """The step module traced on its examples, the examples, and the runs at other sizes."""
    from fxloom.passes.captured import trace

    inputs = _examples(model, layout, user_ids)
    step = _step_class(layout)(model, layout).eval()
    with _plain_attention(model):
        gm = trace(step, inputs, consumer="fxloom.lower (decoder)")
    return gm, inputs, _runs(inputs, layout)


# ---------------------------------------------------------------- lower
def lower_decoder(
    model: nn.Module,
    example_inputs: Any = None,
    *,
    backend: Any = "onnxruntime",
    threads: int | None = None,
    check: bool = False,
    min_lowered: float = 0.0,
) -> LoweredDecoder:
    """Lower a causal LM's prefill and decode step with the key/value cache as tensors.

    ``example_inputs`` (``{"input_ids": ids}``) gives the dtype of the token ids; the graphs
    are traced at sizes of their own (see the module docstring). Returns a ``LoweredDecoder``
    whose ``forward`` is a drop-in for ``model.forward``.
    """
    from fxloom.lower.lowering import lower

    user_ids = _user_ids(example_inputs)
    graphs = {}
    for past in (False, True):
        layout = _layout(model, past)
        gm, inputs, runs = _traced_step(model, layout, user_ids)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one warning below, for the decoder as a whole
            graphs[layout] = lower(
                gm, inputs, backend=backend, threads=threads, check=check, size_runs=runs
            )
    lowered = LoweredDecoder(model, graphs)
    from fxloom.lower.lowering import LoweringWarning, too_little_lowered

    for part in (lowered.prefill, lowered.decode):
        too_little = too_little_lowered(part.lowering_report, min_lowered)
        if too_little is not None:
            warnings.warn(too_little, LoweringWarning, stacklevel=3)
    return lowered


def _user_ids(example_inputs: Any) -> torch.Tensor | None:
    if isinstance(example_inputs, dict):
        return example_inputs.get("input_ids")
    if isinstance(example_inputs, (tuple, list)) and example_inputs:
        return example_inputs[0]
    return example_inputs if isinstance(example_inputs, torch.Tensor) else None


class LoweredDecoder(nn.Module):
    """A causal LM's prefill and decode graphs, lowered; ``forward`` is a drop-in for the model's.

    ``prefill`` and ``decode`` are the lowered GraphModules (flat tensors in and out, see the
    module docstring), ``lowering_report`` their reports together; ``eager_calls`` counts the
    calls that ran the eager forward instead (each warned once, with its reason).
    """

    def __init__(self, model: nn.Module, graphs: dict[DecoderLayout, Any]) -> None:
        super().__init__()
        (prefill_layout, self.prefill), (decode_layout, self.decode) = sorted(
            graphs.items(), key=lambda item: item[0].past
        )
        self.layout = decode_layout
        self._eager = type(model).forward.__get__(model)  # the class's, even once replaced
        self._output_class = _output_class(model)
        self._model_name = type(model).__name__
        self.eager_calls = 0
        self._warned: set[str] = set()
        self.lowering_report = _joined_report(self._model_name, self.prefill, self.decode)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        cache_position: torch.Tensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> Any:
        call = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )
        reason = self._eager_reason(input_ids, past_key_values, kwargs)
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if reason is None:
            reason = _cache_position_reason(cache_position, past, input_ids.shape[1])
        if reason is not None:
            return self._run_eager(reason, call)
        try:
            logits, present = self._run_graph(
                input_ids, attention_mask, position_ids, past_key_values, past
            )
        except RuntimeError as error:
            if "so the traced code does not apply" not in str(error):
                raise
            return self._run_eager(str(error), call)
        cache = None
        if kwargs.get("use_cache", True) is not False:
            cache = _filled(
                past_key_values if past_key_values is not None else _new_cache(), present
            )
        logits = logits[:, _kept(logits_to_keep), :]
        if kwargs.get("return_dict") is False:
            return (logits, cache) if cache is not None else (logits,)
        return self._output_class(logits=logits, past_key_values=cache)

    def _eager_reason(self, input_ids: Any, cache: Any, kwargs: dict[str, Any]) -> str | None:
        if input_ids is None:
            return "no input_ids (the graphs take token ids)"
        for name, value in kwargs.items():
            if name not in _NEUTRAL or not any(
                value is v or value == v
                for v in _NEUTRAL[name]
                if not isinstance(value, torch.Tensor)
            ):
                return f"{name}={_short(value)} (the graphs were made for its default)"
        if cache is not None:
            return _plain_cache_reason(cache)
        return None

    def _run_graph(self, input_ids: Any, mask: Any, positions: Any, cache: Any, past: int) -> tuple:
        batch, new = input_ids.shape
        if mask is None:
            mask = torch.ones(batch, past + new, dtype=torch.long, device=input_ids.device)
        inputs = [input_ids, mask.to(torch.long)]
        if self.layout.position_ids:
            if positions is None:
                positions = torch.arange(past, past + new, device=input_ids.device)
                positions = positions.unsqueeze(0).expand(batch, -1)
            inputs.append(positions)
        graph = self.prefill
        if past > 0:
            graph = self.decode
            inputs += _tensors_of(cache)
        outputs = graph(*inputs)
        return outputs[0], list(outputs[1:])

    def _run_eager(self, reason: str, call: dict[str, Any]) -> Any:
        from fxloom.lower.lowering import LoweringWarning

        self.eager_calls += 1
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(
                f"{self._model_name}: this call runs the eager forward, not the lowered "
                f"graphs: {reason}",
                LoweringWarning,
                stacklevel=3,
            )
        return self._eager(**{k: v for k, v in call.items() if v is not None})


def _new_cache() -> Any:
    from transformers.cache_utils import DynamicCache

    return DynamicCache()


def _kept(logits_to_keep: int | torch.Tensor) -> Any:
    """Which positions' logits the model returns (transformers' ``logits_to_keep``)."""
    if isinstance(logits_to_keep, int):
        return slice(-logits_to_keep, None) if logits_to_keep else slice(None)
    return logits_to_keep


def _cache_position_reason(cache_position: Any, past: int, new: int) -> str | None:
    if cache_position is None:
        return None
    expected = torch.arange(past, past + new, device=cache_position.device)
    if cache_position.shape == expected.shape and bool(torch.equal(cache_position, expected)):
        return None
    return "cache_position is not the positions after the cache's (the graphs compute those)"


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return repr(value)[:40]


def _output_class(model: nn.Module) -> type:
    with torch.no_grad():
        probe = torch.zeros(1, 1, dtype=torch.long)
        return type(model(input_ids=probe, use_cache=True, return_dict=True))


def _joined_report(model: str, prefill: Any, decode: Any) -> Any:
    """The two graphs' reports as one: regions and operators named by graph."""
    import dataclasses

    from fxloom.lower.report import LoweringReport

    regions, left, notes = [], [], []
    for part, gm in (("prefill", prefill), ("decode", decode)):
        report = gm.lowering_report
        regions += [dataclasses.replace(r, name=f"{part}.{r.name}") for r in report.regions]
        left += [dataclasses.replace(n, name=f"{part}.{n.name}") for n in report.left]
        notes += [f"{part}: {note}" for note in report.notes]
    first = prefill.lowering_report
    return LoweringReport(model, first.backend, tuple(regions), tuple(left), notes=tuple(notes))


# ---------------------------------------------------------------- ONNX files
def decoder_to_onnx(
    model: nn.Module, directory: str | os.PathLike, example_inputs: Any = None
) -> dict[str, Path]:
    """Write ``prefill.onnx`` and ``decode.onnx`` into ``directory``; return their paths.

    Inputs and outputs are named as the module docstring shows, every size but the heads and
    the head size dynamic. ``decode.onnx`` runs the prefill too, given past tensors of
    length 0. Every node must translate (``UnsupportedNodeError`` otherwise).
    """
    from fxloom.lower.extra import require
    from fxloom.lower.onnx_translate import translate_at_sizes

    onnx = require("onnx")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    user_ids = _user_ids(example_inputs)
    paths = {}
    for past, file in ((False, "prefill.onnx"), (True, "decode.onnx")):
        layout = _layout(model, past)
        gm, inputs, runs = _traced_step(model, layout, user_ids)
        proto = translate_at_sizes(gm, inputs, runs)
        _name_for_deployment(proto, layout)
        onnx.checker.check_model(proto, full_check=True)
        paths[file.removesuffix(".onnx")] = directory / file
        onnx.save_model(proto, os.fspath(directory / file))
    return paths


def _name_for_deployment(proto: Any, layout: DecoderLayout) -> None:
    """Inputs and outputs named after the cache; the lengths that sum two sizes named
    ``total_sequence`` (the attention mask of the decode graph, every ``present``)."""
    renames = dict(zip(layout.parameters(), layout.inputs()))
    renames.update({f"output_{i}": name for i, name in enumerate(layout.outputs())})
    graph = proto.graph
    for node in graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        node.output[:] = [renames.get(name, name) for name in node.output]
    for value in list(graph.input) + list(graph.output):
        value.name = renames.get(value.name, value.name)
        dims = value.type.tensor_type.shape.dim
        summed = (value.name == "attention_mask" and layout.past) or value.name.startswith(
            "present."
        )
        position = 1 if value.name == "attention_mask" else 2
        if summed and len(dims) > position and dims[position].dim_param:
            dims[position].dim_param = TOTAL
        for dim in dims:
            if dim.dim_param.startswith("output_0_dim_") and value.name == "logits":
                dim.dim_param = SEQUENCE
