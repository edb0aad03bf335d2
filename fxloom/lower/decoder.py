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
names above (a decoder-only model's ``decode.onnx`` also runs the prefill, given past
tensors of length 0; an encoder-decoder's needs the cross-attention cache its prefill made).

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
    "decode_step",
    "decoder_to_onnx",
    "is_causal_lm",
    "lower_decoder",
]

SEQUENCE, PAST, TOTAL = "sequence", "past_sequence", "total_sequence"
ENCODER = "encoder_sequence"
# The sizes the decoder is traced at, and doubled in turn: no two coincide, nor any sum.
EXAMPLE_BATCH, EXAMPLE_SEQUENCE, EXAMPLE_PAST, EXAMPLE_ENCODER = 2, 3, 5, 7
# The keyword a model's forward takes its cache by, which is also the field of the output that
# returns it: transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old keyword is
# accepted, deprecated, until 5.40). The ONNX files keep the deployed names either way.
CACHE_KEYWORDS = ("cache", "past_key_values")
# The arguments the graphs take, for a decoder-only model (False) and an encoder-decoder.
_TAKEN = {
    False: {"input_ids", "attention_mask", "position_ids", "cache_position", *CACHE_KEYWORDS},
    True: {"decoder_input_ids", "encoder_outputs", "attention_mask", *CACHE_KEYWORDS}
    | {"cache_position", "input_ids"},  # input_ids: the encoder's, unread with encoder_outputs
}
# Other arguments ``generate`` passes, which the graphs follow when they hold these values.
_NEUTRAL = {
    "use_cache": (True, False),
    "output_attentions": (False,),
    "output_hidden_states": (False,),
    "return_dict": (True, False),
    "logits_to_keep": (),  # any int or tensor: the logits are cut after the graph
}


def is_causal_lm(model: Any, concrete_args: dict[str, Any] | None = None) -> bool:
    """Whether ``model`` is a transformers model that generates text with a key/value cache
    (its forward takes a cache, ``CACHE_KEYWORDS``, its config keeps ``use_cache`` on) and is not
    told otherwise (``concrete_args={"use_cache": False}``). Encoder-decoders (T5) are too:
    their decoder is lowered with both its caches (self-attention and cross-attention)."""
    if not isinstance(model, nn.Module) or not hasattr(model, "can_generate"):
        return False
    config = getattr(model, "config", None)
    if config is None:
        return False
    if not getattr(config, "use_cache", False) or (concrete_args or {}).get("use_cache") is False:
        return False
    try:
        generates = bool(model.can_generate())
    except Exception:  # a model that cannot tell is not one we rebuild the cache of
        return False
    return generates and cache_keyword(model) is not None


def cache_keyword(model: nn.Module) -> str | None:
    """The keyword ``model``'s forward takes its cache by (``CACHE_KEYWORDS``), if any."""
    parameters = inspect.signature(type(model).forward).parameters
    return next((name for name in CACHE_KEYWORDS if name in parameters), None)


def returned_cache(output: Any) -> Any:
    """The cache a model's output returns, under either of its names."""
    for name in CACHE_KEYWORDS:
        cache = getattr(output, name, None)
        if cache is not None:
            return cache
    return None


def _given_cache(call: dict[str, Any]) -> Any:
    """The cache a call passes, by the forward's keyword or the deprecated one."""
    return next((call[name] for name in CACHE_KEYWORDS if call.get(name) is not None), None)


