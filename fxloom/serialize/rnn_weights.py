"""Recurrent layers in a file: their weights' names and shapes follow from attributes.

An RNN runs on ``_flat_weights``, a list its ``__init__`` builds in the order of
``_flat_weights_names``; ``state_dict`` shows ``_parameters``. A file that lists the
names in another order would compute with swapped matrices while showing the right
ones, so nothing of that list is read from a file: the names are the ones torch gives
for the module's attributes (``num_layers``, ``bidirectional``, ``bias``, ``proj_size``),
its parameters must be exactly those, in that order, and the flat lists are derived
from them on loading (``rebuild_flat_weights``), from ``_parameters``, never through
``getattr``. Attributes are read from the module's ``__dict__`` only.

torch's dynamic-quantized LSTM and GRU (``torch.ao.nn.quantized.dynamic``) pack the same
weights, by the same names, into one cell per layer and direction: ``packed_rnn_shapes``
gives their shapes, which ``module_states`` checks before packing (QNNPACK computes with a
weight of the wrong width without a word). They pack a bias per gate whatever ``bias``
says, and have no projection. ``FAMILIES`` says, per class, what each family admits.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.ao.nn.quantized.dynamic.modules import rnn as dynamic_rnn

from fxloom.serialize.errors import SerializationError

__all__ = [
    "DERIVED",
    "FAMILIES",
    "canonical_names",
    "packed_rnn_shapes",
    "rnn_shapes",
    "rebuild_flat_weights",
]

Shapes = dict[str, tuple[int, ...]]

# What RNNBase.__init__ derives from the attributes: never saved, rebuilt on loading.
DERIVED = frozenset({"_flat_weights", "_flat_weight_refs", "_flat_weights_names", "_all_weights"})
# Gates per layer, by ``mode`` (an attribute; each class admits its own modes only).
_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


@dataclass(frozen=True)
class Family:
    """What one family of recurrent layers admits: its modes, whether it packs its weights
    (then a bias per gate is always packed, and there is no ``proj_size``)."""

    modes: tuple[str, ...]
    packed: bool = False


# Matched by the module's bases, nearest first.
FAMILIES: dict[type, Family] = {
    nn.LSTM: Family(("LSTM",)),
    nn.GRU: Family(("GRU",)),
    nn.RNN: Family(("RNN_TANH", "RNN_RELU")),
    nn.RNNBase: Family(tuple(_GATES)),
    dynamic_rnn.LSTM: Family(("LSTM",), packed=True),
    dynamic_rnn.GRU: Family(("GRU",), packed=True),
    dynamic_rnn.RNNBase: Family(("LSTM", "GRU"), packed=True),
}


def _family(module: nn.Module) -> Family:
    return next(FAMILIES[base] for base in type(module).__mro__ if base in FAMILIES)


def _attribute(module: nn.Module, name: str, kind: type, least: int = 0) -> Any:
    value = vars(module).get(name)
    if type(value) is not kind or (kind is int and value < least):
        rule = f"an int, at least {least}" if kind is int else f"a {kind.__name__}"
        raise SerializationError(f"{name}={value!r} must be {rule}")
    return value


def _dropout(module: nn.Module) -> float:
    value = vars(module).get("dropout")
    if type(value) is not float or not 0.0 <= value <= 1.0:
        raise SerializationError(f"dropout={value!r} must be a float in [0, 1]")
    return value


def _mode(module: nn.Module) -> str:
    mode = vars(module).get("mode")
    modes = _family(module).modes
    if mode not in modes:
        raise SerializationError(f"mode={mode!r} must be one of {list(modes)}")
    return mode


def _projection(module: nn.Module, mode: str) -> int:
    if _family(module).packed:
        return 0
    proj_size = _attribute(module, "proj_size", int)
    if proj_size and (mode != "LSTM" or proj_size >= _attribute(module, "hidden_size", int)):
        raise SerializationError(f"proj_size={proj_size} needs an LSTM with a larger hidden_size")
    return proj_size


def _check_attributes(module: nn.Module) -> None:
    """What ``RNNBase.__init__`` requires of the attributes the kernels read."""
    _attribute(module, "hidden_size", int, least=1)
    _attribute(module, "num_layers", int, least=1)
    _attribute(module, "input_size", int)
    _attribute(module, "batch_first", bool)
    _dropout(module)


def canonical_names(module: nn.Module) -> list[list[str]]:
    """Per layer and direction, the names torch gives its weights, in torch's order."""
    layers = _attribute(module, "num_layers", int, least=1)
    directions = 2 if _attribute(module, "bidirectional", bool) else 1
    kinds = ["weight_ih", "weight_hh"]
    if _attribute(module, "bias", bool) or _family(module).packed:
        kinds += ["bias_ih", "bias_hh"]
    if _projection(module, _mode(module)):
        kinds.append("weight_hr")
    suffixes = ["", "_reverse"][:directions]
    return [
        [f"{kind}_l{layer}{suffix}" for kind in kinds]
        for layer in range(layers)
        for suffix in suffixes
    ]


def rnn_shapes(module: nn.Module) -> Shapes:
    """The shape of each weight of a float RNN; ``SerializationError`` if its parameters are
    not exactly the canonical names in the canonical order."""
    names = [name for group in canonical_names(module) for name in group]
    if list(module._parameters) != names:
        raise SerializationError(
            f"its parameters must be {names} in this order (what its attributes give), "
            f"found {list(module._parameters)}"
        )
    return _shapes(module, names)


def packed_rnn_shapes(module: nn.Module) -> Shapes:
    """The shape of each weight and bias a dynamic-quantized LSTM/GRU packs, by name."""
    return _shapes(module, [name for group in canonical_names(module) for name in group])


def _shapes(module: nn.Module, names: list[str]) -> Shapes:
    _check_attributes(module)
    hidden = module.__dict__["hidden_size"]
    projected = _projection(module, _mode(module)) or hidden
    gates = _GATES[_mode(module)] * hidden
    directions = 2 if module.__dict__["bidirectional"] else 1
    first_input = module.__dict__["input_size"]
    shapes = {}
    for name in names:
        kind, layer = name.split("_l")[0], int(name.split("_l")[1].split("_")[0])
        inputs = first_input if layer == 0 else projected * directions
        shapes[name] = {
            "weight_ih": (gates, inputs),
            "weight_hh": (gates, projected),
            "bias_ih": (gates,),
            "bias_hh": (gates,),
            "weight_hr": (projected, hidden),
        }[kind]
    return shapes


def rebuild_flat_weights(module: nn.Module) -> None:
    """What ``RNNBase.__init__`` derives from the weights, made from ``_parameters``."""
    groups = canonical_names(module)
    names = [name for group in groups for name in group]
    flat = [module._parameters.get(name) for name in names]
    state = module.__dict__
    state["_all_weights"] = groups
    state["_flat_weights_names"] = names
    state["_flat_weights"] = flat
    state["_flat_weight_refs"] = [None if w is None else weakref.ref(w) for w in flat]
