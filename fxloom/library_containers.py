"""Containers that libraries ship without registering them with any pytree: how fxloom walks them.

Hugging Face ``transformers`` (5.x) returns its key/value caches (``DynamicCache``,
``EncoderDecoderCache``) from every decoder's forward when ``use_cache`` is on, and takes
them back as ``past_key_values``; it registers them with ``torch.utils._pytree`` only
inside its own exporter. So that exported and traced language models return and take
them as they are, this table says how each is taken apart and rebuilt.

``LIBRARY_CONTAINERS`` is keyed by the class's ``module.qualname``: ``fxloom.pytree``
consults it for a class it meets that nothing registered, so an entry applies only once
its library has been imported by someone else (nothing here imports it). A row is
``(flatten, unflatten)`` in ``fxloom.pytree.register_pytree_node``'s form; contexts are
plain data, so specs holding them can be saved.

    DynamicCache         children: one (keys, values) tuple per layer   context: None
    EncoderDecoderCache  children: (self-attention, cross-attention)    context: which layers'
                         caches                                          cross-attention is filled

Only the plain layers are rebuilt (``DynamicLayer``: keys and values are the whole state);
a cache holding other layers (sliding windows, offloading) is refused by name.

Depends on nothing in fxloom (``fxloom.pytree`` reads the table).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["LIBRARY_CONTAINERS"]

_CACHES = "transformers.cache_utils"


def _refuse(value: Any, why: str) -> TypeError:
    name = type(value).__qualname__
    return TypeError(
        f"fxloom cannot take apart this {name}: {why}. Pass use_cache=False, or register "
        f"{name} with torch.utils._pytree.register_pytree_node (fxloom honours it)"
    )


def _check_class(cache: Any, expected: str) -> None:
    if type(cache).__qualname__ != expected:
        raise _refuse(
            cache, f"it is a subclass of {expected}, which fxloom rebuilds as itself only"
        )


def _plain_layers(cache: Any) -> list[Any]:
    _check_class(cache, "DynamicCache")
    if getattr(cache, "offloading", False):
        raise _refuse(cache, "it offloads its layers")
    for index, layer in enumerate(cache.layers):
        if type(layer).__qualname__ != "DynamicLayer":
            raise _refuse(
                cache, f"layer {index} is a {type(layer).__qualname__}, not a DynamicLayer"
            )
    return cache.layers


def _dynamic_cache_flatten(cache: Any) -> tuple[list[Any], Any]:
    layers = _plain_layers(cache)
    return [(layer.keys, layer.values) for layer in layers], None


def _dynamic_cache_unflatten(children: Sequence[Any], context: Any) -> Any:
    from transformers.cache_utils import DynamicCache, DynamicLayer  # imported already

    cache = DynamicCache()  # layers are added as the model fills them
    for keys, values in children:
        layer = DynamicLayer()
        # The layer's state set directly, as ``update`` would leave it after a first call:
        # the stored tensors are the inputs themselves, with no copy through a concatenation.
        layer.keys, layer.values = keys, values
        layer.is_initialized = keys is not None
        if hasattr(keys, "dtype") and hasattr(keys, "device"):
            layer.dtype, layer.device = keys.dtype, keys.device
        cache.layers.append(layer)
    return cache


def _encoder_decoder_cache_flatten(cache: Any) -> tuple[list[Any], Any]:
    _check_class(cache, "EncoderDecoderCache")
    filled = tuple(bool(cache.is_updated.get(i, False)) for i in range(len(cache.is_updated)))
    return [cache.self_attention_cache, cache.cross_attention_cache], filled


def _encoder_decoder_cache_unflatten(children: Sequence[Any], context: Any) -> Any:
    from transformers.cache_utils import EncoderDecoderCache  # imported already

    # Not through __init__, which reads the cross-attention cache's sizes to work out what
    # the context already records.
    cache = EncoderDecoderCache.__new__(EncoderDecoderCache)
    cache.self_attention_cache, cache.cross_attention_cache = children
    cache.is_updated = dict(enumerate(context))
    return cache


FlattenFn = Callable[[Any], tuple[list[Any], Any]]
UnflattenFn = Callable[[Sequence[Any], Any], Any]

LIBRARY_CONTAINERS: dict[str, tuple[FlattenFn, UnflattenFn]] = {
    f"{_CACHES}.DynamicCache": (_dynamic_cache_flatten, _dynamic_cache_unflatten),
    f"{_CACHES}.EncoderDecoderCache": (
        _encoder_decoder_cache_flatten,
        _encoder_decoder_cache_unflatten,
    ),
}