@dataclass(frozen=True)
class DecoderLayout:
    """The tensors at a decoder's boundary: their names, in order, for one graph."""

    layers: int
    position_ids: bool  # whether the model's forward takes position_ids (decoder-only)
    past: bool  # the decode graph (True) or the prefill (False)
    encoder: bool = False  # an encoder-decoder: cross-attention keys and values per layer too

    def parameters(self) -> list[str]:
        """The step module's parameters (Python names: ``past_key_values_0_key``)."""
        if self.encoder:
            names = ["decoder_input_ids", "encoder_hidden_states", "attention_mask"]
        else:
            names = ["input_ids", "attention_mask"] + ["position_ids"] * self.position_ids
        if self.past:
            names += [f"past_key_values_{part}" for part in self.cache_parts()]
        return names

    def cache_parts(self) -> list[str]:
        """Each cached tensor, in order: ``0_key``, ``0_value`` ... (``0_decoder_key``,
        ``0_decoder_value``, ``0_encoder_key``, ``0_encoder_value`` ... with an encoder)."""
        attentions = ("decoder_", "encoder_") if self.encoder else ("",)
        return [
            f"{layer}_{attention}{kind}"
            for layer in range(self.layers)
            for attention in attentions
            for kind in _KV
        ]

    def inputs(self) -> list[str]:
        """The ONNX inputs: the parameters, the cache's named ``past_key_values.0.key``."""
        return [_dotted(name) for name in self.parameters()]

    def outputs(self) -> list[str]:
        return ["logits"] + [f"present.{part.replace('_', '.')}" for part in self.cache_parts()]

    @property
    def token_ids(self) -> str:
        return "decoder_input_ids" if self.encoder else "input_ids"


_KV = ("key", "value")


def _dotted(name: str) -> str:
    """``past_key_values_12_key`` -> ``past_key_values.12.key``."""
    prefix = "past_key_values_"
    if not name.startswith(prefix):
        return name
    return "past_key_values." + name[len(prefix) :].replace("_", ".")


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

    def step(self, ids: Any, attention_mask: Any, extra: dict[str, Any], past: list) -> tuple:
        """The model on these tensors; the prefill lets the model make its own cache."""
        from transformers.cache_utils import DynamicCache

        layout = self.layout
        if layout.past:
            cache = _filled(_new_cache(layout.encoder), past)
        else:
            cache = None if layout.encoder else DynamicCache(config=self.model.config)
        if layout.encoder:
            extra = {"encoder_outputs": (extra["encoder_hidden_states"],)}
        output = self.model(
            **{layout.token_ids: ids},
            attention_mask=attention_mask,
            **{cache_keyword(self.model): cache},
            use_cache=True,
            return_dict=True,
            **extra,
        )
        return (output.logits, *_tensors_of(returned_cache(output)))


def _step_class(layout: DecoderLayout) -> type[_Step]:
    """A ``_Step`` whose forward names each tensor (``past_key_values_0_key``)."""
    names = layout.parameters()
    past = [name for name in names if name.startswith("past_key_values_")]
    extra = [name for name in names[1:] if name not in past and name != "attention_mask"]
    source = (
        f"def forward(self, {', '.join(names)}):\n"
        f"    extra = {{{', '.join(f'{name!r}: {name}' for name in extra)}}}\n"
        f"    return self.step({layout.token_ids}, attention_mask, extra, [{', '.join(past)}])\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<fxloom decoder step, {len(names)} inputs>", "exec"), namespace)
    return type("DecoderStep", (_Step,), {"forward": namespace["forward"]})


def _new_cache(encoder: bool = False) -> Any:
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    if not encoder:
        return DynamicCache()
    # Not through __init__, which reads the cross-attention cache's sizes (guards, here).
    cache = EncoderDecoderCache.__new__(EncoderDecoderCache)
    cache.self_attention_cache, cache.cross_attention_cache = DynamicCache(), DynamicCache()
    cache.is_updated = {}
    return cache


def _filled(cache: Any, tensors: list[torch.Tensor] | tuple) -> Any:
    """``cache`` with its layers' keys and values set to ``tensors`` (``cache_parts`` order),
    as ``update`` leaves them: the caller's cache object is filled in place, as the eager
    model does. An encoder-decoder's cross-attention layers are marked computed."""
    if hasattr(cache, "cross_attention_cache"):
        _fill_layers(cache.self_attention_cache, [t for i, t in enumerate(tensors) if i % 4 < 2])
        _fill_layers(cache.cross_attention_cache, [t for i, t in enumerate(tensors) if i % 4 > 1])
        cache.is_updated = dict.fromkeys(range(len(tensors) // 4), True)
        return cache
    _fill_layers(cache, list(tensors))
    return cache


def _fill_layers(cache: Any, tensors: list[torch.Tensor]) -> None:
    from transformers.cache_utils import DynamicLayer

    pairs = list(zip(tensors[0::2], tensors[1::2]))
    while len(cache.layers) < len(pairs):
        cache.layers.append(DynamicLayer())
    for layer, (keys, values) in zip(cache.layers, pairs):
        layer.keys, layer.values = keys, values
        layer.dtype, layer.device = keys.dtype, keys.device
        layer.is_initialized = True


def _tensors_of(cache: Any) -> list[torch.Tensor]:
    """A cache's tensors in ``cache_parts`` order."""
    if hasattr(cache, "cross_attention_cache"):
        own = _tensors_of(cache.self_attention_cache)
        cross = _tensors_of(cache.cross_attention_cache)
        return [t for i in range(0, len(own), 2) for t in (*own[i : i + 2], *cross[i : i + 2])]
    return [tensor for layer in cache.layers for tensor in (layer.keys, layer.values)]


def _plain_cache_reason(cache: Any, encoder: bool = False) -> str | None:
    """Why the graphs cannot take ``cache`` (None: a DynamicCache of plain layers, or an
    EncoderDecoderCache of two, for an encoder-decoder)."""
    if encoder:
        if type(cache).__qualname__ != "EncoderDecoderCache":
            return f"a {type(cache).__qualname__} cache (the graphs take an EncoderDecoderCache)"
        return _plain_cache_reason(cache.self_attention_cache) or _plain_cache_reason(
            cache.cross_attention_cache
        )
    if type(cache).__qualname__ != "DynamicCache":
        return f"a {type(cache).__qualname__} cache (the graphs take a DynamicCache)"
    for index, layer in enumerate(cache.layers):
        if type(layer).__qualname__ != "DynamicLayer":
            return f"layer {index} of the cache is a {type(layer).__qualname__}"
    return None


# ---------------------------------------------------------------- examples and runs
def _examples(model: nn.Module, layout: DecoderLayout, user_ids: torch.Tensor | None) -> dict:
    """The inputs a graph is traced on: batch 2, 3 new tokens, a past of 5 (decode), an
    encoder's output of 7 positions (encoder-decoders)."""
    generator = torch.Generator().manual_seed(0)
    vocabulary = _vocabulary(model)
    dtype = user_ids.dtype if user_ids is not None else torch.long

    def tokens(length: int) -> torch.Tensor:
        ids = torch.randint(0, vocabulary, (EXAMPLE_BATCH, length), generator=generator)
        return ids.to(dtype)

    past = EXAMPLE_PAST if layout.past else 0
    inputs: dict[str, Any] = {layout.token_ids: tokens(EXAMPLE_SEQUENCE)}
    context: dict[str, Any] = {}
    if layout.encoder:
        mask = torch.ones(EXAMPLE_BATCH, EXAMPLE_ENCODER, dtype=torch.long)
        with torch.no_grad():
            encoded = model.get_encoder()(input_ids=tokens(EXAMPLE_ENCODER), attention_mask=mask)
        inputs["encoder_hidden_states"] = encoded.last_hidden_state
        inputs["attention_mask"] = mask
        context = {"encoder_outputs": (encoded.last_hidden_state,), "attention_mask": mask}
    else:
        inputs["attention_mask"] = torch.ones(
            EXAMPLE_BATCH, past + EXAMPLE_SEQUENCE, dtype=torch.long
        )
    if layout.position_ids:
        positions = torch.arange(past, past + EXAMPLE_SEQUENCE)
        inputs["position_ids"] = positions.unsqueeze(0).expand(EXAMPLE_BATCH, -1).contiguous()
    if layout.past:
        with torch.no_grad():
            output = model(**{layout.token_ids: tokens(past)}, use_cache=True, **context)
        names = [f"past_key_values_{part}" for part in layout.cache_parts()]
        inputs.update(zip(names, _tensors_of(returned_cache(output))))
    return inputs


def _runs(inputs: dict[str, Any], layout: DecoderLayout) -> list[SizeRun]:
    """One run per dynamic size doubled: the batch, the new tokens, the past (decode), the
    encoder's output (encoder-decoders). A decoder-only model's attention mask covers the
    past and the new tokens (``total_sequence``), so it grows in two runs."""
    batch = {name: _repeat(value, 0, 2 * value.shape[0]) for name, value in inputs.items()}
    runs = [SizeRun(batch, {(EXAMPLE_BATCH, 2 * EXAMPLE_BATCH): BATCH})]
    total = (EXAMPLE_PAST if layout.past else 0) + EXAMPLE_SEQUENCE
    grows = [(SEQUENCE, EXAMPLE_SEQUENCE)]
    grows += [(PAST, EXAMPLE_PAST)] if layout.past else []
    grows += [(ENCODER, EXAMPLE_ENCODER)] if layout.encoder else []
    for size, example in grows:
        grown = {name: _grown(name, value, size, example, layout) for name, value in inputs.items()}
        names = {(example, 2 * example): size}
        if layout.past and size != ENCODER:
            names[(total, total + example)] = TOTAL
        runs.append(SizeRun(grown, names))
    return runs


def _grown(
    name: str, value: torch.Tensor, size: str, by: int, layout: DecoderLayout
) -> torch.Tensor:
    """An input with the dynamic ``size`` grown ``by`` positions (unchanged if it has none)."""
    dim = (_GROWS | _mask_grows(layout)).get((_kind(name), size))
    if dim is None:
        return value
    if name == "position_ids":  # the positions after the past
        start = int(value[0, 0]) + (by if size == PAST else 0)
        positions = torch.arange(start, start + value.shape[1] + (by if size == SEQUENCE else 0))
        return positions.unsqueeze(0).expand(value.shape[0], -1).contiguous()
    return _repeat(value, dim, value.shape[dim] + by)


def _kind(name: str) -> str:
    """An input's kind for ``_GROWS``: its name, the cache's ``past.self`` or ``past.cross``."""
    if name.startswith("past_key_values_"):
        return "past.cross" if "_encoder_" in name else "past.self"
    return name


# Which dimension of each input grows with each dynamic size.
_GROWS = {
    ("input_ids", SEQUENCE): 1,
    ("decoder_input_ids", SEQUENCE): 1,
    ("position_ids", SEQUENCE): 1,
    ("position_ids", PAST): 1,
    ("past.self", PAST): 2,
    ("past.cross", ENCODER): 2,
    ("encoder_hidden_states", ENCODER): 1,
}


def _mask_grows(layout: DecoderLayout) -> dict[tuple[str, str], int]:
    """The attention mask: the encoder's positions, or the past and the new tokens."""
    sizes = (ENCODER,) if layout.encoder else (SEQUENCE, PAST)
    return {("attention_mask", size): 1 for size in sizes}


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
    """The layout of ``model``'s cache, found by calling it on one token."""
    encoder = bool(getattr(model.config, "is_encoder_decoder", False))
    cache = returned_cache(_probe(model))
    reason = _plain_cache_reason(cache, encoder)
    if reason is not None:
        raise TypeError(
            f"fxloom.lower cannot lower {type(model).__name__} with its cache: it returns "
            f'{reason}. Lower it with concrete_args={{"use_cache": False}}'
        )
    takes = "position_ids" in inspect.signature(type(model).forward).parameters
    layers = len(cache.self_attention_cache.layers if encoder else cache.layers)
    return DecoderLayout(layers, takes and not encoder, past, encoder)


def _probe(model: nn.Module) -> Any:
    """The model's output on one token (and one encoder position), cache on."""
    probe = torch.zeros(1, 1, dtype=torch.long)
    extra = (
        {"decoder_input_ids": probe} if getattr(model.config, "is_encoder_decoder", False) else {}
    )
    with torch.no_grad():
        return model(input_ids=probe, use_cache=True, return_dict=True, **extra)


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
        self._signature = inspect.signature(self._eager)
        self._output_class = _output_class(model)
        self._model_name = type(model).__name__
        self.eager_calls = 0
        self._warned: set[str] = set()
        self.lowering_report = _joined_report(self._model_name, self.prefill, self.decode)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward (same arguments, same output class): in the lowered graphs
        when the call is one they were made for, else eagerly (``eager_calls``)."""
        call = self._signature.bind_partial(*args, **kwargs).arguments
        call.update(call.pop("kwargs", {}))
        reason, past = self._eager_reason(call)
        if reason is not None:
            return self._run_eager(reason, call)
        cache = _given_cache(call)
        try:
            logits, present = self._run_graph(call, past)
        except RuntimeError as error:
            if "so the traced code does not apply" not in str(error):
                raise
            return self._run_eager(str(error), call)
        if call.get("use_cache") is not False:
            cache = _filled(
                cache if cache is not None else _new_cache(self.layout.encoder), present
            )
        else:
            cache = None
        logits = logits[:, _kept(call.get("logits_to_keep", 0)), :]
        if call.get("return_dict") is False:
            return (logits, cache) if cache is not None else (logits,)
        fields = {"logits": logits, _cache_field(self._output_class): cache}
        if self.layout.encoder:
            fields["encoder_last_hidden_state"] = _encoded(call)
        return self._output_class(**fields)

    def _eager_reason(self, call: dict[str, Any]) -> tuple[str | None, int]:
        """Why this call runs eagerly (None: the graphs take it), and the cache's length."""
        layout = self.layout
        ids = call.get(layout.token_ids)
        if ids is None:
            return f"no {layout.token_ids} (the graphs take token ids)", 0
        if layout.encoder and call.get("encoder_outputs") is None:
            return "no encoder_outputs (the graphs run the decoder; generate passes them)", 0
        for name, value in call.items():
            if name not in _TAKEN[layout.encoder] and not _neutral(name, value):
                return f"{name}={_short(value)} (the graphs were made for its default)", 0
        cache = _given_cache(call)
        if cache is None:
            return None, 0
        reason = _plain_cache_reason(cache, layout.encoder)
        if reason is not None:
            return reason, 0
        past = cache.get_seq_length()
        return _cache_position_reason(call.get("cache_position"), past, ids.shape[1]), past

    def _run_graph(self, call: dict[str, Any], past: int) -> tuple:
        layout = self.layout
        ids = call[layout.token_ids]
        batch, new = ids.shape
        mask = call.get("attention_mask")
        if layout.encoder:
            encoded = _encoded(call)
            if mask is None:
                mask = torch.ones(encoded.shape[:2], dtype=torch.long, device=ids.device)
            inputs = [ids, encoded, mask.to(torch.long)]
        else:
            if mask is None:
                mask = torch.ones(batch, past + new, dtype=torch.long, device=ids.device)
            inputs = [ids, mask.to(torch.long)]
        if layout.position_ids:
            positions = call.get("position_ids")
            if positions is None:
                positions = torch.arange(past, past + new, device=ids.device)
                positions = positions.unsqueeze(0).expand(batch, -1)
            inputs.append(positions)
        graph = self.prefill
        if past > 0:
            graph = self.decode
            inputs += _tensors_of(_given_cache(call))
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


def _neutral(name: str, value: Any) -> bool:
    if value is None or name == "logits_to_keep":
        return True
    return name in _NEUTRAL and isinstance(value, bool) and value in _NEUTRAL[name]


def _encoded(call: dict[str, Any]) -> torch.Tensor:
    outputs = call["encoder_outputs"]
    return outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return repr(value)[:40]


def _output_class(model: nn.Module) -> type:
    return type(_probe(model))


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


# ---------------------------------------------------------------- timing
def decode_step(
    model: nn.Module, forward: Any = None, *, batch: int = 1, past: int = 32, encoded: int = 16
) -> Any:
    """A call of one decode step for timing: one new token after ``past`` cached ones (and an
    encoder output of ``encoded`` positions, for an encoder-decoder), by ``forward`` (the
    model's own by default; a ``LoweredDecoder``'s to time the lowered one). Each call gets a
    fresh cache holding the same tensors, so the past keeps its length."""
    forward = forward or type(model).forward.__get__(model)
    layout = _layout(model, True)
    ids = torch.arange(batch * (past + 1)).reshape(batch, past + 1) % _vocabulary(model)
    context: dict[str, Any] = {}
    if layout.encoder:
        source = torch.ones(batch, encoded, dtype=torch.long)
        with torch.no_grad():
            hidden = model.get_encoder()(input_ids=source, attention_mask=source)
        context = {"encoder_outputs": hidden, "attention_mask": source}
    with torch.no_grad():
        first = model(**{layout.token_ids: ids[:, :past]}, use_cache=True, **context)
    tensors = _tensors_of(returned_cache(first))
    if not layout.encoder:
        context = {"attention_mask": torch.ones(batch, past + 1, dtype=torch.long)}

    def step() -> Any:
        cache = _filled(_new_cache(layout.encoder), tensors)
        with torch.no_grad():
            return forward(
                **{layout.token_ids: ids[:, past:]},
                **{cache_keyword(model): cache},
                use_cache=True,
                **context,
            )

    return step


def _vocabulary(model: nn.Module) -> int:
    return int(getattr(model.config, "vocab_size", 2) or 2)


# ---------------------------------------------------------------- ONNX files
def decoder_to_onnx(
    model: nn.Module, directory: str | os.PathLike, example_inputs: Any = None
) -> dict[str, Path]:
    """Write ``prefill.onnx`` and ``decode.onnx`` into ``directory``; return their paths.

    Inputs and outputs are named as the module docstring shows, every size but the heads and
    the head size dynamic. A decoder-only model's ``decode.onnx`` runs the prefill too, given
    past tensors of length 0. Every node must translate (``UnsupportedNodeError`` otherwise).
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
    ``total_sequence`` (``_sums_two_sizes``)."""
    renames = dict(zip(layout.parameters(), layout.inputs()))
    renames.update({f"output_{i}": name for i, name in enumerate(layout.outputs())})
    graph = proto.graph
    for node in graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        node.output[:] = [renames.get(name, name) for name in node.output]
    for value in list(graph.input) + list(graph.output):
        value.name = renames.get(value.name, value.name)
        dims = value.type.tensor_type.shape.dim
        if _sums_two_sizes(value.name, layout):
            position = 1 if value.name == "attention_mask" else 2
            if len(dims) > position and dims[position].dim_param:
                dims[position].dim_param = TOTAL


def _sums_two_sizes(name: str, layout: DecoderLayout) -> bool:
    """Whether a decode graph's input or output is as long as the past and the new tokens."""
    if not layout.past:
        return False
    if name == "attention_mask":
        return not layout.encoder  # an encoder-decoder's mask covers the encoder's positions
    return name.startswith("present.") and ".encoder." not in name


def _cache_field(output_class: type) -> str:
    """The field ``output_class`` returns the cache in (``CACHE_KEYWORDS``)."""
    fields = getattr(output_class, "__dataclass_fields__", {})
    return next((name for name in CACHE_KEYWORDS if name in fields), "past_key_values")
